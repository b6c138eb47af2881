"""``fedgat train``: one method, one split setting, several seeds; a summary table and optional JSON.

    fedgat train --dataset cora --method fedgat --variant vector --clients 10 --beta 1 \\
        --seeds 10 --rounds 300 --json out.json
    fedgat train --dataset my_graph.npz --owners owners.csv   # your graph and who owns which node
    fedgat train --encodings enc.ckpt --rounds 300            # from fedgat demo --save-encodings enc.ckpt

Seeds are ``first_seed .. first_seed + seeds - 1``; each seeds the split, the encodings' bases, the
model and dropout. Hyper-parameter flags left out take the method's defaults
(:func:`fedgat.methods.default_hparams`); a flag the method does not use is an error.

``--engine ray`` or ``--engine process`` (FedGAT only) runs the FedAvg rounds through the protocol
state machines with the clients hosted in Ray actors or in worker processes on this machine
(:func:`fedgat.pipeline.run_encrypted_fedgat` with the plaintext twin of the pre-training round, same
seed; ``fedgat demo --engine ray|process`` runs the encrypted round too). The
other methods train in process only (they have no protocol path).

``--encodings FILE`` trains FedGAT from the encodings a ``fedgat demo --save-encodings FILE`` run
decrypted, through the protocol (:func:`fedgat.pipeline.run_encrypted_fedgat` with ``encodings=``), in
this process or on ``--engine``: no pre-training round, one seed, and only with the split the file
records (:func:`fedgat.cli_engine.split_info`; a mismatch is a usage error naming the flags to give).

``--device cuda`` (or ``cuda:N``, ``auto``) trains the clients on a GPU: models, optimisers, encodings
and labels live there, the server's weights and their aggregation on the CPU
(:class:`fedgat.federated.Client`). In process only: the hosted engines' clients train on the CPU.
``--cuda-graphs`` with it captures each client's local step as one CUDA graph after 3 eager steps
(:mod:`fedgat.cuda_graphs`): on Cora a FedGAT epoch then takes ~1 ms on an H200 instead of ~6 ms.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedgat.cli_engine import (
    DP_MECHANISMS,
    UsageError,
    add_budget_argument,
    add_dataset_argument,
    add_device_argument,
    add_engine_arguments,
    add_nodes_argument,
    add_owners_arguments,
    add_quiet_argument,
    check_beta,
    check_counts,
    check_dataset,
    check_device,
    check_dp_budget,
    check_engine_arguments,
    check_ledger_dir,
    check_nodes,
    check_output_file,
    check_owners_path,
    describe_rule,
    load_graph,
    open_engine,
    parse_cap,
    resolve_owners,
    split_info,
    synthetic_sizes,
    write_text,
)

NAME = "train"
HELP = "train one method (fedgat, distgat, fedgcn, gat, gcn) over several seeds and summarise"

#: = fedgat.methods.METHODS (kept literal so that ``fedgat --help`` does not import torch)
METHOD_CHOICES = ("fedgat", "distgat", "fedgcn", "gat", "gcn")

# flag dest -> (type, help); each maps to the hyper-parameter of the same name
_HPARAM_FLAGS: dict[str, tuple[Callable[[str], Any], str]] = {
    "rounds": (int, "maximum federated rounds (default 500)"),
    "patience": (int, "early-stopping patience on validation accuracy, rounds (default 100)"),
    "local_epochs": (int, "local full-batch steps per round, E (default 1)"),
    "lr": (float, "Adam learning rate (GAT-type 0.005, GCN-type 0.01)"),
    "weight_decay": (float, "Adam weight decay (default 5e-4)"),
    "fraction": (float, "share of clients sampled per round (default 1)"),
    "mu": (float, "FedProx proximal weight; 0 = FedAvg (default)"),
    "strategy": (
        str,
        (
            "fedadam (clients run SGD, server runs Adam on the averaged step; default) or "
            "fedavg (clients run Adam, server averages; the paper's)"
        ),
    ),
    "client_lr": (float, "FedAdam: the clients' SGD step (default 1; cancels out with one local epoch)"),
    "hidden": (int, "hidden units per head (GAT-type 8, GCN-type 16)"),
    "heads": (int, "attention heads of layer 1 (GAT-type, default 8)"),
    "dropout": (float, "dropout (GAT-type 0.6, GCN-type 0.5)"),
    "variant": (str, "FedGAT encodings: vector (default) or matrix"),
    "feature_dropout": (float, "FedGAT: dropout of input-feature columns of W (default 0.6)"),
    "degree": (int, "FedGAT: degree of the attention-score polynomial (default 16)"),
    "domain": (float, "FedGAT: half-width of the polynomial's domain (default 4)"),
    "psi": (str, "FedGAT: leaky_relu (default) or smooth_leaky_relu"),
    "neighbour_cap": (str, "FedGAT: neighbours kept per node, or 'none' (default: 16 matrix, none vector)"),
    "min_cross": (int, "FedGAT: paper's minimum-cross rule k (default 0: off; the paper uses 2)"),
    "dp_epsilon": (
        float,
        (
            "FedGAT: share other clients' rows only as a DP release with this epsilon (default: off; "
            "each owner's ledger is charged first, see --dp-budget)"
        ),
    ),
    "dp_delta": (float, "FedGAT: the DP release's delta (default 1e-5; spent by gaussian only)"),
    "dp_mechanism": (
        str,
        (
            "FedGAT: the DP release's mechanism: label_rr (randomised response on a predicted label, "
            "default), gaussian (projected features) or multibit (LPGNN)"
        ),
    ),
    "dp_dim": (
        int,
        "FedGAT, gaussian release: dimension of the projection the noise is added to (default 64)",
    ),
    "dp_predictor_rounds": (
        int,
        "FedGAT, label_rr release: rounds that train its label predictor (default 50)",
    ),
    "dp_ledger_dir": (
        str,
        "FedGAT: folder of the owners' DP ledgers (default $FEDGAT_DP_LEDGER_DIR or ~/.fedgat/dp_ledger)",
    ),
    "update_dp_epsilon": (
        float,
        (
            "client-level DP of the training updates and evaluation counts (DP-FedAvg) with this epsilon "
            "over --rounds rounds and their evaluations (default: off); each client clips and noises "
            "both before secure aggregation"
        ),
    ),
    "update_dp_delta": (float, "DP-FedAvg: delta (default 1e-5)"),
    "update_dp_clip": (float, "DP-FedAvg: L2 bound of each client's update (default 1)"),
    "update_dp_ledger_dir": (
        str,
        (
            "DP-FedAvg: folder of the clients' persistent update ledgers (client-<c>-updates.json; default "
            "$FEDGAT_DP_LEDGER_DIR or ~/.fedgat/dp_ledger); given alone, charges the ledgers there with "
            "their stored budgets"
        ),
    ),
}


def configure(parser: argparse.ArgumentParser) -> None:
    add_dataset_argument(parser)
    add_nodes_argument(parser)
    parser.add_argument("--method", default="fedgat", choices=METHOD_CHOICES)
    add_owners_arguments(parser)
    parser.add_argument(
        "--beta",
        type=float,
        default=1.0,
        help="Dirichlet label-split concentration: 1 non-iid, 10000 ~iid (default 1)",
    )
    parser.add_argument("--seeds", type=int, default=1, help="number of seeds (default 1)")
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="first seed (default 0); it also seeds --dataset synthetic's graph, as demo's --seed does",
    )
    group = parser.add_argument_group("hyper-parameters (default: the method's own)")
    for dest, (kind, text) in _HPARAM_FLAGS.items():
        group.add_argument("--" + dest.replace("_", "-"), dest=dest, type=kind, default=None, help=text)
    add_budget_argument(
        group,
        "--dp-budget",
        "FedGAT with --dp-epsilon: the total (epsilon, delta) an owner's ledger allows, needed "
        "the first time an owner releases (every seed's release is charged and composed)",
    )
    add_budget_argument(
        group,
        "--update-dp-budget",
        "DP-FedAvg: the total (epsilon, delta) a client's update ledger allows; every seed's run "
        "is charged its releases before it trains and composed with the runs before it, and a run past "
        "the budget is refused (needed for ledgers that do not exist yet; default: no ledger)",
    )
    parser.add_argument(
        "--encodings",
        type=Path,
        default=None,
        metavar="FILE",
        help="FedGAT from the decrypted encodings FILE holds (fedgat demo --save-encodings) instead of a "
        "pre-training round: no new round, so training can be tuned without re-encrypting. The split "
        "must be the one they were computed for (--dataset and --nodes, --clients, --beta, --first-seed "
        "as demo's --seed, --owners, --variant, --neighbour-cap, --min-cross as that run had them; a "
        "mismatch is refused naming the file's); one seed, no --dp-epsilon. The file is checked against "
        "corruption (SHA-256), not forgery: keep it where only you can write",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--history", action="store_true", help="include per-round metrics in the JSON")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: these graphs are too small to gain from more, "
        "and on a busy machine 2 threads ran 30x slower)",
    )
    add_device_argument(parser, "where the clients train (in process only)", cuda_graphs=True)
    add_engine_arguments(parser)
    add_quiet_argument(parser, "no progress bar")


def check_arguments(args: argparse.Namespace) -> tuple[dict, dict]:
    """Every check on the arguments alone, before anything is loaded or trained.

    Returns:
        the hyper-parameter overrides given as flags and the method's resolved hyper-parameters.

    Raises:
        UsageError: naming the flag and the fix.
    """
    from fedgat.methods import resolve_hparams

    check_counts(
        {
            "--clients": (args.clients, 1),
            "--seeds": (args.seeds, 1),
            "--first-seed": (args.first_seed, 0),
            "--threads": (args.threads, 1),
            "--rounds": (args.rounds, 1),
            "--patience": (args.patience, 1),
            "--local-epochs": (args.local_epochs, 1),
            "--hidden": (args.hidden, 1),
            "--heads": (args.heads, 1),
            "--degree": (args.degree, 1),
        }
    )
    check_beta(args.beta)
    check_dataset(args.dataset)
    check_nodes(args.dataset, args.nodes)
    check_owners_path(args.owners)
    check_engine_arguments(args)
    check_output_file("--json", args.json)
    device = check_device(args.device, args.cuda_graphs)
    if args.engine != "inprocess" and device.type != "cpu":
        raise UsageError(
            f"--device {args.device} trains the clients in this process; --engine {args.engine} hosts them "
            "elsewhere, on the CPU (leave one of the two out)"
        )
    if args.engine != "inprocess" and args.method != "fedgat":
        raise UsageError(
            f"--engine {args.engine} runs FedGAT's protocol; {args.method} trains in process only "
            "(leave --engine out)"
        )
    overrides = {
        k: getattr(args, k)
        for k in (*_HPARAM_FLAGS, "dp_budget", "update_dp_budget")
        if getattr(args, k) is not None
    }
    for pair in ("dp_budget", "update_dp_budget"):
        if pair in overrides:
            overrides[pair] = tuple(overrides[pair])
    dp_flags = [
        f
        for f in ("dp_delta", "dp_mechanism", "dp_dim", "dp_predictor_rounds", "dp_budget", "dp_ledger_dir")
        if f in overrides
    ]
    if dp_flags and "dp_epsilon" not in overrides:
        named = ", ".join("--" + f.replace("_", "-") for f in dp_flags)
        raise UsageError(f"{named}: only for a DP release; add --dp-epsilon")
    _check_dp(overrides)
    _check_update_dp(overrides, args.method)
    for flag in ("dp_ledger_dir", "update_dp_ledger_dir"):
        check_ledger_dir("--" + flag.replace("_", "-"), overrides.get(flag))
    if args.encodings is not None:
        _check_encodings_flags(args, overrides)
    if "neighbour_cap" in overrides:
        overrides["neighbour_cap"] = parse_cap(overrides["neighbour_cap"])
    try:
        hparams = resolve_hparams(args.method, overrides)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return overrides, hparams


def _check_encodings_flags(args: argparse.Namespace, overrides: dict) -> None:
    """``--encodings``: FedGAT, one seed, no DP release of the rows, a file to read."""
    flag = f"--encodings {args.encodings}"
    if args.method != "fedgat":
        raise UsageError(f"{flag}: FedGAT's encodings; --method {args.method} does not train on them")
    if args.seeds != 1:
        raise UsageError(f"{flag}: the encodings of one split and one seed's bases; leave --seeds out")
    if "dp_epsilon" in overrides:
        raise UsageError(
            f"{flag}: --dp-epsilon draws a DP release of the rows in the pre-training round, which a saved "
            "file was computed without (run fedgat train --dp-epsilon without --encodings)"
        )
    if not args.encodings.is_file():
        raise UsageError(f"{flag}: no such file")


#: what ``fedgat demo --save-encodings`` records of its split, and the flag that sets each here
SPLIT_FLAGS = {
    "clients": "--clients",
    "beta": "--beta",
    "seed": "--first-seed",
    "owners": "--owners",
    "variant": "--variant",
    "neighbour_cap": "--neighbour-cap",
    "min_cross": "--min-cross",
}


def _check_saved_split(args: argparse.Namespace, saved: dict, run: dict) -> None:
    """Refuse ``--encodings`` whose recorded split (``saved``, the file's info) differs from this run's
    (``run``), naming the flags to give; a file without a record is checked by its nodes alone
    (:func:`fedgat.pipeline.check_encodings_split`). Owners files are compared by their nodes too, and
    with one, ``--beta`` is unused."""
    dataset, nodes = saved.get("dataset", run["dataset"]), saved.get("num_nodes", run["num_nodes"])
    if dataset != run["dataset"] or nodes != run["num_nodes"]:
        raise UsageError(
            f"--encodings {args.encodings} holds encodings of {dataset!r} ({nodes!r} nodes); --dataset "
            f"{run['dataset']} has {run['num_nodes']} nodes (give the --dataset, and --nodes for synthetic, "
            "of the run that saved them)"
        )
    both_owned = bool(saved.get("owners")) and bool(run["owners"])
    differ = [
        k
        for k in SPLIT_FLAGS
        if k in saved and saved[k] != run[k] and not (both_owned and k in ("owners", "beta"))
    ]
    if differ:

        def flag(k: str, value: Any) -> str:
            if k == "owners" and value is None:
                return "no --owners"
            return f"{SPLIT_FLAGS[k]} {'none' if value is None else value}"

        want = ", ".join(flag(k, saved[k]) for k in differ)
        have = ", ".join(flag(k, run[k]) for k in differ)
        raise UsageError(
            f"--encodings {args.encodings} holds the encodings of another split ({have} here); "
            f"give {want}, as the run that saved them had"
        )


def _check_dp(overrides: dict) -> None:
    """The DP flags' ranges (the release itself refuses the same, but only after loading the data)."""
    eps, delta = overrides.get("dp_epsilon"), overrides.get("dp_delta")
    if eps is not None and not (math.isfinite(eps) and eps > 0):
        raise UsageError(f"--dp-epsilon must be a number > 0, got {eps}")
    if delta is not None and not 0 < delta < 1:
        raise UsageError(f"--dp-delta must be in (0, 1), got {delta}")
    if overrides.get("dp_dim") is not None and overrides["dp_dim"] < 1:
        raise UsageError(f"--dp-dim must be >= 1, got {overrides['dp_dim']}")
    if overrides.get("dp_predictor_rounds") is not None and overrides["dp_predictor_rounds"] < 1:
        raise UsageError(f"--dp-predictor-rounds must be >= 1, got {overrides['dp_predictor_rounds']}")
    mechanism = overrides.get("dp_mechanism")
    if mechanism is not None and mechanism not in DP_MECHANISMS:
        raise UsageError(f"--dp-mechanism must be one of {', '.join(DP_MECHANISMS)}, got {mechanism!r}")
    check_dp_budget(overrides.get("dp_budget"))


def _check_update_dp(overrides: dict, method: str) -> None:
    """The DP-FedAvg flags: ranges, and the epsilon they belong to."""
    given = [
        f
        for f in ("update_dp_delta", "update_dp_clip", "update_dp_budget", "update_dp_ledger_dir")
        if f in overrides
    ]
    eps = overrides.get("update_dp_epsilon")
    if given and eps is None:
        named = ", ".join("--" + f.replace("_", "-") for f in given)
        raise UsageError(f"{named}: only with DP-FedAvg; add --update-dp-epsilon")
    if eps is None:
        return
    if method in ("gat", "gcn"):
        raise UsageError(f"--update-dp-epsilon: {method} is centralised (no federated updates to protect)")
    if not (math.isfinite(eps) and eps > 0):
        raise UsageError(f"--update-dp-epsilon must be a number > 0, got {eps}")
    delta = overrides.get("update_dp_delta")
    if delta is not None and not 0 < delta < 1:
        raise UsageError(f"--update-dp-delta must be in (0, 1), got {delta}")
    clip = overrides.get("update_dp_clip")
    if clip is not None and not (math.isfinite(clip) and clip > 0):
        raise UsageError(f"--update-dp-clip must be a number > 0, got {clip}")
    check_dp_budget(overrides.get("update_dp_budget"), "--update-dp-budget")


def run(args: argparse.Namespace) -> int:
    import torch

    from fedgat.methods import CENTRALISED, check_sweep, run_method
    from fedgat.progress import progress_bar

    overrides, hparams = check_arguments(args)
    device = check_device(args.device)
    torch.set_num_threads(args.threads)
    graph = load_graph(args.dataset, **synthetic_sizes(args.nodes), seed=args.first_seed)
    owners = resolve_owners(args, graph)
    if args.method in CENTRALISED and owners is not None:
        print(
            f"fedgat train: note: --method {args.method} trains one client on the whole graph; "
            f"--owners {args.owners} is unused",
            file=sys.stderr,
        )
        owners = None

    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    # a sweep the ledgers (DP-FedAvg's, the rows') cannot pay for: refused before seed 1
    check_sweep(args.method, graph, args.clients, args.beta, seeds, hparams, owners)
    saved = None
    if args.encodings is not None:
        saved = _read_saved(args, graph, owners, hparams, overrides)
    engine = open_engine(args, "train")
    if engine is not None or saved is not None:
        try:
            results = [_run_protocol(engine, graph, args, seed, overrides, owners, saved) for seed in seeds]
        finally:
            if engine is not None:
                engine.shutdown()
        return _report(args, graph.name, hparams, results)
    rounds = hparams["rounds"]
    results = []
    with progress_bar(
        f"{args.method}/{graph.name}", total=len(seeds) * rounds, unit="round", enabled=not args.quiet
    ) as bar:
        for seed in seeds:

            def progress(r: int, metrics: dict, seed: int = seed) -> None:
                bar.set_postfix(seed=seed, val=f"{metrics['val_accuracy']:.3f}", refresh=False)
                bar.update(1)

            result = run_method(
                args.method,
                graph,
                args.clients,
                args.beta,
                seed,
                callback=progress,
                owner=owners,
                device=device,
                cuda_graphs=args.cuda_graphs,
                **overrides,
            )
            bar.update(rounds - result.rounds)  # early stopping skipped these
            results.append(result)
    return _report(args, graph.name, hparams, results)


def _read_saved(args: argparse.Namespace, graph, owners, hparams: dict, overrides: dict) -> dict:
    """``--encodings``: the file's encodings, once its recorded split is this run's and they cover
    this split's clients' nodes.

    Raises:
        UsageError: another split (the message names the flags to give).
        fedgat.checkpoint.CheckpointError: an unreadable, damaged or foreign file.
    """
    from fedgat.checkpoint import read_encodings
    from fedgat.methods import fedgat_partition
    from fedgat.pipeline import check_encodings_split

    saved = read_encodings(args.encodings)
    # args.clients: resolve_owners' count
    run = split_info(graph, args.clients, args.beta, args.first_seed, args.owners, hparams)
    _check_saved_split(args, saved.info, run)
    partition = fedgat_partition(graph, args.clients, args.beta, args.first_seed, hparams, owners)
    try:
        check_encodings_split(partition, saved.encodings)
    except ValueError as exc:
        raise UsageError(f"--encodings {args.encodings}: {exc}") from None
    return saved.encodings


def _run_protocol(
    engine, graph, args: argparse.Namespace, seed: int, overrides: dict, owners=None, encodings=None
):
    """One FedGAT seed through the protocol over ``engine``'s transport (None: in this process), as a
    ``RunResult`` (``owners``: the user's split, None for the Dirichlet one), from the plaintext twin of
    the pre-training round or, given, from ``encodings`` (``--encodings``: no pre-training, none of its
    bytes)."""
    import time

    from fedgat.methods import RunResult, pretrain_bytes
    from fedgat.pipeline import run_encrypted_fedgat

    start = time.perf_counter()
    run = run_encrypted_fedgat(
        graph,
        args.clients,
        args.beta,
        seed,
        encrypted=False,
        transport=None if engine is None else engine.transport(),
        progress=not args.quiet,
        owner=owners,
        encodings=encodings,
        device=check_device(args.device),
        cuda_graphs=args.cuda_graphs,
        **overrides,
    )
    t = run.training
    return RunResult(
        method="fedgat",
        dataset=graph.name,
        num_clients=args.clients,
        beta=float(args.beta),
        seed=seed,
        test_accuracy=t.fit.test_accuracy,
        best_val_accuracy=t.fit.best_val_accuracy,
        best_round=t.fit.best_round,
        rounds=t.fit.rounds,
        pretrain_bytes=0
        if encodings is not None
        else pretrain_bytes("fedgat", graph, args.clients, args.beta, seed, owner=owners, **overrides),
        pretrain_seconds=time.perf_counter() - start - t.seconds,
        train_seconds=t.seconds,
        hparams=t.hparams,
        history=t.fit.history,
        dp_spent=None if not run.dp_spent else max(run.dp_spent.values()),
        update_dp_spent=t.update_dp_spent,
        update_ledger_spent=None if not run.update_ledger_spent else max(run.update_ledger_spent.values()),
    )


def _report(args: argparse.Namespace, dataset: str, hparams: dict, results: list) -> int:
    summary = summarise(args, dataset, hparams, results)
    print(format_table(summary))
    if args.json is not None:
        per_seed = [r.to_dict(history=args.history) for r in results]
        text = json.dumps({**summary, "per_seed": per_seed}, indent=2) + "\n"
        write_text(args.json, text, "the results as JSON")
    return 0


def summarise(args: argparse.Namespace, dataset: str, hparams: dict, results: list) -> dict:
    """The JSON summary (without ``per_seed``). Standard deviations are sample ones (ddof 1)."""
    from fedgat.methods import CENTRALISED

    centralised = args.method in CENTRALISED  # trained one client: no owners
    acc = [r.test_accuracy for r in results]
    val = [r.best_val_accuracy for r in results]
    spent = [r.dp_spent for r in results if r.dp_spent is not None]
    dp = {} if not spent else {"epsilon_spent": max(e for e, _ in spent), "delta": spent[0][1]}
    upd = [r.update_dp_spent for r in results if r.update_dp_spent is not None]
    if upd:
        dp["update_epsilon_spent"] = max(e for e, _ in upd)
        dp["update_delta"] = upd[0][1]
    ledgers = [r.update_ledger_spent for r in results if r.update_ledger_spent is not None]
    if ledgers:  # after the last seed's charge: every run so far composed
        dp["update_ledger_epsilon_spent"] = max(e for e, _ in ledgers)
        dp["update_ledger_delta"] = ledgers[0][1]
    return {
        "method": args.method,
        "dataset": dataset,
        "clients": results[0].num_clients,
        "beta": args.beta,
        "owners": None if args.owners is None or centralised else str(args.owners),
        # --encodings: the saved encodings it trained from (no pre-training round)
        "encodings": None if getattr(args, "encodings", None) is None else str(args.encodings),
        "seeds": [r.seed for r in results],
        "test_accuracy_mean": statistics.fmean(acc),
        "test_accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
        "best_val_accuracy_mean": statistics.fmean(val),
        "pretrain_bytes": statistics.fmean(r.pretrain_bytes for r in results),
        "train_seconds": statistics.fmean(r.train_seconds for r in results),
        "rounds_mean": statistics.fmean(r.rounds for r in results),
        "device": getattr(args, "device", "cpu"),  # where the clients trained (--device)
        **dp,
        "hparams": hparams,
        "rows": [
            {
                "seed": r.seed,
                "test_accuracy": r.test_accuracy,
                "best_val_accuracy": r.best_val_accuracy,
                "best_round": r.best_round,
                "rounds": r.rounds,
                "pretrain_bytes": r.pretrain_bytes,
                "train_seconds": r.train_seconds,
            }
            for r in results
        ],
    }


def format_table(summary: dict) -> str:
    """A readable per-seed table with a mean +- std line."""
    hp = summary["hparams"]
    extra = f", {hp['variant']}" if "variant" in hp else ""
    if "min_cross" in hp:
        extra += f", minimum-cross rule {describe_rule(hp['min_cross'])}"
    if summary["clients"] > 1 and "strategy" in hp:
        extra += f", {hp['strategy']}"
    split = f"owners from {summary['owners']}" if summary.get("owners") else f"beta {summary['beta']:g}"
    if hp.get("dp_epsilon") is not None:
        extra += f", DP release ({hp['dp_mechanism']}) epsilon {hp['dp_epsilon']:g} per run"
    if hp.get("update_dp_epsilon") is not None:
        extra += f", DP-FedAvg epsilon {hp['update_dp_epsilon']:g} over {hp['rounds']} rounds"
    head = f"{summary['method']} on {summary['dataset']}: {summary['clients']} client(s), {split}{extra}"
    cols = f"{'seed':>6} {'test acc':>9} {'best val':>9} {'best rnd':>9} {'rounds':>7} {'pretrain MB':>12} {'train s':>8}"
    lines = [head, cols, "-" * len(cols)]
    for row in summary["rows"]:
        lines.append(
            f"{row['seed']:>6} {row['test_accuracy']:>9.3f} {row['best_val_accuracy']:>9.3f} "
            f"{row['best_round']:>9} {row['rounds']:>7} {row['pretrain_bytes'] / 1e6:>12.1f} "
            f"{row['train_seconds']:>8.1f}"
        )
    std = summary["test_accuracy_std"]
    lines.append("-" * len(cols))
    lines.append(
        f"{'mean':>6} {summary['test_accuracy_mean']:>9.3f} {summary['best_val_accuracy_mean']:>9.3f}"
        f"{'':>9} {summary['rounds_mean']:>8.0f} {summary['pretrain_bytes'] / 1e6:>12.1f} "
        f"{summary['train_seconds']:>8.1f}"
    )
    if "epsilon_spent" in summary:
        lines.append(
            f"DP: the owners' ledgers have spent up to (epsilon {summary['epsilon_spent']:.3g}, "
            f"delta {summary['delta']:g}) on their rows, all releases so far composed"
        )
    if "update_ledger_epsilon_spent" in summary:
        lines.append(
            f"DP-FedAvg: the clients' update ledgers have spent up to (epsilon "
            f"{summary['update_ledger_epsilon_spent']:.3g}, delta {summary['update_ledger_delta']:g}), all runs "
            "so far composed"
        )
    if not math.isnan(std):
        lines.append(
            f"test accuracy {summary['test_accuracy_mean']:.3f} +- {std:.3f} over "
            f"{len(summary['rows'])} seed(s)"
        )
    return "\n".join(lines)
