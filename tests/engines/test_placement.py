"""How a hosting engine (:class:`~fedgat.protocols.hosting.HostedTransport`) places its parties and
takes their reports back: each spec serialised only when it is sent, so the coordinator never holds
every party's bytes at once (a training client's spec carries its encodings), byte-bounded batches of
specs (one party a call on the process engine) and one report per call, with one call in flight per
host. No Ray needed: the Ray transport runs against a stand-in engine."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedgat.protocols.ray_engine import RayTransport


class _Call:
    def __init__(self, actor: _Actor, name: str, arg: Any) -> None:
        self.actor, self.name, self.arg = actor, name, arg


class _Method:
    def __init__(self, actor: _Actor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, arg: Any) -> _Call:
        actor = self.actor
        actor.in_flight += 1
        actor.most_in_flight = max(actor.most_in_flight, actor.in_flight)
        actor.log.append((self.name, actor.h, sorted(arg)))
        return _Call(actor, self.name, arg)


class _Actor:
    def __init__(self, h: int, log: list) -> None:
        self.h, self.log, self.in_flight, self.most_in_flight = h, log, 0, 0
        self.place, self.report = _Method(self, "place"), _Method(self, "report")


class _Ray:
    def wait(self, calls: list[_Call], num_returns: int = 1, timeout: Any = None):
        return calls[:num_returns], calls[num_returns:]


class _Engine:
    def __init__(self, hosts: int, log: list) -> None:
        self.actors = [_Actor(h, log) for h in range(hosts)]
        self.ray = _Ray()

    def _get(self, call: _Call) -> dict:
        call.actor.in_flight -= 1
        if call.name == "report":
            return {"reports": {pid: b"report %d" % pid for pid in call.arg}, "error": None}
        return {"parties": sorted(call.arg), "error": None}


def test_ray_places_byte_bounded_batches_serialising_each_spec_when_sent():
    log: list = []
    transport = RayTransport(_Engine(3, log), batch_bytes=20)  # type: ignore[arg-type]
    blocks = [[1, 2, 3, 4, 5], [6, 7], []]  # an actor without parties gets no call
    sizes = {1: 8, 2: 8, 3: 8, 4: 30, 5: 8, 6: 8, 7: 8}

    def spec(pid: int) -> bytes:
        log.append(("spec", pid))
        return bytes(sizes[pid])

    transport._place(blocks, spec)
    calls = [(h, pids) for kind, *rest in log if kind == "place" for h, pids in [rest]]
    # batches close once they reach 20 bytes (8 + 8 + 8), a spec larger than that goes alone
    assert [pids for h, pids in calls if h == 0] == [[1, 2, 3], [4], [5]]
    assert [pids for h, pids in calls if h == 1] == [[6, 7]]
    assert sorted(p for _, pids in calls for p in pids) == [1, 2, 3, 4, 5, 6, 7]  # each once
    assert sorted(p for kind, p in (e for e in log if e[0] == "spec")) == [1, 2, 3, 4, 5, 6, 7]
    # a spec is serialised just before the call that carries it, not all of them up front
    first_call = next(i for i, event in enumerate(log) if event[0] == "place")
    assert [event for event in log[:first_call] if event[0] == "spec"] == [
        ("spec", 1),
        ("spec", 2),
        ("spec", 3),
    ]
    assert [actor.most_in_flight for actor in transport.engine.actors] == [1, 1, 0]


def test_ray_takes_one_report_per_call():
    log: list = []
    transport = RayTransport(_Engine(2, log), batch_bytes=20)  # type: ignore[arg-type]
    reports = dict(transport._reports([[1, 2, 3], [4]]))
    assert reports == {pid: b"report %d" % pid for pid in (1, 2, 3, 4)}
    assert [pids for kind, h, pids in log] == [[1], [4], [2], [3]]  # one party per call, actors side by side
    assert all(actor.most_in_flight == 1 for actor in transport.engine.actors)


def test_one_party_a_call_where_the_engine_says_so():
    """The process engine's setting (``place_batch_bytes = 0``): each call carries one spec, whatever
    its size."""

    class OnePerCall(RayTransport):
        place_batch_bytes = 0

    log: list = []
    transport = OnePerCall(_Engine(2, log), batch_bytes=1 << 20)  # type: ignore[arg-type]
    transport._place([[1, 2, 3], [4]], lambda pid: bytes(8))
    assert sorted(pids for kind, h, pids in log) == [[1], [2], [3], [4]]
    assert all(actor.most_in_flight == 1 for actor in transport.engine.actors)


def test_ray_ships_each_spec_as_an_array_over_its_bytes():
    """Spec bytes go to an actor as uint8 arrays over the same memory (Ray ships a numpy buffer out of
    band: one copy into its object store; ``bytes`` would be pickled in band, a copy more each side)."""
    transport = RayTransport(_Engine(1, []))  # type: ignore[arg-type]
    blob = bytes(range(256)) * 64
    call = transport._call(0, "place", {7: blob})
    (sent,) = call.arg.values()
    assert isinstance(sent, np.ndarray) and sent.dtype == np.uint8 and not sent.flags.writeable
    assert sent.tobytes() == blob and np.shares_memory(sent, np.frombuffer(blob, np.uint8))
