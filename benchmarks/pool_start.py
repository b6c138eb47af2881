"""How long the server's round pool takes to start: its recipients' setup as files vs as initializer arguments.

    python benchmarks/pool_start.py                       # 10 recipients, 2 / 4 / 8 workers
    python benchmarks/pool_start.py --workers 16 --recipients 10

A :class:`~fedgat.crypto.encoders.RoundPool` spawns its workers, each of which loads every recipient's
public context and spool index. Multiprocessing's "spawn" writes a new worker's initializer
arguments into its start-up pipe in one piece, and the worker reads them only after importing the
parent's ``__main__``: arguments larger than the pipe's buffer (64 KiB on Linux; one n4096 public
context is ~140 KB) hold the parent at each worker until that import is done, so the workers start
one after another. The pool now hands them setup files
(:func:`~fedgat.crypto.tasks.worker_init_from_setups`); the ``arguments`` rows start the same
workers the way it used to (:func:`~fedgat.crypto.tasks.worker_init_round` with every context in its
arguments), alternating with the ``files`` rows, ``--repeats`` times each.

Start: from the pool's construction until every worker has answered one task held at a barrier
(so that each has started and initialised). ``--main-import-s`` makes this script's ``__main__``
cost that many CPU seconds to import in each worker, standing in for a heavier main module (the
H200 host's workers took ~0.4 s each). Writes ``<--name>.json`` / ``.md`` (default ``pool_start``)
to ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

if __name__ == "__mp_main__" and os.environ.get("FEDGAT_POOL_START_MAIN_S"):
    _until = time.process_time() + float(os.environ["FEDGAT_POOL_START_MAIN_S"])
    while time.process_time() < _until:  # a heavier __main__, imported again by every spawned worker
        pass


def recipients_setup(count: int, nodes: int = 4):
    """``count`` recipients, each its own key and a spool of ``nodes`` uploads: ``(contexts, spools,
    layout)``, ``contexts[key]`` the public context bytes."""
    import numpy as np

    from fedgat.crypto import KeyHolderContext, ServerContext, SlotLayout, packing
    from fedgat.crypto.encodings import CiphertextSpool

    layout: SlotLayout | None = None
    contexts, spools = {}, {}
    rng = np.random.default_rng(0)
    for key in range(count):
        holder = KeyHolderContext.generate("n4096")
        server = ServerContext.from_bytes(holder.public_context_bytes())
        layout = layout or SlotLayout.for_dimension(64, server.slots)
        spool = CiphertextSpool(server, layout)
        for j in range(nodes):
            for ch, vec in enumerate(layout.pack_row(rng.uniform(-1, 1, layout.d))):
                spool.put(j, ch, packing.serialize(holder, holder.encrypt_vector(vec)))
        contexts[key], spools[key] = server.public_context_bytes(), spool
    return contexts, spools, layout


def start_once(mode: str, contexts: dict, spools: dict, layout, workers: int, manager) -> float:
    """Seconds from the pool's construction until each of its ``workers`` answered at a barrier."""
    from fedgat.crypto.encoders import RoundPool
    from fedgat.crypto.tasks import worker_init_round, worker_pid

    barrier = manager.Barrier(workers)
    start = time.perf_counter()
    if mode == "files":
        pool = RoundPool({k: (contexts[k], spools[k]) for k in contexts}, layout, "compact", workers)
        executor, close = pool.executor, pool.close
    else:  # the setup in the initializer's arguments, as RoundPool started its workers before
        setup = {k: (contexts[k], *spools[k].snapshot()) for k in contexts}
        executor = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=worker_init_round,
            initargs=(setup, layout, "compact"),
        )
        close = executor.shutdown
    try:
        assert executor is not None
        pids = {f.result() for f in [executor.submit(worker_pid, barrier) for _ in range(workers)]}
        elapsed = time.perf_counter() - start
    finally:
        close()
    assert len(pids) == workers
    return elapsed


def run(workers: list[int], recipients: int, repeats: int) -> dict:
    contexts, spools, layout = recipients_setup(recipients)
    manager = multiprocessing.get_context("spawn").Manager()
    rows = []
    try:
        start_once("files", contexts, spools, layout, 1, manager)  # warm the page cache
        for n in workers:
            times: dict[str, list[float]] = {"arguments": [], "files": []}
            for _ in range(repeats):
                for mode in ("arguments", "files"):
                    times[mode].append(start_once(mode, contexts, spools, layout, n, manager))
            med = {m: statistics.median(v) for m, v in times.items()}
            rows.append(
                {
                    "workers": n,
                    "arguments_s": times["arguments"],
                    "files_s": times["files"],
                    "median_arguments_s": med["arguments"],
                    "median_files_s": med["files"],
                    "files_vs_arguments": med["files"] / med["arguments"],
                }
            )
            print(
                f"{n:>3} workers: arguments {med['arguments']:.2f} s, files {med['files']:.2f} s "
                f"({med['files'] / med['arguments']:.2f}x)",
                flush=True,
            )
    finally:
        manager.shutdown()
        for spool in spools.values():
            spool.close()
    import pickle

    return {
        "recipients": recipients,
        "public_context_bytes": len(next(iter(contexts.values()))),
        "initargs_bytes": {
            # what "spawn" pickles into every worker's start-up pipe, either way
            "arguments": len(pickle.dumps({k: (contexts[k], "/tmp/spool", {}) for k in contexts})),
            "files": len(pickle.dumps({k: f"/tmp/fedgat-pool-xxxxxxxx/start-{k}.npz" for k in contexts})),
        },
        "repeats": repeats,
        "main_import_s": float(os.environ.get("FEDGAT_POOL_START_MAIN_S", "0") or 0),
        "rows": rows,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        },
    }


def markdown(result: dict) -> str:
    m = result["machine"]
    rows = [
        "# Round pool start: recipients' setup as files vs as initializer arguments",
        "",
        (
            f"{result['recipients']} recipients (public context {result['public_context_bytes'] / 1e3:.0f} KB "
            f"each; pickled into each worker's start-up pipe: {result['initargs_bytes']['arguments'] / 1e3:.0f} KB "
            f"as arguments, {result['initargs_bytes']['files'] / 1e3:.1f} KB as file paths), medians of "
            f"{result['repeats']} alternating starts; this script's `__main__` costs each worker "
            f"{result['main_import_s']:.2f} CPU-s more to import. Machine: {m['cpus']} CPU(s), {m['platform']}, "
            f"Python {m['python']}, {m['date']}. Generated by `benchmarks/pool_start.py`."
        ),
        "",
        "| workers | arguments s | files s | files / arguments |",
        "|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        rows.append(
            f"| {r['workers']} | {r['median_arguments_s']:.2f} | {r['median_files_s']:.2f} | "
            f"**{r['files_vs_arguments']:.2f}x** |"
        )
    rows += [
        "",
        (
            "Start: from the pool's construction until every worker has answered a task held at a barrier. "
            "`arguments`: every recipient's context in the initializer's arguments (how `RoundPool` started "
            "its workers before); `files`: setup files, the arguments a few paths (`worker_init_from_setups`)."
        ),
    ]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--recipients", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--main-import-s",
        type=float,
        default=0.0,
        help="extra CPU seconds each worker spends importing __main__",
    )
    parser.add_argument("--name", default="pool_start")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.workers) or args.recipients < 1 or args.repeats < 1:
        parser.error("--workers, --recipients and --repeats must be at least 1")
    if args.main_import_s:
        os.environ["FEDGAT_POOL_START_MAIN_S"] = str(args.main_import_s)  # the spawned workers inherit it
    result = run(args.workers, args.recipients, args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
