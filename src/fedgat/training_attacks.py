r"""Trap-weight attacks by a hostile server on the FedAvg rounds, run against the real protocol.

The server chooses the global weights every client trains from. *Trap weights* (Boenisch et al.,
"When the Curious Abandon Honesty", EuroS&P 2023) make a hidden unit fire for one input only; the
unit's weight update divided by its bias update is then that input. In FedGAT's first layer the
input of node :math:`i`'s unit is :math:`a_i = \sum_j \alpha_{ij} h_j`, a mix of the features of
its attention neighbourhood -- foreign features among them, from the client's decrypted encodings.
The hostile server here (:class:`TrapServer`, a :class:`~fedgat.protocols.ServerRounds` that
deviates) sets layer 1's attention to zero (uniform :math:`\alpha`), draws a random direction per
unit and a bias that lets about one node of the cohort's inputs fire (calibrated on the *true*
inputs: an attacker who knows the feature distribution exactly, so an upper bound), scales the unit
so that the others stay deep in ELU's flat part, and reads every unit out of what it receives
(:func:`read_out`); a candidate is also split into binary feature rows when its values allow
(:func:`unmix`: Cora-type features are :math:`1_S/\sqrt{|S|}`). Every candidate is scored against
the ground truth (cosine >= :data:`~fedgat.server_attacks.RECOVERY_COSINE`).

Attacks (:func:`training_attacks`):

* ``chosen_weights_one_client`` -- read one client's update: a cohort of that client alone (a forged
  cohort message with its advert only), and a cohort of three where the server claims the other two
  dropped after sending their masked inputs (so that it would unmask the target's input alone);
  with the reference run *without* secure aggregation (plaintext updates) for comparison;
* ``chosen_weights_aggregate`` -- the same traps to every client, read out of the securely
  aggregated mean (the exception secure aggregation allows: measured, per strategy);
* ``model_inconsistency`` -- trap weights to one client, the honest model to the others, hoping to
  isolate the target's trap units in the sum; and, to show what the binding of the masks to the
  model digest does when that check is passed, the sum of masked inputs made for different digests;
* ``cohort_differencing`` -- the same trap weights in :math:`K` rounds, round :math:`j` sampling
  every client but one (each cohort at least ``min_cohort``): secure aggregation is per round, so
  :math:`x_t = \sum_j S_j / (K - 1) - S_{j = t}` is the target's own update (SECURITY.md, known
  break 2), read out like a plaintext one; run with the default hyper-parameters, with the dropouts
  off, and with DP-FedAvg (:mod:`fedgat.dp_fedavg`) on top.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedgat.app import TrainingParties, build_training_parties
from fedgat.encodings import Encodings
from fedgat.graph import Graph
from fedgat.partition import Partition
from fedgat.protocols import (
    ClientRounds,
    Driver,
    GlobalModel,
    InProcessTransport,
    Message,
    QuorumError,
    ServerRounds,
)
from fedgat.protocols.fedavg_client import DEFAULT_SECAGG, secure_mean
from fedgat.protocols.messages_secagg import AdvertItem, SecAggAdvert, SecAggCohort, SecAggSurvivors
from fedgat.protocols.secagg import (
    SecAggConfig,
    decode,
    encode,
    mask_input,
    mask_key,
    public_bytes,
    random_seed,
    unmask_sum,
)
from fedgat.protocols.secagg_server import Send, ServerSecAgg
from fedgat.server_attacks import RECOVERY_COSINE, AttackOutcome, cosines, foreign_rows

__all__ = [
    "ATTACK_STRATEGIES",
    "TrainingSetting",
    "TrapPlan",
    "TrapServer",
    "differencing_attack",
    "digest_binding_check",
    "read_out",
    "training_attacks",
    "trap_state",
    "unmix",
]

StateDict = dict[str, torch.Tensor]

#: hyper-parameter overrides the aggregate attack runs under: the default configuration, FedAdam (the
#: headline; clients take plain SGD steps), then FedAvg, and FedAdam with both dropouts off (the last
#: one is also the setting of the one-client reference without secure aggregation)
ATTACK_STRATEGIES: tuple[dict[str, Any], ...] = (
    {"strategy": "fedadam"},
    {"strategy": "fedavg"},
    {"strategy": "fedadam", "feature_dropout": 0.0, "dropout": 0.0},
)

#: the activation a trap unit's one chosen node gets (the others sit far below 0, where ELU is flat)
TRAP_ACTIVATION = 10.0
#: largest trap weight the server sends (well inside the clients' 1e6 bound and float32 precision)
TRAP_MAX_WEIGHT = 1e4


@dataclass(frozen=True)
class TrainingSetting:
    """The federation of the training attacks: graph, partition, every client's (decrypted)
    encodings, the seed and FedGAT hyper-parameter overrides (:func:`fedgat.methods.resolve_hparams`)."""

    graph: Graph
    partition: Partition
    encodings: Mapping[int, Encodings]
    seed: int = 0
    hparams: Mapping[str, Any] = field(default_factory=dict)

    @property
    def truth(self) -> np.ndarray:
        return self.graph.x.double().numpy()


# ----------------------------------------------------------------------------------- the traps
def neighbourhood_means(setting: TrainingSetting, nodes: np.ndarray) -> np.ndarray:
    """``(len(nodes), d)``: layer 1's input of each node under uniform attention, the mean of its
    attention neighbourhood's features (ground truth: what the attacker calibrates its traps on)."""
    nbh, x = setting.partition.neighbourhoods, setting.truth
    return (
        np.stack([x[nbh.row(int(i))].mean(axis=0) for i in nodes])
        if len(nodes)
        else np.zeros((0, x.shape[1]))
    )


def gradient_nodes(partition: Partition, clients: Sequence[int]) -> np.ndarray:
    """Nodes whose layer-1 output reaches a training loss of one of ``clients``: the attention
    neighbourhoods of their training nodes (sorted, distinct)."""
    nbh = partition.neighbourhoods
    rows = [nbh.row(int(t)) for c in clients for t in partition.clients[c].train_nodes]
    return np.unique(np.concatenate(rows)) if rows else np.zeros(0, np.int64)


def trap_state(
    base: Mapping[str, torch.Tensor], pool: np.ndarray, rng: np.random.Generator, dropout: float = 0.0
) -> StateDict:
    """Trap weights from ``base``'s shapes: layer 1 with zero attention (uniform), each unit a random
    direction ``r`` and a bias ``-lambda tau`` with ``tau`` between the two largest ``r . a`` over the
    ``pool`` inputs (with feature dropout ``dropout``: the medians over sampled masks), ``lambda`` so
    that the chosen node's activation is :data:`TRAP_ACTIVATION`; layer 2 small random weights and
    zero attention (so its softmax does not saturate)."""
    state = {k: v.detach().clone() for k, v in base.items()}
    weight = state["conv1.lin.weight"]
    units, d = weight.shape
    W, b = np.zeros((units, d)), np.zeros(units)
    masks = 16 if dropout > 0 else 1
    for u in range(units):
        r = rng.standard_normal(d)
        tops = []
        for _ in range(masks):
            keep = (rng.random(d) >= dropout) / (1.0 - dropout) if dropout > 0 else np.ones(d)
            vals = pool @ (r * keep)
            top = np.sort(vals)[-2:] if len(vals) > 1 else np.array([vals[0] - 1.0, vals[0]])
            tops.append(top)
        top2, top1 = np.median(np.array(tops), axis=0)
        tau, margin = (top1 + top2) / 2, max((top1 - top2) / 2, 1e-12)
        lam = min(TRAP_ACTIVATION / margin, TRAP_MAX_WEIGHT / max(np.abs(r).max(), abs(tau), 1e-12))
        W[u], b[u] = lam * r, -lam * tau
    state["conv1.lin.weight"] = torch.tensor(W, dtype=weight.dtype)
    state["conv1.bias"] = torch.tensor(b, dtype=state["conv1.bias"].dtype)
    for name in ("conv1.att_src", "conv1.att_dst", "conv2.att_src", "conv2.att_dst", "conv2.bias"):
        state[name] = torch.zeros_like(state[name])
    w2 = state["conv2.lin.weight"]
    state["conv2.lin.weight"] = torch.tensor(rng.normal(0.0, 0.05, tuple(w2.shape)), dtype=w2.dtype)
    return state


def read_out(sent: Mapping[str, torch.Tensor], received: Mapping[str, torch.Tensor]) -> list[np.ndarray]:
    """Per layer-1 unit whose bias moved: its weight update divided by its bias update (the unit's
    input when one node fired it and the clients took plain gradient steps)."""
    dW = (received["conv1.lin.weight"].double() - sent["conv1.lin.weight"].double()).numpy()
    db = (received["conv1.bias"].double() - sent["conv1.bias"].double()).numpy()
    return [dW[u] / db[u] for u in range(len(db)) if db[u] != 0 and np.all(np.isfinite(dW[u]))]


def unmix(a: np.ndarray, max_atoms: int = 10, rtol: float = 1e-3) -> list[np.ndarray]:
    """Binary feature rows (:math:`1_S/\\sqrt{|S|}`) that a non-negative mixture ``a`` of a few of
    them is made of: its distinct values are sums of one value per row (the row's weight over
    :math:`\\sqrt{|S|}`); the smallest values that are no sum of smaller ones are the rows' values,
    and each coordinate goes to the rows whose values add up to it. Empty when ``a`` has negative
    entries or more than ``max_atoms`` such values."""
    a = np.asarray(a, dtype=np.float64)
    top = float(np.abs(a).max()) if a.size else 0.0
    if top == 0 or a.min() < -rtol * top:
        return []
    tol = rtol * top
    levels: list[float] = []
    for v in np.sort(a[a > tol]):
        if not levels or v - levels[-1] > tol:
            levels.append(float(v))
    atoms: list[float] = []
    sums: dict[tuple[int, ...], float] = {(): 0.0}
    for v in levels:
        if any(abs(s - v) <= tol for s in sums.values()):
            continue
        atoms.append(v)
        if len(atoms) > max_atoms:
            return []
        j = len(atoms) - 1
        sums.update({(*k, j): s + v for k, s in list(sums.items())})
    keys, values = list(sums), np.array(list(sums.values()))
    members: list[list[int]] = [[] for _ in atoms]
    for c in np.flatnonzero(a > tol):
        best = keys[int(np.argmin(np.abs(values - a[c])))]
        for j in best:
            members[j].append(int(c))
    out = []
    for m in members:
        if m:
            row = np.zeros_like(a)
            row[m] = 1.0 / np.sqrt(len(m))
            out.append(row)
    return out


def candidates(sent: Mapping[str, torch.Tensor], received: Mapping[str, torch.Tensor]) -> list[np.ndarray]:
    """Everything the attacker tries: each unit's read-out and its binary parts (:func:`unmix`)."""
    out = []
    for a in read_out(sent, received):
        out.append(a)
        out.extend(unmix(a))
    return out


# ------------------------------------------------------------------------------ the server
@dataclass
class TrapPlan:
    """What the hostile server does: ``rounds`` rounds, fresh trap weights (calibrated on ``pool``)
    in each; ``cohort``: the clients it samples; ``target`` with ``forge_cohort`` (a cohort of the
    target's advert alone), ``lie_survivors`` (claim everyone but the target dropped after the
    masked inputs), or ``inconsistent`` (traps to the target, ``honest`` weights to the others);
    ``differencing``: one trap state for every round, round ``j`` sampling all clients but the
    ``j``-th, each round's secure sum kept (:meth:`TrapServer.differenced`)."""

    pool: np.ndarray
    rounds: int = 1
    cohort: list[int] | None = None
    target: int | None = None
    forge_cohort: bool = False
    lie_survivors: bool = False
    inconsistent: bool = False
    dropout: float = 0.0
    seed: int = 0
    differencing: bool = False


@dataclass
class Capture:
    """What the server got in a round: the weights it sent, what came back (the mean of the
    updates, or one client's update), from whom."""

    round: int
    sent: StateDict
    received: StateDict
    clients: list[int]


class HostileSecAgg(ServerSecAgg):
    """The server's secure round, deviating: with ``any_digest`` it takes adverts for any model
    (it sent different ones); with ``lie_target`` set it claims, once the masked inputs are in, that
    every member but that client dropped out (asking for the target's self-mask shares and the
    others' mask-key shares: with both it would unmask the target's input alone; the clients refuse
    to confirm such a set)."""

    any_digest: bool = False
    lie_target: int | None = None

    def _on_advert(self, msg: SecAggAdvert) -> None:
        if not self.any_digest:
            return super()._on_advert(msg)
        saved, self.digest = self.digest, msg.model_digest
        try:
            return super()._on_advert(msg)
        finally:
            self.digest = saved

    def close(self) -> list[Send] | QuorumError:
        target = self.lie_target
        if target is not None and self.stage == "masked" and target in self.masked:
            self.u3, self.stage = [target], "confirm"
            request = {"round": self.round, "survivors": (target,)}
            return [(v, SecAggSurvivors, request) for v in self.u2]
        return super().close()


class TrapServer(ServerRounds):
    """A hostile FedAvg server following a :class:`TrapPlan` (see the module docstring); what it
    receives is kept in :attr:`captures`."""

    def __init__(self, *args: Any, plan: TrapPlan, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.plan = plan
        self.captures: list[Capture] = []
        self._sent: dict[int, StateDict] = {}
        self._honest = {k: v.detach().clone() for k, v in self.global_state.items()}
        self._rng = np.random.default_rng(plan.seed)
        self._trap: StateDict | None = None  # the one trap state of a differencing plan
        self._draws = 0
        #: per secure round of a differencing plan: (the sampled clients that survived, the sum)
        self.sums: list[tuple[list[int], np.ndarray]] = []

    def _sample(self) -> list[int]:
        if self.plan.differencing:
            excluded = self.clients[self._draws % len(self.clients)]
            self._draws += 1
            return [c for c in self.clients if c != excluded]
        return list(self.plan.cohort) if self.plan.cohort is not None else super()._sample()

    def _send_round(self, t: int, fit: list[int], splits: tuple[str, ...]) -> list[Message]:
        if fit:
            if self._trap is None or not self.plan.differencing:
                self._trap = trap_state(self._honest, self.plan.pool, self._rng, self.plan.dropout)
            self.loop.state = {k: v.clone() for k, v in self._trap.items()}
            self._sent[t] = {k: v.clone() for k, v in self.loop.state.items()}
        out = super()._send_round(t, fit, splits)
        if fit and self.plan.inconsistent:
            honest = {k: v.numpy().copy() for k, v in self._honest.items()}
            out = [
                dataclasses.replace(m, arrays=honest)
                if isinstance(m, GlobalModel) and m.recipient != self.plan.target
                else m
                for m in out
            ]
        return out

    def _start_secure(self, t: int, fit: list[int], arrays: dict[str, np.ndarray]) -> None:
        super()._start_secure(t, fit, arrays)
        s, plan = self._secure, self.plan
        if s is not None and (plan.lie_survivors or plan.inconsistent):
            hostile = HostileSecAgg(
                s.config, s.roster, s.session, s.round, s.sampled, s.digest, s.length, s.quorum
            )
            hostile.any_digest = plan.inconsistent
            hostile.lie_target = plan.target if plan.lie_survivors else None
            self._secure = hostile

    def _on_secure(self, msg: Message) -> list[Message]:
        if self.plan.forge_cohort and isinstance(msg, SecAggAdvert) and msg.sender == self.plan.target:
            self._from_client(msg)
            item = AdvertItem.of(msg)
            return [self._new(SecAggCohort, msg.sender, round=msg.round, adverts=(item,))]
        return super()._on_secure(msg)

    def _secure_aggregate(self) -> list[Message] | None:
        sec = self._secure
        if sec is not None and sec.result is not None and self._fit_round and self.plan.differencing:
            survivors = [c for c in self._sampled if c in sec.u3]
            self.sums.append((survivors, np.array(sec.result[: self._weights_size() + 1], dtype=np.float64)))
        if sec is not None and sec.result is not None and self._fit_round:
            mean, _total, _loss, _counts = secure_mean(sec.result, self.loop.state)
            if mean is not None:
                self.captures.append(
                    Capture(self._fit_round, self._sent[self._fit_round], mean, list(sec.u3))
                )
        return super()._secure_aggregate()

    def _weights_size(self) -> int:
        return sum(v.numel() for v in self._honest.values())

    def differenced(self, target: int) -> StateDict | None:
        """The target's own weights from the kept sums (``x_t = sum_j S_j / (K - 1) - S_{j = t}``,
        then ``w_t = x_t / n_t``), or None when the rounds' cohorts were not the planned ones."""
        k = len(self.clients)
        cohorts = [sorted(ids) for ids, _ in self.sums[:k]]
        if len(cohorts) < k or cohorts != [[c for c in self.clients if c != e] for e in self.clients]:
            return None
        total = sum(vec for _, vec in self.sums[:k]) / (k - 1)
        x = total - self.sums[self.clients.index(target)][1]
        n = float(x[-1])
        if not n > 0:
            return None
        out, start = {}, 0
        for name, ref in self._honest.items():
            part = x[start : start + ref.numel()] / n
            out[name] = torch.from_numpy(part.reshape(tuple(ref.shape))).to(ref.dtype)
            start += ref.numel()
        return out

    def _on_update(self, msg: Any) -> list[Message]:
        out = super()._on_update(msg)  # raises (nothing kept) if the update is refused
        sent = self._sent.get(msg.round)
        if msg.num_train and sent is not None:
            state = {k: torch.from_numpy(np.array(msg.arrays[k])) for k in sent}
            self.captures.append(Capture(msg.round, sent, state, [msg.sender]))
        return out


# ------------------------------------------------------------------------------- running them
def _parties(
    setting: TrainingSetting, plan: TrapPlan, secagg: SecAggConfig | None, hparams: Mapping[str, Any]
) -> TrainingParties:
    hp = {**setting.hparams, **hparams, "rounds": plan.rounds, "patience": None}
    built = build_training_parties(
        setting.graph, setting.partition, setting.encodings, seed=setting.seed, **hp
    )
    honest = built.server
    roster = built.deployment.roster
    server = TrapServer(
        roster.server,
        roster,
        honest.session,
        built.deployment.identities[roster.server],
        initial_state=honest.global_state,
        rounds=plan.rounds,
        patience=None,
        strategy=honest.strategy,
        fraction=honest.fraction,
        seed=setting.seed,
        secagg=secagg,
        plan=plan,
    )
    clients = {
        c: ClientRounds(
            c, roster, honest.session, built.deployment.identities[c], client=p.client, secagg=secagg
        )
        for c, p in built.clients.items()
    }
    return TrainingParties(built.deployment, built.hparams, server, clients)


def _run(parties: TrainingParties) -> Driver:
    driver = Driver(InProcessTransport(), parties.all(), strict=False)
    driver.start()
    driver.run()
    return driver


@dataclass
class _Score:
    foreign: set[int] = field(default_factory=set)
    any: set[int] = field(default_factory=set)
    inputs: set[int] = field(default_factory=set)
    best_foreign_cosine: float = 0.0
    candidates: int = 0


def _score(captures: Sequence[Capture], truth: np.ndarray, foreign: np.ndarray, pool: np.ndarray) -> _Score:
    """Foreign rows (and any rows) recovered by the candidates; ``inputs``: layer-1 inputs of the
    ``pool`` that a unit's read-out recovers (the check that the read-out works at all)."""
    out = _Score()
    fset = set(foreign.tolist())
    for cap in captures:
        raw = read_out(cap.sent, cap.received)
        if raw and len(pool):
            hit_inputs = cosines(np.stack(raw), pool).max(axis=0) >= RECOVERY_COSINE
            out.inputs |= set(np.flatnonzero(hit_inputs).tolist())
        cands = candidates(cap.sent, cap.received)
        out.candidates += len(cands)
        if not cands:
            continue
        cos = cosines(np.stack(cands), truth).max(axis=0)
        hit = set(np.flatnonzero(cos >= RECOVERY_COSINE).tolist())
        out.any |= hit
        out.foreign |= hit & fset
        if len(foreign):
            out.best_foreign_cosine = max(out.best_foreign_cosine, float(cos[foreign].max()))
    return out


def _foreign_union(partition: Partition, clients: Sequence[int]) -> np.ndarray:
    rows = [foreign_rows(partition, c) for c in clients]
    return np.unique(np.concatenate(rows)) if rows else np.zeros(0, np.int64)


def _refusals(driver: Driver, parties: Sequence[int]) -> list[str]:
    return [f"party {pid}: {type(exc).__name__}: {exc}" for pid, exc in driver.rejected if pid in parties]


def digest_binding_check(clients: int = 3, length: int = 64, seed: int = 0) -> dict[str, Any]:
    """The masks' binding to the model digest, with the real mask functions: ``clients`` inputs
    masked for one digest sum to their sum; when one client masks for another digest (it received
    another model) the unmasked sum is noise. Returns the cosine of each unmasked sum to the truth."""
    rng = np.random.default_rng(seed)
    xs = {u: rng.standard_normal(length) for u in range(clients)}
    truth = sum(xs.values())
    keys = {u: mask_key(random_seed(), 1, 1, u) for u in xs}
    publics = {u: public_bytes(k) for u, k in keys.items()}
    b_seeds = {u: random_seed() for u in xs}
    d0, d1 = b"\x00" * 32, b"\x01" * 32

    def unmasked(digests: Mapping[int, bytes]) -> np.ndarray:
        masked = {
            u: mask_input(
                encode(xs[u], clients),
                b_seeds[u],
                keys[u],
                u,
                {v: publics[v] for v in xs if v != u},
                1,
                1,
                digests[u],
            )
            for u in xs
        }
        return decode(unmask_sum(masked, b_seeds, {}, publics, 1, 1, d0))

    def cos(v: np.ndarray) -> float:
        return float(v @ truth / (np.linalg.norm(v) * np.linalg.norm(truth) + 1e-300))

    same = unmasked(dict.fromkeys(xs, d0))
    mixed = unmasked({u: d1 if u == 0 else d0 for u in xs})
    return {
        "same_digest_cosine_to_true_sum": cos(same),
        "mismatched_digest_cosine_to_true_sum": cos(mixed),
        "mismatched_digest_max_abs": float(np.abs(mixed).max()),
    }


def training_attacks(
    setting: TrainingSetting,
    *,
    target: int | None = None,
    rounds: int = 3,
    strategies: Sequence[Mapping[str, Any]] = ATTACK_STRATEGIES,
    secagg: SecAggConfig = DEFAULT_SECAGG,
) -> dict[str, AttackOutcome]:
    """``chosen_weights_one_client``, ``chosen_weights_aggregate`` and ``model_inconsistency`` (see
    the module docstring) against the real FedAvg parties with secure aggregation ``secagg``.

    ``rounds``: attack rounds of the aggregate attack (fresh traps each round) and of the plaintext
    reference; ``strategies``: hyper-parameter overrides the aggregate attack runs under, the first
    being the headline (the default configuration); ``target``: the client the one-client and
    inconsistency attacks aim at (default: the client with training nodes that holds the most
    foreign rows)."""
    part, truth = setting.partition, setting.truth
    hp0 = dict(strategies[0]) if strategies else {}
    dropout = float({**setting.hparams, **hp0}.get("feature_dropout", 0.6))
    clients = list(range(part.num_clients))
    trainers = [c for c in clients if len(part.clients[c].train_nodes)]
    if target is None:
        target = max(trainers, key=lambda c: len(foreign_rows(part, c))) if trainers else 0
    others = [c for c in clients if c != target]
    out: dict[str, AttackOutcome] = {}

    # --- one client --------------------------------------------------------------------------------
    pool_t = neighbourhood_means(setting, gradient_nodes(part, [target]))
    foreign_t = foreign_rows(part, target)
    runs: dict[str, dict[str, Any]] = {}
    scenarios: list[tuple[str, TrapPlan, SecAggConfig | None]] = [
        (
            "cohort_of_one",
            TrapPlan(pool_t, 1, [target], target, forge_cohort=True, dropout=dropout, seed=setting.seed),
            secagg,
        )
    ]
    if len(others) >= 2:
        cohort = sorted([target, *others[:2]])
        scenarios.append(
            (
                "lying_survivors",
                TrapPlan(pool_t, 1, cohort, target, lie_survivors=True, dropout=dropout, seed=setting.seed),
                secagg,
            )
        )
    reference = dict(strategies[-1]) if strategies else {}
    ref_dropout = float({**setting.hparams, **reference}.get("feature_dropout", 0.6))
    scenarios.append(
        (
            "without_secure_aggregation",
            TrapPlan(pool_t, rounds, [target], target, dropout=ref_dropout, seed=setting.seed),
            None,
        )
    )
    for name, plan, sa in scenarios:
        parties = _parties(setting, plan, sa, reference if sa is None else hp0)
        driver = _run(parties)
        server = parties.server
        assert isinstance(server, TrapServer)
        score = _score(server.captures, truth, foreign_t, pool_t)
        refused = _refusals(driver, [target, *(plan.cohort or [])])
        runs[name] = {
            "secure_aggregation": sa is not None,
            "hparams": reference if sa is None else hp0,
            "rounds_received": len(server.captures),
            "recovered_foreign": len(score.foreign),
            "recovered_any_node": len(score.any),
            "layer1_inputs_recovered": len(score.inputs),
            "best_foreign_cosine": score.best_foreign_cosine,
            "refused_by_clients": bool(refused),
            "errors": refused[:3],
        }
    secure = [n for n, _, sa in scenarios if sa is not None]
    out["chosen_weights_one_client"] = AttackOutcome(
        "chosen_weights_one_client",
        len(foreign_t),
        max(runs[n]["recovered_foreign"] for n in secure),
        all(runs[n]["refused_by_clients"] for n in secure),
        detail={
            "target": target,
            "runs": runs,
            "min_cohort": secagg.min_cohort,
            "threshold_of_3": secagg.threshold(3),
            "note": (
                "with secure aggregation the server never holds one client's update: a cohort below "
                f"min_cohort ({secagg.min_cohort}) is refused by the client, and an unmask request naming fewer "
                "survivors than the Shamir threshold (or counting a client that sent its input as dropped) is "
                "refused; recovered counts the target's foreign rows read out of anything the server received. "
                "without_secure_aggregation is a reference (plaintext updates, under the last strategy setting), "
                "not the protocol's default"
            ),
        },
    )

    # --- the aggregate -------------------------------------------------------------------------------
    pool = neighbourhood_means(setting, gradient_nodes(part, clients))
    foreign_all = _foreign_union(part, clients)
    by_strategy: dict[str, dict[str, Any]] = {}
    headline: _Score | None = None
    for k, hp in enumerate(strategies):
        drop = float({**setting.hparams, **hp}.get("feature_dropout", 0.6))
        plan = TrapPlan(pool, rounds, None, dropout=drop, seed=setting.seed + k)
        parties = _parties(setting, plan, secagg, hp)
        driver = _run(parties)
        server = parties.server
        assert isinstance(server, TrapServer)
        score = _score(server.captures, truth, foreign_all, pool)
        label = ",".join(f"{a}={b}" for a, b in hp.items()) or "default"
        by_strategy[label] = {
            "rounds_aggregated": len(server.captures),
            "cohort_sizes": [len(c.clients) for c in server.captures],
            "candidates": score.candidates,
            "recovered_foreign": len(score.foreign),
            "recovered_fraction": len(score.foreign) / len(foreign_all) if len(foreign_all) else 0.0,
            "recovered_any_node": len(score.any),
            "layer1_inputs_recovered": len(score.inputs),
            "best_foreign_cosine": score.best_foreign_cosine,
            "refusals": _refusals(driver, clients)[:3],
        }
        if headline is None:
            headline = score
    assert headline is not None
    out["chosen_weights_aggregate"] = AttackOutcome(
        "chosen_weights_aggregate",
        len(foreign_all),
        len(headline.foreign),
        False,
        detail={
            "rounds": rounds,
            "headline": next(iter(by_strategy)),
            "by_strategy": by_strategy,
            "note": (
                "trap weights to every client, read out of the securely aggregated mean (allowed by secure "
                "aggregation: the server sees the sum). Traps calibrated on the true inputs (upper bound); "
                "targets: every foreign row in the clients' inputs; recovered at cosine >= 0.99 after `rounds` "
                "attack rounds. Not detected: the weights are valid"
            ),
        },
    )

    # --- model inconsistency -------------------------------------------------------------------------
    plan = TrapPlan(pool_t, 1, clients, target, inconsistent=True, dropout=dropout, seed=setting.seed)
    parties = _parties(setting, plan, secagg, hp0)
    driver = _run(parties)
    server = parties.server
    assert isinstance(server, TrapServer)
    score = _score(server.captures, truth, foreign_t, pool_t)
    refused = _refusals(driver, clients)
    out["model_inconsistency"] = AttackOutcome(
        "model_inconsistency",
        len(foreign_t),
        len(score.foreign),
        bool(refused),
        detail={
            "target": target,
            "rounds_aggregated": len(server.captures),
            "refusals": len(refused),
            "errors": refused[:3],
            "mask_binding": digest_binding_check(),
            "note": (
                "trap weights to the target, the honest model to the others: every client compares the model "
                "digests in the signed adverts of its cohort and refuses a mismatch; mask_binding shows, with "
                "the real mask functions, that inputs masked for different digests unmask to noise"
            ),
        },
    )
    out["cohort_differencing"] = differencing_attack(
        setting, target, pool_t, foreign_t, secagg, hp0, strategies
    )
    return out


#: the DP-FedAvg budget of the differencing attack's protected run, over its K rounds
DIFFERENCING_DP_EPSILON = 8.0


def differencing_attack(
    setting: TrainingSetting,
    target: int,
    pool: np.ndarray,
    foreign: np.ndarray,
    secagg: SecAggConfig,
    headline: Mapping[str, Any],
    strategies: Sequence[Mapping[str, Any]],
) -> AttackOutcome:
    """``cohort_differencing`` (see the module docstring): K rounds of one trap state, round j without
    client j; the target's update differenced out of the sums and read out."""
    k = setting.partition.num_clients
    off = dict(strategies[-1]) if strategies else {}
    runs: dict[str, dict[str, Any]] = {}
    settings = {
        "default": dict(headline),
        "dropouts_off": off,
        "dropouts_off_dp_fedavg": {**off, "update_dp_epsilon": DIFFERENCING_DP_EPSILON},
    }
    for label, hp in settings.items():
        drop = float({**setting.hparams, **hp}.get("feature_dropout", 0.6))
        plan = TrapPlan(pool, k, None, target, dropout=drop, seed=setting.seed, differencing=True)
        parties = _parties(setting, plan, secagg, hp)
        driver = _run(parties)
        server = parties.server
        assert isinstance(server, TrapServer)
        own = server.differenced(target)
        refused = _refusals(driver, list(range(k)))
        sent = next(iter(server._sent.values()), None)
        score = (
            _score([Capture(0, sent, own, [target])], setting.truth, foreign, pool)
            if own is not None and sent is not None
            else _Score()
        )
        runs[label] = {
            "hparams": hp,
            "rounds_summed": len(server.sums),
            "differenced": own is not None,
            "recovered_foreign": len(score.foreign),
            "recovered_fraction": len(score.foreign) / len(foreign) if len(foreign) else 0.0,
            "layer1_inputs_recovered": len(score.inputs),
            "best_foreign_cosine": score.best_foreign_cosine,
            "refused_by_clients": bool(refused),
            "errors": refused[:3],
        }
    head = runs["default"]
    return AttackOutcome(
        "cohort_differencing",
        len(foreign),
        int(head["recovered_foreign"]),
        bool(head["refused_by_clients"]),
        ran=k - 1 >= secagg.min_cohort,
        detail={
            "target": target,
            "clients": k,
            "min_cohort": secagg.min_cohort,
            "dp_fedavg_epsilon": DIFFERENCING_DP_EPSILON,
            "runs": runs,
            "note": (
                "the same trap weights in K rounds, round j sampling every client but j: secure aggregation is "
                "per round, so the sums difference into the target's own update (known break 2), read out like "
                "a plaintext one; needs K - 1 >= min_cohort. dropouts_off_dp_fedavg adds DP-FedAvg "
                f"(epsilon {DIFFERENCING_DP_EPSILON:g} over the K rounds, off by default)"
            ),
        },
    )
