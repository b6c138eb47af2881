"""Known break 2 on a real-sized graph: the ``cohort_differencing`` training attack
(:mod:`fedgat.training_attacks`) against the real FedAvg protocol, on the decrypted encodings of a
plaintext pre-training (equal to the encrypted round's, tested), without the hours of the encrypted
round that ``fedgat audit`` runs first.

    python benchmarks/differencing.py --dataset cora --clients 10

Writes ``differencing_<dataset>.json`` into ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

from fedgat.data import load_dataset
from fedgat.partition import make_partition
from fedgat.pipeline import run_plaintext_pretraining
from fedgat.protocols.fedavg_client import DEFAULT_SECAGG
from fedgat.training_attacks import (
    ATTACK_STRATEGIES,
    TrainingSetting,
    differencing_attack,
    foreign_rows,
    gradient_nodes,
    neighbourhood_means,
)

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    graph = load_dataset(args.dataset)
    part = make_partition(graph, args.clients, beta=1.0, seed=args.seed)
    enc = run_plaintext_pretraining(graph, part, "vector", seed=args.seed + 1)
    setting = TrainingSetting(graph, part, enc, seed=args.seed, hparams={"variant": "vector"})
    trainers = [c for c in range(args.clients) if len(part.clients[c].train_nodes)]
    target = max(trainers, key=lambda c: len(foreign_rows(part, c)))
    pool = neighbourhood_means(setting, gradient_nodes(part, [target]))
    outcome = differencing_attack(
        setting,
        target,
        pool,
        foreign_rows(part, target),
        DEFAULT_SECAGG,
        ATTACK_STRATEGIES[0],
        ATTACK_STRATEGIES,
    )
    result = {
        "dataset": args.dataset,
        "clients": args.clients,
        "beta": 1.0,
        "seed": args.seed,
        "variant": "vector",
        "cohort_differencing": outcome.as_dict(),
        "seconds": round(time.perf_counter() - start, 1),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "date": dt.date.today().isoformat(),
        "command": "python benchmarks/differencing.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"differencing_{args.dataset}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result["cohort_differencing"]["runs"], indent=1, default=str))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
