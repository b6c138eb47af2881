"""CPU seconds the server's *main process* spends per GB while it handles uploads and sends results.

    python benchmarks/server_serial.py --dataset synthetic --nodes 300 --clients 4
    PYTHONPATH=/path/to/another/tree python benchmarks/server_serial.py ...   # the same for other code
    python benchmarks/server_serial.py --compare /path/to/another/src --runs 2 --out benchmarks/results

``--compare SRC`` runs this script in subprocesses, alternately with the code under ``SRC`` (a
``PYTHONPATH`` entry holding another ``fedgat`` package, e.g. a ``git worktree``'s ``src`` with
``crypto``, ``protocols`` and ``benchmarks`` linked into ``src/fedgat``) and with this checkout, ``--runs``
times each, and writes the rows and their ratios to ``--out`` as ``server_serial_compare.{json,md}``
(``--name`` for another stem).

Runs the encrypted round once on the process engine (clients in worker processes, the server's
homomorphic work on its own pool), so this process holds the server's state machine, the framing
and the transport only. Prints one JSON line: the server party's CPU clock of the ``upload`` phase
(decode, signature, ciphertext checks, spool) and of the ``download`` phase (framing and signing its
results) per GB of frames up / down, and this process's whole CPU for the round. ``--profile PATH``
also writes a cProfile (main thread, CPU time) of the round. Compare two versions of the code by
running each in turn on the same arguments (same graph, partition and seeds, so the same sizes).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

#: the per-GB quantities compared by ``--compare``
COMPARED = ("upload_s_per_gb", "download_s_per_gb", "main_process_s_per_gb", "main_process_ms_per_result")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synthetic", choices=("cora", "citeseer", "synthetic"))
    parser.add_argument("--nodes", type=int, default=300, help="synthetic only")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default=None, help="write a cProfile of the round here")
    parser.add_argument("--compare", default=None, metavar="SRC", help="the other code's PYTHONPATH entry")
    parser.add_argument("--runs", type=int, default=2, help="--compare: runs of each version")
    parser.add_argument("--out", default="benchmarks/results", help="--compare: where the results go")
    parser.add_argument("--name", default="server_serial_compare", help="--compare: file name stem")
    parser.add_argument("--label", default="", help="--compare: what the two versions are (Markdown)")
    args = parser.parse_args(argv)
    if args.compare is not None:
        return compare(args, sys.argv[1:] if argv is None else list(argv))

    import torch

    from fedgat.benchmarks.overhead import load_graph
    from fedgat.methods import fedgat_partition, resolve_hparams
    from fedgat.pipeline import run_encrypted_pretraining
    from fedgat.protocols.pretrain_server import ServerPretrain
    from fedgat.protocols.process_engine import ProcessEngine

    torch.set_num_threads(1)
    servers: list[ServerPretrain] = []
    init = ServerPretrain.__init__

    def keep(self, *a, **k):  # the server party the pipeline builds (its CPU clocks are read below)
        init(self, *a, **k)
        servers.append(self)

    ServerPretrain.__init__ = keep  # type: ignore[method-assign]
    graph = load_graph(args.dataset, args.nodes, args.seed)
    hp = resolve_hparams("fedgat", {"variant": "vector", "neighbour_cap": None})
    partition = fedgat_partition(graph, args.clients, 1.0, args.seed, hp, None)
    engine = ProcessEngine(None, threads=1)
    profile = cProfile.Profile(time.thread_time) if args.profile else None
    try:
        c0, t0 = time.process_time(), time.thread_time()
        if profile is not None:
            profile.enable()
        pre = run_encrypted_pretraining(
            graph, partition, "vector", "n4096", args.seed, engine.transport(), progress=False
        )
        if profile is not None:
            profile.disable()
        cpu, main_thread = time.process_time() - c0, time.thread_time() - t0
    finally:
        engine.shutdown()
    if profile is not None:
        profile.dump_stats(args.profile)
    clock = servers[0].cpu_timings
    results = servers[0].nodes_computed
    up, down = clock.get("upload", 0.0), clock.get("download", 0.0)
    print(
        json.dumps(
            {
                "upload_cpu_s": up,
                "download_cpu_s": down,
                "server_compute_cpu_s": clock.get("server_compute", 0.0),
                "bytes_up": pre.bytes_up,
                "bytes_down": pre.bytes_down,
                "upload_s_per_gb": up / pre.bytes_up * 1e9,
                "download_s_per_gb": down / pre.bytes_down * 1e9,
                "main_process_cpu_s": cpu,
                "main_process_s_per_gb": cpu / (pre.bytes_up + pre.bytes_down) * 1e9,
                # the main thread (state machine, submission, framing) vs the process's other threads
                # (the pool's feeder and result threads pickling tasks / unpickling results, the
                # process engine's pipe writers)
                "main_thread_cpu_s": main_thread,
                "other_threads_cpu_s": cpu - main_thread,
                "results": results,
                "main_process_ms_per_result": cpu / max(1, results) * 1e3,
            }
        )
    )
    return 0


def _one(args: argparse.Namespace, pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath is None:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, __file__, "--dataset", args.dataset, "--nodes", str(args.nodes)]
    cmd += ["--clients", str(args.clients), "--seed", str(args.seed)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    """Both versions alternately (other first), ``args.runs`` times each; JSON + Markdown."""
    rows = []
    for run in range(1, args.runs + 1):
        for version, path in (("other", args.compare), ("this", None)):
            rows.append({"version": version, "run": run, **_one(args, path)})
            print(json.dumps({k: rows[-1][k] for k in ("version", "run", *COMPARED)}), flush=True)
    mean = {
        v: {k: sum(r[k] for r in rows if r["version"] == v) / args.runs for k in COMPARED}
        for v in ("other", "this")
    }
    ratios = {k: mean["this"][k] / mean["other"][k] for k in COMPARED}
    result = {
        "command": shlex.join(["python", "benchmarks/server_serial.py", *argv]),
        "label": args.label,
        "machine": f"{os.cpu_count()} CPU(s), {platform.platform()}",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "rows": rows,
        "mean": mean,
        "ratios_this_over_other": ratios,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# The server main process's serial work per GB: two versions side by side",
        "",
        f"{args.label}".strip(),
        "",
        (
            f"`{result['command']}`; {result['machine']}; {result['date']}. CPU seconds "
            "(`time.process_time`) of the server party's upload and download phases per GB of frames, "
            "and of the whole main process per GB and per result; the versions alternate, other first."
        ),
        "",
        "| version | run | upload s/GB | download s/GB | main process s/GB | main process ms/result |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {r['version']} | {r['run']} | " + " | ".join(f"{r[k]:.2f}" for k in COMPARED) + " |"
            for r in rows
        ),
        "| **this / other (means)** | | " + " | ".join(f"**{ratios[k]:.2f}x**" for k in COMPARED) + " |",
        "",
    ]
    (out / f"{args.name}.md").write_text("\n".join(lines))
    print(f"wrote {out / args.name}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
