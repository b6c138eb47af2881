"""Graph scale: how FedGAT's time, memory and bytes grow with the graph, 10k to 169k nodes.

    python benchmarks/graph_scale.py                        # 10k, 20k, 40k, 80k, 169,343 nodes
    python benchmarks/graph_scale.py --quick                # 200 and 400 nodes (a smoke run)
    python benchmarks/graph_scale.py --nodes 10000 20000 --encrypted-max-nodes 20000
    python benchmarks/graph_scale.py --nodes 10000 20000 40000 --modes plain --engines inprocess ray --actors 2

Every size is a synthetic graph (:func:`fedgat.synthetic.synthetic_graph`, no download) with
ogbn-arxiv's shape: 128 features, 40 classes, mean degree 13.77 (ogbn-arxiv's 1,166,243 edges over
169,343 nodes, both directions stored), homophily 0.65; the splits scale with the graph. It is split
among ``--clients`` (default 10) clients (Dirichlet beta 1e4, i.e. ~iid, 2 layers), and, in a fresh
subprocess per size and mode (so that one run's memory does not leak into the next):

* ``plain``: **plaintext pre-training** (:func:`fedgat.pipeline.run_plaintext_pretraining`, vector
  variant: the same server plan and bases as the encrypted round, computed in the clear), then
  **training**: ``--rounds`` FedAvg rounds of FedGAT through the protocol
  (:func:`fedgat.pipeline.train_fedgat`, no early stop);
* ``encrypted``: the **encrypted pre-training round** (:func:`fedgat.pipeline.run_encrypted_pretraining`,
  vector variant, n4096, the server's work on a pool of every core), for sizes up to
  ``--encrypted-max-nodes``.

With ``--engines ray`` (default ``inprocess``) the protocol's phases, training and the encrypted round,
run on Ray instead (:class:`fedgat.protocols.ray_engine.RayEngine`): the clients in ``--actors`` actors
(default ``min(cores, clients)``) and, in the encrypted round, the server's homomorphic work as Ray
tasks. The plaintext pre-training has no parties to place (it is the round computed in the clear in
one process) and runs as in process. A Ray run also reports the engine's start (``ray.init`` and the
actors, ``ray_start_seconds``, not in any phase), each actor's peak RSS over the whole run
(``actor_peak_rss``; Ray reads no per-phase peak) and the driver's peak plus those
(``peak_rss_with_actors``: an upper bound, the peaks need not coincide), and the seconds the engine
spent placing the clients in the actors and taking their reports back (``placement_seconds``,
``export_seconds``, inside the phase).

Each phase (``build``: graph; ``partition``; ``plaintext_pretrain``; ``train``; ``encrypted_pretrain``)
reports wall seconds and its peak RSS, sampled every 20 ms by a thread in the subprocess (the process's
RSS, so what earlier phases left allocated counts; the graph and partition stay alive throughout).
The plaintext pre-training computes in float64 and stores the clients' encodings in float32 (the
values training reads); training is handed them and frees them once its clients have built their
tasks (each client keeps the rows its tasks need), unless ``--hold-encodings`` keeps them referenced
throughout, as ``fedgat demo`` does. Each subprocess lets glibc keep freed memory for reuse, as the
command line does (:mod:`fedgat.allocator`; ``FEDGAT_KEEP_FREED_MEMORY=0`` measures without).
Bytes: encrypted round and training, the frames on the wire (up: clients -> server); plaintext
pre-training has no wire, so its bytes are the float32 size of the same traffic (every feature row up
once, the clients' encodings down). The growth exponent of a phase between two consecutive sizes is
``log(y2 / y1) / log(E2 / E1)`` with ``E`` the stored (directed) edge count: 1 is linear in edges;
each engine's sizes form their own series.

New pages: each phase also reports the memory its process touched for the first time (``new_pages``:
minor page faults x the page size; a freshly allocated large tensor is faulted in page by page; worker
processes' pages are not counted, nor fully those of large numpy arrays, which numpy maps with
transparent huge pages where the kernel allows it: one fault per 2 MiB). On a VM a first touch
can cost far more than the write itself, and more the more memory the process already holds, which bends
a phase's time upward while its work grows linearly. So after the sizes, a probe (in its own
subprocess, skipped with ``--no-probe``) touches fresh memory one GiB at a time up to the largest peak RSS
measured and reports GB/s against the resident size, beside the speed of rewriting memory already
touched (:func:`first_touch_probe`).

Writes ``graph_scale.json``, ``graph_scale.md`` and ``graph_scale.png`` (``graph_scale_quick.*`` with
``--quick``) into ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

#: ogbn-arxiv: 169,343 nodes, 1,166,243 edges (stored in both directions here), 128 features, 40 classes
ARXIV_NODES = 169_343
ARXIV_EDGES = 1_166_243
ARXIV_DEGREE = 2 * ARXIV_EDGES / ARXIV_NODES
ARXIV_FEATURES = 128
ARXIV_CLASSES = 40
ARXIV_HOMOPHILY = 0.65
NODES = (10_000, 20_000, 40_000, 80_000, ARXIV_NODES)
QUICK_NODES = (200, 400)
PHASES = ("build", "partition", "plaintext_pretrain", "train", "encrypted_pretrain")
MODES = ("plain", "encrypted")
ENGINES = ("inprocess", "ray")
#: the phases whose parties run on the engine; the others are the same code whichever engine is chosen
ENGINE_PHASES = ("train", "encrypted_pretrain")


PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _minor_faults() -> int:
    """Minor page faults of this process so far (each a page touched for the first time)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def first_touch_probe(max_gib: float, step_gib: float = 1.0) -> list[dict]:
    """GB/s of writing ``step_gib`` of freshly allocated memory (first touch: page faults and zeroing
    included) as the memory this process holds grows to ``max_gib``, each step kept; and, per step,
    GB/s of writing the same memory again (no faults: the write alone). The blocks are torch tensors,
    faulted in 4 KiB pages as the phases' tensors are (numpy asks for transparent huge pages on large
    arrays, a path with other costs, and its pages count 512 times less in ``new_pages``)."""
    import torch

    keep, rows = [], []
    words = int(step_gib * 2**30) // 8
    for i in range(max(1, int(max_gib / step_gib))):
        t = time.perf_counter()
        block = torch.empty(words, dtype=torch.float64)
        block.fill_(1.0)
        first = time.perf_counter() - t
        t = time.perf_counter()
        block.fill_(2.0)
        again = time.perf_counter() - t
        keep.append(block)
        rows.append(
            {
                "resident_gib": round((i + 1) * step_gib, 2),
                "first_touch_gb_s": round(words * 8 / first / 1e9, 2),
                "rewrite_gb_s": round(words * 8 / again / 1e9, 2),
            }
        )
    return rows


class PeakSampler:
    """Peak RSS of this process since the last :meth:`reset`, sampled by a daemon thread."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _rss())

    def reset(self) -> None:
        self.peak = _rss()

    def read(self) -> int:
        self.peak = max(self.peak, _rss())
        return self.peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def arxiv_like(nodes: int, seed: int = 0):
    """A synthetic graph of ``nodes`` nodes with ogbn-arxiv's degree, features and classes."""
    from fedgat.synthetic import synthetic_graph

    classes = min(ARXIV_CLASSES, max(2, nodes // 50))
    return synthetic_graph(
        num_nodes=nodes,
        num_classes=classes,
        num_features=ARXIV_FEATURES,
        avg_degree=ARXIV_DEGREE,
        homophily=ARXIV_HOMOPHILY,
        train_per_class=max(2, min(nodes // classes // 4, nodes // 20 // classes)),
        num_val=nodes // 10,
        num_test=nodes // 10,
        seed=seed,
    )


def start_ray(actors: int | None, parties: int):
    """A :class:`~fedgat.protocols.ray_engine.RayEngine` with its actors started (``actors``; None:
    the engine's default for ``parties``), and ``{"ray_start_seconds", "actors"}``: the seconds
    ``ray.init`` and the actors took (not in any phase) and how many there are."""
    from fedgat.protocols.ray_engine import RayEngine

    start = time.perf_counter()
    eng = RayEngine(actors, log_to_driver=False)
    eng.ensure_actors(parties)
    return eng, {"ray_start_seconds": round(time.perf_counter() - start, 3), "actors": len(eng.actors)}


def one(
    mode: str,
    nodes: int,
    clients: int,
    rounds: int,
    seed: int,
    upload_window: int | None = None,
    engine: str = "inprocess",
    actors: int | None = None,
    hold_encodings: bool = False,
) -> dict:
    """One size and mode, in this process; returns its measurements (``upload_window``: the
    encrypted round's, :attr:`fedgat.protocols.pretrain.PretrainConfig.upload_window`; ``engine``
    ``"ray"``: training and the encrypted round on a :class:`~fedgat.protocols.ray_engine.RayEngine`
    of ``actors`` actors; ``hold_encodings``: the plaintext pre-training's encodings stay referenced
    while training runs, as ``fedgat demo`` and a script holding ``pre.encodings`` keep them)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    from fedgat.allocator import keep_freed_memory

    eng = None
    out: dict = {"mode": mode, "nodes": nodes, "clients": clients, "engine": engine}
    out["freed_memory_kept"] = keep_freed_memory()  # as the command line (fedgat.allocator)
    if engine == "ray":
        eng, started = start_ray(actors, clients)
        out.update(started)
    try:
        _phases(out, mode, nodes, clients, rounds, seed, upload_window, eng, hold_encodings)
        if eng is not None:
            out["actor_peak_rss"] = [m["peak_rss"] for m in eng.memory()]
            out["peak_rss_with_actors"] = out["peak_rss"] + sum(out["actor_peak_rss"])
    finally:
        if eng is not None:
            eng.shutdown()
    return out


def _phases(
    out: dict,
    mode: str,
    nodes: int,
    clients: int,
    rounds: int,
    seed: int,
    upload_window: int | None,
    eng,
    hold_encodings: bool = False,
) -> None:
    """:func:`one`'s phases, written into ``out`` (``eng``: a Ray engine, or None in process)."""
    import torch

    from fedgat.partition import make_partition
    from fedgat.pipeline import run_encrypted_pretraining, run_plaintext_pretraining, train_fedgat

    transport = None if eng is None else eng.transport()
    sampler = PeakSampler()
    out["threads"] = torch.get_num_threads()
    phases: dict[str, dict] = {}

    faults = [0]  # minor faults when the phase began

    def phase(name: str, start: float, **extra) -> None:
        now = _minor_faults()
        phases[name] = {
            "seconds": round(time.perf_counter() - start, 3),
            "peak_rss": sampler.read(),
            "new_pages": (now - faults[0]) * PAGE,
            **extra,
        }
        faults[0] = now

    def begin() -> float:
        sampler.reset()
        faults[0] = _minor_faults()
        return time.perf_counter()

    start = begin()
    graph = arxiv_like(nodes, seed)
    phase("build", start)
    out["edges"] = int(graph.edge_index.shape[1])
    out["features"] = int(graph.x.shape[1])
    out["classes"] = int(graph.num_classes)

    start = begin()
    partition = make_partition(graph, clients, beta=1e4, seed=seed, num_layers=2)
    phase("partition", start)
    out["cross_client_edges"] = sum(c.cross_edges for c in partition.clients)

    if mode == "plain":
        start = begin()
        # computed in float64 like the encrypted round's twin, stored in float32: training reads
        # float32 (the same values), and the clients' copies are 7-8 encodings per node at 10 clients
        encodings = run_plaintext_pretraining(graph, partition, "vector", seed, out_dtype=torch.float32)
        down = sum(e.nbytes(4) for e in encodings.values())
        up = int(graph.x.numel()) * 4
        phase("plaintext_pretrain", start, bytes_up=up, bytes_down=down, float32_equivalent=True)
        start = begin()
        handed = [encodings]  # handed over: freed once the clients have built their tasks
        held = encodings if hold_encodings else None  # --hold-encodings: as fedgat demo holds them
        out["hold_encodings"] = held is not None
        del encodings
        run = train_fedgat(
            graph,
            partition,
            handed.pop(),
            seed=seed,
            progress=False,
            rounds=rounds,
            patience=None,
            transport=transport,
        )
        phase(
            "train",
            start,
            bytes_up=run.bytes_up,
            bytes_down=run.bytes_down,
            rounds=run.fit.rounds,
            **_hosting(transport),
        )
        out["test_accuracy"] = run.fit.test_accuracy
        del held
    else:
        start = begin()
        pre = run_encrypted_pretraining(
            graph,
            partition,
            "vector",
            "n4096",
            seed=seed,
            progress=False,
            upload_window=upload_window,
            transport=transport,
        )
        phase(
            "encrypted_pretrain",
            start,
            bytes_up=pre.bytes_up,
            bytes_down=pre.bytes_down,
            round_seconds=round(pre.wall_seconds, 3),
            server_workers=pre.server_workers,
            multiply_adds=pre.multiply_adds,
            ciphertexts_up=pre.ciphertexts_up,
            ciphertexts_down=pre.ciphertexts_down,
            upload_window=upload_window,
            peak_spooled_bytes=pre.peak_spooled_bytes,
            phases={k: round(v, 3) for k, v in pre.phases.items()},
            **_hosting(transport),
        )
    sampler.stop()
    out["phases"] = phases
    out["peak_rss"] = max(p["peak_rss"] for p in phases.values())


def _hosting(transport) -> dict:
    """A hosting engine's seconds of the last run spent placing the parties in its hosts (their specs)
    and taking back their reports (``placement_seconds``, ``export_seconds``); nothing in process."""
    if transport is None:
        return {}
    return {
        "placement_seconds": round(transport.placement_seconds, 3),
        "export_seconds": round(transport.export_seconds, 3),
    }


def _child(args: argparse.Namespace, mode: str, nodes: int, engine: str = "inprocess") -> dict:
    cmd = [sys.executable, __file__, "--one", mode, str(nodes)]
    cmd += ["--clients", str(args.clients), "--rounds", str(args.rounds), "--seed", str(args.seed)]
    cmd += ["--engines", engine]
    if args.actors is not None:
        cmd += ["--actors", str(args.actors)]
    if args.upload_window is not None:
        cmd += ["--upload-window", str(args.upload_window)]
    if args.hold_encodings:
        cmd += ["--hold-encodings"]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MPLBACKEND": "Agg"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-5:]
        return {"mode": mode, "nodes": nodes, "engine": engine, "error": tail}
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_run(tries: list[dict]) -> dict:
    """One size and mode measured in several subprocesses as one run: each phase's seconds, peak RSS
    and new pages the median over the tries (every try's seconds kept in ``seconds_tries``); the
    first failed try if any failed."""
    failed = [t for t in tries if "error" in t]
    if failed or len(tries) == 1:
        return (failed or tries)[0]
    out = dict(tries[0])
    out["phases"] = {}
    for name, first in tries[0]["phases"].items():
        phase = dict(first)
        for key in ("seconds", "peak_rss", "new_pages", "placement_seconds", "export_seconds"):
            values = [t["phases"][name][key] for t in tries if key in t["phases"].get(name, {})]
            if values:
                phase[key] = statistics.median(values)
        phase["seconds_tries"] = [t["phases"][name]["seconds"] for t in tries]
        out["phases"][name] = phase
    out["peak_rss"] = max(p["peak_rss"] for p in out["phases"].values())
    if "actor_peak_rss" in out:  # a Ray run: each actor's median, and the sum recomputed from them
        out["ray_start_seconds"] = statistics.median(t["ray_start_seconds"] for t in tries)
        out["actor_peak_rss"] = [statistics.median(v) for v in zip(*(t["actor_peak_rss"] for t in tries))]
        out["peak_rss_with_actors"] = out["peak_rss"] + sum(out["actor_peak_rss"])
    out["tries"] = len(tries)
    return out


#: new pages below this (per size) give no slope: a phase that allocates next to nothing (the partition)
#: faults a few pages of allocator noise, whose ratio means nothing
MIN_SLOPE_PAGES = 16 * 2**20


def slope(x1: float, y1: float, x2: float, y2: float) -> float | None:
    """Log-log slope ``log(y2/y1) / log(x2/x1)`` (None where undefined)."""
    if min(x1, y1, x2, y2) <= 0 or x1 == x2:
        return None
    return math.log(y2 / y1) / math.log(x2 / x1)


def _engine(run: dict) -> str:
    return run.get("engine", "inprocess")  # results written before engines were a dimension


def series(runs: list[dict], name: str) -> dict[str | None, dict[int, dict]]:
    """``{engine: {edges: phase}}`` of phase ``name`` over the runs that did not fail: one series per
    engine for the phases that run on it (:data:`ENGINE_PHASES`), else one series (key None) taking
    the first run of each size (build and partition run in every mode and engine)."""
    out: dict[str | None, dict[int, dict]] = {}
    for r in runs:
        if "error" in r or name not in r["phases"]:
            continue
        key = _engine(r) if name in ENGINE_PHASES else None
        out.setdefault(key, {}).setdefault(r["edges"], r["phases"][name])
    order = {e: i for i, e in enumerate((None, *ENGINES))}
    return dict(sorted(out.items(), key=lambda kv: order.get(kv[0], len(order))))


def growth(runs: list[dict]) -> list[dict]:
    """Growth exponents of every phase's seconds, peak RSS and new pages vs edges, between consecutive
    sizes of each :func:`series` (new pages: None where either size touched less than
    :data:`MIN_SLOPE_PAGES`, or has none recorded, as in results written before new pages were counted)."""
    rows = []
    for name in PHASES:
        for engine, points in series(runs, name).items():
            for (e1, p1), (e2, p2) in itertools.pairwise(sorted(points.items())):
                t = slope(e1, p1["seconds"], e2, p2["seconds"])
                m = slope(e1, p1["peak_rss"], e2, p2["peak_rss"])
                f1, f2 = p1.get("new_pages", 0), p2.get("new_pages", 0)
                f = slope(e1, f1, e2, f2) if min(f1, f2) >= MIN_SLOPE_PAGES else None
                rows.append(
                    {
                        "phase": name,
                        "engine": engine,
                        "edges_from": e1,
                        "edges_to": e2,
                        "time_slope": None if t is None else round(t, 3),
                        "rss_slope": None if m is None else round(m, 3),
                        "new_pages_slope": None if f is None else round(f, 3),
                    }
                )
    return rows


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def write_markdown(result: dict, path: Path) -> None:
    runs = [r for r in result["runs"] if "error" not in r]
    encrypted = (
        f"encrypted round at n4096 up to {result['encrypted_max_nodes']} nodes"
        if any(r["mode"] == "encrypted" for r in runs)
        else "no encrypted round"
    )
    before, after = result.get("load_before"), result.get("load_after")
    if before is None:
        load = "The growth exponents compare sizes within this run."
    else:
        shared = before[0] >= 0.5 * (result.get("cpus") or 1)
        load = (
            ("**Timings were taken on a shared machine, under load from other jobs.** " if shared else "")
            + f"Load average {before} before, {after} after; the growth exponents compare sizes within this run."
        )
    tries = max((r.get("tries", 1) for r in runs), default=1)
    repeat = (
        f" Each size's phases: the median of {tries} subprocesses (`seconds_tries` in the JSON)."
        if tries > 1
        else ""
    )
    if result.get("hold_encodings"):
        repeat += " The pre-training's encodings stay referenced while training runs (`--hold-encodings`)."
    kept = {r.get("freed_memory_kept") for r in runs}
    if kept == {True}:
        repeat += " glibc kept freed memory for reuse (`fedgat.allocator`, as the command line does)."
    elif kept == {False}:
        repeat += (
            " glibc's allocator as it is (`FEDGAT_KEEP_FREED_MEMORY=0`, or a run before `fedgat.allocator`)."
        )
    lines = [
        "# Graph scale: time, memory and bytes vs graph size",
        "",
        (
            f"Synthetic ogbn-arxiv-like graphs ({ARXIV_FEATURES} features, up to {ARXIV_CLASSES} classes, mean "
            f"degree {ARXIV_DEGREE:.2f}, homophily {ARXIV_HOMOPHILY}), {result['clients']} clients (~iid), vector "
            f"encodings; {encrypted}; {result['rounds']} FedAvg rounds. Machine: {result['cpus']} CPU(s), {result['memory_gib']} GiB RAM, "
            f"{result['platform']}; {result['date']}. Command: `{result['command']}`."
        ),
        "",
        load + repeat,
        "",
        "| nodes | edges | engine | phase | seconds | peak RSS GiB | new pages GiB | bytes up MiB | bytes down MiB |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    # the engine-independent phases once per size: the run :func:`series` (and so the growth) takes
    first = {name: series(runs, name).get(None, {}) for name in PHASES if name not in ENGINE_PHASES}
    for r in sorted(runs, key=lambda r: (r["nodes"], r["mode"] != "plain", ENGINES.index(_engine(r)))):
        for name in PHASES:
            p = r["phases"].get(name)
            if p is None or (name in first and first[name].get(r["edges"]) is not p):
                continue
            engine = _engine(r) if name in ENGINE_PHASES else "-"
            note = " (float32)" if p.get("float32_equivalent") else ""
            lines.append(
                f"| {r['nodes']} | {r['edges']} | {engine} | {name} | {p['seconds']:.2f} | {_gib(p['peak_rss'])} | "
                f"{_gib(p.get('new_pages'))} | {_mib(p.get('bytes_up'))}{note} | {_mib(p.get('bytes_down'))}{note} |"
            )
    on_ray = [r for r in runs if _engine(r) == "ray"]
    if on_ray:
        lines += [
            "",
            (
                "On Ray (`--engines ray`): the phases above are the driver's; the engine's start is not in "
                "them, and each actor's peak RSS is over the whole run (Ray reads no per-phase peak). "
                "Driver + actors is an upper bound (the peaks need not coincide)."
            ),
            "",
            (
                "| nodes | mode | actors | Ray start s | placing parties s | taking reports s | driver peak RSS GiB "
                "| actors' peak RSS GiB | driver + actors GiB |"
            ),
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sorted(on_ray, key=lambda r: (r["nodes"], r["mode"] != "plain")):
            actors = " + ".join(_gib(x) for x in r.get("actor_peak_rss", []))
            hosted = next((r["phases"][n] for n in ENGINE_PHASES if n in r["phases"]), {})
            lines.append(
                f"| {r['nodes']} | {r['mode']} | {r.get('actors', '-')} | {r.get('ray_start_seconds', '-')} | "
                f"{hosted.get('placement_seconds', '-')} | {hosted.get('export_seconds', '-')} | "
                f"{_gib(r['peak_rss'])} | {actors or '-'} | {_gib(r.get('peak_rss_with_actors'))} |"
            )
    lines += [
        "",
        "Growth exponents (log-log slope vs edges between consecutive sizes; 1 = linear):",
        "",
        "| phase | engine | edges from | edges to | time slope | RSS slope | new pages slope |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for g in result["growth"]:
        lines.append(
            f"| {g['phase']} | {g.get('engine') or '-'} | {g['edges_from']} | {g['edges_to']} | {g['time_slope']} "
            f"| {g['rss_slope']} | {g.get('new_pages_slope', '-')} |"
        )
    probe = result.get("first_touch")
    if probe:
        slow = min(probe, key=lambda r: r["first_touch_gb_s"])
        lines += [
            "",
            (
                "This machine's memory (`first_touch_probe`, its own subprocess after the sizes): GB/s of writing "
                "a freshly allocated GiB (page faults included) as the memory the process holds grows, and of "
                "writing the same GiB again. A phase whose new pages grow linearly in edges but whose time "
                f"grows faster is paying this: here a first touch runs at {slow['first_touch_gb_s']} GB/s at "
                f"{slow['resident_gib']} GiB held, against {probe[0]['first_touch_gb_s']} GB/s at "
                f"{probe[0]['resident_gib']} GiB (a rewrite: {min(r['rewrite_gb_s'] for r in probe)}-"
                f"{max(r['rewrite_gb_s'] for r in probe)} GB/s)."
            ),
            "",
            "| resident GiB | first touch GB/s | rewrite GB/s |",
            "|---:|---:|---:|",
            *(f"| {r['resident_gib']} | {r['first_touch_gb_s']} | {r['rewrite_gb_s']} |" for r in probe),
        ]
    errors = [r for r in result["runs"] if "error" in r]
    if errors:
        lines += ["", "Failed runs:"] + [
            f"- {r['mode']} / {_engine(r)} / {r['nodes']} nodes: {r['error']}" for r in errors
        ]
    skipped = result.get("encrypted_skipped", [])
    if skipped:
        lines += ["", f"Encrypted round not run (above `--encrypted-max-nodes`): {skipped} nodes."]
    if result.get("notes"):
        lines += ["", result["notes"]]
    lines += [
        "",
        (
            "Peak RSS is the subprocess's RSS sampled every 20 ms during the phase (graph and partition stay "
            "allocated). Each size, mode and engine runs in its own subprocess; the phases that are the same "
            "code on every engine (build, partition, plaintext pre-training) are shown once per size, from its "
            "first run. Plaintext pre-training bytes are the float32 size of the same traffic (feature rows up "
            "once, encodings down), not frames."
        ),
        "",
    ]
    path.write_text("\n".join(lines))


def plot(result: dict, path: Path) -> None:
    """Log-log panels of each phase's seconds, peak RSS and new pages against edges and, when the
    probe ran, the machine's first-touch and rewrite speed against the memory held."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    runs = [r for r in result["runs"] if "error" not in r]
    probe = result.get("first_touch") or []
    panels: list[tuple[str, float, str]] = [
        ("seconds", 1.0, "wall seconds"),
        ("peak_rss", 2**30, "peak RSS (GiB)"),
    ]
    if any("new_pages" in p for r in runs for p in r["phases"].values()):  # not in older results
        panels.append(("new_pages", 2**30, "new pages (GiB): memory touched first"))
    count = len(panels) + bool(probe)
    rows = 2 if count == 4 else 1
    fig, grid = plt.subplots(rows, count // rows, figsize=(5.5 * count // rows, 4 * rows), squeeze=False)
    axes = list(grid.flat)
    for i, (name, marker) in enumerate(zip(PHASES, "os^vD")):
        for engine, pts in series(runs, name).items():
            e = sorted(pts)
            style = marker + ("--" if engine == "ray" else "-")
            label = name if engine in (None, "inprocess") else f"{name} ({engine})"
            for ax, (key, unit, _) in zip(axes, panels):
                least = MIN_SLOPE_PAGES if key == "new_pages" else 0  # the partition's few pages left out
                if all(pts[k].get(key, 0) > least for k in e):
                    ax.plot(e, [pts[k][key] / unit for k in e], style, color=f"C{i}", label=label)
    sizes = sorted({r["edges"] for r in runs})
    for ax, (_, _, title) in zip(axes, panels):
        ax.set_xscale("log")
        ax.set_yscale("log")
        # the measured sizes as the ticks: a range within one decade has no labelled log tick
        ax.set_xticks(sizes, [f"{e / 1e6:.2f}M" if e >= 1e6 else f"{e / 1e3:.0f}k" for e in sizes])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(title)
        ax.set_xlabel("edges (directed)")
        ax.grid(alpha=0.3, which="both")
        if ax.lines:
            ax.legend(fontsize=8)
        else:
            ax.text(
                0.5,
                0.5,
                f"no phase touched {MIN_SLOPE_PAGES // 2**20} MiB",
                ha="center",
                transform=ax.transAxes,
            )
    if probe:
        ax = axes[-1]
        held = [r["resident_gib"] for r in probe]
        ax.plot(held, [r["first_touch_gb_s"] for r in probe], "o-", label="first touch (page faults)")
        ax.plot(held, [r["rewrite_gb_s"] for r in probe], "s--", label="rewrite")
        ax.set_ylim(bottom=0)
        ax.set_title("this machine: GB/s writing 1 more GiB")
        ax.set_xlabel("GiB the process already holds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"FedGAT vs graph size, {result['clients']} clients, {result['cpus']} shared CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)
    except (ValueError, OSError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--nodes", type=int, nargs="+", default=None, help="graph sizes (default 10k..169,343)"
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=None, help="FedAvg rounds (default 3; --quick 1)")
    parser.add_argument(
        "--encrypted-max-nodes",
        type=int,
        default=None,
        help="largest size for the encrypted round (default 20000; --quick 200)",
    )
    parser.add_argument(
        "--upload-window",
        type=int,
        default=None,
        help="the encrypted round's upload window (recipients whose uploads the server holds at once; "
        "default: every upload before compute)",
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=ENGINES,
        default=["inprocess"],
        help="where training and the encrypted round run: in process and/or on Ray (default inprocess)",
    )
    parser.add_argument("--actors", type=int, default=None, help="Ray actors (default: min(cores, clients))")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="subprocesses per size and mode; each phase reports the median (default 1; a VM's first "
        "touch of memory varies by several times from run to run, see the probe)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 200 and 400 nodes")
    parser.add_argument("--notes", default="", help="a paragraph for the Markdown (what ran where)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument(
        "--no-probe",
        action="store_true",
        help="skip the first-touch probe of the machine's memory after the sizes",
    )
    parser.add_argument(
        "--hold-encodings",
        action="store_true",
        help="plain mode: keep the pre-training's encodings referenced while training runs, as fedgat demo "
        "(and a script holding pre.encodings) does; by default they are freed once the clients have "
        "built their tasks",
    )
    parser.add_argument("--one", nargs=2, metavar=("MODE", "NODES"), help=argparse.SUPPRESS)
    parser.add_argument("--probe", type=float, metavar="GIB", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.actors is not None and args.actors < 1:
        parser.error(f"--actors must be at least 1, got {args.actors}")
    if args.encrypted_max_nodes is None:
        args.encrypted_max_nodes = QUICK_NODES[0] if args.quick else 20_000
    if args.probe is not None:
        step = 1.0 if args.probe >= 4 else 0.25
        print(json.dumps(first_touch_probe(step * math.ceil(args.probe / step), step)))
        return 0
    if args.one:
        print(
            json.dumps(
                one(
                    args.one[0],
                    int(args.one[1]),
                    args.clients,
                    args.rounds,
                    args.seed,
                    args.upload_window,
                    engine=args.engines[0],
                    actors=args.actors,
                    hold_encodings=args.hold_encodings,
                )
            )
        )
        return 0
    sizes = sorted(args.nodes or (QUICK_NODES if args.quick else NODES))
    load_before = os.getloadavg()
    start = time.perf_counter()
    runs: list[dict] = []
    skipped = [n for n in sizes if "encrypted" in args.modes and n > args.encrypted_max_nodes]
    stem = "graph_scale_quick" if args.quick else "graph_scale"
    result: dict = {}
    for n, mode, engine in itertools.product(sizes, args.modes, args.engines):
        if mode == "encrypted" and n > args.encrypted_max_nodes:
            continue
        run = median_run([_child(args, mode, n, engine) for _ in range(args.repeat)])
        runs.append(run)
        print(json.dumps(run), flush=True)
        # written after every size, so that a run cut off by a time limit keeps what it measured
        result = _result(args, argv, runs, skipped, load_before, start)
        _write(result, args.out, stem)
    if not runs:
        print("graph_scale: nothing to run")
        return 0
    if not args.no_probe:
        result["first_touch"] = _probe(runs)
        _write(result, args.out, stem)
    print(f"wrote {args.out / stem}.json/.md/.png in {result['total_seconds']} s")
    return 0


def _probe(runs: list[dict]) -> list[dict] | None:
    """:func:`first_touch_probe` in a fresh subprocess, up to the largest peak RSS measured (at most
    60% of the machine's memory); None if it fails."""
    peak = max((r["peak_rss"] for r in runs if "error" not in r), default=0) / 2**30
    limit = 0.6 * (_memory_gib() or peak)
    cmd = [sys.executable, __file__, "--probe", f"{max(0.25, min(peak, limit)):.2f}"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _result(args, argv, runs: list[dict], skipped: list[int], load_before, start: float) -> dict:
    result = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(
            ["python benchmarks/graph_scale.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "platform": platform.platform(),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "clients": args.clients,
        "rounds": args.rounds,
        "encrypted_max_nodes": args.encrypted_max_nodes,
        "upload_window": args.upload_window,
        "hold_encodings": args.hold_encodings,
        "engines": args.engines,
        "actors": args.actors,
        "repeat": args.repeat,
        "encrypted_skipped": skipped,
        "notes": args.notes,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "total_seconds": round(time.perf_counter() - start, 1),
        "runs": runs,
    }
    result["growth"] = growth(runs)
    return result


def _write(result: dict, out: Path, stem: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result, out / f"{stem}.md")
    plot(result, out / f"{stem}.png")


if __name__ == "__main__":
    sys.exit(main())
