"""The upload window side by side: the server's spool and the round's wall time, with and without it.

    python benchmarks/upload_window.py --nodes 500 --clients 10 --windows none 1 2

Runs the encrypted pre-training round on the same ogbn-arxiv-like synthetic graph
(:func:`fedgat.benchmarks.graph_scale.arxiv_like`: 128 features, mean degree 13.8) and partition once per
upload window (``none``: every upload before compute, the default), on the process engine (clients
in worker processes, the server's homomorphic work on its own pool, ``--workers``), alternating the
windows ``--repeats`` times. Per run: wall seconds, the most bytes of uploads the server's spool held
at once (:attr:`~fedgat.protocols.pretrain_server.ServerPretrain.peak_spooled_bytes`; without a
window that is every uploaded ciphertext, so ``spool vs no window`` is the fraction of the round's
uploads on disk at once), and the decryption error against the plaintext round with the same bases.
Writes ``upload_window.json`` / ``.md`` to ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
from pathlib import Path

from fedgat.benchmarks.overhead import load_average

RESULTS = Path(__file__).resolve().parent / "results"


def _window(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def run(
    nodes: int, clients: int, windows: list[int | None], repeats: int, workers: int | None, seed: int
) -> dict:
    from fedgat.benchmarks.graph_scale import arxiv_like
    from fedgat.partition import make_partition
    from fedgat.pipeline import max_abs_error, run_encrypted_pretraining, run_plaintext_pretraining
    from fedgat.protocols.process_engine import ProcessEngine

    graph = arxiv_like(nodes, seed)
    partition = make_partition(graph, clients, beta=1e4, seed=seed, num_layers=2)
    plain = run_plaintext_pretraining(graph, partition, "vector", seed)
    load_before = load_average()
    runs = []
    with ProcessEngine(min(clients, os.cpu_count() or 1)) as engine:
        for rep in range(repeats):
            for window in windows:
                pre = run_encrypted_pretraining(
                    graph,
                    partition,
                    seed=seed,
                    transport=engine.transport(),
                    progress=False,
                    workers=workers,
                    upload_window=window,
                )
                row = {
                    "window": window,
                    "repeat": rep,
                    "wall_s": round(pre.wall_seconds, 3),
                    "peak_spooled_bytes": pre.peak_spooled_bytes,
                    "bytes_up": pre.bytes_up,
                    "ciphertexts_up": pre.ciphertexts_up,
                    "ciphertexts_down": pre.ciphertexts_down,
                    "server_workers": pre.server_workers,
                    "max_abs_error": max_abs_error(pre.encodings, plain),
                }
                runs.append(row)
                print(json.dumps(row), flush=True)
    summary = []
    for window in windows:
        mine = [r for r in runs if r["window"] == window]
        summary.append(
            {
                "window": window,
                "wall_s_median": statistics.median(r["wall_s"] for r in mine),
                "peak_spooled_bytes": max(r["peak_spooled_bytes"] for r in mine),
                "max_abs_error": max(r["max_abs_error"] for r in mine),
            }
        )
    base = next((s for s in summary if s["window"] is None), summary[0])
    for s in summary:
        s["wall_vs_no_window"] = round(s["wall_s_median"] / base["wall_s_median"], 3)
        s["spool_vs_no_window"] = round(s["peak_spooled_bytes"] / base["peak_spooled_bytes"], 3)
    return {
        "benchmark": "upload_window",
        "nodes": nodes,
        "edges": int(graph.edge_index.shape[1]),
        "clients": clients,
        "repeats": repeats,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "load_average_before_after": [load_before, load_average()],
        },
        "runs": runs,
        "summary": summary,
    }


def write(result: dict, out: Path, notes: str = "") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "upload_window.json", out / "upload_window.md"
    js.write_text(json.dumps(result, indent=1) + "\n")
    m = result["machine"]
    lines = [
        (
            f"# Upload window: the server's spool and the round's wall time ({result['nodes']} nodes, "
            f"{result['clients']} clients)"
        ),
        "",
        (
            f"ogbn-arxiv-like synthetic graph ({result['nodes']} nodes, {result['edges']} directed edges, 128 "
            f"features), vector variant, n4096, process engine; windows alternated, {result['repeats']} "
            f"run(s) each. Machine: {m['platform']}, {m['cpus']} CPU(s), {m['date']}; load average "
            f"{m['load_average_before_after'][0]} before, {m['load_average_before_after'][1]} after. "
            "Generated by `benchmarks/upload_window.py`."
        ),
        "",
        (
            "| upload window | wall s (median) | wall vs no window | peak spool MB | spool vs no window | "
            "max abs error |"
        ),
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in result["summary"]:
        name = "none (all uploads, then compute)" if s["window"] is None else f"{s['window']} recipient(s)"
        lines.append(
            f"| {name} | {s['wall_s_median']:.1f} | {s['wall_vs_no_window']:.2f} | "
            f"{s['peak_spooled_bytes'] / 1e6:.1f} | {s['spool_vs_no_window']:.2f} | {s['max_abs_error']:.1e} |"
        )
    if notes:
        lines += ["", notes]
    md.write_text("\n".join(lines) + "\n")
    return [js, md]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--windows", type=_window, nargs="+", default=[None, 1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--workers", type=int, default=None, help="server pool processes (default: auto)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--notes", default="")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    result = run(args.nodes, args.clients, args.windows, args.repeats, args.workers, args.seed)
    paths = write(result, args.out, args.notes)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
