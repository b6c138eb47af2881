"""DP-FedAvg (client-level DP of the training updates, :mod:`fedgat.dp_fedavg`): calibration against
``dp_accounting``, clipping and noise of the exact size from the OS CSPRNG, the budget a client
enforces, and the same mechanism through the secure FedAvg state machines."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fault_helpers import Federation

from fedgat.dp_fedavg import UPDATE_UNIT, UpdateBudgetError, UpdateDP, charge_training, update_dp_from_hparams
from fedgat.dp_ledger import Budget, BudgetExceededError, DPLedger, LedgerFileError, gaussian_epsilon
from fedgat.federated import Client
from fedgat.methods import run_method
from fedgat.protocols import InProcessTransport, run_parties
from fedgat.protocols.driver import ManualClock
from fedgat.protocols.errors import PrivacyBudgetError
from fedgat.protocols.fedavg import ServerRounds
from fedgat.protocols.fedavg_client import ClientRounds
from fedgat.protocols.secagg import SecAggConfig
from fedgat.randomness import RandomSource
from fedgat.rounds import Counts
from fedgat.synthetic import synthetic_graph


# ------------------------------------------------------------------------------------- calibration
@pytest.mark.parametrize(
    ("epsilon", "rounds", "evaluations"), [(0.5, 1, None), (1.0, 50, 0), (4.0, 200, None), (8.0, 500, 17)]
)
def test_the_noise_multiplier_spends_exactly_the_budget_and_the_pld_accountant_agrees(
    epsilon, rounds, evaluations
):
    """The budget pays for ``rounds`` updates and ``evaluations`` counts releases (None: as many as
    rounds), each a Gaussian mechanism of the same multiplier."""
    dp = UpdateDP.for_budget(epsilon, 1e-5, rounds, evaluations=evaluations)
    releases = rounds + (rounds if evaluations is None else evaluations)
    assert dp.max_releases == releases and dp.evaluations == releases - rounds
    assert dp.epsilon(releases) == pytest.approx(epsilon, rel=1e-6)
    assert dp.epsilon(releases // 2) < epsilon if releases > 1 else True  # fewer releases spend less
    # dp_accounting's privacy-loss-distribution accountant composes the same releases one by one
    pld = gaussian_epsilon([(dp.noise_multiplier, releases)], 1e-5)
    assert pld == pytest.approx(epsilon, rel=0.02)
    # a slightly smaller multiplier would overspend
    smaller = UpdateDP(dp.clip, dp.noise_multiplier * 0.99, rounds, max_evaluations=dp.evaluations)
    assert smaller.epsilon(releases) > epsilon


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 0.0, "delta": 1e-5, "rounds": 10},
        {"epsilon": -1.0, "delta": 1e-5, "rounds": 10},
        {"epsilon": math.inf, "delta": 1e-5, "rounds": 10},
        {"epsilon": 1.0, "delta": 0.0, "rounds": 10},
        {"epsilon": 1.0, "delta": 1.0, "rounds": 10},
        {"epsilon": 1.0, "delta": 1e-5, "rounds": 0},
        {"epsilon": 1.0, "delta": 1e-5, "rounds": 10, "clip": 0.0},
        {"epsilon": 1.0, "delta": 1e-5, "rounds": 10, "honest": 0},
        {"epsilon": 1.0, "delta": 1e-5, "rounds": 10, "evaluations": -1},
        {"epsilon": 1.0, "delta": 1e-5, "rounds": 10, "counts_clip": 0.0},
        {"epsilon": 1.0, "delta": 1e-5, "rounds": 10, "counts_clip": math.nan},
    ],
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        UpdateDP.for_budget(**kwargs)


def test_hparams_turn_it_on_only_when_asked():
    assert update_dp_from_hparams({"rounds": 10}) is None
    dp = update_dp_from_hparams({"rounds": 10, "update_dp_epsilon": 2.0, "update_dp_clip": 0.5})
    assert dp is not None and dp.clip == 0.5 and dp.max_rounds == 10 and dp.evaluations == 10
    assert dp.epsilon(20) == pytest.approx(2.0, rel=1e-6)  # 10 updates and 10 evaluations


def test_a_ledger_composes_runs_as_one_longer_run_and_refuses_the_one_past_its_budget(tmp_path):
    """``UpdateDP`` bounds one run; :func:`charge_training` charges every run's releases to the
    client's whole dataset in a persistent ledger: k runs of R releases cost what one run of k R
    releases of the same multiplier costs (Gaussian composition), and the run that would pass the
    budget is refused with the file unchanged, also by a ledger reopened from disk."""
    dp = UpdateDP.for_budget(4.0, 1e-5, 10)
    path = tmp_path / "updates.json"
    ledger = DPLedger(Budget(7.0, 1e-5), path)
    spent = [charge_training(ledger, dp)[0] for _ in range(2)]
    two_runs = UpdateDP(dp.clip, dp.noise_multiplier, 2 * dp.max_rounds).epsilon(2 * dp.max_releases)
    assert spent[0] == pytest.approx(4.0, rel=1e-3) and spent[1] == pytest.approx(two_runs, rel=1e-3)
    assert 5.5 < spent[1] < 7.0  # sqrt composition: less than twice 4
    before = path.read_bytes()
    reopened = DPLedger(None, path)
    with pytest.raises(BudgetExceededError, match="over the budget epsilon 7"):
        charge_training(reopened, dp)
    assert path.read_bytes() == before
    assert reopened.spent(UPDATE_UNIT)[0] == pytest.approx(spent[1], rel=1e-9)


# ---------------------------------------------------------------------------------- the mechanism
def _state(values: np.ndarray) -> dict[str, torch.Tensor]:
    return {"a.weight": torch.from_numpy(values[:-3].reshape(-1, 3)), "a.bias": torch.from_numpy(values[-3:])}


def _flat(state) -> np.ndarray:
    return np.concatenate([v.double().numpy().ravel() for v in state.values()])


@pytest.mark.parametrize("norm", [0.3, 5.0])
def test_privatize_clips_the_whole_update_to_c_and_adds_shares_of_the_stated_std(norm):
    """With a known stream the noise is subtracted again: what remains is the update, scaled to norm
    ``C`` when longer, unchanged when shorter; the noise's empirical std is ``2 z C / sqrt(h)``."""
    dp = UpdateDP(clip=1.0, noise_multiplier=0.7, max_rounds=5, honest=3)
    rng = np.random.default_rng(0)
    size = 30_003
    reference = rng.standard_normal(size)
    step = rng.standard_normal(size)
    step *= norm / np.linalg.norm(step)
    out = dp.privatize(_state(reference + step), _state(reference), rng=RandomSource.from_seed(b"test"))
    noise = RandomSource.from_seed(b"test").normal(size) * dp.share_std
    kept = _flat(out) - reference - noise
    assert np.linalg.norm(kept) == pytest.approx(min(norm, 1.0), rel=1e-9)
    assert np.allclose(kept / np.linalg.norm(kept), step / norm, atol=1e-9)
    assert dp.share_std == pytest.approx(2 * 0.7 * 1.0 / math.sqrt(3))
    assert np.std(_flat(out) - reference - kept) == pytest.approx(dp.share_std, rel=0.02)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_update_or_count_is_released_as_zero_plus_its_noise(bad):
    """Whether local training diverges depends on the client's data, so under DP nothing refuses on
    it: a non-finite update is released exactly as the zero update would be (same noise stream),
    and a non-finite count entry as 0 (a twelfth review pass)."""
    dp = UpdateDP(clip=1.0, noise_multiplier=0.7, max_rounds=5, honest=3)
    reference = np.random.default_rng(1).standard_normal(3_003)
    broken = reference.copy()
    broken[7] = bad
    out = dp.privatize(_state(broken), _state(reference), rng=RandomSource.from_seed(b"nan"))
    zero = dp.privatize(_state(reference), _state(reference), rng=RandomSource.from_seed(b"nan"))
    assert np.isfinite(_flat(out)).all() and np.array_equal(_flat(out), _flat(zero))
    counts = {"val": Counts(3, 5, bad), "test": Counts(4, 6, 2.0)}
    zeroed = {"val": Counts(3, 5, 0.0), "test": Counts(4, 6, 2.0)}
    got = dp.privatize_counts(counts, rng=RandomSource.from_seed(b"c"))
    assert got == dp.privatize_counts(zeroed, rng=RandomSource.from_seed(b"c"))
    assert all(math.isfinite(v) for c in got.values() for v in c)


def test_the_headroom_keeps_released_weights_off_the_limit():
    """A client under DP refuses a global model within ``clip + 20`` noise shares of the weight
    limit, before it trains (a data-independent refusal); at the bound it accepts."""
    from fedgat.protocols.errors import PayloadError
    from fedgat.protocols.fedavg_client import check_headroom
    from fedgat.protocols.messages_rounds import MAX_WEIGHT_ABS

    dp = UpdateDP(clip=1.0, noise_multiplier=3.0, max_rounds=5, honest=2)
    assert dp.headroom == pytest.approx(1.0 + 20 * 2 * 3.0 / math.sqrt(2))
    at_bound = {"w": np.array([0.5, -(MAX_WEIGHT_ABS - dp.headroom)]), "steps": np.array([10**7])}
    check_headroom(at_bound, dp.headroom)  # integer buffers are not released with noise
    with pytest.raises(PayloadError, match=r"arrays\['w'\] .* within 85\.9 of the limit"):
        check_headroom({"w": at_bound["w"] * (1 + 1e-9)}, dp.headroom)


def test_the_noise_comes_from_the_os_and_differs_every_time():
    """No seed reaches the noise: the same update privatised twice gives two different outputs, whose
    difference has the std of two independent shares."""
    dp = UpdateDP(clip=1.0, noise_multiplier=1.0, max_rounds=5)
    ref = _state(np.zeros(20_004))
    a, b = _flat(dp.privatize(ref, ref)), _flat(dp.privatize(ref, ref))
    assert not np.array_equal(a, b)
    assert np.std(a - b) == pytest.approx(math.sqrt(2) * dp.share_std, rel=0.03)


def tiny_client(update_dp: UpdateDP | None, with_training: bool = True) -> tuple[Client, dict]:
    g = synthetic_graph(num_nodes=60, num_features=8, train_per_class=4, num_val=10, num_test=10, seed=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, g.num_classes))
    targets = {}
    for split in ("train", "val", "test"):
        rows = torch.from_numpy(np.flatnonzero(getattr(g, f"{split}_mask").numpy()))
        if split == "train" and not with_training:
            rows = rows[:0]
        targets[split] = (rows, g.y[rows])
    from fedgat.federated import LocalTask

    task = LocalTask((g.x,), targets)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    return Client(0, model, task, task, lr=0.1, update_dp=update_dp), initial


def test_a_client_under_dp_sends_weight_one_no_loss_and_stops_at_its_budget():
    # tiny noise: the clip is visible; no evaluation budgeted, so two releases in all
    dp = UpdateDP(clip=0.5, noise_multiplier=1e-6, max_rounds=2, max_evaluations=0)
    client, initial = tiny_client(dp)
    update = client.fit(initial)
    assert update.num_train == 1 and math.isnan(update.loss) and client.dp_releases == 1
    moved = math.sqrt(sum(float(((update.state[k] - initial[k]) ** 2).sum()) for k in initial))
    assert moved == pytest.approx(0.5, rel=1e-3)  # lr 0.1 moves the weights by more than 0.5: clipped
    client.fit(initial)
    with pytest.raises(UpdateBudgetError, match="2 releases"):
        client.fit(initial)
    with pytest.raises(UpdateBudgetError, match="0 evaluations"):
        client.release_counts(initial, ("val", "test"))
    assert client.dp_releases == 2
    # a client without training nodes still adds its noise share (else the sum would lack it)
    idle, initial = tiny_client(UpdateDP(clip=1.0, noise_multiplier=1.0, max_rounds=2), with_training=False)
    update = idle.fit(initial)
    assert update.num_train == 1 and not all(torch.equal(update.state[k], initial[k]) for k in initial)


def test_a_client_releases_its_counts_clipped_noised_and_charged():
    """Under DP-FedAvg the counts that leave a client are one release of its budget: the splits'
    counts as one vector scaled to ``counts_clip`` (ratios kept), plus a noise share; past the
    budget nothing is evaluated."""
    dp = UpdateDP(clip=0.5, noise_multiplier=1e-9, max_rounds=1, max_evaluations=1, counts_clip=2.0)
    client, initial = tiny_client(dp)
    exact = client.evaluate(initial, ("val", "test"))
    released = client.release_counts(initial, ("val", "test"))
    assert client.dp_releases == 1
    vector = np.array([v for s in ("val", "test") for v in released[s]])
    assert np.linalg.norm(vector) == pytest.approx(2.0, rel=1e-6)  # scaled down to the clip
    for s in ("val", "test"):
        assert exact[s].count > 2.0  # the clip binds
        assert released[s].correct / released[s].count == pytest.approx(
            exact[s].correct / exact[s].count, abs=1e-6
        )
        assert released[s].loss_sum / released[s].count == pytest.approx(exact[s].loss_sum / exact[s].count)
    client.fit(initial)
    with pytest.raises(UpdateBudgetError, match="2 releases"):
        client.release_counts(initial, ("val", "test"))
    assert client.dp_releases == 2
    # without DP the counts leave exact and nothing is charged
    plain, _ = tiny_client(None)
    assert plain.release_counts(initial, ("val",)) == plain.evaluate(initial, ("val",))


def test_the_counts_noise_has_the_stated_std():
    dp = UpdateDP(clip=1.0, noise_multiplier=0.8, max_rounds=1, honest=3, counts_clip=0.5)
    zero = {"val": Counts(0, 0, 0.0), "test": Counts(0, 0, 0.0)}
    draws = np.array([[v for c in dp.privatize_counts(zero).values() for v in c] for _ in range(600)])
    assert dp.counts_share_std == pytest.approx(2 * 0.8 * 0.5 / math.sqrt(3))
    assert np.std(draws) == pytest.approx(dp.counts_share_std, rel=0.05)
    assert abs(np.mean(draws)) < 0.1 * dp.counts_share_std


# ----------------------------------------------------------------------------- through the protocol
class DPFederation(Federation):
    def __init__(self, dp: UpdateDP, **kw) -> None:
        super().__init__(secagg=SecAggConfig(), fraction=1.0, num_clients=4, update_dp=dp, **kw)
        self.dp = dp

    def members(self):
        members, initial = super().members()
        for m in members:
            m.update_dp = self.dp
        return members, initial


def test_secure_rounds_under_dp_aggregate_the_privatized_updates():
    """The server's new weights are the plain mean of the clients' clipped, noised updates (each
    recorded where it is computed); the history's train loss is NaN (not sent); the server states
    the epsilon the rounds spent."""
    dp = UpdateDP(clip=0.2, noise_multiplier=0.5, max_rounds=3)
    fed = DPFederation(dp, rounds=3, patience=None)
    parties = fed.parties()
    sent: dict[int, list] = {}
    for c in fed.roster.clients:
        member = parties[c].client
        fit = member.fit

        def recording(weights, fit=fit, c=c):
            update = fit(weights)
            sent.setdefault(c, []).append((weights, update))
            return update

        member.fit = recording
    server: ServerRounds = parties[fed.sid]
    pooled: list = []
    on_reports = server.loop.on_reports
    server.loop.on_reports = lambda splits, reports, missing=(): (  # type: ignore[method-assign]
        pooled.extend(reports) or on_reports(splits, reports, missing)
    )
    run_parties(InProcessTransport(), parties, clock=ManualClock())
    # the noised counts reach the loop as summed (scaled to the clip, plus noise), not rounded
    assert pooled and all(not float(r["val"].count).is_integer() for r in pooled)
    assert server.done and len(server.history) == 3
    assert all(math.isnan(row["train_loss"]) for row in server.history)
    # three updates and three evaluations (each round's model, once) per client
    assert server.dp_epsilon == pytest.approx(dp.epsilon(6))
    assert all(parties[c].client.dp_releases == 6 for c in fed.roster.clients)
    last = [sent[c][-1][1].state for c in fed.roster.clients]
    want = {k: sum(s[k].double() for s in last) / len(last) for k in last[0]}
    for k, v in want.items():
        assert torch.allclose(server.global_state[k].double(), v, atol=1e-6), k


def test_a_client_refuses_a_round_past_its_budget_for_good():
    """A server that runs more rounds than the clients' budget pays for gets a terminal refusal:
    rounds 1 and 2 spend 3 of the 4 releases (two updates, one evaluation); round 3's evaluation is
    the fourth, its update would be the fifth, and the round is refused. The evaluation stays
    charged: a refusal is seen by the server, so nothing computed from a release goes uncounted."""
    dp = UpdateDP(clip=0.2, noise_multiplier=0.5, max_rounds=2)
    fed = DPFederation(dp, rounds=4, patience=None)
    parties = fed.parties()
    with pytest.raises(PrivacyBudgetError, match="4 releases"):
        run_parties(InProcessTransport(), parties, clock=ManualClock())
    clients: list[ClientRounds] = [parties[c] for c in fed.roster.clients]
    refused = [c for c in clients if c.state_name() == "aborted"]
    assert refused and all(c.client.dp_releases == dp.max_releases == 4 for c in refused)
    assert all(c.client.dp_releases <= dp.max_releases for c in clients)


def test_run_method_reports_what_the_update_budget_spent():
    g = synthetic_graph(num_nodes=120, num_features=12, train_per_class=5, num_val=20, num_test=30, seed=1)
    result = run_method(
        "distgat", g, num_clients=3, seed=0, rounds=4, patience=None, hidden=4, heads=2, update_dp_epsilon=2.0
    )
    eps, delta = result.update_dp_spent
    assert eps == pytest.approx(2.0, rel=1e-6) and delta == 1e-5  # all 4 rounds and 4 evaluations
    # the rounds saw noised counts; the result is the chosen model's exact accuracy
    assert 0.0 <= result.test_accuracy <= 1.0
    assert all(math.isnan(row["train_loss"]) for row in result.history)
    plain = run_method("distgat", g, num_clients=3, seed=0, rounds=4, patience=None, hidden=4, heads=2)
    assert plain.update_dp_spent is None and not math.isnan(plain.history[0]["train_loss"])


def test_run_method_charges_every_clients_update_ledger_before_it_trains(tmp_path, monkeypatch):
    """``update_dp_budget`` / ``update_dp_ledger_dir``: each client's persistent DP-FedAvg ledger
    (``client-<c>-updates.json``) is charged the run's releases before anything is trained, composed
    with the runs before it; the run past the budget is refused with no ledger charged and no round
    run, and a ledger is refused without DP-FedAvg."""
    from fedgat import methods

    g = synthetic_graph(num_nodes=120, num_features=12, train_per_class=5, num_val=20, num_test=30, seed=1)
    kw = {"num_clients": 3, "seed": 0, "rounds": 2, "patience": None, "hidden": 4, "heads": 2}
    ledgers = tmp_path / "ledgers"
    upd = {"update_dp_epsilon": 2.0, "update_dp_budget": (2.5, 1e-5), "update_dp_ledger_dir": str(ledgers)}
    first = run_method("distgat", g, **kw, **upd)
    dp = update_dp_from_hparams(first.hparams)
    assert dp is not None
    files = sorted(ledgers.glob("*.json"))
    assert [f.name for f in files] == [f"client-{c}-updates.json" for c in range(3)]
    for f in files:
        (release,) = DPLedger(None, f).releases
        assert release["count"] == dp.max_releases == 4  # 2 rounds' updates and evaluations
    assert first.update_ledger_spent == pytest.approx((2.0, 1e-5), rel=1e-3)
    # a second run of epsilon 2 composes past 2.5: refused before its first round
    before = [f.read_bytes() for f in files]
    fitted: list = []
    real_fit = methods.Server.fit
    monkeypatch.setattr(
        methods.Server, "fit", lambda self, *a, **k: fitted.append(a) or real_fit(self, *a, **k)
    )
    with pytest.raises(BudgetExceededError, match="over the budget epsilon 2.5"):
        run_method("distgat", g, **kw, **upd)
    assert [f.read_bytes() for f in files] == before and fitted == []
    # a smaller run still fits; given alone, the folder charges the ledgers with their stored budget
    again = run_method("distgat", g, **kw, update_dp_epsilon=0.5, update_dp_ledger_dir=str(ledgers))
    assert 2.0 < again.update_ledger_spent[0] < 2.5 and len(fitted) == 1
    with pytest.raises(LedgerFileError, match="holds budget"):  # another budget for the same ledgers
        run_method("distgat", g, **kw, **{**upd, "update_dp_budget": (9.0, 1e-5)})
    with pytest.raises(ValueError, match="needs update_dp_epsilon"):
        run_method("distgat", g, **kw, update_dp_budget=(2.5, 1e-5), update_dp_ledger_dir=str(ledgers))
    assert run_method("distgat", g, **kw, update_dp_epsilon=2.0).update_ledger_spent is None  # no ledger


@pytest.mark.parametrize("mechanism", ["gaussian", "label_rr"])
def test_a_fedgat_run_its_release_budget_refuses_charges_no_update(tmp_path, mechanism):
    """FedGAT with a DP release and DP-FedAvg ledgers: the release's ledgers are checked before the
    updates' are charged (with label_rr, whose predictor trains under DP-FedAvg before the release,
    that is before the predictor's rounds), so a run the release budget refuses leaves the update
    ledgers as they were; the predictor's rounds are in what a run is charged."""
    g = synthetic_graph(num_nodes=120, num_features=12, train_per_class=5, num_val=20, num_test=30, seed=1)
    kw = {"num_clients": 3, "seed": 0, "rounds": 2, "patience": None, "hidden": 4, "heads": 2}
    release = {"dp_epsilon": 2.0, "dp_mechanism": mechanism, "dp_dim": 4, "dp_budget": (2.5, 1e-5)}
    release.update(dp_predictor_rounds=2, dp_ledger_dir=str(tmp_path / "rows"))
    upd = {
        "update_dp_epsilon": 2.0,
        "update_dp_budget": (9.0, 1e-5),
        "update_dp_ledger_dir": str(tmp_path / "u"),
    }
    first = run_method("fedgat", g, **kw, **release, **upd)
    assert first.dp_spent is not None and first.update_ledger_spent is not None
    files = sorted((tmp_path / "u").glob("*.json"))
    dp = update_dp_from_hparams(first.hparams)
    assert dp is not None and dp.max_rounds == 2 + (2 if mechanism == "label_rr" else 0)
    assert all(DPLedger(None, f).releases[0]["count"] == dp.max_releases for f in files)
    before = [f.read_bytes() for f in files]
    with pytest.raises(BudgetExceededError, match="row"):  # the rows' budget of 2.5: a second release
        run_method("fedgat", g, **kw, **release, **upd)
    assert [f.read_bytes() for f in files] == before


def test_dp_fedavg_refuses_to_run_without_secure_aggregation():
    """Each release carries one share of the noise (std 2zC/sqrt(h)); only the secure sum adds the
    h shares the accountant counts on. So no party and no builder runs DP-FedAvg in plaintext."""
    from fedgat.app import training_secagg
    from fedgat.pipeline import make_deployment

    dp = UpdateDP(clip=1.0, noise_multiplier=1.0, max_rounds=2)
    client, initial = tiny_client(dp)
    dep = make_deployment(3)
    roster = dep.roster
    with pytest.raises(ValueError, match="needs secure aggregation"):
        ClientRounds(
            roster.clients[0], roster, 1, dep.identities[roster.clients[0]], client=client, secagg=None
        )
    with pytest.raises(ValueError, match="needs secure aggregation"):
        ServerRounds(
            roster.server, roster, 1, dep.identities[roster.server], initial_state=initial, rounds=2,
            secagg=None, update_dp=dp,
        )  # fmt: skip
    with pytest.raises(ValueError, match="needs secure aggregation"):
        training_secagg(None, 3, 1.0, private=True)
    with pytest.raises(ValueError, match="below its minimum cohort of 3"):
        training_secagg("auto", 3, 0.5, private=True)  # 2 clients per round
    assert training_secagg("auto", 3, 1.0, private=True) == SecAggConfig()
