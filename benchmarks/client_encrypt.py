"""A client's encryptions in its own process against an encryption pool of N workers, side by side.

    python benchmarks/client_encrypt.py                        # 512 rows of Cora's width, 2 and all cores
    python benchmarks/client_encrypt.py --rows 2500 --workers 2 4 8 16

The encrypted round's largest client (Cora, 10 clients: ~7,500 encryptions) encrypts for ~35 s on
one core while the other cores idle (issue 20); TenSEAL holds the GIL, so only processes help
(:class:`fedgat.crypto.encrypt_pool.EncryptionPool`). This benchmark encrypts ``--rows`` rows of
``--dim`` values (Cora's 1,433 features + 2 tag columns) for ``--recipients`` recipients in batches
of ``--batch`` rows, as :class:`fedgat.protocols.ClientPretrain` sends them:

1. in this process (:func:`~fedgat.crypto.packing.encrypt_rows`, what a client without a pool does):
   its time per encryption is the one-core cost the floor uses;
2. on a pool of each ``--workers`` size, keeping ``pool.depth`` batches submitted and collecting
   them in order, as the client does: wall time from the first submission to the last envelope (the
   pool's start-up, timed apart, is paid once per round), against the floor
   ``encryptions x one-core cost / min(workers, cores)``.

A sample of each pool's envelopes is decrypted and compared with the rows (the pool must make what
the client would). Writes ``client_encrypt.json`` and ``.md`` into ``--out`` with the machine, its
cores and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def run(
    rows: int = 512,
    dim: int = 1435,
    batch: int = 32,
    recipients: int = 3,
    workers: list[int] | None = None,
    preset: str = "n4096",
    wire: str = "compact",
    seed: int = 0,
) -> dict:
    from fedgat.benchmarks.layer_speed import cpu_model
    from fedgat.crypto import KeyHolderContext, ServerContext, SlotLayout, decrypt_rows, encrypt_rows
    from fedgat.crypto.encrypt_pool import EncryptionPool
    from fedgat.protocols.process_engine import usable_cores

    cores = usable_cores()
    workers = workers or sorted({2, cores})
    holders = [KeyHolderContext.generate(preset, wire=wire) for _ in range(recipients)]
    pubs = {r: ServerContext.from_bytes(h.public_context_bytes(), wire=wire) for r, h in enumerate(holders)}
    layout = SlotLayout.for_dimension(dim, pubs[0].slots)
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((rows, dim))
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    batches = [(r, lo) for r in range(recipients) for lo in range(0, rows, batch)]
    encryptions = recipients * rows * layout.chunks

    # 1. in this process
    start, cpu = time.perf_counter(), time.process_time()
    for r, lo in batches:
        list(encrypt_rows(pubs[r], data[lo : lo + batch], layout))
    inline_s, inline_cpu = time.perf_counter() - start, time.process_time() - cpu
    per_encryption = inline_cpu / encryptions

    # 2. on pools, the client's submission pattern: pool.depth batches submitted, results in order
    pools = []
    for k in workers:
        start = time.perf_counter()
        pool = EncryptionPool(pubs, layout, k)
        warm = pool.submit(0, data[:1])  # every worker loaded: the first answer needs one
        pool.result(warm)
        start_s = time.perf_counter() - start
        try:
            ahead: dict[int, int] = {}
            worker_cpu = 0.0
            sample = None
            start = time.perf_counter()
            for i, (r, lo) in enumerate(batches):
                for j in range(i, min(len(batches), i + pool.depth)):
                    if j not in ahead:
                        rr, ll = batches[j]
                        ahead[j] = pool.submit(rr, data[ll : ll + batch])
                blobs, c = pool.result(ahead.pop(i))
                worker_cpu += c
                if i == len(batches) - 1:
                    sample = (r, lo, blobs)
            wall = time.perf_counter() - start
        finally:
            pool.close()
        assert sample is not None
        r, lo, blobs = sample
        n = len(data[lo : lo + batch])
        error = float(
            np.abs(decrypt_rows(holders[r], blobs, n, layout, kind="fresh") - data[lo : lo + n]).max()
        )
        if error > 1e-5:
            raise AssertionError(f"a pool of {k} made envelopes that decrypt {error:.2e} away from the rows")
        floor = encryptions * per_encryption / min(k, cores)
        pools.append(
            {
                "workers": k,
                "start_s": start_s,
                "wall_s": wall,
                "worker_cpu_s": worker_cpu,
                "floor_s": floor,
                "vs_floor": wall / floor,
                "speedup_vs_inline": inline_s / wall,
                "max_abs_error": error,
            }
        )
    return {
        "machine": f"{platform.node()} ({cpu_model()})",
        "cores": cores,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "preset": preset,
        "wire": wire,
        "rows": rows,
        "dim": dim,
        "batch": batch,
        "recipients": recipients,
        "chunks": layout.chunks,
        "encryptions": encryptions,
        "inline": {"wall_s": inline_s, "cpu_s": inline_cpu, "ms_per_encryption": per_encryption * 1e3},
        "pools": pools,
    }


def render(r: dict) -> str:
    lines = [
        "# A client's encryptions: in process vs an encryption pool",
        "",
        f"{r['machine']}, {r['cores']} cores, {r['date']}. Generated by `benchmarks/client_encrypt.py`.",
        "",
        (
            f"{r['encryptions']:,} encryptions: {r['rows']} rows of {r['dim']} values ({r['chunks']} chunks each) for "
            f"{r['recipients']} recipients, batches of {r['batch']} rows, preset {r['preset']}, wire {r['wire']}. "
            f"In this process: {r['inline']['wall_s']:.2f} s ({r['inline']['ms_per_encryption']:.2f} ms per "
            "encryption, the one-core cost of the floor)."
        ),
        "",
        "| workers | start s | wall s | floor s | wall / floor | speedup vs in process | workers' CPU s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in r["pools"]:
        lines.append(
            f"| {p['workers']} | {p['start_s']:.2f} | {p['wall_s']:.2f} | {p['floor_s']:.2f} | "
            f"{p['vs_floor']:.2f}x | {p['speedup_vs_inline']:.2f}x | {p['worker_cpu_s']:.2f} |"
        )
    lines += [
        "",
        (
            "Floor: encryptions x the one-core cost / min(workers, cores). Start: the pool's processes "
            "started and each holding the recipients' public contexts (paid once per round, before the "
            "first batch). Every pool's last batch decrypts to its rows (max error in the JSON)."
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument(
        "--dim", type=int, default=1435, help="values per row (default Cora's 1,433 + 2 tags)"
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--recipients", type=int, default=3)
    parser.add_argument(
        "--workers", type=int, nargs="+", default=None, help="pool sizes (default 2 and every core)"
    )
    parser.add_argument("--preset", default="n4096")
    parser.add_argument("--wire", default="compact", choices=("compact", "tenseal"))
    parser.add_argument("--name", default="client_encrypt", help="file name stem of the results")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if any(k < 1 for k in args.workers or []) or args.rows < 1 or args.batch < 1 or args.recipients < 1:
        parser.error("--rows, --batch, --recipients and --workers must be positive")
    r = run(args.rows, args.dim, args.batch, args.recipients, args.workers, args.preset, args.wire)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(r, indent=2) + "\n")
    text = render(r)
    (args.out / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
