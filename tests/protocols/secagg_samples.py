"""Sample secure-aggregation messages (every type, valid field values) for the framing tests."""

from __future__ import annotations

import numpy as np

from fedgat.protocols.messages_secagg import (
    AdvertItem,
    Confirmation,
    RevealedShare,
    SealedShare,
    SecAggAdvert,
    SecAggCohort,
    SecAggConfirm,
    SecAggMasked,
    SecAggRelay,
    SecAggShares,
    SecAggSurvivors,
    SecAggUnmaskRequest,
    SecAggUnmaskShares,
)
from fedgat.protocols.secagg import SEALED_SHARE_BYTES


def secagg_samples(header: dict) -> list:
    """One message of each secure-aggregation type with the header fields ``header``."""
    advert = AdvertItem(2, b"c" * 32, b"s" * 32, b"b" * 32, b"d" * 32, b"g" * 64, 1)
    sealed = (SealedShare(0, b"x" * SEALED_SHARE_BYTES), SealedShare(2, b"y" * SEALED_SHARE_BYTES))
    masked = np.array([[1, -2, 3], [-(2**63), 0, 2**63 - 1]], dtype=np.int64)
    return [
        SecAggAdvert(
            round=3,
            c_pk=b"c" * 32,
            s_pk=b"s" * 32,
            b_commit=b"b" * 32,
            model_digest=b"d" * 32,
            binding_signature=b"g" * 64,
            parts=3,
            **header,
        ),
        SecAggCohort(round=3, adverts=(AdvertItem(1, *(b"z" * 32,) * 4, b"g" * 64), advert), **header),
        SecAggShares(round=3, shares=sealed, **header),
        SecAggRelay(round=3, shares=sealed, **header),
        SecAggMasked(round=3, masked=masked, **header),
        SecAggSurvivors(round=3, survivors=(0, 1, 2), **header),
        SecAggConfirm(round=3, confirmation=b"k" * 64, **header),
        SecAggUnmaskRequest(
            round=3,
            survivors=(0, 1, 2),
            confirmations=(Confirmation(0, b"k" * 64), Confirmation(2, b"l" * 64)),
            **header,
        ),
        SecAggUnmaskShares(
            round=3,
            b_shares=(RevealedShare(0, b"q" * 16),),
            s_shares=(RevealedShare(2, b"r" * 16),),
            **header,
        ),
    ]
