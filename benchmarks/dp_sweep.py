"""Differential privacy that pays: FedGAT with a DP release of the shared rows, per mechanism and
epsilon, against not sharing at all (DistGAT), and the client-side attacks against a null release.

Every row is :func:`fedgat.methods.run_method` on the same split (Cora by default, 10 clients,
Dirichlet beta 1, public split) with the same strategy (FedAdam, the default), over ``--seeds``
seeds:

* ``distgat``: cross-client edges dropped, nothing shared (the floor sharing must beat);
* ``fedgat``: the rows shared in the clear inside ciphertexts (no DP; the ceiling);
* ``edges only``: the cross-client edges but no foreign feature at all (``share="edges"``): the
  limit of any release as epsilon goes to 0, i.e. what the *structure* alone is worth;
* one row per mechanism (:data:`fedgat.dp.MECHANISMS`) and epsilon: the DP release in the block
  layout of :mod:`fedgat.dp` (own rows clean, foreign rows released), each owner's release charged to
  a fresh ledger whose budget is exactly that release.

Attacks (seed 0; ``--attack-clients`` clients' views): every client-side attack of
:func:`fedgat.audit.audit_clients` (vector variant: basis, neighbour sum, prior knowledge; with
``--matrix-attacks`` also the matrix variant's spectral and M1-trace attacks) on the release and on a
*null release* (the same mechanism on shuffled rows): recovered fraction (cosine >= 0.99 against the
true features after the attacker's decoding) and re-identification rate.

    python benchmarks/dp_sweep.py --seeds 5 --epsilons 0.5 1 2 4 8 --jobs 2

Runs are independent processes (``--jobs``), one torch thread each, cached one JSON line per run in
``--cache`` (default ``<out>/dp_sweep_runs.jsonl``) so an interrupted sweep resumes. Writes
``dp_sweep.{json,md,png}`` into ``--out`` (default ``benchmarks/results``) with the issue's targets
checked: at every epsilon the default mechanism >= DistGAT, >= 0.75 at epsilon 4, >= DistGAT + 3
points at epsilon 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_MECHANISM = "label_rr"
TARGET_AT_4 = 0.75
#: multibit's public range of a coordinate: Planetoid's bag-of-words rows are non-negative (unit rows <= 1)
MULTIBIT_BOUNDS = (0.0, 1.0)
MARGIN_AT_1 = 0.03


# ---------------------------------------------------------------------------------------- one job
def _job_key(job: dict) -> str:
    return json.dumps(job, sort_keys=True)


def run_job(job: dict) -> dict:
    """One training run or one attack audit (in a worker process, one torch thread)."""
    import torch

    torch.set_num_threads(1)
    from fedgat.data import load_dataset

    graph = load_dataset(job["dataset"])
    start = time.perf_counter()
    if job["kind"] == "attack":
        out = _attack(graph, job)
    else:
        out = _train(graph, job)
    return {**job, **out, "seconds": time.perf_counter() - start}


def _train(graph, job: dict) -> dict:
    from fedgat.methods import run_method

    hp: dict = {}
    method = "distgat" if job["kind"] == "distgat" else "fedgat"
    if job["kind"] == "edges":
        hp["share"] = "edges"
    with tempfile.TemporaryDirectory(prefix="fedgat-dp-sweep-") as ledgers:
        if job["kind"] == "dp":
            hp.update(
                dp_epsilon=job["epsilon"],
                dp_mechanism=job["mechanism"],
                dp_bounds=MULTIBIT_BOUNDS,
                dp_budget=(job["epsilon"], 1e-5),  # exactly this release: a sweep point spends it once
                dp_ledger_dir=ledgers,
            )
        res = run_method(method, graph, job["clients"], job["beta"], job["seed"], **hp)
    return {
        "test_accuracy": res.test_accuracy,
        "rounds": res.rounds,
        "epsilon_spent": None if res.dp_spent is None else res.dp_spent[0],
    }


def _attack(graph, job: dict) -> dict:
    from fedgat.audit import Mitigation, audit_clients, audit_predictor
    from fedgat.dp import FeatureDP
    from fedgat.partition import make_partition
    from fedgat.variants import as_variant

    cap = as_variant(job["variant"]).default_neighbour_cap
    part = make_partition(graph, job["clients"], beta=job["beta"], seed=job["seed"], neighbour_cap=cap)
    dp = FeatureDP(job["epsilon"], mechanism=job["mechanism"], seed=job["seed"], bounds=MULTIBIT_BOUNDS)
    predictor = audit_predictor(graph, part, job["seed"]) if dp.needs_predictor else None
    common = {
        "mitigation": Mitigation(0, cap, dp),
        "clients": range(job["attack_clients"]),
        "partition": part,
        "predictor": predictor,
    }
    scores = audit_clients(graph, job["variant"], job["clients"], job["beta"], job["seed"], **common)
    null = audit_clients(
        graph, job["variant"], job["clients"], job["beta"], job["seed"], null_release=True, **common
    )
    return {"attacks": scores.as_dict(), "null_attacks": null.as_dict()}


# ------------------------------------------------------------------------------------------ grid
def jobs_for(args: argparse.Namespace) -> list[dict]:
    base = {"dataset": args.dataset, "clients": args.clients, "beta": args.beta}
    jobs = []
    secondary_seeds = args.seeds if args.secondary_seeds is None else args.secondary_seeds
    for k, seed in enumerate(range(args.first_seed, args.first_seed + args.seeds)):
        secondary = k < secondary_seeds
        for kind in ("distgat", "edges") + (("fedgat",) if secondary else ()):
            jobs.append({**base, "kind": kind, "seed": seed})
        for mechanism in args.mechanisms:
            if mechanism != DEFAULT_MECHANISM and not secondary:
                continue
            for eps in _epsilons(args, mechanism):
                jobs.append({**base, "kind": "dp", "mechanism": mechanism, "epsilon": eps, "seed": seed})
    for mechanism in args.mechanisms if args.attack_mechanisms is None else args.attack_mechanisms:
        for eps in _epsilons(args, mechanism):
            variants = ["vector"]
            if args.matrix_attacks and mechanism == DEFAULT_MECHANISM:
                variants.append("matrix")
            for variant in variants:
                jobs.append(
                    {
                        **base,
                        "kind": "attack",
                        "mechanism": mechanism,
                        "epsilon": eps,
                        "seed": args.first_seed,
                        "variant": variant,
                        "attack_clients": args.attack_clients,
                    }
                )
    return jobs


def _epsilons(args: argparse.Namespace, mechanism: str) -> list[float]:
    if mechanism == DEFAULT_MECHANISM or args.secondary_epsilons is None:
        return args.epsilons
    return args.secondary_epsilons


def run_all(jobs: list[dict], cache: Path, workers: int) -> list[dict]:
    """Every job's result, from the cache where present; new ones appended to it as they finish."""
    done: dict[str, dict] = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done[_job_key({k: row[k] for k in row if k in _JOB_FIELDS})] = row
    todo = [j for j in jobs if _job_key(j) not in done]
    print(
        f"{len(jobs) - len(todo)} of {len(jobs)} runs cached in {cache}; {len(todo)} to run", file=sys.stderr
    )
    cache.parent.mkdir(parents=True, exist_ok=True)
    if todo:
        context = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool, cache.open("a") as f:
            futures = {pool.submit(run_job, j): j for j in todo}
            for k, fut in enumerate(cf.as_completed(futures), 1):
                row = fut.result()
                f.write(json.dumps(row) + "\n")
                f.flush()
                done[_job_key(futures[fut])] = row
                print(f"[{k}/{len(todo)}] {_describe(row)}", file=sys.stderr, flush=True)
    return [done[_job_key(j)] for j in jobs]


_JOB_FIELDS = (
    "dataset",
    "clients",
    "beta",
    "kind",
    "seed",
    "mechanism",
    "epsilon",
    "variant",
    "attack_clients",
)


def _describe(row: dict) -> str:
    what = row["kind"] if row["kind"] != "dp" else f"{row['mechanism']} eps {row['epsilon']:g}"
    if row["kind"] == "attack":
        basis = row["attacks"].get("basis") or row["attacks"].get("spectral") or {}
        return (
            f"attack {row['mechanism']} eps {row['epsilon']:g} ({row['variant']}): "
            f"re-identified {basis.get('reidentification_rate', float('nan')):.4f} ({row['seconds']:.0f} s)"
        )
    return f"{what} seed {row['seed']}: {row['test_accuracy']:.3f} ({row['seconds']:.0f} s)"


# ------------------------------------------------------------------------------------- summary
def _stats(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "n": len(values),
        "values": values,
    }


def summarise(rows: list[dict], epsilons: list[float], mechanisms: list[str]) -> dict:
    train = [r for r in rows if r["kind"] != "attack"]
    refs = {
        k: _stats([r["test_accuracy"] for r in train if r["kind"] == k])
        for k in ("distgat", "fedgat", "edges")
    }
    dp: dict[str, dict[str, dict]] = {}
    for m in mechanisms:
        dp[m] = {}
        for eps in epsilons:
            got = [r for r in train if r["kind"] == "dp" and r["mechanism"] == m and r["epsilon"] == eps]
            if got:
                dp[m][f"{eps:g}"] = {
                    **_stats([r["test_accuracy"] for r in got]),
                    "epsilon_spent": max(r["epsilon_spent"] for r in got),
                }
    attacks = [
        {k: r[k] for k in ("mechanism", "epsilon", "variant", "attack_clients", "attacks", "null_attacks")}
        for r in rows
        if r["kind"] == "attack"
    ]
    return {
        "references": refs,
        "dp": dp,
        "attacks": attacks,
        "targets": targets(refs, dp.get(DEFAULT_MECHANISM, {})),
    }


def targets(refs: dict, default: dict) -> list[dict]:
    """The issue's targets for the default mechanism, each with its measured value and verdict."""
    floor = refs["distgat"]["mean"]
    out = []
    for eps, row in default.items():
        out.append(
            {
                "target": f"epsilon {eps}: >= DistGAT ({floor:.3f})",
                "measured": row["mean"],
                "met": row["mean"] >= floor,
            }
        )
    if "4" in default:
        out.append(
            {
                "target": f"epsilon 4: >= {TARGET_AT_4}",
                "measured": default["4"]["mean"],
                "met": default["4"]["mean"] >= TARGET_AT_4,
            }
        )
    if "1" in default:
        want = floor + MARGIN_AT_1
        out.append(
            {
                "target": f"epsilon 1: >= DistGAT + 3 points ({want:.3f})",
                "measured": default["1"]["mean"],
                "met": default["1"]["mean"] >= want,
            }
        )
    return out


# -------------------------------------------------------------------------------------- output
def render(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "dp_sweep.json", out / "dp_sweep.md", out / "dp_sweep.png"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    s, refs = result["summary"], result["summary"]["references"]
    eps_cols = [f"{e:g}" for e in result["epsilons"]]

    def cell(st: dict | None) -> str:
        if not st:
            return "-"
        n = "" if st["n"] == result["seeds"] else f" (n={st['n']})"
        return f"{st['mean']:.3f} +- {st['std']:.3f}{n}"

    lines = [
        "# DP release of the shared rows: accuracy against not sharing, and the attacks against a null release",
        "",
        (
            f"{result['dataset']}, {result['clients']} clients, Dirichlet beta {result['beta']:g}, public split, "
            f"strategy FedAdam (the default) for every row, {result['seeds']} seeds (test accuracy at the "
            f"round of best validation accuracy, mean +- sample std). Each DP row: the release in the block "
            f"layout of `fedgat.dp` (own rows clean, every foreign row released), delta 1e-5, each owner's "
            f"ledger charged exactly that release. Machine: {result['machine']}, {result['cpus']} CPU(s), "
            f"{result['date']}. Command: `{result['command']}`."
        ),
        "",
        "| row | " + " | ".join(f"eps {e}" for e in eps_cols) + " |",
        "|---|" + "---|" * len(eps_cols),
        f"| DistGAT (nothing shared) | {cell(refs['distgat'])} |" + " |" * (len(eps_cols) - 1),
        f"| FedGAT, edges only (no foreign feature; eps -> 0) | {cell(refs['edges'])} |"
        + " |" * (len(eps_cols) - 1),
        f"| FedGAT, rows in the clear (no DP) | {cell(refs['fedgat'])} |" + " |" * (len(eps_cols) - 1),
    ]
    for m, per in s["dp"].items():
        name = f"**FedGAT + {m}** (default)" if m == DEFAULT_MECHANISM else f"FedGAT + {m}"
        lines.append(f"| {name} | " + " | ".join(cell(per.get(e)) for e in eps_cols) + " |")
    lines += ["", "Targets (default mechanism):", ""]
    for t in s["targets"]:
        lines.append(f"- {t['target']}: {t['measured']:.3f} -- {'met' if t['met'] else 'MISSED'}")
    lines += [
        "",
        (
            f"## Client-side attacks against the release (seed {result['first_seed']}, the first "
            f"{result['attack_clients']} clients' views)"
        ),
        "",
        (
            "Recovered: foreign neighbours whose true feature row the attack (after the attacker's decoding "
            "of the release, `fedgat.attacks.release_decoder`) gets at cosine >= 0.99; re-identified: the "
            "guess is nearest to the right node among all other clients' nodes. Null release: the same "
            "mechanism on shuffled rows (chance under the same oracle scoring). Without DP the basis attack "
            "recovers every foreign neighbour."
        ),
        "",
        "| mechanism | variant | epsilon | attack | recovered | re-identified | re-identified, null release |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in s["attacks"]:
        for name, sc in a["attacks"].items():
            null = a["null_attacks"].get(name, {})
            lines.append(
                f"| {a['mechanism']} | {a['variant']} | {a['epsilon']:g} | {name} | "
                f"{sc['recovered_fraction']:.4f} | {sc['reidentification_rate']:.4f} | "
                f"{null.get('reidentification_rate', float('nan')):.4f} |"
            )
    lines += ["", result["verdict"], ""]
    paths[1].write_text("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    xs = result["epsilons"]
    for m, per in s["dp"].items():
        pts = [(float(e), v) for e, v in per.items()]
        ax.errorbar(
            [p[0] for p in pts],
            [p[1]["mean"] for p in pts],
            yerr=[p[1]["std"] for p in pts],
            marker="o",
            capsize=3,
            lw=2.0 if m == DEFAULT_MECHANISM else 1.0,
            label=f"FedGAT + {m}",
        )
    for key, label, style in (
        ("fedgat", "FedGAT, no DP", "--"),
        ("edges", "FedGAT, edges only", "-."),
        ("distgat", "DistGAT (nothing shared)", ":"),
    ):
        ax.axhline(refs[key]["mean"], ls=style, color="grey", lw=1)
        ax.text(xs[0], refs[key]["mean"] + 0.004, label, fontsize=7, color="grey")
    ax.axhline(TARGET_AT_4, color="red", lw=0.5, alpha=0.4)
    ax.set_xscale("log")
    ax.set_xlabel("epsilon per node (delta 1e-5)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{result['dataset']}, {result['clients']} clients, beta {result['beta']:g}")
    ax.legend(fontsize=7, loc="lower right")
    for m in {a["mechanism"] for a in s["attacks"]}:
        got = sorted(
            (a["epsilon"], a) for a in s["attacks"] if a["mechanism"] == m and a["variant"] == "vector"
        )
        if not got:
            continue
        (line,) = bx.plot(
            [e for e, _ in got],
            [a["attacks"]["basis"]["reidentification_rate"] for _, a in got],
            "o-",
            label=f"{m}",
        )
        bx.plot(
            [e for e, _ in got],
            [a["null_attacks"]["basis"]["reidentification_rate"] for _, a in got],
            "x--",
            color=line.get_color(),
            label=f"{m}, null release",
        )
    bx.set_xscale("log")
    bx.set_xlabel("epsilon per node")
    bx.set_ylabel("basis attack: re-identified")
    bx.set_title("basis attack (no DP: 0.99)")
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=120)
    plt.close(fig)
    return paths


def verdict(summary: dict) -> str:
    refs, tg = summary["references"], summary["targets"]
    missed = [t for t in tg if not t["met"]]
    edge_gain = refs["edges"]["mean"] - refs["distgat"]["mean"]
    return (
        f"Verdict: {DEFAULT_MECHANISM} meets {len(tg) - len(missed)} of {len(tg)} targets"
        + (f" (missed: {'; '.join(t['target'] for t in missed)})" if missed else "")
        + f". The cross-client edges alone (no foreign feature) are worth {edge_gain * 100:+.1f} points over "
        "DistGAT: most of what DP FedGAT gains at small epsilon is the structure, which no release "
        "protects (SECURITY.md)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--mechanisms", nargs="+", default=["label_rr", "gaussian", "multibit"])
    parser.add_argument(
        "--secondary-seeds",
        type=int,
        default=None,
        help="seeds for the no-DP FedGAT row and the non-default mechanisms (default: --seeds)",
    )
    parser.add_argument(
        "--secondary-epsilons",
        type=float,
        nargs="+",
        default=None,
        help="epsilons for the non-default mechanisms (default: --epsilons)",
    )
    parser.add_argument(
        "--attack-mechanisms",
        nargs="+",
        default=None,
        help="mechanisms whose releases the attacks audit (default: --mechanisms)",
    )
    parser.add_argument("--attack-clients", type=int, default=3)
    parser.add_argument("--matrix-attacks", action="store_true", help="also the matrix variant's attacks")
    parser.add_argument("--jobs", type=int, default=max(1, len(os.sched_getaffinity(0))))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--cache", type=Path, default=None, help="JSON lines of finished runs (resume)")
    args = parser.parse_args(argv)
    cache = args.cache if args.cache is not None else args.out / "dp_sweep_runs.jsonl"
    rows = run_all(jobs_for(args), cache, args.jobs)
    summary = summarise(rows, args.epsilons, args.mechanisms)
    result = {
        "dataset": args.dataset,
        "clients": args.clients,
        "beta": args.beta,
        "seeds": args.seeds,
        "first_seed": args.first_seed,
        "epsilons": args.epsilons,
        "mechanisms": args.mechanisms,
        "secondary_seeds": args.secondary_seeds,
        "secondary_epsilons": args.secondary_epsilons,
        "attack_mechanisms": args.attack_mechanisms or args.mechanisms,
        "attack_clients": args.attack_clients,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "date": dt.date.today().isoformat(),
        "command": "python benchmarks/dp_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "summary": summary,
        "runs": rows,
    }
    result["verdict"] = verdict(summary)
    for path in render(result, args.out):
        print(path)
    print(result["verdict"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
