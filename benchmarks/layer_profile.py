"""Which operators of the FedGAT layer do not scale with CPU threads: a per-operator profile per thread count.

    python benchmarks/layer_profile.py --dataset cora --threads 1,2 [--variant vector] [--steps 10]

``layer_speed.py`` says how far the layer's forward+backward is from its GEMM floor at each thread count
(issue 20: <= 1.5x for the vector layer at 1, 2 and 16 threads); this says where the rest goes. It runs the
same step (``layer(encodings).square().sum().backward()``, encodings as training uses them) under
``torch.profiler`` at each ``--threads`` count and lists, per operator, its self CPU milliseconds per step
at each count and its speed-up from the first count to the last. Operators whose time does not fall with
threads (speed-up near 1) are the ones to replace or fuse. Dense ``aten::mm``/``aten::addmm``/``aten::bmm``
are GEMMs (the floor's kind of work); operators inside the layer's constant sparse products are listed
apart, as ``aten::... (sparse)``.

Writes ``layer_profile_<variant>.json`` and ``.md`` into ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from fedgat.benchmarks.layer_speed import machine_info, parse_threads
from fedgat.data import load_dataset
from fedgat.encodings import encode
from fedgat.layer import FedGATConv
from fedgat.partition import make_partition

RESULTS = Path(__file__).resolve().parent / "results"
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm")


def _step_fn(dataset: str, variant: str, cap: int | None, heads: int, hidden: int):
    graph = load_dataset(dataset)
    part = make_partition(graph, num_clients=1, seed=0, neighbour_cap=cap)
    enc = encode(variant, graph.x, part.neighbourhoods, rng=0)
    enc = enc.factorise() if variant == "matrix" else enc.compact()
    torch.manual_seed(0)
    layer = FedGATConv(graph.num_features, hidden, heads=heads)

    def step() -> None:
        layer(enc).square().sum().backward()

    return step


#: the layer's autograd functions around its constant sparse products (and their backward nodes)
SPARSE_FUNCTIONS = ("_SparseMatmul", "_GatherBackwardSum")


def _under_sparse(event) -> bool:
    """Whether ``event`` runs inside the layer's sparse products (:data:`SPARSE_FUNCTIONS` and their
    backward): their kernels are dispatched as ``aten::mm``/``aten::addmm`` too, and are not the GEMM
    floor's work."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(SPARSE_FUNCTIONS):
            return True
        parent = parent.cpu_parent
    return False


def profile_threads(step, threads: list[int], steps: int) -> dict[int, dict[str, float]]:
    """``{threads: {operator: self CPU ms per step}}``, plus ``"total"`` (the profiled wall per step)."""
    initial = torch.get_num_threads()
    out: dict[int, dict[str, float]] = {}
    try:
        for n in threads:
            torch.set_num_threads(n)
            for _ in range(2):  # warm-up: plans, allocator
                step()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(steps):
                    step()
            ops: dict[str, float] = {}
            for e in prof.events():
                key = e.name + (" (sparse)" if _under_sparse(e) else "")
                ops[key] = ops.get(key, 0.0) + e.self_cpu_time_total / 1e3 / steps
            ops["total"] = sum(ops.values())
            out[n] = ops
    finally:
        torch.set_num_threads(initial)
    return out


def table(per_threads: dict[int, dict[str, float]], top: int) -> list[dict]:
    """Rows sorted by time at the last thread count: operator, ms per count, speed-up first -> last."""
    counts = sorted(per_threads)
    first, last = per_threads[counts[0]], per_threads[counts[-1]]
    names = sorted(last, key=lambda k: -last[k])
    rows = []
    for name in names[: top + 1]:  # + the total
        ms = {str(n): round(per_threads[n].get(name, 0.0), 4) for n in counts}
        speedup = first.get(name, 0.0) / last[name] if last.get(name) else None
        rows.append({"op": name, "ms": ms, "speedup": speedup, "gemm": name in GEMM_OPS})  # dense only
    return rows


def write(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"layer_profile_{result['variant']}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    counts = [str(n) for n in result["threads"]]
    m = result["machine"]
    lines = [
        f"# FedGAT layer ({result['variant']}) per operator and thread count ({result['dataset']})",
        "",
        (
            f"Self CPU ms per forward+backward step under `torch.profiler` ({result['steps']} steps per count); "
            f"speed-up is the first count's time over the last's. Machine: {m.get('name')}, "
            f"{m.get('cpu_cores')} cores, {m.get('date')}; torch {m.get('torch')}. GEMM rows are the floor's "
            "kind of work; the rest is the attention maths."
        ),
        "",
        "| operator | " + " | ".join(f"{c} threads ms" for c in counts) + " | speed-up |",
        "|---|" + "---:|" * (len(counts) + 1),
    ]
    for r in result["rows"]:
        name = f"**{r['op']}**" if r["gemm"] else r["op"]
        speed = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        lines.append(f"| {name} | " + " | ".join(f"{r['ms'][c]:.2f}" for c in counts) + f" | {speed} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return [stem.with_suffix(".json"), stem.with_suffix(".md")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--variant", default="vector", choices=("vector", "matrix"))
    parser.add_argument("--cap", type=int, default=16, help="neighbour cap for the matrix variant")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=8)
    parser.add_argument("--threads", type=parse_threads, default=[1, os.cpu_count() or 1])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=20, help="operators listed")
    parser.add_argument("--machine", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    cap = args.cap if args.variant == "matrix" else None
    step = _step_fn(args.dataset, args.variant, cap, args.heads, args.hidden)
    per = profile_threads(step, args.threads, args.steps)
    result = {
        "benchmark": "layer_profile",
        "dataset": args.dataset,
        "variant": args.variant,
        "neighbour_cap": cap,
        "threads": args.threads,
        "steps": args.steps,
        "machine": {**machine_info(torch.device("cpu"), args.machine, None)},
        "rows": table(per, args.top),
    }
    for r in result["rows"]:
        print(
            f"{r['op'][:48]:48s} "
            + " ".join(f"{v:9.2f}" for v in r["ms"].values())
            + (f"  {r['speedup']:.2f}x" if r["speedup"] else "")
        )
    for path in write(result, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
