"""The owner's DP ledger (:mod:`fedgat.dp_ledger`) and the plaintext release paths that charge it."""

from __future__ import annotations

import json
import math
import os
import stat

import numpy as np
import pytest

from fedgat.dp import FeatureDP
from fedgat.dp_ledger import (
    Budget,
    BudgetExceededError,
    DPError,
    DPLedger,
    LedgerFileError,
    MissingLedgerError,
    owner_ledgers,
    row_ids,
)
from fedgat.dp_release import check_budgets, check_sweep, draw_release, spent_by_owner
from fedgat.methods import run_method
from fedgat.partition import make_partition
from fedgat.synthetic import synthetic_graph

DP = FeatureDP(epsilon=2.0, delta=1e-5, mechanism="gaussian", dim=8, seed=5)


def rows(n: int = 20, d: int = 16, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize(
    "epsilon, delta, needle",
    [
        (0.0, 1e-5, "epsilon"),
        (-1.0, 1e-5, "epsilon"),
        (math.nan, 1e-5, "epsilon"),
        (math.inf, 1e-5, "epsilon"),
        (1.0, 0.0, "delta"),
        (1.0, 1.0, "delta"),
        (1.0, -1e-5, "delta"),
    ],
)
def test_bad_budgets_are_refused(epsilon, delta, needle):
    with pytest.raises(DPError, match=needle):
        Budget(epsilon, delta)
    with pytest.raises(ValueError, match=needle):  # the mechanism too
        FeatureDP(epsilon, delta)


def test_one_release_spends_its_epsilon_and_releases_compose_sublinearly():
    ledger = DPLedger(Budget(10.0, 1e-5))
    data = rows()
    eps1, delta = ledger.charge(data, DP.sigma, (1, 2))
    assert delta == 1e-5 and eps1 == pytest.approx(2.0, rel=1e-6)  # tight for one analytic release
    eps2, _ = ledger.charge(data, DP.sigma, (1,))
    assert 2.0 * 1.1 < eps2 < 2.0 * 2.0  # composed, better than adding epsilons
    assert ledger.spent(data) == (eps2, 1e-5)
    # other rows have their own account
    assert ledger.spent(rows(seed=1))[0] == 0.0
    rec = ledger.releases[0]
    assert rec["recipients"] == [1, 2] and rec["mechanism"] == "gaussian" and rec["sensitivity"] == 2.0
    assert rec["sigma"] == DP.sigma and rec["count"] == 1 and rec["timestamp"] > 0


def test_the_ledger_persists_atomically_and_privately(tmp_path):
    path = tmp_path / "owner" / "client.json"
    ledger = DPLedger(Budget(10.0, 1e-5), path)
    assert not path.exists()  # nothing written before a release
    data = rows()
    spent = ledger.charge(data, DP.sigma)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # no temporary file left; the lock file of charges (0600) beside it
    assert sorted(p.name for p in path.parent.iterdir()) == ["client.json", "client.json.lock"]
    assert stat.S_IMODE(os.stat(path.with_name("client.json.lock")).st_mode) == 0o600
    again = DPLedger(None, path)  # the stored budget
    assert again.budget == Budget(10.0, 1e-5) and again.spent(data) == spent
    with pytest.raises(LedgerFileError, match="holds budget"):
        DPLedger(Budget(20.0, 1e-5), path)  # a budget cannot be raised by asking for another
    path.write_text("{not json")
    with pytest.raises(LedgerFileError, match="cannot read DP ledger"):
        DPLedger(None, path)
    with pytest.raises(DPError, match="needs the owner's budget"):
        DPLedger(None, tmp_path / "new.json")


def test_a_release_over_the_budget_is_refused_and_changes_nothing(tmp_path):
    path = tmp_path / "c.json"
    x = rows()
    ledger = DPLedger(Budget(2.5, 1e-5), path)
    DP.release_rows(x, ledger=ledger)  # spends 2
    before = path.read_bytes()
    with pytest.raises(BudgetExceededError) as err:
        DP.release_rows(x, ledger=ledger)
    msg = str(err.value)
    assert (
        "20 row(s), of which the most charged has spent epsilon 2" in msg
        and "(gaussian)" in msg
        and "budget epsilon 2.5" in msg
    )
    requested = float(msg.split("would bring it to ")[1].split()[0])
    assert 2.5 < requested < 4.0  # two epsilon-2 releases, composed
    assert path.read_bytes() == before and len(ledger.releases) == 1
    # a budget already spent: even a small release is refused
    tight = DPLedger(Budget(2.0, 1e-5), tmp_path / "d.json")
    DP.release_rows(x, ledger=tight)
    with pytest.raises(BudgetExceededError, match="over the budget epsilon 2"):
        FeatureDP(epsilon=0.05, delta=1e-5, mechanism="gaussian", dim=8).release_rows(x, ledger=tight)


def test_the_budget_is_per_row_whatever_matrix_the_rows_come_in(tmp_path):
    """A red-team review found whole-matrix keys: the same rows again with one row added, two rows
    swapped, or one row dropped each got a fresh budget. Rows are the unit now."""
    x = rows()
    ledger = DPLedger(Budget(2.5, 1e-5), tmp_path / "c.json")
    DP.release_rows(x, ledger=ledger)  # spends 2 on every row of x
    for again in (np.vstack([x, rows(1, seed=9)]), x[[1, 0, *range(2, len(x))]], x[:-1], x[[3]]):
        with pytest.raises(BudgetExceededError):
            DP.release_rows(again, ledger=ledger)
    assert len(ledger.releases) == 1
    fresh = rows(5, seed=9)
    DP.release_rows(fresh, ledger=ledger)  # other rows: their own budget
    assert ledger.spent(fresh)[0] == pytest.approx(2.0, rel=1e-6)
    # a mix: the most charged row decides (the new row has spent 2, x's rows 2)
    with pytest.raises(BudgetExceededError, match="6 row"):
        DP.release_rows(np.vstack([fresh, rows(1, seed=11)]), ledger=ledger)
    # persisted per row: a reloaded ledger refuses the same subsets
    with pytest.raises(BudgetExceededError):
        DP.release_rows(x[:2], ledger=DPLedger(None, tmp_path / "c.json"))


def test_rows_compose_by_their_own_histories():
    """Two overlapping releases: the overlap has spent two releases, the rest one."""
    x = rows(30)
    ledger = DPLedger(Budget(10.0, 1e-5))
    one, _ = ledger.charge(x[:20], DP.sigma)
    two, _ = ledger.charge(x[10:], DP.sigma)
    assert two > one * 1.1
    assert ledger.spent(x[:10])[0] == pytest.approx(one) and ledger.spent(x[20:])[0] == pytest.approx(one)
    assert ledger.spent(x[10:20])[0] == pytest.approx(two) and ledger.spent(x)[0] == pytest.approx(two)
    assert ledger.spent(x[[0, 25]])[0] == pytest.approx(one)  # each row once: no composition across rows


def test_row_fingerprints_follow_the_values():
    x = rows(50)
    ids = row_ids(x)
    assert ids.dtype == np.dtype("S16") and len(set(ids.tolist())) == 50
    np.testing.assert_array_equal(row_ids(x[::-1]), ids[::-1])  # order-free: one row, one id
    np.testing.assert_array_equal(
        row_ids(x.astype(np.float32)), row_ids(x.astype(np.float32).astype(np.float64))
    )
    y = x.copy()
    y[7, 3] = np.nextafter(y[7, 3], 1.0)  # one bit of one value
    assert (row_ids(y) != ids).tolist() == [k == 7 for k in range(50)]
    z = np.zeros((2, 4))
    z[1, 2] = -0.0
    assert row_ids(z)[0] == row_ids(z)[1]
    swapped = x[:, [1, 0, *range(2, x.shape[1])]]  # columns matter
    assert not np.any(row_ids(swapped) == ids)
    with pytest.raises(DPError, match="2-D"):
        row_ids(x[0])


def test_a_version_1_ledger_counts_its_releases_against_every_row(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "budget": {"epsilon": 2.5, "delta": 1e-5},
                "releases": [
                    {
                        "dataset": "ab" * 32,
                        "recipients": [1],
                        "mechanism": "gaussian",
                        "sigma": DP.sigma,
                        "sensitivity": 2.0,
                        "count": 1,
                        "timestamp": 1.0,
                    }
                ],
            }
        )
    )
    ledger = DPLedger(None, path)
    assert ledger.spent(rows(seed=4))[0] == pytest.approx(2.0, rel=1e-6)  # any rows: conservative
    with pytest.raises(BudgetExceededError):
        DP.release_rows(rows(seed=4), ledger=ledger)
    small = FeatureDP(epsilon=0.3, delta=1e-5, mechanism="gaussian", dim=8)
    small.release_rows(rows(seed=4), ledger=ledger)
    stored = json.loads(path.read_text())
    assert stored["version"] == 2 and "dataset" in stored["releases"][0] and "rows" in stored["releases"][1]
    path.write_text(json.dumps({**stored, "releases": [{**stored["releases"][1], "rows": "!!"}]}))
    with pytest.raises(LedgerFileError, match="cannot read DP ledger"):
        DPLedger(None, path)


def test_a_ledger_loaded_before_another_process_charged_it_counts_that_charge(tmp_path):
    """An eighteenth review pass: two ClientApp processes loaded one node's ledger, both passed the
    check and the later write replaced the earlier (two runs admitted, one charged). Every check
    now reads the file again, under the ledger's lock when it charges."""
    path = tmp_path / "node.json"
    x = rows()
    budget = Budget(2.5, 1e-5)
    first, second = DPLedger(budget, path), DPLedger(budget, path)  # both loaded before either charges
    first.charge(x, DP.sigma)  # epsilon 2 of 2.5
    written = path.read_bytes()
    with pytest.raises(BudgetExceededError, match="has spent epsilon 2"):
        second.charge(x, DP.sigma)
    assert path.read_bytes() == written and len(DPLedger(None, path).releases) == 1
    assert second.spent(x)[0] == pytest.approx(2.0, rel=1e-6)


def test_concurrent_charges_admit_what_the_budget_pays_for(tmp_path):
    """Eight charges at once (threads, each with its own ledger object and so its own open lock
    file, as processes have), each of epsilon 2 against a budget of 2.5: exactly one is admitted
    and the file holds exactly it."""
    import threading

    path = tmp_path / "node.json"
    x = rows()
    ledgers = [DPLedger(Budget(2.5, 1e-5), path) for _ in range(8)]
    start = threading.Barrier(len(ledgers))
    outcomes: list[str] = []

    def charge(ledger: DPLedger) -> None:
        start.wait()
        try:
            ledger.charge(x, DP.sigma)
            outcomes.append("admitted")
        except BudgetExceededError:
            outcomes.append("refused")

    threads = [threading.Thread(target=charge, args=(ledger,)) for ledger in ledgers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["admitted"] + ["refused"] * 7
    assert len(DPLedger(None, path).releases) == 1


def test_renumbered_owners_do_not_reset_the_simulations_budget(tmp_path):
    """A red-team review: per-row histories lived in per-index files, so the same split with the
    clients renumbered released every row again at the full epsilon. A simulation's checks and
    charges now count a row's releases in every owner's ledger."""
    graph = synthetic_graph(num_nodes=60, num_features=16, train_per_class=3, num_val=8, num_test=12, seed=3)
    dp = FeatureDP(1.0, 1e-5, "gaussian", 8, seed=0)
    first = make_partition(graph, 3, beta=1.0, seed=0)
    ledgers = owner_ledgers(3, (1.0, 1e-5), tmp_path)
    draw_release(graph, first, dp, ledgers=ledgers)
    rotated = make_partition(graph, 3, beta=1.0, seed=0, owner=(first.owner + 1) % 3)
    again = owner_ledgers(3, (1.0, 1e-5), tmp_path)  # a new run reads the same files
    assert spent_by_owner(graph, rotated, again) == {
        c: pytest.approx((1.0, 1e-5), rel=1e-6) for c in range(3)
    }
    with pytest.raises(BudgetExceededError):
        check_budgets(graph, rotated, dp, again)
    with pytest.raises(BudgetExceededError):
        draw_release(graph, rotated, dp, ledgers=again)
    assert all(len(again[c].releases) == 1 for c in range(3))  # nothing charged by the refusals


def test_a_release_without_a_ledger_is_refused():
    with pytest.raises(MissingLedgerError, match="needs the owner's ledger"):
        DP.release_rows(rows(), ledger=None)
    graph = synthetic_graph(num_nodes=48, num_features=16, train_per_class=3, num_val=8, num_test=12, seed=3)
    part = make_partition(graph, 3, beta=1.0, seed=0)
    with pytest.raises(MissingLedgerError):
        draw_release(graph, part, DP, ledgers=None)
    with pytest.raises(MissingLedgerError, match="none for client 1"):
        check_budgets(graph, part, DP, {0: DPLedger(Budget(3.0, 1e-5))})


def test_the_plaintext_method_needs_a_budget_and_charges_the_owners_ledgers(tmp_path):
    graph = synthetic_graph(num_nodes=48, num_features=16, train_per_class=3, num_val=8, num_test=12, seed=3)
    hp = {
        "rounds": 1,
        "patience": 1,
        "dp_epsilon": 2.0,
        "dp_mechanism": "gaussian",
        "dp_dim": 8,
        "dp_ledger_dir": str(tmp_path),
    }
    with pytest.raises(DPError, match="needs the owner's budget"):
        run_method("fedgat", graph, num_clients=3, seed=0, **hp)
    assert list(tmp_path.iterdir()) == []  # nothing released, nothing recorded
    run_method("fedgat", graph, num_clients=3, seed=0, dp_budget=(2.5, 1e-5), **hp)
    files = sorted(p.name for p in tmp_path.glob("*.json"))
    assert files == ["client-0.json", "client-1.json", "client-2.json"]
    stored = json.loads((tmp_path / "client-0.json").read_text())
    assert stored["budget"] == {"epsilon": 2.5, "delta": 1e-5} and len(stored["releases"]) == 1
    assert stored["releases"][0]["recipients"] == [1, 2]
    snapshot = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(BudgetExceededError):  # epsilon 2 then 1.5 on the same rows: over 2.5
        run_method("fedgat", graph, num_clients=3, seed=0, dp_budget=(2.5, 1e-5), **{**hp, "dp_epsilon": 1.5})
    # the first owner was refused before anything was drawn; no ledger changed
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == snapshot


def test_owner_ledgers_checks_the_budget(tmp_path):
    with pytest.raises(DPError, match=r"\(epsilon, delta\)"):
        owner_ledgers(2, (1.0,), tmp_path)
    got = owner_ledgers(2, (1.0, 1e-6), tmp_path)
    assert sorted(got) == [0, 1] and got[1].path == tmp_path / "client-1.json"


def test_a_spent_budget_is_refused_before_the_release_predictor_trains(tmp_path, monkeypatch):
    """label_rr trains a predictor before its release: the owners' budgets are checked first, so a
    spent budget costs no training round (nothing leaves, not even a model update)."""
    import fedgat.methods

    graph = synthetic_graph(num_nodes=48, num_features=16, train_per_class=3, num_val=8, num_test=12, seed=3)
    hp = {
        "rounds": 1,
        "patience": 1,
        "dp_epsilon": 2.0,
        "dp_predictor_rounds": 1,
        "dp_ledger_dir": str(tmp_path),
    }
    run_method("fedgat", graph, num_clients=3, seed=0, dp_budget=(3.0, 1e-5), **hp)  # spends 2 of 3

    def trained(*args, **kwargs):
        raise AssertionError("the predictor trained although the budget was spent")

    monkeypatch.setattr(fedgat.methods, "train_predictor", trained)
    with pytest.raises(BudgetExceededError, match="over the budget epsilon 3"):
        run_method("fedgat", graph, num_clients=3, seed=0, **hp)


def test_a_refusal_names_a_named_unit_and_the_releases_it_was_asked_for(tmp_path):
    """A charge on a named unit (DP-FedAvg's whole local dataset) is refused naming that unit and
    the number of releases, not "1 row(s)"; the ledger is unchanged."""
    from fedgat.dp_fedavg import UPDATE_UNIT
    from fedgat.dp_ledger import ReleaseRecord

    ledger = DPLedger(Budget(1.0, 1e-5), tmp_path / "u.json")
    with pytest.raises(BudgetExceededError) as err:
        ledger.charge(UPDATE_UNIT, ReleaseRecord.gaussian(0.8, sensitivity=1.0), count=50)
    msg = str(err.value)
    assert f"{UPDATE_UNIT!r} has spent epsilon 0" in msg and "50 releases (gaussian)" in msg, msg
    assert "row(s)" not in msg and ledger.releases == []


def test_a_sweeps_check_agrees_with_drawing_its_releases_one_run_after_another(tmp_path):
    """:func:`fedgat.dp_release.check_sweep` before a seed sweep (owners move between seeds; two nodes
    share a feature row, one ledger unit; owners' budgets differ) passes exactly when every run's
    release, drawn one after another, is admitted: no sweep it passes is refused half-way, and none
    it refuses would have been paid for. Nothing is charged by the check."""
    graph = synthetic_graph(num_nodes=60, num_features=16, train_per_class=3, num_val=8, num_test=12, seed=3)
    graph.x[7] = graph.x[3]  # one unit, two nodes: charged once per owner holding it
    dp = FeatureDP(1.0, 1e-5, "gaussian", 8, seed=0)
    sweep = [make_partition(graph, 3, beta=1.0, seed=s) for s in (0, 1, 2)]
    assert any(p.owner[7] != p.owner[3] for p in sweep)  # the shared unit is charged twice somewhere
    rng = np.random.default_rng(0)
    outcomes = []
    for trial in range(8):  # one release spends 1.0; three compose to 1.83, four 2.15, five 2.44
        budgets = rng.choice([1.9, 2.2, 2.5, 3.0], size=3)
        fresh = [tmp_path / f"{trial}-{k}" for k in ("check", "draw")]
        checked, drawn = (
            {c: DPLedger(Budget(float(b), 1e-5), root / f"client-{c}.json") for c, b in enumerate(budgets)}
            for root in fresh
        )
        try:
            check_sweep(graph, sweep, dp, checked)
            passed = True
        except BudgetExceededError:
            passed = False
        assert not fresh[0].exists()  # the check charged nothing
        try:
            for partition in sweep:
                draw_release(graph, partition, dp, ledgers=drawn)
            paid = True
        except BudgetExceededError:
            paid = False
        assert passed == paid, budgets
        outcomes.append(passed)
    assert True in outcomes and False in outcomes  # both verdicts exercised
    with pytest.raises(MissingLedgerError, match="none for client 2"):
        check_sweep(graph, sweep, dp, {0: DPLedger(Budget(9.0, 1e-5)), 1: DPLedger(Budget(9.0, 1e-5))})
