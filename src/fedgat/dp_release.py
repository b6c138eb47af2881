"""A whole federation's DP release, drawn owner by owner: what the simulations (:mod:`fedgat.methods`,
the plaintext pre-training of :mod:`fedgat.pipeline`, the audit) share with the protocol, where each
:class:`~fedgat.protocols.ClientPretrain` draws its own rows the same way.

* :func:`feature_dp_from_hparams` -- the :class:`fedgat.dp.FeatureDP` a run's hyper-parameters ask for;
* :func:`draw_release` -- every owner's release with its own ledger (and, for ``label_rr``, the
  published predictor), as ``(N, w)`` rows;
* :func:`check_budgets` -- whether every owner's budget still pays for one release, before anything
  runs (the predictor's rounds included);
* :func:`check_sweep` -- the same for a sweep of runs (seeds), each with its own split, before the first;
* :func:`spent_by_owner` -- what each owner's ledger has spent on its rows.

One process holds every simulated owner's ledger, so each check counts a row's releases in all of
them, not only in its current owner's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from fedgat.dp import FeatureDP, LabelPredictor
from fedgat.dp_ledger import DPLedger, MissingLedgerError, row_ids
from fedgat.graph import Graph
from fedgat.partition import Partition

__all__ = ["check_budgets", "check_sweep", "draw_release", "feature_dp_from_hparams", "spent_by_owner"]


def feature_dp_from_hparams(hp: Mapping, seed: int) -> FeatureDP | None:
    """The release a run's resolved FedGAT hyper-parameters ask for (``dp_epsilon`` None: none):
    ``dp_mechanism`` at ``(dp_epsilon, dp_delta)``, gaussian's projection ``dp_dim`` seeded by the
    run's public ``seed``, multibit's ``dp_bounds``."""
    if hp.get("dp_epsilon") is None:
        return None
    low, high = hp["dp_bounds"]
    return FeatureDP(
        float(hp["dp_epsilon"]),
        float(hp["dp_delta"]),
        hp["dp_mechanism"],
        hp["dp_dim"],
        seed=seed,
        bounds=(float(low), float(high)),
    )


def check_budgets(
    graph: Graph, partition: Partition, dp: FeatureDP, ledgers: Mapping[int, DPLedger] | None
) -> None:
    """Refuse early: every owner's ledger exists and its budget pays for one more release of its rows
    (:meth:`fedgat.dp_ledger.DPLedger.check`), before any round runs or anything is drawn. (The
    release itself charges again, atomically per owner.)

    A sweep of one run (:func:`check_sweep`): a row two owners hold (the same features) counts
    twice, as the release charges it.

    Raises:
        MissingLedgerError: no ledger for some owner; BudgetExceededError: an owner's budget is spent.
    """
    check_sweep(graph, [partition], dp, ledgers)


def check_sweep(
    graph: Graph, partitions: Sequence[Partition], dp: FeatureDP, ledgers: Mapping[int, DPLedger] | None
) -> None:
    """Refuse a sweep before its first run: whether the owners' budgets pay for one release per run,
    the runs' splits given in order (a seed sweep's owners move between seeds), with nothing charged.

    Each run charges each owner's rows to that owner's ledger, a row's earlier releases counted in
    every ledger (:func:`draw_release`); so at run ``s`` a row has its history plus every release
    before it in the sweep, rows with the same features (one ledger unit) once per owner holding
    them, and the binding check of each ledger is at the last run in which it charges the row.

    Raises:
        MissingLedgerError: no ledger for some owner; BudgetExceededError: some owner's budget cannot
            pay for its rows' releases in the sweep.
    """
    x = graph.x.numpy()
    record = dp.record(x.shape[1], graph.num_classes)
    units, unit_of_node = np.unique(row_ids(x), return_inverse=True)
    released = np.zeros(len(units), dtype=np.int64)  # releases of each unit so far in the sweep
    needed: dict[int, np.ndarray] = {}  # ledger -> unit -> releases at its last charge of it
    for partition in partitions:
        for c, cp in enumerate(partition.clients):
            if len(cp.owned) == 0:
                continue
            charged = np.unique(unit_of_node[cp.owned])
            released[charged] += 1
            if c not in needed:
                needed[c] = np.zeros(len(units), dtype=np.int64)
            needed[c][charged] = released[charged]
    for c, counts in needed.items():
        ledger = None if ledgers is None else ledgers.get(c)
        if ledger is None:
            raise MissingLedgerError(f"a DP release needs every owner's ledger; none for client {c}")
        for count in np.unique(counts[counts > 0]).tolist():
            ledger.check(units[counts == count], record, count=count, others=_others(ledgers, ledger))


def draw_release(
    graph: Graph,
    partition: Partition,
    dp: FeatureDP,
    *,
    ledgers: Mapping[int, DPLedger] | None,
    predictor: LabelPredictor | None = None,
) -> torch.Tensor:
    """``(N, w)`` float64: every node's released row, each owner's rows drawn as that owner draws
    them (:meth:`fedgat.dp.FeatureDP.release_rows`: charged to ``ledgers[c]`` first, recipients the
    other clients, randomness from a fresh CSPRNG). No seed reproduces it: draw it once and hand it to
    every path that must see the same release.

    Raises:
        MissingLedgerError: no ledger for some client; BudgetExceededError: a client's budget is spent
            (owners before it have been charged; nothing is returned); ValueError: ``label_rr``
            without ``predictor``.
    """
    x = graph.x.numpy()
    classes = predictor.num_classes if predictor is not None else graph.num_classes
    out = np.zeros((len(x), dp.width(x.shape[1], classes)))
    clients = tuple(range(partition.num_clients))
    for c, cp in enumerate(partition.clients):
        if len(cp.owned) == 0:
            continue
        ledger = None if ledgers is None else ledgers.get(c)
        if ledger is None:
            raise MissingLedgerError(f"a DP release needs every owner's ledger; none for client {c}")
        others = tuple(o for o in clients if o != c)
        out[cp.owned] = dp.release_rows(
            x[cp.owned],
            ledger=ledger,
            recipients=others,
            predictor=predictor,
            others=_others(ledgers, ledger),
        )
    return torch.from_numpy(out)


def spent_by_owner(
    graph: Graph, partition: Partition, ledgers: Mapping[int, DPLedger]
) -> dict[int, tuple[float, float]]:
    """Client -> the ``(epsilon, delta)`` its ledger has spent on its owned rows (all its releases)."""
    x = graph.x.numpy()
    return {
        c: ledgers[c].spent(np.asarray(x[cp.owned], dtype=np.float64), others=_others(ledgers, ledgers[c]))
        for c, cp in enumerate(partition.clients)
        if len(cp.owned) and c in ledgers
    }


def _others(ledgers: Mapping[int, DPLedger] | None, ledger: DPLedger) -> list[DPLedger]:
    """The simulation's other owners' ledgers: a row's releases count whichever simulated owner made
    them (a split that renumbers the owners moves rows between ledgers; a red-team review released
    400 of 400 rows twice at the full epsilon that way, 2026-11-27)."""
    return [] if ledgers is None else [o for o in ledgers.values() if o is not ledger]
