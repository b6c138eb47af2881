"""``fedgat audit``: what each party can learn, measured by real attacks against ground truth.

    fedgat audit --dataset cora --variant vector                  # unmitigated protocol
    fedgat audit --dataset cora --variant matrix --neighbour-cap 16
    fedgat audit --dataset cora --dp-epsilon 4 --dp-dim 64        # with the DP release
    fedgat audit --dataset cora --sweep 0.5 1 2 4 8 16 --json audit.json --report audit.md

Runs (1) the server side (:func:`fedgat.audit.audit_server`): the encrypted pre-training round with
a recorded transcript, the checks of everything the server received and whether any two clients
share a CKKS key, then every server-side attack against the real protocol -- a hostile server, alone
or with a colluding client (substituted results, injected ciphertexts, fake edges, server plus one
client, trap weights against one client's update and against the aggregate, inconsistent models) --
each with the fraction of foreign feature vectors it recovers and whether an honest party detected
it; (2) every client-side attack on every client's view (:func:`fedgat.audit.audit_clients`: what an
honest recipient learns), (3) FedGAT training under the same mitigation for its test accuracy, and
optionally (4) a sweep over epsilon with DistGAT's accuracy (no sharing at all) as the reference line.
Writes a Markdown report with a table per party and, with ``--json``, the numbers (top level:
``server_attacks``, ``shared_secret_key``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

NAME = "audit"
HELP = "privacy audit: server-side checks and client-side attacks, with mitigations and their accuracy"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="cora", choices=("cora", "citeseer", "pubmed", "synthetic"))
    parser.add_argument("--variant", default="vector", choices=("vector", "matrix"))
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-cross", type=int, default=2, help="paper's rule k (1 disables; default 2)")
    parser.add_argument(
        "--neighbour-cap",
        type=int,
        default=None,
        help="neighbour sampling cap (default none; 16 for the matrix variant)",
    )
    parser.add_argument("--dp-epsilon", type=float, default=None, help="DP release of shared features")
    parser.add_argument("--dp-delta", type=float, default=1e-5)
    parser.add_argument("--dp-dim", type=int, default=64, help="projection dimension before the noise")
    parser.add_argument(
        "--sweep",
        type=float,
        nargs="*",
        default=None,
        metavar="EPS",
        help="also sweep these epsilons (attacks + accuracy) against DistGAT",
    )
    parser.add_argument("--rounds", type=int, default=300, help="FedAvg rounds for the accuracy runs")
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
        nargs="*",
        default=None,
        metavar="NAME",
        help="server-side attacks to run (default all; none: only the encrypted round's checks)",
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
    parser.add_argument("--no-training", action="store_true", help="skip the accuracy runs")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None, help="Markdown report path")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of the epsilon sweep")


def _accuracy(graph, args, **hp) -> float:
    from fedgat.methods import run_method

    return run_method(
        "fedgat", graph, args.clients, args.beta, args.seed, rounds=args.rounds, **hp
    ).test_accuracy


def run(args: argparse.Namespace) -> int:
    from fedgat.audit import Mitigation, audit_clients, chance_reidentification
    from fedgat.data import load_dataset
    from fedgat.dp import FeatureDP
    from fedgat.methods import run_method
    from fedgat.partition import make_partition
    from fedgat.variants import as_variant

    graph = load_dataset(args.dataset)
    cap = args.neighbour_cap
    if cap is None:
        cap = as_variant(args.variant).default_neighbour_cap
    dp = FeatureDP(args.dp_epsilon, args.dp_delta, args.dp_dim, seed=args.seed) if args.dp_epsilon else None
    mitigation = Mitigation(args.min_cross, cap, dp)
    part = make_partition(
        graph, args.clients, beta=args.beta, seed=args.seed, min_cross=args.min_cross, neighbour_cap=cap
    )
    clients = range(min(args.attack_clients or part.num_clients, part.num_clients))
    report: dict = {
        "dataset": args.dataset,
        "variant": args.variant,
        "clients": args.clients,
        "beta": args.beta,
        "seed": args.seed,
        "mitigation": mitigation.describe(),
        "attacked_clients": len(clients),
        "chance_reidentification": chance_reidentification(graph, part),
    }
    start = time.perf_counter()

    if not args.no_server_check:
        from fedgat.audit import SERVER_ATTACKS, audit_server

        print("server side: encrypted round, checks and server-side attacks ...", file=sys.stderr)
        report.update(
            audit_server(
                graph,
                part,
                args.variant,
                seed=args.seed,
                workers=args.workers,
                colluder=args.colluder,
                attacks=SERVER_ATTACKS if args.server_attacks is None else args.server_attacks,
                training_rounds=args.attack_rounds,
            )
        )
    print("client side: attacks on every client's view ...", file=sys.stderr)
    report["client_attacks"] = audit_clients(
        graph, args.variant, args.clients, args.beta, args.seed, mitigation, clients=clients, partition=part
    ).as_dict()
    dp_hp = {} if dp is None else {"dp_epsilon": dp.epsilon, "dp_delta": dp.delta, "dp_dim": dp.dim}
    if not args.no_training:
        print("training FedGAT under this setting ...", file=sys.stderr)
        report["test_accuracy"] = _accuracy(
            graph, args, variant=args.variant, min_cross=args.min_cross, neighbour_cap=cap, **dp_hp
        )
        report["distgat_test_accuracy"] = run_method(
            "distgat", graph, args.clients, args.beta, args.seed, rounds=args.rounds
        ).test_accuracy
    if args.sweep:
        sweep = []
        for eps in args.sweep:
            point_dp = FeatureDP(eps, args.dp_delta, args.dp_dim, seed=args.seed)
            scores = audit_clients(
                graph,
                args.variant,
                args.clients,
                args.beta,
                args.seed,
                Mitigation(args.min_cross, cap, point_dp),
                clients=clients,
                partition=part,
            )
            null = audit_clients(
                graph,
                args.variant,
                args.clients,
                args.beta,
                args.seed,
                Mitigation(args.min_cross, cap, point_dp),
                clients=clients,
                partition=part,
                null_release=True,
            )
            point = {
                "epsilon": eps,
                "sigma": point_dp.sigma,
                "client_attacks": scores.as_dict(),
                "null_release_attacks": null.as_dict(),
            }
            if not args.no_training:
                point["test_accuracy"] = _accuracy(
                    graph,
                    args,
                    variant=args.variant,
                    min_cross=args.min_cross,
                    neighbour_cap=cap,
                    dp_epsilon=eps,
                    dp_delta=args.dp_delta,
                    dp_dim=args.dp_dim,
                )
            print(
                f"  epsilon {eps:g}: "
                + ", ".join(
                    f"{k} reid {v['reidentification_rate']:.3f}" for k, v in point["client_attacks"].items()
                )
                + (f", accuracy {point['test_accuracy']:.3f}" if "test_accuracy" in point else ""),
                file=sys.stderr,
            )
            sweep.append(point)
        report["epsilon_sweep"] = sweep
    report["seconds"] = time.perf_counter() - start

    markdown = render_markdown(report)
    print(markdown)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(markdown)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=_jsonable))
    if args.plot and args.sweep:
        plot_sweep(report, args.plot)
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
            f"beta {report['beta']:g}"
        ),
        "",
        f"Mitigation: `{json.dumps(report['mitigation'], default=str)}`",
        "",
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
            lines.append(f"| {key.replace('_', ' ')} | {server.get(key)} |")
        lines += (
            [
                "",
                f"Shared secret key: **{report.get('shared_secret_key')}**.",
                "",
                "Messages received: " + ", ".join(f"{k} x{v}" for k, v in server["message_types"].items()),
                "",
                "What the server learns:",
                "",
            ]
            + [f"- {item}" for item in server["server_learns"]]
            + [""]
        )
    if report.get("server_attacks"):
        lines += server_attacks_markdown(report)
    lines += [
        "## Clients (honest but curious)",
        "",
        (
            f"Attacks on the views of {report['attacked_clients']} clients; victims are foreign nodes. "
            f"Chance re-identification: {report['chance_reidentification']:.2e}."
        ),
        "",
        "| attack | victims | recovered (cos >= 0.99) | mean cosine | re-identified |",
        "|---|---|---|---|---|",
    ]
    for name, s in report["client_attacks"].items():
        lines.append(
            f"| {name} | {s['victims']} | {s['recovered_fraction']:.3f} | {s['mean_cosine']:.3f} | "
            f"{s['reidentification_rate']:.3f} |"
        )
    if "test_accuracy" in report:
        lines += [
            "",
            (
                f"FedGAT test accuracy in this setting: **{report['test_accuracy']:.3f}** "
                f"(DistGAT, no sharing: {report['distgat_test_accuracy']:.3f})."
            ),
        ]
    if report.get("epsilon_sweep"):
        lines += [
            "",
            "## Epsilon sweep (DP release of shared features)",
            "",
            (
                "Null release: the same attacks and scoring on a release of *shuffled* features (same "
                "mechanism, no information on who has which features): the chance level of the oracle "
                "scoring, which keeps each victim's best guess. `prior_knowledge` guesses with the "
                "client's own nodes only."
            ),
            "",
            (
                "| epsilon | sigma | attack | recovered | mean cosine | re-identified | re-identified, "
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
                    f"| {p['epsilon']:g} | {p['sigma']:.2f} | {name} | {s['recovered_fraction']:.3f} | "
                    f"{s['mean_cosine']:.3f} | {s['reidentification_rate']:.3f} | {null_reid} | {acc} |"
                )
    return "\n".join(lines) + "\n"


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
        "| attack | targets | recovered | recovered fraction | detected | ran |",
        "|---|---|---|---|---|---|",
    ]
    for name, a in report["server_attacks"].items():
        lines.append(
            f"| {name} | {a['targets']} | {a['recovered']} | {a['recovered_fraction']:.4f} | {a['detected']} | "
            f"{a['ran']} |"
        )
    lines.append("")
    tabled = {"chosen_weights_one_client", "chosen_weights_aggregate"}
    for name, a in report["server_attacks"].items():
        lines.append(f"- **{name}**: {a.get('note', '')}")
        if name not in tabled:
            keep = ("recovered_fraction", "detected", "ran", "targets", "recovered", "note")
            extra = {k: v for k, v in a.items() if k not in keep}
            lines.append(f"  `{json.dumps(extra, default=str)[:1500]}`")
    one = report["server_attacks"].get("chosen_weights_one_client")
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
    agg = report["server_attacks"].get("chosen_weights_aggregate")
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
    if report.get("server_attacks_not_run"):
        lines += [
            "",
            "Not run (nothing to target in this setting): " + ", ".join(report["server_attacks_not_run"]),
        ]
    return [*lines, ""]


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
    ax.set_xlabel("epsilon (per node feature vector, delta 1e-5)")
    ax.set_ylabel("rate")
    ax.set_title(f"Privacy vs accuracy: {report['dataset']}, {report['variant']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
