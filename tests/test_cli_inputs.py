"""The command line with a user's own graph and owners, and its one error path (issues 21 and 22).

A ``.npz`` (gnn-benchmark layout) and a ``.pt`` (a saved PyG ``Data``) made here from random data
(60 nodes, 6 features, 3 classes) run through ``demo``, ``train`` and ``audit``, with owners given as
CSV and as ``.npy``. Every bad input is refused in one line on stderr (``fedgat <command>: error:``)
with exit status 2 (usage) or 1 (fedgat's typed errors), before any work, and nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

import fedgat
from fedgat.cli import main
from fedgat.graph import Graph
from fedgat.owners import OwnersError

N, D, C = 60, 6, 3
#: a tiny, quick setting for every command (seconds per run)
TINY = {
    "demo": ["--rounds", "2", "--workers", "0", "--quiet"],
    "train": ["--rounds", "2", "--quiet"],
    "audit": ["--rounds", "2", "--attack-rounds", "1", "--no-server-check", "--quiet"],
}


def _edges(seed: int = 0) -> np.ndarray:
    """A connected-ish random graph: a ring plus random chords, one direction only (fedgat symmetrises)."""
    rng = np.random.default_rng(seed)
    ring = np.stack([np.arange(N), (np.arange(N) + 1) % N])
    chords = rng.integers(0, N, size=(2, 2 * N))
    return np.concatenate([ring, chords], axis=1)


def _features(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((N, D)).astype(np.float32) + 0.1


def _labels(seed: int = 0) -> np.ndarray:
    return np.arange(N) % C  # every class present, 20 nodes each


def write_npz(path: Path, **override) -> Path:
    """A gnn-benchmark ``.npz``: CSR adjacency, dense ``features``, ``labels``."""
    ei = _edges()
    order = np.lexsort((ei[1], ei[0]))
    rows, cols = ei[0, order], ei[1, order]
    indptr = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=N), out=indptr[1:])
    arrays = {
        "adj_data": np.ones(len(cols), dtype=np.float32),
        "adj_indices": cols.astype(np.int32),
        "adj_indptr": indptr,
        "adj_shape": np.array([N, N]),
        "features": _features(),
        "labels": _labels(),
        **override,
    }
    np.savez(path, **arrays)
    return path


def write_pt(path: Path, **fields) -> Path:
    """A saved PyG ``Data`` with the same graph (and ``fields`` besides, e.g. masks)."""
    data = Data(
        x=torch.from_numpy(_features()),
        y=torch.from_numpy(_labels()),
        edge_index=torch.from_numpy(_edges()),
        **fields,
    )
    torch.save(data, path)
    return path


def write_folder(path: Path) -> Path:
    """A graph folder (``nodes.csv`` with named nodes and classes, ``edges.csv``) of the same graph."""
    path.mkdir()
    ids = [f"node-{k:03d}" for k in range(N)]
    rows = [
        ",".join([ids[k], f"class-{c}", *map(repr, map(float, x))])
        for k, (c, x) in enumerate(zip(_labels(), _features()))
    ]
    (path / "nodes.csv").write_text(
        "id,label," + ",".join(f"f{j}" for j in range(D)) + "\n" + "\n".join(rows) + "\n"
    )
    (path / "edges.csv").write_text("".join(f"{ids[s]},{ids[t]}\n" for s, t in _edges().T))
    return path


def _masks(empty: str) -> dict[str, torch.Tensor]:
    """The three split masks (nodes 0-19 train, 20-39 val, 40-59 test), ``empty`` selecting none."""
    masks = {
        key: (torch.arange(N) // 20 == i) for i, key in enumerate(("train_mask", "val_mask", "test_mask"))
    }
    masks[empty] = torch.zeros(N, dtype=torch.bool)
    return masks


def owners_array(k: int = 3) -> np.ndarray:
    return np.random.default_rng(1).permutation(np.arange(N) % k)


def write_owners(path: Path, owners: np.ndarray) -> Path:
    if path.suffix == ".npy":
        np.save(path, owners)
    else:
        path.write_text("client\n" + "".join(f"{o}\n" for o in owners))
    return path


@pytest.fixture
def inputs(tmp_path):
    """The input files in ``tmp_path/in``; outputs go to ``tmp_path/out`` (absent until written)."""
    folder = tmp_path / "in"
    folder.mkdir()
    return {
        "npz": write_npz(folder / "g.npz"),
        "pt": write_pt(folder / "g.pt"),
        "folder": write_folder(folder / "g"),
        "csv": write_owners(folder / "owners.csv", owners_array()),
        "npy": write_owners(folder / "owners.npy", owners_array()),
        "tsv": write_owners(folder / "owners.tsv", owners_array()),
        "out": tmp_path / "out",
    }


def test_graph_is_exported_at_the_top_level():
    assert fedgat.Graph is Graph
    assert "Graph" in fedgat.__all__


# ------------------------------------------------------------------------------- user graphs


@pytest.mark.parametrize("kind", ["npz", "pt", "folder"])
@pytest.mark.parametrize("command", ["demo", "train", "audit"])
def test_graph_file_runs_through_the_command(inputs, kind, command, capsys):
    out = inputs["out"] / f"{command}.json"
    argv = [command, "--dataset", str(inputs[kind]), "--clients", "3", *TINY[command], "--json", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["clients"] == 3
    if command == "train":
        assert result["dataset"] == "g" and 0.0 <= result["test_accuracy_mean"] <= 1.0
    elif command == "demo":
        assert result["num_nodes"] == N and result["num_features"] == D
        assert 0 < result["max_abs_error_vs_plaintext"] < 1e-3
    else:
        assert 0.0 <= result["test_accuracy"] <= 1.0 and "basis" in result["client_attacks"]
    err = capsys.readouterr().err
    if command != "audit":  # audit --quiet prints nothing on stderr but what it wrote
        # the graph report, one line: the input was directed, so reverse edges were added
        report = [line for line in err.splitlines() if line.startswith("graph: ")]
        assert len(report) == 1 and "reverse edges added" in report[0]
    assert f"wrote the results as JSON to {out}" in err


@pytest.mark.parametrize("owners", ["csv", "npy", "tsv"])
@pytest.mark.parametrize("command", ["demo", "audit"])
def test_owners_file_sets_the_split_and_the_client_count(inputs, owners, command):
    out = inputs["out"] / "r.json"
    argv = [command, "--dataset", str(inputs["npz"]), "--owners", str(inputs[owners]), *TINY[command]]
    assert main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["clients"] == 3  # from the file (the default without it is 10)
    assert result["owners"] == str(inputs[owners])


def test_owners_checked_against_clients(inputs, capsys):
    """``--clients`` with ``--owners``: ids must lie below it and every client must own a node."""
    out = inputs["out"] / "r.json"
    base = ["demo", "--dataset", str(inputs["npz"]), "--owners", str(inputs["csv"]), *TINY["demo"]]
    assert main([*base, "--clients", "2", "--json", str(out)]) == 1
    assert "client id 2" in capsys.readouterr().err and not inputs["out"].exists()
    assert main([*base, "--clients", "4", "--json", str(out)]) == 1
    err = capsys.readouterr().err
    assert "names clients 0..2 but 4 clients were asked for (client 3 would own no nodes)" in err
    assert "--clients" in err and not inputs["out"].exists()
    assert main([*base, "--clients", "3", "--json", str(out)]) == 0


def test_owners_keyed_by_the_folders_node_ids(inputs):
    """A graph folder's owners file may name each node by its ``id`` in ``nodes.csv``, in any order."""
    import argparse

    from fedgat.cli_engine import resolve_owners
    from fedgat.data import load_dataset

    owners = owners_array()
    order = np.random.default_rng(2).permutation(N)
    path = inputs["out"].parent / "by_id.csv"
    path.write_text("client,node\n" + "".join(f"{owners[k]},node-{k:03d}\n" for k in order))
    args = argparse.Namespace(owners=path, clients=None)
    assert resolve_owners(args, load_dataset(str(inputs["folder"]))).tolist() == owners.tolist()
    assert args.clients == 3
    out = inputs["out"] / "r.json"
    argv = [
        "demo",
        "--dataset",
        str(inputs["folder"]),
        "--owners",
        str(path),
        *TINY["demo"],
        "--json",
        str(out),
    ]
    assert main(argv) == 0 and json.loads(out.read_text())["clients"] == 3


def test_train_with_owners(inputs, capsys):
    out = inputs["out"] / "t.json"
    argv = ["train", "--dataset", str(inputs["pt"]), "--owners", str(inputs["npy"]), *TINY["train"]]
    assert main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["clients"] == 3 and result["owners"] == str(inputs["npy"])
    assert "3 client(s), owners from" in capsys.readouterr().out


def test_audit_quiet_prints_no_progress(inputs, capsys):
    argv = ["audit", "--dataset", "synthetic", "--clients", "3", *TINY["audit"], "--no-training"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.startswith("# Privacy audit")
    assert main([a for a in argv if a != "--quiet"]) == 0
    assert "client side: attacks" in capsys.readouterr().err


# ------------------------------------------------------------------------------- bad inputs


def _bad_inputs(folder: Path) -> dict[str, Path]:
    """Malformed owners and graph files."""
    files = {
        "short": write_owners(folder / "short.csv", owners_array()[:-1]),
        "empty_client": write_owners(folder / "gap.npy", np.where(owners_array() == 1, 2, owners_array())),
        "nan": folder / "nan.npy",
        "malformed": folder / "bad.csv",
        "pickle": folder / "obj.npy",
        "nan_features": write_npz(folder / "nanx.npz", features=np.full((N, D), np.nan, dtype=np.float32)),
        "bad_labels": write_npz(folder / "labels.npz", labels=-np.ones(N, dtype=np.int64)),
        "one_class": write_npz(folder / "one.npz", labels=np.zeros(N, dtype=np.int64)),
        "no_train": write_pt(folder / "notrain.pt", **_masks("train_mask")),
        "no_val": write_pt(folder / "noval.pt", **_masks("val_mask")),
        "not_npz": folder / "junk.npz",
        "xlsx": folder / "owners.xlsx",
        "sweep_json": folder / "sweep.json",
        "text_json": folder / "notes.json",
    }
    np.save(files["nan"], np.where(np.arange(N) == 5, np.nan, owners_array().astype(float)))
    files["malformed"].write_text("client\n0\nzero\n" + "1\n" * (N - 2))
    np.save(files["pickle"], np.array([{"a": 1}] * N, dtype=object), allow_pickle=True)
    files["not_npz"].write_text("not a zip archive")
    files["xlsx"].write_text("x")
    files["sweep_json"].write_text('[{"encrypted": {}, "ratios": {}}]')
    files["text_json"].write_text("not JSON")
    return files


#: (argv, exit status, message fragment); {name} is a file of _bad_inputs or the fixture's inputs,
#: {out} the output folder that must stay absent
BAD = [
    (["train", "--clients", "0"], 2, "--clients must be >= 1, got 0"),
    (["train", "--beta", "-1"], 2, "--beta must be finite and > 0"),
    (["demo", "--beta", "-1"], 2, "--beta must be finite and > 0"),
    (["audit", "--beta", "nan"], 2, "--beta must be finite and > 0"),
    (["audit", "--clients", "0"], 2, "--clients must be >= 1"),
    (["demo", "--rounds", "0"], 2, "--rounds must be >= 1"),
    (["train", "--seeds", "0"], 2, "--seeds must be >= 1"),
    (["train", "--dataset", "synthetic", "--clients", "5000"], 2, "synthetic has 500 nodes"),
    (["demo", "--dataset", "synthetic", "--nodes", "60", "--clients", "61"], 2, "give at most 60 clients"),
    (["train", "--dataset", "nosuch"], 2, "--dataset nosuch: unknown dataset"),
    (["demo", "--dataset", "coauthor:xx"], 2, "unknown coauthor dataset 'xx'"),
    (["audit", "--dataset", "{out}/g.csv"], 2, "unsupported file type '.csv'"),
    (["train", "--dataset", "{out}/missing.npz"], 2, "missing.npz: no such file"),
    (["demo", "--dataset", "{nan_features}"], 1, "finite"),
    (["train", "--dataset", "{bad_labels}"], 1, "label"),
    (
        ["train", "--dataset", "{one_class}"],
        1,
        "every node has label 0; node classification needs at least two",
    ),
    (["demo", "--dataset", "{no_train}"], 1, "train_mask selects no node"),
    (["train", "--dataset", "{no_val}"], 1, "val_mask selects no node"),
    (["audit", "--dataset", "{not_npz}"], 1, "junk.npz"),
    (
        ["train", "--dataset", "{npz}", "--owners", "{short}"],
        1,
        f"gives {N - 1} owners but the graph has {N}",
    ),
    (["demo", "--dataset", "{npz}", "--owners", "{empty_client}"], 1, "client 1 owns no nodes"),
    (["audit", "--dataset", "{npz}", "--owners", "{nan}", "--no-training"], 1, "must be finite"),
    (["demo", "--dataset", "{pt}", "--owners", "{malformed}"], 1, "line 3 holds 'zero'"),
    (["demo", "--dataset", "{pt}", "--owners", "{pickle}"], 1, "not a readable .npy array"),
    (["train", "--dataset", "{npz}", "--owners", "{xlsx}"], 2, "unsupported type '.xlsx'"),
    (["train", "--dataset", "{npz}", "--owners", "{out}/none.csv"], 2, "none.csv: no such file"),
    (["train", "--dataset", "synthetic", "--json", "{dir}"], 2, "is a directory; give a file path"),
    (["demo", "--dataset", "synthetic", "--json", "{dir}"], 2, "is a directory; give a file path"),
    (["audit", "--dataset", "synthetic", "--report", "{dir}"], 2, "--report"),
    (["audit", "--dataset", "synthetic", "--sweep", "1", "--plot", "{dir}"], 2, "--plot"),
    (["train", "--dataset", "synthetic", "--json", "{npz}/x.json"], 2, "is a file, not a folder"),
    (["audit", "--dataset", "synthetic", "--plot", "{out}/p.png"], 2, "--plot draws the epsilon sweep"),
    (["train", "--dataset", "synthetic", "--dp-epsilon", "0"], 2, "--dp-epsilon must be a number > 0"),
    (["train", "--dataset", "synthetic", "--dp-epsilon", "1", "--dp-delta", "1"], 2, "--dp-delta must be in"),
    (
        ["train", "--dataset", "synthetic", "--dp-epsilon", "1", "--dp-budget", "1", "2"],
        2,
        "--dp-budget needs",
    ),
    (["train", "--dataset", "synthetic", "--dp-budget", "4", "1e-5"], 2, "add --dp-epsilon"),
    (
        ["train", "--dataset", "synthetic", "--method", "gat", "--dp-epsilon", "1"],
        2,
        "unknown hyper-parameter",
    ),
    (["train", "--dataset", "synthetic", "--update-dp-epsilon", "-1"], 2, "--update-dp-epsilon must be"),
    (["train", "--dataset", "synthetic", "--update-dp-clip", "1"], 2, "add --update-dp-epsilon"),
    (
        ["train", "--dataset", "synthetic", "--update-dp-epsilon", "1", "--update-dp-delta", "0"],
        2,
        "--update-dp-delta must be in",
    ),
    (
        ["train", "--dataset", "synthetic", "--update-dp-epsilon", "1", "--update-dp-clip", "0"],
        2,
        "--update-dp-clip must be",
    ),
    (
        ["train", "--dataset", "synthetic", "--method", "gcn", "--update-dp-epsilon", "1"],
        2,
        "gcn is centralised",
    ),
    (["bench", "overhead", "--clients", "0"], 2, "--clients must be >= 1"),
    (["bench", "overhead", "--dataset", "synthetic", "--nodes", "60", "--clients", "61"], 2, "at most 60"),
    (["bench", "overhead", "--beta", "-1"], 2, "--beta must be finite and > 0"),
    (["bench", "overhead", "--link-gbps", "0"], 2, "--link-gbps must be a number > 0"),
    (["bench", "overhead", "--dataset", "nosuch"], 2, "unknown dataset"),
    (["bench", "overhead", "--out", "{npz}"], 2, "--out"),
    # the overhead benchmark's options that would be ignored, or cost a whole run before failing
    (["bench", "overhead", "--baseline", "{text_json}"], 2, "notes.json is not JSON"),
    (["bench", "overhead", "--baseline", "{sweep_json}"], 2, "is a list (a --sweep's results?)"),
    (["bench", "overhead", "--baseline", "{dir}"], 2, "a folder; give its overhead.json"),
    (["bench", "overhead", "--baseline-label", "v1"], 2, "--baseline-label names a --baseline"),
    (["bench", "overhead", "--out", "{out}", "--json", "{out}/overhead.md"], 2, "where --out writes the .md"),
    (["bench", "overhead", "--no-train", "--rounds", "5"], 2, "--no-train skips it"),
    (["bench", "overhead", "--client-counts", "2"], 2, "--client-counts choose what --sweep runs"),
    (["bench", "overhead", "--sweep", "--nodes", "100"], 2, "leave --nodes out"),
    (["bench", "overhead", "--sweep", "--client-counts", "1", "2"], 2, "--client-counts 1: one client owns"),
    (["bench", "overhead", "--sweep", "--matrix-estimate"], 2, "leave --matrix-estimate out"),
    (["bench", "layer", "--out", "{npz}"], 2, "is a file; give a folder"),
    (["bench", "accuracy", "--out", "{npz}"], 2, "is a file; give a folder"),
    # hyper-parameters out of their range, refused before any set-up (not deep inside a run)
    (["train", "--dataset", "synthetic", "--psi", "foo"], 2, "unknown psi 'foo'"),
    (["train", "--dataset", "synthetic", "--domain", "0"], 2, "domain must lie in (0, inf)"),
    (["train", "--dataset", "synthetic", "--fraction", "0"], 2, "fraction must lie in (0, 1]"),
    (["train", "--dataset", "synthetic", "--fraction", "1.5"], 2, "fraction must lie in (0, 1]"),
    (["train", "--dataset", "synthetic", "--dropout", "1.5"], 2, "dropout must lie in [0, 1)"),
    (["train", "--dataset", "synthetic", "--feature-dropout", "1"], 2, "feature_dropout must lie in [0, 1)"),
    (["train", "--dataset", "synthetic", "--strategy", "fedavg", "--mu", "-1"], 2, "mu must lie in [0, inf)"),
    (["train", "--dataset", "synthetic", "--min-cross", "-1"], 2, "min_cross must be an integer >= 0"),
    (["train", "--dataset", "synthetic", "--lr", "0"], 2, "lr must lie in (0, inf)"),
    (["train", "--dataset", "synthetic", "--first-seed", "-1"], 2, "--first-seed must be >= 0"),
    (["train", "--dataset", "cora", "--nodes", "80"], 2, "--nodes applies to --dataset synthetic only"),
    (["train", "--dataset", "synthetic", "--nodes", "10"], 2, "--nodes must be >= 40"),
    (["audit", "--dataset", "cora", "--nodes", "80"], 2, "--nodes applies to --dataset synthetic only"),
    (["audit", "--dataset", "synthetic", "--nodes", "10"], 2, "--nodes must be >= 40"),
    (["demo", "--dataset", "synthetic", "--seed", "-1"], 2, "--seed must be >= 0"),
    (["audit", "--dataset", "synthetic", "--seed", "-1"], 2, "--seed must be >= 0"),
    (["audit", "--dataset", "synthetic", "--server-attacks", "bogus"], 2, "--server-attacks: unknown bogus"),
    (["audit", "--dataset", "synthetic", "--server-attacks", "all", "fake_edges"], 2, "stand alone"),
    (
        ["audit", "--dataset", "synthetic", "--no-server-check", "--upload-window", "1"],
        2,
        "--no-server-check skips",
    ),
    (["audit", "--dataset", "synthetic", "--sweep"], 2, "--sweep needs the epsilons"),
    (
        ["audit", "--dataset", "synthetic", "--dp-mechanism", "gaussian"],
        2,
        "give --dp-epsilon (or --sweep) too",
    ),
    (
        ["audit", "--dataset", "synthetic", "--dp-epsilon", "1", "--dp-dim", "8"],
        2,
        "label_rr does not use it",
    ),
    (["audit", "--dataset", "synthetic", "--sweep", "1", "--plot", "{out}/p.txt"], 2, "cannot write .txt"),
    (["audit", "--dataset", "synthetic", "--json", "{out}/a", "--report", "{out}/a"], 2, "give each its own"),
    (["audit", "--dataset", "synthetic", "--report", "-"], 2, "--report - : give a file path"),
    (["audit", "--dataset", "synthetic", "--report", "{dir}"], 2, "/dir/audit.md)"),
    (
        ["audit", "--dataset", "synthetic", "--clients", "3", "--attack-clients", "5"],
        2,
        "there are 3 clients",
    ),
    # the benchmarks with their own parser: one line under the command's name, before any work
    (["bench", "presets", "--nodes", "-5"], 2, "--nodes must be >= 40, got -5"),
    (["bench", "presets", "--dataset", "nosuch"], 2, "unknown dataset"),
    (["bench", "train", "--dataset", "nosuch"], 2, "--dataset nosuch: unknown dataset"),
    (["bench", "train", "--epochs", "0"], 2, "--epochs must be >= 1"),
    (["bench", "scale", "--quick", "--clients", "-1"], 2, "--clients must be >= 1, got -1"),
    (["bench", "accuracy", "--seeds", "0"], 2, "--seeds must be >= 1, got 0"),
    (["bench", "accuracy", "--sweep-beta", "0"], 2, "--sweep-beta must be finite and > 0"),
]


@pytest.mark.parametrize(("argv", "status", "message"), BAD, ids=[" ".join(a[:4]) for a, _, _ in BAD])
def test_bad_input_is_refused_in_one_line_before_any_work(
    inputs, tmp_path, capsys, monkeypatch, argv, status, message
):
    monkeypatch.chdir(tmp_path)  # bench's default --out is ./fedgat-results: it must not appear either
    names = {k: str(v) for k, v in inputs.items()} | {
        k: str(v) for k, v in _bad_inputs(tmp_path / "in").items()
    }
    (tmp_path / "in" / "dir").mkdir()
    names["dir"] = str(tmp_path / "in" / "dir")
    before = sorted(p.name for p in (tmp_path / "in").rglob("*"))
    argv = [a.format(**names) for a in argv]
    json_out = [] if "--json" in argv or argv[0] == "bench" else ["--json", str(inputs["out"] / "r.json")]
    assert main([*argv, *json_out]) == status
    # the graph's summary line and its report's notes come before the error
    report = ("graph: ", "  note: ")
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith(report)]
    command = " ".join(argv[:2]) if argv[0] == "bench" else argv[0]
    assert len(lines) == 1 and lines[0].startswith(f"fedgat {command}: error: "), lines
    assert message in lines[0]
    assert not inputs["out"].exists() and not (tmp_path / "fedgat-results").exists()  # nothing written
    assert sorted(p.name for p in (tmp_path / "in").rglob("*")) == before
    assert not any((tmp_path / "in" / "dir").iterdir())


def test_train_sizes_the_synthetic_graph_as_demo_does(monkeypatch, capsys):
    import fedgat.commands.train as train_command

    seen: list[Graph] = []
    real = train_command.load_graph

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(train_command, "load_graph", spy)
    argv = ["train", "--dataset", "synthetic", "--nodes", "80", "--clients", "2", "--rounds", "1", "--quiet"]
    assert main(argv) == 0
    assert seen[0].num_nodes == 80 and int(seen[0].val_mask.sum()) == int(seen[0].test_mask.sum()) == 16


def test_a_benchmark_with_its_own_parser_speaks_under_its_command_name(capsys, tmp_path, monkeypatch):
    """``fedgat bench train|accuracy|scale|presets`` hand their options to the benchmark's own
    parser: its help and errors carry the command's name and the folder the command writes to."""
    monkeypatch.chdir(tmp_path)
    for name in ("train", "accuracy", "scale", "presets"):
        assert main(["bench", name, "--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: fedgat bench {name} "), out[:80]
        assert "(default fedgat-results)" in " ".join(out.split()), name
    assert main(["bench", "presets", "--debug", "--nodes", "10"]) == 2  # --debug is known here too
    assert capsys.readouterr().err.startswith("fedgat bench presets: error: --nodes must be >= 40")
    assert not (tmp_path / "fedgat-results").exists()


def test_debug_shows_the_traceback(inputs, tmp_path):
    bad = write_owners(tmp_path / "short.csv", owners_array()[:-1])
    argv = ["demo", "--dataset", str(inputs["npz"]), "--owners", str(bad), *TINY["demo"]]
    with pytest.raises(OwnersError, match="gives 59 owners"):
        main([*argv, "--debug"])


def test_argparse_errors_are_one_line_with_status_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--clients", "many"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("fedgat train: error: argument --clients: invalid int value") and err.count("\n") == 1
    )
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--no-such-flag"])
    assert exc.value.code == 2
    assert "fedgat audit: error: unrecognized arguments: --no-such-flag" in capsys.readouterr().err
    for bad in ("0", "two"):
        with pytest.raises(SystemExit) as exc:
            main(["demo", "--upload-window", bad])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert (
            f"argument --upload-window: must be a positive integer, got '{bad}'" in err
            and err.count("\n") == 1
        )
    for command, bad in (("demo", "-1"), ("bench", "some")):
        with pytest.raises(SystemExit) as exc:
            main([command, *(["overhead"] if command == "bench" else []), "--encrypt-workers", bad])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"argument --encrypt-workers: must be 'auto' or a count >= 0, got '{bad}'" in err


def test_train_refuses_more_clients_than_cora_has_nodes(cora, capsys, tmp_path):
    out = tmp_path / "out" / "r.json"
    assert main(["train", "--clients", "5000", "--json", str(out), "--quiet"]) == 2
    assert "cora has 2708 nodes" in capsys.readouterr().err and not out.parent.exists()


def test_engine_flags_are_usage_errors(tmp_path, capsys):
    """``--engine``/``--address``/``--actors`` misuse: exit 2 in one line, before anything runs."""
    out = tmp_path / "out" / "r.json"
    base = ["train", "--dataset", "synthetic", "--rounds", "1", "--quiet", "--json", str(out)]
    assert main([*base, "--method", "gcn", "--engine", "ray"]) == 2
    assert "fedgat train: error: --engine ray runs FedGAT's protocol; gcn trains in process only" in (
        capsys.readouterr().err
    )
    assert main([*base, "--actors", "2"]) == 2
    assert "fedgat train: error: --actors needs --engine process or --engine ray" in capsys.readouterr().err
    assert main([*base, "--engine", "process", "--address", "auto"]) == 2
    assert "fedgat train: error: --address needs --engine ray" in capsys.readouterr().err
    assert main(["demo", "--dataset", "synthetic", "--engine", "ray", "--actors", "0"]) == 2
    assert "--actors must be >= 1, got 0" in capsys.readouterr().err
    assert not out.parent.exists()


def test_a_dp_budget_refusal_is_a_one_line_runtime_error(monkeypatch, capsys):
    """A release over its owner's budget (or without a ledger) ends the command with one line, exit 1."""
    from fedgat import cli
    from fedgat.commands import train
    from fedgat.dp_ledger import BudgetExceededError

    def refused(args):
        raise BudgetExceededError("client 0: spent 4.0 of 4.0; this release would make it 5.99")

    monkeypatch.setattr(train, "run", refused)
    assert cli.main(["train", "--dataset", "synthetic", "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "spent 4.0 of 4.0" in err[0] and err[0].startswith("fedgat train: error:")


def test_train_runs_one_dp_point_and_charges_the_owners_ledgers(tmp_path, capsys):
    """``fedgat train --method fedgat --dp-epsilon E``: one point of the DP sweep, JSON with the mean
    accuracy and the spent (epsilon, delta) read back from the owners' ledgers; the same release
    again on the same split (same seed) composes, and over a budget it is refused in one line, a seed
    sweep before its first seed."""
    ledgers, out = tmp_path / "ledgers", tmp_path / "dp.json"
    argv = ["train", "--dataset", "synthetic", "--clients", "3", "--rounds", "2", "--quiet"]
    dp = ["--dp-epsilon", "2", "--dp-ledger-dir", str(ledgers)]
    assert main([*argv, *dp, "--dp-budget", "2.5", "1e-5", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert 0.0 <= got["test_accuracy_mean"] <= 1.0
    assert got["epsilon_spent"] == pytest.approx(2.0, rel=1e-3) and got["delta"] == 1e-5
    assert got["hparams"]["dp_epsilon"] == 2.0
    files = sorted(ledgers.glob("*.json"))
    assert len(files) == 3  # one persistent ledger per owner
    assert "DP: the owners' ledgers have spent up to (epsilon 2" in capsys.readouterr().out
    # the same split again: a second release would compose above the budget of 2.5 -> refused, exit 1
    before = [f.read_bytes() for f in files]
    assert main([*argv, *dp]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedgat train: error:")
    assert [f.read_bytes() for f in files] == before  # nothing charged
    # a seed sweep the fresh ledgers cannot pay for (two releases of 2 > 2.5) is refused before its
    # first seed, where it used to train and charge seed 0 and lose it to seed 1's refusal
    sweep = tmp_path / "sweep"
    budget = ["--dp-budget", "2.5", "1e-5", "--seeds", "2"]
    assert main([*argv, "--dp-epsilon", "2", "--dp-ledger-dir", str(sweep), *budget]) == 1
    assert "DP release refused" in capsys.readouterr().err and not sweep.exists()


def test_train_with_dp_fedavg_reports_the_update_budget_spent(tmp_path, capsys):
    """``fedgat train --update-dp-epsilon E``: client-level DP of the updates over ``--rounds``
    rounds; the JSON states the (epsilon, delta) the rounds spent and the history has no loss."""
    out = tmp_path / "upd.json"
    argv = ["train", "--dataset", "synthetic", "--clients", "3", "--rounds", "3", "--patience", "5"]
    assert main([*argv, "--update-dp-epsilon", "4", "--quiet", "--history", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["update_epsilon_spent"] == pytest.approx(4.0, rel=1e-6) and got["update_delta"] == 1e-5
    assert got["hparams"]["update_dp_epsilon"] == 4.0
    assert all(
        row["train_loss"] is None or row["train_loss"] != row["train_loss"]
        for row in got["per_seed"][0]["history"]
    )
    assert "DP-FedAvg epsilon 4 over 3 rounds" in capsys.readouterr().out


@pytest.mark.parametrize(("window", "hint"), [([], True), (["--upload-window", "1"], False)])
def test_demo_refuses_a_spool_the_disk_cannot_hold(monkeypatch, capsys, tmp_path, window, hint):
    """The server spools uploads under the temporary directory: a demo whose estimated spool
    (:func:`fedgat.estimate.peak_spool_bytes`) cannot fit in 80% of the free disk, even one recipient
    at a time, stops in one line before any work, saying what ``--upload-window 1`` would hold unless
    that was asked already."""
    from fedgat import cli_engine

    monkeypatch.setattr(cli_engine, "free_disk", lambda path: 1000)
    out = tmp_path / "r.json"
    argv = [
        "demo",
        "--dataset",
        "synthetic",
        "--nodes",
        "400",
        "--clients",
        "3",
        "--quiet",
        "--json",
        str(out),
    ]
    assert main([*argv, *window]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "the server's spool needs ~" in lines[0] and "--force" in lines[0], lines
    assert ("--upload-window 1 would hold ~" in lines[0]) is hint
    assert not out.exists()


def test_the_demo_paces_uploads_when_only_a_window_fits_the_disk():
    """:func:`fedgat.cli_engine.spool_window`: the window asked when its spool fits; without one, every
    upload at once when that fits, else the widest window that does (unless told not to pace, as the
    audit and the overhead benchmark are); else a one-line refusal."""
    from fedgat.cli_engine import UsageError, spool_window

    est = {"spool_bytes_per_recipient": {0: 10, 1: 20, 2: 30}}  # peaks: all 60, pairs 30/50, singles 30
    assert spool_window(est, 100, None) is None
    assert spool_window(est, 55, None) == 2 and spool_window(est, 35, None) == 1
    assert spool_window(est, 35, 1) == 1
    with pytest.raises(UsageError, match="--upload-window 1 would hold"):
        spool_window(est, 25, None)
    with pytest.raises(UsageError, match="--upload-window 1 would hold"):
        spool_window(est, 45, 2)  # asked for: not widened or narrowed behind the user's back
    with pytest.raises(UsageError) as exc:
        spool_window(est, 25, 1)
    assert "would hold" not in str(exc.value)
    assert spool_window(est, 100, None, pace=False) is None
    with pytest.raises(UsageError, match="--upload-window 1 would hold .* or skip it"):
        spool_window(est, 55, None, pace=False, escape="skip it")


@pytest.mark.parametrize(
    ("argv", "escape"),
    [
        (["audit", "--no-training", "--server-attacks", "none"], "--no-server-check"),
        (["audit", "--no-training", "--server-attacks", "none", "--upload-window", "2"], "--no-server-check"),
        (["bench", "overhead", "--no-train", "--nodes", "300"], "benchmark a smaller graph"),
        (
            ["bench", "overhead", "--sweep", "--datasets", "cora", "--client-counts", "2"],
            "benchmark a smaller",
        ),
    ],
)
def test_audit_and_overhead_refuse_a_spool_the_disk_cannot_hold(monkeypatch, capsys, tmp_path, argv, escape):
    """The audit's and the overhead benchmark's encrypted rounds spool their uploads like the demo's,
    but are never paced behind the user's back (the round they measure is the one asked for): a spool
    that does not fit in 80% of the free disk stops them in one line before any work."""
    from fedgat import cli_engine

    monkeypatch.setattr(cli_engine, "free_disk", lambda path: 1000)
    out = tmp_path / "r.json"
    sweep = "--sweep" in argv
    graph = ["--json", str(out)] + ([] if sweep else ["--dataset", "synthetic", "--clients", "3"])
    assert main([*argv, *graph]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "the server's spool needs ~" in lines[0] and escape in lines[0], lines
    assert ("--upload-window 1 would hold" in lines[0]) is (argv[0] == "audit")  # bench has no window
    assert not out.exists()


@pytest.mark.slow  # a whole (small) demo
def test_a_demo_whose_disk_holds_one_recipient_runs_windowed(monkeypatch, capsys, tmp_path):
    from fedgat import cli_engine, estimate

    seen: list[dict] = []
    real = estimate.estimate_pretraining

    def recorded(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(estimate, "estimate_pretraining", recorded)
    # room for one recipient's uploads at a time (80% of it), not for two
    monkeypatch.setattr(
        cli_engine, "free_disk", lambda path: int(estimate.peak_spool_bytes(seen[-1], 1) / 0.8) + 1
    )
    out = tmp_path / "r.json"
    argv = ["demo", "--dataset", "synthetic", "--nodes", "400", "--clients", "3", "--rounds", "1", "--quiet"]
    assert main([*argv, "--json", str(out)]) == 0
    assert estimate.peak_spool_bytes(seen[-1], 2) > 0.8 * cli_engine.free_disk("")
    assert "the uploads are paced recipient by recipient (--upload-window 1" in capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["upload_window"] == 1
    assert 0 < report["peak_spooled_bytes"] <= estimate.peak_spool_bytes(seen[-1], 1)


def test_a_graph_folder_is_the_graph_of_the_same_npz(inputs):
    """Named nodes and classes in CSV tables give the graph the ``.npz`` gives (ids and class names
    sort in node and class order here)."""
    from fedgat.data import load_dataset

    assert load_dataset(inputs["folder"]) == load_dataset(inputs["npz"])


def test_train_charges_the_clients_update_ledgers_and_refuses_a_run_past_them(tmp_path, capsys):
    """``fedgat train --update-dp-budget E D --update-dp-ledger-dir DIR``: every seed's DP-FedAvg
    releases are charged to each client's ledger before it trains, composed over seeds and runs; a
    run past the budget exits 1 with the ledgers unchanged; the budget flags need --update-dp-epsilon."""
    ledgers = tmp_path / "upd"
    argv = [
        "train",
        "--dataset",
        "synthetic",
        "--clients",
        "3",
        "--rounds",
        "2",
        "--patience",
        "5",
        "--quiet",
    ]
    upd = [
        "--update-dp-epsilon",
        "2",
        "--update-dp-budget",
        "3.5",
        "1e-5",
        "--update-dp-ledger-dir",
        str(ledgers),
    ]
    out = tmp_path / "r.json"
    assert main([*argv, *upd, "--seeds", "2", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    # two seeds of epsilon 2, composed: more than one run's 2, less than their sum
    assert 2.0 < got["update_ledger_epsilon_spent"] < 3.5 and got["update_ledger_delta"] == 1e-5
    assert got["update_epsilon_spent"] == pytest.approx(2.0, rel=1e-6)  # what each run itself spent
    assert "the clients' update ledgers have spent up to (epsilon" in capsys.readouterr().out
    files = sorted(ledgers.glob("*.json"))
    assert [f.name for f in files] == [f"client-{c}-updates.json" for c in range(3)]
    before = [f.read_bytes() for f in files]
    assert main([*argv, *upd]) == 1
    err = capsys.readouterr().err
    assert "DP release refused: 'dp-fedavg:local-dataset' has spent epsilon" in err, err
    assert [f.read_bytes() for f in files] == before
    # a sweep the ledgers cannot pay for is refused before its first seed (fresh ledgers: 3 runs of 2 > 3.5)
    fresh = ["--update-dp-epsilon", "2", "--update-dp-budget", "3.5", "1e-5"]
    assert main([*argv, *fresh, "--update-dp-ledger-dir", str(tmp_path / "sweep"), "--seeds", "3"]) == 1
    assert "DP release refused" in capsys.readouterr().err and not (tmp_path / "sweep").exists()
    # a new ledger folder without a budget: the error names the flag that gives one
    assert main([*argv, "--update-dp-epsilon", "2", "--update-dp-ledger-dir", str(tmp_path / "new")]) == 1
    assert "--update-dp-budget EPSILON DELTA" in capsys.readouterr().err
    assert main([*argv, "--update-dp-budget", "3", "1e-5"]) == 2
    assert "--update-dp-budget: only with DP-FedAvg; add --update-dp-epsilon" in capsys.readouterr().err
    assert main([*argv, "--update-dp-epsilon", "2", "--update-dp-budget", "0", "1e-5"]) == 2
    assert "--update-dp-budget needs EPSILON > 0" in capsys.readouterr().err


def test_a_ledger_folder_flag_refuses_an_empty_string_and_a_file(tmp_path, capsys):
    """``--dp-ledger-dir ""`` would put the ledgers in the working directory, a file cannot hold them:
    both are usage errors (exit 2) before anything runs."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    train = ["train", "--dataset", "synthetic", "--clients", "3", "--rounds", "1", "--quiet"]
    upd = ["--update-dp-epsilon", "2", "--update-dp-ledger-dir"]
    for argv, flag in (
        ([*train, *upd, ""], "--update-dp-ledger-dir needs a folder, got an empty string"),
        ([*train, *upd, str(afile)], f"--update-dp-ledger-dir {afile} is a file"),
        ([*train, "--dp-epsilon", "1", "--dp-ledger-dir", " "], "--dp-ledger-dir needs a folder"),
        (
            ["demo", "--dataset", "synthetic", "--clients", "3", "--dp-ledger-dir", ""],
            "--dp-ledger-dir needs a folder",
        ),
    ):
        assert main(argv) == 2, argv
        assert flag in capsys.readouterr().err, argv


def test_a_centralised_method_says_it_leaves_the_owners_file_unused(tmp_path, capsys):
    """``fedgat train --method gat --owners FILE`` trains one client on the whole graph: it says the
    file is unused instead of reporting "1 client(s), owners from FILE" (a newcomer's review)."""
    owners = tmp_path / "owners.npy"
    np.save(owners, np.arange(500) % 3)
    out = tmp_path / "gat.json"
    argv = [
        "train",
        "--dataset",
        "synthetic",
        "--method",
        "gat",
        "--rounds",
        "1",
        "--quiet",
        "--json",
        str(out),
    ]
    assert main([*argv, "--owners", str(owners)]) == 0
    captured = capsys.readouterr()
    assert f"--method gat trains one client on the whole graph; --owners {owners} is unused" in captured.err
    assert "owners from" not in captured.out and json.loads(out.read_text())["owners"] is None
