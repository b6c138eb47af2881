r"""Typed, versioned, signed messages and their framed binary encoding (no pickle anywhere).

Frame (all integers big-endian)::

    offset  size  field
    0       4     magic b"FGAT"
    4       1     version (14)
    5       2     message type id (table below)
    7       4     sender party id
    11      4     recipient party id
    15      8     session id (one pre-training + FedAvg run; rounds are payload fields)
    23      8     sequence number (per sender, strictly increasing, starts at 1)
    31      32    CKKS key fingerprint the message is bound to (32 zero bytes before a key exists)
    63      4     payload length L
    67      L     payload (the message's fields, :mod:`fedgat.protocols.codec`)
    67+L    64    Ed25519 signature of the sender over b"FGAT-frame-sha256-tree\0" + SHA-256 of
                  bytes [0, 67+L) without each ciphertext's bytes before the SHA-256 ending it

Every ``ct`` (below) is an envelope that ends with its own SHA-256
(:func:`fedgat.crypto.packing.envelope_body`): the signature covers it through that digest and its
length, so a ciphertext is hashed once at its maker and once at its receiver, not a second time for
the frame (:attr:`fedgat.protocols.frame.Message.signed_digest`; version 7 to 13 hashed every byte).
A ``ct`` is 1 KiB to 4 MiB.

:func:`decode_message` checks, in this order and before allocating anything of the declared size:
length of the header, magic (:class:`FrameError`), version (:class:`VersionError`), type
(:class:`UnknownTypeError`), ``L`` against the type's payload limit (:class:`SizeLimitError`), that the
frame is exactly ``67 + L + 64`` bytes (:class:`FrameError`), then parses the payload field by field
(every field with its own limit; each ``ct`` against the SHA-256 that ends it,
:class:`SignatureError` otherwise) and runs the type's value checks (:class:`PayloadError`,
:class:`KeyFingerprintError`). It does **not** check the signature, the recipient, the session or the
sequence number: that needs the roster and the receiver's state, see
:class:`fedgat.protocols.roster.Verifier`.

Message types (limits are on the payload; ``ct`` = one enveloped CKKS ciphertext,
:func:`fedgat.crypto.serialize`, at most 4 MiB):

==  ===================  ==========================  ================================================  ========
id  type                 direction                   fields                                            limit
==  ===================  ==========================  ================================================  ========
1   KeyAnnounce          client -> server -> every   party, hpke (1216 B), ed25519 (32 B),             2 KiB
                         other client                context_fingerprint, binding_signature (64 B)
2   PublicContext        client -> server -> every   party, preset, wire, context (<= 8 MiB),          8 MiB+1K
                         other client                context_fingerprint
3   SealedCheckKeys      client -> server -> owners  recipient_party, owners, sealed (HPKE, one per    8 MiB
                                                     owner), keys_signature (64 B)
4   GraphAnnounce        client -> server            dim, owned (int64), indptr (int64), indices       ~320 MiB
                                                     (int64): owned nodes' neighbour lists, self first
5   FeatureUpload        client -> server            target, items: <= 4096 x (node u32, chunk u16,    64 MiB
                                                     ct under the target's key)
6   UploadDone           client -> server            nodes, ciphertexts                                64 B
7   EncodingBases        server -> client            bucket, variant, n, nodes, neighbours, owners     64 MiB
                                                     (int64 B x n), p (float64 B x m x n), q (opt.)
8   EncodingResults      server -> client            bucket, items: <= 65536 x (node, row cts,         256 MiB
                                                     optional self cts, refused)
9   EncodingsDone        server -> client            buckets, nodes                                    64 B
10  GlobalModel          server -> client            round, fit, splits (<= 8 names to evaluate),      256 MiB
                                                     arrays (<= 1024 named float32, <= 2^26 each)
11  LocalUpdate          client -> server            round, num_train, loss, arrays (named float32)    256 MiB
12  EvaluationReport     client -> server            round, splits: <= 8 x (split, correct, count,     1 KiB
                                                     loss_sum)
13  Abort                any                         code, reason (UTF-8 <= 1 KiB)                     2 KiB
14  EvaluateRequest      server -> client            round, splits (evaluate the last weights again)   1 KiB
16  PrivacyTerms         client -> server,           epsilon, delta, dim (0: no projection), seed      64 B
                         server -> client
17  UploadGrant          server -> client            recipients (int64, <= 4096): whose rows the       64 KiB
                                                     client may upload now (upload window only)
30  EdgeClaims           client -> server -> the     claimer, peer, edges (int64 k x 2), uses (0/1),   ~96 MiB
                         clients that check them     peers (every client it claims edges to),
                                                     claim_signature (64 B)
31  RosterReady          server -> client            participants (int64, <= 4096)                     64 KiB
32  NeighbourhoodState-  client -> server ->         owner, recipient_party, nodes, indptr, indices          ~320 MiB
    ment                 recipient                   (int64): neighbourhoods of the owner's nodes
                                                     the recipient needs, statement_signature (64 B)
==  ===================  ==========================  ================================================  ========

Secure aggregation of the FedAvg updates adds ids 20-28 (SecAggAdvert, SecAggCohort, SecAggShares,
SecAggRelay, SecAggMasked, SecAggSurvivors, SecAggConfirm, SecAggUnmaskRequest, SecAggUnmaskShares): see
:mod:`fedgat.protocols.messages_secagg` for their fields and limits (:data:`SECAGG_MESSAGES`).

Differential privacy (sessions whose :class:`~fedgat.protocols.pretrain.PretrainConfig` has ``dp``;
type 16 is only used there): a client sends PrivacyTerms before its graph, and the rows it releases
to other clients are its DP release (:mod:`fedgat.dp`); the server answers with its own
PrivacyTerms before the first EncodingBases. Each side refuses terms other than its
configuration's, and the server refuses the graph of a client that announced none
(:class:`~fedgat.protocols.errors.ConfigMismatchError`).

Upload window (sessions whose :class:`~fedgat.protocols.pretrain.PretrainConfig` has
``upload_window``; type 17 is only used there): a client uploads the rows it releases to a
recipient only after an UploadGrant naming that recipient, and accepts its bases and results while
it still uploads; the server refuses uploads for recipients it has not granted.

Relayed messages (KeyAnnounce, PublicContext, SealedCheckKeys, EdgeClaims, NeighbourhoodStatement) are re-framed and
re-signed by the server; what makes them trustworthy end to end is inside them: the announcing
party's ``binding_signature`` over its keys (which fixes its context's fingerprint), its
``keys_signature`` over the sealed check keys, its ``claim_signature`` over its edges and its
``statement_signature`` over the neighbourhoods it states.
"""

from __future__ import annotations

from .frame import (
    HEADER,
    MAGIC,
    MAX_NODES,
    MESSAGE_TYPES,
    SIGNATURE_SIZE,
    VERSION,
    ZERO_FINGERPRINT,
    Abort,
    AbortCode,
    Message,
    decode_message,
    encode_message,
    peek_type,
    register,
)
from .messages_pretrain import (
    EdgeClaims,
    EncodingBases,
    EncodingResults,
    EncodingsDone,
    FeatureUpload,
    GraphAnnounce,
    KeyAnnounce,
    NeighbourhoodStatement,
    PrivacyTerms,
    PublicContext,
    ResultItem,
    RosterReady,
    SealedCheckKeys,
    UploadDone,
    UploadGrant,
    UploadItem,
    claim_bytes,
    claim_keys_digest,
    key_binding_bytes,
    keyset_fingerprint,
    neighbourhood_bytes,
    sealed_keys_bytes,
)
from .messages_rounds import EvaluateRequest, EvaluationReport, GlobalModel, LocalUpdate, SplitCounts
from .messages_secagg import SECAGG_MESSAGES  # ids 20-26, registered on import

__all__ = [
    "HEADER",
    "MAGIC",
    "MAX_NODES",
    "MESSAGE_TYPES",
    "SECAGG_MESSAGES",
    "SIGNATURE_SIZE",
    "VERSION",
    "ZERO_FINGERPRINT",
    "Abort",
    "AbortCode",
    "EdgeClaims",
    "EncodingBases",
    "EncodingResults",
    "EncodingsDone",
    "EvaluateRequest",
    "EvaluationReport",
    "FeatureUpload",
    "GlobalModel",
    "GraphAnnounce",
    "KeyAnnounce",
    "LocalUpdate",
    "Message",
    "NeighbourhoodStatement",
    "PrivacyTerms",
    "PublicContext",
    "ResultItem",
    "RosterReady",
    "SealedCheckKeys",
    "SplitCounts",
    "UploadDone",
    "UploadGrant",
    "UploadItem",
    "claim_bytes",
    "claim_keys_digest",
    "decode_message",
    "encode_message",
    "key_binding_bytes",
    "keyset_fingerprint",
    "neighbourhood_bytes",
    "peek_type",
    "sealed_keys_bytes",
]

register(
    KeyAnnounce,
    PublicContext,
    SealedCheckKeys,
    GraphAnnounce,
    FeatureUpload,
    UploadDone,
    UploadGrant,
    EncodingBases,
    EncodingResults,
    EncodingsDone,
    GlobalModel,
    LocalUpdate,
    EvaluationReport,
    EvaluateRequest,
    PrivacyTerms,
    EdgeClaims,
    RosterReady,
    NeighbourhoodStatement,
)
