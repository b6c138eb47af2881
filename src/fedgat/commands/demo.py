"""``fedgat demo``: the whole encrypted pipeline on one dataset, with its costs and its accuracy.

    fedgat demo                                  # Cora, 10 clients, vector encodings, n4096
    fedgat demo --variant matrix --json out.json # matrix encodings (neighbour cap 16; slow: see the estimate)
    fedgat demo --dataset my_graph.pt --owners owners.npy  # a saved PyG Data, one client id per node
    fedgat demo --save-encodings enc.ckpt        # keep the decrypted encodings (fedgat.checkpoint.load_encodings)

Each client generates its own CKKS key; owners encrypt the rows a client needs under that client's
key (only for edges both owners confirmed), the server computes each client's encodings on
ciphertexts (no secret key), each client decrypts and checks its own, then FedGAT trains through
FedAvg rounds. ``--engine auto`` (the default) runs a round whose clients have enough CKKS work to
spread (:data:`fedgat.cli_engine.AUTO_PROCESS_MIN_SECONDS` on one core, e.g. Cora) on a machine with
more than one core with ``--engine process``: the clients in worker processes on this machine's cores,
the server and its process pool here (:mod:`fedgat.protocols.process_engine`); anything smaller
``--engine inprocess``: everything in one process over the in-process transport
(:mod:`fedgat.protocols.transport`). ``--engine ray`` hosts the clients in a pool of Ray actors and runs the server's homomorphic work as
Ray tasks (:mod:`fedgat.protocols.ray_engine`; a local Ray, or ``--address`` for a cluster). Printed: time per
phase, bytes each way, slot use, the largest decryption error against the plaintext encodings built
with the same bases, the test accuracy (with ``--plaintext-training`` also the plaintext twin's, same seed and bases)
and whether the server's context holds a secret key (it does not).

``--device cuda`` (``cuda:N``, ``auto``) trains the FedAvg rounds' clients on a GPU; the encrypted
pre-training round (TenSEAL) runs on the CPU whatever the device. Off the CPU the rounds run in this
process (one GPU shared by the clients in turn), whichever ``--engine`` hosted the pre-training round;
``--cuda-graphs`` with it captures each client's local step as one CUDA graph (:mod:`fedgat.cuda_graphs`).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from pathlib import Path

from fedgat.cli_engine import (
    UsageError,
    add_budget_argument,
    add_dataset_argument,
    add_device_argument,
    add_encrypt_workers_argument,
    add_engine_arguments,
    add_nodes_argument,
    add_owners_arguments,
    add_quiet_argument,
    add_upload_window_argument,
    add_wire_argument,
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
    describe_split,
    fit_spool,
    gigabytes,
    load_graph,
    open_engine,
    parse_cap,
    resolve_engine,
    resolve_owners,
    say_written,
    split_info,
    synthetic_sizes,
    write_text,
)

NAME = "demo"
HELP = "encrypted pre-training + FedGAT training end to end (Cora, 10 clients by default)"

PRESET_CHOICES = ("n4096", "n8192", "n8192-small", "n16384")

MATRIX_DEFAULT_CAP = 16
#: FedAvg rounds of the demo: Cora's best validation round is ~250 (fedgat train runs up to 500); 300
#: server compute (one core, estimated) and decrypted-encoding memory above which the demo warns
#: before it starts (a fifth of the time for the matrix variant)
HEAVY_SECONDS = 600.0
HEAVY_BYTES = 1e9
#: keeps the whole demo near 5 minutes on 2 cores
DEMO_ROUNDS = 300


def configure(parser: argparse.ArgumentParser) -> None:
    add_dataset_argument(parser)
    add_nodes_argument(parser)
    parser.add_argument(
        "--variant",
        default="vector",
        choices=("vector", "matrix"),
        help="FedGAT encodings (default vector; matrix is ~m^2 rows per node)",
    )
    add_owners_arguments(parser)
    parser.add_argument("--beta", type=float, default=1.0, help="Dirichlet label split (default 1: non-iid)")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the split, the server's bases (so the plaintext twin uses the same ones), "
        "the model and dropout (default 0)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEMO_ROUNDS,
        help=f"maximum federated training rounds (default {DEMO_ROUNDS})",
    )
    parser.add_argument(
        "--patience",
        type=int,
        default=None,
        help="early-stopping patience in rounds (default: fedgat's, 100)",
    )
    parser.add_argument(
        "--preset", default="n4096", choices=PRESET_CHOICES, help="CKKS preset (default n4096)"
    )
    add_wire_argument(parser)
    add_upload_window_argument(parser)
    add_encrypt_workers_argument(parser)
    parser.add_argument(
        "--neighbour-cap",
        default=None,
        help=f"neighbours kept per node, or 'none' (default: {MATRIX_DEFAULT_CAP} for matrix, "
        "none for vector)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes for the server's homomorphic compute (default: every core; 0: in process)",
    )
    parser.add_argument(
        "--plaintext-training",
        action="store_true",
        help="also train on the plaintext twin's encodings (same seed and bases) to compare "
        "accuracies; doubles the training time",
    )
    add_budget_argument(
        parser,
        "--dp-budget",
        "charge each client's session verdicts (what the server may learn from them: SECURITY.md, "
        "known break 22) to its owner's DP ledger, as fedgat train charges its DP releases to the same "
        "ledgers; a session past this budget is refused before anything is sent (needed for ledgers "
        "that do not exist yet; default: no ledger)",
    )
    parser.add_argument(
        "--dp-ledger-dir",
        default=None,
        help="folder of the owners' DP ledgers (default $FEDGAT_DP_LEDGER_DIR or ~/.fedgat/dp_ledger); "
        "given alone, charges the ledgers there with their stored budgets",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    add_device_argument(
        parser,
        "where the training rounds run (the encrypted pre-training always runs on the CPU; off the "
        "CPU the rounds run in this process whatever --engine)",
        cuda_graphs=True,
    )
    add_engine_arguments(parser, default="auto")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--save-encodings",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the clients' decrypted encodings to FILE once the pre-training round has ended (one "
        "integrity-checked file, no pickle), with the split they belong to: fedgat train --encodings FILE "
        "(or fedgat.checkpoint.load_encodings) trains from them later with no new encrypted round. They "
        "reveal the clients' neighbours' features: keep the file where the raw data may be kept",
    )
    add_quiet_argument(parser)
    parser.add_argument(
        "--force",
        action="store_true",
        help="run even when the estimated memory exceeds 70%% of what is available, or the server's "
        "spool 80%% of the free disk",
    )


def check_arguments(args: argparse.Namespace) -> None:
    """Every check on the arguments alone, before anything is loaded or computed.

    Raises:
        UsageError: naming the flag and the fix.
    """
    check_counts(
        {
            "--clients": (args.clients, 1),
            "--seed": (args.seed, 0),
            "--rounds": (args.rounds, 1),
            "--patience": (args.patience, 1),
            "--threads": (args.threads, 1),
            "--workers": (args.workers, 0),
        }
    )
    check_beta(args.beta)
    check_dataset(args.dataset)
    check_nodes(args.dataset, args.nodes)
    check_owners_path(args.owners)
    check_engine_arguments(args)
    check_output_file("--json", args.json)
    check_output_file("--save-encodings", args.save_encodings, example="encodings.ckpt")
    check_device(args.device, args.cuda_graphs)
    check_dp_budget(args.dp_budget)
    check_ledger_dir("--dp-ledger-dir", args.dp_ledger_dir)
    _cap(args)


def _load(args: argparse.Namespace):
    return load_graph(args.dataset, **synthetic_sizes(args.nodes), seed=args.seed)


def _cap(args: argparse.Namespace) -> int | None:
    """``--neighbour-cap`` as a count or None (the variant's default when left out).

    Raises:
        UsageError: not a whole number >= 1 nor 'none'.
    """
    if args.neighbour_cap is None:
        from fedgat.variants import as_variant

        return as_variant(args.variant).default_neighbour_cap
    return parse_cap(args.neighbour_cap)


def _available_memory() -> int | None:
    """Available physical memory in bytes (Linux ``MemAvailable``), or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def run(args: argparse.Namespace) -> int:
    import torch

    from fedgat.app import run_summary
    from fedgat.device import describe_device
    from fedgat.estimate import estimate_pretraining
    from fedgat.methods import fedgat_partition, resolve_hparams
    from fedgat.pipeline import (
        max_abs_error,
        run_encrypted_pretraining,
        run_plaintext_pretraining,
        train_fedgat,
    )
    from fedgat.variants import as_variant

    check_arguments(args)
    device = check_device(args.device)
    torch.set_num_threads(args.threads)
    progress = not args.quiet
    start = time.perf_counter()
    graph = _load(args)
    owners = resolve_owners(args, graph)
    cap = _cap(args)
    hp = {"neighbour_cap": cap, "variant": args.variant}
    hp.update({k: v for k, v in (("rounds", args.rounds), ("patience", args.patience)) if v is not None})
    settings = resolve_hparams("fedgat", hp)
    # the split every FedGAT engine makes, with the rule and cap of the settings the run trains with
    partition = fedgat_partition(graph, args.clients, args.beta, args.seed, settings, owners)

    est = estimate_pretraining(partition, args.variant, graph.num_features, args.preset, wire=args.wire)
    rule = describe_rule(settings["min_cross"])
    # --engine auto: worker processes for a round whose clients' CKKS work is worth spreading (--actors
    # asks for them outright)
    args.engine = "process" if args.engine == "auto" and args.actors else args.engine
    args.engine = resolve_engine(args.engine, est["client_seconds"])
    print(
        f"fedgat demo: {graph.name} ({graph.num_nodes} nodes, d={graph.num_features}), {args.clients} clients, "
        f"{describe_split(args)}, {args.variant} encodings, preset {args.preset}, "
        f"neighbour cap {'none' if cap is None else cap}; "
        f"training: {settings['strategy']}, minimum-cross rule {rule}; engine {args.engine}"
    )
    memory = 2 * est["decrypted_bytes_float64"]  # decrypted encodings + the plaintext twin, float64
    # the matrix variant's M2 (m^2 rows per node) makes it heavy on any but the smallest graphs
    heavy = HEAVY_SECONDS / (5 if as_variant(args.variant).has_m2 else 1)
    if est["server_seconds"] > heavy or memory > HEAVY_BYTES:
        minutes = est["server_seconds"] / 60
        took = f"~{minutes:.0f} min" if minutes >= 1 else f"~{est['server_seconds']:.0f} s"
        print(
            f"WARNING: {args.variant} encodings need ~{est['multiply_adds']:.3g} homomorphic multiply-adds "
            f"({took} of server compute on one core, more on a busy machine), "
            f"up to {est['max_rows_per_node']} encoding rows per node, ~{gigabytes(est['bytes_down'])} of "
            f"result ciphertexts to download and ~{gigabytes(memory)} of memory for the decrypted encodings "
            "and their plaintext twin; --workers N spreads the compute.",
            file=sys.stderr,
            flush=True,
        )
    available = _available_memory()
    if available is not None and memory > 0.7 * available and not args.force:
        raise UsageError(
            f"the decrypted encodings need ~{gigabytes(memory)}, more than 70% of the "
            f"{gigabytes(available)} available; lower --neighbour-cap, use a smaller dataset, or pass "
            "--force"
        )

    # the server spools uploads under the temporary directory (a windowed round: W recipients' at once)
    if not args.force:
        args.upload_window = fit_spool(est, args.upload_window)

    ledgers = None
    if args.dp_budget is not None or args.dp_ledger_dir is not None:
        from fedgat.dp_ledger import owner_ledgers

        ledgers = owner_ledgers(args.clients, args.dp_budget, args.dp_ledger_dir)
    engine = open_engine(args, "demo")
    try:
        transport = None if engine is None else engine.transport()
        pre = run_encrypted_pretraining(
            graph,
            partition,
            args.variant,
            args.preset,
            args.seed,
            transport,
            progress=progress,
            workers=args.workers,
            wire=args.wire,
            upload_window=args.upload_window,
            encrypt_workers=args.encrypt_workers,
            dp_ledgers=ledgers,
        )
        plain = run_plaintext_pretraining(graph, partition, args.variant, args.seed)
        error = max_abs_error(pre.encodings, plain)
        if not args.plaintext_training:
            del plain
        # the pre-training report now, not after the training rounds
        print(format_pretraining({**run_summary(pre), "max_abs_error_vs_plaintext": error}), flush=True)
        if args.save_encodings is not None:  # before training: a failed round keeps them
            info = split_info(graph, args.clients, args.beta, args.seed, args.owners, settings)
            _save_encodings(args.save_encodings, pre.encodings, {"written_by": "fedgat demo", **info})
        # off the CPU the clients train in this process (None: the in-process transport)
        rounds_transport = transport if device.type == "cpu" else None
        encrypted = train_fedgat(
            graph,
            partition,
            pre.encodings,
            seed=args.seed,
            deployment=pre.deployment,
            transport=rounds_transport,
            fingerprint=pre.fingerprint,
            progress=progress,
            device=device,
            cuda_graphs=args.cuda_graphs,
            **hp,
        )
        plaintext = None
        if args.plaintext_training:
            plaintext = train_fedgat(
                graph,
                partition,
                plain,
                seed=args.seed,
                transport=rounds_transport,
                progress=progress,
                device=device,
                cuda_graphs=args.cuda_graphs,
                **hp,
            )
        actors = [] if engine is None else engine.memory()
    finally:
        if engine is not None:
            engine.shutdown()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB

    result = {
        "dataset": graph.name,
        "num_nodes": graph.num_nodes,
        "num_features": graph.num_features,
        "clients": args.clients,
        "beta": args.beta,
        "owners": None if args.owners is None else str(args.owners),
        "seed": args.seed,
        "neighbour_cap": cap,
        "dp_spent": None,  # client -> its ledger's (epsilon, delta) with --dp-budget/--dp-ledger-dir
        **run_summary(pre, encrypted),  # variant, preset, pre-training costs, training outcome
        "max_abs_error_vs_plaintext": error,
        "saved_encodings": None if args.save_encodings is None else str(args.save_encodings),
        "plaintext_test_accuracy": None if plaintext is None else plaintext.fit.test_accuracy,
        "plaintext_best_round": None if plaintext is None else plaintext.fit.best_round,
        "total_seconds": round(time.perf_counter() - start, 3),
        "peak_rss_bytes": peak_rss,
        "engine": args.engine,
        "training_device": describe_device(device),
        "actors": len(actors),
        "actor_peak_rss_bytes": [a["peak_rss"] for a in actors],
    }
    print(format_training(result))
    if args.json is not None:
        write_text(args.json, json.dumps(result, indent=2) + "\n", "the results as JSON")
    return 0


def _save_encodings(path: Path, encodings, info: dict) -> None:
    """``--save-encodings``: the clients' decrypted encodings to ``path`` (:func:`fedgat.checkpoint.save_encodings`),
    and where they went (:func:`~fedgat.cli_engine.say_written`)."""
    from fedgat.checkpoint import save_encodings

    made = not path.parent.exists()
    save_encodings(path, encodings, info=info)
    what = f"{len(encodings)} clients' decrypted encodings ({gigabytes(path.stat().st_size)})"
    say_written(
        path,
        what,
        made,
        "; they reveal the clients' neighbours' features: keep the file where the raw data may be kept",
    )


def format_report(r: dict) -> str:
    """The whole report of a finished run: :func:`format_pretraining` then :func:`format_training`."""
    return format_pretraining(r) + "\n" + format_training(r)


def format_pretraining(r: dict) -> str:
    """The encrypted pre-training round's report (printed as soon as the round ends)."""
    lines = [
        "",
        "pre-training (encrypted), seconds per phase, summed over the parties (parties work at the same",
        "time, so the phases add up to more than the round's wall time; the progress bars show wall time):",
    ]
    lines += [f"  {name:<15} {sec:8.2f}" for name, sec in r["phases"].items()]
    layout = r["slot_layout"]
    lines.append(f"  {'wall':<15} {r['pretrain_wall_seconds']:8.2f}")
    lines.append(
        f"bytes up (clients -> server):   {gigabytes(r['bytes_up'])} in {r['messages_up']} messages, "
        f"{r['ciphertexts_up']} ciphertexts"
    )
    lines.append(
        f"bytes down (server -> clients): {gigabytes(r['bytes_down'])} in {r['messages_down']} messages, "
        f"{r['ciphertexts_down']} ciphertexts ({r['result_ciphertexts']} distinct results)"
    )
    lines.append(f"server multiply-adds:           {r['multiply_adds']}")
    if r.get("encrypt_workers"):
        lines.append(
            f"client encryption: up to {r['encrypt_workers']} worker processes per client "
            "(public keys only; --encrypt-workers)"
        )
    window = r.get("upload_window")
    lines.append(
        f"server spool: at most {gigabytes(r['peak_spooled_bytes'])} of uploads on disk at once ("
        + ("every upload before compute" if window is None else f"upload window of {window} recipient(s)")
        + ")"
    )
    lines.append(
        f"packing: a ciphertext holds {layout['slots']} numbers: "
        + ("a whole row" if layout["chunks"] == 1 else f"1/{layout['chunks']} of a row")
        + f" (d = {layout['d']} numbers per row sent, check tags included) for {layout['blocks']} rows at once; "
        f"{r['slot_utilisation']:.0%} of the numbers sent carry data "
        f"({r['result_slot_utilisation']:.0%} in the results), the rest is padding"
    )
    lines.append(f"max |decrypted - plaintext| (same bases): {r['max_abs_error_vs_plaintext']:.2e}")
    lines.append(
        f"keys: every client has its own CKKS key (shared secret key: {r['shared_secret_key']}); "
        f"the server holds a secret key: {r['server_has_secret_key']}; "
        f"{r['rows_released']} rows released, each encrypted for the one client that needs it"
    )
    verdicts = r.get("verdict_epsilon")
    if verdicts:
        lines.append(
            f"verdicts towards the server: each row padded with Gaussian noise (sd {r['upload_pad_sigma']:.3g}), "
            f"so a session's accept/refuse verdicts are at most epsilon {max(verdicts.values()):.3g} "
            "(delta 1e-5) per row; sessions add up (SECURITY.md, known break 22)"
        )
        spent = r.get("dp_spent")
        lines.append(
            "  owners' DP ledgers (--dp-budget): none kept, sessions are not counted"
            if not spent
            else f"  owners' DP ledgers, after this session: up to epsilon "
            f"{max(e for e, _ in spent.values()):.3g} spent (delta {next(iter(spent.values()))[1]:g})"
        )
    return "\n".join(lines)


def format_training(r: dict) -> str:
    """The training rounds' report and the run's totals."""
    lines = []
    lines.append(
        f"FedGAT test accuracy (encrypted pre-training): {r['test_accuracy']:.3f} "
        f"(best round {r['best_round']} of {r['rounds']}, {r['training_seconds']:.1f} s)"
    )
    lines.append(
        "training updates: "
        + (
            "securely aggregated (the server sees only their weighted sum)"
            if r.get("secure_aggregation")
            else "in the clear (fewer than 3 clients per round: secure aggregation needs 3)"
        )
    )
    lines.append(
        "differential privacy of the shared rows: off; each shared row reaches the one client that "
        "needs it exactly (SECURITY.md); fedgat train --dp-epsilon E releases it under DP"
    )
    if r["plaintext_test_accuracy"] is not None:
        lines.append(f"FedGAT test accuracy (plaintext twin, same seed): {r['plaintext_test_accuracy']:.3f}")
    lines.append(f"total {r['total_seconds']:.1f} s, peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB")
    if r.get("engine") in ("ray", "process"):
        peaks = r["actor_peak_rss_bytes"]
        hosts = "actor(s)" if r["engine"] == "ray" else "worker process(es)"
        lines.append(
            f"engine {r['engine']}: clients in {r['actors']} {hosts}, peak RSS "
            f"{sum(peaks) / 2**30:.2f} GiB together ({sum(peaks) / max(1, r['clients']) / 2**20:.0f} MiB "
            "per client)"
        )
    if math.isnan(r["test_accuracy"]):
        lines.append("note: no test node anywhere, accuracy undefined")
    return "\n".join(lines)
