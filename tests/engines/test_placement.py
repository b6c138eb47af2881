"""How a hosting engine places its parties: each spec serialised only when it is sent, so the
coordinator never holds every party's bytes at once (a training client's spec carries its
encodings), and, on Ray, byte-bounded batches with one call in flight per actor. No Ray needed: the
Ray transport runs against a stand-in engine."""

from __future__ import annotations

from typing import Any

from fedgat.protocols.ray_engine import RayTransport


class _Call:
    def __init__(self, actor: _Actor, batch: dict[int, bytes]) -> None:
        self.actor, self.batch = actor, batch


class _Actor:
    def __init__(self, h: int, log: list) -> None:
        self.h, self.log, self.in_flight, self.most_in_flight = h, log, 0, 0
        self.place = self  # ``actor.place.remote(batch)``

    def remote(self, batch: dict[int, bytes]) -> _Call:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.log.append(("call", self.h, sorted(batch)))
        return _Call(self, batch)


class _Ray:
    def wait(self, calls: list[_Call], num_returns: int = 1, timeout: Any = None):
        return calls[:num_returns], calls[num_returns:]


class _Engine:
    def __init__(self, hosts: int, log: list) -> None:
        self.actors = [_Actor(h, log) for h in range(hosts)]
        self.ray = _Ray()

    def _get(self, call: _Call) -> dict:
        call.actor.in_flight -= 1
        return {"parties": sorted(call.batch), "error": None}


def test_ray_places_byte_bounded_batches_serialising_each_spec_when_sent():
    log: list = []
    transport = RayTransport(_Engine(2, log), batch_bytes=20)  # type: ignore[arg-type]
    blocks = [[1, 2, 3, 4, 5], [6, 7]]
    sizes = {1: 8, 2: 8, 3: 8, 4: 30, 5: 8, 6: 8, 7: 8}

    def spec(pid: int) -> bytes:
        log.append(("spec", pid))
        return bytes(sizes[pid])

    transport._place(blocks, spec)
    calls = [(h, pids) for kind, *rest in log if kind == "call" for h, pids in [rest]]
    # batches close once they reach 20 bytes (8 + 8 + 8), a spec larger than that goes alone
    assert [pids for h, pids in calls if h == 0] == [[1, 2, 3], [4], [5]]
    assert [pids for h, pids in calls if h == 1] == [[6, 7]]
    assert sorted(p for _, pids in calls for p in pids) == [1, 2, 3, 4, 5, 6, 7]  # each once
    # a spec is serialised just before the call that carries it, not all of them up front
    first_call = next(i for i, event in enumerate(log) if event[0] == "call")
    assert [event for event in log[:first_call] if event[0] == "spec"] == [
        ("spec", 1),
        ("spec", 2),
        ("spec", 3),
    ]
    assert all(actor.most_in_flight == 1 for actor in transport.engine.actors)
