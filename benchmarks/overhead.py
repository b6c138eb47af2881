"""Encrypted vs plaintext overhead of FedGAT's pre-training round.

    python benchmarks/overhead.py                                 # Cora, 10 clients, vector, n4096
    python benchmarks/overhead.py --dataset synthetic --nodes 200 --clients 3 --no-train
    python benchmarks/overhead.py --sweep --datasets cora citeseer --client-counts 2 5 10
    fedgat bench overhead ...                                     # the same, through the CLI

One run = the pre-training round twice on the *same* partition and the *same* random bases:

* **encrypted**: :func:`fedgat.pipeline.run_encrypted_pretraining` (CKKS, the protocol state machines
  over the in-process transport, the server on a process pool);
* **plaintext**: the FedGAT round without HE, on the *same plan* through the *same seam*
  (:func:`fedgat.pipeline.run_plaintext_pretraining`, timed in its two halves):
  :func:`fedgat.pipeline.plaintext_round` plans the round as the encrypted server does
  (:func:`~fedgat.protocols.pretrain_plan.plan_round` over the clients' graph announcements, same
  bases) and keys the uploads like the spool (``plaintext.plan``); then the plaintext encoder
  (:class:`fedgat.plain_encoder.PlainEncoder`, each node's :math:`A_i H_i` in the clear, batched per
  bucket) runs over the plan's compute buckets and the results are routed to the clients as the
  protocol routes them (:func:`fedgat.plain_encoder.assemble_encodings`). Planning, encoder and
  routing together are the plaintext ``server_compute``, as the encrypted server's clock also
  covers its planning. Bytes are the float32 payloads of the same uploads (each node's
  feature row once) and of the same encodings (every row of every node, to every client that needs
  it). Encrypt, decrypt and protocol framing cost nothing there.

Reported per phase (keygen, encrypt, upload, server_compute, download, decrypt, round): wall and CPU
seconds. CPU seconds are ``time.process_time`` of this process charged by the parties' clocks; the
server's worker processes are added to ``server_compute`` from ``getrusage(RUSAGE_CHILDREN)`` (they
are reaped when the round ends). Peak memory: ``main_process_peak_rss`` is the peak resident set of
this process (clients + server state machine + driver; sampled from ``/proc/self/statm`` every 20 ms
during the round, minus nothing: the dataset and Python are included), ``server_worker_peak_rss`` the
largest worker's peak and ``server_workers_peak_rss_total`` all workers together (sampled from
``/proc/<pid>/statm`` of the children; ``RUSAGE_CHILDREN.ru_maxrss`` is useless for this: Linux keeps
it across the spawn's fork + exec, so it reports the parent's size at fork time); ``ratios.memory``
compares main + workers with the plaintext round's peak; the spool of uploads is on disk (about ``bytes_up``). All parties share one process here, so per-role memory inside the main
process is not separable; the worker figure is the server's homomorphic compute alone.

Op-count lower bound of the server: the SEAL operations its evaluator spends
(:class:`fedgat.crypto.evaluator.OpCounts`: one encoding per (result group, source) shared by the
chunks, ``multiply_adds`` plaintext multiplies, the additions, one rescale per result ciphertext) x
each operation's cost measured in the same run / the cores used. The costs are timed in one process
per server core *at the same time* (:func:`fedgat.crypto.measure.evaluator_op_seconds_busy`): busy
cores slow each other down (on the 2-vCPU VM by 5-20 %), and a bound the server could not reach with
every core working is no bound. Serialising the results is not an operation of the bound: it is
overhead, reported as ``op_bound.serialise_seconds``. ``server_seconds_alone_cost`` is the same count
at the one-core-alone costs; ``op_bound.tenseal_seconds`` what TenSEAL's per-term path (encode,
multiply and rescale per product, :func:`fedgat.crypto.measure.multiply_add_seconds`) would cost.
Likewise the clients' encryptions and decryptions. ``ratios.server_vs_op_bound`` = the server's compute span
(start of its compute phase to its last result, ``server_compute_span``) / that bound, while the
clients' downloads and decryptions share the cores; ``ratios.server_alone_vs_op_bound``: the same
compute replayed after the round with the clients idle (``server_compute_alone``; as on a server of
its own). The ``server_compute`` phase row counts only the time the round *waited* for the server (the
workers compute while this process frames, checks and decrypts earlier results).
``ratios.server_cpu_vs_op_count``: the server's CPU seconds (workers included) / (multiply-adds x
cost of one).

Critical path of a deployment (``critical_path_s``, ``critical_path``): the simulation runs every
party in one process (``wall_s``, the round's wall time); on a deployment each party has a machine of
its own. For each protocol phase in order (:data:`PATH_PHASES`), the slowest party in that phase --
the one whose own clock (:attr:`fedgat.protocols.party.Party.timings`) charged it the most -- takes
its compute time plus the bytes it sends and receives in that phase (frames counted by the
transport, each charged to its message type's phase, :data:`fedgat.protocols.party.PHASES`) at
``--link-gbps`` (default 1 Gbit/s; the server's at ``--server-link-gbps``, default the same);
``critical_path_s`` sums the phases. A model: phases as
barriers (no overlap of one phase with the next, which the round does have), no latency, and the
per-party table (``critical_path.parties``) recomputes it at another speed (:func:`critical_path`).
With server workers the server's clock only counts the time it waited for them, so its
``server_compute`` is the larger of that and the compute replayed with the clients idle
(``server_compute_alone``, which leaves its planning out).

Writes ``overhead.json``, ``overhead.md`` and ``overhead.png`` (sweep: ``overhead_sweep.*``) into
``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import resource
import shlex
import sys
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Self

import numpy as np

PHASES = ("keygen", "encrypt", "upload", "server_compute", "download", "decrypt")
#: where the encrypted round's clients run (``--engine``)
ENGINES = ("inprocess", "process")

#: FedGraph (Yao et al. 2024) reports for FedGCN with homomorphic encryption of the pre-training
#: aggregation: ~2-4x time and ~55x communication over plaintext FedGCN. A different algorithm.
FEDGRAPH_FEDGCN_HE = {
    "time": "2-4x",
    "bytes": "~55x",
    "source": "FedGraph (Yao et al., 2024), FedGCN pre-training with HE; different algorithm",
}
RESULTS = Path(__file__).resolve().parent / "results"
FROM_JSON_HELP = (
    "run nothing: recompute an earlier run's critical paths (encrypted and plaintext) at --link-gbps (and "
    "--server-link-gbps) from its JSON and write overhead_<X>gbps[_server<Y>gbps].{json,md,png} into --out"
)
SERVER_LINK_HELP = (
    "the server's link speed in Gbit/s for the critical path, where it differs from the clients' "
    "(--link-gbps; e.g. 10 for a server in a data centre); default the same"
)
NO_REPLAY_HELP = (
    "skip computing every result again with the clients idle after the round (the 'server alone' "
    "ratios; ~3 minutes on Cora at 10 clients on 2 cores)"
)
#: ``--sweep``'s datasets and client counts when not given
SWEEP_DATASETS = ("cora", "citeseer")
SWEEP_CLIENTS = (2, 5, 10)
#: the protocol's phases in the order a deployment runs them, for the critical path (the keys, the
#: graphs, the clients' encryption, the uploads, the server's compute, the results, the decryption)
PATH_PHASES = ("keygen", "setup", "encrypt", "upload", "server_compute", "download", "decrypt")
#: default link speed of every party for the critical path, Gbit/s
LINK_GBPS = 1.0


# ---------------------------------------------------------------------------------- helpers
def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the lifetime peak instead
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _children_rss(exclude: Collection[int] = ()) -> list[int]:
    """Resident sets of this process's child processes but ``exclude`` (Linux ``/proc``; empty
    elsewhere)."""
    out = []
    try:
        pids = set()
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(f.read().split())
        for pid in pids:
            if int(pid) in exclude:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"multiprocessing" not in f.read():  # forked, not yet exec'd: the parent's pages
                        continue
                with open(f"/proc/{pid}/statm") as f:
                    out.append(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
            except OSError:
                continue
    except OSError:
        return []
    return out


class PeakRSS:
    """Peak resident set of this process, of its largest child and of all children together while
    the ``with`` block runs (sampled every ``period`` s from ``/proc``); ``exclude()`` names child pids
    to leave out (a process engine's client workers, measured on their own)."""

    def __init__(self, period: float = 0.02, exclude: Callable[[], set[int]] | None = None) -> None:
        self.period, self.peak = period, 0
        self.child_peak = self.children_peak = 0
        self._exclude = exclude
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            kids = _children_rss(self._exclude() if self._exclude is not None else set())
            if kids:
                self.child_peak = max(self.child_peak, max(kids))
                self.children_peak = max(self.children_peak, sum(kids))
            self._stop.wait(self.period)

    def __enter__(self) -> Self:
        self.peak = _rss_bytes()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())


#: the round's stretches, read off the frames: (name, from, to); an end is (message type, "first" or
#: "last") or "start"/"end" of the round. They overlap a little (the server computes one recipient's
#: shares while the clients decrypt another's) but show where the wall time went and what a parallel
#: engine shortened.
WINDOWS = (
    ("keys_and_graphs", "start", ("FeatureUpload", "first")),
    ("encrypt_upload", ("FeatureUpload", "first"), ("UploadDone", "last")),
    ("first_results", ("UploadDone", "last"), ("EncodingResults", "first")),
    ("compute_download_decrypt", ("EncodingResults", "first"), ("EncodingResults", "last")),
    ("tail", ("EncodingResults", "last"), "end"),
)


class FrameClock:
    """Mixed into a transport (:func:`timed`): the time of the first and last frame of each message
    type that crossed it (every engine's transport counts frames in ``TrafficLog._log``)."""

    def _log(self, sender: int, to: int, data):
        from fedgat.protocols.messages import MESSAGE_TYPES, peek_type

        now = time.perf_counter()
        cls = MESSAGE_TYPES.get(peek_type(data) or -1)
        marks = self.__dict__.setdefault("frame_marks", {})
        first_last = marks.setdefault(cls.__name__ if cls else "?", [now, now])
        first_last[1] = now
        return super()._log(sender, to, data)  # type: ignore[misc]


def timed(transport):
    """``transport`` with a :class:`FrameClock` (its class swapped for a subclass that adds one)."""
    transport.__class__ = type(f"Timed{type(transport).__name__}", (FrameClock, type(transport)), {})
    return transport


def round_windows(marks: dict, start: float, end: float) -> dict[str, float | None]:
    """Wall seconds of each of :data:`WINDOWS` (None when a bound's message never crossed)."""

    def at(bound) -> float | None:
        if bound == "start":
            return start
        if bound == "end":
            return end
        name, which = bound
        return marks[name][0 if which == "first" else 1] if name in marks else None

    out: dict[str, float | None] = {}
    for name, lo, hi in WINDOWS:
        a, b = at(lo), at(hi)
        out[name] = None if a is None or b is None else max(0.0, b - a)
    return out


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def partition_for(
    graph, clients: int, variant: str, neighbour_cap: int | None, beta: float, seed: int, owner=None
) -> tuple:
    """The split :func:`run_overhead` measures (FedGAT's) and the settings it was made with (the
    variant's default neighbour cap filled in): also what ``fedgat bench overhead`` estimates the
    server's spool on before it starts."""
    from fedgat.methods import fedgat_partition, resolve_hparams

    hp = resolve_hparams("fedgat", {"variant": variant, "neighbour_cap": neighbour_cap})
    return fedgat_partition(graph, clients, beta, seed, hp, owner), hp


def load_graph(dataset: str, nodes: int | None = None, seed: int = 0):
    from fedgat.data import load_dataset

    if dataset != "synthetic":
        return load_dataset(dataset)
    n = nodes or 200
    return load_dataset(
        "synthetic",
        num_nodes=n,
        num_classes=4,
        num_features=32,
        train_per_class=max(2, min(20, n // 16)),
        num_val=n // 5,
        num_test=n // 5,
        seed=seed,
    )


def plaintext_bytes(partition, encodings: dict, d: int) -> dict:
    """float32 payload of the plaintext round: every owned feature row up once, every needed node's
    encoding rows (all rows, h_i included) down to every client that needs it; ``client_bytes``: each
    client's up and down (client id as a string -> bytes), for the critical path."""
    clients = {}
    for c, client in enumerate(partition.clients):
        down = sum(int(np.prod(b.features.shape)) * 4 for b in encodings[c].buckets) if c in encodings else 0
        clients[str(c)] = len(client.owned) * d * 4 + down
    down = sum(int(np.prod(b.features.shape)) * 4 for enc in encodings.values() for b in enc.buckets)
    return {"bytes_up": partition.num_nodes * d * 4, "bytes_down": down, "client_bytes": clients}


# ----------------------------------------------------------------------------- critical path
def party_phase_table(
    party_timings: dict[int, dict[str, float]], traffic: dict[tuple[int, int, str], list[int]], server: int
) -> dict[str, dict]:
    """Per party (id as a string, for JSON): its role, the seconds its own clock charged to each phase
    (``compute_s``) and the frame bytes it sent and received per phase. ``traffic`` is a transport's
    count, (sender, recipient, message type name) -> [messages, bytes]
    (:class:`fedgat.protocols.transport.TrafficLog`); a frame is charged to its message type's phase
    (:data:`fedgat.protocols.party.PHASES`; unknown types to ``setup``, as a party's clock does)."""
    from fedgat.protocols.party import PHASES as MESSAGE_PHASES

    phase_of = {cls.__name__: phase for cls, phase in MESSAGE_PHASES.items()}
    pids = sorted(set(party_timings) | {s for s, _, _ in traffic} | {r for _, r, _ in traffic})
    table: dict[str, dict] = {
        str(pid): {
            "role": "server" if pid == server else "client",
            "compute_s": {ph: float(t) for ph, t in party_timings.get(pid, {}).items()},
            "bytes_sent": {},
            "bytes_received": {},
        }
        for pid in pids
    }
    for (sender, recipient, type_name), (_, size) in sorted(traffic.items()):
        phase = phase_of.get(type_name, "setup")
        for pid, key in ((sender, "bytes_sent"), (recipient, "bytes_received")):
            counts = table[str(pid)][key]
            counts[phase] = counts.get(phase, 0) + int(size)
    return table


def link_speeds(link_gbps: float, server_link_gbps: float | None = None) -> tuple[float, float]:
    """``(client, server)`` link speeds in Gbit/s (the server's defaults to the clients').

    Raises:
        ValueError: a speed that is not a positive number.
    """
    server = link_gbps if server_link_gbps is None else server_link_gbps
    for name, value in (("link", link_gbps), ("server link", server)):
        if not (isinstance(value, int | float) and np.isfinite(value) and value > 0):
            raise ValueError(f"{name} speed must be a positive number of Gbit/s, got {value!r}")
    return float(link_gbps), float(server)


def describe_links(path: dict) -> str:
    """A critical path's link speeds for people: ``1 Gbit/s links`` or ``1 Gbit/s client links, 10 Gbit/s
    server link``."""
    link, server = path["link_gbps"], path.get("server_link_gbps", path["link_gbps"])
    if server == link:
        return f"{link:g} Gbit/s links"
    return f"{link:g} Gbit/s client links, {server:g} Gbit/s server link"


def critical_path(
    parties: dict[str, dict], link_gbps: float = LINK_GBPS, server_link_gbps: float | None = None
) -> dict:
    """The critical path of a deployment with every party on its own machine, from
    :func:`party_phase_table`: for each phase (in :data:`PATH_PHASES` order, then any other, by name),
    the party that takes longest over it -- its own clock's compute plus the bytes it sent and received
    in the phase over its own link, a client's at ``link_gbps`` Gbit/s, the server's at
    ``server_link_gbps`` (default ``link_gbps``; a server in a data centre often has 10) -- with that
    compute, those bytes and their transfer time. The server's link carries every upload and every
    result, so in those phases it is often the server's bytes, not the slowest client's, that hold the
    path. ``seconds`` sums the phases; ``busiest_link`` names the party with the most bytes in the phase
    (None: no frames).

    Raises:
        ValueError: a link speed that is not a positive number.
    """
    link_gbps, server_link_gbps = link_speeds(link_gbps, server_link_gbps)

    def bits_per_second(pid: str) -> float:
        return (server_link_gbps if parties[pid]["role"] == "server" else link_gbps) * 1e9

    seen = {
        ph for p in parties.values() for key in ("compute_s", "bytes_sent", "bytes_received") for ph in p[key]
    }
    order = [ph for ph in PATH_PHASES if ph in seen] + sorted(seen - set(PATH_PHASES))

    def moved(pid: str, phase: str) -> int:
        p = parties[pid]
        return p["bytes_sent"].get(phase, 0) + p["bytes_received"].get(phase, 0)

    def took(pid: str, phase: str) -> float:
        return parties[pid]["compute_s"].get(phase, 0.0) + moved(pid, phase) * 8 / bits_per_second(pid)

    rows = []
    for phase in order:
        slowest = max(parties, key=lambda pid: took(pid, phase))
        busiest = max(parties, key=lambda pid: moved(pid, phase))
        p = parties[slowest]
        compute, sent, received = (
            p["compute_s"].get(phase, 0.0),
            p["bytes_sent"].get(phase, 0),
            p["bytes_received"].get(phase, 0),
        )
        transfer = (sent + received) * 8 / bits_per_second(slowest)
        rows.append(
            {
                "phase": phase,
                "party": int(slowest),
                "role": p["role"],
                "compute_s": compute,
                "bytes_sent": sent,
                "bytes_received": received,
                "bytes": sent + received,
                "transfer_s": transfer,
                "seconds": compute + transfer,
                "busiest_link": (
                    {
                        "party": int(busiest),
                        "bytes": moved(busiest, phase),
                        "transfer_s": moved(busiest, phase) * 8 / bits_per_second(busiest),
                    }
                    if moved(busiest, phase)
                    else None
                ),
            }
        )
    return {
        "link_gbps": link_gbps,
        "server_link_gbps": server_link_gbps,
        "seconds": sum(r["seconds"] for r in rows),
        "compute_s": sum(r["compute_s"] for r in rows),
        "transfer_s": sum(r["transfer_s"] for r in rows),
        "phases": rows,
    }


def plaintext_path(
    plaintext: dict, link_gbps: float, server_link_gbps: float | None = None, clients: int | None = None
) -> dict:
    """The plaintext round deployed like the encrypted one: the clients' float32 rows up and the
    encodings down, the server's compute (the round's wall time) between; the clients' own plaintext
    work is not timed and taken as free. The transfer is the longer of the server's link carrying
    every byte and the busiest client's link carrying its own (``plaintext["client_bytes"]``; a result
    written before they were recorded takes the bytes as evenly split among ``clients``, which can only
    make that client's share smaller)."""
    link_gbps, server_link_gbps = link_speeds(link_gbps, server_link_gbps)
    bits = (plaintext["bytes_up"] + plaintext["bytes_down"]) * 8
    compute = plaintext["phases"]["round"]["wall"]
    transfer = bits / (server_link_gbps * 1e9)
    busiest = max((plaintext.get("client_bytes") or {}).values(), default=None)
    if busiest is not None:
        transfer = max(transfer, busiest * 8 / (link_gbps * 1e9))
    elif clients:
        transfer = max(transfer, bits / (clients * link_gbps * 1e9))
    return {
        "link_gbps": link_gbps,
        "server_link_gbps": server_link_gbps,
        "compute_s": compute,
        "transfer_s": transfer,
        "seconds": compute + transfer,
    }


def relink(r: dict, link_gbps: float, server_link_gbps: float | None = None) -> dict:
    """One run's results (:func:`run_overhead`, or its JSON) with both critical paths and the deployed
    ratio recomputed at ``link_gbps`` (the server's at ``server_link_gbps``, default the same) from the
    per-party table it recorded (``fedgat bench overhead --from-json FILE --link-gbps X
    [--server-link-gbps Y]``: what a deployment on slower or faster links would take, without running
    it again).

    Raises:
        ValueError: a result without the per-party table (written before 2026-11-27), or a link speed
            that is not positive.
    """
    cp = r.get("critical_path") or {}
    if "parties" not in cp:
        raise ValueError(
            "these results have no per-party table to recompute the critical path from (older run)"
        )
    path = critical_path(cp["parties"], link_gbps, server_link_gbps)
    path["server_compute"], path["parties"] = cp.get("server_compute"), cp["parties"]
    plain = dict(r["plaintext"])
    plain["critical_path"] = plaintext_path(plain, link_gbps, server_link_gbps, r.get("clients"))
    plain["critical_path_s"] = plain["critical_path"]["seconds"]
    ratios = {
        **r["ratios"],
        "critical_path": path["seconds"] / plain["critical_path_s"] if plain["critical_path_s"] else None,
    }
    relinked = {
        "from_gbps": cp.get("link_gbps"),
        "to_gbps": path["link_gbps"],
        "from_server_gbps": cp.get("server_link_gbps", cp.get("link_gbps")),
        "to_server_gbps": path["server_link_gbps"],
    }
    return {
        **r,
        "critical_path": path,
        "critical_path_s": path["seconds"],
        "plaintext": plain,
        "ratios": ratios,
        "relinked": relinked,
    }


# ------------------------------------------------------------------------------------ one run
def run_overhead(
    dataset: str = "cora",
    clients: int = 10,
    variant: str = "vector",
    *,
    preset: str = "n4096",
    seed: int = 0,
    beta: float = 1.0,
    neighbour_cap: int | None = None,
    nodes: int | None = None,
    workers: int | None = None,
    train: bool = True,
    rounds: int | None = None,
    progress: bool = False,
    measure_repeats: int = 5,
    owner: np.ndarray | None = None,
    link_gbps: float = LINK_GBPS,
    engine: str = "inprocess",
    engine_workers: int | None = None,
    wire: str = "compact",
    encrypt_workers: int | str = 0,
    replay: bool = True,
    server_link_gbps: float | None = None,
) -> dict:
    """Plaintext and encrypted pre-training rounds on the same partition and bases; see the module doc.
    ``replay=False`` (``--no-replay``) skips computing every result again with the clients idle (on
    Cora at 10 clients ~3 minutes on 2 cores): the ``*_alone_*`` ratios are then None, and a server
    with workers is charged its clock on the critical path.
    ``encrypt_workers``: processes each client may encrypt on (``"auto"``: see
    :func:`fedgat.app.auto_encrypt_workers`; the CLI's default).
    ``wire``: the encrypted round's ciphertext wire (``"compact"`` or ``"tenseal"``, the per-operation
    sizes and serialisation costs are measured in the same wire).
    ``owner``: the user's split (one client id per node, ``fedgat bench overhead --owners``) instead of
    the Dirichlet one. ``link_gbps``: the clients' link speed for the critical path, ``server_link_gbps``
    the server's (default the same). ``engine``: where
    the encrypted round's clients run (:data:`ENGINES`; ``engine_workers``: the process engine's
    workers, default one per usable core); the accuracy comparison trains in process either way."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    link_gbps, server_link_gbps = link_speeds(link_gbps, server_link_gbps)
    import torch

    from fedgat.crypto.evaluator import OpCounts
    from fedgat.crypto.measure import (
        children_cpu_seconds,
        evaluator_op_seconds,
        evaluator_op_seconds_busy,
        measure_preset,
        multiply_add_seconds,
    )
    from fedgat.pipeline import max_abs_error, plaintext_round, run_encrypted_pretraining, train_fedgat
    from fedgat.protocols import InProcessTransport

    torch.set_num_threads(1)
    graph = load_graph(dataset, nodes, seed)
    partition, hp = partition_for(graph, clients, variant, neighbour_cap, beta, seed, owner)
    cores = os.cpu_count() or 1
    d = graph.num_features

    # --- per-operation costs, measured in this run
    m = measure_preset(preset, repeats=measure_repeats, wire=wire)
    per_mad_tenseal = multiply_add_seconds(preset, repeats=max(30, 6 * measure_repeats))
    op_costs_alone = evaluator_op_seconds(preset, repeats=max(30, 6 * measure_repeats))

    # --- plaintext round (what run_plaintext_pretraining runs): the plan, then the plaintext
    # encoder over its compute buckets and the routing to the clients (the server compute)
    with PeakRSS() as plain_mem:
        w0, c0 = time.perf_counter(), time.process_time()
        plain_round = plaintext_round(graph, partition, variant, seed)
        w1, c1 = time.perf_counter(), time.process_time()
        plain = plain_round.run()
        w2, c2 = time.perf_counter(), time.process_time()
    plain_wall, plain_cpu = w2 - w0, c2 - c0
    pbytes = plaintext_bytes(partition, plain, d)
    plaintext = {
        "phases": {p: {"wall": 0.0, "cpu": 0.0} for p in PHASES},
        "bytes_up": pbytes["bytes_up"],
        "bytes_down": pbytes["bytes_down"],
        "client_bytes": pbytes["client_bytes"],
        "ciphertexts_up": 0,
        "ciphertexts_down": 0,
        "main_process_peak_rss": plain_mem.peak,
        "server_worker_peak_rss": 0,
        "slot_utilisation": None,
        "max_abs_error": 0.0,
        # of server_compute: plan_round and the uploads keyed like the spool (the encrypted server's
        # server_compute clock covers its plan_round too)
        "plan": {"wall": w1 - w0, "cpu": c1 - c0},
    }
    plaintext["phases"]["server_compute"] = {"wall": plain_wall, "cpu": plain_cpu}
    plaintext["phases"]["round"] = {"wall": plain_wall, "cpu": plain_cpu}

    # --- encrypted round (with the process engine: its pool starts inside the round, as in a demo)
    child_cpu0 = children_cpu_seconds()
    pool = None
    if engine == "process":
        from fedgat.protocols.process_engine import ProcessEngine

        pool = ProcessEngine(engine_workers, threads=1)
        transport = timed(pool.transport())
    else:  # the default one, kept for its per-party, per-type byte counts
        transport = timed(InProcessTransport())
    hosts: dict = {}
    load_before = load_average()
    try:
        with PeakRSS(
            exclude=lambda: {w.process.pid for w in list(pool.workers)} if pool else set()
        ) as enc_mem:
            c0, w0 = time.process_time(), time.perf_counter()
            pre = run_encrypted_pretraining(
                graph,
                partition,
                variant,
                preset,
                seed,
                transport,
                progress=progress,
                workers=workers,
                measure_server_alone=replay,
                wire=wire,
                encrypt_workers=encrypt_workers,
            )
            enc_cpu = time.process_time() - c0
            windows = round_windows(getattr(transport, "frame_marks", {}), w0, w0 + pre.wall_seconds)
        if pool is not None:  # the client workers' own accounts, before they are stopped
            memory = pool.memory()
            hosts = {
                "workers": len(memory),
                "cpu_seconds": sum(m["cpu_seconds"] for m in memory),
                "peak_rss": [m["peak_rss"] for m in memory],
                "start_seconds": pool.start_seconds,
                "placement_seconds": transport.placement_seconds,
                "report_seconds": transport.export_seconds,
            }
    finally:
        if pool is not None:
            pool.shutdown()
    load_after = load_average()
    worker_cpu = children_cpu_seconds() - child_cpu0
    if pool is not None:  # reaped at shutdown: theirs is in client_workers, not the server's
        worker_cpu -= hosts["cpu_seconds"]
    # the in-process clients' encryption workers are children of this process too: their CPU is in
    # phases.encrypt (the clients charge it there), not the server's
    worker_cpu -= pre.encrypt_worker_cpu
    # the replay of the server's compute (measure_server_alone) is not part of the round
    enc_cpu -= pre.server_compute_alone_cpu[0]
    worker_cpu -= pre.server_compute_alone_cpu[1]
    # sampled from /proc: RUSAGE_CHILDREN.ru_maxrss would report the parent's resident set at fork time
    # (Linux keeps ru_maxrss across the spawn's fork + exec), not what a worker used
    worker_peak = enc_mem.child_peak
    error = max_abs_error(pre.encodings, plain)
    phases = {p: {"wall": pre.phases.get(p, 0.0), "cpu": pre.cpu_phases.get(p, 0.0)} for p in PHASES}
    phases["server_compute"]["cpu"] += worker_cpu
    phases["round"] = {
        "wall": pre.wall_seconds,
        "cpu": enc_cpu + worker_cpu + pre.encrypt_worker_cpu + hosts.get("cpu_seconds", 0.0),
    }
    span = pre.server_compute_span

    # --- critical path of a deployment (every party on its own machine)
    server = pre.deployment.server
    parties = party_phase_table(pre.party_timings, transport.traffic, server)
    clock = parties[str(server)]["compute_s"].get("server_compute", 0.0)
    if pre.server_workers and replay:  # its clock counted the waits for its workers, not their compute
        parties[str(server)]["compute_s"]["server_compute"] = max(clock, pre.server_compute_alone)
    path = critical_path(parties, link_gbps, server_link_gbps)
    path["server_compute"] = {
        "clock_s": clock,
        "replay_alone_s": pre.server_compute_alone if replay else None,
        "used": (
            "max(clock, replay alone): server workers"
            if pre.server_workers and replay
            else "clock (no replay: a lower bound with server workers)"
            if pre.server_workers
            else "clock"
        ),
    }
    path["parties"] = parties
    encrypted = {
        "phases": phases,
        "bytes_up": pre.bytes_up,
        "bytes_down": pre.bytes_down,
        "messages_up": pre.messages_up,
        "messages_down": pre.messages_down,
        "ciphertexts_up": pre.ciphertexts_up,
        "ciphertexts_down": pre.ciphertexts_down,
        "result_ciphertexts": pre.result_ciphertexts,
        "multiply_adds": pre.multiply_adds,
        "server_workers": pre.server_workers,
        "encrypt_workers": pre.encrypt_workers,
        "encrypt_worker_cpu": pre.encrypt_worker_cpu,
        "server_compute_span": span,
        "server_worker_cpu": worker_cpu,
        "server_compute_alone": pre.server_compute_alone if replay else None,
        "server_compute_alone_cpu": {
            "main": pre.server_compute_alone_cpu[0],
            "workers": pre.server_compute_alone_cpu[1],
        },
        "main_process_peak_rss": enc_mem.peak,
        "server_worker_peak_rss": worker_peak,
        "server_workers_peak_rss_total": enc_mem.children_peak,
        "peak_rss_all_processes_at_most": enc_mem.peak
        + enc_mem.children_peak
        + sum(hosts.get("peak_rss", [])),
        # the process engine's client workers (their CPU is in phases.round.cpu; their peaks are
        # each worker's VmHWM); empty in process
        "client_workers": hosts,
        # wall seconds of the round's stretches (WINDOWS), read off the frames
        "windows": windows,
        "slot_utilisation": pre.slot_utilisation,
        "result_slot_utilisation": pre.result_slot_utilisation,
        "max_abs_error": error,
        "server_has_secret_key": pre.server_has_secret_key,
        "layout": {
            "d": pre.layout.d,
            "slots": pre.layout.slots,
            "chunks": pre.layout.chunks,
            "blocks": pre.layout.blocks,
        },
    }

    # --- what per-recipient keys cost and what the own share saves (same bases, same layout)
    from fedgat.crypto.encodings import multiply_adds as bucket_multiply_adds

    layout = pre.layout
    once = sum(bucket_multiply_adds(b, layout) for b in plain_round.plan.bases)
    full = sum(bucket_multiply_adds(v, layout) for views in plain_round.plan.views.values() for v in views)
    released = pre.ciphertexts_up // max(1, layout.chunks)
    keys = {
        "multiply_adds_once_per_node": once,
        "multiply_adds_per_recipient_full": full,
        "multiply_adds_per_recipient_foreign_share": pre.multiply_adds,
        "growth_per_recipient": full / once if once else None,
        "own_share_saving": 1 - pre.multiply_adds / full if full else None,
        "vs_once_per_node": pre.multiply_adds / once if once else None,
        "rows_released": released,
        "rows_owned": graph.num_nodes,
        "releases_per_row": released / graph.num_nodes,
        "tag_columns": layout.d - d,
    }

    # --- op-count lower bounds
    used = max(1, pre.server_workers or 1)
    # the server keeps `used` cores busy with multiply-adds; on this kind of VM two busy vCPUs are
    # slower per op than one alone, so the bound takes the op's cost measured that way
    busy = evaluator_op_seconds_busy(preset, used, repeats=max(60, 12 * measure_repeats))
    op_costs = {k: float(np.mean([b[k] for b in busy])) for k in busy[0]}
    ops = OpCounts.of_round(pre.multiply_adds, pre.result_ciphertexts, max(1, layout.chunks))
    server_ops_s = ops.seconds(op_costs)
    bound = {
        "op_counts": dataclasses.asdict(ops),
        "op_seconds": op_costs,
        "op_seconds_one_core_alone": op_costs_alone,
        "op_seconds_busy_per_process": busy,
        # the effective cost of one multiply-add (its share of encodings, additions and rescales)
        "seconds_per_multiply_add": server_ops_s / max(1, pre.multiply_adds),
        "seconds_per_multiply_add_one_core_alone": ops.seconds(op_costs_alone) / max(1, pre.multiply_adds),
        "seconds_per_multiply_add_tenseal": per_mad_tenseal,
        "seconds_per_encrypt": m["encrypt_serialize_ms"] / 1e3,
        "seconds_per_decrypt": m["decrypt_ms"] / 1e3,
        "cores": cores,
        "server_cores_used": used,
        "multiply_adds": pre.multiply_adds,
        "encryptions": pre.ciphertexts_up,
        "decryptions": pre.ciphertexts_down,
        "server_seconds": server_ops_s / used,
        # the same with the costs measured on one core while the others idle (not reachable when
        # the cores slow each other down)
        "server_seconds_alone_cost": ops.seconds(op_costs_alone) / used,
        # what TenSEAL's vector API (encode, multiply, rescale per product) would need
        "tenseal_seconds": pre.multiply_adds * per_mad_tenseal / used,
        # serialising the results: overhead on top of the bound
        "serialise_seconds": pre.result_ciphertexts * op_costs["save"] / used,
        "encrypt_seconds": pre.ciphertexts_up * m["encrypt_serialize_ms"] / 1e3,
        "decrypt_seconds": pre.ciphertexts_down * m["decrypt_ms"] / 1e3,
    }
    bound["round_seconds"] = (
        bound["server_seconds"] + (bound["encrypt_seconds"] + bound["decrypt_seconds"]) / cores
    )

    # --- accuracy reached by training on each
    accuracy = {"plaintext": None, "encrypted": None}
    if train:
        kw = {"neighbour_cap": hp["neighbour_cap"], "variant": variant}
        if rounds is not None:
            kw["rounds"] = rounds
        accuracy["encrypted"] = train_fedgat(
            graph,
            partition,
            pre.encodings,
            seed=seed,
            deployment=pre.deployment,
            fingerprint=pre.fingerprint,
            progress=progress,
            **kw,
        ).fit.test_accuracy
        accuracy["plaintext"] = train_fedgat(
            graph, partition, plain, seed=seed, progress=progress, **kw
        ).fit.test_accuracy
    plaintext["test_accuracy"], encrypted["test_accuracy"] = accuracy["plaintext"], accuracy["encrypted"]

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    plaintext["critical_path"] = plaintext_path(plaintext, link_gbps, server_link_gbps, partition.num_clients)
    plaintext["critical_path_s"] = plaintext["critical_path"]["seconds"]
    ratios = {
        # deployment against deployment: the two critical paths over the same links
        "critical_path": ratio(path["seconds"], plaintext["critical_path_s"]),
        # the simulation's wall time (every party in this process) against the plaintext compute
        "time": ratio(phases["round"]["wall"], plain_wall),
        "cpu": ratio(phases["round"]["cpu"], plain_cpu),
        "server_compute_time": ratio(
            phases["server_compute"]["wall"], plaintext["phases"]["server_compute"]["wall"]
        ),
        "bytes": ratio(pre.bytes_up + pre.bytes_down, pbytes["bytes_up"] + pbytes["bytes_down"]),
        "bytes_up": ratio(pre.bytes_up, pbytes["bytes_up"]),
        "bytes_down": ratio(pre.bytes_down, pbytes["bytes_down"]),
        # every process of the encrypted round (main + server and client workers, at most) over the
        # plaintext round's one process; ``memory_main``: main process over main process
        "memory": ratio(encrypted["peak_rss_all_processes_at_most"], plain_mem.peak),
        "memory_main": ratio(encrypted["main_process_peak_rss"], plain_mem.peak),
        # the server's compute span (start of compute to last result; overlaps the clients'
        # download and decryption on the same cores) over the op-count bound
        "server_vs_op_bound": ratio(span, bound["server_seconds"]),
        # the same compute replayed after the round with the clients idle (as on a server of its own)
        "server_alone_vs_op_bound": ratio(pre.server_compute_alone, bound["server_seconds"])
        if replay
        else None,
        # CPU seconds of the server's compute (workers + its share of this process) over the op count
        "server_cpu_vs_op_count": ratio(phases["server_compute"]["cpu"], server_ops_s),
        "server_alone_vs_op_bound_alone_cost": ratio(
            pre.server_compute_alone, bound["server_seconds_alone_cost"]
        )
        if replay
        else None,
        "round_vs_op_bound": ratio(phases["round"]["wall"], bound["round_seconds"]),
    }
    # --- bytes against the floor (fedgat.crypto.compact): the ciphertexts moved at their envelope
    # sizes (measure_preset), over the floors of the same ciphertexts; per useful slot the unused
    # slots count against it (uploads at the nominal utilisation, results at the measured one)
    from fedgat.crypto import get_preset

    cp = get_preset(preset)
    ct_up, ct_down = pre.ciphertexts_up, pre.ciphertexts_down
    ct_bytes = ct_up * m["fresh_bytes"] + ct_down * m["result_bytes"]
    floor_total = ct_up * cp.floor_bytes("fresh") + ct_down * cp.floor_bytes("result")
    result_use = pre.result_slot_utilisation if ct_down else 0.0
    useful = cp.slots * (ct_up * pre.slot_utilisation + ct_down * result_use)
    per_useful = ct_bytes / useful if useful else None
    floor_per_slot = floor_total / (cp.slots * (ct_up + ct_down)) if ct_up + ct_down else 0.0
    encrypted["ciphertext_bytes"] = ct_bytes
    encrypted["ciphertext_floor_bytes"] = floor_total
    encrypted["bytes_per_useful_slot"] = per_useful
    ratios["bytes_vs_floor"] = ratio(ct_bytes, floor_total)
    # every frame (signatures, headers, contexts, bases included) over the same floors
    ratios["frame_bytes_vs_floor"] = ratio(pre.bytes_up + pre.bytes_down, floor_total)
    ratios["bytes_per_useful_slot_vs_floor"] = ratio(per_useful or 0.0, floor_per_slot)
    ratios["bytes_per_useful_slot_vs_float32"] = ratio(per_useful or 0.0, 4.0)
    return {
        "dataset": graph.name,
        "num_nodes": graph.num_nodes,
        # where the encrypted round's clients ran: inprocess (this process) or process (worker
        # processes, the server here)
        "engine": engine,
        # the simulation's wall time of the encrypted round (every party in this process) and the
        # critical path of a deployment with every party on its own machine (see the module doc)
        "wall_s": pre.wall_seconds,
        "critical_path_s": path["seconds"],
        "critical_path": path,
        "num_features": d,
        "clients": clients,
        "variant": variant,
        "preset": preset,
        "wire": wire,
        "seed": seed,
        # the split: a Dirichlet label split of concentration beta, or the user's owners (beta unused)
        "beta": beta if owner is None else None,
        "split": f"Dirichlet beta {beta:g}" if owner is None else "the user's owners",
        "neighbour_cap": hp["neighbour_cap"],
        "rounds": rounds,
        "cores": cores,
        "plaintext": plaintext,
        "encrypted": encrypted,
        "ratios": ratios,
        "per_recipient_keys": keys,
        "slot_utilisation": {"nominal": pre.slot_utilisation, "results": pre.result_slot_utilisation},
        "op_bound": bound,
        "measured_preset": {
            k: m[k]
            for k in (
                "encrypt_ms",
                "encrypt_serialize_ms",
                "mul_plain_ms",
                "add_ms",
                "lincomb_ms",
                "terms",
                "decrypt_ms",
                "serialize_ms",
                "deserialize_ms",
                "fresh_bytes",
                "result_bytes",
                "tenseal_fresh_bytes",
                "tenseal_result_bytes",
                "fresh_floor_bytes",
                "result_floor_bytes",
                "fresh_vs_floor",
                "result_vs_floor",
            )
        },
        "fedgraph_fedgcn_he": FEDGRAPH_FEDGCN_HE,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cores": cores,
            # 1-minute load averages around the encrypted round: other jobs on the cores slow it
            "load_average_before_after": [load_before, load_after],
        },
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def estimate_matrix(
    dataset: str = "cora",
    clients: int = 10,
    cap: int = 16,
    preset: str = "n4096",
    seed: int = 0,
    beta: float = 1.0,
    seconds_per_multiply_add: float | None = None,
    nodes: int | None = None,
) -> dict:
    """Cost of the matrix variant without running it (:func:`fedgat.estimate.estimate_pretraining`), on
    the graph the run used (``nodes``, ``seed``: the synthetic one's size and seed)."""
    from fedgat.estimate import estimate_pretraining

    graph = load_graph(dataset, nodes, seed)
    partition, _ = partition_for(graph, clients, "matrix", cap, beta, seed)
    est = estimate_pretraining(
        partition,
        "matrix",
        graph.num_features,
        preset,
        seconds_per_multiply_add=seconds_per_multiply_add,
        ship_m2=True,
    )
    ours = estimate_pretraining(
        partition, "matrix", graph.num_features, preset, seconds_per_multiply_add=seconds_per_multiply_add
    )
    cores = os.cpu_count() or 1
    est.update(
        dataset=graph.name,
        clients=clients,
        neighbour_cap=cap,
        cores=cores,
        server_seconds_all_cores=est["server_seconds"] / cores,
        protocol="paper (server ships M2)",
        derived_m2={
            k: ours[k]
            for k in ("multiply_adds", "bytes_down", "result_ciphertexts_down", "max_rows_per_node")
        },
    )
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    est["why"] = (
        f"The paper's protocol, not run: its clients' decrypted encodings alone are "
        f"{est['decrypted_bytes_float64'] / 1e9:.1f} GB of float64 on a machine with "
        f"{ram / 1e9:.0f} GB of RAM, and {est['bytes_down'] / 1e9:.0f} GB of result ciphertexts "
        f"would cross the transport ({est['bytes_down'] / (1e6 * est['result_ciphertexts_down']):.3f} MB "
        f"each). This implementation's clients derive M2 from K2 and the bases "
        f"(`BucketBases.m2_map`), so its server computes {ours['multiply_adds']:.3g} multiply-adds and "
        f"ships {ours['bytes_down'] / 1e9:.1f} GB, and the round runs: "
        f"`fedgat bench overhead --variant matrix --neighbour-cap {cap}`."
    )
    return est


# ------------------------------------------------------------------------------------ output
def _fmt_s(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def _mb(x: float) -> str:
    """Bytes in MB (kB below one MB, where 0.0 MB would hide them)."""
    return f"{x / 1e6:.1f} MB" if x >= 1e6 or x == 0 else f"{x / 1e3:.1f} kB"


def _r(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}x"


def format_table(r: dict) -> str:
    p, e, ratios, b = r["plaintext"], r["encrypted"], r["ratios"], r["op_bound"]
    lines = [
        (
            f"{r['dataset']}, {r['clients']} clients, {r['variant']}, preset {r['preset']}, "
            f"{e['server_workers'] or 'in-process'} server workers, {r['cores']} cores, engine "
            f"{r.get('engine', 'inprocess')}"
            + (f" ({e['client_workers']['workers']} client workers)" if e.get("client_workers") else "")
        ),
        f"{'phase':<16}{'plain wall':>11}{'plain cpu':>10}{'enc s':>10}{'enc cpu':>10}   (enc s: summed over parties)",
    ]
    for name in (*PHASES, "round"):
        pp, ee = p["phases"][name], e["phases"][name]
        lines.append(
            f"{name:<16}{_fmt_s(pp['wall']):>11}{_fmt_s(pp['cpu']):>10}{_fmt_s(ee['wall']):>10}"
            f"{_fmt_s(ee['cpu']):>10}"
        )
    lines += [
        f"bytes up      plaintext {_mb(p['bytes_up'])}  encrypted {_mb(e['bytes_up'])}  ({_r(ratios['bytes_up'])})",
        (
            f"bytes down    plaintext {_mb(p['bytes_down'])}  encrypted {_mb(e['bytes_down'])}  "
            f"({_r(ratios['bytes_down'])})"
        ),
        (
            f"ciphertexts   up {e['ciphertexts_up']}  down {e['ciphertexts_down']}  distinct results "
            f"{e['result_ciphertexts']}"
        ),
        (
            f"memory        plaintext peak {_mb(p['main_process_peak_rss'])}  encrypted main {_mb(e['main_process_peak_rss'])}"
            + (f"  largest server worker {_mb(e['server_worker_peak_rss'])}" if e["server_workers"] else "")
        ),
        f"slots         nominal {r['slot_utilisation']['nominal']:.1%}, results {r['slot_utilisation']['results']:.1%}",
        (
            f"floor         ciphertext bytes {_r(ratios.get('bytes_vs_floor'), 3)} their floor, per useful slot "
            f"{_r(ratios.get('bytes_per_useful_slot_vs_floor'))} the floor and "
            f"{_r(ratios.get('bytes_per_useful_slot_vs_float32'))} float32"
        ),
        f"max |enc - plain| {e['max_abs_error']:.2e}",
        (
            f"op bound      {b['multiply_adds']} multiply-adds x {b['seconds_per_multiply_add'] * 1e3:.3f} ms "
            f"(cores busy; {b.get('seconds_per_multiply_add_one_core_alone', float('nan')) * 1e3:.3f} ms alone) / "
            f"{b['server_cores_used']} cores = {b['server_seconds']:.1f} s server; encrypt {b['encrypt_seconds']:.1f} s, "
            f"decrypt {b['decrypt_seconds']:.1f} s (one core)"
        ),
        (
            f"ratios        deployed {_r(ratios.get('critical_path'))}  simulated {_r(ratios['time'])}  "
            f"bytes {_r(ratios['bytes'])}  memory {_r(ratios['memory'])}  "
            f"server span/op-bound {_r(ratios['server_vs_op_bound'])}  "
            f"server alone/op-bound {_r(ratios.get('server_alone_vs_op_bound'))}  "
            f"round/op-bound {_r(ratios['round_vs_op_bound'])}"
        ),
    ]
    w = e.get("windows")
    if w:
        lines.append(
            "windows (wall) "
            + ", ".join(f"{name} {_fmt_s(v) if v is not None else '-'}" for name, v in w.items())
        )
    k = r.get("per_recipient_keys")
    if k:
        lines.append(
            f"per-recipient keys  multiply-adds {k['multiply_adds_per_recipient_foreign_share']} (foreign shares) vs "
            f"{k['multiply_adds_once_per_node']} once per node ({_r(k['vs_once_per_node'])}); full encodings per "
            f"recipient would be {_r(k['growth_per_recipient'])}, the own share saves {k['own_share_saving']:.0%}; "
            f"{k['releases_per_row']:.2f} releases per row"
        )
    cp = r.get("critical_path")
    if cp:
        lines.append(
            f"deployment    critical path {r['critical_path_s']:.2f} s over {describe_links(cp)} "
            f"(compute {cp['compute_s']:.2f} s + transfer {cp['transfer_s']:.2f} s); simulation wall "
            f"{r['wall_s']:.2f} s"
            + (
                f"; plaintext deployed {p['critical_path_s']:.2f} s"
                if p.get("critical_path_s") is not None
                else ""
            )
        )
    if p.get("test_accuracy") is not None:
        lines.append(f"test accuracy plaintext {p['test_accuracy']:.3f}  encrypted {e['test_accuracy']:.3f}")
    return "\n".join(lines)


def render_critical_path(r: dict) -> list[str]:
    """The markdown section of ``r["critical_path"]`` (none for results written before it)."""
    cp = r.get("critical_path")
    if not cp:
        return []
    out = [
        "",
        f"## Critical path of a deployment: every party on its own machine, {describe_links(cp)}",
        "",
        (
            "Per phase in protocol order: the party that takes longest over it -- the time its own clock "
            "charged to the phase plus the bytes it sends and receives in the phase over its own link (the "
            "server's link carries every upload and every result) -- with that compute, those bytes and "
            "their transfer time. Each party's clock is wall time in this simulation, where the parties "
            f"share this machine's {r['cores']} cores: a party on a machine of its own would be at most as "
            "slow. Phases are taken as barriers (the round overlaps some of them), latency is left out. "
            f"Server compute: {cp.get('server_compute', {}).get('used', 'clock')}."
        ),
        "",
        "| phase | party holding it | compute s | bytes sent + received | transfer s | phase s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in cp["phases"]:
        out.append(
            f"| {row['phase']} | {row['role']} {row['party']} | {row['compute_s']:.3f} | {_mb(row['bytes'])} | "
            f"{row['transfer_s']:.3f} | {row['seconds']:.3f} |"
        )
    out += [
        (
            f"| **critical path** | | {cp['compute_s']:.3f} | {_mb(sum(x['bytes'] for x in cp['phases']))} | "
            f"{cp['transfer_s']:.3f} | **{r['critical_path_s']:.2f}** |"
        ),
        "",
        f"Simulation wall time of the encrypted round (every party in one process): {r['wall_s']:.2f} s.",
    ]
    plain = r.get("plaintext", {}).get("critical_path")
    if plain:
        out += [
            "",
            (
                f"The plaintext round deployed the same way: {plain['compute_s']:.2f} s of server compute + "
                f"{plain['transfer_s']:.2f} s for its float32 rows and encodings (every byte crosses the "
                "server's link, each client's share its own) = "
                f"**{plain['seconds']:.2f} s** (the clients' own plaintext work not counted); encrypted / "
                f"plaintext deployed: **{_r(r['ratios'].get('critical_path'))}**."
            ),
        ]
    return out


#: quantities of the before/after table: (label, path into the result)
_BEFORE_AFTER = (
    ("bytes up", ("encrypted", "bytes_up")),
    ("bytes down", ("encrypted", "bytes_down")),
    ("messages up / down", None),
    ("ciphertexts up", ("encrypted", "ciphertexts_up")),
    ("ciphertexts down", ("encrypted", "ciphertexts_down")),
    ("multiply-adds (op count)", ("encrypted", "multiply_adds")),
    ("round wall s", ("encrypted", "phases", "round", "wall")),
    ("encrypt wall s", ("encrypted", "phases", "encrypt", "wall")),
    ("encryption workers per client", ("encrypted", "encrypt_workers")),
    ("critical path s", ("critical_path_s",)),
    ("deployed / plaintext deployed", ("ratios", "critical_path")),
    ("server alone / op bound", ("ratios", "server_alone_vs_op_bound")),
    ("max abs error", ("encrypted", "max_abs_error")),
    ("test accuracy (encrypted)", ("encrypted", "test_accuracy")),
)


def _get(r: dict, path: tuple) -> object:
    for key in path:
        if not isinstance(r, dict) or key not in r:
            return None
        r = r[key]
    return r


def _cell(x: object) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.3g}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def render_before_after(r: dict) -> list[str]:
    """The markdown table of ``r["baseline"]`` (an earlier overhead JSON) beside this run."""
    base = r.get("baseline")
    if not base:
        return []
    out = [
        "",
        f"## Before / after: {base.get('label', 'baseline')}",
        "",
        f"Baseline: {base.get('source', 'an earlier run')} ({base.get('date', '?')}); after: this run."
        + (f" The baseline's setting differs in: {base['differs_in']}." if base.get("differs_in") else ""),
        "",
        "| quantity | before | after | after / before |",
        "|---|---:|---:|---:|",
    ]
    for label, path in _BEFORE_AFTER:
        if path is None:
            b = f"{_cell(_get(base, ('encrypted', 'messages_up')))} / {_cell(_get(base, ('encrypted', 'messages_down')))}"
            a = f"{_cell(_get(r, ('encrypted', 'messages_up')))} / {_cell(_get(r, ('encrypted', 'messages_down')))}"
            out.append(f"| {label} | {b} | {a} | |")
            continue
        b, a = _get(base, path), _get(r, path)
        ratio = a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
        out.append(f"| {label} | {_cell(b)} | {_cell(a)} | {_r(ratio)} |")
    return out


def _load_caution(r: dict) -> list[str]:
    """A paragraph when other work was running as the round started: the 1-minute load average before it
    above half the cores (the one after it measures the round itself, which keeps every core busy)."""
    load = r.get("machine", {}).get("load_average_before_after") or []
    before = load[0] if load else None
    if before is None or before <= r["cores"] / 2:
        return []
    return [
        "",
        (
            f"**Caution:** other work was running as the round started (1-minute load average {before:.2f} on "
            f"{r['cores']} cores): times are upper bounds."
        ),
    ]


def render_markdown(r: dict, matrix: dict | None = None) -> str:
    p, e, ratios, b = r["plaintext"], r["encrypted"], r["ratios"], r["op_bound"]
    out = [
        f"# Encrypted vs plaintext pre-training: {r['dataset']}, {r['clients']} clients, {r['variant']}",
        "",
        (
            f"Preset {r['preset']}, wire {r.get('wire', 'compact')}, split {r.get('split', '?')}, "
            f"{r['cores']} cores, server workers: {e['server_workers'] or 'in process'}, "
            f"encryption workers per client: {('up to ' + str(e['encrypt_workers'])) if e.get('encrypt_workers') else 'in process'} (a client with little to encrypt starts fewer), "
            f"seed {r['seed']}, {r['date']}. Generated by `benchmarks/overhead.py` (`fedgat bench overhead`)"
            + (f": `{r['command']}`" if r.get("command") else "")
            + "."
            + (
                f" **Recomputed** for {_relinked(r['relinked'], 'to')} from `{r['relinked'].get('source', '?')}` "
                f"(measured for {_relinked(r['relinked'], 'from')}; nothing was run again"
                + (f": `{r['relinked']['command']}`" if r["relinked"].get("command") else "")
                + ")."
                if r.get("relinked")
                else ""
            )
        ),
        *_load_caution(r),
        "",
        "| phase | plaintext wall s | plaintext CPU s | encrypted s (summed over parties) | encrypted CPU s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in (*PHASES, "round"):
        pp, ee = p["phases"][name], e["phases"][name]
        label = "round (wall time)" if name == "round" else name
        out.append(f"| {label} | {pp['wall']:.2f} | {pp['cpu']:.2f} | {ee['wall']:.2f} | {ee['cpu']:.2f} |")
    out += [
        "",
        (
            "Encrypted phases: the seconds each party's own clock charged to the phase, summed over the "
            "parties; they work at the same time, so the phases add up to more than the round's wall time. "
            "`server_compute` is only the time the round waited for the server (its workers compute while "
            "the clients work); the server's compute itself is below (span, and replayed alone)."
        ),
    ]
    acc = (
        f"{p['test_accuracy']:.3f} | {e['test_accuracy']:.3f}"
        if p.get("test_accuracy") is not None
        else "not trained | not trained"
    )
    out += [
        "",
        "| quantity | plaintext | encrypted | ratio |",
        "|---|---:|---:|---:|",
        f"| bytes up | {_mb(p['bytes_up'])} | {_mb(e['bytes_up'])} | {_r(ratios['bytes_up'])} |",
        f"| bytes down | {_mb(p['bytes_down'])} | {_mb(e['bytes_down'])} | {_r(ratios['bytes_down'])} |",
        f"| ciphertexts up / down | - | {e['ciphertexts_up']} / {e['ciphertexts_down']} | |",
        (
            f"| ciphertext bytes vs their floor (per useful slot) | - | {_mb(e.get('ciphertext_bytes', 0))} | "
            f"{_r(ratios.get('bytes_vs_floor'), 3)} ({_r(ratios.get('bytes_per_useful_slot_vs_floor'))}) |"
        ),
        (
            f"| peak RSS, main process (clients + server state machine) | {_mb(p['main_process_peak_rss'])} | "
            f"{_mb(e['main_process_peak_rss'])} | {_r(ratios.get('memory_main'))} |"
        ),
        (
            f"| peak RSS, largest server worker | - | "
            f"{_mb(e['server_worker_peak_rss']) if e['server_workers'] else 'none (server in process)'} | |"
        ),
        (
            f"| peak RSS, every process at most (main + workers) | {_mb(p['main_process_peak_rss'])} | "
            f"{_mb(e['peak_rss_all_processes_at_most'])} | {_r(ratios['memory'])} |"
        ),
        (
            f"| slot utilisation (nominal / results) | - | {e['slot_utilisation']:.1%} / "
            f"{e['result_slot_utilisation']:.1%} | |"
        ),
        f"| max abs error vs plaintext | 0 | {e['max_abs_error']:.2e} | |",
        f"| test accuracy | {acc} | |",
        (
            f"| round, simulation wall time (every party in this process; plaintext: compute only) | "
            f"{p['phases']['round']['wall']:.2f} s | {e['phases']['round']['wall']:.2f} s | {_r(ratios['time'])} |"
        ),
        *(
            [
                (
                    f"| round, deployment (critical path, {describe_links(r['critical_path'])}) | "
                    f"{p['critical_path_s']:.2f} s | {r['critical_path_s']:.2f} s | {_r(ratios['critical_path'])} |"
                )
            ]
            if p.get("critical_path_s") is not None and ratios.get("critical_path") is not None
            else []
        ),
        "",
        (
            "Op-count lower bound (same run): "
            f"{b['multiply_adds']} plaintext x ciphertext multiply-adds x {b['seconds_per_multiply_add'] * 1e3:.3f} ms "
            + (
                f"(timed with all {b['server_cores_used']} cores busy; "
                if b["server_cores_used"] > 1
                else "(timed on the one core the server used; "
            )
            + f"{b.get('seconds_per_multiply_add_one_core_alone', float('nan')) * 1e3:.3f} ms on one core alone, "
            f"which gives {b.get('server_seconds_alone_cost', float('nan')):.1f} s, and the replay below takes "
            f"{_r(ratios.get('server_alone_vs_op_bound_alone_cost'))} that) "
            f"/ {b['server_cores_used']} core{'s' if b['server_cores_used'] != 1 else ''} = "
            f"**{b['server_seconds']:.1f} s** of server compute "
            f"(measured span {e['server_compute_span']:.1f} s, {_r(ratios['server_vs_op_bound'])}, sharing the cores "
            "with the clients' downloads and decryptions; "
            f"the same compute replayed with the clients idle, as on a server of its own: "
            f"{_seconds(e.get('server_compute_alone'))}, **{_r(ratios.get('server_alone_vs_op_bound'))}**; server CPU "
            f"{e['phases']['server_compute']['cpu']:.1f} s = {_r(ratios['server_cpu_vs_op_count'])} the op count "
            "x the busy cost); "
            f"{b['encryptions']} encryptions x {b['seconds_per_encrypt'] * 1e3:.2f} ms = {b['encrypt_seconds']:.1f} s, "
            f"{b['decryptions']} decryptions x {b['seconds_per_decrypt'] * 1e3:.2f} ms = {b['decrypt_seconds']:.1f} s "
            "(one core each)."
        ),
        "",
        (
            "Plaintext column: the same round in the clear (`run_plaintext_pretraining`) on the same plan "
            "(`plan_round`, same bases; "
            f"{p.get('plan', {}).get('wall', float('nan')):.2f} s of it with the uploads keyed like the spool); "
            "its server_compute is that planning plus the plaintext encoder (`fedgat.plain_encoder.PlainEncoder`, "
            "the same per-node A_i H_i behind the encoders' seam) over the plan's compute buckets and the "
            "routing of the results to the clients. Bytes are float32 payloads "
            "(each feature row up once, every encoding row to every client that needs it). Memory: peak "
            "RSS sampled every 20 ms from `/proc` (main process, and each server worker)."
        ),
        "",
        "| comparison (different algorithm) | time | communication |",
        "|---|---:|---:|",
        (
            f"| FedGraph, FedGCN + HE vs FedGCN (published) | {FEDGRAPH_FEDGCN_HE['time']} | "
            f"{FEDGRAPH_FEDGCN_HE['bytes']} |"
        ),
        (
            f"| this run, FedGAT + CKKS vs FedGAT (plaintext), deployed | {_r(ratios.get('critical_path'), 0)} | "
            f"{_r(ratios['bytes'], 1)} |"
        ),
        f"| this run, the same, simulated in one process | {_r(ratios['time'], 0)} | |",
    ]
    w = e.get("windows")
    if w:
        out += [
            "",
            f"Engine: **{r.get('engine', 'inprocess')}**. Wall seconds of the round's stretches, read off the "
            "frames (`WINDOWS` in the benchmark): "
            + ", ".join(f"{name} {_fmt_s(v) if v is not None else '-'}" for name, v in w.items())
            + ".",
        ]
    k = r.get("per_recipient_keys")
    if k:
        out += [
            "",
            "## Per-recipient keys: what the server computes",
            "",
            (
                "Every client has its own CKKS key, so an owner encrypts each row once per client that needs it "
                "and the server computes each recipient's encodings under that recipient's key, but only the "
                "*foreign share* (the recipient adds the share of its own rows in plaintext). Same bases, same "
                "layout, counted in this run:"
            ),
            "",
            "| quantity | value |",
            "|---|---:|",
            f"| multiply-adds, each node once (one shared key, before) | {k['multiply_adds_once_per_node']:,} |",
            (
                f"| multiply-adds, full encodings per recipient | {k['multiply_adds_per_recipient_full']:,} "
                f"({_r(k['growth_per_recipient'])}) |"
            ),
            (
                f"| multiply-adds, foreign shares per recipient (run) | {k['multiply_adds_per_recipient_foreign_share']:,} "
                f"({_r(k['vs_once_per_node'])}; the own share saves {k['own_share_saving']:.0%}) |"
            ),
            (
                f"| rows released ((row, recipient) pairs) / rows owned | {k['rows_released']:,} / "
                f"{k['rows_owned']:,} ({k['releases_per_row']:.2f} per row) |"
            ),
            f"| tag columns per released row | {k['tag_columns']} |",
        ]
    out += render_critical_path(r)
    out += render_before_after(r)
    if matrix:
        out += [
            "",
            (
                f"## Matrix variant, {matrix['dataset']}, cap {matrix['neighbour_cap']}, the paper's protocol "
                "(estimate, not run)"
            ),
            "",
            (
                f"{matrix['multiply_adds']:.3g} multiply-adds (~{matrix['server_seconds'] / 3600:.1f} h on one core, "
                f"~{matrix['server_seconds_all_cores'] / 3600:.1f} h on {matrix['cores']}), "
                f"{matrix['bytes_down'] / 1e9:.1f} GB of result ciphertexts down, {matrix['bytes_up'] / 1e6:.0f} MB up, "
                f"{matrix['decrypted_bytes_float64'] / 1e9:.1f} GB of decrypted float64 encodings, up to "
                f"{matrix['max_rows_per_node']} rows per node. {matrix.get('why', '')}"
            ),
        ]
    return "\n".join(out) + "\n"


def _seconds(x: float | None) -> str:
    return "not measured (--no-replay)" if x is None else f"{x:.1f} s"


def _short(v: float) -> str:
    """A bar's label: whole numbers from 100, one decimal from 1, two significant digits below."""
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.2g}" if v else "0"


def render_plot(r: dict, path: Path) -> None:
    """Seconds per phase (and the round: simulated, and deployed on the critical path) and bytes, each
    plaintext beside encrypted, values written on the bars; the server's op bound marks its phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    names = [*PHASES, "round"]
    plain = [r["plaintext"]["phases"][n]["wall"] for n in names]
    enc = [r["encrypted"]["phases"][n]["wall"] for n in names]
    names[-1] = "round\n(wall)"
    if r.get("critical_path_s") is not None and r["plaintext"].get("critical_path_s") is not None:
        names.append(f"deployed\n({describe_links(r['critical_path'])})")
        plain.append(r["plaintext"]["critical_path_s"])
        enc.append(r["critical_path_s"])
    x = np.arange(len(names))
    for k, (label, values) in enumerate((("plaintext", plain), ("encrypted", enc))):
        bars = ax1.bar(x + (k - 0.5) * 0.38, values, 0.38, label=label)
        ax1.bar_label(bars, [_short(v) for v in values], fontsize=7, padding=1)
    k = PHASES.index("server_compute")
    ax1.hlines(
        r["op_bound"]["server_seconds"],
        k - 0.45,
        k + 0.45,
        color="k",
        ls="--",
        lw=1.2,
        label="server op bound",
    )
    ax1.set_xticks(x, names, rotation=30, ha="right")
    ax1.set_ylabel("seconds (encrypted phases: summed over parties)")
    ax1.set_yscale("symlog", linthresh=0.1)
    ax1.set_ylim(0, max(max(enc), max(plain), 0.1) * 4)
    ax1.legend(loc="upper left", fontsize=8)
    ax1.set_title(f"{r['dataset']}, {r['clients']} clients, {r['variant']}: time per phase")
    kinds = ["bytes_up", "bytes_down"]
    top = 0.0
    for k, label in enumerate(("plaintext", "encrypted")):
        values = [r[label][q] / 1e6 for q in kinds]
        top = max(top, *values)
        bars = ax2.bar(np.arange(2) + (k - 0.5) * 0.38, values, 0.38, label=label)
        ax2.bar_label(bars, [_short(v) for v in values], fontsize=7, padding=1)
    ax2.set_xticks(np.arange(2), ["up", "down"])
    ax2.set_ylabel("MB")
    ax2.set_yscale("log")
    ax2.set_ylim(top=top * 10)
    ax2.set_title(f"bytes (x{r['ratios']['bytes']:.1f} overall)")
    ax2.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render_sweep(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    md = [
        "# Encrypted vs plaintext overhead: sweep",
        "",
        (
            "| dataset | clients | enc round s | critical path s | plain s | plain critical path s "
            "| deployed ratio | simulated ratio | bytes ratio | server span / op bound | server alone / op bound "
            "| slots |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        plain_path = r["plaintext"].get("critical_path_s")
        md.append(
            f"| {r['dataset']} | {r['clients']} | {r['encrypted']['phases']['round']['wall']:.1f} | "
            f"{'n/a' if r.get('critical_path_s') is None else format(r['critical_path_s'], '.2f')} | "
            f"{r['plaintext']['phases']['round']['wall']:.2f} | "
            f"{'n/a' if plain_path is None else format(plain_path, '.2f')} | "
            f"{_r(r['ratios'].get('critical_path'), 0)} | {_r(r['ratios']['time'], 0)} | "
            f"{_r(r['ratios']['bytes'], 1)} | {_r(r['ratios']['server_vs_op_bound'])} | "
            f"{_r(r['ratios'].get('server_alone_vs_op_bound'))} | "
            f"{r['slot_utilisation']['nominal']:.1%} |"
        )
    links = sorted({describe_links(r["critical_path"]) for r in rows if r.get("critical_path")})
    if links:
        md += [
            "",
            (
                "Critical path: a deployment with every party on its own machine, "
                f"{'; '.join(links)} (the model: the module doc of `benchmarks/overhead.py`)."
            ),
        ]
    md += [
        "",
        (
            f"FedGraph's FedGCN + HE (different algorithm): time {FEDGRAPH_FEDGCN_HE['time']}, "
            f"communication {FEDGRAPH_FEDGCN_HE['bytes']}."
        ),
    ]
    (out / "overhead_sweep.md").write_text("\n".join(md) + "\n")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for ds in sorted({r["dataset"] for r in rows}):
        sel = sorted((r for r in rows if r["dataset"] == ds), key=lambda r: r["clients"])
        cs = [r["clients"] for r in sel]
        ax1.plot(cs, [r["ratios"]["time"] for r in sel], "o--", label=f"{ds}, simulated")
        if all(r["ratios"].get("critical_path") for r in sel):
            ax1.plot(cs, [r["ratios"]["critical_path"] for r in sel], "o-", label=f"{ds}, deployed")
        ax2.plot(cs, [r["ratios"]["bytes"] for r in sel], "o-", label=ds)
    ax1.set(xlabel="clients", ylabel="encrypted / plaintext time", yscale="log", title="time overhead")
    ax2.set(xlabel="clients", ylabel="encrypted / plaintext bytes", title="communication overhead")
    from matplotlib.ticker import MaxNLocator

    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "overhead_sweep.png", dpi=120)
    plt.close(fig)


def write(
    r: dict, out: Path, json_path: Path | None = None, matrix: dict | None = None, stem: str = "overhead"
) -> list[Path]:
    """``<stem>.json``, ``.md`` and ``.png`` in ``out``, and the JSON also at ``json_path`` when given."""
    out.mkdir(parents=True, exist_ok=True)
    data = dict(r, matrix_estimate=matrix) if matrix else r
    text = json.dumps(data, indent=2, default=float) + "\n"
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    paths[0].write_text(text)
    paths[1].write_text(render_markdown(r, matrix))
    render_plot(r, paths[2])
    if json_path is not None and json_path.resolve() != paths[0].resolve():
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text)
        paths.append(json_path)
    return paths


# ------------------------------------------------------------------------------------ CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="cora", choices=("cora", "citeseer", "pubmed", "synthetic"))
    parser.add_argument("--nodes", type=int, default=None, help="synthetic only: nodes (default 200)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--variant", default="vector", choices=("vector", "matrix"))
    parser.add_argument("--neighbour-cap", type=int, default=None)
    parser.add_argument("--preset", default="n4096")
    from fedgat.cli_engine import add_encrypt_workers_argument, add_wire_argument

    add_wire_argument(parser)  # as `fedgat bench overhead`
    add_encrypt_workers_argument(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=None, help="server processes (default: every core)")
    parser.add_argument(
        "--engine",
        default="inprocess",
        choices=ENGINES,
        help="where the encrypted round's clients run: inprocess (default) or process (worker processes)",
    )
    parser.add_argument(
        "--actors", type=int, default=None, help="process engine: worker processes (default: usable cores)"
    )
    parser.add_argument("--no-train", dest="train", action="store_false", help="skip the accuracy comparison")
    parser.add_argument("--no-replay", dest="replay", action="store_false", help=NO_REPLAY_HELP)
    parser.add_argument("--rounds", type=int, default=None, help="FedAvg rounds for the accuracy comparison")
    parser.add_argument(
        "--matrix-estimate",
        action="store_true",
        help="add the matrix variant's estimate (cap 16) for the same dataset and clients",
    )
    parser.add_argument(
        "--sweep", action="store_true", help="sweep --datasets x --client-counts (no training)"
    )
    parser.add_argument(
        "--datasets", nargs="+", default=None, help="--sweep: datasets (default cora citeseer)"
    )
    parser.add_argument(
        "--client-counts", nargs="+", type=int, default=None, help="--sweep: client counts (default 2 5 10)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--progress", action="store_true")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="an earlier overhead JSON to show before/after (e.g. one taken before a protocol change)",
    )
    parser.add_argument("--baseline-label", default=None, help="what the baseline was (default 'baseline')")
    parser.add_argument("--from-json", type=Path, default=None, help=FROM_JSON_HELP)
    parser.add_argument(
        "--link-gbps",
        type=float,
        default=LINK_GBPS,
        help=f"the clients' link speed in Gbit/s for the deployment's critical path, and the server's unless "
        f"--server-link-gbps (default {LINK_GBPS:g})",
    )
    parser.add_argument("--server-link-gbps", type=float, default=None, help=SERVER_LINK_HELP)


#: the settings a before/after comparison should share (the baseline's differences are named)
BASELINE_SETTINGS = (
    "dataset",
    "num_nodes",
    "clients",
    "variant",
    "preset",
    "wire",
    "neighbour_cap",
    "engine",
    "cores",
    "split",
)


def relinked_stem(link_gbps: float, server_link_gbps: float | None = None) -> str:
    """The file stem ``--from-json`` writes at ``link_gbps`` (and ``server_link_gbps`` when it differs)."""
    server = "" if server_link_gbps in (None, link_gbps) else f"_server{server_link_gbps:g}gbps"
    return f"overhead_{link_gbps:g}gbps{server}"


def _relinked(relinked: dict, when: str) -> str:
    """``relinked``'s link speeds before (``when="from"``) or after (``"to"``) for people."""
    link = relinked[f"{when}_gbps"]
    return describe_links({"link_gbps": link, "server_link_gbps": relinked.get(f"{when}_server_gbps", link)})


def load_baseline(path: Path, flag: str = "--baseline") -> dict:
    """An earlier single-run overhead JSON (what ``--json`` or ``overhead.json`` holds) for ``--baseline``
    (or ``--from-json``: ``flag`` names the option in errors).

    Raises:
        ValueError: not a file, not JSON, or not one run's results (a sweep's list, another benchmark's
            JSON); the message names the file.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{flag} {path}: cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} {path} is not JSON ({exc}); give an overhead.json") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), dict) for k in ("encrypted", "ratios")):
        kind = "a list (a --sweep's results?)" if isinstance(data, list) else "not one overhead run's results"
        raise ValueError(
            f"{flag} {path} is {kind}; give the overhead.json of one run (fedgat bench overhead --json)"
        )
    return data


def baseline_differences(base: dict, r: dict) -> str:
    """The settings of :data:`BASELINE_SETTINGS` (and the critical path's link speed) in which ``base``
    differs from this run (empty: none)."""
    pairs = [(key, base.get(key), r.get(key)) for key in BASELINE_SETTINGS if key in base]
    for key in ("link_gbps", "server_link_gbps"):
        # a result from before the server's own link had one speed for every party
        links = [
            (d.get("critical_path") or {}).get(key, (d.get("critical_path") or {}).get("link_gbps"))
            for d in (base, r)
        ]
        if links[0] is not None:
            pairs.append((key, links[0], links[1]))
    return ", ".join(f"{key} {a!r} vs {b!r}" for key, a, b in pairs if a != b)


def main_args(args: argparse.Namespace) -> int:
    try:
        link_gbps, server_link_gbps = link_speeds(
            getattr(args, "link_gbps", LINK_GBPS), getattr(args, "server_link_gbps", None)
        )
    except ValueError as exc:
        raise SystemExit(f"--link-gbps / --server-link-gbps: {exc}") from None
    try:  # before the run: a bad file must not cost the run's minutes
        base = None if args.baseline is None else load_baseline(args.baseline)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if getattr(args, "from_json", None) is not None:
        try:
            r = relink(load_baseline(args.from_json, "--from-json"), link_gbps, server_link_gbps)
        except ValueError as exc:
            raise SystemExit(f"--from-json {args.from_json}: {exc}") from None
        r["relinked"].update(
            source=str(args.from_json), command=shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
        )
        print(format_table(r))
        stem = relinked_stem(link_gbps, server_link_gbps)
        for path in write(r, args.out, args.json, r.get("matrix_estimate"), stem=stem):
            print(f"wrote {path}")
        return 0
    if args.sweep:
        rows = []
        for ds in args.datasets or SWEEP_DATASETS:
            for c in args.client_counts or SWEEP_CLIENTS:
                r = run_overhead(
                    ds,
                    c,
                    args.variant,
                    preset=args.preset,
                    seed=args.seed,
                    beta=args.beta,
                    neighbour_cap=args.neighbour_cap,
                    workers=args.workers,
                    train=False,
                    progress=args.progress,
                    link_gbps=link_gbps,
                    server_link_gbps=server_link_gbps,
                    engine=getattr(args, "engine", "inprocess"),
                    engine_workers=getattr(args, "actors", None),
                    wire=getattr(args, "wire", "compact"),
                    encrypt_workers=getattr(args, "encrypt_workers", 0),
                    replay=getattr(args, "replay", True),
                )
                print(format_table(r), flush=True)
                rows.append(r)
        args.out.mkdir(parents=True, exist_ok=True)
        text = json.dumps(rows, indent=2, default=float) + "\n"
        for target in {args.out / "overhead_sweep.json", *([args.json] if args.json else [])}:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        render_sweep(rows, args.out)
        for path in sorted(
            {args.out / f"overhead_sweep{x}" for x in (".json", ".md", ".png")}
            | set([args.json] if args.json else [])
        ):
            print(f"wrote {path}")
        return 0
    r = run_overhead(
        args.dataset,
        args.clients,
        args.variant,
        preset=args.preset,
        seed=args.seed,
        beta=args.beta,
        neighbour_cap=args.neighbour_cap,
        nodes=args.nodes,
        workers=args.workers,
        train=args.train,
        rounds=args.rounds,
        progress=args.progress,
        owner=getattr(args, "owner_array", None),
        link_gbps=link_gbps,
        server_link_gbps=server_link_gbps,
        engine=getattr(args, "engine", "inprocess"),
        engine_workers=getattr(args, "actors", None),
        wire=getattr(args, "wire", "compact"),
        encrypt_workers=getattr(args, "encrypt_workers", 0),
        replay=getattr(args, "replay", True),
    )
    matrix = None
    if args.matrix_estimate:
        matrix = estimate_matrix(
            args.dataset,
            args.clients,
            16,
            args.preset,
            args.seed,
            args.beta,
            r["op_bound"]["seconds_per_multiply_add"],
            nodes=args.nodes,
        )
    if base is not None:
        r["baseline"] = {
            "label": args.baseline_label or "baseline",
            "source": str(args.baseline.name),
            "date": base.get("date"),
            **{key: base.get(key) for key in ("encrypted", "ratios", "plaintext", "critical_path_s")},
            "differs_in": baseline_differences(base, r),
        }
        if r["baseline"]["differs_in"]:
            print(
                f"note: the baseline {args.baseline} ran another setting: {r['baseline']['differs_in']}",
                file=sys.stderr,
            )
    r["command"] = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
    print(format_table(r))
    for path in write(r, args.out, args.json, matrix):
        print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    return main_args(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
