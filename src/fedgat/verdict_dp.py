"""What a server learns from the recipients' verdicts, as differential privacy (known break 22).

A recipient checks every result it decrypts (:mod:`fedgat.crypto.tags`) and refuses the session if
one fails; the server sees that verdict, and it chooses what it sends. Since every row an owner
releases is padded with Gaussian noise under a key the server does not hold (frame version 13:
``u = h + rho``, ``rho ~ N(0, sigma^2 I)``, :func:`fedgat.crypto.tags.prf_pads`), every verdict is
a function of ``u`` and of the recipient's keys alone, which do not depend on the data: whatever the
server sends, the verdicts of one session are post-processing of the Gaussian mechanism
``h -> h + rho`` applied once per recipient of the row. For replace-one neighbouring between unit
rows (L2 sensitivity 2) a row released to ``R`` recipients is therefore
``(epsilon, delta)``-DP towards the server, with ``epsilon`` that of ``R`` Gaussian mechanisms of
sd ``sigma`` (:func:`verdict_epsilon`, ``dp_accounting``'s PLD accountant, as the owners' ledgers
compose their releases: :mod:`fedgat.dp_ledger`). Sessions compose: an owner that keeps a ledger
has each session's verdicts charged to it (``ClientPretrain(ledger=...)``,
:func:`verdict_record`), and a session past the budget is refused before anything is sent.

What this does not protect: a statistic of many of an owner's rows (how often a word occurs among
them), which DP by design leaves readable (group privacy: ``k`` rows at ``k`` times the distance);
the pads bound it as in SECURITY.md ("Known breaks", 22). With the DP release of shared rows on
(``PretrainConfig.dp``), the rows the server computes on are already a DP release, and the verdicts
are its post-processing too: they spend nothing beyond the release's charge.

``sigma`` is public (:attr:`fedgat.protocols.PretrainConfig.upload_pad`): 14.2 at the default
``n4096`` (vector variant; 6.4 matrix), 819 at ``n8192``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from fedgat.dp_ledger import SENSITIVITY, ReleaseRecord, composed_epsilon

__all__ = ["DEFAULT_DELTA", "row_recipients", "verdict_epsilon", "verdict_record"]

#: the delta at which a session's verdicts are reported (an owner's ledger uses its budget's)
DEFAULT_DELTA = 1e-5


def verdict_record(sigma: float, recipients: int) -> ReleaseRecord:
    """The ledger record of one session's verdicts on a row released to ``recipients`` parties:
    ``recipients`` Gaussian mechanisms of sd ``sigma`` at the unit rows' sensitivity 2.

    Raises:
        DPError: ``sigma`` not finite and > 0, or ``recipients`` < 1.
    """
    return ReleaseRecord.gaussian(sigma, SENSITIVITY, count=recipients)


def verdict_epsilon(
    sigma: float, recipients: int = 1, *, sessions: int = 1, delta: float = DEFAULT_DELTA
) -> float:
    """Epsilon at ``delta`` of ``sessions`` sessions' verdicts on a row released to ``recipients``
    parties in each, padded with sd ``sigma`` (``inf`` unpadded; 0 for a row released to nobody).

    Raises:
        ValueError: ``recipients`` or ``sessions`` < 0, ``sigma`` < 0 or not finite, ``delta`` not in (0, 1).
    """
    if not (isinstance(sigma, int | float) and math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma!r}")
    if recipients < 0 or sessions < 0:
        raise ValueError(f"recipients and sessions must be >= 0, got {recipients}, {sessions}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if recipients == 0 or sessions == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    return composed_epsilon([(verdict_record(sigma, recipients), sessions)], delta)


def row_recipients(releases: Mapping[int, np.ndarray], owned: np.ndarray) -> np.ndarray:
    """``(len(owned),)``: to how many recipients each owned row is released (``releases``:
    recipient -> node ids, as :attr:`fedgat.protocols.ClientPretrain.releases`)."""
    owned = np.asarray(owned, dtype=np.int64)
    counts = np.zeros(len(owned), dtype=np.int64)
    for nodes in releases.values():
        hit = np.isin(owned, np.asarray(nodes, dtype=np.int64))
        counts += hit
    return counts
