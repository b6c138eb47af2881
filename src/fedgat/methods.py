r"""The methods of the paper's Table 1 behind one entry point, :func:`run_method`.

==========  =====================================================================================
fedgat      FedGAT: one pre-training round ships every client the encodings (paper eq. 9-14) of its
            ``needed`` nodes (owned + 1-hop); layer 1 is :class:`~fedgat.layer.FedGATConv`, layer 2
            an exact ``GATConv`` over the client's edges into owned nodes. Plaintext encodings here.
distgat     Federated GAT with every cross-client edge dropped; a client sees only its own nodes.
fedgcn      FedGCN (Yao et al. 2023), 2-hop communication for a 2-layer GCN: one pre-training round
            ships :math:`(\hat A X)_i` for the client's needed nodes, full-graph :math:`\hat A`.
gat         Centralised GAT (PyG ``GATConv``) on the whole graph: one client, no federation.
gcn         Centralised 2-layer GCN (Kipf & Welling).
==========  =====================================================================================

All methods share the training loop of :mod:`fedgat.federated` (centralised ones with a single
client, where FedAvg is the identity), the same Dirichlet label split for a given
``(num_clients, beta, seed)``, and early stopping on pooled validation accuracy.

Speed: FedGAT's layer-1 output of node :math:`v` depends only on :math:`v`'s encodings (FedGCN's
only on :math:`(\hat A X)_v`), and a loss or prediction only on layer-2 outputs at its target
nodes. So each such client trains on the 1-hop support of its training nodes and evaluates on the
supports of its validation and of its test nodes, all drawn from its ``needed`` nodes: the same
gradients and predictions as a forward over all of ``needed``, several times cheaper, and the server
evaluates validation alone each round (test only at a new best). ``pretrain_bytes`` still counts
every ``needed`` node, as the protocol ships them all.
"""

from __future__ import annotations

import difflib
import math
import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn

from fedgat.approx import PSI_NAMES, fit_score
from fedgat.cuda_graphs import check_device as cuda_graphs_device
from fedgat.device import resolve_device
from fedgat.dp import MECHANISMS, block_rows
from fedgat.dp_fedavg import UpdateDP, charge_owners, check_owners, update_dp_from_hparams
from fedgat.dp_ledger import DPLedger, owner_ledgers
from fedgat.dp_predictor import train_predictor
from fedgat.dp_release import check_budgets, draw_release, feature_dp_from_hparams, spent_by_owner
from fedgat.dp_release import check_sweep as check_release_sweep
from fedgat.encodings import as_variant, encode, encoding_size
from fedgat.federated import Client, LocalTask, Server, client_seed, strategy_from_hparams
from fedgat.gcn import GCN, PrecomputedGCN, normalised_aggregate
from fedgat.graph import CSR, Graph, check_trainable
from fedgat.models import GAT, FedGAT
from fedgat.owners import owner_clients
from fedgat.partition import Partition, check_graph, drop_cross_client, make_partition
from fedgat.randomness import RandomSource
from fedgat.rounds import pool_counts
from fedgat.tasks import owned_targets, support_tasks

METHODS: tuple[str, ...] = ("fedgat", "distgat", "fedgcn", "gat", "gcn")
CENTRALISED: tuple[str, ...] = ("gat", "gcn")
BYTES_PER_REAL = 4  # float32
#: neighbour cap the matrix variant gets unless one is given (its encodings grow like sum n^2)
MATRIX_DEFAULT_CAP = 16

#: keyword arguments of the entry points that take hyper-parameters as ``**hparams`` beside their own
#: (:func:`run_method`, :func:`fedgat.pipeline.run_encrypted_fedgat`, :func:`fedgat.pipeline.train_fedgat`):
#: a misspelt one lands among the hyper-parameters, so the message suggests these too
CALL_ARGUMENTS = (
    "num_clients",
    "beta",
    "seed",
    "owner",
    "encrypted",
    "variant",
    "preset",
    "wire",
    "transport",
    "progress",
    "workers",
    "chunks",
    "dp_ledgers",
    "device",
    "upload_window",
    "encrypt_workers",
    "deployment",
    "fingerprint",
    "cuda_graphs",
    "dp_releases",
    "compact_tol",
)

_TRAINING = {
    "rounds": 500,
    "patience": 100,
    "local_epochs": 1,
    "lr": 0.005,
    "weight_decay": 5e-4,
    "fraction": 1.0,
    "mu": 0.0,
    "strategy": "fedadam",
    "client_lr": 1.0,
    "update_dp_epsilon": None,
    "update_dp_delta": 1e-5,
    "update_dp_clip": 1.0,
    "update_dp_budget": None,
    "update_dp_ledger_dir": None,
}
_GAT = {"hidden": 8, "heads": 8, "dropout": 0.6}
_GCN = {"hidden": 16, "dropout": 0.5, "lr": 0.01}
_DEFAULTS: dict[str, dict] = {
    "fedgat": {
        **_TRAINING,
        **_GAT,
        "variant": "vector",
        "feature_dropout": 0.6,
        "degree": 16,
        "domain": 4.0,
        "psi": "leaky_relu",
        "fit": "interpolation",
        "neighbour_cap": "auto",
        "min_cross": 0,
        "share": "rows",
        "dp_epsilon": None,
        "dp_delta": 1e-5,
        "dp_mechanism": "label_rr",
        "dp_dim": 64,
        "dp_bounds": (-1.0, 1.0),
        "dp_predictor_rounds": 50,
        "dp_predictor_hidden": 64,
        "dp_budget": None,
        "dp_ledger_dir": None,
    },
    "distgat": {**_TRAINING, **_GAT},
    "fedgcn": {**_TRAINING, **_GCN},
    "gat": {**_TRAINING, **_GAT},
    "gcn": {**_TRAINING, **_GCN},
}


def default_hparams(method: str) -> dict:
    """The hyper-parameters ``method`` runs with unless overridden (a fresh dict).

    Shared: ``rounds`` (max rounds), ``patience`` (early stopping, rounds), ``local_epochs`` (E),
    ``lr``, ``weight_decay`` (Adam), ``fraction`` (clients per round), ``mu`` (FedProx; 0 = FedAvg),
    ``strategy`` ("fedadam", the default: clients run SGD with ``client_lr``, the server runs Adam,
    :class:`fedgat.federated.FedAdam`; "fedavg", the paper's: clients run Adam, the server averages).
    GAT-type: ``hidden``, ``heads``, ``dropout``. GCN-type: ``hidden``, ``dropout``.
    FedGAT: ``variant`` ("vector"/"matrix"), ``feature_dropout`` (columns of W), ``degree``,
    ``domain``, ``psi``, ``fit`` (score polynomial, :func:`fedgat.approx.fit_score`),
    ``neighbour_cap`` ("auto": 16 for matrix, None for vector), ``min_cross`` (the paper's rule k;
    0, the default, is off: see :func:`fedgat.partition.make_partition`); ``share`` ("rows", the
    default: foreign rows, or their DP release, enter the encodings; "edges": only the cross-client
    edges do -- every foreign row is the block layout's constant marker, no feature leaves its
    owner: the zero-information limit of a DP release, in the simulation only); ``dp_epsilon``
    (None: off), ``dp_delta``, ``dp_mechanism`` ("label_rr", "gaussian", "multibit"), ``dp_dim``
    (gaussian's projection), ``dp_bounds`` (multibit's public coordinate range): the DP release of the rows other clients' encodings use
    (:class:`fedgat.dp.FeatureDP`; every model then reads the block layout, own rows clean);
    ``dp_predictor_rounds``, ``dp_predictor_hidden``: label_rr's predictor
    (:mod:`fedgat.dp_predictor`); ``dp_budget`` (``(epsilon, delta)``, needed for owners without a
    ledger yet) and ``dp_ledger_dir`` (None: ``~/.fedgat/dp_ledger`` or ``$FEDGAT_DP_LEDGER_DIR``):
    each owner's persistent ledger (:func:`fedgat.dp_ledger.owner_ledgers`), charged before its
    release is drawn.
    Every federated method: ``update_dp_epsilon`` (None: off), ``update_dp_delta``,
    ``update_dp_clip``: client-level DP of the training updates over ``rounds`` rounds (plus the
    predictor's rounds with label_rr) (DP-FedAvg, :class:`fedgat.dp_fedavg.UpdateDP`);
    ``update_dp_budget`` (``(epsilon, delta)``) and/or ``update_dp_ledger_dir`` (None: off; given,
    each client's persistent DP-FedAvg ledger, ``client-<c>-updates.json`` in that folder or the
    default one, is charged the run's releases before anything is trained, and a run past it is
    refused: :func:`fedgat.dp_fedavg.charge_owners`).
    """
    _check_method(method)
    return dict(_DEFAULTS[method])


#: clients of a Dirichlet split unless a caller says otherwise
DEFAULT_CLIENTS = 10

#: hyper-parameter -> (lowest, highest, whether each end is included); checked where present
_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "lr": (0.0, math.inf, False, False),
    "client_lr": (0.0, math.inf, False, False),
    "weight_decay": (0.0, math.inf, True, False),
    "mu": (0.0, math.inf, True, False),
    "fraction": (0.0, 1.0, False, True),
    "dropout": (0.0, 1.0, True, False),
    "feature_dropout": (0.0, 1.0, True, False),
    "domain": (0.0, math.inf, False, False),
    "update_dp_delta": (0.0, 1.0, False, False),
    "update_dp_clip": (0.0, math.inf, False, False),
}
#: integer hyper-parameters -> their least value
_COUNTS = {
    "rounds": 1,
    "patience": 1,
    "local_epochs": 1,
    "hidden": 1,
    "heads": 1,
    "degree": 1,
    "min_cross": 0,
    "dp_dim": 1,
    "dp_predictor_hidden": 1,
}
#: hyper-parameters of _RANGES and _COUNTS that may be None (no early stop; no DP projection)
_OPTIONAL = ("patience", "dp_dim")


def check_ranges(hp: dict) -> None:
    """Each hyper-parameter ``hp`` holds inside its range (rates in (0, inf), dropouts in [0, 1),
    ``fraction`` in (0, 1], counts integers >= 1, ``min_cross`` >= 0, ``psi`` a known score), so a
    bad value fails before any set-up, not deep inside a run (or, for ``mu < 0``, never).

    Raises:
        ValueError: naming the hyper-parameter, its range and the value.
    """
    for name, (low, high, low_in, high_in) in _RANGES.items():
        value = hp.get(name)
        if name not in hp or (value is None and name in _OPTIONAL):
            continue
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        v = float(value) if real else math.nan  # type: ignore[arg-type]
        inside = (low <= v if low_in else low < v) and (v <= high if high_in else v < high)
        if not (math.isfinite(v) and inside):
            span = f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"
            raise ValueError(f"{name} must lie in {span}, got {value!r}")
    for name, least in _COUNTS.items():
        value = hp.get(name)
        if name not in hp or (value is None and name in _OPTIONAL):
            continue
        if not (isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= least):
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    for name in ("dp_budget", "update_dp_budget"):
        budget = hp.get(name)
        if budget is not None:
            pair = isinstance(budget, (tuple, list)) and len(budget) == 2
            if not pair or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in budget):
                raise ValueError(f"{name} must be a pair (epsilon, delta) of numbers, got {budget!r}")
    if "psi" in hp and hp["psi"] not in PSI_NAMES:
        raise ValueError(f"unknown psi {hp['psi']!r}; choose one of {', '.join(PSI_NAMES)}")


def resolve_hparams(method: str, overrides: dict) -> dict:
    """Defaults updated with ``overrides``; "auto" neighbour caps resolved.

    Raises:
        ValueError: unknown method, unknown hyper-parameter name, a value out of its range
            (:func:`check_ranges`), a bad strategy setting, or a bad FedGAT variant.
    """
    hp = default_hparams(method)
    unknown = sorted(set(overrides) - set(hp))
    if unknown:
        close = {u: difflib.get_close_matches(u, [*hp, *CALL_ARGUMENTS], n=1) for u in unknown}
        meant = "; ".join(f"{u!r}: did you mean {m[0]!r}?" for u, m in close.items() if m)
        raise ValueError(
            f"unknown hyper-parameter(s) {unknown} for method {method!r}"
            + (f" ({meant})" if meant else "")
            + f"; known: {sorted(hp)}"
        )
    hp.update(overrides)
    check_ranges(hp)
    strategy_from_hparams(hp)  # an unknown strategy, or mu with FedAdam, fails here, before any set-up
    if method == "fedgat":
        variant = as_variant(hp["variant"])  # ValueError for an unknown name, listing the choices
        if hp["dp_mechanism"] not in MECHANISMS:
            raise ValueError(f"unknown dp_mechanism {hp['dp_mechanism']!r}; choose one of {MECHANISMS}")
        if hp["share"] not in ("rows", "edges"):
            raise ValueError(f"share must be 'rows' or 'edges', got {hp['share']!r}")
        if hp["share"] == "edges" and hp["dp_epsilon"] is not None:
            raise ValueError("share='edges' releases no rows: it takes no dp_epsilon")
        if not (isinstance(hp["dp_predictor_rounds"], int) and hp["dp_predictor_rounds"] >= 1):
            raise ValueError(f"dp_predictor_rounds must be an int >= 1, got {hp['dp_predictor_rounds']!r}")
        if hp["neighbour_cap"] == "auto":
            hp["neighbour_cap"] = variant.default_neighbour_cap
    return hp


@dataclass
class RunResult:
    """One training run.

    Attributes:
        method, dataset, num_clients, beta, seed: what ran (centralised methods: 1 client).
        test_accuracy: pooled test accuracy at the round of best validation accuracy. Under
            DP-FedAvg the rounds see only noised counts (the history's accuracies, the best round's
            choice); this is then the chosen model's exact test accuracy, which the simulation can
            measure and a deployment cannot.
        best_val_accuracy, best_round: that round's validation accuracy and index (1-based).
        rounds: rounds actually run (early stopping).
        pretrain_bytes: float32 bytes the pre-training round ships to all clients together.
        pretrain_seconds: time to build partition, pre-training data and models.
        train_seconds: wall time of the rounds (training and per-round evaluation).
        hparams: the resolved hyper-parameters.
        history: per-round metrics (``round``, ``train_loss``, ``clients``, ``val_accuracy``,
            ``val_loss``; ``test_accuracy``, ``test_loss`` in rounds that set a new best).
    """

    method: str
    dataset: str
    num_clients: int
    beta: float
    seed: int
    test_accuracy: float
    best_val_accuracy: float
    best_round: int
    rounds: int
    pretrain_bytes: int
    pretrain_seconds: float
    train_seconds: float
    hparams: dict
    history: list[dict] = field(default_factory=list, repr=False)
    #: with a DP release (``dp_epsilon``): the largest ``(epsilon, delta)`` any owner's ledger has
    #: spent on its rows after this run's release (composed with its earlier releases)
    dp_spent: tuple[float, float] | None = None
    #: with DP-FedAvg (``update_dp_epsilon``): the ``(epsilon, delta)`` the rounds spent of each
    #: client's update budget (the most rounds any client trained in)
    update_dp_spent: tuple[float, float] | None = None
    #: with DP-FedAvg ledgers (``update_dp_budget`` / ``update_dp_ledger_dir``): the largest
    #: ``(epsilon, delta)`` any client's ledger has spent after this run's charge (earlier runs composed)
    update_ledger_spent: tuple[float, float] | None = None

    def to_dict(self, history: bool = False) -> dict:
        out = asdict(self)
        if not history:
            out.pop("history")
        return out


@dataclass
class Federation:
    """What a method's set-up produces: per-client ``(train, evaluation)`` tasks (the arguments of
    :class:`~fedgat.federated.Client`), a model factory and the pre-training traffic."""

    tasks: Sequence[tuple[LocalTask, LocalTask | Sequence[LocalTask]]]
    model_fn: Callable[[], nn.Module]
    pretrain_bytes: int
    #: with a DP release: the largest ``(epsilon, delta)`` an owner's ledger has spent on its rows
    dp_spent: tuple[float, float] | None = None
    #: per client, the rounds it trained in before FedGAT's (label_rr's predictor), which DP-FedAvg counts
    dp_releases: Sequence[int] | None = None


def run_method(
    method: str,
    graph: Graph,
    num_clients: int | None = None,
    beta: float = 1.0,
    seed: int = 0,
    callback: Callable[[int, dict], None] | None = None,
    *,
    owner: np.ndarray | None = None,
    device: str | torch.device | None = None,
    cuda_graphs: bool = False,
    **hparams,
) -> RunResult:
    """Set up ``method`` on ``graph`` split among ``num_clients`` clients and train it.

    Args:
        method: one of :data:`METHODS`.
        graph: the full graph (features unit-norm rows).
        num_clients, beta: Dirichlet label split (ignored by centralised methods); ``num_clients``
            defaults to the owners' count with ``owner``, else 10.
        seed: seeds the split, the encodings' bases, model initialisation, dropout and client
            sampling; a run is reproducible from its arguments.
        callback: ``callback(round, metrics)`` after every round (progress bars).
        owner: ``(N,)`` client id of every node, the user's split instead of the Dirichlet one
            (checked by :func:`fedgat.owners.owner_clients`: every client ``0..K-1`` owns a node, and
            ``num_clients``, when given, is ``K``; ``beta`` is unused); read a user's file with
            :func:`fedgat.owners.load_owners`. Ignored by centralised methods.
        device: where the clients train (:func:`fedgat.device.resolve_device`; default the CPU):
            models, optimisers, encodings and labels live there, the server's global weights and
            their aggregation stay on the CPU (:class:`~fedgat.federated.Client`). Not a
            hyper-parameter: results do not depend on it beyond floating-point rounding, and it is not
            recorded in ``hparams``. FedGAT's label_rr release predictor trains on the CPU.
        cuda_graphs: on a CUDA ``device``, every client's local step runs as a captured CUDA graph
            (:class:`~fedgat.federated.Client`'s ``cuda_graphs``; a GPU epoch is bound by kernel
            launches, and a graph is one launch). ValueError on another device.
        **hparams: overrides of :func:`default_hparams`.

    Returns:
        A :class:`RunResult`.

    Raises:
        ValueError: unknown method or hyper-parameter, or invalid settings.
        fedgat.device.DeviceError: an unknown ``device``, or CUDA asked for without one (a ValueError).
    """
    check_graph(graph)
    hp = resolve_hparams(method, hparams)
    check_trainable(graph)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    device = resolve_device(device)  # before any set-up
    if cuda_graphs:
        cuda_graphs_device(device)
    if method in CENTRALISED:
        clients, owner = 1, None
    elif owner is not None:
        owner, clients = owner_clients(owner, num_clients, graph.num_nodes)
    else:
        clients = DEFAULT_CLIENTS if num_clients is None else num_clients
    update_dp = None if method in CENTRALISED else update_dp_from_hparams(hp)
    update_ledgers = None
    release = feature_dp_from_hparams(hp, seed) if method == "fedgat" else None
    if wants_update_ledgers(hp, update_dp) and release is not None and release.needs_predictor:
        # the builder trains label_rr's predictor under DP-FedAvg: charge before it, after the rows'
        # budgets (which the builder charges) are checked, so that a run they refuse charges no update
        part = fedgat_partition(graph, clients, beta, seed, hp, owner)
        check_budgets(graph, part, release, owner_ledgers(clients, hp["dp_budget"], hp["dp_ledger_dir"]))
        update_ledgers = charge_update_ledgers(clients, update_dp, hp)
    start = time.perf_counter()
    fed = _BUILDERS[method](graph, clients, beta, seed, hp, owner)
    torch.manual_seed(seed)
    model = fed.model_fn()
    initial = model.state_dict()
    strategy = strategy_from_hparams(hp, model)
    members = [
        Client.from_hparams(
            i,
            fed.model_fn(),
            train,
            evaluation,
            hp,
            strategy=strategy.client,
            update_dp=update_dp,
            device=device,
            cuda_graphs=cuda_graphs,
            seed=client_seed(seed, i),
        )
        for i, (train, evaluation) in enumerate(fed.tasks)
    ]
    for member, before in zip(members, fed.dp_releases or (), strict=False):
        member.dp_releases = before  # the predictor's rounds count against the same DP-FedAvg budget
    server = Server(members, initial, strategy.server, fraction=hp["fraction"], seed=seed)
    if update_ledgers is None:  # every setting checked above: charged just before the first update
        update_ledgers = charge_update_ledgers(clients, update_dp, hp)
    pretrain_seconds = time.perf_counter() - start
    start = time.perf_counter()
    fit = server.fit(hp["rounds"], hp["patience"], callback)
    test_accuracy = fit.test_accuracy
    if update_dp is not None:  # the rounds' counts were noised releases: measure the chosen model
        exact = [m.evaluate(server.best_state, ("test",)) for m in members]
        test_accuracy = pool_counts(exact, ("test",))["test_accuracy"]
    return RunResult(
        method=method,
        dataset=graph.name,
        num_clients=clients,
        beta=float(beta),
        seed=seed,
        test_accuracy=test_accuracy,
        best_val_accuracy=fit.best_val_accuracy,
        best_round=fit.best_round,
        rounds=fit.rounds,
        pretrain_bytes=fed.pretrain_bytes,
        pretrain_seconds=pretrain_seconds,
        train_seconds=time.perf_counter() - start,
        hparams=hp,
        history=fit.history,
        dp_spent=fed.dp_spent,
        update_dp_spent=None
        if update_dp is None
        else (update_dp.epsilon(max(m.dp_releases for m in members)), update_dp.delta),
        update_ledger_spent=max(update_ledgers.values()) if update_ledgers else None,
    )


def wants_update_ledgers(hp: Mapping, update_dp: UpdateDP | None = None) -> bool:
    """Whether ``hp`` asks for the clients' DP-FedAvg ledgers (``update_dp_budget`` or
    ``update_dp_ledger_dir``).

    Raises:
        ValueError: it does, and the run has no DP-FedAvg (``update_dp``, e.g.
            :func:`~fedgat.dp_fedavg.update_dp_from_hparams`; centralised methods have no updates).
    """
    if hp.get("update_dp_budget") is None and hp.get("update_dp_ledger_dir") is None:
        return False
    if update_dp is None:
        raise ValueError(
            "update_dp_budget / update_dp_ledger_dir: a DP-FedAvg ledger needs update_dp_epsilon in a "
            "federated method"
        )
    return True


def check_update_sweep(num_clients: int, hp: Mapping, runs: int) -> None:
    """Before a sweep of ``runs`` runs (seeds) with the same DP-FedAvg settings: whether every
    client's ledger can pay for all of them (each run is still charged on its own, when it starts), so
    that a sweep is refused before its first run instead of after the runs it paid for.

    Raises:
        fedgat.dp_ledger.BudgetExceededError: some client's ledger cannot pay for the ``runs`` runs.
    """
    update_dp = update_dp_from_hparams(dict(hp))
    if wants_update_ledgers(hp, update_dp):
        assert update_dp is not None  # wants_update_ledgers refused it
        check_owners(_update_ledgers(num_clients, hp), update_dp, runs)


def check_sweep(
    method: str,
    graph: Graph,
    num_clients: int,
    beta: float,
    seeds: Sequence[int],
    hp: Mapping,
    owner: np.ndarray | None = None,
) -> None:
    """Before a sweep of ``method`` over ``seeds`` with resolved hyper-parameters ``hp``: whether every
    ledger the runs charge can pay for all of them -- the clients' DP-FedAvg ledgers
    (:func:`check_update_sweep`) and, for FedGAT's DP release, the owners' row ledgers over each
    seed's split (:func:`fedgat.dp_release.check_sweep`) -- so that a sweep is refused before its first
    run instead of after the runs it paid for. Nothing is charged; each run still charges its own.

    Raises:
        fedgat.dp_ledger.BudgetExceededError, fedgat.dp_ledger.MissingLedgerError: some ledger cannot
            pay, or does not exist and no budget starts it.
    """
    if method in CENTRALISED:
        return
    check_update_sweep(num_clients, hp, len(seeds))
    dp = feature_dp_from_hparams(hp, seeds[0]) if method == "fedgat" and len(seeds) else None
    if dp is not None:
        partitions = [fedgat_partition(graph, num_clients, beta, s, dict(hp), owner) for s in seeds]
        ledgers = owner_ledgers(num_clients, hp["dp_budget"], hp["dp_ledger_dir"])
        check_release_sweep(graph, partitions, dp, ledgers)


def charge_update_ledgers(
    num_clients: int, update_dp: UpdateDP | None, hp: Mapping
) -> dict[int, tuple[float, float]] | None:
    """With ``update_dp_budget`` or ``update_dp_ledger_dir``: charge each client's persistent DP-FedAvg
    ledger a run's releases (:func:`fedgat.dp_fedavg.charge_owners`; client id -> ``(epsilon, delta)``
    spent after it); None without either.

    Raises:
        ValueError: a ledger asked for without DP-FedAvg (``update_dp_epsilon``; centralised methods
            have no updates).
        fedgat.dp_ledger.BudgetExceededError: the run would pass a client's budget (nothing charged).
        fedgat.dp_ledger.MissingLedgerError: a client without a ledger yet and no budget to start one.
    """
    if not wants_update_ledgers(hp, update_dp):
        return None
    assert update_dp is not None  # wants_update_ledgers refused it
    return charge_owners(_update_ledgers(num_clients, hp), update_dp)


def _update_ledgers(num_clients: int, hp: Mapping) -> dict[int, DPLedger]:
    return owner_ledgers(num_clients, hp["update_dp_budget"], hp["update_dp_ledger_dir"], updates=True)


def build_federation(
    method: str,
    graph: Graph,
    num_clients: int = 10,
    beta: float = 1.0,
    seed: int = 0,
    *,
    owner: np.ndarray | None = None,
    **hparams,
) -> Federation:
    """The clients' pre-training data and model factory of ``method``, without training (what
    :func:`run_method` trains on; centralised methods get one client whatever ``num_clients``)."""
    hp = resolve_hparams(method, hparams)
    return _BUILDERS[method](graph, 1 if method in CENTRALISED else num_clients, beta, seed, hp, owner)


def pretrain_bytes(
    method: str,
    graph: Graph,
    num_clients: int = 10,
    beta: float = 1.0,
    seed: int = 0,
    *,
    owner: np.ndarray | None = None,
    **hparams,
) -> int:
    """The float32 bytes ``method``'s pre-training round ships (summed over clients), without
    building the encodings or training; equals :attr:`RunResult.pretrain_bytes`."""
    hp = resolve_hparams(method, hparams)
    if method == "fedgat":
        return _fedgat_bytes(
            fedgat_partition(graph, num_clients, beta, seed, hp, owner), hp["variant"], graph.num_features
        )
    if method == "fedgcn":
        part = make_partition(graph, num_clients, beta, seed, min_cross=0, owner=owner)
        return _fedgcn_bytes(part, graph.num_features)
    return 0


# ----------------------------------------------------------------------------------------- builders


def _build_fedgat(
    graph: Graph, num_clients: int, beta: float, seed: int, hp: dict, owner: np.ndarray | None = None
) -> Federation:
    """FedGAT clients: encodings of their training/eval supports (subsets of ``needed``).

    With ``dp_epsilon`` set, a client's encodings use the block layout of :mod:`fedgat.dp`: its own
    nodes' clean features and every other node's DP release, each owner's rows drawn with fresh
    CSPRNG randomness and charged first to its ledger (``dp_budget``, ``dp_ledger_dir``); for
    ``label_rr`` after the release predictor's rounds (:func:`fedgat.dp_predictor.train_predictor`).
    With ``share="edges"`` every foreign row is the layout's marker alone.
    """
    part = fedgat_partition(graph, num_clients, beta, seed, hp, owner)
    nbh = part.neighbourhoods
    bases = RandomSource.from_seed(f"fedgat-bases:{seed}")
    x, shared, dp_spent, dp_releases = graph.x, None, None, None
    dp = feature_dp_from_hparams(hp, seed)
    if dp is not None:
        ledgers = owner_ledgers(part.num_clients, hp["dp_budget"], hp["dp_ledger_dir"])
        check_budgets(graph, part, dp, ledgers)
        predictor = None
        if dp.needs_predictor:
            predictor, dp_releases = train_predictor(
                graph, part, seed, hp, update_dp=update_dp_from_hparams(hp)
            )
        release = draw_release(graph, part, dp, ledgers=ledgers, predictor=predictor)
        x, shared = block_rows(graph.x, release)
        spent = spent_by_owner(graph, part, ledgers)
        dp_spent = max(spent.values()) if spent else None
    elif hp["share"] == "edges":
        x, shared = block_rows(graph.x, torch.ones(graph.num_nodes, 1, dtype=graph.x.dtype))

    def inputs(nodes: np.ndarray, edges: torch.Tensor, client: int) -> tuple:
        enc = encode(
            hp["variant"],
            x,
            nbh,
            nodes=nodes,
            rng=bases,
            shared_x=shared,
            owner=part.owner if shared is not None else None,
            viewer=client,
        )
        return enc.compact().factorise(), edges

    tasks = support_tasks(graph, part, inputs)
    model_fn = fedgat_model_fn(x.shape[1], graph.num_classes, hp)
    return Federation(tasks, model_fn, _fedgat_bytes(part, hp["variant"], x.shape[1]), dp_spent, dp_releases)


def _build_distgat(
    graph: Graph, num_clients: int, beta: float, seed: int, hp: dict, owner: np.ndarray | None = None
) -> Federation:
    """DistGAT clients: raw features of owned nodes, edges between owned nodes only."""
    part = make_partition(graph, num_clients, beta, seed, owner=owner)
    csr = drop_cross_client(part)
    tasks = []
    for cp in part.clients:
        local = np.full(graph.num_nodes, -1, dtype=np.int64)
        local[cp.owned] = np.arange(len(cp.owned))
        src, dst = _incoming_edges(csr, cp.owned)
        edges = torch.from_numpy(np.stack([local[src], local[dst]]))
        task = LocalTask((graph.x[cp.owned], edges), owned_targets(graph, cp.owned))
        tasks.append((task, task))
    return Federation(tasks, _gat_factory(graph, hp), 0)


def _build_fedgcn(
    graph: Graph, num_clients: int, beta: float, seed: int, hp: dict, owner: np.ndarray | None = None
) -> Federation:
    r"""FedGCN clients: :math:`(\hat A X)` rows of their needed nodes, full-graph :math:`\hat A`.

    The partition keeps every edge (``min_cross=0``: FedGCN has no minimum-cross rule), so each
    client's local edges are all edges into its owned nodes, weighted :math:`1/\sqrt{\tilde d_i \tilde
    d_j}` with full-graph degrees; owned nodes' logits then equal the centralised GCN's.
    """
    part = make_partition(graph, num_clients, beta, seed, min_cross=0, owner=owner)
    nbh = part.neighbourhoods  # = graph.neighbourhoods(self_loops=True): nothing was filtered
    ax = normalised_aggregate(graph.x, nbh)  # (N, d): the server's one-round aggregate
    inv_sqrt_deg = torch.from_numpy(nbh.degrees()).float().rsqrt()

    def inputs(nodes: np.ndarray, edges: torch.Tensor, client: int) -> tuple:
        glob = torch.from_numpy(nodes)[edges]
        return ax[nodes], edges, inv_sqrt_deg[glob[0]] * inv_sqrt_deg[glob[1]]

    tasks = support_tasks(graph, part, inputs)

    def model_fn() -> nn.Module:
        return PrecomputedGCN(graph.num_features, graph.num_classes, hp["hidden"], hp["dropout"])

    return Federation(tasks, model_fn, _fedgcn_bytes(part, graph.num_features))


def _build_gat(
    graph: Graph, num_clients: int, beta: float, seed: int, hp: dict, owner: np.ndarray | None = None
) -> Federation:
    """Centralised GAT: one client holding the whole graph."""
    everyone = np.arange(graph.num_nodes)
    edges = graph.neighbourhoods(self_loops=True).to_edge_index()
    task = LocalTask((graph.x, edges), owned_targets(graph, everyone))
    return Federation([(task, task)], _gat_factory(graph, hp), 0)


def _build_gcn(
    graph: Graph, num_clients: int, beta: float, seed: int, hp: dict, owner: np.ndarray | None = None
) -> Federation:
    """Centralised GCN: one client holding the whole graph."""
    task = LocalTask((graph.x, graph.edge_index), owned_targets(graph, np.arange(graph.num_nodes)))

    def model_fn() -> nn.Module:
        return GCN(graph.num_features, graph.num_classes, hp["hidden"], hp["dropout"])

    return Federation([(task, task)], model_fn, 0)


_BUILDERS = {
    "fedgat": _build_fedgat,
    "distgat": _build_distgat,
    "fedgcn": _build_fedgcn,
    "gat": _build_gat,
    "gcn": _build_gcn,
}


# ------------------------------------------------------------------------------------------ helpers


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")


def fedgat_partition(
    graph: Graph, num_clients: int, beta: float, seed: int, hp: dict, owner: np.ndarray | None = None
) -> Partition:
    """FedGAT's 2-layer split with the ``min_cross`` and ``neighbour_cap`` of resolved
    hyper-parameters ``hp`` (:func:`resolve_hparams`): the Dirichlet split ``(num_clients, beta,
    seed)``, or the user's ``owner`` array; every FedGAT engine splits this way
    (:func:`fedgat.pipeline.run_encrypted_fedgat`, the Flower apps)."""
    return make_partition(
        graph,
        num_clients,
        beta,
        seed,
        num_layers=2,
        min_cross=hp["min_cross"],
        neighbour_cap=hp["neighbour_cap"],
        owner=owner,
    )


def fedgat_model_fn(num_features: int, num_classes: int, hp: dict) -> Callable[[], nn.Module]:
    """A factory of FedGAT models (:class:`fedgat.models.FedGAT`) for resolved hyper-parameters ``hp``:
    each call draws a fresh model from torch's global generator."""
    score = fit_score(hp["psi"], hp["degree"], hp["domain"], hp["fit"])

    def model_fn() -> nn.Module:
        return FedGAT(
            num_features,
            num_classes,
            hidden=hp["hidden"],
            heads=hp["heads"],
            dropout=hp["dropout"],
            feature_dropout=hp["feature_dropout"],
            score=score,
        )

    return model_fn


def _fedgat_bytes(part: Partition, variant: str, num_features: int) -> int:
    """Bytes of the encodings of every client's ``needed`` nodes (= ``Encodings.nbytes()``)."""
    degrees = part.neighbourhoods.degrees()
    sizes = np.concatenate([degrees[c.needed] for c in part.clients])
    return int(encoding_size(variant, sizes, num_features)["total_reals"]) * BYTES_PER_REAL


def _fedgcn_bytes(part: Partition, num_features: int) -> int:
    """Bytes of one d-vector per ``needed`` node per client."""
    return sum(len(c.needed) for c in part.clients) * num_features * BYTES_PER_REAL


def _gat_factory(graph: Graph, hp: dict) -> Callable[[], nn.Module]:
    def model_fn() -> nn.Module:
        return GAT(
            graph.num_features,
            graph.num_classes,
            hidden=hp["hidden"],
            heads=hp["heads"],
            dropout=hp["dropout"],
        )

    return model_fn


def _incoming_edges(csr: CSR, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Global ``(src, dst)`` of every entry in the rows ``targets`` of ``csr``, row by row."""
    sizes = csr.degrees()[targets]
    starts = np.repeat(csr.indptr[targets] - np.cumsum(sizes) + sizes, sizes)
    return csr.indices[starts + np.arange(sizes.sum())], np.repeat(targets, sizes)
