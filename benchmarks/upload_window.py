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
Writes ``<--name>.json`` / ``.md`` (default ``upload_window``) to ``--out`` (default ``benchmarks/results``).

``--engine inprocess`` runs every party in this process instead (the server's pool, ``--workers``, is
then the only other processes), and ``--pool-per-recipient`` also runs each window the way windowed
rounds computed before one pool served them all: a pool started for each recipient (what a factory
without ``add_recipient`` gets, e.g. Ray's), side by side; with the in-process engine each row counts
the server pools started.
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
from fedgat.crypto.encoders import EncoderFactory, LocalEncoderFactory, RoundPool
from fedgat.protocols import InProcessTransport

RESULTS = Path(__file__).resolve().parent / "results"


def _window(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


class _PoolPerRecipient(LocalEncoderFactory):
    """The default factory without ``add_recipient``: a windowed round's server starts a pool for
    each recipient (the path before one pool served them all)."""

    add_recipient = None  # type: ignore[assignment]


class _PerRecipientTransport(InProcessTransport):
    def encoder_factory(self, workers: int | None = None) -> EncoderFactory:
        return _PoolPerRecipient(workers)


def run(
    nodes: int,
    clients: int,
    windows: list[int | None],
    repeats: int,
    workers: int | None,
    seed: int,
    engine_name: str = "process",
    pool_per_recipient: bool = False,
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
    modes = [(w, False) for w in windows]
    if pool_per_recipient:
        modes += [(w, True) for w in windows if w is not None]
    pools = [0]  # server pools started in this process
    init = RoundPool.__init__

    def counted(self, *args, **kwargs) -> None:
        pools[0] += 1
        init(self, *args, **kwargs)

    engine = ProcessEngine(min(clients, os.cpu_count() or 1)) if engine_name == "process" else None
    RoundPool.__init__ = counted  # type: ignore[method-assign]
    try:
        for rep in range(repeats):
            for window, per_recipient in modes:
                if per_recipient and engine is not None:
                    raise SystemExit("--pool-per-recipient needs --engine inprocess")
                transport = (
                    engine.transport()
                    if engine is not None
                    else (_PerRecipientTransport() if per_recipient else InProcessTransport())
                )
                pools[0] = 0
                pre = run_encrypted_pretraining(
                    graph,
                    partition,
                    seed=seed,
                    transport=transport,
                    progress=False,
                    workers=workers,
                    upload_window=window,
                )
                row = {
                    "window": window,
                    "pool_per_recipient": per_recipient,
                    "repeat": rep,
                    "wall_s": round(pre.wall_seconds, 3),
                    "server_compute_s": round(pre.phases.get("server_compute", 0.0), 3),
                    "server_pools_started": pools[0] if engine is None else None,
                    "peak_spooled_bytes": pre.peak_spooled_bytes,
                    "bytes_up": pre.bytes_up,
                    "ciphertexts_up": pre.ciphertexts_up,
                    "ciphertexts_down": pre.ciphertexts_down,
                    "server_workers": pre.server_workers,
                    "max_abs_error": max_abs_error(pre.encodings, plain),
                }
                runs.append(row)
                print(json.dumps(row), flush=True)
    finally:
        RoundPool.__init__ = init  # type: ignore[method-assign]
        if engine is not None:
            engine.shutdown()
    summary = []
    for window, per_recipient in modes:
        mine = [r for r in runs if r["window"] == window and r["pool_per_recipient"] == per_recipient]
        summary.append(
            {
                "window": window,
                "pool_per_recipient": per_recipient,
                "wall_s_median": statistics.median(r["wall_s"] for r in mine),
                "server_compute_s_median": statistics.median(r["server_compute_s"] for r in mine),
                "server_pools_started": mine[0]["server_pools_started"],
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
        "engine": engine_name,
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


def write(result: dict, out: Path, notes: str = "", name: str = "upload_window") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / f"{name}.json", out / f"{name}.md"
    engine = result.get("engine", "process")
    engine_text = "process engine" if engine == "process" else "every party in one process"
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
            f"features), vector variant, n4096, {engine_text}; windows alternated, {result['repeats']} "
            f"run(s) each. Machine: {m['platform']}, {m['cpus']} CPU(s), {m['date']}; load average "
            f"{m['load_average_before_after'][0]} before, {m['load_average_before_after'][1]} after. "
            "Generated by `benchmarks/upload_window.py`."
        ),
        "",
        (
            "| upload window | server pools | wall s (median) | wall vs no window | server compute s | "
            "peak spool MB | spool vs no window | max abs error |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in result["summary"]:
        label = "none (all uploads, then compute)" if s["window"] is None else f"{s['window']} recipient(s)"
        started = s.get("server_pools_started")
        pools = "a pool per recipient" if s.get("pool_per_recipient") else "one for the round"
        if started is not None:
            pools += f" ({started} started)"
        compute = s.get("server_compute_s_median")
        lines.append(
            f"| {label} | {pools} | {s['wall_s_median']:.1f} | {s['wall_vs_no_window']:.2f} | "
            f"{'-' if compute is None else f'{compute:.1f}'} | {s['peak_spooled_bytes'] / 1e6:.1f} | "
            f"{s['spool_vs_no_window']:.2f} | {s['max_abs_error']:.1e} |"
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
    parser.add_argument("--engine", choices=("process", "inprocess"), default="process")
    parser.add_argument(
        "--pool-per-recipient",
        action="store_true",
        help="also run each window with a server pool per recipient (the path before; --engine inprocess)",
    )
    parser.add_argument("--notes", default="")
    parser.add_argument("--name", default="upload_window", help="file name stem of the results")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.pool_per_recipient and args.engine != "inprocess":
        parser.error(
            "--pool-per-recipient needs --engine inprocess (the server's pools are counted in this process)"
        )
    result = run(
        args.nodes,
        args.clients,
        args.windows,
        args.repeats,
        args.workers,
        args.seed,
        args.engine,
        args.pool_per_recipient,
    )
    paths = write(result, args.out, args.notes, args.name)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
