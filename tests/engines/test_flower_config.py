"""The Flower run config (no flwr needed): what a server operator's hparams may not set."""

from __future__ import annotations

import json

import pytest

from fedgat.protocols.flower_config import SIMULATION_LEDGERS, FlowerRunConfig


@pytest.mark.parametrize("key", SIMULATION_LEDGERS)
def test_a_run_config_refuses_the_simulations_dp_ledgers(key):
    """The simulations' ledger hyper-parameters would be silently ignored on Flower (a node's budget
    is its own node config): a run config that sets one is refused, naming where the budget lives."""
    value = [3.0, 1e-5] if key.endswith("budget") else "/tmp/ledgers"
    cfg = FlowerRunConfig.from_run_config({"hparams": json.dumps({"update_dp_epsilon": 4.0, key: value})})
    with pytest.raises(ValueError, match=rf"run config hparams {key}: .* update-ledger"):
        cfg.hyper()
    ok = FlowerRunConfig.from_run_config({"hparams": json.dumps({"update_dp_epsilon": 4.0})}).hyper()
    assert ok["update_dp_epsilon"] == 4.0 and ok[key] is None
