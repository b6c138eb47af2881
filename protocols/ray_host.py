"""The body of a Ray actor that hosts many parties: :class:`~fedgat.protocols.hosting.PartyHost`, which
every hosting engine shares (:mod:`fedgat.protocols.hosting`), and the Ray engine's error type.

Kept as the Ray engine's own module name: :class:`fedgat.protocols.ray_engine.RayEngine` makes
:class:`PartyHost` an actor; the process engine (:mod:`fedgat.protocols.process_engine`) serves the
same class in its worker processes. Parties arrive as the bytes of their
:class:`~fedgat.protocols.party_values.PartySpec`, leave as the bytes of their
:class:`~fedgat.protocols.party_values.PartyReport`, and errors cross as values: nothing here pickles
a party, a result or an exception."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from .hosting import EngineError, Frame, PartyHost, failure, rss_bytes
from .hosting import raise_failure as _raise_failure

__all__ = ["Frame", "PartyHost", "RayEngineError", "failure", "raise_failure", "rss_bytes"]


class RayEngineError(EngineError):
    """An actor died or a hosted run could not proceed (not a protocol error: those are re-raised
    as the party raised them)."""


def raise_failure(error: Mapping[str, Any]) -> NoReturn:
    """Raise (in the coordinator) the error a :func:`failure` value from a Ray actor describes: a
    protocol error as the party raised it, anything that is not rebuilt as itself as
    :class:`RayEngineError`."""
    _raise_failure(error, RayEngineError, "a Ray actor")
