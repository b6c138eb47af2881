r"""FedGAT's encrypted pre-training round: the message flow, and the names of its pieces.

The round is written as small sans-IO pieces, each in its own module:

* :mod:`~fedgat.protocols.pretrain_config` -- what every party agrees on: :class:`PretrainConfig`,
  :class:`PretrainTimeouts`, :class:`PretrainLimits`;
* :mod:`~fedgat.protocols.pretrain_checks` -- checks on what a party receives or is given
  (:func:`validate_features`, upload and graph limits);
* :mod:`~fedgat.protocols.pretrain_plan` -- who needs which rows and what the server computes for
  whom (:func:`plan_round`, a pure function of the clients' graph announcements);
* :mod:`~fedgat.protocols.pretrain_keys` -- key set-up (:class:`SessionKeys`, :func:`check_announce`);
* :mod:`~fedgat.protocols.pretrain_edges` -- confirmed edges: who may receive which rows;
* :mod:`~fedgat.protocols.pretrain_server` -- :class:`ServerPretrain`; where its homomorphic compute
  runs is injected (:mod:`fedgat.crypto.encoders`);
* :mod:`~fedgat.protocols.pretrain_client` -- :class:`ClientPretrain`.

This module re-exports them.

Parties: the server and the clients. The roster of Ed25519 keys is pinned out of band
(:mod:`fedgat.protocols.roster`). There is no dealer and no shared secret key: every client holds
its own CKKS key pair, and the rows a client needs are encrypted under *its* key by their owners.

Message flow (``->`` one message, ``=>`` a stream of them)::

    client  start: own CKKS key pair and HPKE key pair; KeyAnnounce (HPKE key, context fingerprint,
            signed), PublicContext, [PrivacyTerms], EdgeClaims (one per bordering client, signed),
            GraphAnnounce -> server
    server  once every client's are in: checks the claims against the graphs
            (:func:`~fedgat.protocols.pretrain_edges.check_claims`: every cross-client attention edge
            confirmed by both owners), relays every client's KeyAnnounce and PublicContext to every
            other client and each client the claims it needs, then RosterReady (the participants;
            later messages are bound to their key set, :func:`~fedgat.protocols.messages.keyset_fingerprint`)
    client  RosterReady: decides its releases itself from confirmed edges
            (:func:`~fedgat.protocols.pretrain_edges.releases`); seals fresh check keys to every
            other client (SealedCheckKeys: HPKE ML-KEM-768 + X25519, signed) -> server -> owners;
            states, to each client whose nodes attend over its own, those nodes' neighbourhoods
            (NeighbourhoodStatement, signed) -> server (checks it against the graph) -> recipient
    client  once it holds the check keys of every client it releases to: => FeatureUpload (its
            released rows, padded under the recipient's check key, with their tag columns,
            :func:`fedgat.crypto.tags.release_rows`, encrypted under the recipient's public
            context), UploadDone
    server  checks every upload against the rows the plan needs from that owner for that recipient
            (and takes none before the owner's statement to that recipient); once all are done: draws the bases of every needed node ONCE
            (:func:`fedgat.encodings.draw_bases`), sends each client its buckets' EncodingBases
            (with neighbours and their owners), then => EncodingResults: per recipient, each needed
            node's *foreign share* :math:`F_i = A_i^{f} H^{f}` (paper eq. 9-14, over the neighbours
            the recipient does not own; vector variant :math:`V_i = Q_i H_i`, row 0 is :math:`h_i`)
            under the recipient's key, one *partial* per foreign owner, partials of one owner packed
            in shared ciphertexts (:func:`fedgat.crypto.tasks.encode_node`,
            :func:`~fedgat.protocols.pretrain_plan.plan_shares`,
            :class:`~fedgat.crypto.encodings.PackedShares`); finally EncodingsDone
    client  checks its bases against what it knows, the claims and the statements
            (:func:`~fedgat.protocols.pretrain_edges.check_foreign_neighbourhoods`); adds the share
            of its own rows in plaintext; decrypts and unpacks each partial, checks its tag
            columns on the padded values, removes the pads and checks the range
            (:func:`fedgat.crypto.tags.check_share`, every partial of a message in
            one pass by :func:`~fedgat.crypto.tags.check_shares`:
            :class:`~fedgat.protocols.errors.ResultRejectedError` names the node and the owners),
            and assembles its :class:`~fedgat.encodings.Encodings`

Upload window (``PretrainConfig.upload_window = W``; off by default): the server draws the plan as
soon as the roster is ready and sends each client its bases once it has relayed the statements the
client checks them against; it grants uploads recipient by
recipient (UploadGrant to the owners that release rows to it), ``W`` recipients open at a time. A
client uploads the rows it releases to a recipient only once granted, and takes its bases and
results while it still uploads. Recipients are computed in plan order: once the next one's uploads
are all in, the server computes its foreign shares, streams them, deletes its spool and grants the
next recipient; EncodingsDone follows the last recipient and every UploadDone. The server refuses
uploads for a recipient it has not granted (:class:`~fedgat.protocols.errors.PayloadError`), so its
disk holds at most ``W`` recipients' uploads whatever the clients send. Deadlines count waiting, not
working: the server's ``upload`` deadline restarts at the first tick after each of its compute steps,
does not fire while it has a complete recipient to compute, and names the owners of the open
recipients' missing rows; a client's ``download`` deadline restarts
after each of its upload steps and does not end its session while it has granted rows to send. The
rows released, the bases, the results and what each party learns are those of the round without a
window; a client refuses a result for good (terminal, see ``SECURITY.md``) only at EncodingsDone,
which follows every upload, and until then keeps uploading, so a forged result does not stop the
round for the others.

Differential privacy (``PretrainConfig.dp``, :mod:`fedgat.dp`): every client sends PrivacyTerms
before its graph; the rows it releases to others are its DP release (noise drawn by the client);
its own share reads its clean projected rows. The server confirms the terms (PrivacyTerms) to each
client before the bases; a party refuses other terms, or terms in a session without DP
(:class:`~fedgat.protocols.errors.ConfigMismatchError`).

What the server learns: the graph structure (owned nodes, neighbour lists, claims, hence who needs
what), the feature dimension, node counts, ciphertexts and their sizes. It holds only public CKKS
contexts (:meth:`fedgat.crypto.ServerContext.from_bytes` refuses secret keys), so it cannot
decrypt; a colluding client's secret key opens only the ciphertexts made for that client. What a
client learns from its encodings is *not* hidden by this protocol: see ``SECURITY.md``.

Faults (:class:`PretrainTimeouts`; time is given by :meth:`~fedgat.protocols.party.Party.tick`):
the server's ``keys`` phase lasts until it holds every client's keys, context, claims and graph; its
``upload`` phase until every client reported UploadDone. When the ``keys`` deadline passes, the
clients that did not finish are dropped *if* no remaining client needs them -- no node in the
remaining clients' needed sets (their nodes and their neighbours) is owned by a missing client --
and the round goes on without them (they get an Abort); otherwise the server stops with a
:class:`~fedgat.protocols.errors.MissingPartyError` naming the missing parties and the phase, and
tells every client. Once the roster is ready, releases are planned with every participant, so a
client missing at the ``upload`` deadline stops the round. Clients time out too: ``keys`` (waiting
for the roster and the check keys of the clients they release to; give clients longer deadlines
than the server, so that the server decides about a missing peer first) and ``download`` (no bases
or results for that long).

Limits (:class:`PretrainLimits`, checked before anything of that size is allocated or computed):
the server refuses a GraphAnnounce with a feature dimension, node count, neighbourhood size or
bases memory above its limits; a client refuses bases whose decrypted encodings would exceed its
memory budget (:class:`~fedgat.protocols.errors.SizeLimitError`, state unchanged).

Restarts: pre-training is one round and is rerun from scratch if interrupted; once it is done a
client's checkpoint (:meth:`ClientPretrain.checkpoint`) holds its decrypted encodings, so a client
restarted later (e.g. during training) reloads them (:func:`encodings_from_checkpoint`) instead.

Memory: uploads are validated and spooled to disk as they arrive, one spool per recipient
(:class:`~fedgat.crypto.spool.CiphertextSpool`; all of them before compute, or with an upload window
at most ``W`` at a time); results are computed node by node by the injected
encoder (one per recipient, under its context) as :meth:`ServerPretrain.step` pulls them, and leave in batches of ~``result_batch_bytes``; clients decrypt each
batch on arrival. No party holds all ciphertexts of a dataset.
"""

from __future__ import annotations

from fedgat.crypto.encoders import AUTO_POOL_MIN_MULTIPLY_ADDS

from .pretrain_checks import MAX_BASIS_ABS, NORM_TOLERANCE, validate_features
from .pretrain_client import ClientPretrain, ClientState, encodings_from_checkpoint
from .pretrain_config import CLIENT_KIND, PretrainConfig, PretrainLimits, PretrainTimeouts
from .pretrain_edges import LocalGraph, releases
from .pretrain_keys import SessionKeys, check_announce
from .pretrain_plan import RoundPlan, client_bucket_views, needed_from_neighbourhoods, plan_round, plan_shares
from .pretrain_server import ServerPretrain, ServerState, SpoolFactory

__all__ = [
    "AUTO_POOL_MIN_MULTIPLY_ADDS",
    "CLIENT_KIND",
    "MAX_BASIS_ABS",
    "NORM_TOLERANCE",
    "ClientPretrain",
    "ClientState",
    "LocalGraph",
    "PretrainConfig",
    "PretrainLimits",
    "PretrainTimeouts",
    "RoundPlan",
    "ServerPretrain",
    "ServerState",
    "SessionKeys",
    "SpoolFactory",
    "check_announce",
    "client_bucket_views",
    "encodings_from_checkpoint",
    "needed_from_neighbourhoods",
    "plan_round",
    "plan_shares",
    "releases",
    "validate_features",
]
