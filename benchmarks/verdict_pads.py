"""What the upload pads leave of known break 22: the server's best single-slot verdict test.

    python benchmarks/verdict_pads.py [--trials 20000] [--out benchmarks/results]

The server adds ``lam`` times one column of a foreign upload ``u = h + rho`` (``rho`` uniform on
``(-A, A)``) to a slot of the victim's result that the victim checks, and reads the victim's
verdict. Unpadded (``A = 0``) any ``lam`` gives the zero test: refused iff ``h != 0``. Padded, the
verdict is ``|lam u r_c| <= tol``: the check passes iff ``|h + rho|`` is within a window set by
``lam``. A window inside the pads' support says nothing of ``h``; the best one ends exactly at
the support's edge, ``A`` (chosen here with the secret check vectors known, which favours the
attacker): a session passes with probability ``1`` for ``h = 0`` and ``1 - |h| / (2A)`` otherwise,
the bound itself.

:func:`aggregate_acceptance` does the same for the sum of one column over many rows of an owner,
whose pads add up to a spread of only ``A sqrt(rows / 3)`` (a sixteenth review pass).

Each trial is one session's check as the recipient runs it (:func:`fedgat.crypto.tags.check_share`
with real pads, real check vectors and fresh pair keys; no CKKS noise, which only blurs the test
further). Writes ``verdict_pads.json`` and ``verdict_pads.md``: per preset's pad bound and feature
value, the measured acceptance rates, their difference (the advantage) and the bound.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

DIM, NODE, COLUMN = 8, 5, 3


def accepted(
    result: np.ndarray, coefficients: np.ndarray, keys, session: int, nodes: np.ndarray, rows, u
) -> bool:
    """The victim's verdict on a (probed) partial ``result`` of the rows ``rows`` of ``nodes``,
    released as ``u`` under the pair ``keys`` (:func:`fedgat.crypto.tags.check_share`, the pads'
    part removed as the recipient removes it)."""
    from fedgat.crypto.tags import ResultCheckError, check_share, prf_tags

    try:
        check_share(
            result,
            coefficients,
            prf_tags(keys.prf, session, nodes),
            keys.vectors(DIM),
            node=0,
            owners=(1,),
            offsets=coefficients @ (u[:, :DIM] - rows),
        )
    except ResultCheckError:
        return False
    return True


def stamp(out: dict, start: float) -> dict:
    """``out`` with the machine, its cores, the date and the seconds since ``start``."""
    out.update(
        machine=platform.node(),
        cores=os.cpu_count(),
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        seconds=round(time.perf_counter() - start, 1),
    )
    return out


def acceptance(h: float, pad: float, trials: int, *, zero_test: bool = False) -> float:
    """Share of ``trials`` sessions whose probed result passes the victim's check."""
    from fedgat.crypto.tags import TAG_TOLERANCE, CheckKeys, release_rows

    tol = TAG_TOLERANCE * 2.0  # (1 + sum |C|) for one coefficient
    passed = 0
    for t in range(trials):
        keys = CheckKeys.generate()
        row = np.zeros((1, DIM))
        row[0, COLUMN], row[0, (COLUMN + 1) % DIM] = h, np.sqrt(1.0 - h * h)
        u = release_rows(keys, t, np.array([NODE]), row, pad)
        coefficients = np.array([[1.0]])
        result = coefficients @ u
        r_c = np.abs(keys.vectors(DIM)[:, COLUMN]).max()  # the tag that misses most
        lam = 100.0 if zero_test else tol / (r_c * pad) * (1 - 1e-9)  # the window ends at the edge
        result[0, COLUMN] += lam * u[0, COLUMN]
        passed += accepted(result, coefficients, keys, t, np.array([NODE]), row, u)
    return passed / trials


def aggregate_acceptance(x: float, rows: int, pad: float, trials: int, window: float, seed: int = 0) -> float:
    """Share of ``trials`` sessions passing when the server adds ``lam`` times the *sum* of one
    column over ``rows`` released rows (each with value ``x`` there) to a checked slot, its window
    ``window`` standard deviations of the pads' sum wide (check vectors known, as above). The pads
    add up to a spread of ``A sqrt(rows / 3)`` while the data part grows as ``rows * x``: a statistic
    of an owner's rows is read far better than one feature (a sixteenth review pass)."""
    from fedgat.crypto.tags import TAG_TOLERANCE, CheckKeys, release_rows

    rng = np.random.default_rng(seed)
    nodes = np.arange(100, 100 + rows)
    spread = pad * np.sqrt(rows / 3)
    passed = 0
    for t in range(trials):
        keys = CheckKeys(rng.bytes(32), rng.bytes(32))  # a simulation: seeded, so both hypotheses pair
        h = np.abs(rng.standard_normal((rows, DIM)))
        h[:, COLUMN] = 0.0
        h *= np.sqrt(1 - x * x) / np.linalg.norm(h, axis=1, keepdims=True)
        h[:, COLUMN] = x
        u = release_rows(keys, t, nodes, h, pad)
        coefficients = np.zeros((2, rows))
        coefficients[1] = rng.standard_normal(rows) / np.sqrt(rows)
        result = coefficients @ u
        r_c = np.abs(keys.vectors(DIM)[:, COLUMN]).max()
        lam = TAG_TOLERANCE * (1 + np.abs(coefficients).sum(axis=1)).min() / (r_c * window * spread)
        result[0, COLUMN] += lam * u[:, COLUMN].sum()
        passed += accepted(result, coefficients, keys, t, nodes, h, u)
    return passed / trials


def measure_aggregates(trials: int) -> list[dict]:
    """The column-sum test of :func:`aggregate_acceptance`: per preset (vector), rows and value,
    the best of three windows centred on zero; beside it the Gaussian model of the best one-sided
    test, ``0.69 rows x / (A sqrt(rows))`` (its total variation)."""
    from fedgat.crypto import get_preset

    out = []
    for name in ("n4096", "n8192"):
        pad = get_preset(name).pad_bound(1.0)
        for rows, x in ((45, 1.0), (45, 0.24), (200, 0.24)):
            best = max(
                (
                    abs(
                        aggregate_acceptance(0.0, rows, pad, trials, w)
                        - aggregate_acceptance(x, rows, pad, trials, w)
                    ),
                    w,
                )
                for w in (0.5, 1.0, 2.0)
            )
            model = min(1.0, 0.69 * rows * x / (pad * np.sqrt(rows)))
            out.append(
                {
                    "preset": name,
                    "upload_pad": pad,
                    "rows": rows,
                    "x": x,
                    "advantage": best[0],
                    "window_sd": best[1],
                    "gaussian_model": model,
                    "single_feature_bound": x / (2 * pad),
                }
            )
    return out


def measure(trials: int, values: tuple[float, ...] = (0.05, 0.24, 1.0)) -> dict:
    from fedgat.crypto import PRESETS
    from fedgat.variants import as_variant

    rows = []
    for name, preset in PRESETS.items():
        for variant in ("vector", "matrix"):
            pad = preset.pad_bound(as_variant(variant).max_coefficient_row_norm())
            base = acceptance(0.0, pad, trials)
            for h in values:
                rate = acceptance(h, pad, trials)
                rows.append(
                    {
                        "preset": name,
                        "variant": variant,
                        "upload_pad": pad,
                        "h": h,
                        "accepted_h0": base,
                        "accepted_h": rate,
                        "advantage": abs(base - rate),
                        "bound": h / (2 * pad),
                        "sampling_sd": float(np.sqrt(rate * (1 - rate) / trials)),
                    }
                )
    unpadded = {
        "accepted_h0": acceptance(0.0, 0.0, 200, zero_test=True),
        "accepted_h": acceptance(0.24, 0.0, 200, zero_test=True),
    }
    aggregates = measure_aggregates(max(200, trials // 10))
    return {"trials": trials, "rows": rows, "unpadded_zero_test": unpadded, "aggregates": aggregates}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = stamp(measure(args.trials), start)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verdict_pads.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [
        "# Upload pads against the verdict oracle (known break 22)",
        "",
        (
            f"{out['date']}, {out['machine']}, {out['cores']} cores, {args.trials} sessions per rate, "
            f"{out['seconds']} s. Unpadded zero test: accepted {out['unpadded_zero_test']['accepted_h0']:.2f} "
            f"for h = 0, {out['unpadded_zero_test']['accepted_h']:.2f} for h = 0.24 (the bit, exactly). "
            "Padded: the best single-slot test (its window at the pads' edge, check vectors known)."
        ),
        "",
        "| preset | variant | pad A | h | accepted (h = 0) | accepted (h) | advantage | bound h / 2A | sampling sd |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['preset']} | {r['variant']} | {r['upload_pad']:.3g} | {r['h']} | {r['accepted_h0']:.4f} | "
        f"{r['accepted_h']:.4f} | {r['advantage']:.4f} | {r['bound']:.2g} | {r['sampling_sd']:.4f} |"
        for r in out["rows"]
    ]
    lines += [
        "",
        (
            f"Column sums over an owner's rows ({max(200, args.trials // 10)} sessions per rate, best of three "
            "windows): the pads add up as A sqrt(rows / 3), the data as rows * x, so a statistic of many rows "
            "is read far better than one feature."
        ),
        "",
        "| preset | pad A | rows | x | advantage | Gaussian model | one-feature bound x / 2A |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['preset']} | {r['upload_pad']:.3g} | {r['rows']} | {r['x']} | {r['advantage']:.3f} | "
        f"{r['gaussian_model']:.3f} | {r['single_feature_bound']:.2g} |"
        for r in out["aggregates"]
    ]
    (args.out / "verdict_pads.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
