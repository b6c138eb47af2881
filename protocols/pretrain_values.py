"""Pre-training clients as values (:mod:`fedgat.protocols.party_values`): what a
:class:`~fedgat.protocols.pretrain_client.ClientPretrain` ships, reports and saves mid-run.

Spec (before :meth:`~fedgat.protocols.party.Party.start`): the roster, session and long-term private
key (Ed25519 signer), the :class:`~fedgat.protocols.pretrain_config.PretrainConfig` (with its
:class:`~fedgat.dp.FeatureDP`), deadlines and limits as their dataclass fields, the owned nodes, their
validated feature rows and -- with DP -- the release drawn at construction (so the rebuilt client
uploads the very same release, never a fresh draw), the neighbourhoods (CSR), the cross-client edges
and their owners (what it claims), the ``needed`` nodes, the encodings' dtype and the upload batch.
The per-session keys do not exist yet: the client generates them at ``start()``.

Report: state, abort reason, failure and timings (every party), the counters ``ciphertexts_decrypted``
and ``nodes_decrypted``, and the result: the decrypted encodings
(:func:`~fedgat.protocols.party_values.encodings_to_value`, exact), the fingerprint of the round's key
set (:func:`~fedgat.protocols.messages.keyset_fingerprint`), the fingerprint of the client's own CKKS
key (public: it hashes the public context), the participants and the slot layout --
never a secret (the CKKS secret context, HPKE keys and check keys stay where the client ran:
``holder`` stays None in the caller's copy).

Mid-run state (:mod:`fedgat.protocols.party_state`, any point between messages): the spec's fields
(without the long-term key) and the progress --

* the client's own per-session secrets: its CKKS secret context as serialised bytes with its
  fingerprint and encryption mode (reloaded with
  :meth:`~fedgat.crypto.KeyHolderContext.from_secret_bytes`, which checks the fingerprint), its HPKE
  private keys (:meth:`~fedgat.protocols.pretrain_keys.SessionKeys.private_bytes`), the check keys it
  gave every owner and those every recipient gave it (:meth:`~fedgat.crypto.tags.CheckKeys.to_bytes`);
* what the server relayed: every peer's :class:`~fedgat.protocols.messages.KeyAnnounce`,
  :class:`~fedgat.protocols.messages.EdgeClaims` and
  :class:`~fedgat.protocols.messages.NeighbourhoodStatement` as the signed frame it arrived in
  (decoded again on restore: the very same messages), every peer's public CKKS context as its canonical bytes
  (reloaded with :meth:`~fedgat.crypto.ServerContext.from_bytes` and checked against the fingerprint
  the peer announced);
* the round: the participants, the releases (recipient -> node ids), the slot layout, the upload
  batches left and the ciphertexts uploaded, the buckets received so far (bases, owners, decrypted
  rows and which are filled), the nodes assigned, the encoding budget used, whether the DP terms were
  confirmed, the decrypted encodings, a refused result still to be raised at the end of the results
  (its node, owners and local detail) and the counters.

Every mapping is saved as a list of pairs in its insertion order, so a restored client iterates as
the original did. A client restored after any message goes on exactly as the original
(``tests/protocols/test_party_state.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from fedgat.crypto import DEFAULT_WIRE, KeyHolderContext, ServerContext, SlotLayout
from fedgat.crypto.tags import CheckKeys
from fedgat.dp import FeatureDP

from .errors import ResultRejectedError, StateError
from .frame import Message, decode_message
from .messages import EdgeClaims, KeyAnnounce, NeighbourhoodStatement
from .party_values import PartyReport, PartySpec, encodings_from_value, encodings_to_value
from .pretrain_config import PretrainConfig, PretrainLimits, PretrainTimeouts
from .pretrain_keys import SessionKeys
from .roster import Identity, Roster

if TYPE_CHECKING:
    from .pretrain_client import ClientPretrain

__all__ = [
    "DTYPES",
    "absorb_client",
    "client_from_spec",
    "client_spec_fields",
    "config_from_value",
    "config_to_value",
    "from_state_fields",
    "report_client",
    "restore_progress",
    "state_fields",
    "state_progress",
]

M = TypeVar("M", bound=Message)

#: dtypes a client's decrypted encodings may have, by name
DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def config_to_value(config: PretrainConfig) -> dict[str, Any]:
    """The session's parameters (DP terms included) as plain values."""
    return {
        "session": config.session,
        "variant": config.variant,
        "preset": config.preset,
        "chunks": config.chunks,
        "embed_factor": config.embed_factor,
        "dp": None if config.dp is None else dataclasses.asdict(config.dp),
        "wire": config.wire,
        "upload_window": config.upload_window,
    }


def config_from_value(value: Mapping[str, Any]) -> PretrainConfig:
    dp = value["dp"]
    return PretrainConfig(
        session=int(value["session"]),
        variant=str(value["variant"]),
        preset=str(value["preset"]),
        chunks=None if value["chunks"] is None else int(value["chunks"]),
        embed_factor=int(value["embed_factor"]),
        dp=None if dp is None else FeatureDP(**dp),
        wire=str(value.get("wire", DEFAULT_WIRE)),  # values saved before the option: the compact wire
        upload_window=None if value.get("upload_window") is None else int(value["upload_window"]),
    )


def client_spec_fields(client: ClientPretrain) -> dict[str, Any]:
    """The constructor inputs of a client that has not started (see the module docstring)."""
    from .pretrain_client import ClientState

    if client.state is not ClientState.NEW:
        raise StateError(f"client {client.party_id} has started; a spec describes it before start()")
    return state_fields(client)


def state_fields(client: ClientPretrain) -> dict[str, Any]:
    """The constructor inputs of a client at any point (a spec's, and a mid-run state's, fields)."""
    g = client._graph
    dtype = str(client.dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise TypeError(f"client {client.party_id}'s encodings dtype {client.dtype} has no value")
    return {
        "config": config_to_value(client.config),
        "owned": np.asarray(client.owned),
        "features": np.asarray(client._features),
        "release": None if client._release is None else np.asarray(client._release),
        "indptr": np.asarray(g.indptr),
        "indices": np.asarray(g.indices),
        "cross": np.asarray(client.local.cross),
        "cross_owner": np.asarray(client.local.cross_owner),
        "needed": np.asarray(client.needed),
        "dtype": dtype,
        "upload_batch": client.upload_batch,
        "encrypt_workers": client.encrypt_workers,
        "timeouts": dataclasses.asdict(client.timeouts),
        "limits": dataclasses.asdict(client.limits),
    }


def client_from_spec(cls: type[ClientPretrain], spec: PartySpec) -> ClientPretrain:
    """The client (of class ``cls``) that :func:`client_spec_fields` described."""
    f = spec.fields
    client = cls(
        spec.party_id,
        Roster.from_value(f["roster"]),
        config_from_value(f["config"]),
        Identity.from_value(f["identity"]),
        owned=f["owned"],
        features=f["features"],
        indptr=f["indptr"],
        indices=f["indices"],
        cross=f["cross"],
        cross_owner=f["cross_owner"],
        needed=f["needed"],
        dtype=DTYPES[f["dtype"]],
        upload_batch=int(f["upload_batch"]),
        encrypt_workers=int(f.get("encrypt_workers", 0)),  # states saved before it: in process
        timeouts=PretrainTimeouts(**f["timeouts"]),
        limits=PretrainLimits(**f["limits"]),
        release=f["release"],
    )
    client._restore_spec_base(f)
    return client


def report_client(client: ClientPretrain) -> tuple[dict[str, int], dict[str, Any]]:
    """``(counters, result)`` of a client's report (see the module docstring)."""
    layout = client.layout
    counters = {
        "ciphertexts_decrypted": int(client.ciphertexts_decrypted),
        "nodes_decrypted": int(client.nodes_decrypted),
    }
    result = {
        "encodings": None if client.encodings is None else encodings_to_value(client.encodings),
        "fingerprint": client.verifier.fingerprint,
        "key": client.key_fingerprint,
        "participants": [int(p) for p in client.participants],
        "layout": None if layout is None else [layout.d, layout.slots, layout.chunks],
    }
    return counters, result


def absorb_client(client: ClientPretrain, report: PartyReport) -> None:
    """Take in what :func:`report_client` reported."""
    client.ciphertexts_decrypted = int(report.counters["ciphertexts_decrypted"])
    client.nodes_decrypted = int(report.counters["nodes_decrypted"])
    enc, layout = report.result["encodings"], report.result["layout"]
    client.encodings = None if enc is None else encodings_from_value(enc)
    client.verifier.fingerprint = report.result["fingerprint"]
    key = report.result.get("key")  # absent from reports of an older client
    client._reported_key = None if key is None else bytes(key)
    client.participants = [int(p) for p in report.result["participants"]]
    client.layout = None if layout is None else SlotLayout(*(int(x) for x in layout))


# ------------------------------------------------------------------------------------ mid-run state
def from_state_fields(cls: type[ClientPretrain], spec: PartySpec) -> ClientPretrain:
    """The client as constructed from a mid-run state's fields (its progress follows)."""
    return client_from_spec(cls, spec)


def _tensor_to_value(t: torch.Tensor) -> dict[str, Any]:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits, exactly
        return {"dtype": "bfloat16", "data": t.view(torch.int16).numpy().copy()}
    return {"dtype": str(t.dtype).removeprefix("torch."), "data": t.numpy().copy()}


def _tensor_from_value(value: Mapping[str, Any]) -> torch.Tensor:
    data = torch.from_numpy(np.array(value["data"]))
    out = data.view(torch.bfloat16) if value["dtype"] == "bfloat16" else data
    if out.dtype != DTYPES.get(str(value["dtype"]), out.dtype):
        raise ValueError(f"a saved tensor of dtype {value['dtype']} holds {out.dtype}")
    return out


def _frame(msg: Message) -> bytes:
    """The signed frame a received message was decoded from."""
    if msg.signed_bytes is None or msg.signature is None:
        raise StateError(f"a relayed {msg.type_name} without its signed frame cannot be saved")
    return bytes(msg.signed_bytes) + bytes(msg.signature)


def _unframe(data: bytes, cls: type[M]) -> M:
    msg = decode_message(bytes(data))
    if isinstance(msg, cls):
        return msg
    raise ValueError(f"a saved {cls.__name__} frame holds a {msg.type_name}")


def state_progress(client: ClientPretrain) -> dict[str, Any]:
    """The client's progress (see the module docstring)."""
    holder, layout, keys = client.holder, client.layout, client._session_keys
    return {
        "holder": None
        if holder is None
        else {
            "secret": holder.secret_context_bytes(),
            "fingerprint": holder.fingerprint(),
            "symmetric": bool(holder.symmetric_encryption),
        },
        "session_keys": None if keys is None else keys.private_bytes(),
        "layout": None if layout is None else [layout.d, layout.slots, layout.chunks],
        "peers": [_frame(m) for m in client._peers.values()],
        "contexts": [[int(p), ctx.public_context_bytes()] for p, ctx in client._peer_contexts.items()],
        "claims": [_frame(m) for m in client._claims.values()],
        "statements": [_frame(m) for m in client._statements.values()],
        "participants": [int(p) for p in client.participants],
        "releases": [[int(r), np.asarray(nodes, dtype=np.int64)] for r, nodes in client.releases.items()],
        "owner_keys": [[int(p), k.to_bytes()] for p, k in client._owner_keys.items()],
        "my_keys": [[int(p), k.to_bytes()] for p, k in client._my_keys.items()],
        "queue": [[int(r), int(start)] for r, start in client._queue],
        "granted": sorted(int(r) for r in client._granted),
        "uploaded": int(client._uploaded),
        "encoding_bytes": int(client._encoding_bytes),
        "terms_confirmed": bool(client._terms_confirmed),
        "assemblies": [
            {
                "variant": a.bases.variant,
                "rows": np.asarray(a.bases.rows),
                "nodes": np.asarray(a.bases.nodes),
                "neighbours": np.asarray(a.bases.neighbours),
                "p": np.asarray(a.bases.p),
                "q": None if a.bases.q is None else np.asarray(a.bases.q),
                "owners": np.asarray(a.owners, dtype=np.int64),
                "buffer": _tensor_to_value(a.rows),
                "received": np.array(sorted(a.received), dtype=np.int64).reshape(-1, 2),
            }
            for a in client._assemblies
        ],
        "assigned": np.array(sorted(client._assigned), dtype=np.int64),
        "encodings": None if client.encodings is None else encodings_to_value(client.encodings),
        "refusal": None
        if client._refusal is None
        else {
            "node": int(client._refusal.node),
            "owners": [int(o) for o in client._refusal.owners],
            "detail": str(client._refusal.detail),
        },
        "ciphertexts_decrypted": int(client.ciphertexts_decrypted),
        "nodes_decrypted": int(client.nodes_decrypted),
    }


def restore_progress(client: ClientPretrain, progress: Mapping[str, Any]) -> None:
    """Set what :func:`state_progress` saved on a client built from the same state's fields.

    Raises:
        ValueError: saved values that do not fit together (a peer's context that is not the one it
            announced, a frame of another type, a bucket of another dtype).
    """
    from fedgat.encodings import BucketBases

    from .pretrain_client import _Assembly, foreign_owner_counts

    preset = client.config.preset
    h = progress["holder"]
    client.holder = (
        None
        if h is None
        else KeyHolderContext.from_secret_bytes(
            h["secret"],
            expected_fingerprint=h["fingerprint"],
            presets=[preset],
            symmetric_encryption=bool(h["symmetric"]),
            wire=client.config.wire,
        )
    )
    keys = progress["session_keys"]
    client._session_keys = None if keys is None else SessionKeys.from_private_bytes(keys)
    layout = progress["layout"]
    client.layout = None if layout is None else SlotLayout(*(int(x) for x in layout))
    peers = [_unframe(f, KeyAnnounce) for f in progress["peers"]]
    client._peers = {int(m.party): m for m in peers}
    contexts: dict[int, ServerContext] = {}
    for p, data in progress["contexts"]:
        ctx = ServerContext.from_bytes(data, presets=[preset], wire=client.config.wire)
        announced = client._peers.get(int(p))
        if announced is None or ctx.fingerprint() != announced.context_fingerprint:
            raise ValueError(f"the saved context of party {p} is not the one it announced")
        contexts[int(p)] = ctx
    client._peer_contexts = contexts
    claims = [_unframe(f, EdgeClaims) for f in progress["claims"]]
    client._claims = {(int(m.claimer), int(m.peer)): m for m in claims}
    client._claims_cache = None  # derived again from the claims and participants when needed
    statements = [_unframe(f, NeighbourhoodStatement) for f in progress.get("statements", ())]
    client._statements = {int(m.owner): m for m in statements}
    client.participants = [int(p) for p in progress["participants"]]
    client.releases = {int(r): np.asarray(nodes, dtype=np.int64) for r, nodes in progress["releases"]}
    client._owner_keys = {int(p): CheckKeys.from_bytes(k) for p, k in progress["owner_keys"]}
    client._my_keys = {int(p): CheckKeys.from_bytes(k) for p, k in progress["my_keys"]}
    client._queue = [(int(r), int(start)) for r, start in progress["queue"]]
    client._granted = {int(r) for r in progress.get("granted", ())}  # states saved before the window: none
    client._uploaded = int(progress["uploaded"])
    client._encoding_bytes = int(progress["encoding_bytes"])
    client._terms_confirmed = bool(progress["terms_confirmed"])
    assemblies = []
    for a in progress["assemblies"]:
        bases = BucketBases(a["variant"], a["rows"], a["nodes"], a["neighbours"], a["p"], a["q"])
        rows = _tensor_from_value(a["buffer"])
        if rows.dtype != client.dtype:
            raise ValueError(f"a saved bucket of dtype {rows.dtype} for a client of {client.dtype}")
        owners = np.asarray(a["owners"], dtype=np.int64)
        if owners.shape != bases.neighbours.shape:
            raise ValueError(
                f"a saved bucket's owners have shape {owners.shape}, not {bases.neighbours.shape}"
            )
        nodes = [int(n) for n in bases.nodes]
        received = np.asarray(a["received"], dtype=np.int64).reshape(-1, 2)
        slots, got = received[:, 0], received[:, 1]
        if len(received) and (
            slots.min() < 0
            or slots.max() >= len(nodes)
            or not np.all((owners[slots] == got[:, None]).any(axis=1))
            or np.any(got == client.party_id)
            or len(np.unique(received, axis=0)) != len(received)
        ):
            raise ValueError("a saved bucket's received partials name a node or owner outside it")
        remaining = foreign_owner_counts(owners, client.party_id) - np.bincount(slots, minlength=len(nodes))
        assemblies.append(
            _Assembly(
                bases,
                owners,
                rows,
                remaining,
                {n: i for i, n in enumerate(nodes)},
                {(int(k), int(o)) for k, o in received},
            )
        )
    client._assemblies = assemblies
    client._assigned = {int(n) for n in progress["assigned"]}
    enc = progress["encodings"]
    client.encodings = None if enc is None else encodings_from_value(enc)
    refusal = progress.get("refusal")  # absent from states saved before refusals waited for the end
    client._refusal = (
        None
        if refusal is None
        else ResultRejectedError(
            int(refusal["node"]), tuple(int(o) for o in refusal["owners"]), detail=str(refusal["detail"])
        )
    )
    client.ciphertexts_decrypted = int(progress["ciphertexts_decrypted"])
    client.nodes_decrypted = int(progress["nodes_decrypted"])
    # the received buckets' nodes still waiting, plus those already complete
    client.nodes_to_decrypt = client.nodes_decrypted + sum(int((a.remaining > 0).sum()) for a in assemblies)
