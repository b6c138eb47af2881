"""What the upload pads leave of known break 22: the server's best verdict tests, against DP.

    python benchmarks/verdict_pads.py [--trials 20000] [--out benchmarks/results]

The server adds ``lam`` times one column of a foreign upload ``u = h + rho`` (``rho`` Gaussian of sd
``sigma`` since frame version 13), plus a constant ``b`` of its choice, to a slot of the victim's
result that the victim checks, and reads the victim's verdict. Unpadded (``sigma = 0``) any ``lam``
gives the zero test: refused iff ``h != 0``. Padded, the check passes iff ``u`` lies in a window that
``lam`` and ``b`` set. Between the hypotheses ``h = 0`` and ``h`` the best such test (Neyman-Pearson:
the likelihood ratio of two Gaussians is monotone) is one-sided, here a window ``8 sigma`` wide that
ends at ``h / 2`` (chosen with the secret check vectors known, which favours the attacker): its
advantage is the total variation ``2 Phi(|h| / (2 sigma)) - 1`` between the two, which the
Gaussian mechanism's ``(epsilon, delta)`` bounds (:mod:`fedgat.verdict_dp`; at the rows'
sensitivity 2 a session's per-row epsilon is in the table).

:func:`aggregate_acceptance` does the same for the sum of one column over many rows of an owner,
whose pads add up to ``sigma sqrt(rows)`` while the data grow as ``rows * x``: a statistic of many
rows, which DP does not hide (a sixteenth review pass).

Each trial is one session's check as the recipient runs it (:func:`fedgat.crypto.tags.check_share`
with real pads and check vectors, keys drawn from a seeded generator so that both hypotheses see the
same keys and pads, i.e. the difference of the rates is measured paired; no CKKS noise, which only
blurs the test further). Writes ``verdict_pads.json`` and ``verdict_pads.md``.
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


def _window(cut: float, width: float, keys, tol: float) -> tuple[float, float]:
    """``(lam, b)`` that make the check pass iff ``cut - width <= t <= cut``, ``t`` the value the
    server scales into the checked slot (check vectors known)."""
    r_c = np.abs(keys.vectors(DIM)[:, COLUMN]).max()  # the tag that misses most
    lam = 2 * tol / (r_c * width) * (1 - 1e-9)
    return lam, -lam * (cut - width / 2)


def acceptance(
    h: float, pad: float, trials: int, *, cut: float = 0.0, zero_test: bool = False, seed: int = 0
) -> float:
    """Share of ``trials`` sessions whose probed result passes the victim's check: a window of
    ``8 pad`` ending at ``cut`` (``zero_test``: ``lam = 100``, no constant)."""
    from fedgat.crypto.tags import TAG_TOLERANCE, CheckKeys, release_rows

    rng = np.random.default_rng(seed)
    tol = TAG_TOLERANCE * 2.0  # (1 + sum |C|) for one coefficient
    passed = 0
    for t in range(trials):
        keys = CheckKeys(rng.bytes(32), rng.bytes(32))  # a simulation: seeded, so both hypotheses pair
        row = np.zeros((1, DIM))
        row[0, COLUMN], row[0, (COLUMN + 1) % DIM] = h, np.sqrt(1.0 - h * h)
        u = release_rows(keys, t, np.array([NODE]), row, pad)
        coefficients = np.array([[1.0]])
        result = coefficients @ u
        lam, b = (100.0, 0.0) if zero_test else _window(cut, 8 * pad, keys, tol)
        result[0, COLUMN] += lam * u[0, COLUMN] + b
        passed += accepted(result, coefficients, keys, t, np.array([NODE]), row, u)
    return passed / trials


def aggregate_acceptance(x: float, rows: int, pad: float, trials: int, cut: float, seed: int = 0) -> float:
    """Share of ``trials`` sessions passing when the server adds ``lam`` times the *sum* of one
    column over ``rows`` released rows (each with value ``x`` there), plus a constant, to a checked
    slot: a window ``8 pad sqrt(rows)`` wide ending at ``cut`` (check vectors known, as above). The
    pads add up to ``pad sqrt(rows)`` while the data part grows as ``rows * x``: a statistic of an
    owner's rows is read far better than one feature (a sixteenth review pass)."""
    from fedgat.crypto.tags import TAG_TOLERANCE, CheckKeys, release_rows

    rng = np.random.default_rng(seed)
    nodes = np.arange(100, 100 + rows)
    passed = 0
    for t in range(trials):
        keys = CheckKeys(rng.bytes(32), rng.bytes(32))
        h = np.abs(rng.standard_normal((rows, DIM)))
        h[:, COLUMN] = 0.0
        h *= np.sqrt(1 - x * x) / np.linalg.norm(h, axis=1, keepdims=True)
        h[:, COLUMN] = x
        u = release_rows(keys, t, nodes, h, pad)
        coefficients = np.zeros((2, rows))
        coefficients[1] = rng.standard_normal(rows) / np.sqrt(rows)
        result = coefficients @ u
        tol = TAG_TOLERANCE * (1 + np.abs(coefficients).sum(axis=1)).min()
        lam, b = _window(cut, 8 * pad * np.sqrt(rows), keys, tol)
        result[0, COLUMN] += lam * u[:, COLUMN].sum() + b
        passed += accepted(result, coefficients, keys, t, nodes, h, u)
    return passed / trials


def total_variation(shift: float, sd: float) -> float:
    """Total variation between ``N(0, sd^2)`` and ``N(shift, sd^2)``: ``2 Phi(|shift| / (2 sd)) - 1``."""
    from scipy.stats import norm

    return float(2 * norm.cdf(abs(shift) / (2 * sd)) - 1) if sd > 0 else float(shift != 0)


def dp_advantage(epsilon: float, delta: float) -> float:
    """The most an ``(epsilon, delta)``-DP mechanism lets any test tell two neighbours apart."""
    return float((np.expm1(epsilon) + 2 * delta) / (np.exp(epsilon) + 1))


def measure_aggregates(trials: int) -> list[dict]:
    """The column-sum test of :func:`aggregate_acceptance`, per preset (vector), rows and value,
    paired; beside it the total variation it attains, ``2 Phi(sqrt(rows) x / (2 sigma)) - 1``."""
    from fedgat.crypto import get_preset

    out = []
    for name in ("n4096", "n8192"):
        pad = get_preset(name).pad_bound(1.0)
        for rows, x in ((45, 1.0), (45, 0.24), (200, 0.24)):
            seed = len(out)
            a0, a1 = (aggregate_acceptance(v, rows, pad, trials, rows * x / 2, seed=seed) for v in (0.0, x))
            out.append(
                {
                    "preset": name,
                    "upload_pad": pad,
                    "rows": rows,
                    "x": x,
                    "accepted_0": a0,
                    "accepted_x": a1,
                    "advantage": a0 - a1,
                    "total_variation": total_variation(rows * x, pad * np.sqrt(rows)),
                    "one_feature": total_variation(x, pad),
                }
            )
    return out


def measure(trials: int, values: tuple[float, ...] = (0.05, 0.24, 1.0)) -> dict:
    from fedgat.crypto import PRESETS
    from fedgat.variants import as_variant
    from fedgat.verdict_dp import DEFAULT_DELTA, verdict_epsilon

    rows = []
    for name, preset in PRESETS.items():
        for variant in ("vector", "matrix"):
            pad = preset.pad_bound(as_variant(variant).max_coefficient_row_norm())
            eps = verdict_epsilon(pad, 1)
            for h in values:
                seed = len(rows)  # independent draws per row, paired within it
                a0, a1 = (acceptance(v, pad, trials, cut=h / 2, seed=seed) for v in (0.0, h))
                tv = total_variation(h, pad)
                rows.append(
                    {
                        "preset": name,
                        "variant": variant,
                        "upload_pad": pad,
                        "h": h,
                        "accepted_h0": a0,
                        "accepted_h": a1,
                        "advantage": a0 - a1,
                        "total_variation": tv,
                        "sampling_sd": float(np.sqrt(max(tv, 1e-12) * (1 - tv) / trials)),
                        "epsilon_per_session": eps,
                        "dp_bound": dp_advantage(eps, DEFAULT_DELTA),
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
            "Padded (Gaussian, sd sigma): the best single-slot test (one-sided, ending at h / 2, check "
            "vectors known), paired; its advantage against the total variation of the two Gaussians and "
            "against what the session's per-row epsilon (delta 1e-5, one recipient) allows any test."
        ),
        "",
        (
            "| preset | variant | sigma | h | accepted (h = 0) | accepted (h) | advantage | total variation "
            "| sampling sd | epsilon / session | DP bound |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['preset']} | {r['variant']} | {r['upload_pad']:.3g} | {r['h']} | {r['accepted_h0']:.4f} | "
        f"{r['accepted_h']:.4f} | {r['advantage']:.4f} | {r['total_variation']:.4f} | {r['sampling_sd']:.4f} | "
        f"{r['epsilon_per_session']:.3g} | {r['dp_bound']:.3g} |"
        for r in out["rows"]
    ]
    lines += [
        "",
        (
            f"Column sums over an owner's rows ({max(200, args.trials // 10)} sessions per rate, paired, "
            "one-sided at rows x / 2): the pads add up as sigma sqrt(rows), the data as rows * x, so a "
            "statistic of many rows is read far better than one feature; DP does not hide it (group "
            "privacy: rows x at distance sqrt(rows) x)."
        ),
        "",
        "| preset | sigma | rows | x | accepted (0) | accepted (x) | advantage | total variation | one feature |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['preset']} | {r['upload_pad']:.3g} | {r['rows']} | {r['x']} | {r['accepted_0']:.3f} | "
        f"{r['accepted_x']:.3f} | {r['advantage']:.3f} | {r['total_variation']:.3f} | {r['one_feature']:.2g} |"
        for r in out["aggregates"]
    ]
    (args.out / "verdict_pads.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
