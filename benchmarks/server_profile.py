"""Where the server's CPU goes: its homomorphic work on a sample of a real round's tasks, per component.

    python benchmarks/server_profile.py                          # Cora, 10 clients, 1500 tasks
    python benchmarks/server_profile.py --dataset synthetic --nodes 300 --tasks 200

Issue 20 asks the server's compute to stay within 1.2x of its op-count bound (the SEAL operations
:class:`~fedgat.crypto.evaluator.OpCounts` counts: encodings, plaintext x ciphertext multiplies,
additions, rescales) and to find where the rest goes. This benchmark plans the round exactly as the
server does (:func:`~fedgat.protocols.pretrain_plan.plan_shares`, the session's slot layout), cuts
every recipient's shares into the encoders' tasks (:func:`~fedgat.crypto.tasks.pieces`), takes
``--tasks`` of them evenly spaced over the round (so the sample has the round's mix of small and
large nodes), spools fresh uploads for their sources and runs them through the process-pool
worker's own code (:func:`~fedgat.crypto.tasks.worker_batch_for`, spool cache and all) on one core:

1. a warm-up pass (discarded);
2. a clean pass: CPU seconds per result, and the operations the evaluator counted;
3. a pass under :mod:`cProfile`, which splits that CPU into

   * ``ops``: SEAL's encode, multiply_plain, add_inplace, rescale (what the bound counts);
   * ``seal_save``: writing each result through SEAL's save (zstd-compressed; ``sealapi`` has no
     other way out of a ciphertext, so every wire pays it) and reading the bytes back;
   * ``wire``: turning those bytes into the envelope's body (the compact wire decompresses SEAL's
     stream and bit-packs the coefficients) and the envelope's SHA-256;
   * ``loads``: reading uploads from the spool on a cache miss (expand + TenSEAL load);
   * ``copies``: TenSEAL's ``ciphertext()`` copies of each source;
   * ``other``: the rest (Python around the calls, coefficient vectors, allocation, the profiler).

With ``--workers N [M ...]`` the same tasks then run on a :class:`~fedgat.crypto.encoders.RoundPool`
of each size, as the server's round runs them (its workers' start-up paid and timed before the pass):
wall time against the op bound divided by the workers, i.e. how the server's compute scales with cores
(``benchmarks/device_check.sh server16`` on the 16-core machine).

The op-count bound uses per-operation costs measured in the same run, one core, nothing else running
(:func:`~fedgat.crypto.measure.evaluator_op_seconds`). ``floor_with_save`` adds SEAL's save (the part
no wire can avoid) to it. Every wire of ``--wires`` (the session option
:attr:`fedgat.protocols.PretrainConfig.wire`) runs the same tasks, side by side. Writes ``server_profile.json``, ``.md`` and ``.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import json
import os
import platform
import pstats
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
COMPONENTS = ("ops", "seal_save", "wire", "loads", "copies", "other")
WIRES = ("compact", "tenseal")
#: SEAL calls the bound counts (cProfile names of the sealapi builtins)
_OP_CALLS = ("encode", "multiply_plain", "add_inplace", "rescale_to_next_inplace")


def pieces_of(shares, layout, max_task_cost: int = 512) -> list:
    """One recipient's tasks, cut as the process-pool encoder cuts them."""
    from fedgat.crypto.tasks import pieces

    return list(pieces(shares, layout.chunks, layout.blocks, max_task_cost))


def sample_tasks(plan, layout, count: int, max_task_cost: int = 512) -> list:
    """``count`` of the round's tasks, evenly spaced over all recipients in the server's order."""
    assert plan.shares is not None
    every = [t for c in sorted(plan.shares) for t in pieces_of(plan.shares[c], layout, max_task_cost)]
    if count >= len(every):
        return every
    return [every[i] for i in np.linspace(0, len(every) - 1, count).round().astype(int)]


def _component_seconds(profile: cProfile.Profile) -> dict[str, float]:
    """Seconds per component (module docstring) out of one profiled pass."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    tot: dict[str, float] = {}
    cum: dict[str, float] = {}
    for (filename, _line, name), (_cc, _nc, tt, ct, _callers) in stats.items():
        key = f"{Path(filename).name}:{name}" if filename != "~" else name
        tot[key] = tot.get(key, 0.0) + tt
        cum[key] = cum.get(key, 0.0) + ct
    builtin = {k.split(".")[-1].strip(">}'"): v for k, v in tot.items() if k.startswith("<")}
    ops = sum(builtin.get(name, 0.0) for name in _OP_CALLS)
    seal_save = cum.get("evaluator.py:save", 0.0)  # _MemoryFile.save: SEAL's save, read back
    wire = cum.get("evaluator.py:result_envelope", 0.0) - seal_save
    loads = cum.get("spool.py:get", 0.0)
    copies = builtin.get("ciphertext", 0.0)
    total = sum(tot.values())
    # Python 3.12's cProfile reports no calls into TenSEAL's pybind11 bindings and loses the frames
    # around them (result_envelope, linear_map): the split would read ops 0 and a negative wire
    attributed = ops > 0 and "evaluator.py:result_envelope" in cum and wire >= 0
    return {
        "attributed": attributed,
        "ops": ops,
        "seal_save": seal_save,
        "wire": wire,
        "loads": loads,
        "copies": copies,
        "other": max(0.0, total - ops - seal_save - wire - loads - copies),
        "total": total,
    }


def profile(
    dataset: str = "Cora",
    *,
    nodes: int | None = None,
    clients: int = 10,
    beta: float = 1.0,
    variant: str = "vector",
    preset: str = "n4096",
    tasks: int = 1500,
    wires: tuple[str, ...] = WIRES,
    seed: int = 0,
    progress: bool = True,
    workers: list[int] | None = None,
) -> dict:
    """The measurement of the module docstring, as a JSON-ready dict: the same tasks in every wire
    of ``wires``, the passes of the wires interleaved (warm-ups, then clean passes, then profiles);
    with ``workers``, a pool pass of the first wire per worker count (:func:`pool_pass`)."""
    import torch
    from tqdm.auto import tqdm

    from fedgat.benchmarks.overhead import load_graph
    from fedgat.crypto import KeyHolderContext, packing
    from fedgat.crypto import tasks as worker
    from fedgat.crypto.context import ServerContext
    from fedgat.crypto.evaluator import OpCounts, evaluator_for
    from fedgat.crypto.measure import evaluator_op_seconds
    from fedgat.crypto.spool import CiphertextSpool
    from fedgat.methods import fedgat_partition, resolve_hparams
    from fedgat.protocols.pretrain_config import PretrainConfig
    from fedgat.protocols.pretrain_plan import partition_graphs, plan_shares
    from fedgat.randomness import RandomSource

    torch.set_num_threads(1)
    graph = load_graph(dataset, nodes, seed)
    hp = resolve_hparams("fedgat", {"variant": variant})
    partition = fedgat_partition(graph, clients, beta, seed, hp, None)
    config = PretrainConfig(session=1, variant=variant, preset=preset)
    holders = {w: KeyHolderContext.generate(preset, wire=w) for w in wires}
    layout = config.layout(config.row_width(graph.num_features), next(iter(holders.values())).slots)
    graphs = partition_graphs(partition, graph.num_features)
    plan = plan_shares(graphs, variant, RandomSource.from_seed(seed), layout=layout)
    round_ops = OpCounts()
    for shares in plan.shares.values():  # type: ignore[union-attr]
        for bucket in shares:
            for s in range(len(bucket)):
                round_ops += OpCounts.of_map(bucket.coefficients(s), layout)
    chosen = sample_tasks(plan, layout, tasks)
    sources = sorted({int(j) for t in chosen for j in t[1]})
    batches = list(worker.batched(iter(chosen), 8, 512, layout.chunks))

    spools: dict[str, CiphertextSpool] = {}
    states: dict[str, dict] = {}
    clean: dict[str, float] = {}
    parts: dict[str, dict[str, float]] = {}
    counted: dict[str, OpCounts] = {}
    try:
        for w, holder in holders.items():
            server = ServerContext.from_bytes(holder.public_context_bytes(), wire=w)
            spool = spools[w] = CiphertextSpool(server, layout)
            rng = np.random.default_rng(seed)  # the same rows in every wire
            for j in tqdm(sources, desc=f"uploads ({w})", unit="node", disable=not progress):
                for ch, vec in enumerate(layout.pack_row(rng.uniform(-0.05, 0.05, layout.d))):
                    spool.put(j, ch, packing.serialize(holder, holder.encrypt_vector(vec)))
            path, index = spool.snapshot()
            worker.worker_init_round({0: (server.public_context_bytes(), path, index)}, layout, wire=w)
            states[w] = dict(worker._WORKER)

        def one_pass(w: str) -> float:
            worker._WORKER.clear()
            worker._WORKER.update(states[w])
            worker._WORKER["recipients"][0][1].drop_cache()  # each pass starts like a fresh worker
            start = time.process_time()
            for batch in tqdm(batches, desc=f"tasks ({w})", unit="batch", disable=not progress, leave=False):
                worker.worker_batch_for(0, batch)
            return time.process_time() - start

        for w in wires:
            one_pass(w)  # warm-up
        for w in wires:
            evaluator = evaluator_for(states[w]["recipients"][0][0])
            evaluator.ops = OpCounts()
            clean[w] = one_pass(w)
            counted[w] = evaluator.ops
        for w in wires:
            prof = cProfile.Profile()
            prof.enable()
            one_pass(w)
            prof.disable()
            parts[w] = _component_seconds(prof)
        w = wires[0]
        server = states[w]["recipients"][0][0]
        pools = [
            pool_pass(server.public_context_bytes(), spools[w], layout, w, n, batches) for n in workers or []
        ]
    finally:
        worker._WORKER.clear()
        for spool in spools.values():
            spool.close()

    ops = counted[wires[0]]
    assert all(c == ops for c in counted.values()), "every wire runs the same operations"
    costs = evaluator_op_seconds(preset)
    results = ops.rescales
    bound = ops.seconds(costs)
    per_wire = {}
    for w in wires:
        # the profiled pass runs slower than the clean one (cProfile's own cost): scale the split to it
        scale = clean[w] / parts[w]["total"]
        split = parts[w]["attributed"]
        floor_with_save = bound + parts[w]["seal_save"] * scale if split else None
        per_wire[w] = {
            "cpu_seconds": clean[w],
            "profiled_seconds": parts[w]["total"],
            "split_attributed": split,
            "ms_per_result": (
                {k: parts[w][k] * scale / results * 1e3 for k in COMPONENTS}
                if split
                else dict.fromkeys(COMPONENTS)
            ),
            "ms_per_result_total": clean[w] / results * 1e3,
            "floor_with_save_ms_per_result": floor_with_save / results * 1e3 if floor_with_save else None,
            "ratios": {
                "cpu_vs_op_bound": clean[w] / bound,
                "cpu_vs_floor_with_save": clean[w] / floor_with_save if floor_with_save else None,
                "floor_with_save_vs_op_bound": floor_with_save / bound if floor_with_save else None,
            },
            "round_cpu_seconds_predicted": clean[w] / results * round_ops.rescales,
        }
    return {
        "dataset": graph.name,
        "nodes": graph.num_nodes,
        "features": graph.num_features,
        "clients": clients,
        "beta": beta,
        "variant": variant,
        "preset": preset,
        "layout": {"chunks": layout.chunks, "blocks": layout.blocks, "width": layout.width},
        "tasks_sampled": len(chosen),
        "sources": len(sources),
        "op_counts": ops.__dict__,
        "round_op_counts": round_ops.__dict__,
        "results": results,
        "multiply_adds_per_result": ops.multiplies / results,
        "op_seconds": costs,
        "bound_ms_per_result": bound / results * 1e3,
        "round_op_bound_cpu_seconds": round_ops.seconds(costs),
        "wires": per_wire,
        "pools": [
            {
                **pool,
                "wire": wires[0],
                "bound_seconds": bound / pool["workers"],
                "clean_pass_seconds": clean[wires[0]] / pool["workers"],
                "wall_vs_op_bound": pool["wall_seconds"] / (bound / pool["workers"]),
                "wall_vs_clean_pass": pool["wall_seconds"] / (clean[wires[0]] / pool["workers"]),
            }
            for pool in pools
        ],
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "load_average": list(os.getloadavg()),
        },
    }


def pool_pass(public_context: bytes, spool, layout, wire: str, workers: int, batches: list) -> dict:
    """The sampled batches on a :class:`~fedgat.crypto.encoders.RoundPool` of ``workers`` processes,
    as the server's round runs them (the same worker code and window of ``4 * workers`` batches;
    this profile's batches hold up to 8 tasks where the round's hold up to 32): its
    start (spawn, imports, context and spool loads, timed until every worker has answered a ping),
    the wall time of the pass, the main process's CPU in it (submitting, receiving) and the
    workers' CPU, start-up included (reaped at shutdown)."""
    import multiprocessing
    import types

    from fedgat.crypto.encoders import RoundPool
    from fedgat.crypto.measure import children_cpu_seconds
    from fedgat.crypto.tasks import run_windowed, worker_batch_for, worker_pid

    # the barrier's manager process starts (and is reaped) outside every timing
    manager = multiprocessing.get_context("spawn").Manager() if workers > 1 else None
    try:
        barrier = manager.Barrier(workers) if manager is not None else None
        before_children = children_cpu_seconds()
        start = time.perf_counter()
        pool = RoundPool({0: (public_context, spool)}, layout, wire, workers)
        try:
            executor = pool.executor
            assert executor is not None
            # one ping per worker, all held at the barrier: every worker has started before the pass
            pids = {f.result() for f in [executor.submit(worker_pid, barrier) for _ in range(workers)]}
            started = time.perf_counter() - start
            window = types.SimpleNamespace(window=4 * workers, max_in_flight=0)
            cpu, t = time.process_time(), time.perf_counter()
            results = 0
            for _, r in run_windowed(
                window,
                ((0, b) for b in batches),
                lambda key, b: executor.submit(worker_batch_for, key, b),
                lambda f: f.result(),
            ):
                results += len(r.row_blobs)
            wall, main_cpu = time.perf_counter() - t, time.process_time() - cpu
        finally:
            pool.close()  # reaps the workers: their CPU is counted below
        workers_cpu = children_cpu_seconds() - before_children
    finally:
        if manager is not None:
            manager.shutdown()
    return {
        "workers": workers,
        "workers_answered": len(pids),
        "start_seconds": started,
        "wall_seconds": wall,
        "main_process_cpu_seconds": main_cpu,
        "workers_cpu_seconds": workers_cpu,
        "results": results,
        "max_in_flight": window.max_in_flight,
    }


def markdown(result: dict) -> str:
    m, wires = result["machine"], result["wires"]
    names = list(wires)
    costs = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in result["op_seconds"].items() if k != "save")
    rows = [
        f"# Server CPU per result: {result['dataset']}, {result['clients']} clients, {result['variant']}, {result['preset']}",
        "",
        (
            f"{result['tasks_sampled']} of the round's tasks (evenly spaced over every recipient; {result['results']} "
            f"results, {result['multiply_adds_per_result']:.2f} multiply-adds per result; layout "
            f"{result['layout']['chunks']} chunks x {result['layout']['blocks']} blocks) run through the server "
            f"worker's code on one core, once per wire, passes interleaved. Machine: {m['cpus']} CPU(s), "
            f"{m['platform']}, {m['date']}; load average {', '.join(f'{x:.2f}' for x in m['load_average'])} at "
            "the end. Generated by `benchmarks/server_profile.py`."
        ),
        "",
        "| component | " + " | ".join(f"{w} ms per result | share" for w in names) + " |",
        "|---|" + "---:|---:|" * len(names),
    ]
    for k in COMPONENTS:
        cells = []
        for w in names:
            v, total = wires[w]["ms_per_result"][k], wires[w]["ms_per_result_total"]
            cells.append("n/a | n/a" if v is None else f"{v:.3f} | {v / total:.0%}")
        rows.append(f"| {k} | " + " | ".join(cells) + " |")
    rows.append(
        "| **total (clean pass)** | "
        + " | ".join(f"**{wires[w]['ms_per_result_total']:.3f}** | " for w in names)
        + " |"
    )
    rows += [
        "",
        "| quantity | " + " | ".join(f"{w} ms per result | ratio to the op bound" for w in names) + " |",
        "|---|" + "---:|---:|" * len(names),
        f"| op-count bound (one core; {costs} ms) | "
        + " | ".join(f"{result['bound_ms_per_result']:.3f} | 1.00" for _ in names)
        + " |",
        "| bound + SEAL's save (no wire avoids it) | "
        + " | ".join(
            "n/a | n/a"
            if wires[w]["floor_with_save_ms_per_result"] is None
            else f"{wires[w]['floor_with_save_ms_per_result']:.3f} | "
            f"{wires[w]['ratios']['floor_with_save_vs_op_bound']:.2f}"
            for w in names
        )
        + " |",
        "| measured | "
        + " | ".join(
            f"{wires[w]['ms_per_result_total']:.3f} | **{wires[w]['ratios']['cpu_vs_op_bound']:.2f}**"
            + (
                ""
                if wires[w]["ratios"]["cpu_vs_floor_with_save"] is None
                else f" ({wires[w]['ratios']['cpu_vs_floor_with_save']:.2f}x bound + save)"
            )
            for w in names
        )
        + " |",
        "",
        (
            f"The whole round ({result['round_op_counts']['rescales']} results) at these rates: "
            + ", ".join(f"{w} {wires[w]['round_cpu_seconds_predicted']:.0f} CPU-s" for w in names)
            + f"; its op bound {result['round_op_bound_cpu_seconds']:.0f} CPU-s."
        ),
        *pool_rows(result),
        "",
        (
            "Components: `ops` = SEAL encode, multiply_plain, add_inplace, rescale (what the bound counts); "
            "`seal_save` = SEAL's zstd save of each result and reading it back; `wire` = the envelope's body "
            "(compact: decompress + bit-pack; tenseal: the bytes as they are) and its SHA-256; `loads` = spool "
            "reads on a cache miss; `copies` = TenSEAL's `ciphertext()` copies; `other` = Python around the "
            "calls, coefficient vectors, allocation. The split comes from a cProfile pass, scaled to the clean "
            "pass's CPU."
        ),
    ]
    if not all(wires[w]["split_attributed"] for w in names):
        rows += [
            "",
            (
                f"n/a: this Python's cProfile (Python {result['machine'].get('python', '?')}) did not report "
                "the calls into TenSEAL's C++ bindings (Python 3.12 and later lose them and the frames around "
                "them), so the split, and the bound + save it gives, cannot be read off this run; the clean "
                "pass's CPU and the op bound are timed without the profiler and stand."
            ),
        ]
    return "\n".join(rows) + "\n"


def pool_rows(result: dict) -> list[str]:
    """The pool passes' table (none without ``--workers``)."""
    pools = result.get("pools") or []
    if not pools:
        return []
    rows = [
        "",
        (
            f"The same tasks on a round pool ({pools[0]['wire']} wire; the bound and the one-core clean pass "
            "divided by the workers; workers' start-up timed apart, before the pass):"
        ),
        "",
        (
            "| workers | start s | wall s | op bound / workers s | wall vs bound | wall vs one-core pass / workers | "
            "workers' CPU s | main process CPU s |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in pools:
        rows.append(
            f"| {p['workers']} | {p['start_seconds']:.2f} | {p['wall_seconds']:.2f} | {p['bound_seconds']:.2f} | "
            f"**{p['wall_vs_op_bound']:.2f}** | {p['wall_vs_clean_pass']:.2f} | {p['workers_cpu_seconds']:.1f} | "
            f"{p['main_process_cpu_seconds']:.2f} |"
        )
    return rows


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["wires"])
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(names)))
    colours = plt.get_cmap("tab10").colors
    labelled: set[str] = set()
    for y, w in enumerate(names):
        left = 0.0
        row = result["wires"][w]
        if not row["split_attributed"]:  # the total alone (see markdown)
            label = None if "total (no split)" in labelled else "total (no split)"
            labelled.add("total (no split)")
            ax.barh([y], [row["ms_per_result_total"]], color="0.6", label=label)
            continue
        for i, k in enumerate(COMPONENTS):
            v = row["ms_per_result"][k]
            ax.barh([y], [v], left=left, color=colours[i], label=None if k in labelled else k)
            labelled.add(k)
            left += v
    ax.axvline(result["bound_ms_per_result"], color="k", linestyle="--", label="op bound")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("CPU ms per result ciphertext (one core)")
    ax.set_title(f"Server CPU per result, {result['dataset']} ({result['variant']}, {result['preset']})")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(result: dict, out: Path, name: str = "server_profile") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md", out / f"{name}.png"]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(markdown(result))
    plot(result, paths[2])
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="Cora", help="a Planetoid name (default Cora) or synthetic")
    parser.add_argument("--nodes", type=int, default=None, help="synthetic only: nodes")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--variant", default="vector", choices=("vector", "matrix"))
    parser.add_argument("--preset", default="n4096")
    parser.add_argument("--tasks", type=int, default=1500, help="tasks sampled from the round (default 1500)")
    parser.add_argument(
        "--wires", nargs="+", choices=WIRES, default=list(WIRES), help="ciphertext wires to compare"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="server_profile", help="file name stem of the results")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="*",
        default=[],
        help="also run the sampled tasks on a round pool of each of these sizes (e.g. 2 16): wall time "
        "against the op bound divided by the workers",
    )
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.workers):
        parser.error("--workers: every pool size must be at least 1")
    result = profile(
        args.dataset,
        nodes=args.nodes,
        clients=args.clients,
        beta=args.beta,
        variant=args.variant,
        preset=args.preset,
        tasks=args.tasks,
        wires=tuple(args.wires),
        seed=args.seed,
        progress=not args.quiet,
        workers=args.workers,
    )
    for path in write(result, args.out, args.name):
        print(path)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
