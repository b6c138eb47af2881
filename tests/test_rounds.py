"""The round loop on its own: sampling, aggregation, pooled evaluation, the test split on a new best,
patience, stragglers, misuse and checkpoints -- with made-up updates and counts, no clients."""

import math

import numpy as np
import pytest
import torch

from fedgat.checkpoint import CheckpointMismatchError
from fedgat.federated import ClientUpdate, Counts, FedAdam, FedAvg
from fedgat.rounds import RoundLoop, pool_counts


def _state(value: float) -> dict:
    return {"w": torch.full((2, 3), float(value)), "b": torch.full((2,), float(value))}


def _updates(values, num_train):
    return [ClientUpdate(_state(v), n, 0.5 * v) for v, n in zip(values, num_train)]


def _reports(correct, count=10, loss=2.0, splits=("val",)):
    """One report per client: ``correct[i]`` right of ``count`` on every split, loss sum ``loss``."""
    return [{s: Counts(c, count, loss) for s in splits} for c in correct]


def test_round_aggregates_pools_and_asks_for_test_on_a_new_best_only():
    loop = RoundLoop(3, _state(0.0), rounds=3)
    assert loop.sample() == [0, 1, 2] and loop.more_rounds and not loop.evaluating
    assert loop.on_updates([0, 1, 2], _updates([1.0, 2.0, 9.0], [1, 3, 0])) == ("val",)
    torch.testing.assert_close(loop.state["w"], torch.full((2, 3), 1.75))  # 1 * 1 + 3 * 2 over 4
    assert loop.evaluating and loop.metrics["train_loss"] == pytest.approx((0.5 + 3 * 1.0) / 4)
    assert loop.on_reports(("val",), _reports([5, 6, 7])) == ("test",)  # first round: a new best
    assert loop.on_reports(("test",), _reports([1, 2, 3], splits=("test",))) == ()
    row = loop.history[-1]
    assert list(row) == [
        "round",
        "train_loss",
        "clients",
        "val_accuracy",
        "val_loss",
        "test_accuracy",
        "test_loss",
    ]
    assert (row["round"], row["clients"], row["val_accuracy"], row["test_accuracy"]) == (
        1,
        [0, 1, 2],
        0.6,
        0.2,
    )
    assert loop.best_state is loop.state and loop.best_round == 1 and not loop.done

    best = loop.state
    loop.on_updates([0, 1, 2], _updates([0.0, 0.0, 0.0], [1, 1, 1]))
    assert loop.on_reports(("val",), _reports([5, 6, 7], loss=3.0)) == ()  # same accuracy, higher loss
    assert "test_accuracy" not in loop.history[-1] and loop.best_state is best
    loop.on_updates([0, 1, 2], _updates([0.0, 0.0, 0.0], [1, 1, 1]))
    assert loop.on_reports(("val",), _reports([5, 6, 7], loss=1.0)) == ("test",)  # a tie, lower loss
    assert loop.on_reports(("test",), _reports([3, 3, 3], splits=("test",))) == ()
    assert loop.done and not loop.more_rounds
    assert (loop.result.best_round, loop.result.rounds, loop.result.test_accuracy) == (3, 3, 0.3)
    assert loop.result.best_val_accuracy == 0.6 and loop.result.history is loop.history


def test_patience_stops_and_a_finished_loop_takes_nothing():
    loop = RoundLoop(2, _state(0.0), rounds=10, patience=2)
    for correct in ([5, 5], [4, 4], [5, 4]):
        splits = loop.on_updates([0, 1], _updates([1.0, 1.0], [1, 1]))
        while splits:
            splits = loop.on_reports(splits, _reports(correct, splits=splits))
    assert loop.done and loop.result.rounds == 3 and loop.result.best_round == 1
    with pytest.raises(RuntimeError):
        loop.on_updates([0, 1], _updates([1.0, 1.0], [1, 1]))
    with pytest.raises(RuntimeError):
        loop.on_reports(("val",), _reports([1, 1]))


def test_every_round_tested_no_training_nodes_and_nan_counts():
    loop = RoundLoop(2, _state(3.0), rounds=2, test_every_round=True)
    assert loop.on_updates([0, 1], _updates([1.0, 2.0], [0, 0])) == ("val", "test")
    assert torch.equal(loop.state["w"], _state(3.0)["w"]) and math.isnan(loop.metrics["train_loss"])
    assert loop.on_reports(("val", "test"), _reports([0, 0], count=0, splits=("val", "test"))) == ()
    assert math.isnan(loop.history[-1]["val_accuracy"]) and loop.best_round == 0  # NaN is never a best


def test_stragglers_are_recorded_and_left_out_of_the_sums():
    loop = RoundLoop(3, _state(0.0), rounds=2)
    loop.on_updates([0, 2], _updates([1.0, 3.0], [1, 1]), missing=[1])
    torch.testing.assert_close(loop.state["w"], torch.full((2, 3), 2.0))
    loop.on_reports(("val",), _reports([2, 4]), missing=[1])
    loop.on_reports(("test",), _reports([1, 1, 1], splits=("test",)))
    row = loop.history[-1]
    assert list(row)[:5] == ["round", "train_loss", "clients", "missing_fit", "missing_eval_val"]
    assert (row["clients"], row["missing_fit"], row["missing_eval_val"], row["val_accuracy"]) == (
        [0, 2],
        [1],
        [1],
        0.3,
    )


def test_sampling_is_seeded_and_sizes_follow_the_fraction():
    draws = [RoundLoop(10, _state(0.0), fraction=0.3, seed=5).sample() for _ in range(2)]
    assert draws[0] == draws[1] and len(draws[0]) == 3 and draws[0] == sorted(draws[0])
    assert RoundLoop(10, _state(0.0), fraction=0.01).clients_per_round == 1
    for bad in ({"fraction": 0.0}, {"fraction": 1.5}):
        with pytest.raises(ValueError, match="fraction"):
            RoundLoop(3, _state(0.0), **bad)
    with pytest.raises(ValueError, match="client"):
        RoundLoop(0, _state(0.0))
    loop = RoundLoop(3, _state(0.0))
    with pytest.raises(RuntimeError):  # no run begun
        loop.on_updates([0], _updates([1.0], [1]))
    for rounds, patience, match in ((0, None, "rounds"), (3, 0, "patience")):
        with pytest.raises(ValueError, match=match):
            loop.begin(rounds, patience)


def test_pool_counts_sums_in_order():
    reports = [{"val": Counts(1, 2, 0.5)}, {"val": Counts(3, 4, 1.5)}]
    assert pool_counts(reports, ["val"]) == {"val_accuracy": 4 / 6, "val_loss": 2.0 / 6}


def _drive(loop, rounds_left, seed=0):
    """Made-up rounds: every sampled client sends a state drawn from ``seed``'s stream."""
    gen = np.random.default_rng(seed)
    while not loop.done and rounds_left:
        rounds_left -= 1
        if not loop.evaluating:
            ids = loop.sample()
            splits = loop.on_updates(ids, _updates(gen.normal(size=len(ids)).tolist(), [1] * len(ids)))
        else:
            splits = ("val",)
        while splits:
            splits = loop.on_reports(splits, _reports(gen.integers(0, 10, size=3).tolist(), splits=splits))


@pytest.mark.parametrize("strategy", [FedAvg, lambda: FedAdam(0.1)])
def test_a_checkpointed_loop_continues_exactly(strategy):
    """Round state, sampler, best model and the strategy's state (FedAdam's moments) survive a
    checkpoint taken while a round is under evaluation; the checkpoint is a snapshot."""

    def new():
        return RoundLoop(3, _state(0.0), strategy(), fraction=0.67, seed=4, rounds=8)

    loop = new()
    _drive(loop, 3)
    loop.on_updates([0, 1], _updates([0.3, 0.1], [1, 2]))  # a round under evaluation
    meta, arrays = loop.state_to_checkpoint()
    fresh = new()
    fresh.state_from_checkpoint(meta, arrays)
    assert fresh.evaluating and fresh.round == loop.round == 4 and fresh.metrics is not loop.metrics
    for a in (loop, fresh):
        _drive(a, 8, seed=1)
    assert loop.done and fresh.history == loop.history and fresh.result.best_round == loop.result.best_round
    assert all(
        torch.equal(fresh.state[k], loop.state[k]) and torch.equal(fresh.best_state[k], loop.best_state[k])
        for k in loop.state
    )
    assert len(meta["history"]) == 3  # not the rows added since
    other = RoundLoop(3, {"w": torch.zeros(1)}, strategy(), fraction=0.67, seed=4, rounds=8)
    with pytest.raises(CheckpointMismatchError):
        other.state_from_checkpoint(meta, arrays)
