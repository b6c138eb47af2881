"""The encrypted pre-training round with every client in this process (``inprocess``) against the clients
in worker processes (``process``, :mod:`fedgat.protocols.process_engine`).

    python benchmarks/engines.py --dataset synthetic --nodes 500 --clients 10      # a small graph
    python benchmarks/engines.py --dataset cora --clients 10 --append              # add Cora to the file
    python benchmarks/engines.py --dataset cora --clients 10 --configs inprocess process:1 --append

Each run is ``benchmarks/overhead.py --no-train`` in a fresh interpreter (so no run inherits another's
imports, caches or pools), one configuration after another and ``--repeats`` times round robin, so
that drift in the machine's load hits every configuration alike. A configuration is ``ENGINE`` or
``ENGINE:SERVER_WORKERS`` (the server's process pool; default: overhead.py's, every core). The
1-minute load average before and after each run is recorded with it: on a machine shared with other
jobs, wall times are upper bounds, and the CPU seconds per phase (every process of the run: this
one, the server's pool, the client workers) and the wall seconds of the round's stretches (read off
the frames, ``WINDOWS`` in overhead.py) say more than the round's wall time alone.

Writes ``engines.json`` (every run, appended with ``--append``) and ``engines.md`` into ``--out``
(default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
OVERHEAD = Path(__file__).resolve().parent / "overhead.py"
PHASES = ("keygen", "encrypt", "upload", "server_compute", "download", "decrypt")


def parse_config(text: str) -> tuple[str, int | None]:
    """``"process"`` -> ("process", None); ``"process:1"`` -> ("process", 1)."""
    engine, _, workers = text.partition(":")
    if engine not in ("inprocess", "process"):
        raise argparse.ArgumentTypeError(f"unknown engine {engine!r}")
    return engine, (int(workers) if workers else None)


def one(args: argparse.Namespace, engine: str, server_workers: int | None) -> dict:
    """One overhead run in a fresh interpreter; the fields this comparison reads."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, str(OVERHEAD), "--dataset", args.dataset, "--clients", str(args.clients)]
        cmd += ["--no-train", "--engine", engine, "--json", str(out), "--out", tmp, "--seed", str(args.seed)]
        if args.nodes is not None:
            cmd += ["--nodes", str(args.nodes)]
        if server_workers is not None:
            cmd += ["--workers", str(server_workers)]
        if engine == "process" and args.actors is not None:
            cmd += ["--actors", str(args.actors)]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        r = json.loads(out.read_text())
    e = r["encrypted"]
    return {
        "dataset": r["dataset"],
        "num_nodes": r["num_nodes"],
        "clients": r["clients"],
        "variant": r["variant"],
        "preset": r["preset"],
        "engine": r.get("engine", engine),
        "server_workers": e["server_workers"],
        "client_workers": e.get("client_workers", {}),
        "wall_s": r["wall_s"],
        "critical_path_s": r["critical_path_s"],
        "round_cpu_s": e["phases"]["round"]["cpu"],
        "phases_cpu_s": {p: e["phases"][p]["cpu"] for p in PHASES},
        "phases_wall_summed_s": {p: e["phases"][p]["wall"] for p in PHASES},
        "windows_s": e.get("windows", {}),
        "server_compute_span_s": e["server_compute_span"],
        "server_compute_alone_s": e["server_compute_alone"],
        "bytes_up": e["bytes_up"],
        "bytes_down": e["bytes_down"],
        "messages": e["messages_up"] + e["messages_down"],
        "max_abs_error": e["max_abs_error"],
        "peak_rss_main": e["main_process_peak_rss"],
        "peak_rss_all_processes_at_most": e["peak_rss_all_processes_at_most"],
        "load_average_before_after": r["machine"].get("load_average_before_after"),
        "cores": r["cores"],
        "date": r["date"],
    }


# ---------------------------------------------------------------------------------------- report
def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _gb(x: float) -> str:
    return f"{x / 2**30:.2f}"


def label(run: dict) -> str:
    workers = run["server_workers"] or "inline"
    clients = run["client_workers"].get("workers") if run["client_workers"] else None
    hosts = f", {clients} client workers" if clients else ""
    return f"{run['engine']} (server pool {workers}{hosts})"


def render(runs: list[dict]) -> str:
    """engines.md: per setting, a table of runs, then the per-phase CPU and the speedups of the mean
    process run over the mean in-process run."""
    lines = [
        "# Engines: the encrypted round in process vs in worker processes",
        "",
        (
            "Made by `python benchmarks/engines.py` (each run is `benchmarks/overhead.py --no-train` in a fresh "
            "interpreter; configurations round robin). `wall` is the round's wall time (for the process engine "
            "it includes starting the worker pool and placing the clients, which imports torch in every "
            "worker); `CPU` is every process of the run (this one, the server's pool, the client workers). "
            "Load: the 1-minute load average before/after the run; the machine was shared with other jobs, "
            "so wall times are upper bounds and CPU seconds per phase are the steadier measure."
        ),
    ]
    settings: dict[tuple, list[dict]] = {}
    for run in runs:
        settings.setdefault((run["dataset"], run["num_nodes"], run["clients"], run["variant"]), []).append(
            run
        )
    for (dataset, nodes, clients, variant), group in settings.items():
        lines += [
            "",
            (
                f"## {dataset} ({nodes} nodes), {clients} clients, {variant}, {group[0]['preset']}, "
                f"{group[0]['cores']} cores"
            ),
            "",
            (
                "| run | date | load before/after | wall s | CPU s | critical path s | client workers: start s, "
                "placement s | peak RSS all processes GB | max error |"
            ),
            "|---|---|---|---:|---:|---:|---|---:|---:|",
        ]
        for run in group:
            cw = run["client_workers"]
            hosts = f"{cw['start_seconds']:.2f}, {cw['placement_seconds']:.1f}" if cw else "-"
            load = run["load_average_before_after"] or [None, None]
            lines.append(
                f"| {label(run)} | {run['date'][:16]} | {load[0]} / {load[1]} | {run['wall_s']:.1f} | "
                f"{run['round_cpu_s']:.1f} | {run['critical_path_s']:.1f} | {hosts} | "
                f"{_gb(run['peak_rss_all_processes_at_most'])} | {run['max_abs_error']:.1e} |"
            )
        configs: dict[str, list[dict]] = {}
        for run in group:
            configs.setdefault(label(run), []).append(run)
        names = list(configs)
        lines += [
            "",
            (
                "CPU seconds per phase (summed over the parties, each measured in its own process; mean of "
                "the runs) and the wall seconds of the round's stretches (mean):"
            ),
            "",
            "| | " + " | ".join(names) + " |",
            "|---|" + "---:|" * len(names),
        ]

        def mean(rows: list[dict], get) -> float | None:
            values = [v for v in (get(r) for r in rows) if v is not None]
            return sum(values) / len(values) if values else None

        for phase in PHASES:
            lines.append(
                f"| CPU {phase} | "
                + " | ".join(_s(mean(configs[n], lambda r, p=phase: r["phases_cpu_s"][p])) for n in names)
                + " |"
            )
        windows = list(group[0]["windows_s"])
        for window in windows:
            lines.append(
                f"| wall {window} | "
                + " | ".join(_s(mean(configs[n], lambda r, w=window: r["windows_s"].get(w))) for n in names)
                + " |"
            )
        lines.append(
            "| wall round | " + " | ".join(_s(mean(configs[n], lambda r: r["wall_s"])) for n in names) + " |"
        )
        base = next((n for n in names if n.startswith("inprocess")), None)
        if base is not None:
            lines += ["", f"Speedup over {base} (mean wall of the same stretch, in-process / this):", ""]
            for n in names:
                if n == base:
                    continue
                parts = []
                for key, get in [("round", lambda r: r["wall_s"])] + [
                    (w, lambda r, w=w: r["windows_s"].get(w)) for w in windows
                ]:
                    a, b = mean(configs[base], get), mean(configs[n], get)
                    parts.append(f"{key} {a / b:.2f}x" if a and b else f"{key} -")
                lines.append(f"- {n}: " + ", ".join(parts))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synthetic", choices=("cora", "citeseer", "synthetic"))
    parser.add_argument("--nodes", type=int, default=None, help="synthetic only (default overhead.py's)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--configs",
        nargs="+",
        type=parse_config,
        default=[("inprocess", None), ("process", None)],
        help="ENGINE or ENGINE:SERVER_WORKERS (default: inprocess process)",
    )
    parser.add_argument("--actors", type=int, default=None, help="process engine workers (default: cores)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--append", action="store_true", help="add to engines.json instead of replacing it")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    path = args.out / "engines.json"
    runs: list[dict] = json.loads(path.read_text())["runs"] if args.append and path.exists() else []
    for _ in range(args.repeats):
        for engine, workers in args.configs:
            run = one(args, engine, workers)
            print(
                f"{label(run)}: wall {run['wall_s']:.1f} s, CPU {run['round_cpu_s']:.1f} s, load "
                f"{run['load_average_before_after']}",
                flush=True,
            )
            runs.append(run)
            args.out.mkdir(parents=True, exist_ok=True)
            machine = {"platform": platform.platform(), "python": platform.python_version()}
            machine["cores"] = len(os.sched_getaffinity(0))
            stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            path.write_text(json.dumps({"machine": machine, "updated": stamp, "runs": runs}, indent=2) + "\n")
            (args.out / "engines.md").write_text(render(runs))
    print(f"wrote {path} and {args.out / 'engines.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
