"""Parties as values (:mod:`fedgat.protocols.party_values`): specs rebuild equal parties, reports carry
a hosted party's results back, unsupported kinds are refused, and a hosted run (the Ray engine's
:class:`RayTransport` over :class:`PartyHost` objects, no Ray) never uses pickle."""

from __future__ import annotations

import ast
import inspect
import math
import pickle
import sys

import numpy as np
import pytest
import torch

from fedgat.app import build_pretrain_parties, build_training_parties
from fedgat.checkpoint import CheckpointError
from fedgat.dp import FeatureDP
from fedgat.dp_ledger import Budget, DPLedger
from fedgat.dp_release import draw_release
from fedgat.pipeline import (
    drive,
    max_abs_error,
    run_encrypted_pretraining,
    run_plaintext_pretraining,
    train_fedgat,
)
from fedgat.protocols import (
    ClientPretrain,
    InProcessTransport,
    MissingPartyError,
    QuorumError,
    SignatureError,
    StateError,
    errors,
    party_values,
    ray_engine,
    ray_host,
    roster,
)
from fedgat.protocols.party_values import (
    PartyReport,
    PartySpec,
    encodings_to_value,
    error_from_value,
    error_to_value,
    pack_value,
    unpack_value,
)
from fedgat.protocols.pretrain import PretrainTimeouts
from fedgat.protocols.ray_engine import PartyHost, RayEngineError, RayTransport
from fedgat.protocols.ray_host import RayPartyHost

TRAIN = {"rounds": 2, "patience": None, "dropout": 0.0, "feature_dropout": 0.0}


def rebuilt(party):
    return PartySpec.from_bytes(party.spec().to_bytes()).build()


def same_encodings(a, b) -> bool:
    va, vb = encodings_to_value(a), encodings_to_value(b)
    packed_a, arrays_a = pack_value(va)
    packed_b, arrays_b = pack_value(vb)
    return packed_a == packed_b and all(
        x.dtype == arrays_b[k].dtype and np.array_equal(x, arrays_b[k]) for k, x in arrays_a.items()
    )


# ------------------------------------------------------------------------------------------ codec
def test_plain_values_round_trip():
    value = {
        "a": [1, 2.5, None, True, "x", b"\x00\xff", np.arange(6, dtype=np.int16).reshape(2, 3)],
        "b": {"nan": math.inf, "empty": b"", "t": (1, 2)},
    }
    packed, arrays = pack_value(value)
    back = unpack_value(packed, arrays)
    assert back["a"][:6] == [1, 2.5, None, True, "x", b"\x00\xff"]
    assert back["a"][6].dtype == np.int16 and np.array_equal(back["a"][6], value["a"][6])
    assert back["b"] == {"nan": math.inf, "empty": b"", "t": [1, 2]}
    with pytest.raises(TypeError, match="not a plain value"):
        pack_value({"x": object()})
    with pytest.raises(TypeError, match="key"):
        pack_value({"$array": 1})
    with pytest.raises(TypeError, match="key"):
        pack_value({1: 1})


# ------------------------------------------------------------------------------------ pre-training
def test_pretrain_spec_rebuilds_equal_clients(tiny_graph, tiny_partition):
    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=1, workers=0)
    for pid, client in parties.clients.items():
        spec = client.spec()
        twin = rebuilt(client)
        assert type(twin) is type(client) and twin.party_id == pid
        assert twin.snapshot() == client.snapshot()
        assert twin.spec().to_bytes() == spec.to_bytes()
        assert twin._signer.private_bytes() == client._signer.private_bytes()
        # the spec's repr names fields, never the private keys
        assert client._signer.private_bytes().hex() not in repr(spec)
        assert "identity" in repr(spec)


def test_dp_spec_ships_the_release_not_a_redraw(tiny_graph, tiny_partition):
    dp = FeatureDP(epsilon=4.0, mechanism="gaussian", dim=8)
    ledgers = {c: DPLedger(Budget(1e3, 1e-5)) for c in range(tiny_partition.num_clients)}
    parties = build_pretrain_parties(
        tiny_graph, tiny_partition, seed=None, workers=0, dp=dp, dp_ledgers=ledgers
    )
    for client in parties.clients.values():
        twin = rebuilt(client)
        assert twin.config == client.config
        assert np.array_equal(twin._release, client._release)  # the CSPRNG draw, shipped
        assert np.array_equal(twin._features, client._features)


def test_started_party_has_no_spec(tiny_graph, tiny_partition):
    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=1, workers=0)
    client = parties.clients[tiny_partition.num_clients - 1]
    client.start()
    with pytest.raises(StateError):
        client.spec()


def test_report_absorb_gives_equal_results(tiny_graph, tiny_partition):
    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=1, workers=0)
    copies = {pid: rebuilt(c) for pid, c in parties.clients.items()}  # the coordinator's copies
    drive(InProcessTransport(), parties.all())
    for pid, client in parties.clients.items():
        report = PartyReport.from_bytes(client.report().to_bytes())
        copy = copies[pid]
        copy.absorb(report)
        assert copy.done and copy.state is client.state and copy.abort_reason is None
        assert same_encodings(copy.encodings, client.encodings)
        assert copy.nodes_decrypted == client.nodes_decrypted > 0
        assert copy.ciphertexts_decrypted == client.ciphertexts_decrypted
        assert dict(copy.timings) == dict(client.timings)
        assert dict(copy.cpu_timings) == dict(client.cpu_timings)
        assert copy.layout == client.layout and copy.verifier.fingerprint == client.verifier.fingerprint
        assert copy.holder is None  # no key material in a report
    with pytest.raises(ValueError, match="report of"):
        copies[0].absorb(parties.clients[1].report())


# ----------------------------------------------------------------------------------------- rounds
@pytest.mark.parametrize("variant", ["vector", "matrix"])
def test_rounds_spec_rebuilds_equal_clients(tiny_graph, tiny_partition, variant):
    plain = run_plaintext_pretraining(tiny_graph, tiny_partition, variant=variant, seed=1)
    parties = build_training_parties(tiny_graph, tiny_partition, plain, seed=1, rounds=2)
    for client in parties.clients.values():
        state = torch.get_rng_state()
        twin = rebuilt(client)
        assert torch.equal(state, torch.get_rng_state())  # rebuilding draws nothing
        assert twin.snapshot() == client.snapshot()
        assert twin.spec().to_bytes() == client.spec().to_bytes()
        weights = {k: v.clone() for k, v in client.client.model.state_dict().items()}
        torch.manual_seed(7)
        mine = client.client.fit(weights)
        torch.manual_seed(7)
        theirs = twin.client.fit(weights)
        assert mine.loss == theirs.loss and all(torch.equal(mine.state[k], theirs.state[k]) for k in weights)
        assert twin.client.evaluate(weights) == client.client.evaluate(weights)


def test_rounds_client_with_its_own_stream(tiny_graph, tiny_partition):
    from fedgat.protocols import ClientRounds

    plain = run_plaintext_pretraining(tiny_graph, tiny_partition, seed=1)
    parties = build_training_parties(tiny_graph, tiny_partition, plain, seed=1, rounds=2)
    c = parties.clients[0]
    seeded = ClientRounds(
        0, c.roster, c.session, roster.Identity(c._signer), client=c.client, fingerprint=None, seed=11
    )
    twin = rebuilt(seeded)
    assert torch.equal(twin._rng, seeded._rng)
    report = PartyReport.from_bytes(twin.report().to_bytes())
    seeded.absorb(report)
    assert seeded.last_round == 0 and seeded.done


# ------------------------------------------------------------------------------------ unsupported
def test_unsupported_kinds_raise(tiny_graph, tiny_partition):
    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=1, workers=0)
    with pytest.raises(TypeError, match="ServerPretrain cannot be described"):
        parties.server.spec()

    class Tweaked(ClientPretrain):  # a subclass does not inherit its parent's kind
        pass

    client = parties.clients[1]
    tweaked = Tweaked.__new__(Tweaked)
    tweaked.__dict__.update(client.__dict__)
    with pytest.raises(TypeError, match="Tweaked cannot be described"):
        tweaked.spec()
    with pytest.raises(TypeError, match="no party kind"):
        PartySpec("fedgat.pipeline:os.system", 1, {}).build()
    with pytest.raises(TypeError, match="no party kind"):
        PartySpec.from_bytes(PartySpec("nope", 1, {}).to_bytes()).build()
    blob = bytearray(client.spec().to_bytes())
    blob[-40] ^= 1
    with pytest.raises(CheckpointError):
        PartySpec.from_bytes(bytes(blob))


def test_engine_refuses_a_party_it_cannot_describe(tiny_graph, tiny_partition):
    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=1, workers=0)
    transport = RayTransport(FakeEngine(), keep_local=lambda party: False, server_tasks=False)
    with pytest.raises(TypeError, match="cannot host party .* ServerPretrain"):
        transport.run_parties(parties.all())


def test_engine_builds_each_spec_only_as_it_places_it(tiny_graph, tiny_partition, monkeypatch):
    """A spec copies the party's values (a training client's, its encodings): the coordinator builds
    each only as it places it, not every party's before the first placement; a party that cannot be
    described is still refused before any (the test above)."""
    from fedgat.protocols.party import Party

    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=1, workers=0)
    log: list = []
    real_spec, real_place = Party.spec, PartyHost.place

    def spec(self):
        log.append(("spec", self.party_id))
        return real_spec(self)

    def place(self, specs):
        log.append(("place", sorted(specs)))
        return real_place(self, specs)

    monkeypatch.setattr(Party, "spec", spec)
    monkeypatch.setattr(PartyHost, "place", place)
    transport = RayTransport(FakeEngine(), server_tasks=False, batch_bytes=1)  # one party per batch
    transport.run_parties(parties.all())
    pairs = list(zip(log[::2], log[1::2]))
    assert len(log) == 2 * len(pairs) and all(s == ("spec", p[1][0]) and p[0] == "place" for s, p in pairs)
    assert sorted(s[1] for s, _ in pairs) == sorted(parties.clients)  # each built once, then placed
    assert all(c.state.value == "done" for c in parties.clients.values())


# ----------------------------------------------------------------------------------------- errors
def test_errors_travel_as_values():
    def through(exc: BaseException) -> Exception:
        try:
            raise exc
        except BaseException as raised:  # noqa: BLE001 - a traceback to carry
            return error_from_value(error_to_value(raised), fallback=RayEngineError)

    got = through(SignatureError("bad signature"))
    assert type(got) is SignatureError and str(got) == "bad signature"
    got = through(MissingPartyError("gone", phase="keys", missing=[3, 1]))
    assert type(got) is MissingPartyError and got.phase == "keys" and got.missing == (1, 3)
    got = through(QuorumError("few", phase="fit", missing=[2], round=4, answered=[0, 1], required=3))
    assert (got.round, got.answered, got.required) == (4, (0, 1), 3)
    got = through(KeyError("party 9"))
    assert type(got) is KeyError and got.args == ("party 9",)

    class Strange(Exception):
        pass

    got = through(Strange("odd"))
    assert type(got) is RayEngineError and "Strange: odd" in str(got)
    assert "Strange" in error_to_value(Strange("odd"))["type"]


def _sample_error(cls: type) -> Exception:
    """One instance of a protocol error class, built as the protocol builds it."""
    pe = errors
    if issubclass(cls, pe.QuorumError):
        return cls("few", phase="fit", missing=[2], round=4, answered=[0, 1], required=3)
    if issubclass(cls, pe.FaultError):
        return cls("gone", phase="keys", missing=[3])
    if cls is pe.ResultRejectedError:
        return cls(17, (2,), detail="tag off by 0.6821 in column 9")
    if cls is pe.TrainingRefusedError:
        return cls(5, detail="|w| = 1.4e+06")
    return cls("refused")


@pytest.mark.parametrize("name", [n for n in errors.__all__ if isinstance(getattr(errors, n), type)])
def test_every_protocol_error_travels_as_a_value_without_its_local_detail(name):
    """A fourteenth review pass: a refused result came back to the coordinator as a TypeError (its
    class could not be rebuilt from its text), and its traceback carried the chained cause's
    decrypted values. Every protocol error now round-trips as itself, with no traceback, and what
    travels holds no ``detail``, node or owner (a refused result's text is one constant)."""
    cls = getattr(errors, name)
    try:
        try:
            raise ValueError("decrypted value 0.6821")  # a cause holding a secret
        except ValueError as cause:
            raise _sample_error(cls) from cause
    except errors.ProtocolError as raised:
        value = error_to_value(raised)
    got = error_from_value(value, fallback=RayEngineError)
    assert type(got) is cls and str(got) == str(_sample_error(cls))
    assert value["traceback"] == "" and "0.6821" not in repr(value) and "1.4e+06" not in repr(value)
    if cls is errors.ResultRejectedError:
        assert str(got) == errors.ResultRejectedError.TEXT and "17" not in repr(value)
    if cls is errors.TrainingRefusedError:
        assert got.round == 5


# --------------------------------------------------------------------------- hosted, without Ray
class _Ref:
    def __init__(self, value):
        self.value = value


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args, **kwargs):
        return _Ref(self.fn(*args, **kwargs))


class _Actor:
    """A :class:`PartyHost` object called the way a Ray actor handle is (``actor.method.remote``)."""

    def __init__(self, host: PartyHost):
        self.host = host

    def __getattr__(self, name):
        return _Method(getattr(self.host, name))


class _Ray:
    @staticmethod
    def wait(refs, num_returns=1, timeout=None):
        return list(refs), []


class FakeEngine:
    """What :class:`RayTransport` uses of a :class:`RayEngine`, over plain :class:`RayPartyHost` objects
    (the actors' class: specs arrive and reports leave as uint8 arrays): every call runs at once, in
    this process."""

    def __init__(self, actors: int = 2):
        self.ray = _Ray()
        self.n = actors
        self.actors: list[_Actor] = []

    def ensure_actors(self, parties: int):
        if not self.actors:
            self.actors = [_Actor(RayPartyHost(threads=None)) for _ in range(self.n)]
        return self.actors

    def _get(self, refs):
        return [r.value for r in refs] if isinstance(refs, list) else refs.value


def _no_pickle(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used on the hosted path")

    for name in ("dumps", "loads", "dump", "load"):
        monkeypatch.setattr(pickle, name, refuse)
        for module in ("cloudpickle", "ray.cloudpickle"):
            if module in sys.modules and hasattr(sys.modules[module], name):
                monkeypatch.setattr(sys.modules[module], name, refuse)


def test_engine_modules_import_no_pickle():
    for module in (party_values, ray_host, ray_engine):
        tree = ast.parse(inspect.getsource(module))
        names = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        }
        names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not {n for n in names if "pickle" in n}, module.__name__


@pytest.mark.parametrize(
    "dp", [None, FeatureDP(epsilon=4.0, mechanism="gaussian", dim=8)], ids=["plain", "dp"]
)
def test_hosted_run_equals_in_process_without_pickle(tiny_graph, tiny_partition, monkeypatch, dp):
    ledgers = {c: DPLedger(Budget(1e3, 1e-5)) for c in range(tiny_partition.num_clients)}
    drawn = None if dp is None else draw_release(tiny_graph, tiny_partition, dp, ledgers=ledgers)
    kw = {"seed": 2, "progress": False, "workers": 0, "dp": dp, "dp_release": drawn}
    want = run_encrypted_pretraining(tiny_graph, tiny_partition, **kw)
    engine = FakeEngine()
    transport = RayTransport(engine, server_tasks=False)
    _no_pickle(monkeypatch)
    got = run_encrypted_pretraining(tiny_graph, tiny_partition, transport=transport, **kw)
    assert [len(a.host.parties) for a in engine.actors] == [0, 0]  # reported and dropped
    assert max_abs_error(got.encodings, want.encodings) <= 1e-5
    for c, enc in got.encodings.items():
        for a, b in zip(enc.buckets, want.encodings[c].buckets, strict=True):
            assert np.array_equal(a.bases.p, b.bases.p) and np.array_equal(a.bases.nodes, b.bases.nodes)
    for field in ("ciphertexts_up", "ciphertexts_down", "messages_up", "messages_down", "multiply_adds"):
        assert getattr(got, field) == getattr(want, field), field
    assert got.phases["decrypt"] > 0  # the hosted clients' timings came back
    if dp is None:
        ref = train_fedgat(tiny_graph, tiny_partition, want.encodings, seed=2, progress=False, **TRAIN)
        run = train_fedgat(
            tiny_graph, tiny_partition, got.encodings, seed=2, transport=transport, progress=False, **TRAIN
        )
        assert run.fit.rounds == ref.fit.rounds and run.messages == ref.messages
        assert run.fit.best_val_accuracy == ref.fit.best_val_accuracy


def test_a_host_reports_when_its_parties_want_a_tick(tiny_graph, tiny_partition):
    """A host never reads a clock: it ticks its parties with the coordinator's ``now`` and says when
    it next wants a tick -- the earliest armed deadline, or at once while a deadline waits to be
    armed at the next tick (a windowed client after an upload step), which would otherwise never
    start on a host nobody calls."""
    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=1, workers=0, upload_window=1)
    c = parties.deployment.roster.clients[0]
    parties.clients[c].timeouts = PretrainTimeouts(keys=50.0, download=20.0)
    host = PartyHost(threads=None)
    host.place({c: parties.clients[c].spec().to_bytes()})
    hosted = host.parties[c]
    assert host.due(0.0) is None  # nothing armed before the start
    started = host.start([c], 5.0)
    assert started["error"] is None and started["due"] == 55.0  # keys, from the tick at 5.0
    hosted._arm_at_next_tick("download", 20.0)  # as an upload step leaves it
    assert hosted.tick_pending() and host.due(7.0) == 7.0 and host.due(None) == 55.0
    reply = host.deliver([], False, 9.0)  # the coordinator's tick-only call
    assert reply["error"] is None and reply["ticked"] == [] and not hosted.tick_pending()
    assert reply["due"] == 29.0 == hosted.next_deadline()
    reply = host.deliver([], False, 60.0)  # past both deadlines: the client gives up, says so
    assert [(f[0], f[1]) for f in reply["ticked"]] == [(c, parties.deployment.roster.server)]
    assert isinstance(hosted.failure, MissingPartyError) and reply["due"] is None


def test_a_host_on_real_time_counts_its_own_work_as_work(tiny_graph, tiny_partition, monkeypatch):
    """On a real-time clock a host ticks each party before its frame at the call's time plus the
    time the call has taken so far, so a deadline armed after a long batch starts when the batch's
    work ends (as the in-process driver, which reads the clock before every event), not when the
    coordinator made the call; on a manual clock time stands still."""
    from fedgat.protocols import hosting

    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=1, workers=0, upload_window=1)
    c = parties.deployment.roster.clients[0]
    parties.clients[c].timeouts = PretrainTimeouts(download=20.0)
    wall = iter(range(0, 10_000, 7))  # each reading of the host's clock: 7 s later
    monkeypatch.setattr(hosting.time, "monotonic", lambda: float(next(wall)))
    for realtime, want in ((False, 100.0), (True, 107.0)):
        host = PartyHost(threads=None)
        host.place({c: parties.clients[c].spec().to_bytes()})
        hosted = host.parties[c]
        hosted._arm_at_next_tick("download", 20.0)
        reply = host.deliver([], False, 100.0, realtime)
        # on real time: the call's start, then the tick, 7 s apart: the deadline starts at 107
        assert hosted.now == want and reply["due"] == want + 20.0, realtime


def test_without_timeouts_a_hosted_run_makes_no_tick_calls(tiny_graph, tiny_partition, monkeypatch):
    calls: dict[int, list[tuple[bool, bool, float | None, float | None]]] = {}
    deliver = PartyHost.deliver

    def spy(self, frames, step, now=None, realtime=False, strict=True):
        work = self.has_work()  # a call with no frames for a host without work could only tick it
        reply = deliver(self, frames, step, now, realtime, strict)
        calls.setdefault(id(self), []).append((bool(frames) or work, realtime, now, reply["due"]))
        return reply

    monkeypatch.setattr(PartyHost, "deliver", spy)
    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=1, workers=0)
    drive(RayTransport(FakeEngine(), server_tasks=False), parties.all())
    every = [call for host in calls.values() for call in host]
    assert len(calls) == 2 and all(now is not None and real and due is None for _, real, now, due in every)
    # after its first call (the coordinator asks every host once whether it has work), every call
    # to a host delivered frames or stepped streamed work: none only ticked it
    assert all(reason for host in calls.values() for reason, *_ in host[1:])


def test_hosted_rejection_surfaces_typed(tiny_graph, tiny_partition, monkeypatch):
    import dataclasses

    from fedgat.protocols import Verifier

    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=1, workers=0)
    r = parties.deployment.roster
    victim = r.clients[-1]
    keys = dict(r.signing_keys)
    keys[r.server] = keys[r.clients[0]]
    parties.clients[victim].verifier = Verifier(
        dataclasses.replace(r, signing_keys=keys), victim, parties.config.session
    )
    engine = FakeEngine()
    _no_pickle(monkeypatch)
    with pytest.raises(SignatureError) as info:
        drive(RayTransport(engine, server_tasks=False), parties.all())
    assert any(f"by party {victim}" in note for note in info.value.__notes__)
    assert [len(a.host.parties) for a in engine.actors] == [0, 0]  # reset after the failure
