"""Secure aggregation's maths and crypto (:mod:`fedgat.protocols.secagg`): the fixed-point encoding
and its overflow bound, masks that look uniform and cancel only in the sum, the model digest in the
pairwise masks, Shamir sharing through pycryptodome, sealed shares, the CSPRNG as the only source of
secrets, and the framing of the stage messages."""

from __future__ import annotations

import math
import random
import struct

import numpy as np
import pytest
import torch
from Crypto.Protocol import SecretSharing
from secagg_samples import secagg_samples

from fedgat.crypto import SignatureError as CryptoSignatureError
from fedgat.crypto import SigningIdentity, verify
from fedgat.protocols import (
    AuthError,
    FrameError,
    PayloadError,
    ProtocolError,
    SignatureError,
    SizeLimitError,
    StateError,
    decode_message,
    encode_message,
)
from fedgat.protocols import secagg as sa
from fedgat.protocols.messages_secagg import (
    Confirmation,
    RevealedShare,
    SealedShare,
    SecAggCohort,
    SecAggMasked,
    SecAggSurvivors,
    SecAggUnmaskRequest,
    SecAggUnmaskShares,
)
from fedgat.protocols.secagg_client import ClientSecAgg

SESSION, ROUND, M = 5, 2, 4096
DIGEST = bytes(range(32))
RNG = np.random.default_rng(0)


def _clients(k: int, digest: bytes = DIGEST) -> dict:
    """``k`` clients' plain inputs, weights, seeds and mask keys."""
    out = {}
    for u in range(k):
        n = int(RNG.integers(1, 200))
        w = RNG.standard_normal(M - 2) * 0.1
        x = np.concatenate([n * w, [n, n * 1.3]])
        s_seed, b_seed = sa.random_seed(), sa.random_seed()
        key = sa.mask_key(s_seed, SESSION, ROUND, u)
        out[u] = {"x": x, "n": n, "w": w, "s_seed": s_seed, "b_seed": b_seed, "key": key, "digest": digest}
    return out


def _masked(clients: dict, u2: list[int]) -> dict[int, np.ndarray]:
    publics = {u: sa.public_bytes(c["key"]) for u, c in clients.items()}
    out = {}
    for u in u2:
        c = clients[u]
        peers = {v: publics[v] for v in u2 if v != u}
        x = sa.encode(c["x"], len(clients))
        out[u] = sa.mask_input(x, c["b_seed"], c["key"], u, peers, SESSION, ROUND, c["digest"])
    return out


def _unmask(clients: dict, masked: dict, dropped: list[int]) -> np.ndarray:
    publics = {u: sa.public_bytes(c["key"]) for u, c in clients.items()}
    b = {v: clients[v]["b_seed"] for v in masked}
    keys = {u: clients[u]["key"] for u in dropped}
    return sa.decode(sa.unmask_sum(masked, b, keys, publics, SESSION, ROUND, DIGEST))


# ---------------------------------------------------------------------------------- fixed point
def test_fixed_point_sums_are_exact_to_the_resolution_and_signed():
    values = [RNG.standard_normal(1000) * 10.0 ** RNG.integers(-3, 12, 1000) for _ in range(7)]
    total = sa.ring_zeros(1000)
    for v in values:
        total = sa.ring_add(total, sa.encode(v, 7))
    got = sa.decode(total)
    want = np.array([math.fsum(col) for col in zip(*values)])  # exactly rounded
    # rounding to 2^-48 per term, then the decoded integer's float64 rounding
    assert np.all(np.abs(got - want) <= 7 * 2.0**-49 + 2.0**-52 * np.abs(want))
    assert np.array_equal(sa.decode(sa.encode(np.array([-1.0, -0.5, 0.0, 3.25]), 2)), [-1.0, -0.5, 0.0, 3.25])
    a = sa.encode(RNG.standard_normal(50), 2)
    assert np.array_equal(sa.ring_sub(sa.ring_add(a, a), a), a)
    assert np.array_equal(sa.ring_add(a, sa.ring_neg(a)), sa.ring_zeros(50))


def test_values_that_could_overflow_are_refused():
    limit = 2.0 ** (127 - sa.FRAC_BITS)  # |sum| < 2^127: the signed range of Z_2^128
    ok = np.array([limit / 10 * 0.999, -limit / 10 * 0.999])
    total = sa.ring_zeros(2)
    for _ in range(10):
        total = sa.ring_add(total, sa.encode(ok, 10))
    assert np.allclose(sa.decode(total), ok * 10, rtol=1e-12)  # ten of the largest still decode
    for bad in (np.array([limit / 10]), np.array([np.nan]), np.array([np.inf])):
        with pytest.raises(sa.FixedPointOverflowError) as info:
            sa.encode(bad, 10)
        assert isinstance(info.value, PayloadError)
    # every admissible update fits: |w| <= MAX_WEIGHT_ABS, n <= MAX_NODES, 4096 clients
    from fedgat.protocols.messages import MAX_NODES
    from fedgat.protocols.messages_rounds import MAX_WEIGHT_ABS

    sa.encode(np.array([MAX_WEIGHT_ABS * MAX_NODES, -MAX_WEIGHT_ABS * MAX_NODES]), sa.MAX_COHORT)


# ------------------------------------------------------------------------------------------ masks
def test_masked_inputs_look_uniform_and_hide_the_update():
    clients = _clients(4)
    masked = _masked(clients, [0, 1, 2, 3])
    for u, y in masked.items():
        x = sa.encode(clients[u]["x"], 4)
        assert not np.any(y == x)  # every element changed
        raw = np.frombuffer(y.tobytes(), dtype=np.uint8)
        counts = np.bincount(raw, minlength=256)
        chi2 = float(((counts - raw.size / 256) ** 2 / (raw.size / 256)).sum())
        assert chi2 < 400, chi2  # 255 degrees of freedom: p ~ 1e-7 above 400
        bits = np.unpackbits(raw).mean()
        assert abs(bits - 0.5) < 0.01
        plain = np.frombuffer(x.tobytes(), dtype=np.uint8)
        plain_chi2 = float(
            ((np.bincount(plain, minlength=256) - plain.size / 256) ** 2 / (plain.size / 256)).sum()
        )
        assert plain_chi2 > 10_000  # the encoded update itself is far from uniform
        assert abs(np.corrcoef(sa.decode(y)[:-2], clients[u]["x"][:-2])[0, 1]) < 0.1
    # the same input masked again (fresh seeds) shares nothing with the first masking
    again = _masked({u: {**c, "b_seed": sa.random_seed()} for u, c in clients.items()}, [0, 1, 2, 3])
    assert not np.any(again[0] == masked[0])


def test_the_unmasked_sum_is_the_weighted_sum_with_and_without_dropouts():
    clients = _clients(5)
    want = np.sum([c["x"] for c in clients.values()], axis=0)
    got = _unmask(clients, _masked(clients, [0, 1, 2, 3, 4]), [])
    assert np.max(np.abs(got - want)) < 1e-9 * np.max(np.abs(want))
    # clients 1 and 3 shared their keys (they are in U2) but never sent a masked input
    masked = _masked(clients, [0, 1, 2, 3, 4])
    survivors = {v: masked[v] for v in (0, 2, 4)}
    got = _unmask(clients, survivors, [1, 3])
    want = np.sum([clients[v]["x"] for v in (0, 2, 4)], axis=0)
    assert np.max(np.abs(got - want)) < 1e-9 * np.max(np.abs(want))
    mean = got[:-2] / got[-2]
    plain = sum(clients[v]["n"] * clients[v]["w"] for v in (0, 2, 4)) / sum(
        clients[v]["n"] for v in (0, 2, 4)
    )
    assert np.max(np.abs(mean - plain)) <= 1e-9 * np.max(np.abs(plain))
    assert got[-2] == sum(clients[v]["n"] for v in (0, 2, 4))  # the total weight, exactly
    # without the dropped clients' mask keys the sum is noise
    noise = _unmask(clients, survivors, [])
    assert np.median(np.abs(noise - want)) > 1e10


def test_two_models_give_noise_not_a_sum():
    """Client 2 was sent another model: its pairwise masks are derived from another digest."""
    clients = _clients(4)
    clients[2]["digest"] = bytes(32)
    got = _unmask(clients, _masked(clients, [0, 1, 2, 3]), [])
    sums = [np.sum([c["x"] for c in clients.values()], axis=0)] + [
        np.sum([c["x"] for u, c in clients.items() if u != v], axis=0) for v in clients
    ]
    for want in sums:  # far from the sum of all, and from any sum that leaves one client out
        assert np.median(np.abs(got - want)) > 1e10


def test_pair_masks_refuse_low_order_keys():
    key = sa.mask_key(sa.random_seed(), SESSION, ROUND, 0)
    with pytest.raises(PayloadError, match="not a usable X25519"):
        sa.pair_mask(key, bytes(32), SESSION, ROUND, 0, 1, DIGEST, 8)


def test_model_digest_depends_on_every_weight_name_and_shape():
    arrays = {"a": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    d = sa.model_digest(arrays)
    assert d == sa.model_digest({k: v.copy() for k, v in arrays.items()})
    changed = {"a": arrays["a"].copy(), "b": arrays["b"]}
    changed["a"][1, 2] = np.nextafter(np.float32(1), np.float32(2))
    others = [
        changed,
        {"b": arrays["b"], "a": arrays["a"]},
        {"a": arrays["a"].reshape(3, 2), "b": arrays["b"]},
    ]
    assert all(sa.model_digest(o) != d for o in others)


# ----------------------------------------------------------------------------------------- Shamir
@pytest.mark.parametrize("t, n", [(3, 3), (3, 4), (7, 10)])
def test_shamir_shares_rebuild_the_secret_from_any_t(t, n):
    secret = sa.random_seed()
    shares = sa.split_secret(secret, t, n)
    assert len(shares) == n and all(len(s) == 16 for s in shares)
    indexed = list(enumerate(shares, start=1))
    for _ in range(10):
        subset = random.sample(indexed, t)
        assert sa.combine_shares(subset) == secret
        assert SecretSharing.Shamir.combine(subset) == secret  # pycryptodome directly
    assert sa.combine_shares(indexed[: t - 1]) != secret  # t - 1 shares say nothing
    # the server's checks: b's commitment, s's public key
    key = sa.mask_key(sa.combine_shares(indexed[-t:]), SESSION, ROUND, 4)
    assert sa.public_bytes(key) == sa.public_bytes(sa.mask_key(secret, SESSION, ROUND, 4))
    assert sa.b_commitment(sa.combine_shares(indexed[:t]), SESSION, ROUND, 4) == sa.b_commitment(
        secret, SESSION, ROUND, 4
    )


# ---------------------------------------------------------------------------------- sealed shares
def _box(**over):
    sender, recipient = SigningIdentity.generate(), sa.mask_key(sa.random_seed(), 1, 1, 1)
    args = {"session": SESSION, "round_": ROUND, "sender": 3, "recipient": 4, "index": 2, "view": b"v" * 32}
    sealed = sa.seal_share(sender, sa.public_bytes(recipient), s_share=b"s" * 16, b_share=b"b" * 16, **args)
    return sealed, recipient, sender, {**args, **over}


def test_sealed_shares_open_only_for_their_recipient_and_context():
    sealed, key, sender, args = _box()
    assert len(sealed) == sa.SEALED_SHARE_BYTES
    s_share, b_share, s_sig, b_sig = sa.open_share(key, sealed, sender.public_bytes(), **args)
    assert (s_share, b_share) == (b"s" * 16, b"b" * 16)
    # each share carries its dealer's signature, which the holder reveals with it
    for kind, share, signature in ((b"s", s_share, s_sig), (b"b", b_share, b_sig)):
        data = sa.dealt_bytes(SESSION, ROUND, 3, 4, 2, kind, share, b"v" * 32)
        verify(sender.public_bytes(), data, signature)
        with pytest.raises(CryptoSignatureError):  # another holder, index or share: not what was dealt
            verify(
                sender.public_bytes(),
                sa.dealt_bytes(SESSION, ROUND, 3, 5, 2, kind, share, b"v" * 32),
                signature,
            )
    for pos in (0, 40, len(sealed) - 1):  # the encapsulated key, the body, the tag
        bad = bytearray(sealed)
        bad[pos] ^= 1
        with pytest.raises(AuthError, match="do not open"):
            sa.open_share(key, bytes(bad), sender.public_bytes(), **args)
    # ... also a recipient shown another cohort than the sender (frame version 11)
    for field, value in (
        ("session", SESSION + 1),
        ("round_", ROUND + 1),
        ("sender", 9),
        ("recipient", 9),
        ("view", b"w" * 32),
    ):
        with pytest.raises(AuthError):
            sa.open_share(key, sealed, sender.public_bytes(), **{**args, field: value})
    other = sa.mask_key(sa.random_seed(), 1, 1, 1)
    with pytest.raises(AuthError):
        sa.open_share(other, sealed, sender.public_bytes(), **args)
    with pytest.raises(PayloadError, match="index"):
        sa.open_share(key, sealed, sender.public_bytes(), **{**args, "index": 3})


def test_a_share_sealed_by_anyone_but_its_sender_is_a_forgery():
    """The server knows every recipient's public key, so it can seal a box; it cannot sign as the sender."""
    _, key, sender, args = _box()
    forger = SigningIdentity.generate()
    forged = sa.seal_share(forger, sa.public_bytes(key), s_share=b"f" * 16, b_share=b"f" * 16, **_box()[3])
    with pytest.raises(SignatureError):
        sa.open_share(key, forged, sender.public_bytes(), **args)


# ------------------------------------------------------------------------------------- randomness
def test_secrets_come_from_the_os_csprng_never_from_a_seed(monkeypatch):
    calls = {"secagg": [], "shamir": 0}
    real = sa._random_bytes

    def counted(n: int) -> bytes:
        calls["secagg"].append(n)
        return real(n)

    def shamir_rng(n: int) -> bytes:
        calls["shamir"] += 1
        return real(n)

    monkeypatch.setattr("fedgat.protocols.secagg._random_bytes", counted)
    monkeypatch.setattr(SecretSharing, "rng", shamir_rng)
    x = sa.encode(np.ones(8), 3)
    rounds = []
    for _ in range(2):  # every seed a caller could set, set alike: the round's secrets still differ
        torch.manual_seed(0), np.random.seed(0), random.seed(0)
        rounds.append(ClientSecAgg.begin(sa.SecAggConfig(), SESSION, ROUND, 1, DIGEST, x))
    assert calls["secagg"] == [32, 16, 16] * 2  # c key, s seed, b seed: all from the OS
    a, b = rounds
    assert len({a.c_secret, b.c_secret, a.s_seed, b.s_seed, a.b_seed, b.b_seed}) == 6
    sa.split_secret(a.s_seed, 3, 5)
    assert calls["shamir"] > 0 and SecretSharing.rng is shamir_rng
    assert real is __import__("os").urandom


def test_config_and_threshold():
    c = sa.SecAggConfig()
    assert [c.threshold(n) for n in (3, 4, 5, 6, 9, 10, 30)] == [3, 3, 4, 4, 6, 7, 20]
    # 2t - n >= min_cohort - 1 (a ninth review pass): a survivor split takes as many colluders as
    # a cohort of min_cohort does to leave one client alone in the sum
    for config in (
        c,
        sa.SecAggConfig(min_cohort=5),
        sa.SecAggConfig(threshold_ratio=0.51),
        sa.SecAggConfig(8, 0.6),
    ):
        for n in range(config.min_cohort, 200):
            t = config.threshold(n)
            assert 3 <= t <= n and 2 * t - n >= config.min_cohort - 1
            assert t >= math.ceil(config.threshold_ratio * n - 1e-9) or t == n
    assert (
        sa.SecAggConfig(min_cohort=5).threshold(6) == 5
        and sa.SecAggConfig(threshold_ratio=0.6).threshold(5) == 4
    )
    # exactly ceil(r n) of the float r: a ratio a hair above 7/10 gives 8 of 10, never 7 (an eleventh
    # review pass split a cohort of ten at 0.7 + 5e-11 with four colluders under a rounding fudge)
    assert sa.SecAggConfig(threshold_ratio=0.7 + 5e-11).threshold(10) == 8
    assert sa.SecAggConfig(threshold_ratio=0.7).threshold(10) == 7  # the float 0.7 is below 7/10
    assert sa.SecAggConfig(min_cohort=2).threshold(2) == 2
    assert sa.SecAggConfig.from_value(c.to_value()) == c and sa.SecAggConfig.from_value(None) is None
    for bad in ({"min_cohort": 1}, {"threshold_ratio": 0.5}, {"threshold_ratio": 1.2}):
        with pytest.raises(ValueError):
            sa.SecAggConfig(**bad)


# ------------------------------------------------------------------------------------------ frames
SIGNER = SigningIdentity.generate()
HDR = {"sender": 1, "recipient": 3, "session": 77, "seq": 5, "fingerprint": bytes(32)}


@pytest.mark.parametrize("msg", secagg_samples(HDR), ids=lambda m: m.type_name)
def test_stage_messages_round_trip_and_reject_damage(msg):
    data = encode_message(msg, SIGNER)
    assert decode_message(data) == msg
    for cut in (len(data) - 1, len(data) - 65, 70):
        with pytest.raises(ProtocolError):
            decode_message(data[:cut])
    for pos in range(0, len(data), max(1, len(data) // 25)):
        bad = bytearray(data)
        bad[pos] ^= 0x10
        try:
            decoded = decode_message(bytes(bad))
        except ProtocolError:
            continue
        with pytest.raises(CryptoSignatureError):  # what parses is caught by the signature
            verify(SIGNER.public_bytes(), decoded.signed_bytes, decoded.signature)


def test_stage_message_values_are_checked():
    item = SealedShare(2, b"x" * sa.SEALED_SHARE_BYTES)
    share = RevealedShare(1, b"q" * 16)
    bad = [
        SecAggCohort(round=1, adverts=tuple(reversed(secagg_samples(HDR)[1].adverts)), **HDR),
        SecAggUnmaskRequest(round=1, survivors=(2, 1), **HDR),
        SecAggUnmaskRequest(round=1, survivors=(), **HDR),
        SecAggUnmaskRequest(
            round=1,
            survivors=(1, 2),
            confirmations=(Confirmation(2, bytes(64)), Confirmation(1, bytes(64))),
            **HDR,
        ),
        SecAggSurvivors(round=1, survivors=(1, 1), **HDR),
        SecAggSurvivors(round=1, survivors=(), **HDR),
        SecAggUnmaskShares(round=1, b_shares=(share,), s_shares=(share,), **HDR),  # both shares of party 1
        SecAggMasked(round=1, masked=np.zeros((3, 4), np.int64), **HDR),
    ]
    for msg in bad:
        with pytest.raises(PayloadError):
            encode_message(msg, SIGNER)
    from fedgat.protocols.messages_secagg import SecAggShares

    with pytest.raises(PayloadError):
        encode_message(SecAggShares(round=1, shares=(item, item), **HDR), SIGNER)
    with pytest.raises(PayloadError):  # a sealed box must have its exact size
        encode_message(SecAggShares(round=1, shares=(SealedShare(2, b"x" * 10),), **HDR), SIGNER)
    data = encode_message(SecAggMasked(round=1, masked=np.zeros((2, 4), np.int64), **HDR), SIGNER)
    length = struct.unpack_from(">I", data, 63)[0]
    huge = data[:63] + struct.pack(">I", SecAggMasked.MAX_PAYLOAD + 1) + data[67:]
    with pytest.raises(SizeLimitError):
        decode_message(huge)
    assert length < SecAggMasked.MAX_PAYLOAD
    with pytest.raises(FrameError):
        decode_message(data[:-1])


def _masked_client(parts: dict[int, int], me: int = 0) -> ClientSecAgg:
    """Client ``me`` in stage "masked" of a cohort whose members carry ``parts`` (fake keys; every
    other member dealt it shares)."""
    from fedgat.protocols.messages_secagg import AdvertItem

    client = ClientSecAgg.begin(
        sa.SecAggConfig(), SESSION, ROUND, me, DIGEST, np.zeros((2, 4), np.uint64), parts[me]
    )
    client.cohort = {
        p: AdvertItem(p, bytes([p]) * 32, bytes(32), bytes(32), DIGEST, bytes(64), q)
        for p, q in parts.items()
    }
    client.view = sa.cohort_view(client.cohort.values())
    fake = (b"s" * 16, b"b" * 16, bytes(64), bytes(64))
    client.received = {p: fake for p in parts if p != me}
    client.own, client.threshold, client.stage, client.vector = fake, 4, "masked", None
    return client


class _Roster:
    """The signing keys of ``signers`` (a roster's only use in :meth:`ClientSecAgg.on_unmask`)."""

    def __init__(self, signers: dict[int, SigningIdentity]) -> None:
        self.signers = signers

    def signing_key(self, party: int) -> bytes:
        return self.signers[party].public_bytes()


def _confirmations(client: ClientSecAgg, signers: dict, survivors, view: bytes | None = None) -> tuple:
    view = client.view if view is None else view
    return tuple(
        Confirmation(p, signers[p].sign(sa.confirm_bytes(SESSION, ROUND, p, view, survivors)))
        for p in sorted(signers)
        if p in survivors
    )


def test_a_client_unmasks_only_sums_enough_members_add_its_parts_to():
    """Frame version 10: each advert says, signed, whether its input carries an update and counts.
    A client that trains refuses to confirm a survivor set in which fewer than ``min_cohort``
    survivors add an update (a server could count the other trainers as dropped and leave the
    target's update alone among evaluators' zeros); the refusal changes nothing, and a set with
    enough is confirmed and, with enough confirmations, unmasked."""
    parts = {0: 3, 1: 3, 2: 3, 3: sa.PART_COUNTS, 4: sa.PART_COUNTS}  # 0-2 train, 3-4 only evaluate
    me = _masked_client(parts)
    head = {**HDR, "sender": 9, "recipient": 0}
    signers = {p: SigningIdentity.generate() for p in parts}
    with pytest.raises(PayloadError, match="fewer than 3 survivors add their updates"):
        me.on_survivors(SecAggSurvivors(round=ROUND, survivors=(0, 1, 3, 4), **head), signers[0])
    assert me.stage == "masked" and me.confirmed is None
    me.on_survivors(SecAggSurvivors(round=ROUND, survivors=(0, 1, 2, 3), **head), signers[0])
    confirmations = _confirmations(me, signers, (0, 1, 2, 3))
    request = SecAggUnmaskRequest(round=ROUND, survivors=(0, 1, 2, 3), confirmations=confirmations, **head)
    out = me.on_unmask(request, _Roster(signers))
    assert [s.party for s in out["b_shares"]] == [0, 1, 2, 3] and [s.party for s in out["s_shares"]] == [4]
    # an evaluator alone: the counts of all five are in the sum, enough
    ev = ClientSecAgg.begin(
        sa.SecAggConfig(), SESSION, ROUND, 3, DIGEST, np.zeros((2, 4), np.uint64), sa.PART_COUNTS
    )
    assert ev._short_parts(me.cohort.values()) == [] and me._short_parts(
        [me.cohort[p] for p in (0, 3, 4)]
    ) == ["updates"]


def test_a_client_reveals_only_for_the_survivor_set_it_signed_with_t_confirmations():
    """Frame version 11 (an eighth review pass told each client another survivor set): a client
    signs one survivor set and reveals only for it, with at least ``t`` survivors' valid signatures
    over it under its own cohort view; every refusal changes nothing."""
    parts = dict.fromkeys(range(6), 3)
    me = _masked_client(parts)
    head = {**HDR, "sender": 9, "recipient": 0}
    signers = {p: SigningIdentity.generate() for p in parts}
    roster = _Roster(signers)
    survivors = (0, 1, 2, 3, 4)
    confirm = me.on_survivors(SecAggSurvivors(round=ROUND, survivors=survivors, **head), signers[0])
    data = sa.confirm_bytes(SESSION, ROUND, 0, me.view, survivors)
    verify(signers[0].public_bytes(), data, confirm["confirmation"])
    with pytest.raises(StateError):  # one survivor set per round
        me.on_survivors(SecAggSurvivors(round=ROUND, survivors=(0, 1, 2, 3), **head), signers[0])

    def request(surv, confirmations):
        return SecAggUnmaskRequest(round=ROUND, survivors=surv, confirmations=confirmations, **head)

    good = _confirmations(me, signers, survivors)
    other = (0, 1, 2, 3)
    swapped = good[:3] + (Confirmation(4, good[3].signature),)  # party 3's signature as party 4's
    bad = [
        (request(other, _confirmations(me, signers, other)), PayloadError, "other survivors"),
        (request(survivors, good[:3]), PayloadError, "below the threshold 4"),
        (
            request(survivors, _confirmations(me, signers, survivors, view=b"x" * 32)),
            SignatureError,
            "did not",
        ),
        (request(survivors, good[:3] + (Confirmation(5, good[3].signature),)), PayloadError, "not survivors"),
        (request(survivors, swapped), SignatureError, "party 4"),
    ]
    for msg, error, text in bad:
        with pytest.raises(error, match=text):
            me.on_unmask(msg, roster)
        assert me.stage == "confirmed" and me.own is not None
    out = me.on_unmask(request(survivors, good), roster)
    assert [s.party for s in out["b_shares"]] == list(survivors) and [s.party for s in out["s_shares"]] == [5]
    with pytest.raises(StateError, match="never answers twice"):
        me.on_unmask(request(survivors, good), roster)
