"""The body of a Ray actor that hosts many parties: :class:`~fedgat.protocols.hosting.PartyHost`, which
every hosting engine shares (:mod:`fedgat.protocols.hosting`), and the Ray engine's error type.

Kept as the Ray engine's own module name: :class:`fedgat.protocols.ray_engine.RayEngine` makes
:class:`PartyHost` an actor; the process engine (:mod:`fedgat.protocols.process_engine`) serves the
same class in its worker processes (a Ray actor is :class:`RayPartyHost`). Parties arrive as the bytes
of their :class:`~fedgat.protocols.party_values.PartySpec`, leave as the bytes of their
:class:`~fedgat.protocols.party_values.PartyReport` (on Ray both as ``uint8`` arrays over those bytes,
:func:`out_of_band`), and errors cross as values: nothing here pickles a party, a result or an
exception."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np

from .hosting import EngineError, Frame, PartyHost, failure, rss_bytes
from .hosting import raise_failure as _raise_failure

__all__ = [
    "Frame",
    "PartyHost",
    "RayEngineError",
    "RayPartyHost",
    "failure",
    "out_of_band",
    "raise_failure",
    "rss_bytes",
]


def out_of_band(blob: bytes) -> np.ndarray:
    """``blob`` as a read-only ``uint8`` array over the same memory, for a Ray call's argument or answer.

    Ray's serialiser ships a numpy array's buffer out of band (one copy into the object store, a
    zero-copy view out of it) and ``bytes`` in band (pickled into its message: a copy more on each
    side). Specs and reports are large (a training client's carries its task encodings, ~70 MB at 10k
    nodes); their readers take any buffer (:func:`fedgat.checkpoint.decode_checkpoint`)."""
    return np.frombuffer(blob, dtype=np.uint8)


class RayPartyHost(PartyHost):
    """:class:`PartyHost` as a Ray actor: its reports leave as :func:`out_of_band` arrays (the
    coordinator sends specs the same way, :meth:`fedgat.protocols.ray_engine.RayTransport._call`)."""

    def __init__(self, threads: int | None = 1, preload: tuple[str, ...] = ()) -> None:
        from fedgat.allocator import keep_freed_memory

        keep_freed_memory()  # an actor trains its clients: as the command line's process (fedgat.allocator)
        super().__init__(threads, preload)

    def report(self, pids: list[int], drop: bool = True) -> dict:
        answer = super().report(pids, drop)
        answer["reports"] = {pid: out_of_band(blob) for pid, blob in answer["reports"].items()}
        return answer


class RayEngineError(EngineError):
    """An actor died or a hosted run could not proceed (not a protocol error: those are re-raised
    as the party raised them)."""


def raise_failure(error: Mapping[str, Any]) -> NoReturn:
    """Raise (in the coordinator) the error a :func:`failure` value from a Ray actor describes: a
    protocol error as the party raised it, anything that is not rebuilt as itself as
    :class:`RayEngineError`."""
    _raise_failure(error, RayEngineError, "a Ray actor")
