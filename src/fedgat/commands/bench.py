"""``fedgat bench``: the benchmarks of the repository's ``benchmarks/`` folder, shipped in the wheel as
:mod:`fedgat.benchmarks`, so they run from an installed fedgat as from a source checkout.

    fedgat bench overhead                                   # Cora, 10 clients, vector: encrypted vs plaintext
    fedgat bench overhead --dataset citeseer --clients 5 --json out.json
    fedgat bench overhead --sweep --datasets cora citeseer --client-counts 2 5 10
    fedgat bench layer --dataset cora --repeats 20          # FedGAT layer vs PyG GATConv
    fedgat bench layer --device cuda                        # the same on a GPU
    fedgat bench train --dataset cora --device auto         # FedGAT vs PyG GAT, seconds per epoch
    fedgat bench accuracy --seeds 3 --sections table        # options: fedgat bench accuracy --help
    fedgat bench scale --quick                              # in-process vs Ray
    fedgat bench presets --nodes 120                        # smallest CKKS preset per variant

``overhead`` runs the pre-training round plaintext and encrypted on the same partition and bases and
reports per phase wall/CPU seconds, memory, bytes, ciphertexts, slot use, the numerical error, the
accuracy reached by training on each and the server's op-count lower bound
(:mod:`fedgat.benchmarks.overhead`). Every benchmark writes its JSON, Markdown and plots into
``--out``, by default ``./fedgat-results`` under the current directory (never into the installed
package or the source checkout; ``python benchmarks/<name>.py`` in a checkout keeps writing to
``benchmarks/results``). ``accuracy`` and ``scale`` pass every other option on to the benchmark's own
parser.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
from pathlib import Path
from types import ModuleType

from fedgat.cli_engine import (
    UsageError,
    add_dataset_argument,
    add_debug_argument,
    add_device_argument,
    add_encrypt_workers_argument,
    add_owners_arguments,
    add_wire_argument,
    check_beta,
    check_counts,
    check_dataset,
    check_device,
    check_nodes,
    check_output_dir,
    check_output_file,
    check_owners_path,
    fit_spool,
    given_flags,
    print_report,
    resolve_owners,
)

NAME = "bench"
HELP = "benchmarks: overhead (encrypted vs plaintext pre-training), layer, train, accuracy, scale, presets"

#: where results go unless ``--out`` says otherwise (relative to the working directory)
DEFAULT_OUT = Path("fedgat-results")
#: benchmark name -> module of :mod:`fedgat.benchmarks`
MODULES = {
    "overhead": "overhead",
    "layer": "layer_speed",
    "train": "train_speed",
    "accuracy": "accuracy",
    "scale": "scale",
    "presets": "presets",
}
_PASSTHROUGH = ("train", "accuracy", "scale", "presets")


def load_benchmark(name: str) -> ModuleType:
    """The benchmark module ``name`` (``overhead``, ``layer``/``layer_speed``, ``accuracy``, ``scale``)
    of :mod:`fedgat.benchmarks` (notebooks call its functions).

    Raises:
        UsageError: an unknown benchmark.
    """
    module = MODULES.get(name, name)
    if module not in MODULES.values():
        raise UsageError(f"unknown benchmark {name!r}; choose one of {', '.join(MODULES)}")
    return importlib.import_module(f"fedgat.benchmarks.{module}")


def _add_out(parser: argparse.ArgumentParser, files: str) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"folder for {files} (default ./{DEFAULT_OUT}, made when needed)",
    )


def _configure_overhead(parser: argparse.ArgumentParser) -> None:
    # mirrors fedgat.benchmarks.overhead.add_arguments without importing it (``fedgat --help`` stays quick)
    add_dataset_argument(parser)
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="synthetic only: nodes (default 200, with 32 features: a smaller graph than the demo's)",
    )
    add_owners_arguments(parser)
    parser.add_argument(
        "--variant", default="vector", choices=("vector", "matrix"), help="FedGAT encodings (default vector)"
    )
    parser.add_argument(
        "--neighbour-cap", type=int, default=None, help="neighbour sampling cap (default none)"
    )
    parser.add_argument(
        "--preset",
        default="n4096",
        choices=("n4096", "n8192", "n8192-small", "n16384"),
        help="CKKS preset (default n4096)",
    )
    add_wire_argument(parser)
    add_encrypt_workers_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="seeds the split and the bases (default 0)")
    parser.add_argument("--beta", type=float, default=1.0, help="Dirichlet label split (default 1: non-iid)")
    parser.add_argument("--workers", type=int, default=None, help="server processes (default: every core)")
    parser.add_argument(
        "--engine",
        default="inprocess",
        choices=("inprocess", "process"),
        help="where the encrypted round's clients run: inprocess (default) or process (worker processes "
        "on this machine's cores; the server stays here)",
    )
    parser.add_argument(
        "--actors", type=int, default=None, help="process engine: worker processes (default: usable cores)"
    )
    parser.add_argument("--no-train", dest="train", action="store_false", help="skip the accuracy comparison")
    parser.add_argument(
        "--no-replay",
        dest="replay",
        action="store_false",
        help="skip computing every result again with the clients idle after the round (the 'server "
        "alone' ratios; ~3 minutes on Cora at 10 clients on 2 cores)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="federated rounds of the accuracy comparison"
    )
    parser.add_argument(
        "--link-gbps",
        type=float,
        default=1.0,
        help="the clients' link speed in Gbit/s for the deployment's critical path, and the server's "
        "unless --server-link-gbps (default 1)",
    )
    parser.add_argument(
        "--server-link-gbps",
        type=float,
        default=None,
        help="the server's link speed in Gbit/s for the critical path, where it differs from the clients' "
        "(--link-gbps; e.g. 10 for a server in a data centre); default the same",
    )
    parser.add_argument(
        "--matrix-estimate",
        action="store_true",
        help="add the matrix variant's estimate (neighbour cap 16) for the same setting",
    )
    parser.add_argument(
        "--sweep", action="store_true", help="sweep --datasets x --client-counts (no training)"
    )
    parser.add_argument(
        "--datasets", nargs="+", default=None, help="--sweep: datasets (default cora citeseer)"
    )
    parser.add_argument(
        "--client-counts", nargs="+", type=int, default=None, help="--sweep: client counts (default 2 5 10)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    _add_out(parser, "overhead.{json,md,png}")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress bars (default on; --no-progress turns them off)",
    )
    parser.add_argument(
        "--quiet", dest="progress", action="store_false", help="no progress bars (as --no-progress)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="an earlier overhead JSON to show before/after (e.g. one taken before a protocol change)",
    )
    parser.add_argument(
        "--baseline-label", default=None, help="--baseline: what the baseline was (default 'baseline')"
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        metavar="FILE",
        help="run nothing: recompute an earlier run's critical paths (encrypted and plaintext) at "
        "--link-gbps (and --server-link-gbps) from its JSON and write "
        "overhead_<X>gbps[_server<Y>gbps].{json,md,png} into --out",
    )


def _configure_layer(parser: argparse.ArgumentParser) -> None:
    # mirrors fedgat.benchmarks.layer_speed.add_arguments without importing it
    add_dataset_argument(parser)
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats per layer (default 15)")
    parser.add_argument(
        "--cap", type=int, default=16, help="neighbour cap for the matrix variant (default 16)"
    )
    parser.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    parser.add_argument("--hidden", type=int, default=8, help="hidden units per head (default 8)")
    parser.add_argument(
        "--threads",
        default=None,
        help="comma-separated torch CPU thread counts to time, e.g. 1,2,16 (default: the current count)",
    )
    add_device_argument(parser, "where both layers run (CUDA: synchronised timings)")
    _add_out(parser, "layer_speed.{json,md}")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    overhead = sub.add_parser(
        "overhead",
        help="encrypted vs plaintext pre-training round",
        description="encrypted vs plaintext pre-training round",
    )
    _configure_overhead(overhead)
    layer = sub.add_parser(
        "layer", help="FedGAT's first layer vs PyG GATConv", description="FedGAT's first layer vs PyG GATConv"
    )
    _configure_layer(layer)
    helps = {
        "train": "FedGAT vs PyG GAT, training seconds per epoch on one device",
        "accuracy": "the accuracy experiments (Table 1, client and degree sweeps, communication)",
        "scale": "scale-out: in-process vs Ray, time and memory per client",
        "presets": "each CKKS preset's decryption error per variant, and the smallest meeting 1e-5",
    }
    for name in _PASSTHROUGH:
        # the benchmark's own parser reads every other option (and -h/--help)
        passthrough = sub.add_parser(name, help=helps[name], description=helps[name], add_help=False)
        _add_out(passthrough, f"{name}'s JSON, Markdown and plots")
        passthrough.set_defaults(passthrough=True)
    for command in sub.choices.values():
        command.set_defaults(prog=command.prog)
        add_debug_argument(command)


def run(args: argparse.Namespace) -> int:
    check_output_dir("--out", args.out)
    if args.benchmark == "overhead":
        return _run_overhead(args)
    if args.benchmark == "layer":
        check_counts({"--repeats": (args.repeats, 1), "--cap": (args.cap, 1), "--heads": (args.heads, 1)})
        check_counts({"--hidden": (args.hidden, 1)})
        check_dataset(args.dataset)
        check_device(args.device)
        module = load_benchmark("layer")
        if args.threads is not None:
            try:
                args.threads = module.parse_threads(args.threads)
            except argparse.ArgumentTypeError as exc:
                raise UsageError(f"--threads: {exc}") from None
        else:
            import torch

            args.threads = [torch.get_num_threads()]  # the current count only
        return int(module.main_args(args) or 0)
    module = load_benchmark(args.benchmark)
    extra = list(getattr(args, "extra", []))
    if any(a in ("-h", "--help") for a in extra):
        extra = ["--help"]
    # the benchmark's own parser, under this command's name and with its output folder; its --help
    # and its one-line errors end in SystemExit, whose status this command returns
    try:
        return int(module.main(extra, prog=args.prog, out=args.out) or 0)
    except SystemExit as exc:
        if isinstance(exc.code, str):  # what the interpreter would have printed on its way out
            print(exc.code, file=sys.stderr)
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1


def _check_spool(args: argparse.Namespace, graph, clients: int, owner=None) -> float:
    """The benchmark's round spools every upload at once under the temporary directory: refuse,
    before any work, one whose estimated spool does not fit (:func:`fedgat.cli_engine.fit_spool`).
    Returns the seconds the run should take here (:func:`expected_seconds`)."""
    from fedgat.estimate import estimate_pretraining

    partition, _ = load_benchmark("overhead").partition_for(
        graph, clients, args.variant, args.neighbour_cap, args.beta, args.seed, owner
    )
    est = estimate_pretraining(partition, args.variant, graph.num_features, args.preset, wire=args.wire)
    fit_spool(est, None, pace=False, escape="benchmark a smaller graph", windowed=False)
    return expected_seconds(est, os.cpu_count() or 1, replay=args.replay)


#: wall seconds of the benchmark's encrypted round per CPU-second of estimated CKKS work per core:
#: Cora, 10 clients, 2 cores (``overhead_cora_inprocess_2core.json``): the round took 386 s for
#: 266 + 284 s of estimated server and client work, the replay ~186 s for the server's 266 s
ROUND_WALL_PER_WORK = 1.4


def expected_seconds(est: dict, cores: int, *, replay: bool) -> float:
    """Rough wall seconds of one ``fedgat bench overhead`` run from its round's estimate
    (:func:`fedgat.estimate.estimate_pretraining`): the round's CKKS work spread over the cores, and
    the server's again for the replay, scaled by :data:`ROUND_WALL_PER_WORK`; training and the
    plaintext round are left out (seconds on Cora)."""
    work = est["server_seconds"] + est["client_seconds"] + (est["server_seconds"] if replay else 0.0)
    return ROUND_WALL_PER_WORK * work / max(1, cores)


def _say_expected(args: argparse.Namespace, seconds: float) -> None:
    """One line before the run: how long its encrypted rounds should take here, and what else it runs."""
    took = f"~{seconds / 60:.0f} min" if seconds >= 90 else f"~{seconds:.0f} s"
    what = "the encrypted round" + (" and its replay" if args.replay else "")
    line = (
        f"expect {took} on {os.cpu_count() or 1} cores for {what} (the estimated CKKS work, plus keys and set-up; "
        "more on a busy machine)"
    )
    if args.train and not args.sweep:  # the sweep compares rounds only
        from fedgat.methods import resolve_hparams

        rounds = args.rounds or resolve_hparams("fedgat", {})["rounds"]
        line += (
            f"; then two trainings of up to {rounds} rounds for the accuracy row, longer than that on small "
            "graphs (--rounds N caps them, --no-train skips them)"
        )
    print(line, flush=True)


def _check_json_apart(args: argparse.Namespace) -> None:
    """``--json`` must not be one of the files ``--out`` receives under another format (a JSON written
    over ``overhead.md`` would replace the report)."""
    if args.json is None:
        return
    if args.from_json is not None:
        stem = load_benchmark("overhead").relinked_stem(args.link_gbps, args.server_link_gbps)
    else:
        stem = "overhead_sweep" if args.sweep else "overhead"
    taken = {(args.out / f"{stem}{suffix}").resolve(): suffix for suffix in (".md", ".png")}
    if args.json.resolve() in taken:
        raise UsageError(
            f"--json {args.json} is where --out writes the {taken[args.json.resolve()]} report; give another path"
        )


def _relink_overhead(args: argparse.Namespace) -> int:
    """``--from-json``: no run, only the earlier one's critical paths at ``--link-gbps``; the options of a
    run are refused (they would be silently ignored)."""
    given = given_flags(
        ("--sweep", args.sweep or None),
        ("--baseline", args.baseline),
        ("--owners", args.owners),
        ("--matrix-estimate", args.matrix_estimate or None),
        ("--nodes", args.nodes),
        ("--clients", args.clients),
    )
    if given:
        raise UsageError(
            f"--from-json runs nothing; leave {', '.join(given)} out (only --link-gbps, --server-link-gbps "
            "and outputs apply)"
        )
    if not args.from_json.is_file():
        raise UsageError(f"--from-json {args.from_json}: no such file")
    overhead = load_benchmark("overhead")
    try:
        overhead.relink(
            overhead.load_baseline(args.from_json, "--from-json"), args.link_gbps, args.server_link_gbps
        )
    except (ValueError, KeyError) as exc:
        raise UsageError(f"--from-json {args.from_json}: {exc}") from None
    return int(overhead.main_args(args) or 0)


def _check_baseline(args: argparse.Namespace) -> None:
    """``--baseline``: one run's overhead JSON, read now (not after the run); ``--baseline-label`` only with it."""
    if args.baseline is None:
        if args.baseline_label is not None:
            raise UsageError("--baseline-label names a --baseline; give the baseline too")
        return
    if not args.baseline.is_file():
        raise UsageError(
            f"--baseline {args.baseline}: "
            + ("a folder; give its overhead.json" if args.baseline.is_dir() else "no such file")
        )
    try:
        load_benchmark("overhead").load_baseline(args.baseline)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _run_overhead(args: argparse.Namespace) -> int:
    check_counts(
        {
            "--clients": (args.clients, 1),
            "--neighbour-cap": (args.neighbour_cap, 1),
            "--workers": (args.workers, 0),
            "--rounds": (args.rounds, 1),
            "--actors": (args.actors, 1),
        }
    )
    if args.actors is not None and args.engine != "process":
        raise UsageError("--actors needs --engine process")
    check_beta(args.beta)
    for flag, value in (("--link-gbps", args.link_gbps), ("--server-link-gbps", args.server_link_gbps)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"{flag} must be a number > 0, got {value}")
    check_output_file("--json", args.json)
    _check_json_apart(args)
    if args.from_json is not None:
        return _relink_overhead(args)
    _check_baseline(args)
    check_owners_path(args.owners)
    if args.rounds is not None and not args.train:
        raise UsageError("--rounds sets the accuracy comparison's rounds; --no-train skips it (give one)")
    if args.sweep:
        given = given_flags(
            ("--clients", args.clients),
            ("--owners", args.owners),
            ("--nodes", args.nodes),
            ("--baseline", args.baseline),
            ("--rounds", args.rounds),
            ("--matrix-estimate", args.matrix_estimate or None),
        )
        if given:
            raise UsageError(
                f"--sweep runs --datasets x --client-counts at each dataset's own size, untrained; leave "
                f"{', '.join(given)} out"
            )
        args.datasets = args.datasets or list(load_benchmark("overhead").SWEEP_DATASETS)
        args.client_counts = args.client_counts or list(load_benchmark("overhead").SWEEP_CLIENTS)
        for dataset in args.datasets:
            check_dataset(dataset)
        if min(args.client_counts) < 2:
            raise UsageError(
                f"--client-counts {min(args.client_counts)}: one client owns every node and nothing is "
                "encrypted to compare; give counts of 2 or more"
            )
        expected = 0.0
        for dataset in args.datasets:  # one round at a time: each must fit
            graph = load_benchmark("overhead").load_graph(dataset, None, args.seed)
            for clients in args.client_counts:
                expected += _check_spool(args, graph, clients)
        _say_expected(args, expected)
    else:
        unused = given_flags(("--datasets", args.datasets), ("--client-counts", args.client_counts))
        if unused:
            raise UsageError(
                f"{' and '.join(unused)} choose what --sweep runs; add --sweep or use --dataset/--clients"
            )
        check_dataset(args.dataset)
        check_nodes(args.dataset, args.nodes)
        graph = load_benchmark("overhead").load_graph(args.dataset, args.nodes, args.seed)
        print_report(graph)
        args.owner_array = resolve_owners(args, graph)
        one = args.clients == 1 if args.owner_array is None else int(args.owner_array.max()) == 0
        if one:
            raise UsageError(
                "one client owns every node: nothing crosses to another client, so nothing is encrypted "
                "to compare; give 2 or more clients"
            )
        if args.matrix_estimate and args.owners is not None:
            raise UsageError("--matrix-estimate uses the Dirichlet split; leave --owners out")
        _say_expected(args, _check_spool(args, graph, args.clients, args.owner_array))
    return int(load_benchmark("overhead").main_args(args) or 0)
