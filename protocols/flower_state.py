"""What a Flower ClientApp keeps between messages, and the files the Flower engine writes.

Flower 1.41 runs every message in a fresh ``flwr-clientapp`` process, so a party cannot stay in
memory: after each message the client's state (its parties with their keys, CKKS secret context,
decrypted encodings, model and optimiser) is pickled into ``Context.state``, which the SuperNode
keeps locally, or into a file under the node config's ``state-dir`` (:func:`save_state`,
:func:`load_state`). Keys and CKKS contexts are pickled as their private bytes. Pickle is only ever
read back from that local state, checked against its SHA-256, never from the network. The state
holds the party's private keys and the CKKS secret key: protect the SuperNode's database
(``--database``) and ``state-dir`` like any key store.

Files: a client's decrypted encodings (:func:`save_encodings`, :func:`load_encodings`) and the
server's models (:func:`save_arrays`), as ``.npz``.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedgat.crypto import KeyHolderContext, SigningIdentity, WrappingIdentity
from fedgat.encodings import BucketBases, EncodingBucket, Encodings

from .flower_config import FLOWER_HINT, FlowerUnavailableError, RemotePartyError

try:
    from flwr.app import ConfigRecord, Context
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise FlowerUnavailableError(f"{FLOWER_HINT} ({_exc})") from _exc

__all__ = ["STATE", "load_encodings", "load_state", "save_arrays", "save_encodings", "save_state"]

#: the ConfigRecord of ``Context.state`` that holds (or points to) the pickled client state
STATE = "fedgat.state"


# ====================================================================================== client state
class _StatePickler(pickle.Pickler):
    """Pickles parties; keys and CKKS contexts as their private bytes (local state only)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, SigningIdentity):
            return SigningIdentity.from_private_bytes, (obj.private_bytes(),)
        if isinstance(obj, WrappingIdentity):
            return WrappingIdentity.from_private_bytes, (obj.private_bytes(),)
        if isinstance(obj, KeyHolderContext):
            return _restore_holder, (obj.secret_context_bytes(), obj.fingerprint(), obj.symmetric_encryption)
        return NotImplemented


def _restore_holder(data: bytes, fingerprint: bytes, symmetric: bool) -> KeyHolderContext:
    return KeyHolderContext.from_secret_bytes(
        data, expected_fingerprint=fingerprint, symmetric_encryption=symmetric
    )


def _dumps(state: dict) -> bytes:
    buf = io.BytesIO()
    _StatePickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    return buf.getvalue()


def _state_file(context: Context) -> Path | None:
    directory = context.node_config.get("state-dir")
    if not directory:
        return None
    return Path(str(directory)) / f"fedgat-run{context.run_id}-node{context.node_id}.pkl"


def _record_bytes(record: ConfigRecord, key: str) -> bytes:
    value = record.get(key)
    if not isinstance(value, bytes):
        raise RemotePartyError(f"the saved client state has no {key!r} bytes")
    return value


def load_state(context: Context) -> dict:
    """The client state :func:`save_state` kept in ``context`` (empty before the first message).

    Raises:
        RemotePartyError: the state does not match its digest.
    """
    rec = context.state.config_records.get(STATE)
    if rec is None:
        return {}
    digest = _record_bytes(rec, "sha256")
    path = _state_file(context)
    blob = (
        path.read_bytes() if path is not None and not rec.get("inline", True) else _record_bytes(rec, "blob")
    )
    if hashlib.sha256(blob).digest() != digest:
        raise RemotePartyError("the saved client state does not match its digest")
    return pickle.loads(blob)


def save_state(context: Context, state: dict) -> None:
    """Pickle ``state`` into ``context.state`` (or a 0600 file under the node config's ``state-dir``,
    with its digest in ``context.state``)."""
    blob = _dumps(state)
    digest = hashlib.sha256(blob).digest()
    path = _state_file(context)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        tmp.replace(path)
        context.state[STATE] = ConfigRecord({"sha256": digest, "inline": False})
    else:
        context.state[STATE] = ConfigRecord({"sha256": digest, "inline": True, "blob": blob})


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
