r"""FedGAT's encrypted pre-training round: the message flow, and the names of its pieces.

The round is written as small sans-IO pieces, each in its own module:

* :mod:`~fedgat.protocols.pretrain_config` -- what every party agrees on: :class:`PretrainConfig`,
  :class:`PretrainTimeouts`, :class:`PretrainLimits`;
* :mod:`~fedgat.protocols.pretrain_checks` -- checks on what a party receives or is given
  (:func:`validate_features`, upload and graph limits);
* :mod:`~fedgat.protocols.pretrain_plan` -- who needs which rows and what the server computes for
  whom (:func:`plan_round`, a pure function of the clients' graph announcements);
* :mod:`~fedgat.protocols.pretrain_keys` -- key set-up (:class:`DealerSide`, :func:`check_binding`);
* :mod:`~fedgat.protocols.pretrain_server` -- :class:`ServerPretrain`; where its homomorphic compute
  runs is injected (:mod:`fedgat.crypto.encoders`);
* :mod:`~fedgat.protocols.pretrain_client` -- :class:`ClientPretrain`.

This module re-exports them.

Parties: the server, the clients, and among the clients the key *dealer* (client 0 by default).
The roster of Ed25519 keys is pinned out of band (:mod:`fedgat.protocols.roster`).

Message flow (``->`` one message, ``=>`` a stream of them)::

    dealer  start: CKKS keygen; PublicContext -> server; GraphAnnounce -> server; then => FeatureUpload,
                   UploadDone (its own features)
    client  start: KeyAnnounce -> server; GraphAnnounce -> server
    server  KeyAnnounce from c: relays it -> dealer
    dealer  KeyAnnounce (relayed): checks c's binding signature against the roster, wraps the secret
            context for c's X25519 key (signed) -> WrappedKeyDelivery -> server
    server  WrappedKeyDelivery: relays it -> c (it cannot open it: no X25519 private key of c)
    client  WrappedKeyDelivery: unwraps (dealer's signature, AAD = dealer, client, session, key
            fingerprint), then => FeatureUpload (encrypted unit-norm feature rows), UploadDone
    server  once every client is done: draws the bases of every needed node ONCE
            (:func:`fedgat.encodings.draw_bases`), sends each client its buckets' EncodingBases, then
            => EncodingResults: each node's encodings :math:`F_i = A_i H_i` (paper eq. 9-14; vector
            variant :math:`V_i = Q_i H_i`; row 0 is :math:`h_i`) computed once on ciphertexts
            (:func:`fedgat.crypto.tasks.encode_node`) and sent to every client that needs the
            node, streamed in batches; finally EncodingsDone -> each client
    client  decrypts each batch on arrival into its :class:`~fedgat.encodings.Encodings` (its
            ``needed`` nodes, in ``needed`` order; :math:`h_i` of owned nodes from its own plaintext)

Differential privacy (``PretrainConfig.dp``, :mod:`fedgat.dp`): every client sends PrivacyTerms
before its GraphAnnounce, and for each batch a FeatureUpload of its nodes' clean *projected* rows
and a ReleaseUpload of their DP release (noise drawn by the client). The server computes, per
needed node, one result per distinct view (:func:`fedgat.crypto.encodings.plan_views`): a client's
result reads the clean ciphertexts of the sources it owns and the released ones of all others; it
confirms the terms (PrivacyTerms) to each client before the bases. A party refuses other terms, or
terms in a session without DP (:class:`~fedgat.protocols.errors.ConfigMismatchError`).

What the server learns: the graph structure (owned nodes, neighbour lists, hence who needs what),
the feature dimension, node counts, ciphertexts and their sizes. It holds only the public CKKS context
(:meth:`fedgat.crypto.ServerContext.from_bytes` refuses secret keys), so it cannot decrypt.
What a client learns from its encodings is *not* hidden by this protocol: see ``SECURITY.md``.

Faults (:class:`PretrainTimeouts`; time is given by :meth:`~fedgat.protocols.party.Party.tick`):
the server's ``keys`` phase lasts until it holds the public context, every client's graph and every
wrapped key; its ``upload`` phase until every client reported UploadDone. When a deadline passes, the
clients that did not finish are dropped *if* no remaining client needs them -- no node in the
remaining clients' needed sets (their nodes and their neighbours) is owned by a missing client --
and the round goes on without them (they get an Abort); otherwise the server stops with a
:class:`~fedgat.protocols.errors.MissingPartyError` naming the missing parties and the phase, and
tells every client. A missing dealer always stops the round. Clients time out too: ``keys``
(waiting for the wrapped key) and ``download`` (no bases or results for that long).

Limits (:class:`PretrainLimits`, checked before anything of that size is allocated or computed):
the server refuses a GraphAnnounce with a feature dimension, node count, neighbourhood size or
bases memory above its limits; a client refuses bases whose decrypted encodings would exceed its
memory budget (:class:`~fedgat.protocols.errors.SizeLimitError`, state unchanged).

Restarts: pre-training is one round and is rerun from scratch if interrupted; once it is done a
client's checkpoint (:meth:`ClientPretrain.checkpoint`) holds its decrypted encodings, so a client
restarted later (e.g. during training) reloads them (:func:`encodings_from_checkpoint`) instead.

Memory: uploads are validated and spooled to disk as they arrive
(:class:`~fedgat.crypto.spool.CiphertextSpool`); results are computed node by node by the injected
encoder as :meth:`ServerPretrain.step` pulls them, and leave in batches of ~``result_batch_bytes``; clients decrypt each
batch on arrival. No party holds all ciphertexts of a dataset.
"""

from __future__ import annotations

from fedgat.crypto.encoders import AUTO_POOL_MIN_NODES

from .pretrain_checks import MAX_BASIS_ABS, NORM_TOLERANCE, validate_features
from .pretrain_client import ClientPretrain, ClientState, encodings_from_checkpoint
from .pretrain_config import CLIENT_KIND, PretrainConfig, PretrainLimits, PretrainTimeouts
from .pretrain_keys import DealerSide, check_binding
from .pretrain_plan import RoundPlan, client_bucket_views, needed_from_neighbourhoods, plan_round
from .pretrain_server import ServerPretrain, ServerState, SpoolFactory

__all__ = [
    "AUTO_POOL_MIN_NODES",
    "CLIENT_KIND",
    "MAX_BASIS_ABS",
    "NORM_TOLERANCE",
    "ClientPretrain",
    "ClientState",
    "DealerSide",
    "PretrainConfig",
    "PretrainLimits",
    "PretrainTimeouts",
    "RoundPlan",
    "ServerPretrain",
    "ServerState",
    "SpoolFactory",
    "check_binding",
    "client_bucket_views",
    "encodings_from_checkpoint",
    "needed_from_neighbourhoods",
    "plan_round",
    "validate_features",
]
