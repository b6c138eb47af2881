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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedgat.crypto import SlotLayout
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
    "report_client",
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
