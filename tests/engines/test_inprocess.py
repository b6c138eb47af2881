"""The conformance checks (:mod:`conformance`) over the in-process transport: the reference
against itself, which keeps the checks honest (and fast) in the default suite."""

from __future__ import annotations

from fedgat.protocols import InProcessTransport

from .conformance import check_deadlines, check_pretraining, check_rejection, check_training


def test_pretraining_conforms():
    check_pretraining(InProcessTransport)


def test_training_conforms():
    check_training(InProcessTransport)


def test_rejection_surfaces_typed():
    check_rejection(InProcessTransport)


def test_stalls_end_at_the_deadlines():
    check_deadlines(InProcessTransport)


def test_engine_flags_are_checked_before_anything_runs(capsys):
    from fedgat.cli import main

    assert main(["train", "--dataset", "synthetic", "--method", "gcn", "--engine", "ray", "--quiet"]) == 2
    assert "gcn trains in process only" in capsys.readouterr().err
    assert main(["train", "--dataset", "synthetic", "--actors", "2", "--rounds", "1", "--quiet"]) == 2
    assert "--actors needs --engine process or --engine ray" in capsys.readouterr().err
