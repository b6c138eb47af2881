"""Where a training epoch's time goes on a GPU: FedGAT vs PyG GAT under ``torch.profiler``.

    python benchmarks/gpu_profile.py --dataset cora --variant vector [--epochs 10] [--json out.json]

Runs the same epochs as ``train_speed.py`` (:func:`train_speed._epoch_pair`: forward over every node,
cross entropy, backward, Adam) for each model and reports, per epoch: wall time (synchronised), the
GPU's busy time (the sum of kernel and copy times), the kernel launches, and the operators with the
most GPU time. Wall time far above GPU time means the epoch is bound by launches and Python, not by the
GPU; that says whether to fuse operators (fewer launches) or to make kernels faster.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from fedgat.benchmarks.train_speed import _epoch_pair
from fedgat.data import load_dataset
from fedgat.device import resolve_device
from fedgat.methods import resolve_hparams


def _profile(step, epochs: int, device: torch.device, top: int) -> dict:
    for _ in range(3):  # warm-up: allocator, cuBLAS handles, lazy initialisation
        step()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(epochs):
        step()
    torch.cuda.synchronize(device)
    wall = (time.perf_counter() - t0) / epochs
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(epochs):
            step()
        torch.cuda.synchronize(device)
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_us = sum(e.time_range.elapsed_us() for e in kernels)  # kernels and copies on the device
    averages = prof.key_averages()
    try:
        table = averages.table(sort_by="self_device_time_total", row_limit=top, max_name_column_width=60)
    except (KeyError, AttributeError, ValueError):  # older torch names it after CUDA
        table = averages.table(sort_by="self_cuda_time_total", row_limit=top, max_name_column_width=60)
    return {
        "wall_ms": 1e3 * wall,
        "gpu_busy_ms": busy_us / 1e3 / epochs,
        "kernels_per_epoch": len(kernels) / epochs,
        "table": table,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--variant", default="vector", choices=("vector", "matrix"))
    parser.add_argument("--cap", type=int, default=16, help="neighbour cap for the matrix variant")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--top", type=int, default=25, help="operators listed per model")
    parser.add_argument(
        "--json", type=Path, default=None, help="write the results here (and a .md beside it)"
    )
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    if device.type != "cuda":
        raise SystemExit("gpu_profile: needs a CUDA device")
    graph = load_dataset(args.dataset)
    hp = resolve_hparams("fedgat", {})
    cap = args.cap if args.variant == "matrix" else None
    ours, theirs, edges = _epoch_pair(graph, args.variant, cap, hp, device)
    result = {
        "dataset": args.dataset,
        "variant": args.variant,
        "neighbour_cap": cap,
        "edges": edges,
        "device": torch.cuda.get_device_name(device),
    }
    for name, step in (("fedgat", ours), ("pyg_gat", theirs)):
        r = _profile(step, args.epochs, device, args.top)
        print(
            f"== {name}: wall {r['wall_ms']:.2f} ms/epoch, GPU busy {r['gpu_busy_ms']:.2f} ms/epoch, "
            f"{r['kernels_per_epoch']:.0f} kernels/epoch"
        )
        print(r["table"])
        result[name] = r
    print(
        f"ratio (wall) {result['fedgat']['wall_ms'] / result['pyg_gat']['wall_ms']:.2f}, "
        f"(GPU busy) {result['fedgat']['gpu_busy_ms'] / result['pyg_gat']['gpu_busy_ms']:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
        write_markdown(result, args.json.with_suffix(".md"))
    return 0


def write_markdown(result: dict, path: Path) -> None:
    """A short report: per model wall and GPU-busy time per epoch, kernels, and FedGAT's top operators."""
    ours, theirs = result["fedgat"], result["pyg_gat"]
    lines = [
        f"# Where a training epoch goes on {result['device']}: FedGAT ({result['variant']}) vs PyG GAT",
        "",
        (
            f"{result['dataset']}, neighbour cap {result['neighbour_cap']}, {result['edges']} edges with self-loops; "
            "one full-batch epoch (forward, cross entropy, backward, Adam) as `train_speed.py` runs it, "
            "`torch.profiler` over the timed epochs. GPU busy: the summed durations of the kernels and copies."
        ),
        "",
        "| model | wall ms / epoch | GPU busy ms / epoch | busy / wall | kernels / epoch |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in (("FedGAT", ours), ("PyG GAT", theirs)):
        lines.append(
            f"| {name} | {r['wall_ms']:.2f} | {r['gpu_busy_ms']:.2f} | {r['gpu_busy_ms'] / r['wall_ms']:.0%} | "
            f"{r['kernels_per_epoch']:.0f} |"
        )
    lines += [
        "",
        (
            f"FedGAT / PyG: wall {ours['wall_ms'] / theirs['wall_ms']:.2f}x, GPU busy "
            f"{ours['gpu_busy_ms'] / theirs['gpu_busy_ms']:.2f}x, kernels "
            f"{ours['kernels_per_epoch'] / theirs['kernels_per_epoch']:.2f}x."
        ),
        "",
        "FedGAT's operators by GPU time (all timed epochs):",
        "",
        "```",
        ours["table"].rstrip(),
        "```",
    ]
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
