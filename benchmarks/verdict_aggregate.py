"""Known break 22's open part against the real state machines: a verdict on a column sum.

    python benchmarks/verdict_aggregate.py [--sessions 30] [--out benchmarks/results]

The server alone (:class:`fedgat.server_attacks.ProbingServer` with several targets) adds ``lam``
times the sum of one column over all ``N`` rows one owner released to the victim into a checked slot
of the victim's first result, one session per probe, and reads the victim's verdict. The rows are
padded (Gaussian of sd ``sigma`` since frame version 13), so the sum the victim's check sees is
``S = sum_j (h_j[c] + rho_j[c])``: its data part grows as ``N x`` while the pads spread as
``sigma sqrt(N)``. The server does not know the check vectors, so its window is centred on zero,
about half a standard deviation of the pads' sum wide. Run on a small synthetic graph twice, the
owner's column ``x`` = 1 in every row or 0 (the rest of each row renormalised): a statistic of many
rows, which DP does not hide (the sixteenth review pass; SECURITY.md, "Known breaks" 22); beside the
measured rates, the total variation that bounds any test (reached by a one-sided one with the check
vectors known, ``benchmarks/verdict_pads.py``), and one feature's.
Writes ``verdict_aggregate.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

COLUMN, OWNER = 3, 1


def graph_with(graph, partition, x: float):
    """``graph`` with the owner's column ``COLUMN`` set to ``x`` in every row, rows unit-norm."""
    import torch

    feats = graph.x.clone().abs().double()
    own = torch.from_numpy(partition.owner == OWNER)
    feats[own, COLUMN] = 0.0
    feats[own] = feats[own] / feats[own].norm(dim=1, keepdim=True) * np.sqrt(1 - x * x)
    feats[own, COLUMN] = x
    feats[~own] = feats[~own] / feats[~own].norm(dim=1, keepdim=True)
    return dataclasses.replace(graph, x=feats.float())


def measure(sessions: int, preset: str = "n4096") -> dict:
    from fedgat.benchmarks.verdict_pads import total_variation
    from fedgat.crypto.tags import TAG_TOLERANCE
    from fedgat.partition import make_partition
    from fedgat.protocols import PretrainConfig
    from fedgat.server_attacks import (
        AttackSetting,
        ProbingServer,
        _build,
        _drive,
        _rejections,
        _server_args,
        first_recipient,
        foreign_rows,
    )
    from fedgat.synthetic import synthetic_graph

    base = synthetic_graph(
        num_nodes=120, num_features=16, avg_degree=4.0, train_per_class=5, num_val=20, num_test=40, seed=3
    )
    part = make_partition(base, 3, beta=1.0, seed=0)
    victim = first_recipient(part)
    assert victim is not None
    rows = foreign_rows(part, victim)
    targets = rows[part.owner[rows] == OWNER]
    pad = PretrainConfig(session=1, preset=preset).upload_pad
    spread = pad * np.sqrt(len(targets))
    lam = TAG_TOLERANCE * np.sqrt(base.num_features) / (0.5 * spread)
    accepted = {}
    for x in (1.0, 0.0):
        graph, passed = graph_with(base, part, x), 0
        for k in range(sessions):
            setting = AttackSetting(graph, part, "vector", seed=1000 + k, preset=preset)

            def server(parties, setting=setting):
                return ProbingServer(
                    **_server_args(parties, setting, 1), victim=victim, target=targets, column=COLUMN, lam=lam
                )

            driver = _drive(_build(setting, server=server))
            passed += not _rejections(driver, victim)
        accepted[x] = passed / sessions
    n = len(targets)
    return {
        "preset": preset,
        "upload_pad": pad,
        "victim": int(victim),
        "owner": OWNER,
        "rows": n,
        "column": COLUMN,
        "sessions": sessions,
        "lam": lam,
        "accepted_x1": accepted[1.0],
        "accepted_x0": accepted[0.0],
        "advantage": abs(accepted[0.0] - accepted[1.0]),
        "sampling_sd": float(np.sqrt(sum(a * (1 - a) for a in accepted.values()) / sessions)),
        "one_feature_total_variation": total_variation(1.0, pad),
        "one_sided_total_variation": total_variation(n, spread),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=30, help="sessions per value of the column")
    parser.add_argument("--preset", default="n4096")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    from fedgat.benchmarks.verdict_pads import stamp

    start = time.perf_counter()
    out = stamp(measure(args.sessions, args.preset), start)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verdict_aggregate.json").write_text(json.dumps(out, indent=2) + "\n")
    text = "\n".join(
        [
            "# A verdict on a column sum over an owner's rows (known break 22, open part)",
            "",
            (
                f"{out['date']}, {out['machine']}, {out['cores']} cores, {out['seconds']} s; preset "
                f"{out['preset']} (pads sigma = {out['upload_pad']:.3g}); victim {out['victim']}, the sum of "
                f"column {COLUMN} over the {out['rows']} rows owner {OWNER} released to it, "
                f"{out['sessions']} sessions per value."
            ),
            "",
            "| column in every row | sessions accepted |",
            "|---|---|",
            f"| 1.0 | {out['accepted_x1']:.2f} |",
            f"| 0 | {out['accepted_x0']:.2f} |",
            "",
            (
                f"Advantage {out['advantage']:.2f} (sampling sd {out['sampling_sd']:.2f}); the most any "
                f"test reads (total variation of the two sums): {out['one_sided_total_variation']:.2f}; "
                f"one feature of the same value: {out['one_feature_total_variation']:.3f}."
            ),
        ]
    )
    (args.out / "verdict_aggregate.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
