"""FedGAT vs PyG GAT: training seconds per epoch on one device, side by side.

Issue 20's target: on a GPU, FedGAT per epoch <= 1.5x PyG's GAT on the same GPU. Timed on the CPU the
ratio is reported without a target (the layer benchmark, ``layer_speed.py``, holds the CPU targets).

Two measurements, each interleaved (one FedGAT epoch, one GAT epoch, ...) so that drift in the
machine's load hits both alike, medians reported:

* ``epoch`` -- one full-batch optimiser step on the training nodes: forward over every node, cross
  entropy, backward, Adam. FedGAT (:class:`fedgat.models.FedGAT`: the first layer from the encodings
  of every node, compacted and factorised as training uses them, then an exact ``GATConv``) against
  PyG's two-layer GAT (:class:`fedgat.models.GAT`) with the same width (``--hidden`` x ``--heads``,
  one output head), dropout and neighbourhoods (self-loops included; the matrix variant's neighbour
  cap applies to both).
* ``round`` (``--clients`` > 0) -- one federated training round as :func:`fedgat.methods.run_method`
  runs it (train only, no evaluation): every FedGAT client (Dirichlet split, beta 1) loads the global
  weights, takes one local step on its device and returns its weights to the CPU, where the server
  aggregates them (FedAdam, the default) -- against the same round of centralised ``gat`` (one
  client holding the whole graph, same machinery).

``--cuda-graphs`` (a CUDA device only) repeats both measures with every step of both models captured
as one CUDA graph and replayed (:class:`fedgat.cuda_graphs.GraphedStep`, Adam ``capturable``; the
round's clients with ``cuda_graphs``), warm-up and capture done before timing.

    python benchmarks/train_speed.py --dataset cora --device cuda --epochs 50 [--cuda-graphs]
    fedgat bench train --dataset cora --device auto

Writes ``train_speed.json`` and ``train_speed.md`` (or ``train_speed_<suffix>.*`` with ``--suffix``)
into ``--out`` (``benchmarks/results`` run from a checkout, ``./fedgat-results`` as ``fedgat bench
train``), naming the machine, its cores, the device and the date.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from fedgat.benchmarks.layer_speed import describe_machine, machine_info, time_step
from fedgat.cli_engine import ArgumentParser, check_counts, check_dataset, parser_checks
from fedgat.cuda_graphs import WARMUP_STEPS, GraphedStep
from fedgat.cuda_graphs import check_device as cuda_graphs_device
from fedgat.data import load_dataset
from fedgat.device import resolve_device
from fedgat.encodings import encode
from fedgat.federated import Client, Server, strategy_from_hparams
from fedgat.methods import build_federation, fedgat_model_fn, resolve_hparams
from fedgat.models import GAT
from fedgat.partition import make_partition

RESULTS = Path(__file__).resolve().parent / "results"
#: FedGAT's time per epoch as a multiple of PyG GAT's on the same GPU (issue 20)
GPU_TARGET = 1.5


def _epoch_pair(graph, variant: str, cap: int | None, hp: dict, device: torch.device, graphed: bool = False):
    """Closures running one training epoch of FedGAT and of PyG GAT on ``device``; ``graphed``: each
    as a captured CUDA graph (:class:`fedgat.cuda_graphs.GraphedStep`, Adam ``capturable``), warmed
    up and captured here so that the closures only replay."""
    part = make_partition(graph, num_clients=1, seed=0, neighbour_cap=cap)
    csr = part.neighbourhoods
    edges = csr.to_edge_index().to(device)
    enc = encode(variant, graph.x, csr, rng=0).compact().factorise().to(device)
    rows = torch.nonzero(graph.train_mask).flatten()
    labels = graph.y[rows].to(device)
    rows = rows.to(device)
    x = graph.x.to(device)
    torch.manual_seed(0)
    ours = fedgat_model_fn(graph.num_features, graph.num_classes, hp)().to(device)
    theirs = GAT(graph.num_features, graph.num_classes, hp["hidden"], hp["heads"], dropout=hp["dropout"]).to(
        device
    )
    opt_ours = torch.optim.Adam(
        ours.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"], capturable=graphed
    )
    opt_theirs = torch.optim.Adam(
        theirs.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"], capturable=graphed
    )
    ours.train()
    theirs.train()
    if graphed:

        def losses(model, inputs):
            def step_losses():
                loss = F.cross_entropy(model(*inputs).index_select(0, rows), labels)
                return loss, loss

            return step_losses

        steps = [
            GraphedStep(losses(ours, (enc, edges)), opt_ours),
            GraphedStep(losses(theirs, (x, edges)), opt_theirs),
        ]
        for step in steps:
            while not step.captured:
                step()
        torch.cuda.synchronize(device)
        return steps[0], steps[1], int(csr.indices.shape[0])

    def fedgat_epoch() -> None:
        opt_ours.zero_grad()
        F.cross_entropy(ours(enc, edges)[rows], labels).backward()
        opt_ours.step()

    def gat_epoch() -> None:
        opt_theirs.zero_grad()
        F.cross_entropy(theirs(x, edges)[rows], labels).backward()
        opt_theirs.step()

    return fedgat_epoch, gat_epoch, int(csr.indices.shape[0])


def _round_pair(graph, clients: int, device: torch.device, graphed: bool = False):
    """Closures running one federated training round of FedGAT (``clients`` clients) and of
    centralised GAT (one client), clients on ``device``, the server on the CPU; ``graphed``: clients
    with ``cuda_graphs`` (their eager warm-up rounds and the capture run here, before timing)."""

    def server(method: str, num_clients: int) -> Server:
        hp = resolve_hparams(method, {})
        fed = build_federation(method, graph, num_clients, 1.0, 0)
        torch.manual_seed(0)
        model = fed.model_fn()
        strategy = strategy_from_hparams(hp, model)
        members = [
            Client.from_hparams(
                i, fed.model_fn(), t, e, hp, strategy=strategy.client, device=device, cuda_graphs=graphed
            )
            for i, (t, e) in enumerate(fed.tasks)
        ]
        return Server(members, model.state_dict(), strategy.server)

    ours, theirs = server("fedgat", clients), server("gat", 1)
    if graphed:  # every client's warm-up steps and capture (one local step per round)
        for _ in range(WARMUP_STEPS + 1):
            ours.train_round()
            theirs.train_round()
    return (lambda: ours.train_round()), (lambda: theirs.train_round())


def _timed_pair(ours, theirs, repeats: int, device: torch.device) -> tuple[list[float], list[float]]:
    t_ours: list[float] = []
    t_theirs: list[float] = []
    for _ in range(repeats):  # interleaved
        t_ours += time_step(ours, 1, warmup=2 if not t_ours else 0, device=device)
        t_theirs += time_step(theirs, 1, warmup=2 if not t_theirs else 0, device=device)
    return t_ours, t_theirs


def _row(kind: str, variant: str, cap, t_ours: list[float], t_theirs: list[float], device, **extra) -> dict:
    med_ours, med_theirs = statistics.median(t_ours), statistics.median(t_theirs)
    target = GPU_TARGET if device.type == "cuda" else None
    row = {
        "measure": kind,
        "variant": variant,
        "neighbour_cap": cap,
        **extra,
        "fedgat_ms": 1e3 * med_ours,
        "pyg_gat_ms": 1e3 * med_theirs,
        "ratio": med_ours / med_theirs,
        "fedgat_ms_all": [round(1e3 * t, 3) for t in t_ours],
        "pyg_gat_ms_all": [round(1e3 * t, 3) for t in t_theirs],
        "target_ratio": target,
        "meets_target": None if target is None else med_ours / med_theirs <= target,
    }
    print(
        f"{kind:6s} {variant:8s} cap={cap!s:5s} fedgat {row['fedgat_ms']:8.2f} ms   "
        f"pyg gat {row['pyg_gat_ms']:8.2f} ms   ratio {row['ratio']:.2f}"
        + (f" (target <= {target:g})" if target else " (CPU: no target)")
    )
    return row


def run(
    dataset: str = "cora",
    epochs: int = 20,
    variants: tuple[str, ...] = ("vector",),
    cap: int = 16,
    clients: int = 10,
    rounds: int = 5,
    device: str | torch.device = "cpu",
    threads: int | None = None,
    machine: str | None = None,
    date: str | None = None,
    cuda_graphs: bool = False,
) -> dict:
    """Time ``epochs`` epochs per variant and ``rounds`` federated rounds (``clients`` 0: none);
    ``cuda_graphs`` (a CUDA device only) adds the same measures with every step captured as a CUDA
    graph, FedGAT's and GAT's alike."""
    device = resolve_device(device)
    if cuda_graphs:
        cuda_graphs_device(device)
    if threads is not None:
        torch.set_num_threads(threads)
    graph = load_dataset(dataset)
    hp = resolve_hparams("fedgat", {})
    rows = []
    for graphed in (False, True) if cuda_graphs else (False,):  # eager rows first, then captured ones
        label = ", CUDA graph" if graphed else ""
        for variant in variants:
            variant_cap = cap if variant == "matrix" else None
            ours, theirs, edges = _epoch_pair(graph, variant, variant_cap, hp, device, graphed=graphed)
            t_ours, t_theirs = _timed_pair(ours, theirs, epochs, device)
            rows.append(
                _row(
                    f"epoch{label}",
                    variant,
                    variant_cap,
                    t_ours,
                    t_theirs,
                    device,
                    edges_with_self_loops=edges,
                )
            )
        if clients > 0:
            ours, theirs = _round_pair(graph, clients, device, graphed=graphed)
            t_ours, t_theirs = _timed_pair(ours, theirs, rounds, device)
            rows.append(_row(f"round{label}", "vector", None, t_ours, t_theirs, device, clients=clients))
    return {
        "benchmark": "train_speed",
        "dataset": dataset,
        "num_nodes": graph.num_nodes,
        "hidden": hp["hidden"],
        "heads": hp["heads"],
        "dropout": hp["dropout"],
        "epochs": epochs,
        "rounds": rounds,
        "device": str(device),
        "measure": (
            "median seconds of one full-batch training epoch (forward, loss, backward, Adam) and of one "
            "federated training round, FedGAT vs PyG GAT, interleaved"
        ),
        "machine": machine_info(device, machine, date),
        "rows": rows,
    }


def write(result: dict, out: Path = RESULTS, suffix: str = "") -> list[Path]:
    """Write ``train_speed[_suffix].json`` and ``.md`` into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    stem = "train_speed" + (f"_{suffix}" if suffix else "")
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    machine = result["machine"]
    lines = [
        f"# FedGAT vs PyG GAT, training time per epoch ({result['dataset']}, device {machine['device']})",
        "",
        (
            f"{result['measure']}; {result['epochs']} epochs, {result['rounds']} rounds, 2 warm-up runs each. "
            f"{result['heads']} heads x {result['hidden']} hidden, dropout {result['dropout']:g}, "
            f"{machine['cpu_threads']} torch CPU thread(s). "
            f"{describe_machine(machine)}"
        ),
        "",
        "| measure | variant | neighbour cap | FedGAT ms | PyG GAT ms | FedGAT / PyG | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        what = r["measure"] + (f" ({r['clients']} clients vs 1)" if "clients" in r else "")
        target = (
            f"<= {r['target_ratio']:g} ({'met' if r['meets_target'] else 'MISSED'})"
            if r["target_ratio"] is not None
            else "none on CPU"
        )
        lines.append(
            f"| {what} | {r['variant']} | {r['neighbour_cap']} | {r['fedgat_ms']:.2f} | {r['pyg_gat_ms']:.2f} | "
            f"{r['ratio']:.2f} | {target} |"
        )
    lines += [
        "",
        (
            "Rows named *CUDA graph* capture every step of both models as one CUDA graph "
            "(`fedgat.cuda_graphs.GraphedStep`, Adam `capturable`) and replay it; the others run eagerly."
        ),
        "",
        f"Issue 20's target: FedGAT per epoch <= {GPU_TARGET:g}x PyG GAT on the same GPU; "
        + (
            "measured here." if result["device"].startswith("cuda") else "this run is on the CPU (no target)."
        ),
    ]
    paths[1].write_text("\n".join(lines) + "\n")
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--epochs", type=int, default=20, help="timed epochs per model (default 20)")
    parser.add_argument(
        "--variants", default="vector", help="comma-separated FedGAT variants: vector (default), matrix"
    )
    parser.add_argument(
        "--cap", type=int, default=16, help="neighbour cap for the matrix variant (default 16)"
    )
    parser.add_argument(
        "--clients", type=int, default=10, help="FedGAT clients of the round measure; 0: skip it (default 10)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed federated rounds (default 5)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--machine", default=None, help="machine name for the report (default: host and CPU)")
    parser.add_argument("--date", default=None, help="date for the report (default: today)")
    parser.add_argument("--suffix", default="", help="file name suffix, e.g. cpu or h100")
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="also time every measure with each step captured as a CUDA graph (a CUDA device only)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="output folder (default %(default)s)")


def main(argv: list[str] | None = None, *, prog: str | None = None, out: Path | None = None) -> int:
    """Run from the command line (``prog``, ``out``: the name and default output folder ``fedgat
    bench train`` gives it)."""
    parser = ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    if out is not None:
        parser.set_defaults(out=out)
    args = parser.parse_args(argv)
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    if not variants or any(v not in ("vector", "matrix") for v in variants):
        parser.error(f"--variants takes vector and/or matrix, got {args.variants!r}")
    parser_checks(
        parser,
        lambda: check_dataset(args.dataset),
        lambda: check_counts(
            {
                "--epochs": (args.epochs, 1),
                "--rounds": (args.rounds, 1),
                "--clients": (args.clients, 0),
                "--cap": (args.cap, 1),
                "--threads": (args.threads, 1),
            }
        ),
    )
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        parser.error(f"--device: {exc}")
    if args.cuda_graphs and device.type != "cuda":
        parser.error(f"--cuda-graphs needs a CUDA device, not {device}")
    result = run(
        args.dataset,
        args.epochs,
        variants,
        args.cap,
        args.clients,
        args.rounds,
        device,
        args.threads,
        args.machine,
        args.date,
        cuda_graphs=args.cuda_graphs,
    )
    for path in write(result, args.out, args.suffix):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
