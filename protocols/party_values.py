r"""Parties as values: what an engine ships to host a party and what a hosted party reports back.

An engine that runs a party somewhere else (a Ray actor: :mod:`fedgat.protocols.ray_engine`) does not
pickle the party object. It ships a :class:`PartySpec` -- the party's kind, id and constructor inputs
as plain values -- and rebuilds the party there (:meth:`PartySpec.build`); when the run ends the
hosted party sends a :class:`PartyReport` -- state, abort reason, failure, timings, counters and its
result -- which the caller's own copy of the party takes in (:meth:`~fedgat.protocols.party.Party.absorb`),
so callers read results as after an in-process run (e.g. ``client.encodings``).

Both are frozen dataclasses whose fields hold *plain values* only::

    Value = None | bool | int | float | str | bytes | numpy array (numeric dtype)
          | list[Value] | dict[str, Value]

and travel as bytes without pickle (:meth:`PartySpec.to_bytes`): the checkpoint format of
:mod:`fedgat.checkpoint` (a JSON manifest, then the arrays' raw little-endian bytes, SHA-256 over
all), with every array and ``bytes`` value moved out of the JSON into a named array. Decoding runs
no code: JSON, :func:`numpy.frombuffer` on plain dtypes, and a party class picked from the
allow-list :data:`PARTY_KINDS` (a spec of any other kind raises :class:`TypeError`).

Each party class says what it ships and reports: :meth:`~fedgat.protocols.party.Party.spec` /
``from_spec``, ``report`` / ``absorb``. A class without a ``PARTY_KIND`` of its own (the server
parties, test doubles that subclass a client) cannot be described, and its ``spec()`` raises
:class:`TypeError`. A spec describes a party *before* it has sent or received a message (what an
engine places); a party mid-run is carried by its :class:`~fedgat.protocols.party_state.PartyState`
(:meth:`~fedgat.protocols.party.Party.state_value`) instead.

Secrets: a spec carries its party's raw private keys (the host of a party is that party's trust
domain, as in simulation); ``repr`` of a spec shows field names only. A report carries none (the CKKS
secret context and the private keys stay where the party ran).

Errors raised in a hosted party travel as values too (:func:`error_to_value`,
:func:`error_from_value`): the protocol's typed errors (:mod:`fedgat.protocols.errors`) and a few
builtins are rebuilt as themselves, anything else as the caller's ``fallback`` type.
"""

from __future__ import annotations

import builtins
import importlib
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fedgat.checkpoint import (
    Checkpoint,
    CheckpointFormatError,
    decode_checkpoint,
    encode_checkpoint,
    encodings_from_checkpoint,
    encodings_to_checkpoint,
)

from . import errors as protocol_errors
from .errors import FaultError, QuorumError

if TYPE_CHECKING:
    from fedgat.encodings import Encodings

    from .party import Party

__all__ = [
    "PARTY_KINDS",
    "REPORT_KIND",
    "SPEC_KIND",
    "PartyReport",
    "PartySpec",
    "encodings_from_value",
    "encodings_to_value",
    "error_from_value",
    "error_to_value",
    "pack_value",
    "party_class",
    "register_party_kind",
    "unpack_value",
]

SPEC_KIND = "fedgat.party.spec"
REPORT_KIND = "fedgat.party.report"

#: party kind -> ``"module:class"``: the only classes a spec may build (imported on first use)
PARTY_KINDS: dict[str, str] = {
    "pretrain.client": "fedgat.protocols.pretrain_client:ClientPretrain",
    "rounds.client": "fedgat.protocols.fedavg_client:ClientRounds",
}

#: builtin exceptions rebuilt as themselves by :func:`error_from_value`
_BUILTIN_ERRORS = frozenset(
    {
        "AssertionError",
        "IndexError",
        "KeyError",
        "NotImplementedError",
        "RuntimeError",
        "TypeError",
        "ValueError",
    }
)


def register_party_kind(kind: str, target: str) -> None:
    """Allow specs of ``kind`` to build ``target`` (``"module:class"``; the class's own
    ``PARTY_KIND`` must be ``kind``)."""
    if PARTY_KINDS.get(kind, target) != target:
        raise ValueError(f"party kind {kind!r} is already registered for {PARTY_KINDS[kind]}")
    PARTY_KINDS[kind] = target


def party_class(kind: str) -> type[Party]:
    """The party class registered for ``kind``.

    Raises:
        TypeError: no such kind, or the class does not declare it.
    """
    target = PARTY_KINDS.get(kind) if isinstance(kind, str) else None
    if target is None:
        raise TypeError(f"no party kind {kind!r}; known kinds: {sorted(PARTY_KINDS)}")
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if cls.__dict__.get("PARTY_KIND") != kind:
        raise TypeError(f"{target} does not declare PARTY_KIND = {kind!r}")
    return cls


# ----------------------------------------------------------------------------------------- codec
def pack_value(value: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """``(json, arrays)``: ``value`` with every array and ``bytes`` replaced by a reference to a named
    array (``{"$array": name}``, ``{"$bytes": name}``); tuples become lists.

    Raises:
        TypeError: a value that is not plain (see the module docstring), or a dict key that is not a
            string or starts with ``$``.
    """
    arrays: dict[str, np.ndarray] = {}

    def walk(v: Any, path: str) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, np.bool_):
            return bool(v)
        if isinstance(v, (int, np.integer)):
            return int(v)
        if isinstance(v, (float, np.floating)):
            return float(v)
        if isinstance(v, (bytes, bytearray)):
            name = f"v{len(arrays)}"
            arrays[name] = np.frombuffer(bytes(v), dtype=np.uint8)
            return {"$bytes": name}
        if isinstance(v, np.ndarray):
            name = f"v{len(arrays)}"
            arrays[name] = v
            return {"$array": name}
        if isinstance(v, (list, tuple)):
            return [walk(x, f"{path}[{i}]") for i, x in enumerate(v)]
        if isinstance(v, Mapping):
            out = {}
            for k, x in v.items():
                if not isinstance(k, str) or k.startswith("$"):
                    raise TypeError(f"{path}: key {k!r} is not a plain string key")
                out[k] = walk(x, f"{path}.{k}")
            return out
        raise TypeError(f"{path}: {type(v).__name__} is not a plain value")

    return walk(value, "value"), arrays


def unpack_value(packed: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """Inverse of :func:`pack_value` (arrays are writable copies)."""

    def walk(v: Any) -> Any:
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            if len(v) == 1 and ("$array" in v or "$bytes" in v):
                ref = v.get("$array", v.get("$bytes"))
                if not isinstance(ref, str) or ref not in arrays:
                    raise ValueError(f"reference to a missing array {ref!r:.40}")
                arr = arrays[ref]
                return arr.tobytes() if "$bytes" in v else np.array(arr)
            return {k: walk(x) for k, x in v.items()}
        return v

    return walk(packed)


def _to_bytes(kind: str, value: Mapping[str, Any]) -> bytes:
    meta, arrays = pack_value(value)
    return encode_checkpoint(Checkpoint(kind, meta, arrays))


def _from_bytes(kind: str, data: bytes) -> dict[str, Any]:
    ckpt = decode_checkpoint(data)
    ckpt.require(kind)
    value = unpack_value(ckpt.meta, ckpt.arrays)
    if not isinstance(value, dict):
        raise CheckpointFormatError(f"a {kind} holds no fields")
    return value


# ------------------------------------------------------------------------------------------ spec
@dataclass(frozen=True, eq=False)
class PartySpec:
    """A party before it starts, as plain values: enough to build an equal party anywhere.

    Attributes:
        kind: the party's kind (:data:`PARTY_KINDS`).
        party_id: its id.
        fields: the kind's constructor inputs and settings (plain values; private keys as raw bytes).
    """

    kind: str
    party_id: int
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # never the values: they hold private keys
        return f"PartySpec(kind={self.kind!r}, party_id={self.party_id}, fields={sorted(self.fields)})"

    def to_bytes(self) -> bytes:
        """The spec's bytes (no pickle; see the module docstring)."""
        return _to_bytes(SPEC_KIND, {"kind": self.kind, "party_id": self.party_id, "fields": self.fields})

    @classmethod
    def from_bytes(cls, data: bytes) -> PartySpec:
        """Inverse of :meth:`to_bytes` (a :class:`~fedgat.checkpoint.CheckpointError` for bad bytes)."""
        value = _from_bytes(SPEC_KIND, data)
        return cls(str(value["kind"]), int(value["party_id"]), value["fields"])

    def build(self) -> Party:
        """The party this spec describes (its class's ``from_spec``).

        Raises:
            TypeError: a kind that is not registered (:data:`PARTY_KINDS`).
        """
        party = party_class(self.kind).from_spec(self)
        if party.party_id != self.party_id:
            raise ValueError(f"the spec of party {self.party_id} built party {party.party_id}")
        return party


# ---------------------------------------------------------------------------------------- report
@dataclass(frozen=True, eq=False)
class PartyReport:
    """What a hosted party hands back when its run ends (no key material).

    Attributes:
        kind, party_id: as the party's :class:`PartySpec`.
        state: its state's value (``"done"``, ``"aborted"``, ...).
        abort_reason: :attr:`~fedgat.protocols.party.Party.abort_reason`.
        failure: :attr:`~fedgat.protocols.party.Party.failure` as :func:`error_to_value`, or None.
        timings, cpu_timings: seconds per phase.
        counters: the kind's counters (e.g. ``nodes_decrypted``).
        result: the kind's result (e.g. a pre-training client's decrypted encodings).
    """

    kind: str
    party_id: int
    state: str
    abort_reason: str | None = None
    failure: Mapping[str, Any] | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    cpu_timings: Mapping[str, float] = field(default_factory=dict)
    counters: Mapping[str, int] = field(default_factory=dict)
    result: Mapping[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return _to_bytes(REPORT_KIND, {name: getattr(self, name) for name in _REPORT_FIELDS})

    @classmethod
    def from_bytes(cls, data: bytes) -> PartyReport:
        value = _from_bytes(REPORT_KIND, data)
        return cls(**{name: value[name] for name in _REPORT_FIELDS})


_REPORT_FIELDS = tuple(PartyReport.__dataclass_fields__)


# ---------------------------------------------------------------------------------------- errors
def error_to_value(exc: BaseException) -> dict[str, Any]:
    """An exception as plain values: type, module, arguments, a fault's fields, notes, traceback.

    A refused message (a :class:`~fedgat.protocols.errors.ProtocolError`) travels without its
    traceback, whose chained causes may hold what the error's own text leaves out (a refused
    result's decrypted values: a fourteenth review pass), and without its local ``detail``; a
    training refusal keeps its round."""
    args = list(exc.args) if all(isinstance(a, (str, int, float)) for a in exc.args) else [str(exc)]
    fields: dict[str, Any] = {}
    if isinstance(exc, FaultError):
        fields = {"phase": exc.phase, "missing": list(exc.missing)}
        if isinstance(exc, QuorumError):
            fields.update(round=exc.round, answered=list(exc.answered), required=exc.required)
    elif isinstance(exc, protocol_errors.TrainingRefusedError):
        fields = {"round": exc.round}
    refused = isinstance(exc, protocol_errors.ProtocolError)
    return {
        "type": type(exc).__name__,
        "module": type(exc).__module__,
        "args": args,
        "fields": fields,
        "notes": [str(n) for n in getattr(exc, "__notes__", ())],
        "traceback": "" if refused or exc.__traceback__ is None else "".join(traceback.format_exception(exc)),
    }


def error_from_value(value: Mapping[str, Any], fallback: type[Exception] = RuntimeError) -> Exception:
    """The exception :func:`error_to_value` described: a protocol error or an allowed builtin as
    itself, anything else as ``fallback("Type: message")``. The remote traceback is not attached
    (see ``value["traceback"]``)."""
    name, module, args = value["type"], value["module"], list(value["args"])
    cls: Any = None
    if module == protocol_errors.__name__ and name in protocol_errors.__all__:
        cls = getattr(protocol_errors, name)
    elif module == "builtins" and name in _BUILTIN_ERRORS:
        cls = getattr(builtins, name)
    exc: Exception
    if cls is None:
        exc = fallback(f"{name}: {' '.join(str(a) for a in args)}")
    elif issubclass(cls, FaultError):
        fields = dict(value["fields"])
        exc = cls(*args[:1], **fields)
    elif cls is protocol_errors.ResultRejectedError:  # its text is constant; node and owners stay local
        exc = cls(-1, ())
    elif cls is protocol_errors.TrainingRefusedError:
        exc = cls(int(value["fields"].get("round", -1)))
    else:
        exc = cls(*args)
    for note in value.get("notes", ()):
        exc.add_note(note)
    return exc


# ------------------------------------------------------------------------------------- encodings
_FACTORS = ("R", "K2", "M2", "h_self")


def encodings_to_value(enc: Encodings) -> dict[str, Any]:
    """Decrypted (or training-ready: compacted, factorised) encodings as plain values, exactly:
    :func:`fedgat.checkpoint.encodings_to_checkpoint` plus each bucket's
    :class:`~fedgat.encodings.RowFactors` when set."""
    meta, arrays = encodings_to_checkpoint(enc, prefix="")
    factors = [
        None
        if b.factors is None
        else {
            **{k: getattr(b.factors, k).detach().cpu().contiguous().numpy().copy() for k in _FACTORS},
            "residual": float(b.factors.residual),
        }
        for b in enc.buckets
    ]
    return {"meta": meta, "arrays": arrays, "factors": factors}


def encodings_from_value(value: Mapping[str, Any]) -> Encodings:
    """Inverse of :func:`encodings_to_value`."""
    import torch

    from fedgat.encodings import RowFactors

    enc = encodings_from_checkpoint(value["meta"], value["arrays"], prefix="")
    for bucket, f in zip(enc.buckets, value["factors"], strict=True):
        if f is not None:
            R, K2, M2, h_self = (torch.from_numpy(np.array(f[k])) for k in _FACTORS)
            bucket.factors = RowFactors(R, K2, M2, h_self, float(f["residual"]))
    return enc
