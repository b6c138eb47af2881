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


_DEMO = ["demo", "--dataset", "synthetic", "--clients", "3", "--rounds", "1", "--quiet"]


@pytest.fixture(scope="module")
def saved_demo(tmp_path_factory):
    """One encrypted demo that kept its decrypted encodings: ``(json result, file, stderr)``."""
    import contextlib
    import io

    folder = tmp_path_factory.mktemp("demo")
    out, saved = folder / "demo.json", folder / "kept" / "enc.ckpt"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert cli.main([*_DEMO, "--json", str(out), "--save-encodings", str(saved)]) == 0
    return json.loads(out.read_text()), saved, err.getvalue()


def test_demo_saves_the_decrypted_encodings_for_later_training(saved_demo, tmp_path, capsys):
    """``--save-encodings`` writes what the clients decrypted (said on stderr, with the warning the file
    needs), and the file reads back as those encodings exactly: its largest error against the plaintext
    twin is the one the demo reported; it records the split they belong to."""
    from fedgat.checkpoint import read_encodings
    from fedgat.cli_engine import load_graph
    from fedgat.methods import fedgat_partition, resolve_hparams
    from fedgat.pipeline import max_abs_error, run_plaintext_pretraining

    assert cli.main([*_DEMO, "--save-encodings", str(tmp_path)]) == 2  # a folder: refused before any work
    assert "--save-encodings" in capsys.readouterr().err and not list(tmp_path.iterdir())
    result, saved, err = saved_demo
    assert "wrote 3 clients' decrypted encodings" in err and f"to {saved} (made the folder" in err
    assert "neighbours' features" in err
    assert result["saved_encodings"] == str(saved)
    read = read_encodings(saved)
    assert read.info == {
        "written_by": "fedgat demo",
        "dataset": "synthetic",
        "num_nodes": 500,
        "clients": 3,
        "beta": 1.0,
        "seed": 0,
        "owners": None,
        "variant": "vector",
        "neighbour_cap": None,
        "min_cross": 0,
    }
    graph = load_graph("synthetic", quiet=True, seed=0)
    partition = fedgat_partition(graph, 3, 1.0, 0, resolve_hparams("fedgat", {"variant": "vector"}), None)
    plain = run_plaintext_pretraining(graph, partition, "vector", 0)
    assert 0 < max_abs_error(read.encodings, plain) == result["max_abs_error_vs_plaintext"] < 1e-4


def test_train_from_saved_encodings_runs_no_pre_training_and_matches_the_api(saved_demo, tmp_path):
    """``fedgat train --encodings`` trains on the file's encodings (no pre-training bytes), as
    ``run_encrypted_fedgat(encodings=load_encodings(file))`` does with the same seed."""
    from fedgat.checkpoint import load_encodings
    from fedgat.cli_engine import load_graph, synthetic_sizes
    from fedgat.methods import fedgat_partition, resolve_hparams
    from fedgat.pipeline import run_encrypted_fedgat, train_fedgat

    _, saved, _ = saved_demo
    out = tmp_path / "train.json"
    argv = ["train", "--dataset", "synthetic", "--clients", "3", "--rounds", "3", "--quiet"]
    assert cli.main([*argv, "--encodings", str(saved), "--json", str(out)]) == 0
    row = json.loads(out.read_text())["per_seed"][0]
    assert row["pretrain_bytes"] == 0 and row["rounds"] == 3
    assert json.loads(out.read_text())["encodings"] == str(saved)
    graph = load_graph("synthetic", **synthetic_sizes(None), seed=0)  # the commands' synthetic graph
    run = run_encrypted_fedgat(graph, 3, 1.0, 0, encodings=load_encodings(saved), progress=False, rounds=3)
    assert run.pretrain is None and run.summary()["pretraining"] == "saved encodings"
    # the same training as train_fedgat's on the split the demo made, from the file's encodings
    settings = resolve_hparams("fedgat", {"variant": "vector"})
    partition = fedgat_partition(graph, 3, 1.0, 0, settings, None)
    direct = train_fedgat(graph, partition, load_encodings(saved), seed=0, rounds=3, progress=False)
    assert row["test_accuracy"] == run.training.fit.test_accuracy == direct.fit.test_accuracy
    assert row["best_round"] == direct.fit.best_round


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--clients", "4"], "another split (--clients 4 here); give --clients 3, as the run"),
        (["--first-seed", "1"], "give --first-seed 0,"),
        (["--beta", "0.5"], "give --beta 1.0,"),
        (["--variant", "matrix"], "give --variant vector, --neighbour-cap none,"),
        (["--min-cross", "2"], "give --min-cross 0,"),
        (["--nodes", "600"], "holds encodings of 'synthetic' (500 nodes); --dataset synthetic has 600"),
        (["--method", "gcn"], "--method gcn does not train on them"),
        (["--seeds", "2"], "leave --seeds out"),
        (["--dp-epsilon", "1"], "--dp-epsilon draws a DP release"),
    ],
)
def test_train_refuses_saved_encodings_of_another_split(saved_demo, capsys, flags, says):
    _, saved, _ = saved_demo
    argv = ["train", "--dataset", "synthetic", "--rounds", "1", "--quiet", "--encodings", str(saved)]
    if "--clients" not in flags:
        argv += ["--clients", "3"]
    assert cli.main([*argv, *flags]) == 2
    assert says in capsys.readouterr().err


def test_train_refuses_a_missing_or_damaged_encodings_file(saved_demo, tmp_path, capsys):
    from fedgat.checkpoint import load_encodings, save_encodings

    _, saved, _ = saved_demo
    argv = ["train", "--dataset", "synthetic", "--clients", "3", "--rounds", "1", "--quiet", "--encodings"]
    assert cli.main([*argv, str(tmp_path / "none.ckpt")]) == 2
    assert "no such file" in capsys.readouterr().err
    data = bytearray(saved.read_bytes())
    data[100] ^= 1
    (tmp_path / "bad.ckpt").write_bytes(bytes(data))
    assert cli.main([*argv, str(tmp_path / "bad.ckpt")]) == 1
    assert "digest does not match" in capsys.readouterr().err
    # a file without a record of its split (saved from Python): checked by its clients' nodes
    bare = save_encodings(tmp_path / "bare.ckpt", load_encodings(saved))
    assert cli.main([*argv[:-1], "--beta", "0.3", "--encodings", str(bare)]) == 2
    assert "client 0's encodings cover other nodes than its needed nodes" in capsys.readouterr().err
    # a record without the dataset's name still names what it has
    odd = save_encodings(tmp_path / "odd.ckpt", load_encodings(saved), info={"num_nodes": 7})
    assert cli.main([*argv, str(odd)]) == 2
    assert "holds encodings of 'synthetic' (7 nodes)" in capsys.readouterr().err


def test_train_names_the_owners_the_saved_split_had(saved_demo, tmp_path, capsys):
    import numpy as np

    _, saved, _ = saved_demo
    owners = tmp_path / "owners.npy"
    np.save(owners, np.arange(500) % 3)
    argv = ["train", "--dataset", "synthetic", "--rounds", "1", "--quiet", "--encodings", str(saved)]
    assert cli.main([*argv, "--owners", str(owners)]) == 2
    err = capsys.readouterr().err
    assert f"(--owners {owners} here); give no --owners," in err


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
