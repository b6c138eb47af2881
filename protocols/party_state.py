r"""Parties mid-run as values: a party at *any* point between two messages, saved and rebuilt exactly,
without pickle and authenticated under a key only the party holds.

A :class:`~fedgat.protocols.party_values.PartySpec` describes a party before its first message (what
an engine places). An engine that cannot keep a party in memory between messages -- Flower 1.41 runs
every message in a fresh ClientApp process (:mod:`fedgat.protocols.flower_state`) -- needs it in the
middle of the protocol instead: a :class:`PartyState` (:meth:`Party.state_value
<fedgat.protocols.party.Party.state_value>`, :meth:`PartyState.build`). It holds

* ``fields``: the spec's fields (roster, session, the kind's constructor inputs, the verifier's pins,
  the clock and armed deadlines, the frame limit) **without the long-term private key**:
  :meth:`PartyState.build` takes the party's :class:`~fedgat.protocols.roster.Identity` (its Ed25519
  key) from its owner (a key file, or a key store of its own), so a state store does not hold the
  key its authentication rests on;
* ``progress``: the protocol's progress, common to every kind (:func:`base_progress`: the machine's
  state, sequence number, the last sequence number seen per sender, abort reason, failure, timings)
  plus the kind's own (:data:`STATE_CODECS`): for a pre-training client its *per-session* secrets --
  its own CKKS secret context and HPKE private keys as bytes, the check keys it gave and was given --
  and what it was relayed (its peers' signed key announcements and claims as their frames, their
  public contexts), the participants and its releases, the slot layout, the upload batches left,
  partly received buckets (bases, owners and decrypted rows as arrays), decrypted encodings and
  counters (:mod:`fedgat.protocols.pretrain_values`); for a FedAvg client the current model,
  optimiser and random stream (its spec's fields), the last global weights, evaluated splits and
  round (:mod:`fedgat.protocols.training_values`).

A rebuilt party's :meth:`~fedgat.protocols.party.Party.snapshot` equals the original's and it goes on
exactly as the original would have (tested after every event of a run,
``tests/protocols/test_party_state.py``). Only the kinds of :data:`STATE_CODECS` have a state (all the
client kinds; servers are not hosted by an engine that restarts them per message); another class
raises :class:`TypeError`.

Bytes (:func:`seal`, :func:`unseal`, :meth:`PartyState.to_bytes`): the pickle-free checkpoint format
of :mod:`fedgat.checkpoint`, authenticated with **HMAC-SHA256** under a key derived from the party's
own long-term private key (:func:`state_key`: HKDF-SHA256 over its Ed25519 private key, with a
label naming the purpose and the party). The HMAC is checked over the whole blob before anything is
parsed; decoding runs no code (JSON and plain-dtype arrays; party classes from an allow-list). A blob
that does not verify raises :class:`StateAuthenticationError` (tampered, corrupted, or written under
another party's key); an authentic state of another kind, party, run or node
:class:`ForeignStateError`; anything else unusable :class:`SavedStateError` (their base class).

Confidentiality is not provided: a pre-training client's state holds its CKKS secret key, its HPKE
session keys, its check keys and decrypted encodings. Keep the store like a key store.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import importlib
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedgat.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointIntegrityError,
    decode_checkpoint,
    encode_checkpoint,
)

from .errors import FaultError, StateError
from .party_values import PartySpec, error_from_value, error_to_value, pack_value, party_class, unpack_value

if TYPE_CHECKING:
    from .party import Party
    from .roster import Identity

__all__ = [
    "STATE_CODECS",
    "STATE_KIND",
    "ForeignStateError",
    "PartyState",
    "SavedStateError",
    "StateAuthenticationError",
    "base_progress",
    "capture_state",
    "seal",
    "state_key",
    "unseal",
]

STATE_KIND = "fedgat.party.state"
#: salt of :func:`state_key` (changing it invalidates every saved state)
_KEY_SALT = b"fedgat.party-state.v2"  # v2: Ed25519 key only, pre-training without a dealer
_MIN_KEY = 16
_TAG = 32  # HMAC-SHA256

#: party kind -> module that describes such a party mid-run: ``state_fields(party)``,
#: ``state_progress(party)``, ``from_state_fields(cls, spec)`` and ``restore_progress(party, progress)``
STATE_CODECS: dict[str, str] = {
    "pretrain.client": "fedgat.protocols.pretrain_values",
    "rounds.client": "fedgat.protocols.training_values",
}


class SavedStateError(Exception):
    """Saved party state that cannot be used; nothing was restored."""


class StateAuthenticationError(SavedStateError):
    """The state's HMAC does not verify: tampered, corrupted, or written under another party's key."""


class ForeignStateError(SavedStateError):
    """An authentic state, but of another kind, party, run or node than the one restoring it."""


# ------------------------------------------------------------------------------------------ keys
def state_key(identity: Identity, label: str) -> bytes:
    """The 32-byte HMAC key of the states ``identity``'s party saves for ``label`` (e.g.
    ``"flower-client/3"``): HKDF-SHA256 over its 32-byte Ed25519 private key (uniformly random, the
    party's long-term secret), salt :data:`_KEY_SALT`, info ``"fedgat:" + label``. Nobody without
    that private key can compute it; the salt and label keep it apart from any other use of the key
    (the signatures use the key itself, never a derived one)."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=_KEY_SALT, info=f"fedgat:{label}".encode())
    return hkdf.derive(identity.signer.private_bytes())


def seal(kind: str, value: Mapping[str, Any], hmac_key: bytes) -> bytes:
    """``value`` (plain values, :func:`~fedgat.protocols.party_values.pack_value`) as checkpoint bytes
    of ``kind`` under HMAC-SHA256 with ``hmac_key``."""
    if not isinstance(hmac_key, bytes) or len(hmac_key) < _MIN_KEY:
        raise ValueError(f"a state is sealed under a key of at least {_MIN_KEY} bytes")
    meta, arrays = pack_value(value)
    return encode_checkpoint(Checkpoint(kind, {"value": meta}, arrays), hmac_key=hmac_key)


def unseal(kind: str, data: bytes, hmac_key: bytes) -> dict[str, Any]:
    """Inverse of :func:`seal`: the HMAC is verified over all the bytes before anything is parsed.

    Raises:
        StateAuthenticationError: the HMAC does not verify.
        ForeignStateError: an authentic blob of another kind.
        SavedStateError: anything else (not a checkpoint, another format version, bad manifest).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SavedStateError(f"saved state must be bytes, not {type(data).__name__}")
    data = bytes(data)
    # the checkpoint's trailer is the HMAC over everything before it: checked first, so that any
    # changed byte (the header's too) reads as what it is
    tag = hmac.new(hmac_key, data[:-_TAG], hashlib.sha256).digest()
    try:
        if len(data) <= _TAG or not hmac.compare_digest(tag, data[-_TAG:]):
            raise CheckpointIntegrityError("HMAC mismatch")
        ckpt = decode_checkpoint(data, hmac_key=hmac_key)
    except CheckpointIntegrityError as exc:
        raise StateAuthenticationError(
            f"the saved {kind} does not verify under this party's key: tampered, corrupted, "
            f"truncated, or written by another party ({exc})"
        ) from exc
    except CheckpointError as exc:
        raise SavedStateError(f"the saved {kind} cannot be read: {exc}") from exc
    if ckpt.kind != kind:
        raise ForeignStateError(f"saved state of kind {ckpt.kind!r}, expected {kind!r}")
    try:
        value = unpack_value(ckpt.meta["value"], ckpt.arrays)
    except (KeyError, ValueError) as exc:
        raise SavedStateError(f"the saved {kind} is malformed: {exc}") from exc
    if not isinstance(value, dict):
        raise SavedStateError(f"the saved {kind} holds no fields")
    return value


# ----------------------------------------------------------------------------------------- state
@dataclass(frozen=True, eq=False)
class PartyState:
    """A party between two messages, as plain values (see the module docstring).

    Attributes:
        kind, party_id: as the party's :class:`~fedgat.protocols.party_values.PartySpec`.
        fields: the spec's fields without the private keys.
        progress: the protocol's progress (:func:`base_progress` and the kind's).
    """

    kind: str
    party_id: int
    fields: Mapping[str, Any] = field(default_factory=dict)
    progress: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # never the values: they hold the CKKS secret key
        return (
            f"PartyState(kind={self.kind!r}, party_id={self.party_id}, "
            f"state={self.progress.get('state')!r}, fields={sorted(self.fields)})"
        )

    def to_value(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "party_id": self.party_id,
            "fields": self.fields,
            "progress": self.progress,
        }

    @classmethod
    def from_value(cls, value: Mapping[str, Any]) -> PartyState:
        try:
            return cls(str(value["kind"]), int(value["party_id"]), value["fields"], value["progress"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SavedStateError(f"not a party state's values: {exc}") from exc

    def to_bytes(self, hmac_key: bytes) -> bytes:
        """The state's bytes under HMAC-SHA256 with ``hmac_key`` (:func:`state_key`)."""
        return seal(STATE_KIND, self.to_value(), hmac_key)

    @classmethod
    def from_bytes(cls, data: bytes, hmac_key: bytes) -> PartyState:
        """Inverse of :meth:`to_bytes` (errors: :func:`unseal`)."""
        return cls.from_value(unseal(STATE_KIND, data, hmac_key))

    def build(self, identity: Identity) -> Party:
        """The party this state describes, with ``identity``'s private keys.

        Raises:
            TypeError: a kind without a state codec (:data:`STATE_CODECS`).
            ForeignStateError: ``identity`` is not the roster's key of this party.
        """
        from .roster import Roster

        codec = _codec(self.kind)
        cls = party_class(self.kind)
        roster = Roster.from_value(self.fields["roster"])
        if roster.signing_key(self.party_id) != identity.signer.public_bytes():
            raise ForeignStateError(f"the saved state of party {self.party_id} is not this identity's")
        spec = PartySpec(self.kind, self.party_id, {**self.fields, "identity": identity.to_value()})
        party = codec.from_state_fields(cls, spec)
        if party.party_id != self.party_id:
            raise ValueError(f"the state of party {self.party_id} built party {party.party_id}")
        _restore_base_progress(party, self.progress)
        codec.restore_progress(party, self.progress)
        return party


def _codec(kind: str) -> Any:
    module = STATE_CODECS.get(kind) if isinstance(kind, str) else None
    if module is None:
        raise TypeError(f"party kind {kind!r} has no mid-run state; kinds with one: {sorted(STATE_CODECS)}")
    return importlib.import_module(module)


def capture_state(party: Party) -> PartyState:
    """:meth:`Party.state_value <fedgat.protocols.party.Party.state_value>`.

    Raises:
        TypeError: a class that cannot be described, or a kind without a state codec.
        StateError: called while the party handles a message or runs a step.
    """
    kind = party._kind()
    codec = _codec(kind)
    if party._clock_stack:
        raise StateError(f"party {party.party_id} is inside a message; its state is taken between messages")
    fields = {k: v for k, v in party._spec_base().items() if k != "identity"}
    fields.update(codec.state_fields(party))
    progress = {**base_progress(party), **codec.state_progress(party)}
    return PartyState(kind, party.party_id, fields, progress)


def base_progress(party: Party) -> dict[str, Any]:
    """What every party's progress holds: machine state, sequence numbers, abort, failure, timings."""
    return {
        "state": party.state_name(),
        "seq": int(party._seq),
        "last_seq": {str(k): int(v) for k, v in party.verifier.last_seq().items()},
        "abort_reason": party.abort_reason,
        "failure": None if party.failure is None else error_to_value(party.failure),
        "timings": {str(k): float(v) for k, v in party.timings.items()},
        "cpu_timings": {str(k): float(v) for k, v in party.cpu_timings.items()},
    }


def _restore_base_progress(party: Party, progress: Mapping[str, Any]) -> None:
    state = progress["state"]
    party.state = type(party.state)(state) if isinstance(party.state, enum.Enum) else state
    party._seq = int(progress["seq"])
    party.verifier.restore_last_seq({int(k): int(v) for k, v in progress["last_seq"].items()})
    party.abort_reason = progress["abort_reason"]
    failure = None if progress["failure"] is None else error_from_value(progress["failure"])
    if failure is not None and not isinstance(failure, FaultError):
        raise SavedStateError(f"a saved failure must be a FaultError, not {type(failure).__name__}")
    party.failure = failure
    party.timings = defaultdict(float, {str(k): float(v) for k, v in progress["timings"].items()})
    party.cpu_timings = defaultdict(float, {str(k): float(v) for k, v in progress["cpu_timings"].items()})
