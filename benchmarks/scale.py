"""Scale-out: the same protocol in process and on Ray, for 10 to 200 clients.

    python benchmarks/scale.py                  # 10, 50, 100, 200 clients; in-process and Ray
    python benchmarks/scale.py --quick          # 4 and 10 clients on a small graph (a smoke run)
    python benchmarks/scale.py --clients 10 50 --engines ray --actors 4

One synthetic graph (:func:`fedgat.synthetic.synthetic_graph`, ``--nodes`` nodes, 16 features, an
iid split so that every client owns nodes) is split among K clients; for every K and engine, in a
fresh subprocess (so that memory and Ray start-up of one run do not leak into the next):

* **pre-training**: the encrypted round (:func:`fedgat.pipeline.run_encrypted_pretraining`, vector
  encodings, n4096): in process, the server's homomorphic work on a process pool of every core;
  on Ray, the clients in ``--actors`` actors (default ``min(CPUs, K)``) and the server's work as
  Ray tasks;
* **training**: ``--rounds`` FedAvg rounds of FedGAT through the protocol
  (:func:`fedgat.pipeline.train_fedgat`, no early stop) from the decrypted encodings.

Reported: wall seconds of each (Ray: ``ray.init`` and actor start-up are reported apart, placing the
clients in the actors and copying their results back are included), and memory per client: in
process, the growth of the process's peak RSS over its size before the clients were built, divided
by K; on Ray, the actors' peak RSS summed and divided by K (``actor_rss_per_client``), and the same
after subtracting each actor's idle size (torch + TenSEAL imported, ``actor_marginal_per_client``).

Writes ``scale.json``, ``scale.md`` and ``scale.png`` into ``--out``
(``benchmarks/results`` run from a checkout, ``./fedgat-results`` as ``fedgat bench scale``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

CLIENTS = (10, 50, 100, 200)
QUICK_CLIENTS = (4, 10)
ENGINES = ("inprocess", "ray")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def one(engine: str, clients: int, nodes: int, rounds: int, actors: int | None, seed: int) -> dict:
    """One configuration, in this process; returns its measurements."""
    import torch

    from fedgat.app import make_deployment
    from fedgat.partition import make_partition
    from fedgat.pipeline import run_encrypted_pretraining, train_fedgat
    from fedgat.synthetic import synthetic_graph

    torch.set_num_threads(1)
    graph = synthetic_graph(
        num_nodes=nodes,
        num_features=16,
        train_per_class=max(2, nodes // 40),
        num_val=nodes // 5,
        num_test=nodes // 5,
        seed=seed,
    )
    partition = make_partition(graph, clients, beta=1e4, seed=seed, num_layers=2)
    if min(len(c.owned) for c in partition.clients) == 0:
        raise SystemExit(f"scale: a client owns no node with {nodes} nodes and {clients} clients")
    out: dict = {"engine": engine, "clients": clients, "nodes": nodes, "rounds": rounds}
    eng = None
    transport = None
    if engine == "ray":
        from fedgat.benchmarks.graph_scale import start_ray

        eng, started = start_ray(actors, clients)
        out.update(started)
        out["actor_idle_rss"] = [m["rss"] for m in eng.memory()]
        transport = eng.transport()
    try:
        base_rss, base_peak = _rss(), _peak()
        deployment = make_deployment(clients)
        pre = run_encrypted_pretraining(
            graph, partition, seed=seed, transport=transport, progress=False, deployment=deployment
        )
        out["pretrain_seconds"] = round(pre.wall_seconds, 3)
        out["bytes_up"], out["bytes_down"] = pre.bytes_up, pre.bytes_down
        out["messages"] = pre.messages_up + pre.messages_down
        if transport is not None:
            out["placement_seconds"] = round(transport.placement_seconds, 3)
            out["export_seconds"] = round(transport.export_seconds, 3)
        pre_peak = _peak()
        start = time.perf_counter()
        run = train_fedgat(
            graph,
            partition,
            pre.encodings,
            seed=seed,
            deployment=deployment,
            transport=transport,
            fingerprint=pre.fingerprint,
            progress=False,
            rounds=rounds,
            patience=None,
        )
        out["train_seconds"] = round(time.perf_counter() - start, 3)
        out["train_seconds_per_round"] = round(out["train_seconds"] / run.fit.rounds, 4)
        out["test_accuracy"] = run.fit.test_accuracy
        out["driver_peak_rss"] = _peak()
        out["driver_growth_per_client"] = round((max(pre_peak, _peak()) - max(base_peak, base_rss)) / clients)
        if eng is not None:
            memory = eng.memory()
            peaks = [m["peak_rss"] for m in memory]
            out["actor_peak_rss"] = peaks
            out["actor_rss_per_client"] = round(sum(peaks) / clients)
            out["actor_marginal_per_client"] = round(
                sum(max(0, p - i) for p, i in zip(peaks, out["actor_idle_rss"])) / clients
            )
    finally:
        if eng is not None:
            eng.shutdown()
    out["memory_per_client"] = out.get("actor_rss_per_client", out["driver_growth_per_client"])
    return out


def _child(args: argparse.Namespace, engine: str, clients: int) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--one",
        engine,
        str(clients),
        "--nodes",
        str(args.nodes),
        "--rounds",
        str(args.rounds),
        "--seed",
        str(args.seed),
    ]
    if args.actors:
        cmd += ["--actors", str(args.actors)]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MPLBACKEND": "Agg"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        return {"engine": engine, "clients": clients, "error": done.stderr.strip().splitlines()[-5:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def write_markdown(result: dict, path: Path) -> None:
    runs = [r for r in result["runs"] if "error" not in r]
    lines = [
        "# Scale-out: in-process vs Ray",
        "",
        (
            f"Synthetic graph of {result['nodes']} nodes (16 features, iid split), vector encodings, n4096; "
            f"{result['rounds']} FedAvg rounds. Machine: {result['cpus']} CPU(s), {result['platform']}; "
            f"{result['date']}. Command: `{result['command']}`."
        ),
        "",
        (
            "**Timings were taken on a shared machine, under load from other jobs** (load average "
            f"{result['load_before']} before, {result['load_after']} after); compare engines with each other, "
            "not with other tables."
        ),
        "",
        (
            "| clients | engine | actors | pre-training s | training s | s/round | Ray start s | "
            "memory/client MiB | actor marginal/client MiB | test acc |"
        ),
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r['clients']} | {r['engine']} | {r.get('actors', '-')} | {r['pretrain_seconds']:.1f} | "
            f"{r['train_seconds']:.1f} | {r['train_seconds_per_round']:.2f} | "
            f"{r.get('ray_start_seconds', '-')} | {_mib(r['memory_per_client'])} | "
            f"{_mib(r.get('actor_marginal_per_client'))} | {r['test_accuracy']:.3f} |"
        )
    errors = [r for r in result["runs"] if "error" in r]
    if errors:
        lines += ["", "Failed runs:"] + [
            f"- {r['engine']} / {r['clients']} clients: {r['error']}" for r in errors
        ]
    lines += [
        "",
        (
            "Memory per client: in process, the growth of the process's peak RSS while the round ran, / clients "
            "(server included); on Ray, the actors' peak RSS summed / clients (each actor starts at ~"
            f"{_mib(result.get('actor_idle_rss_mean'))} MiB with torch and TenSEAL imported; the marginal column "
            "subtracts that). Ray's pre-training includes placing the clients in the actors and copying their "
            "encodings back to the driver; its start-up (ray.init + actors) is the separate column."
        ),
        "",
    ]
    path.write_text("\n".join(lines))


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in result["runs"] if "error" not in r]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for engine, style in (("inprocess", "o-"), ("ray", "s--")):
        rs = sorted((r for r in runs if r["engine"] == engine), key=lambda r: r["clients"])
        if not rs:
            continue
        k = [r["clients"] for r in rs]
        axes[0].plot(k, [r["pretrain_seconds"] for r in rs], style, label=engine)
        axes[1].plot(k, [r["train_seconds_per_round"] for r in rs], style, label=engine)
        axes[2].plot(k, [r["memory_per_client"] / 2**20 for r in rs], style, label=engine)
    for ax, title in zip(
        axes, ("encrypted pre-training (s)", "training (s per round)", "memory per client (MiB)")
    ):
        ax.set_title(title)
        ax.set_xlabel("clients")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[2].set_yscale("log")
    fig.suptitle(f"{result['nodes']}-node synthetic graph, {result['cpus']} shared CPUs (under load)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None, *, prog: str | None = None, out: Path | None = None) -> int:
    """Run from the command line (``prog``, ``out``: the name and default output folder ``fedgat
    bench scale`` gives it)."""
    from fedgat.cli_engine import ArgumentParser, check_counts, parser_checks

    parser = ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=None)
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--nodes", type=int, default=None, help="graph size (default 1000; --quick 200)")
    parser.add_argument("--rounds", type=int, default=None, help="FedAvg rounds (default 10; --quick 3)")
    parser.add_argument("--actors", type=int, default=None, help="Ray actors (default min(CPUs, clients))")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 and 10 clients, 200 nodes")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" if out is None else out,
        help="output folder (default %(default)s)",
    )
    parser.add_argument("--one", nargs=2, metavar=("ENGINE", "CLIENTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    parser_checks(
        parser,
        lambda: check_counts(
            {
                "--clients": (min(args.clients) if args.clients else None, 1),
                "--nodes": (args.nodes, 40),
                "--rounds": (args.rounds, 1),
                "--actors": (args.actors, 1),
            }
        ),
    )
    args.nodes = args.nodes or (200 if args.quick else 1000)
    args.rounds = args.rounds or (3 if args.quick else 10)
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.nodes, args.rounds, args.actors, args.seed)))
        return 0
    clients = args.clients or (QUICK_CLIENTS if args.quick else CLIENTS)
    load_before = os.getloadavg()
    start = time.perf_counter()
    runs = []
    for k in clients:
        for engine in args.engines:
            run = _child(args, engine, k)
            runs.append(run)
            print(json.dumps(run), flush=True)
    idle = [i for r in runs for i in r.get("actor_idle_rss", [])]
    result = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python benchmarks/scale.py", *(argv if argv is not None else sys.argv[1:])]),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "nodes": args.nodes,
        "rounds": args.rounds,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "actor_idle_rss_mean": sum(idle) / len(idle) if idle else None,
        "total_seconds": round(time.perf_counter() - start, 1),
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "scale_quick" if args.quick else "scale"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result, args.out / f"{stem}.md")
    plot(result, args.out / f"{stem}.png")
    print(f"wrote {args.out / stem}.json/.md/.png in {result['total_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
