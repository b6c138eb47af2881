"""Checkpoints: atomic, integrity-checked, pickle-free files of JSON metadata and numpy arrays.

A checkpoint is one file::

    offset  size  field
    0       8     magic b"FGCKPT\\0\\n"
    8       4     format version (u32 big-endian, :data:`FORMAT_VERSION`)
    12      8     manifest length M (u64 big-endian)
    20      M     manifest: UTF-8 JSON {"kind", "mac", "meta", "arrays": [{"name", "dtype", "shape",
                  "offset", "nbytes"}]}
    20+M    P     the arrays' raw bytes, little-endian, C order, in manifest order
    20+M+P  32    SHA-256 over bytes [0, 20+M+P) -- or HMAC-SHA256 with a key (``mac`` says which)

With a key and a ``binding`` (:class:`CheckpointStore` binds every file to its party and label),
the HMAC key is derived from the key and the binding (:func:`bound_key`), so a file verifies only
where it was written: copied to another label or party (e.g. an old checkpoint replayed in place
of a newer one) it is refused with :class:`CheckpointIntegrityError`. The kind is in the
authenticated manifest (checked by ``kind=``).

:func:`save_checkpoint` writes a temporary file in the target's directory, fsyncs it and renames it
over the target (:func:`os.replace`), then fsyncs the directory: a crash leaves either the old or
the new checkpoint, never a torn one. :func:`load_checkpoint` verifies the digest (or HMAC) over
the whole file *before* parsing the manifest, then checks every array entry (allowed dtype, shape,
offsets inside the payload, no gaps or overlaps); a truncated, corrupted or tampered file raises a
:class:`CheckpointError` subclass and nothing is loaded. Arrays are rebuilt with
:func:`numpy.frombuffer` from plain dtypes -- no pickle, no object arrays, no code execution.

Torch tensors travel through numpy (:func:`tensors_to_arrays`, :func:`arrays_to_tensors`);
optimiser state through :func:`optimizer_to_checkpoint` / :func:`optimizer_from_checkpoint`;
decrypted FedGAT encodings through :func:`encodings_to_checkpoint` / :func:`encodings_from_checkpoint`,
and a whole run's (client id -> encodings, one file) through :func:`save_encodings` / :func:`load_encodings`.
:class:`CheckpointStore` keeps the last few labelled checkpoints of each party in a directory.

Confidentiality is **not** provided: a client's checkpoint holds its decrypted encodings (which
reveal neighbours' features, see ``SECURITY.md``); store it like the raw data. The HMAC key, when
given, authenticates the file against tampering by someone who can write the directory.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "ENCODINGS_KIND",
    "FORMAT_VERSION",
    "MAGIC",
    "Checkpoint",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointIntegrityError",
    "CheckpointMismatchError",
    "CheckpointStore",
    "SavedEncodings",
    "arrays_to_tensors",
    "bound_key",
    "encodings_from_checkpoint",
    "encodings_to_checkpoint",
    "load_checkpoint",
    "load_encodings",
    "optimizer_from_checkpoint",
    "optimizer_to_checkpoint",
    "read_encodings",
    "save_checkpoint",
    "save_encodings",
    "tensors_to_arrays",
]

MAGIC = b"FGCKPT\0\n"
FORMAT_VERSION = 1
_HEAD = struct.Struct(">8sIQ")
_DIGEST = 32
#: dtypes a checkpoint may hold (plain numbers and bools only: nothing that could carry objects)
ALLOWED_DTYPES = frozenset(
    {
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    }
)
#: largest manifest accepted (the JSON is parsed only after the digest matched)
MAX_MANIFEST_BYTES = 64 << 20
_NAME = re.compile(r"^[A-Za-z0-9_.:/\-]{1,256}$")
_BINDING_DOMAIN = b"fedgat-checkpoint-binding-v1\0"


class CheckpointError(Exception):
    """Base class: the checkpoint cannot be used (nothing was loaded)."""


class CheckpointFormatError(CheckpointError):
    """Not a checkpoint, another format version, truncated, or an inconsistent manifest."""


class CheckpointIntegrityError(CheckpointError):
    """The SHA-256 digest or HMAC does not match the content (corrupted or tampered)."""


class CheckpointMismatchError(CheckpointError):
    """A valid checkpoint of another kind, party, session or model than the one restoring it."""


@dataclass
class Checkpoint:
    """What a checkpoint holds: a ``kind`` tag, JSON-able ``meta`` and named numpy ``arrays``."""

    kind: str
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def require(self, kind: str, **expected: Any) -> None:
        """Raise :class:`CheckpointMismatchError` unless the kind and the given meta values match."""
        if self.kind != kind:
            raise CheckpointMismatchError(f"checkpoint of kind {self.kind!r}, expected {kind!r}")
        for key, want in expected.items():
            if self.meta.get(key) != want:
                raise CheckpointMismatchError(f"checkpoint {key}={self.meta.get(key)!r}, expected {want!r}")


# ------------------------------------------------------------------------------------ file format
def bound_key(hmac_key: bytes, binding: Mapping[str, Any] | None) -> bytes:
    """The HMAC key of a checkpoint bound to ``binding`` (JSON-able values, e.g. ``{"party": 3,
    "label": 7}``): HMAC-SHA256 of the canonical JSON of the binding under ``hmac_key``.
    ``binding=None``: ``hmac_key`` itself (unbound, as before)."""
    if binding is None:
        return hmac_key
    text = json.dumps(dict(binding), sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    return hmac.new(hmac_key, _BINDING_DOMAIN + text, hashlib.sha256).digest()


def _mac_name(hmac_key: bytes | None, binding: Mapping[str, Any] | None) -> str:
    if hmac_key is None:
        return "sha256"
    return "hmac-sha256" if binding is None else "hmac-sha256-bound"


def _mac(data: bytes | memoryview, key: bytes | None) -> bytes:
    if key is None:
        return hashlib.sha256(data).digest()
    return hmac.new(key, data, hashlib.sha256).digest()


def _plain_array(name: str, arr: Any) -> np.ndarray:
    a = np.asarray(arr)
    if a.dtype.name not in ALLOWED_DTYPES:
        raise TypeError(f"array {name!r} has dtype {a.dtype}; checkpoints hold plain numeric arrays only")
    return a.astype(a.dtype.newbyteorder("<"), order="C", copy=False)


def encode_checkpoint(
    ckpt: Checkpoint, hmac_key: bytes | None = None, *, binding: Mapping[str, Any] | None = None
) -> bytes:
    """The bytes of ``ckpt`` in the format of the module docstring. ``binding`` (with a key only):
    where the file belongs, e.g. ``{"party": 3, "label": 7}``; it must be given again to decode."""
    if binding is not None and hmac_key is None:
        raise ValueError("a checkpoint binding needs an HMAC key (a SHA-256 digest binds nothing)")
    entries: list[dict] = []
    views: list[memoryview] = []
    offset = 0
    for name, arr in ckpt.arrays.items():
        if not _NAME.match(name):
            raise ValueError(f"array name {name!r} is not allowed")
        a = _plain_array(name, arr)
        view = a.data.cast("B") if a.size else memoryview(b"")  # C order: the bytes of tobytes()
        entries.append(
            {
                "name": name,
                "dtype": a.dtype.name,
                "shape": list(a.shape),
                "offset": offset,
                "nbytes": view.nbytes,
            }
        )
        views.append(view)
        offset += view.nbytes
    manifest = {"kind": ckpt.kind, "mac": _mac_name(hmac_key, binding), "meta": ckpt.meta, "arrays": entries}
    text = json.dumps(manifest, allow_nan=True, separators=(",", ":")).encode()
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, len(text))
    # the digest over the parts and one join of them: the arrays are copied once (a training client's
    # spec, hundreds of MB, was copied three times: 0.45 against 0.77 GB/s)
    key = None if hmac_key is None else bound_key(hmac_key, binding)
    mac = hashlib.sha256() if key is None else hmac.new(key, digestmod=hashlib.sha256)
    parts: list[bytes | memoryview] = [head, text, *views]
    for part in parts:
        mac.update(part)
    return b"".join([*parts, mac.digest()])


def decode_checkpoint(
    data: bytes, hmac_key: bytes | None = None, *, binding: Mapping[str, Any] | None = None
) -> Checkpoint:
    """Verify and parse checkpoint bytes (see :func:`load_checkpoint`); ``binding``: the one it
    was encoded with (a file bound elsewhere raises :class:`CheckpointIntegrityError`)."""
    if binding is not None and hmac_key is None:
        raise ValueError("a checkpoint binding needs an HMAC key (a SHA-256 digest binds nothing)")
    view = memoryview(data)
    if len(view) < _HEAD.size + _DIGEST:
        raise CheckpointFormatError(f"{len(view)} bytes is too short for a checkpoint")
    magic, version, mlen = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise CheckpointFormatError("bad magic: not a fedgat checkpoint")
    if version != FORMAT_VERSION:
        raise CheckpointFormatError(
            f"checkpoint format version {version}; this reader knows {FORMAT_VERSION}"
        )
    if mlen > MAX_MANIFEST_BYTES or _HEAD.size + mlen + _DIGEST > len(view):
        raise CheckpointFormatError(f"manifest of {mlen} bytes does not fit the file (truncated?)")
    body, digest = view[:-_DIGEST], bytes(view[-_DIGEST:])
    if not hmac.compare_digest(
        _mac(body, None if hmac_key is None else bound_key(hmac_key, binding)), digest
    ):
        raise CheckpointIntegrityError(
            "checkpoint digest does not match its content "
            "(corrupted, truncated, tampered, another HMAC key"
            + (f", or written for another place than {dict(binding)!r})" if binding is not None else ")")
        )
    try:
        manifest = json.loads(bytes(view[_HEAD.size : _HEAD.size + mlen]).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, nesting or an integer too long
        raise CheckpointFormatError(f"unreadable manifest: {type(exc).__name__}: {exc}") from None
    payload = body[_HEAD.size + mlen :]
    expected_mac = _mac_name(hmac_key, binding)
    return Checkpoint(*_parse_manifest(manifest, expected_mac), arrays=_arrays(manifest["arrays"], payload))


def _parse_manifest(manifest: Any, expected_mac: str) -> tuple[str, dict]:
    if not isinstance(manifest, dict) or not {"kind", "mac", "meta", "arrays"} <= set(manifest):
        raise CheckpointFormatError("manifest lacks kind, mac, meta or arrays")
    if manifest["mac"] != expected_mac:
        raise CheckpointIntegrityError(
            f"checkpoint authenticated with {manifest['mac']!r}, expected {expected_mac!r}"
        )
    if (
        not isinstance(manifest["kind"], str)
        or not isinstance(manifest["meta"], dict)
        or not isinstance(manifest["arrays"], list)
    ):
        raise CheckpointFormatError("manifest fields have the wrong types")
    return manifest["kind"], manifest["meta"]


def _arrays(entries: list, payload: memoryview) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    offset = 0
    for entry in entries:
        try:
            name, dtype, shape = entry["name"], entry["dtype"], tuple(entry["shape"])
            start, nbytes = entry["offset"], entry["nbytes"]
        except (KeyError, TypeError) as exc:
            raise CheckpointFormatError(f"bad array entry {entry!r:.100}") from exc
        if not isinstance(name, str) or not _NAME.match(name) or name in out:
            raise CheckpointFormatError(f"bad or duplicate array name {name!r:.80}")
        if dtype not in ALLOWED_DTYPES:
            raise CheckpointFormatError(f"array {name!r}: dtype {dtype!r} is not allowed")
        if len(shape) > 32 or not all(type(d) is int and 0 <= d <= 1 << 40 for d in shape):
            raise CheckpointFormatError(f"array {name!r}: bad shape {shape!r:.80}")
        if type(start) is not int or type(nbytes) is not int:
            raise CheckpointFormatError(f"array {name!r}: offset and size must be integers")
        dt = np.dtype(dtype).newbyteorder("<")
        if start != offset or nbytes != math.prod(shape) * dt.itemsize or start + nbytes > len(payload):
            raise CheckpointFormatError(f"array {name!r}: offset/size do not match the payload")
        out[name] = np.frombuffer(payload[start : start + nbytes], dtype=dt).reshape(shape).copy()
        offset += nbytes
    if offset != len(payload):
        raise CheckpointFormatError(f"{len(payload) - offset} payload bytes belong to no array")
    return out


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(
    path: str | Path,
    ckpt: Checkpoint,
    *,
    hmac_key: bytes | None = None,
    binding: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``ckpt`` to ``path`` atomically: temporary file in the same directory, fsync,
    :func:`os.replace`, fsync of the directory. Returns the path. ``binding``: see
    :func:`encode_checkpoint`.

    Raises:
        TypeError: an array of a non-numeric dtype; ValueError: a bad array name or non-JSON meta.
    """
    path = Path(path)
    data = encode_checkpoint(ckpt, hmac_key, binding=binding)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def load_checkpoint(
    path: str | Path,
    *,
    hmac_key: bytes | None = None,
    kind: str | None = None,
    max_bytes: int = 1 << 34,
    binding: Mapping[str, Any] | None = None,
) -> Checkpoint:
    """Read and verify a checkpoint written by :func:`save_checkpoint`.

    Args:
        hmac_key: the key it was written with (None: plain SHA-256).
        kind: when given, the checkpoint's kind must equal it.
        max_bytes: refuse larger files before reading them.
        binding: the binding it was written with (with ``hmac_key`` only).

    Raises:
        CheckpointFormatError: missing file, bad magic or version, truncation, inconsistent manifest.
        CheckpointIntegrityError: digest or HMAC mismatch (corruption, tampering, another binding).
        CheckpointMismatchError: another ``kind``.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise CheckpointFormatError(f"cannot read checkpoint {path}: {exc}") from exc
    if size > max_bytes:
        raise CheckpointFormatError(f"checkpoint of {size} bytes exceeds the limit {max_bytes}")
    ckpt = decode_checkpoint(path.read_bytes(), hmac_key, binding=binding)
    if kind is not None:
        ckpt.require(kind)
    return ckpt


# ------------------------------------------------------------------------------------ torch helpers
def tensors_to_arrays(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, np.ndarray]:
    """``{prefix + name: numpy copy}`` of CPU tensors (exact: same dtype)."""
    return {f"{prefix}{name}": t.detach().cpu().contiguous().numpy().copy() for name, t in tensors.items()}


def arrays_to_tensors(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[str, torch.Tensor]:
    """Inverse of :func:`tensors_to_arrays`: the arrays under ``prefix``, in stored order."""
    return {
        name[len(prefix) :]: torch.from_numpy(np.array(a))
        for name, a in arrays.items()
        if name.startswith(prefix)
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, torch.Tensor):
        raise TypeError("tensors in optimiser hyper-parameters are not supported")
    return value


def optimizer_to_checkpoint(opt: torch.optim.Optimizer, prefix: str = "opt/") -> tuple[dict, dict]:
    """An optimiser's ``state_dict`` as (JSON meta, arrays): per-parameter state tensors become arrays,
    the hyper-parameter groups JSON (tuples as lists)."""
    sd = opt.state_dict()
    arrays: dict[str, np.ndarray] = {}
    slots: dict[str, dict[str, Any]] = {}
    for idx, state in sd["state"].items():
        slots[str(idx)] = {}
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                arrays[f"{prefix}{idx}/{key}"] = value.detach().cpu().contiguous().numpy().copy()
                slots[str(idx)][key] = "tensor"
            else:
                slots[str(idx)][key] = {"value": value}
    groups = [{k: _jsonable(v) for k, v in g.items()} for g in sd["param_groups"]]
    return {"groups": groups, "slots": slots}, arrays


def optimizer_from_checkpoint(
    opt: torch.optim.Optimizer, meta: dict, arrays: Mapping[str, np.ndarray], prefix: str = "opt/"
) -> None:
    """Load what :func:`optimizer_to_checkpoint` saved into ``opt`` (built over the same parameters)."""
    current = opt.state_dict()["param_groups"]
    if len(current) != len(meta["groups"]):
        raise CheckpointMismatchError("the optimiser has another number of parameter groups")
    groups = []
    for now, saved in zip(current, meta["groups"]):
        if len(now["params"]) != len(saved["params"]):
            raise CheckpointMismatchError("a parameter group has another number of parameters")
        groups.append({k: tuple(v) if isinstance(now.get(k), tuple) else v for k, v in saved.items()})
    state: dict[int, dict] = {}
    for idx, slots in meta["slots"].items():
        state[int(idx)] = {
            key: (
                torch.from_numpy(np.array(arrays[f"{prefix}{idx}/{key}"]))
                if kind == "tensor"
                else kind["value"]
            )
            for key, kind in slots.items()
        }
    opt.load_state_dict({"state": state, "param_groups": groups})


# --------------------------------------------------------------------------------- encodings
def encodings_to_checkpoint(enc: Any, prefix: str = "enc/") -> tuple[dict, dict[str, np.ndarray]]:
    """Decrypted :class:`fedgat.encodings.Encodings` as (JSON meta, arrays), exactly."""
    arrays = {f"{prefix}nodes": np.asarray(enc.nodes)}
    buckets = []
    for i, b in enumerate(enc.buckets):
        bb = b.bases
        parts = {
            "rows": bb.rows,
            "nodes": bb.nodes,
            "neighbours": bb.neighbours,
            "p": bb.p,
            "q": bb.q,
            "h_self": b.h_self,
            "K2": b.K2,
            "M2": b.M2,
            "cols": b.cols,
        }
        present = sorted(k for k, v in parts.items() if v is not None)
        for key in present:
            value = parts[key]
            arrays[f"{prefix}{i}/{key}"] = (
                value.detach().cpu().contiguous().numpy().copy()
                if isinstance(value, torch.Tensor)
                else np.asarray(value)
            )
        buckets.append(present)
    return {"variant": enc.variant, "buckets": buckets}, arrays


def encodings_from_checkpoint(
    meta: dict, arrays: Mapping[str, np.ndarray], prefix: str = "enc/", *, copy: bool = True
) -> Any:
    """Inverse of :func:`encodings_to_checkpoint`; ``copy=False`` takes ``arrays`` as they are (the
    caller's to give away, e.g. :func:`decode_checkpoint`'s own copies)."""
    from fedgat.encodings import BucketBases, EncodingBucket, Encodings

    def get(i: int, key: str, tensor: bool = False) -> Any:
        name = f"{prefix}{i}/{key}"
        if key not in meta["buckets"][i]:
            return None
        try:
            value = np.array(arrays[name]) if copy else arrays[name]
        except KeyError as exc:
            raise CheckpointFormatError(f"encodings checkpoint lacks {name}") from exc
        return torch.from_numpy(value) if tensor else value

    buckets = []
    for i in range(len(meta["buckets"])):
        bases = BucketBases(
            meta["variant"], get(i, "rows"), get(i, "nodes"), get(i, "neighbours"), get(i, "p"), get(i, "q")
        )
        buckets.append(
            EncodingBucket(
                bases, get(i, "h_self", True), get(i, "K2", True), get(i, "M2", True), get(i, "cols", True)
            )
        )
    return Encodings(meta["variant"], np.array(arrays[f"{prefix}nodes"]), buckets)


#: the kind of a file of :func:`save_encodings`
ENCODINGS_KIND = "fedgat.client_encodings"


@dataclass(frozen=True)
class SavedEncodings:
    """What :func:`read_encodings` gives back: ``encodings`` (client id ->
    :class:`~fedgat.encodings.Encodings`) and ``info``, the JSON values the writer stored beside them
    (``fedgat demo --save-encodings``: the settings its partition was made with)."""

    encodings: dict[int, Any]
    info: dict[str, Any]


def save_encodings(
    path: str | Path,
    encodings: Mapping[int, Any],
    *,
    info: Mapping[str, Any] | None = None,
    hmac_key: bytes | None = None,
) -> Path:
    """Write a run's decrypted encodings, client id -> :class:`~fedgat.encodings.Encodings`, to one
    checkpoint file (atomic, digest-checked, no pickle), so that training can start from them later
    without another encrypted round: ``load_encodings(path)`` gives them back exactly, for
    :func:`fedgat.pipeline.train_fedgat` with the same graph and partition (it refuses another's).

    ``encodings`` is e.g. ``pre.encodings`` of :func:`fedgat.pipeline.run_encrypted_pretraining` or
    :func:`~fedgat.pipeline.run_plaintext_pretraining`'s result. Their dtype is kept; a bucket's
    :class:`~fedgat.encodings.RowFactors` (a training cache, :meth:`~fedgat.encodings.Encodings.factorise`)
    are not written. ``info``: JSON values kept beside them (:func:`read_encodings` returns them), e.g.
    how the partition was made. ``hmac_key``: authenticate the file with HMAC-SHA256 instead of
    SHA-256, so that only a holder of the key can write a file that loads.

    The file holds what the clients decrypted, which reveals their neighbours' features
    (``SECURITY.md``): keep it where the clients' raw data may be kept.

    Raises:
        TypeError: not a mapping of non-negative int client ids to :class:`~fedgat.encodings.Encodings`,
            or ``info`` not a mapping.
        ValueError: ``info`` holds values JSON cannot write.
    """
    from fedgat.encodings import Encodings

    if info is not None and not isinstance(info, Mapping):
        raise TypeError(f"info must be a mapping of JSON values, got {type(info).__name__}")
    try:
        json.dumps(dict(info or {}), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"info must hold JSON values only: {exc}") from None

    if not isinstance(encodings, Mapping):
        hint = " (a run's .encodings)" if hasattr(encodings, "encodings") else ""
        raise TypeError(f"encodings must map client id -> Encodings{hint}, got {type(encodings).__name__}")
    layouts, arrays = {}, {}
    for c, enc in sorted(encodings.items()):
        if isinstance(c, bool) or not isinstance(c, int | np.integer) or c < 0:
            raise TypeError(f"client ids must be ints >= 0, got {c!r}")
        if not isinstance(enc, Encodings):
            raise TypeError(f"client {c}: expected Encodings, got {type(enc).__name__}")
        layouts[str(int(c))], part = encodings_to_checkpoint(enc.to("cpu"), prefix=f"c{int(c)}/")
        arrays.update(part)
    meta = {"clients": [int(c) for c in sorted(encodings)], "layouts": layouts, "info": dict(info or {})}
    return save_checkpoint(path, Checkpoint(ENCODINGS_KIND, meta, arrays), hmac_key=hmac_key)


def load_encodings(
    path: str | Path, *, hmac_key: bytes | None = None, max_bytes: int = 1 << 35
) -> dict[int, Any]:
    """The client id -> :class:`~fedgat.encodings.Encodings` mapping :func:`save_encodings` wrote
    (:func:`read_encodings`' ``encodings``; it raises the same errors)."""
    return read_encodings(path, hmac_key=hmac_key, max_bytes=max_bytes).encodings


def read_encodings(
    path: str | Path, *, hmac_key: bytes | None = None, max_bytes: int = 1 << 35
) -> SavedEncodings:
    """The encodings :func:`save_encodings` wrote, on the CPU, each checked
    (:meth:`~fedgat.encodings.Encodings.check_layout`, and one feature width across clients) before any
    is returned, with their ``info``. ``max_bytes``: refuse a larger file before reading it (default
    32 GiB; ogbn-arxiv-sized runs keep ~11 GiB). Reading takes about twice the file's size at its peak
    (its bytes, then the arrays).

    Raises:
        CheckpointFormatError: no such file, not a checkpoint, truncated, or encodings whose layout
            does not hold (the message says what).
        CheckpointIntegrityError: the digest (or, with ``hmac_key``, the HMAC) does not match.
        CheckpointMismatchError: a checkpoint of another kind.
    """
    ckpt = load_checkpoint(path, hmac_key=hmac_key, kind=ENCODINGS_KIND, max_bytes=max_bytes)
    out = {}
    try:
        clients, layouts, info = ckpt.meta["clients"], ckpt.meta["layouts"], ckpt.meta.get("info", {})
        if (
            not isinstance(clients, list)
            or not isinstance(layouts, dict)
            or not isinstance(info, dict)
            or len(set(map(str, clients))) != len(clients)
        ):
            raise ValueError("its client list, layouts or info are malformed")
        for c in clients:
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise ValueError(f"client id {c!r} is not an int >= 0")
            enc = encodings_from_checkpoint(layouts[str(c)], ckpt.arrays, prefix=f"c{c}/", copy=False)
            enc.check_layout()
            out[c] = enc
        widths = {b.h_self.shape[-1] for e in out.values() for b in e.buckets}
        if len(widths) > 1:
            raise ValueError(f"its clients' encodings have different feature widths {sorted(widths)}")
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise CheckpointFormatError(
            f"{path} holds no usable encodings: {type(exc).__name__}: {exc}"
        ) from None
    return SavedEncodings(out, info)


# ------------------------------------------------------------------------------------ store
class CheckpointStore:
    """Labelled checkpoints of several parties in one directory: ``party-<id>/<label:012d>.ckpt``.

    Each party keeps its ``keep`` most recent labels (older ones are removed after a new one is
    safely in place). Labels are non-negative integers (for FedAvg: the round a party resumes at).

    Args:
        directory: where the files live (created on first save).
        hmac_key: authenticate every file with HMAC-SHA256 under this key (None: SHA-256 only),
            bound to its party and label (:func:`bound_key`): a file copied to another label or
            party -- e.g. an old checkpoint replayed as the latest -- fails with
            :class:`CheckpointIntegrityError`. Deleting the newer files (rolling back to an older
            label) is *not* detected: that needs state kept outside the directory.
        keep: checkpoints kept per party, ``>= 2`` so a consistent cut one label back exists.
    """

    def __init__(self, directory: str | Path, *, hmac_key: bytes | None = None, keep: int = 3) -> None:
        if keep < 2:
            raise ValueError("keep at least 2 checkpoints per party")
        self.directory = Path(directory)
        self.hmac_key = hmac_key
        self.keep = keep

    def path(self, party: int, label: int) -> Path:
        return self.directory / f"party-{int(party)}" / f"{int(label):012d}.ckpt"

    def save(self, party: int, label: int, ckpt: Checkpoint) -> Path:
        """Write atomically, then prune labels beyond ``keep``."""
        path = save_checkpoint(
            self.path(party, label), ckpt, hmac_key=self.hmac_key, binding=self._binding(party, label)
        )
        for old in self.labels(party)[: -self.keep]:
            self.path(party, old).unlink(missing_ok=True)
        return path

    def _binding(self, party: int, label: int) -> dict[str, int] | None:
        return None if self.hmac_key is None else {"party": int(party), "label": int(label)}

    def labels(self, party: int) -> list[int]:
        """Labels present for ``party``, ascending (temporary files are ignored)."""
        folder = self.directory / f"party-{int(party)}"
        if not folder.is_dir():
            return []
        return sorted(int(p.stem) for p in folder.glob("*.ckpt") if p.stem.isdigit())

    def load(self, party: int, label: int | None = None, kind: str | None = None) -> Checkpoint:
        """The checkpoint of ``party`` at ``label`` (None: the latest); verified (see
        :func:`load_checkpoint`)."""
        if label is None:
            labels = self.labels(party)
            if not labels:
                raise CheckpointFormatError(f"no checkpoint of party {party} in {self.directory}")
            label = labels[-1]
        return load_checkpoint(
            self.path(party, label), hmac_key=self.hmac_key, kind=kind, binding=self._binding(party, label)
        )
