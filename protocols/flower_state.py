"""What a Flower ClientApp keeps between messages, and the files the Flower engine writes.

Flower 1.41 runs every message in a fresh ``flwr-clientapp`` process, so a party cannot stay in
memory: after each message the client's state -- a :class:`ClientStore`: its party id, run and node,
the roster, the message counter, and its party mid-run as a
:class:`~fedgat.protocols.party_state.PartyState` (its own CKKS secret context and session keys as
bytes, what the server relayed to it, decrypted encodings, model and optimiser as arrays) -- is saved
as **values, never pickled**: the pickle-free checkpoint format of :mod:`fedgat.checkpoint`,
authenticated with HMAC-SHA256 under a key derived from the client's own private key
(:func:`~fedgat.protocols.party_state.state_key`, label
``flower-client/<party id>``). It goes into ``Context.state``, which the SuperNode keeps locally, or
into a 0600 file under the node config's ``state-dir`` with its SHA-256 in ``Context.state`` (so a
file rolled back to an older authentic state is refused too). :func:`load_client` verifies the HMAC
before it parses anything, checks that the state is this party's, run's and node's, and rebuilds the
party exactly; a state that does not verify raises
:class:`~fedgat.protocols.party_state.StateAuthenticationError`, another party's, run's or node's
:class:`~fedgat.protocols.party_state.ForeignStateError`, a state in the old pickled format (or any
other unusable one) :class:`~fedgat.protocols.party_state.SavedStateError`: nothing is unpickled.

The client's long-term private key is not in the saved state. With the node config's ``identity``
(a key file, :func:`~fedgat.protocols.flower_roster.read_identity`) it stays in that file, and
whoever can write ``Context.state`` or ``state-dir`` but cannot read the key file can neither forge
nor alter the state. Without one (local runs, tests) the ClientApp generates a key on its first
message and keeps it in ``Context.state`` (SHA-256 only: there is nothing to key an HMAC with), so
the HMAC then guards against corruption and swapped state, not against a writer of the SuperNode's
database. The state holds the client's CKKS secret key and decrypted encodings either way: protect
the SuperNode's database (``--database``) and ``state-dir`` like a key store.

Files: a client's decrypted encodings (:func:`save_encodings`, :func:`load_encodings`) and the
server's models (:func:`save_arrays`), as ``.npz``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedgat.checkpoint import Checkpoint, CheckpointError, decode_checkpoint, encode_checkpoint
from fedgat.encodings import BucketBases, EncodingBucket, Encodings

from .flower_config import FLOWER_HINT, FlowerUnavailableError
from .flower_roster import read_identity
from .party import Party
from .party_state import (
    ForeignStateError,
    PartyState,
    SavedStateError,
    StateAuthenticationError,
    seal,
    state_key,
    unseal,
)
from .party_values import pack_value, unpack_value
from .roster import Identity, Roster

try:
    from flwr.app import ConfigRecord, Context
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise FlowerUnavailableError(f"{FLOWER_HINT} ({_exc})") from _exc

__all__ = [
    "CLIENT_STATE_KIND",
    "FORMAT",
    "STATE",
    "ClientStore",
    "load_client",
    "load_encodings",
    "save_arrays",
    "save_client",
    "save_encodings",
]

#: the ConfigRecord of ``Context.state`` that holds (or points to) the client state
STATE = "fedgat.state"
#: what that record says it holds (a record without it is of the old, pickled format: refused; /2 is
#: the format of the pre-training with a dealer, whose states are refused as well)
FORMAT = "fedgat.flower.client-state/3"
#: the checkpoint kind of a saved :class:`ClientStore`
CLIENT_STATE_KIND = "fedgat.flower.client"
_IDENTITY_KIND = "fedgat.flower.identity"


# ====================================================================================== client state
@dataclass
class ClientStore:
    """What a ClientApp keeps between messages.

    Attributes:
        party_id: the SuperNode's ``partition-id``.
        identity: the client's long-term private key (from the node config's key file, or
            generated and kept in ``Context.state``; never inside the authenticated state).
        roster: the roster of the last phase set up (None before one).
        party: the phase's party, mid-run (None before a phase is set up).
        messages: protocol messages handled (seeds torch per message).
        exported: the decrypted encodings were written to the output directory.
        phases: the phases set up in this run, in order ("pretrain", "rounds"): each at most once
            (:func:`fedgat.protocols.flower_client._set_up`).
    """

    party_id: int
    identity: Identity
    roster: Roster | None = None
    party: Party | None = None
    messages: int = 0
    exported: bool = False
    phases: tuple[str, ...] = ()

    def __repr__(self) -> str:  # never the keys
        state = None if self.party is None else self.party.state_name()
        return f"ClientStore(party_id={self.party_id}, party={state!r}, messages={self.messages})"


def _label(party_id: int) -> str:
    return f"flower-client/{int(party_id)}"


def _state_file(context: Context) -> Path | None:
    directory = context.node_config.get("state-dir")
    if not directory:
        return None
    return Path(str(directory)) / f"fedgat-run{context.run_id}-node{context.node_id}.state"


def _write_private(path: Path, data: bytes) -> None:
    """``data`` into ``path`` atomically, mode 0600 (directory created 0700)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _generated_identity(rec: Any, party_id: int) -> Identity | None:
    """The identity a ClientApp generated on an earlier message (kept in ``Context.state``)."""
    blob = None if rec is None else rec.get("identity")
    if blob is None:
        return None
    try:
        ckpt = decode_checkpoint(bytes(blob))
        ckpt.require(_IDENTITY_KIND)
        value = unpack_value(ckpt.meta, ckpt.arrays)
        if int(value["party"]) != party_id:
            raise ForeignStateError(f"the kept identity is party {value['party']}'s, not {party_id}'s")
        return Identity.from_value(value["identity"])
    except (CheckpointError, KeyError, TypeError, ValueError) as exc:
        raise SavedStateError(f"the kept client identity cannot be read: {exc}") from exc


def _identity_blob(identity: Identity, party_id: int) -> bytes:
    meta, arrays = pack_value({"party": party_id, "identity": identity.to_value()})
    return encode_checkpoint(Checkpoint(_IDENTITY_KIND, meta, arrays))


def load_client(context: Context, party_id: int) -> ClientStore:
    """The client state :func:`save_client` kept in ``context`` (a fresh one, with the node config's
    identity or new keys, before the first message).

    Raises:
        StateAuthenticationError: the state does not verify under this client's key (tampered,
            corrupted, another client's), or a ``state-dir`` file does not match its digest (altered
            or rolled back).
        ForeignStateError: an authentic state of another party, run or node.
        SavedStateError: a state in the old pickled format, or otherwise unusable.
    """
    rec = context.state.config_records.get(STATE)
    if rec is not None and rec.get("format") != FORMAT:
        raise SavedStateError(
            f"the SuperNode holds client state of another format ({rec.get('format', 'pickled')!r}); "
            f"this version reads {FORMAT!r} only and never unpickles: start a new run"
        )
    path = context.node_config.get("identity")
    identity = read_identity(str(path)) if path else _generated_identity(rec, party_id)
    if rec is None:  # the first message
        return ClientStore(party_id, identity if identity is not None else Identity.generate())
    if identity is None:
        raise SavedStateError("client state without the identity it was saved under")
    blob = _read_blob(context, rec)
    value = unseal(CLIENT_STATE_KIND, blob, state_key(identity, _label(party_id)))
    where = {"party": party_id, "run": int(context.run_id), "node": int(context.node_id)}
    saved = {k: value.get(k) for k in where}
    if saved != where:
        raise ForeignStateError(f"the saved client state is of {saved}, not {where}")
    store = ClientStore(
        party_id,
        identity,
        roster=None if value["roster"] is None else Roster.from_value(value["roster"]),
        messages=int(value["messages"]),
        exported=bool(value["exported"]),
        phases=tuple(str(p) for p in value.get("phases", ())),
    )
    if value["party_state"] is not None:
        state = PartyState.from_value(value["party_state"])
        if state.party_id != party_id:
            raise ForeignStateError(f"the saved party is party {state.party_id}, not {party_id}")
        store.party = state.build(identity)
    return store


def _read_blob(context: Context, rec: Any) -> bytes:
    if rec.get("inline", True):
        blob = rec.get("blob")
        if not isinstance(blob, bytes):
            raise SavedStateError("the saved client state has no bytes")
        return blob
    path = _state_file(context)
    if path is None:
        raise SavedStateError("the client state was saved under state-dir, which the node config lacks now")
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise SavedStateError(f"cannot read the client state {path}: {exc}") from exc
    digest = rec.get("sha256")
    if not isinstance(digest, bytes) or not hmac.compare_digest(hashlib.sha256(blob).digest(), digest):
        raise StateAuthenticationError(
            f"{path} does not match the digest the SuperNode kept (altered, or rolled back to an older state)"
        )
    return blob


def save_client(context: Context, store: ClientStore) -> None:
    """Save ``store`` (see the module docstring) into ``context.state``, or a 0600 file under the node
    config's ``state-dir`` with its SHA-256 in ``context.state``."""
    party = store.party
    value = {
        "party": int(store.party_id),  # whose, where: checked on load
        "run": int(context.run_id),
        "node": int(context.node_id),
        "roster": None if store.roster is None else store.roster.to_value(),
        "messages": int(store.messages),
        "exported": bool(store.exported),
        "phases": list(store.phases),
        "party_state": None if party is None else party.state_value().to_value(),
    }
    blob = seal(CLIENT_STATE_KIND, value, state_key(store.identity, _label(store.party_id)))
    fields: dict[str, Any] = {"format": FORMAT}
    if not context.node_config.get("identity"):
        fields["identity"] = _identity_blob(store.identity, store.party_id)
    path = _state_file(context)
    if path is not None:
        _write_private(path, blob)
        fields.update(inline=False, sha256=hashlib.sha256(blob).digest())
    else:
        fields.update(inline=True, blob=blob)
    context.state[STATE] = ConfigRecord(fields)


# ============================================================================================= files
def save_arrays(path: str | Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``arrays`` as an uncompressed ``.npz`` (:func:`numpy.savez`), one entry per key."""
    clash = {"file", "allow_pickle"} & set(arrays)  # numpy.savez's own keyword arguments
    if clash:
        raise ValueError(f"array names {sorted(clash)} clash with numpy.savez's arguments")
    named: dict[str, Any] = dict(arrays)
    np.savez(path, **named)


def save_encodings(path: str | Path, enc: Encodings) -> None:
    """A client's decrypted encodings as ``.npz`` (kept on the client's machine)."""
    arrays: dict[str, np.ndarray] = {
        "variant": np.array(enc.variant),
        "nodes": enc.nodes,
        "buckets": np.array(len(enc.buckets)),
    }
    for i, b in enumerate(enc.buckets):
        bb = b.bases
        fields = {
            "rows": bb.rows,
            "bnodes": bb.nodes,
            "neighbours": bb.neighbours,
            "p": bb.p,
            "q": bb.q,
            "h_self": b.h_self,
            "K2": b.K2,
            "M2": b.M2,
            "cols": b.cols,
        }
        for name, value in fields.items():
            if value is not None:
                arrays[f"{i}.{name}"] = value.numpy() if isinstance(value, torch.Tensor) else value
    save_arrays(path, arrays)


def load_encodings(path: str | Path) -> Encodings:
    """Read :func:`save_encodings`' file back.

    Raises:
        ValueError: a bucket lacks one of its required arrays.
    """
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    variant = str(data["variant"])

    def optional(i: int, name: str) -> np.ndarray | None:
        return data.get(f"{i}.{name}")

    def required(i: int, name: str) -> np.ndarray:
        value = optional(i, name)
        if value is None:
            raise ValueError(f"{path}: bucket {i} has no {name!r} array")
        return value

    def tensor(value: np.ndarray | None) -> torch.Tensor | None:
        return None if value is None else torch.from_numpy(value)

    buckets = []
    for i in range(int(data["buckets"])):
        bases = BucketBases(
            variant,
            required(i, "rows"),
            required(i, "bnodes"),
            required(i, "neighbours"),
            required(i, "p"),
            optional(i, "q"),
        )
        buckets.append(
            EncodingBucket(
                bases,
                torch.from_numpy(required(i, "h_self")),
                torch.from_numpy(required(i, "K2")),
                tensor(optional(i, "M2")),
                tensor(optional(i, "cols")),
            )
        )
    return Encodings(variant, data["nodes"], buckets)
