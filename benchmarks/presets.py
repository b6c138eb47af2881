"""The smallest CKKS preset per variant: each preset's max decryption error on real encodings.

    python -m fedgat.benchmarks.presets                          # synthetic 120 nodes, 2 clients
    fedgat bench presets --nodes 200 --variants vector --presets n4096 n8192
    python benchmarks/presets.py --dataset cora                  # a real graph (minutes per preset)

For every variant and preset: the encrypted pre-training round (:func:`fedgat.pipeline.run_encrypted_pretraining`,
the protocol in process) and its plaintext twin on the same partition and bases
(:func:`fedgat.pipeline.plaintext_round`); ``max_abs_error`` is the largest absolute difference over
every decrypted encoding value (:func:`fedgat.pipeline.max_abs_error`). ``smallest`` is the preset
with the fewest bytes moved in that round (frames up and down; ties: the smaller wire ciphertexts)
whose error is at most ``--target`` (1e-5). Beside it each preset's wire sizes against their floor
(:meth:`fedgat.crypto.CkksPreset.floor_bytes`). Writes ``presets.json`` into ``--out``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

TARGET = 1e-5
VARIANTS = ("vector", "matrix")


def preset_errors(
    dataset: str = "synthetic",
    *,
    nodes: int | None = 120,
    clients: int = 2,
    variants: Sequence[str] = VARIANTS,
    presets: Sequence[str] | None = None,
    seed: int = 0,
    beta: float = 1.0,
    target: float = TARGET,
) -> dict:
    """Max abs decryption error of every ``(variant, preset)`` on real encodings of one graph, and
    per variant the smallest preset meeting ``target`` (None when none does); see the module doc."""
    import torch

    from fedgat.benchmarks.overhead import load_graph
    from fedgat.crypto import PRESETS, get_preset
    from fedgat.methods import fedgat_partition, resolve_hparams
    from fedgat.pipeline import max_abs_error, plaintext_round, run_encrypted_pretraining
    from fedgat.protocols import InProcessTransport

    torch.set_num_threads(1)
    names = list(presets) if presets is not None else list(PRESETS)
    graph = load_graph(dataset, nodes, seed)
    out: dict = {
        "dataset": graph.name,
        "num_nodes": graph.num_nodes,
        "num_features": graph.num_features,
        "clients": clients,
        "seed": seed,
        "target": target,
        "variants": {},
    }
    for variant in variants:
        hp = resolve_hparams("fedgat", {"variant": variant})
        partition = fedgat_partition(graph, clients, beta, seed, hp, None)
        plain = plaintext_round(graph, partition, variant, seed).run()
        rows = {}
        for name in names:
            p = get_preset(name)
            start = time.perf_counter()
            pre = run_encrypted_pretraining(
                graph, partition, variant, name, seed, InProcessTransport(), progress=False, workers=0
            )
            values = [
                float(x.abs().max())
                for enc in plain.values()
                for b in enc.buckets
                for x in (b.h_self, b.K2, b.M2)
                if x is not None and x.numel()
            ]
            rows[name] = {
                "max_abs_error": max_abs_error(pre.encodings, plain),
                "max_abs_value": max(values, default=0.0),
                "bytes_moved": pre.bytes_up + pre.bytes_down,
                "ciphertexts_up": pre.ciphertexts_up,
                "ciphertexts_down": pre.ciphertexts_down,
                "fresh_bytes": p.wire_bytes("fresh"),
                "result_bytes": p.wire_bytes("result"),
                "fresh_floor_bytes": p.floor_bytes("fresh"),
                "result_floor_bytes": p.floor_bytes("result"),
                "result_bytes_per_slot": p.wire_bytes("result") / p.slots,
                "slot_utilisation": pre.slot_utilisation,
                "result_slot_utilisation": pre.result_slot_utilisation,
                "seconds": time.perf_counter() - start,
            }
        meeting = [n for n in names if rows[n]["max_abs_error"] <= target]
        smallest = min(meeting, key=lambda n: (rows[n]["bytes_moved"], rows[n]["result_bytes"]), default=None)
        out["variants"][variant] = {"presets": rows, "smallest": smallest}
    return out


def format_table(result: dict) -> str:
    lines = [
        (
            f"{result['dataset']}: {result['num_nodes']} nodes, {result['num_features']} features, "
            f"{result['clients']} clients; target max |error| <= {result['target']:.0e}"
        )
    ]
    for variant, block in result["variants"].items():
        lines.append(f"{variant}: smallest preset meeting the target: {block['smallest']}")
        for name, r in block["presets"].items():
            lines.append(
                f"  {name:12s} error {r['max_abs_error']:.1e} (max |value| {r['max_abs_value']:.2f})  "
                f"moved {r['bytes_moved'] / 1e6:.2f} MB  fresh {r['fresh_bytes']} B  result {r['result_bytes']} B "
                f"({r['result_bytes_per_slot']:.1f} B/slot)  {r['seconds']:.1f} s"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None, *, prog: str | None = None, out: Path | None = None) -> int:
    """Run from the command line (``prog``, ``out``: the name and default output folder ``fedgat
    bench presets`` gives it)."""
    from fedgat.cli_engine import ArgumentParser, check_counts, check_dataset, parser_checks
    from fedgat.crypto import PRESETS

    parser = ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synthetic", help="synthetic (default) or a Planetoid name")
    parser.add_argument("--nodes", type=int, default=120, help="synthetic graph size (default 120)")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--presets", nargs="+", choices=sorted(PRESETS), default=list(PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=TARGET)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results" if out is None else out,
        help="output folder (default %(default)s)",
    )
    args = parser.parse_args(argv)
    synthetic = args.dataset.lower() == "synthetic"
    parser_checks(
        parser,
        lambda: check_dataset(args.dataset),
        lambda: check_counts(
            {"--nodes": (args.nodes if synthetic else None, 40), "--clients": (args.clients, 1)}
        ),
    )
    if not 0 < args.target < 1:
        parser.error(f"--target must lie in (0, 1), got {args.target:g}")
    result = preset_errors(
        args.dataset,
        nodes=args.nodes,
        clients=args.clients,
        variants=args.variants,
        presets=args.presets,
        seed=args.seed,
        target=args.target,
    )
    from fedgat.protocols.frame import VERSION

    result.update(
        machine=platform.node(),
        cores=os.cpu_count(),
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        frame_version=VERSION,
    )
    print(format_table(result))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "presets.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
