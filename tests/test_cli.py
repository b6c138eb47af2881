"""The ``fedgat`` command line."""

import json
import re
import subprocess
import sys

import pytest

from fedgat import cli
from fedgat.commands import train
from fedgat.methods import METHODS

REQUIRED_KEYS = {
    "method",
    "dataset",
    "clients",
    "beta",
    "seeds",
    "test_accuracy_mean",
    "test_accuracy_std",
    "per_seed",
    "pretrain_bytes",
    "train_seconds",
    "hparams",
}


def test_help_lists_train(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    assert "train" in capsys.readouterr().out
    assert "train" in cli.COMMANDS


def test_module_entry_point_help():
    out = subprocess.run(
        [sys.executable, "-m", "fedgat.cli", "--help"], capture_output=True, text=True, check=True, timeout=60
    )
    assert "COMMAND" in out.stdout


def test_method_choices_match_library():
    assert train.METHOD_CHOICES == METHODS


def test_train_writes_json(tmp_path, capsys):
    out = tmp_path / "sub" / "run.json"
    status = cli.main(
        [
            "train",
            "--dataset",
            "synthetic",
            "--method",
            "fedgat",
            "--clients",
            "2",
            "--beta",
            "1",
            "--seeds",
            "2",
            "--rounds",
            "3",
            "--json",
            str(out),
            "--quiet",
        ]
    )
    assert status == 0
    data = json.loads(out.read_text())
    assert REQUIRED_KEYS <= set(data)
    assert data["method"] == "fedgat" and data["dataset"] == "synthetic" and data["clients"] == 2
    assert data["seeds"] == [0, 1] and len(data["per_seed"]) == 2
    assert data["hparams"]["rounds"] == 3 and data["hparams"]["variant"] == "vector"
    assert data["pretrain_bytes"] > 0
    assert all("history" not in row for row in data["per_seed"])
    table = capsys.readouterr().out
    assert "fedgat on synthetic" in table and "+-" in table
    # the header names the defaults the numbers depend on: the strategy and the minimum-cross rule
    assert "vector, minimum-cross rule off, fedadam" in table.splitlines()[0]


def test_train_history_and_hparam_flags(tmp_path):
    out = tmp_path / "run.json"
    cli.main(
        [
            "train",
            "--dataset",
            "synthetic",
            "--method",
            "fedgat",
            "--clients",
            "2",
            "--rounds",
            "2",
            "--variant",
            "matrix",
            "--neighbour-cap",
            "3",
            "--degree",
            "8",
            "--json",
            str(out),
            "--history",
            "--quiet",
        ]
    )
    data = json.loads(out.read_text())
    assert data["hparams"]["neighbour_cap"] == 3 and data["hparams"]["degree"] == 8
    assert len(data["per_seed"][0]["history"]) == 2


def test_train_strategy_flag(tmp_path):
    out = tmp_path / "run.json"
    cli.main(
        [
            "train",
            "--dataset",
            "synthetic",
            "--method",
            "distgat",
            "--clients",
            "3",
            "--rounds",
            "2",
            "--strategy",
            "fedadam",
            "--client-lr",
            "0.5",
            "--json",
            str(out),
            "--quiet",
        ]
    )
    hp = json.loads(out.read_text())["hparams"]
    assert hp["strategy"] == "fedadam" and hp["client_lr"] == 0.5


def test_train_refuses_an_unknown_strategy(tmp_path, capsys):
    out = tmp_path / "run.json"
    argv = ["train", "--dataset", "synthetic", "--method", "gcn", "--strategy", "fedsgd", "--quiet"]
    assert cli.main([*argv, "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedgat train: error: ") and "strategy" in err and err.count("\n") == 1
    assert not out.exists()


def test_train_rejects_flag_the_method_does_not_use(tmp_path, capsys):
    out = tmp_path / "run.json"
    argv = ["train", "--dataset", "synthetic", "--method", "gcn", "--heads", "4", "--quiet"]
    assert cli.main([*argv, "--json", str(out)]) == 2
    assert "unknown hyper-parameter" in capsys.readouterr().err and not out.exists()


def test_train_says_where_the_json_went(tmp_path, capsys):
    out = tmp_path / "run.json"
    argv = ["train", "--dataset", "synthetic", "--method", "gcn", "--rounds", "1", "--quiet"]
    assert cli.main([*argv, "--json", str(out)]) == 0
    assert f"wrote the results as JSON to {out}" in capsys.readouterr().err and out.is_file()


def test_demo_reports_pre_training_before_training_and_names_strategy_and_rule(capsys, monkeypatch):
    import fedgat.pipeline

    real = fedgat.pipeline.train_fedgat
    seen = []

    def train_after_the_report(*args, **kwargs):
        seen.append(capsys.readouterr().out)  # what the user has seen when training starts
        return real(*args, **kwargs)

    monkeypatch.setattr(fedgat.pipeline, "train_fedgat", train_after_the_report)
    assert cli.main(["demo", "--dataset", "synthetic", "--clients", "3", "--rounds", "2", "--quiet"]) == 0
    before = seen[0]
    assert "training: fedadam, minimum-cross rule off" in before  # the header names the defaults
    assert "pre-training (encrypted), seconds per phase" in before and "packing: a ciphertext holds" in before
    assert "test accuracy" not in before
    assert "owners' DP ledgers (--dp-budget): none kept, sessions are not counted" in before
    after = capsys.readouterr().out
    assert "FedGAT test accuracy (encrypted pre-training)" in after
    assert "differential privacy of the shared rows: off" in after  # the demo releases no DP rows


def test_demo_charges_each_sessions_verdicts_to_the_owners_ledgers(tmp_path, capsys):
    """``--dp-budget`` (and ``--dp-ledger-dir``) charge every client's session verdicts to its
    owner's ledger, the one ``fedgat train --dp-epsilon`` charges its releases to: a session at the
    n4096 pads costs a row epsilon 0.72 (counted towards both other clients), two compose to 1.05,
    so a budget of 0.9 admits the first demo and refuses the second before anything is sent, with
    the ledgers unchanged and exit status 1."""
    from fedgat.dp_ledger import owner_ledgers

    ledgers = tmp_path / "ledgers"
    out = tmp_path / "demo.json"
    argv = ["demo", "--dataset", "synthetic", "--clients", "3", "--rounds", "1", "--quiet"]
    argv += ["--dp-budget", "0.9", "1e-5", "--dp-ledger-dir", str(ledgers)]
    assert cli.main([*argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert re.search(
        r"owners' DP ledgers, after this session: up to epsilon 0\.72\d? spent \(delta 1e-05\)", printed
    )
    spent = json.loads(out.read_text())["dp_spent"]
    assert sorted(spent) == ["0", "1", "2"]
    assert all(e == pytest.approx(0.7223, abs=2e-3) and d == 1e-5 for e, d in spent.values())
    files = {p.name: p.read_bytes() for p in ledgers.glob("*.json")}
    assert sorted(files) == ["client-0.json", "client-1.json", "client-2.json"]
    assert cli.main([*argv, "--json", str(tmp_path / "again.json")]) == 1
    err = capsys.readouterr().err
    assert re.search(
        r"DP release refused: .* would bring it to 1\.05\d* .* over the budget epsilon 0\.9", err
    )
    assert {p.name: p.read_bytes() for p in ledgers.glob("*.json")} == files
    assert not (tmp_path / "again.json").exists()
    # the ledgers keep their budget: given alone, the folder charges them with it
    ledger = owner_ledgers(3, None, ledgers)[0]
    assert ledger.budget.epsilon == 0.9


def test_demo_saves_the_decrypted_encodings_for_later_training(tmp_path, capsys):
    """``--save-encodings`` writes what the clients decrypted (said on stderr, with the warning the file
    needs), and the file reads back as those encodings exactly: its largest error against the plaintext
    twin is the one the demo reported."""
    from fedgat.checkpoint import load_encodings
    from fedgat.cli_engine import load_graph
    from fedgat.methods import fedgat_partition, resolve_hparams
    from fedgat.pipeline import max_abs_error, run_plaintext_pretraining

    out, saved = tmp_path / "demo.json", tmp_path / "kept" / "enc.ckpt"
    argv = ["demo", "--dataset", "synthetic", "--clients", "3", "--rounds", "1", "--quiet"]
    assert cli.main([*argv, "--save-encodings", str(tmp_path)]) == 2  # a folder: refused before any work
    assert "--save-encodings" in capsys.readouterr().err and not list(tmp_path.iterdir())
    assert cli.main([*argv, "--json", str(out), "--save-encodings", str(saved)]) == 0
    err = capsys.readouterr().err
    assert "wrote 3 clients' decrypted encodings" in err and f"to {saved} (made the folder" in err
    assert "neighbours' features" in err
    result = json.loads(out.read_text())
    assert result["saved_encodings"] == str(saved)
    loaded = load_encodings(saved)
    graph = load_graph("synthetic", quiet=True, seed=0)
    partition = fedgat_partition(graph, 3, 1.0, 0, resolve_hparams("fedgat", {"variant": "vector"}), None)
    plain = run_plaintext_pretraining(graph, partition, "vector", 0)
    assert 0 < max_abs_error(loaded, plain) == result["max_abs_error_vs_plaintext"] < 1e-4


def test_demo_refuses_a_bad_dp_budget(capsys):
    argv = ["demo", "--dataset", "synthetic", "--clients", "3", "--quiet", "--dp-budget", "0", "1e-5"]
    assert cli.main(argv) == 2
    assert "--dp-budget needs EPSILON > 0 and 0 < DELTA < 1" in capsys.readouterr().err


def test_a_finished_progress_bar_stops_its_clock():
    """A phase's bar closes when it is full, not when the whole round ends (its clock stops there)."""
    import io

    from tqdm import tqdm

    from fedgat.pipeline import _advance

    bar = tqdm(total=3, file=io.StringIO())
    _advance(bar, 2)
    assert not bar.disable  # still open
    _advance(bar, 1)
    assert bar.disable and bar.n == 3  # closed at 3 of 3
    _advance(bar, 0)  # a late observer call on a closed bar is harmless


def test_interrupt_and_terminate_run_the_commands_clean_up(monkeypatch, capsys, tmp_path):
    """Ctrl-C (KeyboardInterrupt) and ``kill`` (SIGTERM, raised in the command's process) end a command
    in one line with status 130 / 143, after its ``finally`` clean-up ran (an audit's temporary folders)."""
    import os
    import signal
    import tempfile
    import time

    import fedgat.commands.train as command

    made: list[str] = []

    def run(args):
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            made.append(folder)
            if args.seeds == 1:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal arrives in this sleep
        raise AssertionError("not reached")

    monkeypatch.setattr(command, "run", run)
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["train", "--seeds", "1"]) == 130
    assert capsys.readouterr().err == "fedgat train: interrupted\n"
    assert cli.main(["train", "--seeds", "2"]) == 143
    assert capsys.readouterr().err == "fedgat train: terminated\n"
    assert len(made) == 2 and not any(os.path.exists(f) for f in made)
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the command's only
    with pytest.raises(KeyboardInterrupt):
        cli.main(["train", "--seeds", "1", "--debug"])


def test_audit_knows_the_server_attacks_without_importing_them():
    """``fedgat audit --help`` lists the server-side attacks (:mod:`fedgat.attack_names`) without loading
    torch; ``--server-attacks all|none|NAME`` resolve to the names ``fedgat.audit`` runs."""
    probe = (
        "import sys, fedgat.commands.audit as a; print(len(a.SERVER_ATTACK_NAMES), 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["17", "False"]
    from fedgat.audit import SERVER_ATTACKS
    from fedgat.commands import audit

    assert audit.SERVER_ATTACK_NAMES == SERVER_ATTACKS
    assert set(audit.TRAINING_ATTACKS) <= set(SERVER_ATTACKS)
    parser = cli.build_parser()
    every = [*SERVER_ATTACKS, audit.PREDICTOR_ATTACK]
    for given, wanted in ((["all"], every), (["none"], []), (["fake_edges"], ["fake_edges"])):
        args = parser.parse_args(["audit", "--dataset", "synthetic", "--server-attacks", *given])
        audit.check_arguments(args)
        audit.check_arguments(args)  # idempotent: what it settles passes its own checks again
        assert args.server_attacks == wanted
