"""The conformance checks (:mod:`conformance`) over the in-process transport: the reference
against itself, which keeps the checks honest (and fast) in the default suite."""

from __future__ import annotations

from fedgat.protocols import InProcessTransport

from .conformance import check_pretraining, check_rejection, check_training


def test_pretraining_conforms():
    check_pretraining(InProcessTransport)


def test_training_conforms():
    check_training(InProcessTransport)


def test_rejection_surfaces_typed():
    check_rejection(InProcessTransport)


def test_engine_flags_are_checked_before_anything_runs():
    import pytest

    from fedgat.cli import main

    with pytest.raises(SystemExit, match="gcn trains in process only"):
        main(["train", "--dataset", "synthetic", "--method", "gcn", "--engine", "ray", "--quiet"])
    with pytest.raises(SystemExit, match="need --engine ray"):
        main(["train", "--dataset", "synthetic", "--actors", "2", "--rounds", "1", "--quiet"])
