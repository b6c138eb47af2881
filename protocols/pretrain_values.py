"""Pre-training clients as values (:mod:`fedgat.protocols.party_values`): what a
:class:`~fedgat.protocols.pretrain_client.ClientPretrain` (and the dealer,
:class:`~fedgat.protocols.pretrain_keys.DealerSide`) ships and reports.

Spec (before :meth:`~fedgat.protocols.party.Party.start`): the roster, session and private keys (Ed25519
signer, X25519 wrapping key), the :class:`~fedgat.protocols.pretrain_config.PretrainConfig` (with its
:class:`~fedgat.dp.FeatureDP`), deadlines and limits as their dataclass fields, the owned nodes, their
validated feature rows and -- with DP -- the release drawn at construction (so the rebuilt client
uploads the very same release, never a fresh draw), the neighbourhoods (CSR), the ``needed`` nodes,
the encodings' dtype and the upload batch.

Report: state, abort reason, failure and timings (every party), the counters ``ciphertexts_decrypted``
and ``nodes_decrypted``, and the result: the decrypted encodings
(:func:`~fedgat.protocols.party_values.encodings_to_value`, exact), the session key's fingerprint and
the slot layout -- never the CKKS secret context (``holder`` stays None in the caller's copy). The
dealer adds the clients it wrapped the key for.

Mid-run state (:mod:`fedgat.protocols.party_state`, any point between messages): the spec's fields
(without the private keys) and the progress -- the CKKS secret context as its serialised bytes with
its fingerprint and encryption mode (reloaded with
:meth:`~fedgat.crypto.KeyHolderContext.from_secret_bytes`, which checks the fingerprint), the slot
layout, the upload position and ciphertext count, the buckets received so far (their bases, decrypted
rows and which are filled), the nodes assigned, the encoding budget used, whether the DP terms were
confirmed, the decrypted encodings and the counters; the dealer adds the clients it wrapped the key
for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedgat.crypto import KeyHolderContext, SlotLayout
from fedgat.dp import FeatureDP

from .errors import StateError
from .party_values import PartyReport, PartySpec, encodings_from_value, encodings_to_value
from .pretrain_config import PretrainConfig, PretrainLimits, PretrainTimeouts
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
        "needed": np.asarray(client.needed),
        "dtype": dtype,
        "upload_batch": client.upload_batch,
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
        needed=f["needed"],
        dtype=DTYPES[f["dtype"]],
        upload_batch=int(f["upload_batch"]),
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


def state_progress(client: ClientPretrain) -> dict[str, Any]:
    """The client's progress (see the module docstring)."""
    holder, layout = client.holder, client.layout
    progress: dict[str, Any] = {
        "holder": None
        if holder is None
        else {
            "secret": holder.secret_context_bytes(),
            "fingerprint": holder.fingerprint(),
            "symmetric": bool(holder.symmetric_encryption),
        },
        "layout": None if layout is None else [layout.d, layout.slots, layout.chunks],
        "next_upload": int(client._next_upload),
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
                "buffer": _tensor_to_value(a.rows),
                "filled": np.asarray(a.filled, dtype=bool),
            }
            for a in client._assemblies
        ],
        "assigned": np.array(sorted(client._assigned), dtype=np.int64),
        "encodings": None if client.encodings is None else encodings_to_value(client.encodings),
        "ciphertexts_decrypted": int(client.ciphertexts_decrypted),
        "nodes_decrypted": int(client.nodes_decrypted),
    }
    from .pretrain_keys import DealerSide

    if isinstance(client, DealerSide):
        progress["wrapped_for"] = sorted(int(p) for p in client._wrapped_for)
    return progress


def restore_progress(client: ClientPretrain, progress: Mapping[str, Any]) -> None:
    """Set what :func:`state_progress` saved on a client built from the same state's fields."""
    from fedgat.encodings import BucketBases

    from .pretrain_client import _Assembly
    from .pretrain_keys import DealerSide

    h = progress["holder"]
    client.holder = (
        None
        if h is None
        else KeyHolderContext.from_secret_bytes(
            h["secret"],
            expected_fingerprint=h["fingerprint"],
            presets=[client.config.preset],
            symmetric_encryption=bool(h["symmetric"]),
        )
    )
    layout = progress["layout"]
    client.layout = None if layout is None else SlotLayout(*(int(x) for x in layout))
    client._next_upload = int(progress["next_upload"])
    client._uploaded = int(progress["uploaded"])
    client._encoding_bytes = int(progress["encoding_bytes"])
    client._terms_confirmed = bool(progress["terms_confirmed"])
    assemblies = []
    for a in progress["assemblies"]:
        bases = BucketBases(a["variant"], a["rows"], a["nodes"], a["neighbours"], a["p"], a["q"])
        rows = _tensor_from_value(a["buffer"])
        if rows.dtype != client.dtype:
            raise ValueError(f"a saved bucket of dtype {rows.dtype} for a client of {client.dtype}")
        nodes = [int(n) for n in bases.nodes]
        assemblies.append(
            _Assembly(bases, rows, np.asarray(a["filled"], dtype=bool), {n: i for i, n in enumerate(nodes)})
        )
    client._assemblies = assemblies
    client._assigned = {int(n) for n in progress["assigned"]}
    enc = progress["encodings"]
    client.encodings = None if enc is None else encodings_from_value(enc)
    client.ciphertexts_decrypted = int(progress["ciphertexts_decrypted"])
    client.nodes_decrypted = int(progress["nodes_decrypted"])
    if isinstance(client, DealerSide):
        client._wrapped_for = {int(p) for p in progress["wrapped_for"]}
