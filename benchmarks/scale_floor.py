"""The encrypted round's op-count floor at ogbn-arxiv scale, without running it.

    python benchmarks/scale_floor.py                         # 10k .. 169,343 nodes, floors at 2 and 16 cores
    python benchmarks/scale_floor.py --nodes 2000 20000 --cores 2 16 64

For each size, the same synthetic ogbn-arxiv-shaped graph and ~iid 10-client split as
``benchmarks/graph_scale.py``; the round's exact operation counts from its plan
(:func:`fedgat.estimate.estimate_pretraining`: the server's multiply-adds and result ciphertexts,
the clients' encryptions) and the SEAL operations of the server's evaluator
(:class:`fedgat.crypto.evaluator.OpCounts`), times each operation's cost **measured in this run**
(:func:`fedgat.crypto.measure.evaluator_op_seconds`, :func:`fedgat.crypto.measure.measure_preset`).
The floor of a deployment with ``cores`` cores per party and every party on its own machine:

* server: its operations / ``cores`` (perfect scaling; serialisation left out);
* clients: one client's encryptions and decryptions / ``cores`` (the ~iid split gives every client
  about a tenth; the mean is used);
* transfer: the server's bytes (every upload in, every result out) at ``--link-gbps``.

Beside them: the multiply-adds of one shared key (each needed node computed once, the protocol the
issue's targets were set for) and their ratio, and the spool the server holds before its compute
begins (every upload: the bytes up).

A round cannot be faster than the largest of the three (they overlap at best), nor than the server's
floor plus one client's when, as in the protocol, a client decrypts what the server has finished.
That is the number the issue's "encrypted round <= 10 min on 16 cores at 169k nodes" is held against.
The per-operation costs are this machine's; the 16-core machine of the issue measured a multiply-add
within 3 % of the 2-core VM's (0.56 vs 0.576 ms), so the 2-core costs stand in for its cores.

Writes ``scale_floor.json``, ``scale_floor.md`` and ``scale_floor.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from graph_scale import ARXIV_NODES, arxiv_like

NODES = (10_000, 20_000, 40_000, 80_000, ARXIV_NODES)


def floors(nodes: int, clients: int, cores: list[int], costs: dict, link_gbps: float, seed: int = 0) -> dict:
    from fedgat.crypto.evaluator import OpCounts
    from fedgat.estimate import estimate_pretraining
    from fedgat.partition import make_partition

    graph = arxiv_like(nodes, seed)
    partition = make_partition(graph, clients, beta=1e4, seed=seed, num_layers=2)
    est = estimate_pretraining(partition, "vector", graph.num_features)
    chunks, mads, results = est["layout_chunks"], est["multiply_adds"], est["result_ciphertexts_down"]
    once = multiply_adds_once_per_node(partition, graph.num_features)
    ops = OpCounts.of_round(mads, results, chunks)
    server_s = ops.seconds(costs)
    encryptions = est["rows_released"] * chunks
    client_s = (encryptions * costs["encrypt"] + results * costs["decrypt"]) / clients
    transfer_s = (est["bytes_up"] + est["bytes_down"]) * 8 / (link_gbps * 1e9)
    per_cores = {}
    for c in cores:
        server, client = server_s / c, client_s / c
        per_cores[str(c)] = {
            "server_s": server,
            "client_s": client,
            "transfer_s": transfer_s,
            "floor_overlapped_s": max(server, client, transfer_s),
            "floor_server_then_client_s": server + client,
        }
    return {
        "nodes": nodes,
        "edges": int(graph.edge_index.shape[1]),
        "op_counts": dataclasses.asdict(ops),
        "multiply_adds": mads,
        "multiply_adds_once_per_node": once,
        "op_count_ratio_to_one_key": mads / once,
        "result_ciphertexts": results,
        "encryptions": encryptions,
        "bytes_up": est["bytes_up"],
        "bytes_down": est["bytes_down"],
        "server_cpu_s": server_s,
        "client_cpu_s_each": client_s,
        "floors": per_cores,
    }


def multiply_adds_once_per_node(partition, d: int) -> int:
    """The multiply-adds of the protocol the issue's targets were set for: one shared key, every
    needed node's whole encoding computed once (today each recipient's foreign shares are computed
    under its own key, :func:`fedgat.estimate.estimate_pretraining`)."""
    import numpy as np

    from fedgat.crypto import get_preset
    from fedgat.protocols import PretrainConfig

    cfg = PretrainConfig(session=0, variant="vector", preset="n4096")
    layout = cfg.layout(cfg.row_width(d), get_preset("n4096").slots)
    n = partition.neighbourhoods.degrees().astype(np.int64)
    rows = np.array([cfg.rows_per_node(int(k), False) for k in n])
    groups = -(-(rows + 1) // layout.blocks)  # h_i is result row 0
    needed = np.unique(np.concatenate([np.asarray(c.needed, dtype=np.int64) for c in partition.clients]))
    return int((groups[needed] * n[needed]).sum()) * layout.chunks


def write_markdown(result: dict, path: Path) -> None:
    cores = result["cores"]
    lines = [
        "# The encrypted round's op-count floor at ogbn-arxiv scale",
        "",
        (
            f"Synthetic ogbn-arxiv-shaped graphs, {result['clients']} ~iid clients, vector variant, n4096. "
            f"Operation counts from the round's plan; per-operation costs {result['costs_source']}, "
            f"run on {result['cpus']} CPU(s) ({result['platform']}, {result['date']}): "
            + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in result["costs"].items())
            + f". Link {result['link_gbps']:g} Gbit/s. Command: `{result['command']}`."
        ),
        "",
        "| nodes | edges | multiply-adds (x one key's) | results | bytes up GB (= spool) | bytes down GB | "
        "server CPU h | "
        + " | ".join(f"floor @{c} cores min (server / client / transfer)" for c in cores)
        + " |",
        "|---:|---:|---:|---:|---:|---:|---:|" + "---|" * len(cores),
    ]
    for r in result["rows"]:
        cells = []
        for c in cores:
            f = r["floors"][str(c)]
            cells.append(
                f"**{f['floor_overlapped_s'] / 60:.1f}** ({f['server_s'] / 60:.1f} / {f['client_s'] / 60:.1f} / "
                f"{f['transfer_s'] / 60:.1f})"
            )
        lines.append(
            f"| {r['nodes']} | {r['edges']} | {r['multiply_adds']:,} ({r['op_count_ratio_to_one_key']:.2f}x) | "
            f"{r['result_ciphertexts']:,} | "
            f"{r['bytes_up'] / 1e9:.1f} | {r['bytes_down'] / 1e9:.1f} | {r['server_cpu_s'] / 3600:.2f} | "
            + " | ".join(cells)
            + " |"
        )
    lines += ["", result.get("verdict", ""), ""]
    path.write_text("\n".join(lines))


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    edges = [r["edges"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for c in result["cores"]:
        ax.plot(
            edges, [r["floors"][str(c)]["floor_overlapped_s"] for r in rows], "o-", label=f"floor, {c} cores"
        )
    ax.plot(edges, [r["floors"][str(result["cores"][0])]["transfer_s"] for r in rows], "k:", label="transfer")
    ax.axhline(600, color="r", ls="--", lw=1, label="10 min target")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("edges (directed)")
    ax.set_ylabel("seconds")
    ax.set_title("encrypted round: op-count floor vs graph size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=list(NODES))
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--cores", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--link-gbps", type=float, default=10.0)
    parser.add_argument(
        "--costs-from",
        type=Path,
        default=None,
        help="take the per-operation costs from an overhead JSON (op_bound) instead of measuring them "
        "here, e.g. one measured on a quiet machine",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--name", default="scale_floor", help="file name stem of the results")
    args = parser.parse_args(argv)

    from fedgat.crypto.measure import evaluator_op_seconds, measure_preset

    start = time.perf_counter()
    if args.costs_from is not None:
        bound = json.loads(args.costs_from.read_text())["op_bound"]
        costs = {k: float(v) for k, v in bound["op_seconds"].items() if k != "save"}
        costs["encrypt"] = float(bound["seconds_per_encrypt"])
        costs["decrypt"] = float(bound["seconds_per_decrypt"])
        source = f"from {args.costs_from.name} ({bound.get('cores', '?')} cores)"
    else:
        costs = evaluator_op_seconds("n4096", repeats=15)
        m = measure_preset("n4096")
        costs = {k: v for k, v in costs.items() if k != "save"}
        costs["encrypt"] = m["encrypt_serialize_ms"] / 1e3
        costs["decrypt"] = m["decrypt_ms"] / 1e3
        source = "measured in this run"
    rows = []
    for n in sorted(args.nodes):
        rows.append(floors(n, args.clients, args.cores, costs, args.link_gbps))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "op_counts"}), flush=True)
    result = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(
            ["python benchmarks/scale_floor.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "clients": args.clients,
        "cores": args.cores,
        "link_gbps": args.link_gbps,
        "costs": costs,
        "costs_source": source,
        "rows": rows,
        "seconds": round(time.perf_counter() - start, 1),
    }
    big = rows[-1]
    parts = []
    for c in args.cores:
        f = big["floors"][str(c)]
        parts.append(
            f"{c} cores: {f['floor_overlapped_s'] / 60:.1f} min overlapped, "
            f"{f['floor_server_then_client_s'] / 60:.1f} min server then client"
        )
    ratio = big["op_count_ratio_to_one_key"]
    result["verdict"] = (
        f"At {big['nodes']:,} nodes the floor is "
        + "; ".join(parts)
        + ". The issue's target is 10 min on 16 cores, set when each node was computed once under one "
        f"key; per-recipient keys multiply the server's multiply-adds by {ratio:.2f} here, so the same "
        f"target scaled by the op count is {10 * ratio:.0f} min. The server must also hold every upload "
        f"before its compute begins: {big['bytes_up'] / 1e9:.0f} GB of spool."
    )
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / args.name
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result, stem.with_suffix(".md"))
    plot(result, stem.with_suffix(".png"))
    print(result["verdict"])
    print(f"wrote {stem}.json/.md/.png in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
