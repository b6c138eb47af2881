"""Helpers for the fault and restart tests: a lossy/stalling transport, a small FedAvg federation and a
pre-training driver on a manual clock."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from fedgat.federated import Client, LocalTask
from fedgat.pipeline import make_deployment
from fedgat.protocols import ClientRounds, Driver, InProcessTransport, ServerRounds, Transcript
from fedgat.protocols.driver import ManualClock
from fedgat.protocols.pretrain import PretrainTimeouts
from fedgat.synthetic import synthetic_graph

#: rule(sender, recipient, frame) -> "drop", "hold" or None
Rule = Callable[[int, int, bytes], str | None]


class FaultyTransport(InProcessTransport):
    """An in-process transport that loses (``drop``) or delays (``hold`` until :meth:`release`) frames."""

    def __init__(self, transcript: Transcript | None = None) -> None:
        super().__init__(transcript)
        self.rules: list[Rule] = []
        self.held: list[tuple[int, int, bytes]] = []
        self.lost = 0

    def _send(self, sender: int, to: int, data: bytes) -> None:
        for rule in self.rules:
            action = rule(sender, to, data)
            if action == "drop":
                self.lost += 1
                return
            if action == "hold":
                self.held.append((sender, to, data))
                return
        super()._send(sender, to, data)

    def release(self) -> int:
        held, self.held = self.held, []
        for sender, to, data in held:
            super()._send(sender, to, data)
        return len(held)


def small_clients(
    seed: int = 3, train_all: bool = True, strategy=None, num_clients: int = 3
) -> tuple[list[Client], dict]:
    """``num_clients`` (3) clients with a dropout + linear model on a 90-node synthetic graph (all with
    training nodes); ``strategy`` builds their optimisers (default Adam)."""
    g = synthetic_graph(num_nodes=90, num_features=12, train_per_class=4, num_val=20, num_test=30, seed=5)
    owner = np.arange(g.num_nodes) % num_clients
    torch.manual_seed(seed)

    def model_fn() -> nn.Module:
        return nn.Sequential(nn.Dropout(0.3), nn.Linear(12, g.num_classes))

    initial = model_fn().state_dict()
    clients = []
    for c in range(num_clients):
        nodes = np.flatnonzero(owner == c)
        targets = {}
        for split in ("train", "val", "test"):
            mask = getattr(g, f"{split}_mask").numpy()[nodes]
            if split == "train" and c == 2 and not train_all:
                mask[:] = False
            rows = torch.from_numpy(np.flatnonzero(mask))
            targets[split] = (rows, g.y[nodes][rows])
        task = LocalTask((g.x[nodes],), targets)
        clients.append(Client(c, model_fn(), task, task, lr=0.05, local_epochs=2, strategy=strategy))
    return clients, initial


SESSION = 9


class Federation:
    """Fresh FedAvg state machines over fixed identities (what a restarted process would build).

    ``secagg``: the parties' secure-aggregation setting -- None (plaintext updates) unless given, so
    that these 3-client federations sampling 2 clients a round can run; the secure tests pass a
    :class:`~fedgat.protocols.secagg.SecAggConfig` and ``num_clients``."""

    def __init__(
        self,
        rounds: int = 6,
        fraction: float = 0.67,
        patience: int | None = None,
        strategy_fn=None,
        secagg=None,
        num_clients: int = 3,
        **server_kw,
    ) -> None:
        """``strategy_fn()`` makes a fresh strategy for every process built (default FedAvg)."""
        self.strategy_fn = strategy_fn
        self.secagg, self.num_clients = secagg, num_clients
        self.dep = make_deployment(num_clients)
        self.roster = self.dep.roster
        self.sid = self.roster.server
        self.kw = {
            "rounds": rounds,
            "fraction": fraction,
            "patience": patience,
            "secagg": secagg,
            **server_kw,
        }

    def server(self, initial: dict) -> ServerRounds:
        strategy = self.strategy_fn() if self.strategy_fn else None
        return ServerRounds(
            self.sid,
            self.roster,
            SESSION,
            self.dep.identities[self.sid],
            initial_state=initial,
            seed=4,
            strategy=strategy,
            **self.kw,
        )

    def members(self) -> tuple[list[Client], dict]:
        strategy = self.strategy_fn() if self.strategy_fn else None
        return small_clients(strategy=strategy, num_clients=self.num_clients)

    def client(self, c: int, member: Client) -> ClientRounds:
        return ClientRounds(
            c, self.roster, SESSION, self.dep.identities[c], client=member, seed=100 + c, secagg=self.secagg
        )

    def parties(self) -> dict:
        members, initial = self.members()
        out = {c: self.client(c, members[c]) for c in self.roster.clients}
        out[self.sid] = self.server(initial)
        return out


def same_state(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def same_history(a: list[dict], b: list[dict]) -> bool:
    import math

    def eq(x, y):
        return (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)) or x == y

    return len(a) == len(b) and all(
        list(x) == list(y) and all(eq(x[k], y[k]) for k in x) for x, y in zip(a, b)
    )


def pretrain_driver(h, clients: PretrainTimeouts | None = None, **timeouts) -> Driver:
    """A driver on a lossy transport and a manual clock; the server's deadlines are ``timeouts``, the
    clients' ``clients`` (default: twice the server's, as a deployment sets them, so that the server
    decides about a missing peer before the clients give up on the server)."""
    h.transport = FaultyTransport(Transcript())
    server = PretrainTimeouts(**timeouts)
    if clients is None:
        clients = PretrainTimeouts(**{k: None if v is None else 2 * v for k, v in timeouts.items()})
    for party in h.parties.all().values():
        party.timeouts = server if party is h.server else clients
    return Driver(h.transport, h.parties.all(), clock=ManualClock(), strict=False)
