"""Micro-benchmark of a CKKS preset: time per operation, serialised sizes, precision.

``measure_preset(preset)`` is what the tests use to check the precision target and what the
benchmarks can call to regenerate the table in :mod:`fedgat.crypto.params`.
"""

from __future__ import annotations

import multiprocessing
import resource
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .context import KeyHolderContext, ServerContext
from .packing import deserialize, linear_combination, serialize
from .params import DEFAULT_WIRE, CkksPreset, get_preset

if TYPE_CHECKING:
    from .encoders import Encoder
    from .tasks import ComputeBucket

__all__ = [
    "FLOAT32_BYTES",
    "EncoderTiming",
    "children_cpu_seconds",
    "evaluator_op_seconds",
    "evaluator_op_seconds_busy",
    "floor_report",
    "measure_preset",
    "multiply_add_seconds",
    "multiply_add_seconds_busy",
    "time_encoder",
    "time_run",
]


#: bytes of one plaintext value as the plaintext round ships it (float32)
FLOAT32_BYTES = 4


def floor_report(
    preset: str | CkksPreset, fresh_bytes: float, result_bytes: float, utilisation: float = 1.0
) -> dict:
    """Measured ciphertext sizes against the preset's floor (:meth:`CkksPreset.floor_bytes`).

    For ``level`` in fresh / result: ``{level}_floor_bytes``; ``{level}_vs_floor`` = bytes / floor
    (the ciphertext alone); ``{level}_bytes_per_useful_slot`` = bytes / (slots x ``utilisation``),
    ``{level}_per_useful_slot_vs_floor`` = that / (floor / slots), i.e. the ratio to the floor with
    the unused slots charged to it, and ``{level}_per_useful_slot_vs_float32`` = that / 4 B (the
    plaintext ratio: what one useful value costs against float32)."""
    preset = get_preset(preset)
    if not 0 < utilisation <= 1:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation}")
    out: dict = {"utilisation": utilisation}
    for level, size in (("fresh", fresh_bytes), ("result", result_bytes)):
        floor = preset.floor_bytes(level)
        per_useful = size / (preset.slots * utilisation)
        out[f"{level}_floor_bytes"] = floor
        out[f"{level}_vs_floor"] = size / floor
        out[f"{level}_bytes_per_useful_slot"] = per_useful
        out[f"{level}_per_useful_slot_vs_floor"] = per_useful / (floor / preset.slots)
        out[f"{level}_per_useful_slot_vs_float32"] = per_useful / FLOAT32_BYTES
    return out


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's reaped children (worker pools once joined)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class EncoderTiming:
    """:func:`time_encoder`: wall seconds, this process's CPU seconds, and the CPU seconds of the
    worker processes (reaped children)."""

    wall: float
    cpu: float
    worker_cpu: float

    @classmethod
    def combine(cls, timings: Iterable[EncoderTiming]) -> EncoderTiming:
        """The sums of several timings (e.g. one encoder per recipient, run one after another)."""
        items = list(timings)
        return cls(sum(t.wall for t in items), sum(t.cpu for t in items), sum(t.worker_cpu for t in items))


def time_run(run: Callable[[], object]) -> EncoderTiming:
    """Wall seconds, this process's CPU seconds and its reaped children's CPU seconds of ``run()``
    (which should reap the worker processes it starts, e.g. by closing their pool)."""
    wall0, cpu0, children0 = time.perf_counter(), time.process_time(), children_cpu_seconds()
    run()
    return EncoderTiming(
        wall=time.perf_counter() - wall0,
        cpu=time.process_time() - cpu0,
        worker_cpu=children_cpu_seconds() - children0,
    )


def time_encoder(encoder: Encoder, buckets: Iterable[ComputeBucket]) -> EncoderTiming:
    """Run ``encoder`` over ``buckets`` (results discarded) and close it; its workers are reaped
    before the clock stops, so their CPU seconds are counted."""

    def run() -> None:
        try:
            for _ in encoder.map(buckets):
                pass
        finally:
            encoder.close()

    return time_run(run)


def _ms(fn, repeats: int):
    start = time.perf_counter()
    for _ in range(repeats):
        result = fn()
    return (time.perf_counter() - start) / repeats * 1e3, result


def measure_preset(
    preset: str | CkksPreset,
    *,
    terms: int = 170,
    repeats: int = 10,
    symmetric_encryption: bool = True,
    seed: int = 0,
    utilisation: float = 1.0,
    wire: str = DEFAULT_WIRE,
) -> dict:
    """Measure one preset end to end (key holder -> public server context -> result), ciphertexts
    in ``wire`` (:data:`fedgat.crypto.params.WIRES`).

    Returns a dict with: ``keygen_ms``, ``encrypt_ms``, ``mul_plain_ms`` (ct x plaintext vector
    incl. encoding and rescale), ``add_ms``, ``decrypt_ms``, ``serialize_ms``, ``deserialize_ms``
    (envelope incl. digest and checks), ``fresh_bytes`` / ``result_bytes`` (envelopes in ``wire``:
    the compact form at the floor + 74 B, or TenSEAL's bytes + 74 B), ``public_context_bytes``, ``secret_context_bytes``, ``max_error_fresh``,
    ``max_error_sum`` (``sum_{t<terms} c_t h_t``, ``c, h ~ U[-1, 1]`` per slot),
    ``max_error_extreme`` (slots where every term is +-1, so ``|value| = terms``),
    ``error_bound`` (the analytic bound for ``terms``, ``|c|, |h| <= 1``) and ``lincomb_ms``;
    ``tenseal_fresh_bytes`` / ``tenseal_result_bytes``: TenSEAL's own (zstd) serialisation of the
    same ciphertexts, and :func:`floor_report` of the envelopes at ``utilisation`` (the share of
    slots holding values, e.g. :meth:`~fedgat.crypto.SlotLayout.utilisation`).
    """
    preset = get_preset(preset)
    rng = np.random.default_rng(seed)
    keygen_ms, holder = _ms(
        lambda: KeyHolderContext.generate(preset, symmetric_encryption=symmetric_encryption, wire=wire), 1
    )
    server = ServerContext.from_bytes(holder.public_context_bytes(), wire=wire)
    s = holder.slots

    h = rng.uniform(-1.0, 1.0, size=(terms, s))
    c = rng.uniform(-1.0, 1.0, size=(terms, s))
    extreme = slice(0, min(64, s))
    h[:, extreme] = np.where(np.arange(extreme.stop) % 2 == 0, 1.0, -1.0)
    c[:, extreme] = 1.0

    encrypt_ms, _ = _ms(lambda: holder.encrypt_vector(h[0]), repeats)
    start = time.perf_counter()
    blobs = [serialize(holder, holder.encrypt_vector(row)) for row in h]
    encrypt_all_ms = (time.perf_counter() - start) * 1e3
    deserialize_ms, _ = _ms(lambda: deserialize(server, blobs[0], level="fresh"), repeats)
    cts = [deserialize(server, b, level="fresh") for b in blobs]
    mul_ms, prod = _ms(lambda: cts[0].mul(c[0].tolist()), repeats)
    add_ms, _ = _ms(lambda: prod + prod, repeats)
    lincomb_ms, result = _ms(lambda: linear_combination(server, cts, c), 1)
    serialize_ms, result_blob = _ms(lambda: serialize(server, result), repeats)
    got_vec = deserialize(holder, result_blob, level="result")
    decrypt_ms, got = _ms(lambda: holder.decrypt_vector(got_vec), repeats)

    fresh = holder.decrypt_vector(deserialize(holder, blobs[0], level="fresh"))
    err = np.abs(got - np.einsum("ts,ts->s", c, h))
    return {
        "preset": preset.name,
        "poly_modulus_degree": preset.poly_modulus_degree,
        "coeff_mod_bit_sizes": preset.coeff_mod_bit_sizes,
        "slots": s,
        "scale": holder.scale,
        "symmetric_encryption": symmetric_encryption,
        "wire": wire,
        "terms": terms,
        "keygen_ms": keygen_ms,
        "encrypt_ms": encrypt_ms,
        "encrypt_serialize_ms": encrypt_all_ms / terms,
        "mul_plain_ms": mul_ms,
        "add_ms": add_ms,
        "lincomb_ms": lincomb_ms,
        "decrypt_ms": decrypt_ms,
        "serialize_ms": serialize_ms,
        "deserialize_ms": deserialize_ms,
        "fresh_bytes": len(blobs[0]),
        "result_bytes": len(result_blob),
        "tenseal_fresh_bytes": len(holder.encrypt_vector(h[0]).serialize()),
        "tenseal_result_bytes": len(result.serialize()),
        **floor_report(preset, len(blobs[0]), len(result_blob), utilisation),
        "public_context_bytes": len(holder.public_context_bytes()),
        "secret_context_bytes": len(holder.secret_context_bytes()),
        "max_error_fresh": float(np.max(np.abs(fresh - h[0]))),
        "max_error_sum": float(np.max(err[extreme.stop :])),
        "max_error_extreme": float(np.max(err[extreme])),
        "error_bound": holder.error_bound(terms, symmetric=symmetric_encryption),
    }


def multiply_add_seconds(
    preset: str | CkksPreset, terms: int = 64, repeats: int = 7, seed: int = 0, _barrier=None
) -> float:
    """Seconds of one plaintext x ciphertext multiply-add as the server runs it: the median over
    ``repeats`` of a ``terms``-term :func:`~fedgat.crypto.packing.linear_combination` (coefficient
    encoding, products, sum, TenSEAL's rescale after each product) on deserialised fresh
    ciphertexts, divided by ``terms``."""
    holder = KeyHolderContext.generate(preset)
    server = ServerContext.from_bytes(holder.public_context_bytes())
    rng = np.random.default_rng(seed)
    cts = [
        deserialize(
            server, serialize(holder, holder.encrypt_vector(rng.uniform(-1, 1, holder.slots))), level="fresh"
        )
        for _ in range(terms)
    ]
    coeffs = rng.uniform(-1, 1, (terms, holder.slots))
    linear_combination(server, cts, coeffs)  # warm-up
    if _barrier is not None:
        _barrier.wait()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        linear_combination(server, cts, coeffs)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / terms


def evaluator_op_seconds(
    preset: str | CkksPreset, terms: int = 32, repeats: int = 7, seed: int = 0, _barrier=None
) -> dict[str, float]:
    """Seconds per SEAL operation of :class:`~fedgat.crypto.evaluator.SealEvaluator` (``encode``,
    ``multiply``, ``add``, ``rescale``; and ``save``, a result's serialisation into its envelope, which
    the op-count bound leaves out): medians over ``repeats`` of ``terms`` operations each, on
    deserialised fresh ciphertexts, each operation timed in a loop of its own."""
    from tenseal import sealapi

    from .evaluator import SealEvaluator

    holder = KeyHolderContext.generate(preset)
    server = ServerContext.from_bytes(holder.public_context_bytes())
    ev = SealEvaluator(server)
    rng = np.random.default_rng(seed)
    cts = [
        deserialize(
            server, serialize(holder, holder.encrypt_vector(rng.uniform(-1, 1, holder.slots))), level="fresh"
        ).data.ciphertext()[0]
        for _ in range(terms)
    ]
    coeffs = [c.tolist() for c in rng.uniform(-1, 1, (terms, holder.slots))]
    seal, fresh = ev._seal, ev._fresh_parms
    plains = [sealapi.Plaintext() for _ in range(terms)]
    products = [sealapi.Ciphertext(seal) for _ in range(terms)]

    def encode() -> None:
        for c, p in zip(coeffs, plains):
            ev._encoder.encode(c, fresh, server.scale, p)

    def multiply() -> None:
        for ct, p, out in zip(cts, plains, products):
            ev._evaluator.multiply_plain(ct, p, out)

    def add() -> None:
        acc = sealapi.Ciphertext(seal)
        ev._evaluator.add(products[0], products[1], acc)
        for prod in products[2:]:
            ev._evaluator.add_inplace(acc, prod)

    def rescale() -> None:
        for prod in products:
            ev._evaluator.rescale_to_next_inplace(prod)

    def save() -> None:
        for prod in products:
            ev.result_envelope(prod)

    counts = {"encode": terms, "multiply": terms, "add": terms - 1, "rescale": terms, "save": terms}
    times: dict[str, list[float]] = {k: [] for k in counts}
    encode()  # warm-up, and products to rescale
    multiply()
    if _barrier is not None:
        _barrier.wait()
    for _ in range(repeats):
        for name, op in (("encode", encode), ("multiply", multiply), ("add", add), ("rescale", rescale)):
            start = time.perf_counter()
            op()
            times[name].append(time.perf_counter() - start)
        start = time.perf_counter()
        save()  # rescaled products: results as the server sends them
        times["save"].append(time.perf_counter() - start)
        multiply()  # fresh products for the next rescale
    return {k: statistics.median(v) / counts[k] for k, v in times.items()}


_BARRIER = None


def _init_busy(barrier) -> None:
    global _BARRIER
    _BARRIER = barrier


def _busy_task(preset: str, terms: int, repeats: int, seed: int) -> float:
    return multiply_add_seconds(preset, terms, repeats, seed, _barrier=_BARRIER)


def _busy_ops_task(preset: str, terms: int, repeats: int, seed: int) -> dict[str, float]:
    return evaluator_op_seconds(preset, terms, repeats, seed, _barrier=_BARRIER)


def _busy(task, single, preset: str, processes: int, terms: int, repeats: int, seed: int) -> list:
    """``task(preset, terms, repeats, seed + k)`` in ``processes`` spawned processes that set up,
    meet at a barrier, then time (``single`` in this process when there is one)."""
    if processes < 1:
        raise ValueError("processes must be >= 1")
    if processes == 1:
        return [single(preset, terms, repeats, seed)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    # each process blocks at the barrier inside its only task, so no process can take two tasks
    with ctx.Pool(processes, initializer=_init_busy, initargs=(barrier,)) as pool:
        return pool.starmap(task, [(preset, terms, repeats, seed + k) for k in range(processes)], chunksize=1)


def evaluator_op_seconds_busy(
    preset: str, processes: int, terms: int = 32, repeats: int = 15, seed: int = 0
) -> list[dict[str, float]]:
    """:func:`evaluator_op_seconds` in ``processes`` processes at the same time (as
    :func:`multiply_add_seconds_busy`): the per-operation costs when every core the server uses
    is busy. One dict per process."""
    return _busy(_busy_ops_task, evaluator_op_seconds, preset, processes, terms, repeats, seed)


def multiply_add_seconds_busy(
    preset: str, processes: int, terms: int = 64, repeats: int = 15, seed: int = 0
) -> list[float]:
    """:func:`multiply_add_seconds` measured in ``processes`` processes at the same time (they set
    up, meet at a barrier, then time): the cost of one multiply-add when every core the server
    uses is busy with them. Cores that share caches, memory bandwidth or a physical core (vCPUs)
    are slower together than alone, and a lower bound for ``p`` busy cores must use this cost.
    Returns one cost per process."""
    return _busy(_busy_task, multiply_add_seconds, preset, processes, terms, repeats, seed)


if __name__ == "__main__":  # python -m fedgat.crypto.measure
    import sys

    names = sys.argv[1:] or ["n4096", "n8192", "n8192-small", "n16384"]
    for name in names:
        r = measure_preset(name)
        print(
            f"{name:12s} enc {r['encrypt_ms']:.2f} ms  mul {r['mul_plain_ms']:.2f} ms  "
            f"add {r['add_ms']:.3f} ms  dec {r['decrypt_ms']:.2f} ms  "
            f"fresh {r['fresh_bytes']} B ({r['fresh_vs_floor']:.3f}x floor)  "
            f"result {r['result_bytes']} B ({r['result_vs_floor']:.3f}x floor, "
            f"{r['result_per_useful_slot_vs_float32']:.2f}x float32 per slot)  "
            f"pub {r['public_context_bytes']} B  err {r['max_error_sum']:.1e} "
            f"(extreme {r['max_error_extreme']:.1e}, bound {r['error_bound']:.1e})"
        )
