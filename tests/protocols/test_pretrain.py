"""The encrypted pre-training round over the in-process transport: correct encodings, a server without
a secret key, and every rejected message leaving its receiver unchanged."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from fedgat.crypto import (
    KeyHolderContext,
    KeyUnwrapError,
    ServerContext,
    SlotLayout,
    WrapAAD,
    WrappingIdentity,
    deserialize,
    encrypt_rows,
)
from fedgat.crypto.encodings import CiphertextSpool, compute_node
from fedgat.pipeline import max_abs_error, run_plaintext_pretraining
from fedgat.protocols import (
    AuthError,
    ClientPretrain,
    ClientState,
    EncodingBases,
    EncodingResults,
    FeatureUpload,
    FrameError,
    GraphAnnounce,
    KeyAnnounce,
    KeyFingerprintError,
    PayloadError,
    PretrainConfig,
    PublicContext,
    ReplayError,
    ResultItem,
    ServerState,
    SignatureError,
    StateError,
    UploadDone,
    UploadItem,
    WrappedKeyDelivery,
    WrongRecipientError,
    decode_message,
    validate_features,
)

from protocol_helpers import Harness, keys_distributed


def _features(h: Harness, c: int) -> np.ndarray:
    return h.graph.x.numpy()[h.partition.clients[c].owned].astype(np.float64)


def rejected(party, data: bytes, error: type[Exception], match: str | None = None) -> None:
    """``data`` is refused with ``error`` and the party's snapshot is unchanged."""
    before = party.snapshot()
    with pytest.raises(error, match=match):
        party.receive(data)
    assert party.snapshot() == before


# ------------------------------------------------------------------------------- full round
@pytest.mark.parametrize("variant", ["vector", "matrix"])
def test_round_matches_plaintext_with_the_same_bases(tiny_graph, tiny_partition, variant):
    h = Harness(tiny_graph, tiny_partition, variant=variant).start().run()
    assert all(p.done for p in h.parties.all().values())
    got = {c: h.client(c).encodings for c in h.roster.clients}
    for c, enc in got.items():
        np.testing.assert_array_equal(enc.nodes, tiny_partition.clients[c].needed)
    want = run_plaintext_pretraining(tiny_graph, tiny_partition, variant, seed=1)
    err = max_abs_error(got, want)
    assert err <= 1e-5, err
    assert h.server.has_secret_key is False
    assert not h.server.context.tenseal.has_secret_key()
    # each node is computed once; the server held every needed node's bases exactly once
    nodes = np.concatenate([b.nodes for b in h.server.buckets])
    assert len(nodes) == len(np.unique(nodes)) == tiny_graph.num_nodes
    assert h.server.nodes_computed == tiny_graph.num_nodes


def test_server_cannot_decrypt_or_open_the_wrapped_key(harness):
    h = harness.start().run()
    received = [decode_message(e.data) for e in h.transport.transcript.received_by(h.roster.server)]
    upload = next(m for m in received if isinstance(m, FeatureUpload))
    vec = deserialize(h.server.context, upload.items[0].ciphertext, level="fresh")
    with pytest.raises((ValueError, RuntimeError)):  # TenSEAL: no secret key in the context
        vec.decrypt()
    assert not hasattr(h.server.context, "decrypt_vector")

    wrapped = next(m for m in received if isinstance(m, WrappedKeyDelivery) and m.target == 1)
    aad = WrapAAD(str(h.roster.dealer), "1", h.parties.config.session, wrapped.key_fingerprint)
    dealer_key = h.roster.signing_key(h.roster.dealer)
    with pytest.raises(KeyUnwrapError):  # the server has no X25519 private key of client 1
        KeyHolderContext.from_wrapped(
            wrapped.wrapped, WrappingIdentity.generate(), aad, dealer_public=dealer_key
        )
    # positive control: the addressee opens it
    opened = KeyHolderContext.from_wrapped(
        wrapped.wrapped, h.parties.deployment.identities[1].wrapping, aad, dealer_public=dealer_key
    )
    assert opened.fingerprint() == h.server.context.fingerprint()

    # no plaintext feature row crosses to the server, in float32 or float64
    frames = b"".join(e.data for e in h.transport.transcript.received_by(h.roster.server))
    row = h.graph.x[h.partition.clients[1].owned[0]]
    assert row.numpy().tobytes() not in frames and row.double().numpy().tobytes() not in frames


# ----------------------------------------------------------------------------- server side
def _valid_upload(h: Harness, c: int, k: int = 0) -> bytes:
    client = h.client(c)
    node = int(client.owned[k])
    blobs = list(encrypt_rows(client.holder, _features(h, c)[k : k + 1], client.layout))
    items = tuple(UploadItem(node, ch, b) for ch, b in enumerate(blobs))
    return h.craft(c, FeatureUpload, h.roster.server, items=items)


def test_server_rejects_bad_uploads_without_changing_state(harness):
    h = harness.start().run(until=lambda: keys_distributed(harness))
    server, client1 = h.server, h.client(1)
    assert server.state is ServerState.COLLECTING and client1.state is ClientState.UPLOADING
    owned1, owned2 = client1.owned, h.client(2).owned
    layout = client1.layout
    row = _features(h, 1)[:1]

    # a ciphertext under a foreign key (same parameters), in a correctly bound message
    foreign = KeyHolderContext.generate("n4096")
    blob = next(encrypt_rows(foreign, row, layout))
    rejected(
        server,
        h.craft(1, FeatureUpload, server.party_id, items=(UploadItem(int(owned1[0]), 0, blob),)),
        KeyFingerprintError,
    )
    # the message itself bound to another key
    ok_blob = next(encrypt_rows(client1.holder, row, layout))
    rejected(
        server,
        h.craft(
            1,
            FeatureUpload,
            server.party_id,
            fingerprint=foreign.fingerprint(),
            items=(UploadItem(int(owned1[0]), 0, ok_blob),),
        ),
        KeyFingerprintError,
    )
    # a node the sender does not own
    rejected(
        server,
        h.craft(1, FeatureUpload, server.party_id, items=(UploadItem(int(owned2[0]), 0, ok_blob),)),
        PayloadError,
        "does not own",
    )
    # duplicates inside one message
    rejected(
        server,
        h.craft(1, FeatureUpload, server.party_id, items=(UploadItem(int(owned1[0]), 0, ok_blob),) * 2),
        PayloadError,
        "duplicate",
    )
    # a malformed ciphertext
    rejected(
        server,
        h.craft(1, FeatureUpload, server.party_id, items=(UploadItem(int(owned1[0]), 0, ok_blob[:-5]),)),
        PayloadError,
    )

    first = _valid_upload(h, 1)
    server.receive(first)
    assert (int(owned1[0]), 0) in server._received[1]
    # duplicate of an accepted upload (fresh sequence number)
    rejected(server, _valid_upload(h, 1), PayloadError, "duplicate")
    # the very same frame again
    rejected(server, first, ReplayError)
    # an old / other session id
    rejected(
        server,
        h.craft(
            1,
            FeatureUpload,
            server.party_id,
            session=h.parties.config.session + 1,
            items=(UploadItem(int(owned1[1]), 0, ok_blob),),
        ),
        ReplayError,
    )
    # addressed to someone else
    rejected(
        server,
        h.craft(1, FeatureUpload, 2, items=(UploadItem(int(owned1[1]), 0, ok_blob),)),
        WrongRecipientError,
    )
    # tampered: one bit inside the ciphertext
    data = bytearray(_valid_upload(h, 1, k=1))
    data[len(data) // 2] ^= 0x04
    rejected(server, bytes(data), SignatureError)
    # unfinished upload reported as done
    rejected(server, h.craft(1, UploadDone, server.party_id, nodes=len(owned1), ciphertexts=1), PayloadError)


def test_server_rejects_inconsistent_graphs_and_roles(harness):
    h = harness  # nothing delivered yet
    server, sid = h.server, h.roster.server
    g0 = h.client(0)._graph
    server.receive(
        h.craft(0, GraphAnnounce, sid, dim=g0.dim, owned=g0.owned, indptr=g0.indptr, indices=g0.indices)
    )
    g1 = h.client(1)._graph
    # wrong dimension
    rejected(
        server,
        h.craft(1, GraphAnnounce, sid, dim=g0.dim + 1, owned=g1.owned, indptr=g1.indptr, indices=g1.indices),
        PayloadError,
        "dimension",
    )
    # claiming client 0's node
    stolen = np.array([int(g0.owned[0])])
    rejected(
        server,
        h.craft(1, GraphAnnounce, sid, dim=g0.dim, owned=stolen, indptr=np.array([0, 1]), indices=stolen),
        PayloadError,
        "already owned",
    )
    # uploads before the public context / the graph
    rejected(server, h.craft(1, UploadDone, sid, nodes=1, ciphertexts=1), StateError)
    # a "public" context that carries the secret key is refused before TenSEAL parses it
    secret = KeyHolderContext.generate("n4096")
    blob = secret.secret_context_bytes()
    fp = hashlib.sha256(blob).digest()
    rejected(
        server,
        h.craft(0, PublicContext, sid, fingerprint=fp, preset="n4096", context=blob, context_fingerprint=fp),
        PayloadError,
        "private part",
    )
    # ... and only the dealer may send the context at all
    pub = secret.public_context_bytes()
    rejected(
        server,
        h.craft(
            1,
            PublicContext,
            sid,
            fingerprint=secret.fingerprint(),
            preset="n4096",
            context=pub,
            context_fingerprint=secret.fingerprint(),
        ),
        AuthError,
    )
    # a party that is not in the roster
    from fedgat.crypto import SigningIdentity
    from fedgat.protocols import encode_message

    intruder = encode_message(
        UploadDone(sender=99, recipient=sid, session=h.parties.config.session, seq=1, nodes=1, ciphertexts=1),
        SigningIdentity.generate(),
    )
    rejected(server, intruder, AuthError)
    # a client announcing keys for another party, and the dealer sending what only clients send
    x = WrappingIdentity.generate().public_bytes()
    rejected(
        server,
        h.craft(
            1,
            KeyAnnounce,
            sid,
            party=2,
            x25519=x,
            ed25519=h.roster.signing_key(2),
            binding_signature=bytes(64),
        ),
        PayloadError,
    )
    rejected(
        server,
        h.craft(
            0,
            KeyAnnounce,
            sid,
            party=0,
            x25519=x,
            ed25519=h.roster.signing_key(0),
            binding_signature=bytes(64),
        ),
        AuthError,
    )
    rejected(
        server,
        h.craft(
            1,
            KeyAnnounce,
            sid,
            party=1,
            x25519=x,
            ed25519=h.roster.signing_key(1),
            binding_signature=bytes(64),
        ),
        SignatureError,
    )


# ----------------------------------------------------------------------------- client side
def test_clients_refuse_a_substituted_key(harness):
    h = harness
    h.driver.start()
    client1 = h.client(1)
    # before the key: bases are out of state
    rejected(
        client1,
        h.craft(
            h.roster.server,
            EncodingBases,
            1,
            bucket=0,
            variant="vector",
            n=1,
            nodes=np.array([int(client1.owned[0])]),
            p=np.ones((1, 1, 1)),
        ),
        StateError,
    )
    # a malicious server wraps ITS OWN key for client 1, signing with its own identity
    rogue = KeyHolderContext.generate("n4096")
    wrapped = rogue.wrap_for(
        h.parties.deployment.identities[1].wrapping.public_bytes(),
        sender_id="0",
        recipient_id="1",
        round_id=h.parties.config.session,
        signer=h.parties.deployment.identities[h.roster.server].signer,
    )
    rejected(
        client1,
        h.craft(
            h.roster.server,
            WrappedKeyDelivery,
            1,
            fingerprint=rogue.fingerprint(),
            dealer=0,
            target=1,
            key_fingerprint=rogue.fingerprint(),
            wrapped=wrapped,
        ),
        AuthError,
    )
    # ... and the dealer refuses a substituted X25519 key (its binding signature fails)
    dealer = h.client(0)
    h.run(until=lambda: dealer.holder is not None)
    x = WrappingIdentity.generate().public_bytes()
    rejected(
        dealer,
        h.craft(
            h.roster.server,
            KeyAnnounce,
            0,
            party=1,
            x25519=x,
            ed25519=h.roster.signing_key(1),
            binding_signature=bytes(64),
        ),
        SignatureError,
    )


def _computing(h: Harness) -> bool:
    return h.server.state is ServerState.COMPUTING and not h.transport.pending()


def test_clients_reject_bad_results_without_changing_state(harness):
    h = harness.start().run(until=lambda: _computing(harness))
    server = h.server
    out = server.step()
    target = next(m for m in out if isinstance(m, EncodingResults))
    c = target.recipient
    client = h.client(c)
    data = server.encode(target)
    tampered = bytearray(data)
    tampered[-200] ^= 0x01
    rejected(client, bytes(tampered), SignatureError)
    rejected(client, data[:-1], FrameError)
    # a result computed under a foreign key (as a server mixing up sessions would), correctly signed
    foreign = KeyHolderContext.generate("n4096")
    item = target.items[0]
    fctx = ServerContext.from_bytes(foreign.public_context_bytes())
    spool = CiphertextSpool(fctx, server.layout)
    bases = next(b for b in server.buckets if item.node in b.nodes)
    x = h.graph.x.numpy().astype(np.float64)
    for j in {int(n) for n in bases.neighbours.ravel()}:
        for ch, blob in enumerate(encrypt_rows(foreign, x[j : j + 1], server.layout)):
            spool.put(j, ch, blob)
    slot = int(np.flatnonzero(bases.nodes == item.node)[0])
    res = compute_node(fctx, server.layout, spool, bases, slot)
    spool.close()
    forged = EncodingResults(
        sender=server.party_id,
        recipient=c,
        session=h.parties.config.session,
        seq=h._next_seq(),
        fingerprint=server.verifier.fingerprint,
        bucket=target.bucket,
        items=(ResultItem(item.node, tuple(res.row_blobs)),),
    )
    rejected(client, server.encode(forged), KeyFingerprintError)
    # wrong number of ciphertexts, unknown bucket, duplicates
    short = ResultItem(item.node, item.row_blobs[:-1])
    forwarded = ResultItem(item.node, item.row_blobs, item.row_blobs[:1])
    for items, bucket, err in (
        ((short,), target.bucket, "row ciphertexts"),
        ((forwarded,), target.bucket, "forwarded"),
        ((item,), 10_000, "unknown bucket"),
        ((item, item), target.bucket, "duplicate"),
    ):
        msg = EncodingResults(
            sender=server.party_id,
            recipient=c,
            session=h.parties.config.session,
            seq=h._next_seq(),
            fingerprint=server.verifier.fingerprint,
            bucket=bucket,
            items=items,
        )
        rejected(client, server.encode(msg), PayloadError, err)
    # the genuine message is accepted afterwards, then replaying it fails
    client.receive(data)
    rejected(client, data, ReplayError)
    h.driver.emit(server.party_id, [m for m in out if m is not target])
    h.run()
    assert all(p.done for p in h.parties.all().values())


# --------------------------------------------------------------------------------- features
def test_clients_validate_their_features(tiny_graph, tiny_partition, harness):
    cp = tiny_partition.clients[1]
    x = tiny_graph.x.numpy()[cp.owned].astype(np.float64)
    base = harness.client(1)
    args = {
        "owned": cp.owned,
        "indptr": base._graph.indptr,
        "indices": base._graph.indices,
        "needed": cp.needed,
    }
    ident = harness.parties.deployment.identities[1]
    cfg = harness.parties.config
    nan = x.copy()
    nan[0, 0] = np.nan
    with pytest.raises(PayloadError, match="NaN"):
        ClientPretrain(1, harness.roster, cfg, ident, features=nan, **args)
    with pytest.raises(PayloadError, match="shape"):
        ClientPretrain(1, harness.roster, cfg, ident, features=x[:-1], **args)
    with pytest.raises(PayloadError, match="unit-norm"):
        ClientPretrain(1, harness.roster, cfg, ident, features=2 * x, **args)
    with pytest.raises(PayloadError, match="shape"):
        validate_features(x, len(x), dim=x.shape[1] + 1)
    zero = x.copy()
    zero[0] = 0.0  # isolated all-zero rows (CiteSeer) are allowed
    validate_features(zero, len(x))


def test_config_layout_and_dtype(tiny_graph, tiny_partition):
    h = Harness(tiny_graph, tiny_partition)
    assert isinstance(h.parties.config, PretrainConfig)
    h.start().run()
    client = h.client(2)
    assert client.layout == SlotLayout.for_dimension(tiny_graph.num_features, 2048)
    assert all(b.K2.dtype == torch.float64 for b in client.encodings.buckets)
    assert client.state is ClientState.DONE


def test_config_takes_a_variant_or_its_name():
    from fedgat.protocols.pretrain_config import bases_bytes
    from fedgat.variants import MATRIX, VECTOR

    by_object = PretrainConfig(session=1, variant=MATRIX)
    assert by_object == PretrainConfig(session=1, variant="matrix") and by_object.variant == "matrix"
    assert by_object.kind is MATRIX and PretrainConfig(session=1).kind is VECTOR
    with pytest.raises(ValueError, match=r"unknown FedGAT variant 'tensor'; choose one of"):
        PretrainConfig(session=1, variant="tensor")
    vector2 = PretrainConfig(session=1, embed_factor=2)
    assert [vector2.rows_per_node(n) for n in (1, 3)] == [2, 6]
    assert [vector2.rows_per_node(n, ship_m2=True) for n in (1, 3)] == [2, 6]  # nothing to ship
    assert [by_object.rows_per_node(n) for n in (1, 3)] == [2, 6]
    assert [by_object.rows_per_node(n, ship_m2=True) for n in (1, 3)] == [2 + 4, 6 + 36]
    sizes = np.array([1, 3, 3])
    assert bases_bytes("matrix", sizes, 1) == bases_bytes(MATRIX, sizes, 5) == 8 * 2 * (2 + 18 + 18)
    assert bases_bytes("vector", sizes, 2) == 8 * (2 + 18 + 18)
