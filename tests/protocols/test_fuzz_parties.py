"""Hypothesis fuzz *through a party*: mutated frames and validly signed messages with random field
values either are accepted or raise a ProtocolError subclass with the party's snapshot unchanged;
nothing else ever escapes (no crash, no partial state change)."""

from __future__ import annotations

import itertools

import numpy as np
from fault_helpers import Federation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedgat.protocols import EvaluationReport, LocalUpdate, ProtocolError, SplitCounts, encode_message

FED = Federation(rounds=3, fraction=1.0)
PARTIES = FED.parties()
SERVER = PARTIES[FED.sid]
FIRST = SERVER.start()  # round 1 is under way: the server awaits every client's update
SHAPES = {k: tuple(v.shape) for k, v in SERVER.global_state.items()}
SEQ = itertools.count(1000)
EXAMPLES = {"mutated": 300, "signed": 300}


def _signed(msg_cls, sender: int, **fields) -> bytes:
    msg = msg_cls(sender=sender, recipient=FED.sid, session=9, seq=next(SEQ), **fields)
    return encode_message(msg, FED.dep.identities[sender].signer)


def _valid_update(sender: int) -> bytes:
    arrays = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    return _signed(LocalUpdate, sender, round=1, num_train=3, loss=0.5, arrays=arrays)


FRAMES = [_valid_update(c) for c in FED.roster.clients] + [
    _signed(EvaluationReport, 0, round=1, splits=(SplitCounts("val", 1, 2, 0.5),))
]


def _feed(party, data: bytes) -> None:
    before = party.snapshot()
    try:
        party.receive(data)
    except ProtocolError:
        assert party.snapshot() == before


@settings(max_examples=EXAMPLES["mutated"], deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_mutated_frames_into_the_server(data):
    raw = bytearray(data.draw(st.sampled_from(FRAMES)))
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if kind == "flip":
            raw[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "cut":
            del raw[max(pos, 1) :]
        else:
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    _feed(SERVER, bytes(raw))


def _arrays():
    names = st.lists(st.sampled_from([*SHAPES, "bogus"]), unique=True, max_size=len(SHAPES) + 1)
    return names.flatmap(
        lambda ns: st.fixed_dictionaries(
            {
                n: st.sampled_from([SHAPES.get(n, (2,)), (1,), (3, 1)]).map(lambda s: np.zeros(s, np.float32))
                for n in ns
            }
        )
    )


@settings(max_examples=EXAMPLES["signed"], deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sender=st.sampled_from([0, 1, 2, FED.sid]),
    round_=st.integers(0, 4),
    num_train=st.integers(0, 2**32 - 1),
    loss=st.floats(allow_nan=True, allow_infinity=True),
    arrays=_arrays(),
    report=st.booleans(),
    count=st.integers(0, 2**32 - 1),
)
def test_fuzz_signed_messages_with_random_fields(sender, round_, num_train, loss, arrays, report, count):
    if report:
        splits = (SplitCounts("val", min(count, 5), count, 0.5),)
        msg = EvaluationReport(
            sender=sender, recipient=FED.sid, session=9, seq=next(SEQ), round=round_, splits=splits
        )
    else:
        msg = LocalUpdate(
            sender=sender,
            recipient=FED.sid,
            session=9,
            seq=next(SEQ),
            round=round_,
            num_train=num_train,
            loss=loss,
            arrays=arrays if num_train else {},
        )
    try:
        data = encode_message(msg, FED.dep.identities[sender].signer)
    except ProtocolError:
        return  # the sender's own encoder refuses it (same checks as the receiver)
    _feed(SERVER, data)
