"""A server-side integrity attack on a real-sized graph, twice: against the protocol as it is, and
with the one check that stops it removed (what the attack recovered before the fix). The second run
is the evidence that the first one's refusal is the check's doing, not the setting's.

    python benchmarks/attack_teeth.py --attack row_swap --dataset cora --clients 10

Attacks (``fedgat.server_attacks``) and the check each run removes:

* ``row_swap`` -- the owners' neighbourhood statements (frame version 10;
  :func:`fedgat.server_attacks.statements_unchecked`);
* ``relabel_forgery`` -- the recipient's check of its foreign nodes' neighbourhoods
  (:func:`fedgat.protocols.pretrain_edges.check_foreign_neighbourhoods`);
* ``chosen_bases`` -- the clients' check of the bases' identity
  (:func:`fedgat.protocols.pretrain_checks.check_basis_identity`).

Writes ``audit_<dataset>_<variant>_<attack>.json`` and ``.md`` into ``--out`` (default
``benchmarks/results``), naming the machine, its cores and the date. One encrypted round per run
(about 8 minutes each on Cora on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from fedgat.data import load_dataset
from fedgat.partition import make_partition
from fedgat.server_attacks import (
    AttackOutcome,
    AttackSetting,
    chosen_bases_attack,
    relabel_forgery_attack,
    row_swap_attack,
    statements_unchecked,
)

RESULTS = Path(__file__).resolve().parent / "results"


@contextlib.contextmanager
def _foreign_neighbourhoods_unchecked() -> Iterator[None]:
    from fedgat.protocols import pretrain_client

    with mock.patch.object(pretrain_client, "check_foreign_neighbourhoods", lambda *a, **k: None):
        yield


@contextlib.contextmanager
def _bases_unchecked() -> Iterator[None]:
    from fedgat.protocols import pretrain_checks

    with mock.patch.object(pretrain_checks, "check_basis_identity", lambda *a, **k: None):
        yield


#: attack -> (its function, the context that removes the check it meets, that check in words)
ATTACKS: dict[str, tuple[Callable[[AttackSetting], AttackOutcome], Callable[[], Any], str]] = {
    "row_swap": (row_swap_attack, statements_unchecked, "the owners' signed neighbourhood statements"),
    "relabel_forgery": (
        relabel_forgery_attack,
        _foreign_neighbourhoods_unchecked,
        "the recipient's check of its foreign nodes' neighbourhoods",
    ),
    "chosen_bases": (chosen_bases_attack, _bases_unchecked, "the clients' check of the bases' identity"),
}


def _markdown(result: dict) -> str:
    rows = ["| run | detected | recovered (of targets) | first refusal | seconds |", "|---|---|---|---|---|"]
    for run in ("with_check", "without_check"):
        r = result[run]
        error = r.get("victim_error") or r.get("first_error") or "-"
        rows.append(
            f"| {run.replace('_', ' ')} | {r['detected']} | {r['recovered']} of {r['targets']} | "
            f"{error} | {r['seconds']:.0f} |"
        )
    extra = {
        k: v for k, v in result["with_check"].items() if k not in ("victim_error", "first_error", "seconds")
    }
    return "\n".join(
        [
            f"# `{result['attack']}` on {result['dataset']}, {result['clients']} clients, {result['variant']}",
            "",
            f"The check removed in the second run: {result['check']}.",
            "",
            *rows,
            "",
            f"Details (with the check): `{json.dumps(extra, default=str)}`",
            "",
            f"{result['machine']}, {result['cpus']} cores, {result['date']}; `{result['command']}`",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--attack", choices=sorted(ATTACKS), default="row_swap")
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--variant", choices=("vector", "matrix"), default="vector")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, help="server compute processes")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    attack, unchecked, check = ATTACKS[args.attack]
    graph = load_dataset(args.dataset)
    part = make_partition(graph, args.clients, beta=1.0, seed=args.seed)
    setting = AttackSetting(graph, part, args.variant, seed=args.seed, workers=args.workers)
    result: dict = {"attack": args.attack, "dataset": args.dataset, "clients": args.clients}
    result |= {"variant": args.variant, "seed": args.seed, "check": check}
    for run, context in (("with_check", contextlib.nullcontext), ("without_check", unchecked)):
        start = time.perf_counter()
        with context():
            outcome = attack(setting)
        result[run] = {**outcome.as_dict(), "seconds": round(time.perf_counter() - start, 1)}
        print(f"{run}: {json.dumps(result[run], default=str)}", flush=True)
    result |= {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "date": dt.date.today().isoformat(),
        "command": "python benchmarks/attack_teeth.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"audit_{args.dataset}_{args.variant}_{args.attack}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    stem.with_suffix(".md").write_text(_markdown(result))
    print(f"wrote {stem}.json and .md")
    ok = result["with_check"]["detected"] and result["without_check"]["recovered"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
