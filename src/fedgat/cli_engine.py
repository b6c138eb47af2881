"""What every ``fedgat`` command shares: argument checks, error reporting, datasets, owners, outputs.

Kept outside :mod:`fedgat.commands` (whose every module is a subcommand). One path for all commands:

* :class:`UsageError`: a bad argument (a count below 1, a negative ``beta``, an output path that is a
  directory, an unknown dataset name, more clients than nodes, ...). :func:`fedgat.cli.main` prints it
  as one line, ``fedgat <command>: error: <message>``, and returns exit status 2, as argparse does for
  its own errors.
* fedgat's typed errors (:func:`runtime_errors`: a malformed graph or owners file, a missing dataset,
  a refused ciphertext, ...) raised while a command runs: the same one line, exit status 1.
* anything else is a bug and keeps its traceback; ``--debug`` shows the traceback of the two above too.

Checks run before any work: :func:`check_counts` and :func:`check_output_file` /
:func:`check_output_dir` on the arguments alone, then :func:`load_graph` and :func:`resolve_owners`
(which also check ``--clients`` against the graph and the owners file) before anything is computed or
written. Command modules import heavy dependencies (torch, ...) lazily so ``fedgat --help`` stays quick.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

ENGINE_CHOICES = ("inprocess", "process", "ray")
#: ``--dp-mechanism`` choices: :data:`fedgat.dp.MECHANISMS`, spelled here so that ``--help`` needs no torch
DP_MECHANISMS = ("label_rr", "gaussian", "multibit")
#: ``--engine auto`` (``fedgat demo``'s default) hosts the clients in worker processes when the machine
#: has more than one usable core and the clients' own CKKS work -- encryptions and decryptions on one
#: core, :func:`fedgat.estimate.estimate_pretraining`'s ``client_seconds`` -- is at least this many
#: seconds. On two cores spreading saves about half of that work (Cora at 10 clients: ~200 s estimated,
#: 223 s measured in process, benchmarks/results/demo_cora.json); the process engine's fixed cost --
#: starting the pool, then importing torch in every worker for the FedAvg rounds -- was ~12 s on a
#: loaded 2-core VM (a 60-node demo: 9.4 s in process, 23.6 s on processes), so below this the
#: margin is too thin for an estimate
AUTO_PROCESS_MIN_SECONDS = 60.0
#: dataset names ``--dataset`` takes besides ``<family>:<name>`` and file paths
DATASET_NAMES = ("cora", "citeseer", "pubmed", "synthetic")
#: default client count when neither ``--clients`` nor ``--owners`` gives one
DEFAULT_CLIENTS = 10
_GRAPH_SUFFIXES = (".npz", ".pt", ".pth")
_OWNERS_SUFFIXES = (".csv", ".tsv", ".txt", ".npy")


class UsageError(Exception):
    """A bad command-line argument; :func:`fedgat.cli.main` reports it in one line, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``fedgat <command>: error: <message>`` and a pointer to
    ``--help`` instead of the usage block (exit status 2, as argparse's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    """``--debug``: show the traceback of an error instead of its one-line report."""
    parser.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the full traceback of an error instead of a one-line message",
    )


def runtime_errors() -> tuple[type[BaseException], ...]:
    """fedgat's own typed errors: reported in one line with exit status 1 (imported on demand)."""
    from fedgat.checkpoint import CheckpointError
    from fedgat.crypto.errors import CryptoError
    from fedgat.dp_ledger import DPError
    from fedgat.federated import NonFiniteUpdateError
    from fedgat.graph import GraphError
    from fedgat.graph_files import DatasetNotFoundError
    from fedgat.owners import OwnersError
    from fedgat.protocols.errors import ProtocolError

    errors: list[type[BaseException]] = [
        GraphError,
        DatasetNotFoundError,
        OwnersError,
        CryptoError,
        ProtocolError,
        CheckpointError,
        NonFiniteUpdateError,
        DPError,  # a DP release over its owner's budget, or without a ledger
    ]
    try:
        from fedgat.crypto.ray_encoder import RayUnavailableError
        from fedgat.protocols.hosting import EngineError

        errors += [RayUnavailableError, EngineError]  # Ray's and the process engine's
    except ImportError:  # pragma: no cover - the modules import ray lazily; kept defensive
        pass
    return tuple(errors)


#: the ciphertext wires of the pre-training round (:data:`fedgat.crypto.params.WIRES`; not imported
#: from there so that ``fedgat --help`` stays quick: a test checks that they agree)
WIRES = ("compact", "tenseal")
WIRE_HELP = (
    "ciphertext wire of the encrypted pre-training round (default compact): 'compact' sends every "
    "ciphertext at its byte floor and costs more CPU to pack and unpack (~+0.65 ms per upload, "
    "~+0.34 ms per result on the server at n4096; loading costs about the same); 'tenseal' sends TenSEAL's own bytes, ~16-22%% more bytes "
    "for less CPU. Every party of a session must use the same wire"
)


def add_wire_argument(parser: argparse.ArgumentParser) -> None:
    """``--wire {compact,tenseal}`` (:attr:`fedgat.protocols.pretrain.PretrainConfig.wire`), default compact."""
    parser.add_argument("--wire", default="compact", choices=WIRES, help=WIRE_HELP)


def add_upload_window_argument(parser: argparse.ArgumentParser) -> None:
    """``--upload-window N`` (:attr:`fedgat.protocols.pretrain.PretrainConfig.upload_window`), default off."""
    parser.add_argument(
        "--upload-window",
        type=_positive_int,
        default=None,
        metavar="N",
        help="pace the encrypted round's uploads recipient by recipient, N recipients at a time: the server "
        "computes each recipient as soon as its uploads are in and deletes them, so its disk holds N "
        "recipients' uploads instead of the whole round's (large graphs; default: all at once)",
    )


def add_encrypt_workers_argument(parser: argparse.ArgumentParser) -> None:
    """``--encrypt-workers {auto,N}``: processes each client of the encrypted round may encrypt its
    uploads on (:class:`fedgat.protocols.ClientPretrain`'s ``encrypt_workers``), default auto."""
    parser.add_argument(
        "--encrypt-workers",
        type=_encrypt_workers,
        default="auto",
        metavar="{auto,N}",
        help="processes each client of the encrypted round may encrypt its uploads on (they hold the "
        "recipients' public keys only); 0: in the client's own process; auto (default): twice each "
        "client's share of this machine's cores when that is 2 or more (in-process: the clients encrypt "
        "one after another; an engine runs them all at once), and no more than its uploads are worth",
    )


def _encrypt_workers(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 'auto' or a count >= 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def add_device_argument(
    parser: argparse.ArgumentParser, what: str = "where training runs", *, cuda_graphs: bool = False
) -> None:
    """``--device`` (:func:`fedgat.device.resolve_device`), default ``cpu``; ``what`` starts its help.
    With ``cuda_graphs``, also ``--cuda-graphs`` (checked by :func:`check_device`)."""
    parser.add_argument(
        "--device",
        default="cpu",
        metavar="{cpu,cuda,cuda:N,auto}",
        help=f"{what}: cpu (default), cuda, cuda:N or auto (cuda when available, else cpu). "
        "The CPU is the default because it reproduces results bit for bit on any machine, and the "
        "graphs here are small (Cora: a few hundred nodes per client; a GPU pays off for the larger "
        "ones and for the layer benchmarks); cuda without a GPU is an error",
    )
    if cuda_graphs:
        parser.add_argument(
            "--cuda-graphs",
            action="store_true",
            help="with --device cuda: run each client's local step as one captured CUDA graph (fewer launches)",
        )


def check_device(spec: str, cuda_graphs: bool = False) -> Any:
    """``--device``'s value as a ``torch.device`` (:func:`fedgat.device.resolve_device`; imports torch).

    Raises:
        UsageError: an unknown device, CUDA asked for on a machine without it, or ``cuda_graphs``
            (``--cuda-graphs``) with a device that is not CUDA.
    """
    from fedgat.device import DeviceError, resolve_device

    try:
        device = resolve_device(spec)
    except DeviceError as exc:
        raise UsageError(f"--device {spec}: {exc}") from None
    if cuda_graphs and device.type != "cuda":
        raise UsageError(f"--cuda-graphs captures CUDA work: it needs --device cuda (got --device {spec})")
    return device


def describe_rule(min_cross: int) -> str:
    """The minimum-cross rule as run headers print it: "off" (k <= 1) or "k = <k>"."""
    return "off" if min_cross <= 1 else f"k = {min_cross}"


# ------------------------------------------------------------------------------------ numbers


def check_counts(minimums: dict[str, tuple[float | None, float]]) -> None:
    """Refuse counts below their minimum: ``{"--clients": (args.clients, 1), ...}`` (None: unset).

    Raises:
        UsageError: naming the first flag below its minimum.
    """
    for flag, (value, minimum) in minimums.items():
        if value is not None and value < minimum:
            raise UsageError(f"{flag} must be >= {minimum:g}, got {value:g}")


def parser_checks(parser: argparse.ArgumentParser, *checks: Callable[[], object]) -> None:
    """Run each check (a call of this module's ``check_*``); a :class:`UsageError` becomes
    ``parser.error`` (one line, exit status 2), as a benchmark's own parser reports its errors."""
    for check in checks:
        try:
            check()
        except UsageError as exc:
            parser.error(str(exc))


def check_beta(beta: float) -> None:
    """``--beta``: the Dirichlet concentration must be finite and > 0."""
    if not (math.isfinite(beta) and beta > 0):
        raise UsageError(f"--beta must be finite and > 0 (1: non-iid, 10000: ~iid), got {beta:g}")


def add_budget_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, help: str
) -> None:
    """A DP budget flag ``flag EPSILON DELTA`` (two floats, default None; :func:`check_dp_budget`)."""
    parser.add_argument(flag, type=float, nargs=2, metavar=("EPSILON", "DELTA"), default=None, help=help)


def check_dp_budget(budget: list[float] | tuple[float, float] | None, flag: str = "--dp-budget") -> None:
    """``flag EPSILON DELTA``: a finite epsilon > 0 and 0 < delta < 1 (None: not given)."""
    if budget is not None and not (math.isfinite(budget[0]) and budget[0] > 0 and 0 < budget[1] < 1):
        raise UsageError(f"{flag} needs EPSILON > 0 and 0 < DELTA < 1, got {budget[0]} {budget[1]}")


def parse_cap(value: str) -> int | None:
    """``--neighbour-cap``'s value: 'none' or a whole number >= 1.

    Raises:
        UsageError: anything else.
    """
    if str(value).lower() == "none":
        return None
    try:
        cap = int(value)
    except ValueError:
        cap = 0
    if cap < 1:
        raise UsageError(f"--neighbour-cap must be a whole number >= 1 or 'none', got {value!r}")
    return cap


# ------------------------------------------------------------------------------------ outputs


def given_flags(*pairs: tuple[str, object]) -> list[str]:
    """The flags of ``(flag, value)`` pairs that were given (value not None), for refusing options that a
    mode would ignore: ``given_flags(("--nodes", args.nodes), ("--sweep", args.sweep or None))``."""
    return [flag for flag, value in pairs if value is not None]


def check_output_file(flag: str, path: Path | None, *, example: str = "results.json") -> None:
    """Refuse an output file that cannot be written: an existing directory, or a place under a file
    or an unwritable folder. Nothing is left behind: a probe file is created and removed at once in
    the nearest existing folder, and missing folders are made only when the result is written.
    ``example``: a file name the error suggests inside a directory given instead of a file.

    Raises:
        UsageError: naming ``flag`` and the problem.
    """
    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a file path (e.g. {path / example})")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path} is not writable")
    _check_creatable(flag, path.parent, path)


def check_ledger_dir(flag: str, value: str | None) -> None:
    """A DP ledger folder flag: not an empty string (which would put the ledgers in the working
    directory) and a folder that can be written (:func:`check_output_dir`); None: not given.

    Raises:
        UsageError: naming ``flag`` and the problem.
    """
    if value is None:
        return
    if not value.strip():
        raise UsageError(f"{flag} needs a folder, got an empty string")
    check_output_dir(flag, Path(value))


def check_output_dir(flag: str, path: Path | None) -> None:
    """Refuse an output folder that cannot be written: an existing file, or under an unwritable folder.

    Raises:
        UsageError: naming ``flag`` and the problem.
    """
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file; give a folder")
    _check_creatable(flag, path if path.is_dir() else path.parent, path)


def _check_creatable(flag: str, parent: Path, path: Path) -> None:
    ancestor = parent.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"{flag} {path}: {ancestor} is a file, not a folder")
    # a real probe (created and removed at once): os.access says yes to root even on read-only mounts
    try:
        with tempfile.TemporaryFile(dir=ancestor, prefix=".fedgat-write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{flag} {path}: cannot create files in {ancestor} ({reason})") from None


def write_text(path: Path, text: str, what: str) -> None:
    """Write ``text`` to ``path`` (making its folder) and say where it went (:func:`say_written`)."""
    made = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    say_written(path, what, made)


def say_written(path: Path, what: str, made: bool, then: str = "") -> None:
    """Say on stderr that ``what`` went to ``path``, and that its folder is new when ``made`` (a mistyped
    folder name shows up here, not later); ``then``: more of the sentence."""
    print(
        f"wrote {what} to {path}" + (f" (made the folder {path.parent})" if made else "") + then,
        file=sys.stderr,
    )


# ------------------------------------------------------------------------------- the server's disk
#: the share of the free disk under the temporary directory the server's spool may take
SPOOL_DISK_SHARE = 0.8


def free_disk(path: str) -> int | None:
    """Free bytes on the file system holding ``path`` (where the server spools uploads), or None."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def spool_window(
    estimate: dict,
    budget: int,
    requested: int | None,
    where: str = "the disk",
    *,
    pace: bool = True,
    escape: str = "pass --force",
    windowed: bool = True,
) -> int | None:
    """The upload window to run with, given the bytes the server's spool may take (``budget``):
    ``requested`` when its peak (:func:`fedgat.estimate.peak_spool_bytes`) fits; without a request,
    with every upload at once too big and ``pace``, the widest window that fits; otherwise a
    :class:`UsageError` saying what ``--upload-window 1`` would hold (when the command has it:
    ``windowed``) and ``escape``, the command's way past the check."""
    from fedgat.estimate import peak_spool_bytes

    if peak_spool_bytes(estimate, requested) <= budget:
        return requested
    if requested is None and pace:
        recipients = len(estimate["spool_bytes_per_recipient"])
        fits = [w for w in range(1, recipients + 1) if peak_spool_bytes(estimate, w) <= budget]
        if fits:
            return max(fits)
    one = peak_spool_bytes(estimate, 1)
    hint = "" if requested == 1 or not windowed else f"--upload-window 1 would hold ~{gigabytes(one)}, "
    raise UsageError(
        f"the server's spool needs ~{gigabytes(peak_spool_bytes(estimate, requested))} of disk for the "
        f"uploads it holds at once, more than the {gigabytes(budget)} it may use "
        f"({SPOOL_DISK_SHARE:.0%} of the free space under {where}); {hint}point TMPDIR at a larger disk, "
        f"or {escape}"
    )


def fit_spool(
    estimate: dict,
    requested: int | None,
    *,
    pace: bool = True,
    escape: str = "pass --force",
    windowed: bool = True,
) -> int | None:
    """:func:`spool_window` for the free disk under the temporary directory, where the server spools
    (unknown free space: ``requested``). When it paces a round that asked for no window it says so on
    stderr."""
    from fedgat.estimate import peak_spool_bytes

    where = tempfile.gettempdir()
    free = free_disk(where)
    if free is None:
        return requested
    window = spool_window(
        estimate, int(SPOOL_DISK_SHARE * free), requested, where, pace=pace, escape=escape, windowed=windowed
    )
    if window != requested:
        print(
            f"note: every upload at once would need ~{gigabytes(peak_spool_bytes(estimate))} of the "
            f"{gigabytes(free)} free under {where}: the uploads are paced recipient by recipient "
            f"(--upload-window {window}, ~{gigabytes(peak_spool_bytes(estimate, window))} at once)",
            file=sys.stderr,
            flush=True,
        )
    return window


def gigabytes(n: float) -> str:
    """``n`` bytes for people: GB from 0.1 GB on, else MB."""
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


# ------------------------------------------------------------------------------------ datasets


def add_dataset_argument(parser: argparse.ArgumentParser, default: str = "cora") -> None:
    """``--dataset``: a name, ``<family>:<name>`` or a ``.npz``/``.pt`` path (:func:`fedgat.data.load_dataset`)."""
    parser.add_argument(
        "--dataset",
        default=default,
        metavar="DATASET",
        help=f"{', '.join(DATASET_NAMES)} (synthetic: a planted-class graph for quick checks); a PyG "
        "dataset as FAMILY:NAME (citationfull:cora_ml, coauthor:cs, amazon:photo, ...; raw files under "
        "$FEDGAT_DATA); a path to a gnn-benchmark .npz or a saved torch_geometric Data (.pt); or a "
        f"folder holding nodes.csv (id,label[,split],features...) and edges.csv (source,target) (default {default})",
    )


def _holds_tables(path: Path) -> bool:
    from fedgat.graph_csv import table_files

    try:
        table_files(path)
    except (OSError, ValueError):
        return False
    return True


def check_dataset(spec: str) -> None:
    """The form of ``--dataset`` alone (its content is checked when loading): a known name,
    ``<family>:<name>`` of a known family, an existing file with a graph suffix, or a graph folder
    holding its two tables (:func:`fedgat.graph_csv.table_files`).

    Raises:
        UsageError: an unknown name or family, a missing file, a file type fedgat cannot read, or a
            folder without its tables.
    """
    from fedgat.data import PYG_DATASETS
    from fedgat.graph_csv import table_files

    lower = spec.lower()
    path = Path(spec).expanduser()
    if lower.endswith(_GRAPH_SUFFIXES):
        if path.is_dir():
            raise UsageError(f"--dataset {spec} is a directory; give a .npz or .pt file")
        if not path.is_file():
            raise UsageError(f"--dataset {spec}: no such file")
        return
    if lower in DATASET_NAMES:
        if path.is_dir() and _holds_tables(path):  # the name wins in load_dataset: say which was meant
            print(
                f"note: --dataset {spec} is the built-in dataset; ./{spec} here is a graph folder too: "
                f"write --dataset ./{spec} for the folder",
                file=sys.stderr,
                flush=True,
            )
        return
    if path.is_dir():
        try:
            table_files(path)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--dataset {spec}: {exc}") from None
        return
    if "/" in spec or os.sep in spec or path.suffix:
        hint = (
            " (give the folder holding nodes.csv and edges.csv)" if lower.endswith((".csv", ".tsv")) else ""
        )
        if not path.suffix:
            raise UsageError(f"--dataset {spec}: no such file or folder")
        raise UsageError(
            f"--dataset {spec}: unsupported file type {path.suffix!r}{hint}; fedgat reads .npz "
            "(gnn-benchmark layout), .pt/.pth (a saved torch_geometric Data) and graph folders "
            "(nodes.csv, edges.csv)"
        )
    family, colon, name = lower.partition(":")
    if colon and family in PYG_DATASETS:
        if name in PYG_DATASETS[family]:
            return
        raise UsageError(
            f"--dataset {spec}: unknown {family} dataset {name!r}; choose one of "
            f"{', '.join(f'{family}:{n}' for n in PYG_DATASETS[family])}"
        )
    raise UsageError(
        f"--dataset {spec}: unknown dataset; give one of {', '.join(DATASET_NAMES)}, a PyG dataset as "
        f"FAMILY:NAME ({', '.join(f'{f}:' for f in PYG_DATASETS)}), a path to a .npz or .pt file, or a "
        "graph folder (nodes.csv, edges.csv)"
    )


def check_nodes(dataset: str, nodes: int | None, minimum: int = 40) -> None:
    """``--nodes`` applies to ``--dataset synthetic`` only and must be >= ``minimum``."""
    if nodes is None:
        return
    if dataset.lower() != "synthetic":
        raise UsageError("--nodes applies to --dataset synthetic only")
    if nodes < minimum:
        raise UsageError(f"--nodes must be >= {minimum}, got {nodes}")


#: ``--nodes`` of ``--dataset synthetic`` when left out (demo, train and audit build the same graph)
SYNTHETIC_NODES = 500


def add_nodes_argument(parser: argparse.ArgumentParser) -> None:
    """``--nodes``: the size of ``--dataset synthetic`` (:func:`synthetic_sizes`)."""
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="synthetic dataset only: number of nodes, a fifth of them validating and a fifth testing "
        f"(default {SYNTHETIC_NODES})",
    )


def add_quiet_argument(parser: argparse.ArgumentParser, help: str = "no progress bars") -> None:
    """``--quiet``, also spelt ``--no-progress`` (as ``fedgat bench`` spells it)."""
    parser.add_argument("--quiet", "--no-progress", dest="quiet", action="store_true", help=help)


def synthetic_sizes(nodes: int | None = None, classes: int = 4) -> dict[str, Any]:
    """The synthetic graph of ``--nodes`` nodes the commands build (:data:`SYNTHETIC_NODES` when None):
    ``classes`` classes, 64 features, a fifth of the nodes validate and a fifth test, up to 20 training
    nodes per class."""
    nodes = SYNTHETIC_NODES if nodes is None else nodes
    return {
        "num_nodes": nodes,
        "num_classes": classes,
        "num_features": 64,
        "train_per_class": max(2, min(20, nodes // (4 * classes))),
        "num_val": nodes // 5,
        "num_test": nodes // 5,
    }


def load_graph(dataset: str, *, quiet: bool = False, **synthetic: Any):
    """Load ``--dataset`` (``synthetic`` with the ``synthetic`` keyword arguments) and print its report
    (what was dropped, merged or symmetrised on the way in) in one line on stderr.

    Raises:
        DatasetNotFoundError, DatasetFormatError, GraphError: from :func:`fedgat.data.load_dataset`;
            a GraphError too for labels of one class (every accuracy would be 1) or a split without
            training or validation nodes (:func:`fedgat.graph.check_trainable`).
    """
    from fedgat.data import load_dataset
    from fedgat.graph import GraphError, check_trainable

    graph = (
        load_dataset("synthetic", **synthetic) if dataset.lower() == "synthetic" else load_dataset(dataset)
    )
    if not quiet:
        print_report(graph)
    labels = graph.y.unique()
    if len(labels) < 2:
        raise GraphError(
            f"{dataset}: every node has label {int(labels[0])}; node classification needs at least two "
            "classes (every accuracy would be 1)"
        )
    check_trainable(graph)
    return graph


def print_report(graph) -> None:
    """:func:`report_line` on stderr, then each of the report's notes (class names numbered, a first
    edge line read as a header, classes with no node, ...) on a line of its own."""
    if graph.report is None:
        return
    print(report_line(graph), file=sys.stderr)
    for note in graph.report.notes:
        print(f"  note: {note}", file=sys.stderr)


def report_line(graph) -> str:
    """The graph's :class:`~fedgat.graph_pyg.GraphReport` in one short line: nodes, edges, what was
    removed, merged or added on the way in, and where the split came from (the full account is
    ``str(graph.report)``)."""
    r = graph.report
    changes = [
        f"{count} {what}"
        for count, what in (
            (r.self_loops_removed, "self-loops removed"),
            (r.duplicates_removed, "duplicates merged"),
            (r.edges_added, "reverse edges added (the input was directed)"),
            (r.isolated_nodes, "isolated nodes kept"),
        )
        if count
    ]
    split = "its own split" if r.split.startswith("given") else "a seeded per-class split"
    if "clipped" in r.split:
        split += " (clipped to the graph's size)"
    edges = f"{r.output_edges} directed edges" + (f" ({', '.join(changes)})" if changes else "")
    return f"graph: {graph.name}, {r.num_nodes} nodes, {edges}, {split}"


# ------------------------------------------------------------------------------------ owners


def add_owners_arguments(parser: argparse.ArgumentParser) -> None:
    """``--clients`` and ``--owners`` (the client count defaults to the owners file's, else 10)."""
    parser.add_argument(
        "--clients",
        type=int,
        default=None,
        help=f"number of clients (default: the owners file's, else {DEFAULT_CLIENTS})",
    )
    parser.add_argument(
        "--owners",
        type=Path,
        default=None,
        metavar="FILE",
        help="which client owns which node: one client id (0..K-1) per node, in node order, as CSV "
        "(one column, or a header with a 'client' column and optionally 'node' or 'id') or .npy; replaces the "
        "Dirichlet label split (--beta is then unused); see fedgat.owners",
    )


def check_owners_path(path: Path | None) -> None:
    """The form of ``--owners`` alone: a file of a readable type (its content is checked later)."""
    if path is None:
        return
    if path.suffix.lower() not in _OWNERS_SUFFIXES:
        raise UsageError(
            f"--owners {path}: unsupported type {path.suffix or '(no suffix)'!r}; "
            f"give {', '.join(_OWNERS_SUFFIXES)}"
        )
    if path.is_dir():
        raise UsageError(f"--owners {path} is a directory; give a file")
    if not path.is_file():
        raise UsageError(f"--owners {path}: no such file")


def resolve_owners(args: argparse.Namespace, graph) -> Any:
    """Read ``--owners`` against ``graph`` and settle ``args.clients`` (in place).

    Without ``--owners``: ``args.clients`` defaults to 10 and must not exceed the graph's nodes. With
    it: the file's client count, or ``--clients`` when given (every id must then lie below it and every
    client own a node).

    Returns:
        the ``(N,)`` int64 owner array, or None (the Dirichlet split).

    Raises:
        UsageError: more clients than nodes.
        OwnersError: a malformed or inconsistent owners file (:func:`fedgat.owners.load_owners`).
    """
    if args.owners is None:
        if args.clients is None:
            args.clients = DEFAULT_CLIENTS
        if args.clients > graph.num_nodes:
            raise UsageError(
                f"--clients {args.clients}: {graph.name} has {graph.num_nodes} nodes, so some client would "
                f"own no node; give at most {graph.num_nodes} clients"
            )
        return None
    from fedgat.owners import load_owners

    owners = load_owners(args.owners, graph.num_nodes, args.clients, node_names=graph.node_names)
    args.clients = int(owners.max()) + 1 if args.clients is None else args.clients
    return owners


def split_info(
    graph: Any, clients: int, beta: float, seed: int, owners: str | Path | None, hparams: dict
) -> dict:
    """What a run's split depends on besides the graph, and the graph's name and size: how ``fedgat demo
    --save-encodings`` describes the encodings it saves and what ``fedgat train --encodings`` compares
    (its ``SPLIT_FLAGS`` name the flag of each)."""
    return {
        "dataset": graph.name,
        "num_nodes": int(graph.num_nodes),
        "clients": int(clients),
        "beta": float(beta),
        "seed": int(seed),
        "owners": None if owners is None else str(owners),  # the --owners file as given
        "variant": hparams["variant"],
        "neighbour_cap": hparams["neighbour_cap"],
        "min_cross": hparams["min_cross"],
    }


def describe_split(args: argparse.Namespace) -> str:
    """How the nodes were split, for headers: ``beta 1`` or ``owners from FILE``."""
    return f"owners from {args.owners}" if args.owners is not None else f"beta {args.beta:g}"


# ------------------------------------------------------------------------------------ engines


def add_engine_arguments(parser: argparse.ArgumentParser, default: str = "inprocess") -> None:
    """``--engine``, ``--address``, ``--actors`` (shared by ``fedgat demo`` and ``fedgat train``);
    ``default="auto"`` offers ``auto`` too (:func:`resolve_engine`)."""
    choices = ENGINE_CHOICES + (("auto",) if default == "auto" else ())
    auto = (
        f"auto (default: process on a machine with more than one core when the clients' estimated CKKS "
        f"work is at least {AUTO_PROCESS_MIN_SECONDS:g} s on one core, else inprocess), "
        if default == "auto"
        else ""
    )
    parser.add_argument(
        "--engine",
        default=default,
        choices=choices,
        help=f"where the parties run: {auto}inprocess ({'' if auto else 'default: '}every party in this "
        "process), process (the clients in worker processes on this machine's cores, the server and its "
        "process pool here) or ray (clients in Ray actors, the server's homomorphic work as Ray tasks; pip "
        'install "fedgat[ray]")',
    )
    parser.add_argument(
        "--address",
        default=None,
        help="ray: an existing cluster (e.g. auto, or head-ip:6379; default: start a local Ray)",
    )
    parser.add_argument(
        "--actors",
        type=int,
        default=None,
        help="process: worker processes hosting the clients (default min(usable cores, clients)); ray: "
        "actors hosting the clients (default min(cluster CPUs, clients))",
    )


def check_engine_arguments(args: argparse.Namespace) -> None:
    """``--address`` needs ``--engine ray``; ``--actors`` needs ``ray`` or ``process`` and is >= 1.

    Raises:
        UsageError: naming the flag.
    """
    if args.engine != "ray" and args.address is not None:
        raise UsageError("--address needs --engine ray")
    if args.engine not in ("ray", "process", "auto") and args.actors is not None:
        raise UsageError("--actors needs --engine process or --engine ray")
    if args.actors is not None and args.actors < 1:
        raise UsageError(f"--actors must be >= 1, got {args.actors}")


def resolve_engine(engine: str, client_seconds: float, cores: int | None = None) -> str:
    """The engine ``--engine auto`` stands for: ``process`` when ``cores`` (default: the usable cores)
    is above 1 and ``client_seconds`` (the clients' CKKS work on one core) is at least
    :data:`AUTO_PROCESS_MIN_SECONDS`, else ``inprocess``. Any other ``engine`` is returned as it is."""
    if engine != "auto":
        return engine
    if cores is None:
        from fedgat.protocols.process_engine import usable_cores

        cores = usable_cores()
    return "process" if cores > 1 and client_seconds >= AUTO_PROCESS_MIN_SECONDS else "inprocess"


def open_engine(args: argparse.Namespace, command: str):
    """The engine of ``--engine``: a :class:`~fedgat.protocols.process_engine.ProcessEngine` (process),
    a :class:`~fedgat.protocols.ray_engine.RayEngine` (ray), or None (inprocess).

    Raises:
        UsageError: ``--address`` without ``--engine ray``, ``--actors`` without ``process`` or
            ``ray``, or ``--actors`` below 1.
        RayUnavailableError: Ray is missing (a runtime error, exit status 1).
    """
    check_engine_arguments(args)
    if args.engine == "auto":
        raise ValueError("resolve --engine auto first (resolve_engine)")
    if args.engine == "process":
        from fedgat.protocols.process_engine import ProcessEngine

        return ProcessEngine(args.actors, threads=args.threads)
    if args.engine != "ray":
        return None
    from fedgat.protocols.ray_engine import RayEngine

    return RayEngine(args.actors, address=args.address, threads=args.threads)
