"""``fedgat audit``: what each party can learn, measured by real attacks against ground truth.

    fedgat audit --dataset cora --variant vector                  # unmitigated protocol
    fedgat audit --dataset cora --variant matrix --neighbour-cap 16
    fedgat audit --dataset cora --dp-epsilon 4                    # with the DP release (label_rr)
    fedgat audit --dataset cora --dp-epsilon 4 --dp-mechanism gaussian --dp-dim 64
    fedgat audit --dataset cora --sweep 0.5 1 2 4 8 16 --json audit.json --report audit.md
    fedgat audit --dataset my_graph.npz --owners owners.csv --quiet   # your graph, your organisations
    fedgat audit --dataset cora --upload-window 1                 # server side against windowed rounds

Runs (1) the server side (:func:`fedgat.audit.audit_server`): the encrypted pre-training round with
a recorded transcript, the checks of everything the server received and whether any two clients
share a CKKS key, then every server-side attack against the real protocol -- a hostile server, alone
or with a colluding client (substituted results, injected ciphertexts, fake edges, server plus one
client, trap weights against one client's update and against the aggregate, inconsistent models) --
each with the fraction of foreign feature vectors it recovers and whether an honest party detected
it; (2) every client-side attack on every client's view (:func:`fedgat.audit.audit_clients`: what an
honest recipient learns), (3) FedGAT training under the same mitigation for its test accuracy, and
optionally (4) a sweep over epsilon with DistGAT's accuracy (no sharing at all) as the reference line.
With ``--upload-window N`` every encrypted round of the server side (the honest one and the hostile
ones) runs with that upload window (uploads granted recipient by recipient, N at a time).
Writes a Markdown report with a table per party and, with ``--json``, the numbers (top level:
``server_attacks``, ``shared_secret_key``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from fedgat.attack_names import SERVER_ATTACKS as SERVER_ATTACK_NAMES
from fedgat.attack_names import TRAINING_ATTACKS
from fedgat.cli_engine import (
    DP_MECHANISMS,
    UsageError,
    add_dataset_argument,
    add_nodes_argument,
    add_owners_arguments,
    add_quiet_argument,
    add_upload_window_argument,
    check_beta,
    check_counts,
    check_dataset,
    check_nodes,
    check_output_file,
    check_owners_path,
    fit_spool,
    given_flags,
    load_graph,
    resolve_owners,
    synthetic_sizes,
    write_text,
)

#: a server-side attack on label_rr's release (fedgat.dp_attacks), run with ``--dp-epsilon`` or ``--sweep``
PREDICTOR_ATTACK = "chosen_predictor"
#: what each server-side attack tries, in one sentence (the report's list; SECURITY.md has the details)
SERVER_ATTACK_WHAT = {
    "substituted_result": "the server sends a recipient a result computed from other rows than the plan's",
    "injected_ciphertexts": "the server sends ciphertexts of its own making as a recipient's results",
    "chosen_bases": "the server draws bases of its choosing to single out one neighbour's row",
    "fake_edges": "the server (with a colluding client) claims edges the owners never confirmed, to be sent rows",
    "third_party_claims": "a colluder claims edges over a third client's nodes to be released their owner's rows",
    "relabel_forgery": "the server relabels another owner's row as the colluder's in a victim's neighbourhood",
    "row_swap": "the server swaps an owner's released row for another of its rows in a victim's encoding",
    "withheld_claims": "the server withholds a bordering owner's claim so a victim trains on a partial view",
    "verdict_oracle": "the server tampers with one slot and reads the victim's accept/refuse verdict (break 22)",
    "split_roster": "the server shows clients different rosters (split views of one session)",
    "dropped_client": "the server leaves out a client whose nodes a victim attends over",
    "server_plus_one_client": "the server and one client pool what they hold: every upload and result they see",
    "colluder_forgery": "a colluding owner forges a partial of an honest owner for a victim",
    "chosen_weights_one_client": "trap weights sent to one client to read its inputs out of its update",
    "chosen_weights_aggregate": "trap weights in every client's model, read out of the aggregate",
    "model_inconsistency": "different models to different clients, to single one out of the aggregate",
    "cohort_differencing": "rounds that each leave one client out, differenced to isolate it (break 2)",
}
#: attacks that measure a break SECURITY.md keeps open (everything else is refused or recovers nothing)
OPEN_BREAKS = {
    "chosen_weights_aggregate": "allowed by secure aggregation, measured (SECURITY.md, summary)",
    "verdict_oracle": "open, bounded by DP (break 22)",
    "cohort_differencing": "open without DP-FedAvg (break 2)",
}
#: what each client-side attack does with a client's own view (fedgat.attacks)
CLIENT_ATTACK_WHAT = {
    "prior_knowledge": "guesses each foreign neighbour from the client's own nodes only (a baseline)",
    "neighbour_sum": "reads a neighbour's row off the sums in its encodings",
    "basis": "solves the vector variant's V_i = Q_i H_i with the bases it holds",
    "spectral": "recovers the rows from the spectrum of the matrix variant's encodings",
    "m1_trace": "reads rows off the traces of the matrix variant's M1 blocks",
}
#: the fewest clients secure aggregation (and so the training attacks) runs with
MIN_TRAINING_CLIENTS = 3
DP_MECHANISM = "label_rr"
DP_DIM = 64
#: file types matplotlib writes (``--plot``)
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")

NAME = "audit"
HELP = "privacy audit: server-side checks and client-side attacks, with mitigations and their accuracy"


def configure(parser: argparse.ArgumentParser) -> None:
    add_dataset_argument(parser)
    add_nodes_argument(parser)
    parser.add_argument(
        "--variant",
        default="vector",
        choices=("vector", "matrix"),
        help="FedGAT encodings to attack (default vector)",
    )
    add_owners_arguments(parser)
    parser.add_argument("--beta", type=float, default=1.0, help="Dirichlet label split (default 1: non-iid)")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the split, the bases, the training and --dataset synthetic's graph (default 0)",
    )
    parser.add_argument(
        "--min-cross",
        type=int,
        default=0,
        help="paper's minimum-cross rule k (default 0: off; the paper uses 2)",
    )
    parser.add_argument(
        "--neighbour-cap",
        type=int,
        default=None,
        help="neighbour sampling cap (default none; 16 for the matrix variant)",
    )
    parser.add_argument("--dp-epsilon", type=float, default=None, help="DP release of shared rows")
    parser.add_argument("--dp-delta", type=float, default=1e-5, help="the DP release's delta (default 1e-5)")
    parser.add_argument(
        "--dp-mechanism",
        default=None,
        choices=DP_MECHANISMS,
        help="the DP release's mechanism (default label_rr; see fedgat.dp)",
    )
    parser.add_argument(
        "--dp-dim",
        type=int,
        default=None,
        help=f"gaussian: projection dimension before the noise (default {DP_DIM})",
    )
    parser.add_argument(
        "--sweep",
        type=float,
        nargs="*",
        default=None,
        metavar="EPS",
        help="also sweep these epsilons (attacks + accuracy) against DistGAT",
    )
    parser.add_argument(
        "--rounds", type=int, default=300, help="federated rounds of the accuracy runs (default 300)"
    )
    parser.add_argument(
        "--attack-clients",
        type=int,
        default=None,
        help="attack only the first N clients' views (default all)",
    )
    parser.add_argument(
        "--no-server-check",
        action="store_true",
        help="skip the server side (the encrypted round, its checks and every server-side attack)",
    )
    parser.add_argument(
        "--server-attacks",
        nargs="+",
        default=None,
        metavar="NAME",
        help="server-side attacks to run: 'all' (the default), 'none' (only the encrypted round's checks), "
        f"or names from: {', '.join(SERVER_ATTACK_NAMES)}, {PREDICTOR_ATTACK} (label_rr's DP release only)",
    )
    parser.add_argument(
        "--attack-rounds", type=int, default=3, help="training rounds of the trap-weight attacks (default 3)"
    )
    parser.add_argument(
        "--colluder",
        type=int,
        default=None,
        help="the colluding client (default: the first that receives rows)",
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="server processes for the encrypted rounds (default: auto)"
    )
    add_upload_window_argument(parser)  # the server side's encrypted rounds, honest and hostile
    parser.add_argument("--no-training", action="store_true", help="skip the accuracy runs")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--report", type=Path, default=None, help="Markdown report path")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of the epsilon sweep")
    add_quiet_argument(parser, "no progress lines on stderr (the report is still printed)")


def check_arguments(args: argparse.Namespace) -> None:
    """Every check on the arguments alone, before anything is loaded or attacked.

    Raises:
        UsageError: naming the flag and the fix.
    """
    check_counts(
        {
            "--clients": (args.clients, 1),
            "--seed": (args.seed, 0),
            "--rounds": (args.rounds, 1),
            "--attack-rounds": (args.attack_rounds, 1),
            "--attack-clients": (args.attack_clients, 1),
            "--min-cross": (args.min_cross, 0),
            "--neighbour-cap": (args.neighbour_cap, 1),
            "--dp-dim": (args.dp_dim, 1),
            "--workers": (args.workers, 0),
            "--colluder": (args.colluder, 0),
        }
    )
    check_beta(args.beta)
    for flag, eps in [("--dp-epsilon", args.dp_epsilon), *(("--sweep", e) for e in args.sweep or ())]:
        if eps is not None and not (eps > 0 and eps != float("inf")):
            raise UsageError(f"{flag} must be a finite epsilon > 0, got {eps:g}")
    if not 0 < args.dp_delta < 1:
        raise UsageError(f"--dp-delta must lie in (0, 1), got {args.dp_delta:g}")
    check_dataset(args.dataset)
    check_nodes(args.dataset, args.nodes)
    check_owners_path(args.owners)
    outputs = (("--json", args.json, "results.json"), ("--report", args.report, "audit.md"))
    for flag, path, example in (*outputs, ("--plot", args.plot, "sweep.png")):
        check_output_file(flag, path, example=example)
        if path is not None and str(path) == "-":
            raise UsageError(f"{flag} - : give a file path (the report is printed on stdout anyway)")
    if args.json is not None and args.report is not None and args.json.resolve() == args.report.resolve():
        raise UsageError(f"--json and --report both name {args.json}; give each its own file")
    if args.plot is not None and not args.sweep:
        raise UsageError("--plot draws the epsilon sweep; give --sweep EPS ... too")
    if args.plot is not None and args.plot.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(
            f"--plot {args.plot}: matplotlib cannot write {args.plot.suffix or 'a file without a suffix'}; "
            f"end it in {', '.join(PLOT_SUFFIXES[:4])}, ..."
        )
    if args.sweep is not None and not args.sweep:
        raise UsageError("--sweep needs the epsilons to sweep, e.g. --sweep 0.5 1 2 4 8")
    if args.dp_epsilon is None and not args.sweep:
        given = given_flags(("--dp-mechanism", args.dp_mechanism), ("--dp-dim", args.dp_dim))
        if given:
            raise UsageError(f"{' and '.join(given)} shape a DP release; give --dp-epsilon (or --sweep) too")
    if args.dp_dim is not None and (args.dp_mechanism or DP_MECHANISM) != "gaussian":
        raise UsageError(
            f"--dp-dim is the gaussian mechanism's projection; {args.dp_mechanism or DP_MECHANISM} does not "
            "use it (add --dp-mechanism gaussian)"
        )
    if args.no_server_check:
        given = given_flags(
            ("--upload-window", args.upload_window), ("--server-attacks", args.server_attacks)
        )
        if given:
            raise UsageError(f"{' and '.join(given)} shape the server side, which --no-server-check skips")
    if args.server_attacks is not None:
        names = args.server_attacks
        if ("all" in names or "none" in names) and len(names) > 1:
            raise UsageError("--server-attacks: 'all' and 'none' stand alone; give one of them, or names")
        known = (*SERVER_ATTACK_NAMES, PREDICTOR_ATTACK)
        unknown = sorted(set(names) - set(known) - {"all", "none"})
        if unknown:
            raise UsageError(
                f"--server-attacks: unknown {', '.join(unknown)}; choose from all, none, {', '.join(known)}"
            )
        args.server_attacks = list(known) if names == ["all"] else [] if names == ["none"] else names


def _accuracy(graph, args, **hp) -> float:
    """FedGAT's test accuracy in the audited setting. With a DP release, each owner's release is
    charged to a ledger with a budget of exactly that release, in a folder that lives as long as
    the run: the audit simulates the release in this process (nothing leaves it), so it must not
    spend a persistent budget (a data owner's real releases are charged in ``~/.fedgat/dp_ledger``)."""
    import tempfile

    from fedgat.methods import run_method

    with tempfile.TemporaryDirectory(prefix="fedgat-audit-ledger-") as folder:
        if hp.get("dp_epsilon") is not None:
            hp = {**hp, "dp_budget": (hp["dp_epsilon"], hp["dp_delta"]), "dp_ledger_dir": folder}
        return run_method(
            "fedgat", graph, args.clients, args.beta, args.seed, rounds=args.rounds, **hp
        ).test_accuracy


def _log(args: argparse.Namespace, text: str) -> None:
    """A progress line on stderr (none with ``--quiet``)."""
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    check_arguments(args)  # before the imports below: a usage error in a blink, not in 4 s
    args.dp_mechanism = args.dp_mechanism or DP_MECHANISM
    args.dp_dim = DP_DIM if args.dp_dim is None else args.dp_dim

    from fedgat.audit import Mitigation, audit_clients, audit_predictor, chance_reidentification
    from fedgat.dp import FeatureDP
    from fedgat.methods import run_method
    from fedgat.partition import make_partition
    from fedgat.variants import as_variant

    graph = load_graph(args.dataset, quiet=args.quiet, **synthetic_sizes(args.nodes), seed=args.seed)
    owners = resolve_owners(args, graph)
    if args.colluder is not None and args.colluder >= args.clients:
        raise UsageError(
            f"--colluder {args.colluder}: there are {args.clients} clients (0..{args.clients - 1})"
        )
    if args.attack_clients is not None and args.attack_clients > args.clients:
        raise UsageError(f"--attack-clients {args.attack_clients}: there are {args.clients} clients")
    chosen = (
        [*SERVER_ATTACK_NAMES, PREDICTOR_ATTACK] if args.server_attacks is None else list(args.server_attacks)
    )
    attacks = [a for a in chosen if a in SERVER_ATTACK_NAMES]  # audit_server's (chosen_predictor is below)
    few = [a for a in attacks if a in TRAINING_ATTACKS] if args.clients < MIN_TRAINING_CLIENTS else []
    if few and not args.no_server_check:
        attacks = [a for a in attacks if a not in few]
        _log(
            args,
            f"note: {args.clients} client(s): the training attacks ({', '.join(few)}) train under secure "
            f"aggregation, which needs {MIN_TRAINING_CLIENTS} clients or more; they are not run",
        )
    cap = args.neighbour_cap
    if cap is None:
        cap = as_variant(args.variant).default_neighbour_cap
    dp = (
        FeatureDP(args.dp_epsilon, args.dp_delta, args.dp_mechanism, args.dp_dim, seed=args.seed)
        if args.dp_epsilon
        else None
    )
    mitigation = Mitigation(args.min_cross, cap, dp)
    part = make_partition(
        graph,
        args.clients,
        beta=args.beta,
        seed=args.seed,
        min_cross=args.min_cross,
        neighbour_cap=cap,
        owner=owners,
    )
    if not args.no_server_check:  # its encrypted rounds spool uploads under the temporary directory
        from fedgat.estimate import estimate_pretraining

        fit_spool(
            estimate_pretraining(part, args.variant, graph.num_features),
            args.upload_window,
            pace=False,
            escape="audit the server side of a smaller graph, or skip it (--no-server-check)",
        )
    clients = range(min(args.attack_clients or part.num_clients, part.num_clients))
    report: dict = {
        "dataset": args.dataset,
        "variant": args.variant,
        "clients": args.clients,
        "beta": args.beta,
        "owners": None if args.owners is None else str(args.owners),
        "seed": args.seed,
        "upload_window": args.upload_window,
        "server_side": not args.no_server_check,
        "mitigation": mitigation.describe(),
        "attacked_clients": len(clients),
        "chance_reidentification": chance_reidentification(graph, part),
    }
    start = time.perf_counter()

    if not args.no_server_check:
        from fedgat.audit import audit_server

        _log(
            args,
            f"server side: the encrypted round, its checks and {len(attacks)} server-side attack(s), most "
            "with an encrypted round of their own (Cora: ~2 hours on 2 cores; --server-attacks NAME ... "
            "or --no-server-check for less) ...",
        )
        report.update(
            audit_server(
                graph,
                part,
                args.variant,
                seed=args.seed,
                workers=args.workers,
                upload_window=args.upload_window,
                colluder=args.colluder,
                attacks=attacks,
                training_rounds=args.attack_rounds,
                log=lambda line: _log(args, line),
            )
        )
    _log(args, "client side: attacks on every client's view ...")
    predictor = None
    if (dp is not None and dp.needs_predictor) or (args.sweep and args.dp_mechanism == "label_rr"):
        _log(args, "training label_rr's release predictor ...")
        predictor = audit_predictor(graph, part, args.seed)
    if not args.no_server_check:
        report["server_attacks_chosen"] = chosen  # the user's; those skipped for want of clients: "not run"

    def client_attacks(m: Mitigation, null_release: bool = False):
        return audit_clients(
            graph,
            args.variant,
            args.clients,
            args.beta,
            args.seed,
            m,
            clients=clients,
            partition=part,
            null_release=null_release,
            predictor=predictor,
        )

    report["client_attacks"] = client_attacks(mitigation).as_dict()
    if dp is not None:  # the chance level of the scoring under this release (as the sweep's points)
        report["null_release_attacks"] = client_attacks(mitigation, null_release=True).as_dict()
    # [epsilon, delta] of the audited release (None: no DP)
    report["dp_spent"] = mitigation.dp_spent(graph.num_features, graph.num_classes)
    report["dp_delta"] = args.dp_delta
    if (
        dp is not None
        and dp.mechanism == "label_rr"
        and not args.no_server_check
        and PREDICTOR_ATTACK in chosen
    ):
        from fedgat.dp_attacks import chosen_predictor_attack

        _log(args, "server side: a trap published as label_rr's predictor ...")
        report["chosen_predictor"] = chosen_predictor_attack(
            graph, part, dp.epsilon, seed=args.seed, delta=dp.delta
        ).as_dict()
    dp_hp = (
        {}
        if dp is None
        else {"dp_epsilon": dp.epsilon, "dp_delta": dp.delta, "dp_mechanism": dp.mechanism, "dp_dim": dp.dim}
    )
    if not args.no_training:
        _log(args, "training FedGAT under this setting ...")
        report["test_accuracy"] = _accuracy(
            graph,
            args,
            variant=args.variant,
            min_cross=args.min_cross,
            neighbour_cap=cap,
            owner=owners,
            **dp_hp,
        )
        report["test_nodes"] = int(graph.test_mask.sum())
        report["distgat_test_accuracy"] = run_method(
            "distgat", graph, args.clients, args.beta, args.seed, rounds=args.rounds, owner=owners
        ).test_accuracy
    if args.sweep:
        sweep = []
        for eps in args.sweep:
            point_dp = FeatureDP(eps, args.dp_delta, args.dp_mechanism, args.dp_dim, seed=args.seed)
            scores = client_attacks(Mitigation(args.min_cross, cap, point_dp))
            null = client_attacks(Mitigation(args.min_cross, cap, point_dp), null_release=True)
            point = {
                "epsilon": eps,
                "mechanism": point_dp.describe(),
                "client_attacks": scores.as_dict(),
                "null_release_attacks": null.as_dict(),
            }
            if point_dp.mechanism == "label_rr" and not args.no_server_check and PREDICTOR_ATTACK in chosen:
                from fedgat.dp_attacks import chosen_predictor_attack

                point["chosen_predictor"] = chosen_predictor_attack(
                    graph, part, eps, seed=args.seed, delta=args.dp_delta
                ).as_dict()
            if not args.no_training:
                point["test_accuracy"] = _accuracy(
                    graph,
                    args,
                    variant=args.variant,
                    min_cross=args.min_cross,
                    neighbour_cap=cap,
                    dp_epsilon=eps,
                    dp_delta=args.dp_delta,
                    dp_mechanism=args.dp_mechanism,
                    dp_dim=args.dp_dim,
                    owner=owners,
                )
            _log(
                args,
                f"  epsilon {eps:g}: "
                + ", ".join(
                    f"{k} reid {v['reidentification_rate']:.3f}" for k, v in point["client_attacks"].items()
                )
                + (f", accuracy {point['test_accuracy']:.3f}" if "test_accuracy" in point else ""),
            )
            sweep.append(point)
        report["epsilon_sweep"] = sweep
    report["seconds"] = time.perf_counter() - start
    report["command"] = shlex.join(["fedgat", "audit", *sys.argv[2:]]) if sys.argv[1:2] == ["audit"] else None

    markdown = render_markdown(report)
    print(markdown)
    if args.report:
        write_text(args.report, markdown, "the Markdown report")
    if args.json:
        write_text(args.json, json.dumps(report, indent=2, default=_jsonable), "the results as JSON")
    if args.plot and args.sweep:
        plot_sweep(report, args.plot)
        print(f"wrote the epsilon sweep's plot to {args.plot}", file=sys.stderr)
    return 0


def _jsonable(obj):
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj)}")


def render_markdown(report: dict) -> str:
    """The audit as Markdown: a table per party (what it sees, what the attacks recover)."""
    lines = [
        (
            f"# Privacy audit: {report['dataset']}, {report['variant']} variant, {report['clients']} clients, "
            + (f"owners from {report['owners']}" if report.get("owners") else f"beta {report['beta']:g}")
        ),
        "",
        f"Mitigation: `{json.dumps(report['mitigation'], default=str)}`",
        "",
        *(
            [
                "Upload window of the encrypted rounds: "
                + (
                    "none (every upload before compute)"
                    if report.get("upload_window") is None
                    else f"{report['upload_window']} recipient(s) at a time (`--upload-window`)"
                ),
                "",
            ]
            if report.get("server_side", True)  # False: --no-server-check, no encrypted round
            else []
        ),
        *(
            [f"Audited by `{report['command']}` in {report['seconds']:.0f} s.", ""]
            if report.get("command")
            else []
        ),
    ]
    server = report.get("server")
    if server:
        lines += ["## Server", "", "| check | result |", "|---|---|"]
        for key in (
            "only_allowed_message_types",
            "client_contexts",
            "distinct_client_keys",
            "uploaded_ciphertexts",
            "all_uploads_are_ciphertexts_of_the_recipients_keys",
            "feature_row_anchor_candidates",
            "feature_row_anchor_hits",
            "longest_zero_byte_run_in_ciphertexts",
            "shortest_zero_byte_run_in_a_float32_feature_row",
            "no_feature_rows_visible",
            "server_context_has_secret_key",
            "server_context_cannot_decrypt",
            "passed",
        ):
            value = server.get(key)
            if key == "shortest_zero_byte_run_in_a_float32_feature_row" and value is None:
                value = "n/a (dense features: no zero run to look for)"
            lines.append(f"| {key.replace('_', ' ')} | {value} |")
        lines += (
            [
                "",
                "Clients share one CKKS secret key: "
                + ("**yes**" if report.get("shared_secret_key") else "no (each holds its own)")
                + ".",
                "",
                "Messages received: " + ", ".join(f"{k} x{v}" for k, v in server["message_types"].items()),
                "",
                "What the server learns:",
                "",
            ]
            + [f"- {item}" for item in server["server_learns"]]
            + [""]
        )
    if report.get("server_attacks") or report.get("server_attacks_not_run"):
        lines += server_attacks_markdown(report)
    lines += [
        "## Clients (honest but curious)",
        "",
        (
            f"Attacks on the views of {report['attacked_clients']} clients; a victim is a (target node, foreign "
            "neighbour) pair whose feature row the attack tries to recover. "
            f"Chance re-identification: {report['chance_reidentification']:.2e}."
        ),
        "",
        *(
            [
                (
                    "| attack | victims | recovered (cos >= 0.99) | mean cosine | re-identified | re-identified, "
                    "null release |"
                ),
                "|---|---|---|---|---|---|",
            ]
            if report.get("null_release_attacks")
            else [
                "| attack | victims | recovered (cos >= 0.99) | mean cosine | re-identified |",
                "|---|---|---|---|---|",
            ]
        ),
    ]
    null = report.get("null_release_attacks") or {}
    for name, s in report["client_attacks"].items():
        lines.append(
            f"| {name} | {s['victims']} | {s['recovered_fraction']:.3f} | {s['mean_cosine']:.3f} | "
            f"{s['reidentification_rate']:.3f} |"
            + (f" {null[name]['reidentification_rate']:.3f} |" if name in null else (" - |" if null else ""))
        )
    lines += [""] + [
        f"- **{name}**: {CLIENT_ATTACK_WHAT[name]}"
        for name in report["client_attacks"]
        if name in CLIENT_ATTACK_WHAT
    ]
    if null:
        lines.append(
            "- null release: the same attacks and scoring on a release of shuffled features (same mechanism, "
            "nothing on who has which features): the chance level to read the re-identification against."
        )
    lines.append(
        "- recovered: the fraction of victims whose row the attack got at cosine >= 0.99; re-identified: the "
        "fraction whose best guess is nearest the true row among every foreign node's row (SECURITY.md, "
        "'What clients learn')."
    )
    traps = [report["chosen_predictor"]] if report.get("chosen_predictor") else []
    traps += [p["chosen_predictor"] for p in report.get("epsilon_sweep") or () if p.get("chosen_predictor")]
    if traps:
        lines += [
            "",
            "## A hostile server chooses label_rr's predictor",
            "",
            (
                "The server publishes a trap instead of the trained predictor (fedgat.dp_attacks): the label "
                "is 1 when one chosen word is present. A recipient guesses the word from the released label. "
                "Epsilon-DP bounds any such test's balanced accuracy by e^eps / (1 + e^eps)."
            ),
            "",
            (
                "| epsilon | word | nodes | trap's own accuracy | balanced accuracy | bound | sampling slack "
                "(few nodes) | within bound + slack |"
            ),
            "|---|---|---|---|---|---|---|---|",
        ]
        for t in traps:
            lines.append(
                f"| {t['epsilon']:g} | {t['feature']} | {t['nodes']} | {t['trap_accuracy']:.3f} | "
                f"{t['balanced_accuracy']:.3f} | {t['bound']:.3f} | {t.get('slack', 0.0):.3f} | {t['within_bound']} |"
            )
    if "test_accuracy" in report:
        lines += [
            "",
            (
                f"FedGAT test accuracy in this setting: **{report['test_accuracy']:.3f}** "
                f"(DistGAT, no sharing: {report['distgat_test_accuracy']:.3f})"
                + (f"; {report['test_nodes']} test nodes." if report.get("test_nodes") else ".")
            ),
        ]
    if report.get("epsilon_sweep"):
        lines += [
            "",
            "## Epsilon sweep (DP release of shared rows)",
            "",
            (
                "The attacks recover the released rows; the attacker maps them back to feature space with "
                "its best decoder (fedgat.attacks.release_decoder) before scoring. Null release: the same "
                "attacks and scoring on a release of *shuffled* features (same mechanism, no information on "
                "who has which features): the chance level of the oracle scoring, which keeps each victim's "
                "best guess. `prior_knowledge` guesses with the client's own nodes only."
            ),
            "",
            (
                "| epsilon | mechanism | attack | recovered | mean cosine | re-identified | re-identified, "
                "null release | FedGAT accuracy |"
            ),
            "|---|---|---|---|---|---|---|---|",
        ]
        for p in report["epsilon_sweep"]:
            for name, s in p["client_attacks"].items():
                acc = f"{p['test_accuracy']:.3f}" if "test_accuracy" in p else "-"
                null = p.get("null_release_attacks", {}).get(name)
                null_reid = f"{null['reidentification_rate']:.3f}" if null else "-"
                lines.append(
                    f"| {p['epsilon']:g} | {p['mechanism']['mechanism']} | {name} | {s['recovered_fraction']:.3f} | "
                    f"{s['mean_cosine']:.3f} | {s['reidentification_rate']:.3f} | {null_reid} | {acc} |"
                )
    return "\n".join(lines) + "\n"


def _ran(report: dict, name: str) -> dict | None:
    """The server attack ``name``'s result when it ran (a report from before ``ran`` counts as run)."""
    a = report["server_attacks"].get(name)
    return a if a and a.get("ran", True) else None


def server_attacks_markdown(report: dict) -> list[str]:
    """The server-side attacks as a table, with each attack's own explanation below it."""
    lines = [
        "## Server-side attacks (hostile server, alone or with a colluding client)",
        "",
        (
            "Each attack ran against the real protocol (in-process parties, the actual state machines). "
            "Recovered: foreign feature vectors the attacker got at cosine >= 0.99 against the ground truth "
            "(or, for forged results, that reached an honest client's training input); detected: an honest "
            "party refused with a typed error before training on the attack's output."
        ),
        "",
        (
            "Targets: what the attack aims at, in its own unit (forged results, claims, probes or foreign "
            "rows: see the list below); recovered: how many of them it got; status: whether SECURITY.md "
            "keeps the break open (every other attack is refused or recovers nothing)."
        ),
        "",
        "| attack | targets | recovered | recovered fraction | detected | status |",
        "|---|---|---|---|---|---|",
    ]
    ran = {name: a for name, a in (report.get("server_attacks") or {}).items() if a.get("ran", True)}
    if not ran:
        lines[2:] = ["No server-side attack ran (the list below says why)."]
    for name, a in ran.items():
        lines.append(
            f"| {name} | {a['targets']} | {a['recovered']} | {a['recovered_fraction']:.4f} | {a['detected']} | "
            f"{_status(name, a)} |"
        )
    lines.append("")
    tabled = {"chosen_weights_one_client", "chosen_weights_aggregate", "cohort_differencing"}
    for name, a in ran.items():
        what = SERVER_ATTACK_WHAT.get(name, "")
        note = a.get("note") or ""
        lines.append(f"- **{name}**: {what}" + (f". {note}" if note else "."))
        if name not in tabled:
            keep = ("recovered_fraction", "detected", "ran", "targets", "recovered", "note")
            facts = [
                f"{k.replace('_', ' ')} {v:.3g}" if isinstance(v, float) else f"{k.replace('_', ' ')} {v}"
                for k, v in a.items()
                if k not in keep and _plain(v)
            ]
            if facts:
                lines.append(f"  ({'; '.join(facts)}; the rest in the JSON)")
    # an attack with nothing to target in this setting is listed under "Not run" only, not tabled
    one = _ran(report, "chosen_weights_one_client")
    if one:
        lines += [
            "",
            f"Trap weights against one client's update (target: client {one['target']}):",
            "",
            "| run | secure aggregation | rounds received | foreign rows recovered | layer-1 inputs recovered | refused by clients |",
            "|---|---|---|---|---|---|",
        ]
        for run, r in one["runs"].items():
            lines.append(
                f"| {run} | {r['secure_aggregation']} | {r['rounds_received']} | {r['recovered_foreign']} | "
                f"{r['layer1_inputs_recovered']} | {r['refused_by_clients']} |"
            )
    diff = _ran(report, "cohort_differencing")
    if diff and diff.get("runs"):
        lines += [
            "",
            f"Cohort differencing (target: client {diff['target']}, {diff['clients']} rounds, each without one client):",
            "",
            "| run | differenced | foreign rows recovered | fraction | layer-1 inputs recovered | best foreign cosine |",
            "|---|---|---|---|---|---|",
        ]
        for run, r in diff["runs"].items():
            lines.append(
                f"| {run} | {r['differenced']} | {r['recovered_foreign']} | {r['recovered_fraction']:.4f} | "
                f"{r['layer1_inputs_recovered']} | {r['best_foreign_cosine']:.3f} |"
            )
    agg = _ran(report, "chosen_weights_aggregate")
    if agg:
        lines += [
            "",
            f"Trap weights against the aggregate ({agg['rounds']} attack rounds, {agg['targets']} foreign rows in play):",
            "",
            "| configuration | cohort | foreign rows recovered | fraction | any rows recovered | layer-1 inputs recovered | best foreign cosine |",
            "|---|---|---|---|---|---|---|",
        ]
        for label, r in agg["by_strategy"].items():
            lines.append(
                f"| {label} | {r['cohort_sizes']} | {r['recovered_foreign']} | {r['recovered_fraction']:.4f} | "
                f"{r['recovered_any_node']} | {r['layer1_inputs_recovered']} | {r['best_foreign_cosine']:.3f} |"
            )
    not_run = report.get("server_attacks_not_run") or []
    chosen = report.get("server_attacks_chosen")
    skipped = [n for n in not_run if chosen is not None and n not in chosen]
    idle = [n for n in not_run if n not in skipped]
    if idle:
        lines += ["", "Not run (nothing to target in this setting): " + ", ".join(idle)]
    if skipped:
        lines += ["", "Not asked for (`--server-attacks`): " + ", ".join(skipped)]
    return [*lines, ""]


def _status(name: str, attack: dict) -> str:
    """The status column: SECURITY.md's word on an open break, else "closed" -- unless this run recovered
    something all the same, which the column then says instead of hiding it."""
    if name in OPEN_BREAKS:
        return OPEN_BREAKS[name]
    return f"**recovered {attack['recovered']}**: see SECURITY.md" if attack.get("recovered") else "closed"


def _plain(value: object) -> bool:
    """A value short enough for the report's one line (numbers, booleans, short text)."""
    return isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= 60)


def plot_sweep(report: dict, path: Path) -> None:
    """Privacy/accuracy curve: re-identification and FedGAT accuracy vs epsilon, DistGAT as reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedgat.variants import as_variant

    sweep = report["epsilon_sweep"]
    eps = [p["epsilon"] for p in sweep]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    attack = as_variant(report["variant"]).recovery_attack
    ax.plot(
        eps,
        [p["client_attacks"][attack]["reidentification_rate"] for p in sweep],
        "o-",
        label=f"{attack} attack: re-identified",
    )
    if all("null_release_attacks" in p for p in sweep):
        ax.plot(
            eps,
            [p["null_release_attacks"][attack]["reidentification_rate"] for p in sweep],
            "x:",
            color="grey",
            label=f"{attack} on a null release (chance for this scoring)",
        )
    ax.axhline(report["chance_reidentification"], color="grey", ls=":", label="blind guess")
    if all("test_accuracy" in p for p in sweep):
        ax.plot(eps, [p["test_accuracy"] for p in sweep], "s-", label="FedGAT test accuracy")
    if "distgat_test_accuracy" in report:
        ax.axhline(report["distgat_test_accuracy"], color="C3", ls="--", label="DistGAT (no sharing)")
    ax.set_xscale("log")
    ax.set_xlabel(f"epsilon (per node feature vector, delta {report.get('dp_delta', 1e-5):g})")
    ax.set_ylabel("rate")
    ax.set_title(f"Privacy vs accuracy: {report['dataset']}, {report['variant']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
