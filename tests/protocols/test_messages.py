"""Framing: every message type round-trips; malformed, oversized and tampered frames are rejected with
the right ProtocolError subclass; decode_message never raises anything else (hypothesis)."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from secagg_samples import secagg_samples

from fedgat.crypto import SigningIdentity, verify
from fedgat.protocols import (
    MESSAGE_TYPES,
    Abort,
    AuthError,
    EdgeClaims,
    EncodingBases,
    EncodingResults,
    EncodingsDone,
    EvaluateRequest,
    EvaluationReport,
    FeatureUpload,
    FrameError,
    GlobalModel,
    GraphAnnounce,
    KeyAnnounce,
    KeyFingerprintError,
    LocalUpdate,
    NeighbourhoodStatement,
    PayloadError,
    PrivacyTerms,
    ProtocolError,
    PublicContext,
    ReplayError,
    ResultItem,
    Roster,
    RosterReady,
    SealedCheckKeys,
    SignatureError,
    SizeLimitError,
    SplitCounts,
    UnknownTypeError,
    UploadDone,
    UploadGrant,
    UploadItem,
    Verifier,
    VersionError,
    WrongRecipientError,
    decode_message,
    encode_message,
)
from fedgat.protocols.frame import SIGNING_PREFIX, VERSION, signing_input
from fedgat.protocols.messages import HEADER, SIGNATURE_SIZE
from fedgat.protocols.messages_pretrain import HPKE_PUBLIC

SIGNER = SigningIdentity.generate()
OTHER = SigningIdentity.generate()
SESSION = 77
FP = hashlib.sha256(b"context").digest()
HDR = {"sender": 1, "recipient": 3, "session": SESSION, "seq": 5, "fingerprint": FP}
ROSTER = Roster(
    server=3,
    clients=(0, 1, 2),
    signing_keys={
        0: OTHER.public_bytes(),
        1: SIGNER.public_bytes(),
        2: OTHER.public_bytes(),
        3: OTHER.public_bytes(),
    },
)


def env(body: bytes) -> bytes:
    """A stand-in for a ciphertext envelope: ``body`` repeated to 1 KiB at least (the least a ciphertext
    field holds), then its SHA-256 (what it must end with, :class:`fedgat.protocols.codec.Digested`)."""
    body = body * -(-1024 // max(1, len(body))) if body else bytes(1024)
    return body + hashlib.sha256(body).digest()


def ciphertexts(msg) -> list[bytes]:
    """The ciphertext fields of ``msg``, in payload order."""
    items = getattr(msg, "items", ())
    return [
        c
        for i in items
        for c in ([i.ciphertext] if isinstance(i, UploadItem) else getattr(i, "row_blobs", ()))
    ]


def samples() -> list:
    rng = np.random.default_rng(0)
    p = rng.standard_normal((2, 3, 3))
    bases = {"nodes": np.array([1, 4]), "neighbours": np.array([[1, 4, 7], [4, 1, 9]])}
    owners = np.array([[0, 1, 2], [1, 0, 2]])
    return [
        KeyAnnounce(
            party=1,
            hpke=b"h" * HPKE_PUBLIC,
            ed25519=b"e" * 32,
            context_fingerprint=FP,
            binding_signature=b"s" * 64,
            **{**HDR, "fingerprint": bytes(32)},
        ),
        PublicContext(party=1, preset="n4096", context=b"context", context_fingerprint=FP, **HDR),
        SealedCheckKeys(
            recipient_party=1,
            owners=np.array([0, 2]),
            sealed=(b"a" * 100, b"b" * 120),
            keys_signature=b"k" * 64,
            **HDR,
        ),
        GraphAnnounce(
            dim=4, owned=np.array([2, 5]), indptr=np.array([0, 2, 3]), indices=np.array([2, 5, 5]), **HDR
        ),
        FeatureUpload(target=2, items=(UploadItem(2, 0, env(b"ct0")), UploadItem(5, 1, env(b"ct1"))), **HDR),
        UploadDone(nodes=2, ciphertexts=4, **HDR),
        UploadGrant(recipients=np.array([1, 3]), **HDR),
        EncodingBases(bucket=0, variant="vector", n=3, owners=owners, p=p, **bases, **HDR),
        EncodingBases(
            bucket=1,
            variant="matrix",
            n=3,
            owners=owners,
            p=rng.standard_normal((2, 6, 3)),
            q=rng.standard_normal((2, 6, 3)),
            **bases,
            **HDR,
        ),
        EncodingResults(
            bucket=2,
            items=(ResultItem(4, 0, (env(b"a"), env(b"b" * 1100))), ResultItem(7, 2, (env(b""),))),
            **HDR,
        ),
        EncodingsDone(buckets=3, nodes=9, **HDR),
        GlobalModel(
            round=4,
            fit=True,
            splits=("val", "test"),
            arrays={"w": rng.standard_normal((3, 2)).astype(np.float32), "b": np.zeros(2, np.float32)},
            **HDR,
        ),
        LocalUpdate(
            round=4, num_train=7, loss=float("nan"), arrays={"w": np.ones((3, 2), np.float32)}, **HDR
        ),
        EvaluationReport(
            round=4, splits=(SplitCounts("val", 3, 5, 1.5), SplitCounts("test", 1, 2, 0.25)), **HDR
        ),
        EvaluateRequest(round=4, splits=("test",), **HDR),
        Abort(code=1, reason="stop: ünïcode", **HDR),
        PrivacyTerms(
            mechanism="label_rr", epsilon=4.0, delta=1e-5, dim=64, seed=7, bits=0, low=-1.0, high=1.0, **HDR
        ),
        EdgeClaims(
            claimer=1,
            peer=2,
            edges=np.array([[2, 7], [2, 9], [5, 7]]),
            uses=np.array([1, 0, 1]),
            peers=np.array([0, 2, 3]),
            claim_signature=b"c" * 64,
            **HDR,
        ),
        RosterReady(participants=np.array([0, 1, 2]), **HDR),
        NeighbourhoodStatement(
            owner=1,
            recipient_party=2,
            nodes=np.array([2, 5]),
            indptr=np.array([0, 3, 4]),
            indices=np.array([2, 7, 5, 5]),
            statement_signature=b"n" * 64,
            **HDR,
        ),
        *secagg_samples(HDR),
    ]


def sample(cls):
    """The first sample of type ``cls``."""
    return next(m for m in samples() if type(m) is cls)


def frame(msg, signer=SIGNER) -> bytes:
    return encode_message(msg, signer)


def test_every_type_has_a_sample():
    assert {type(m) for m in samples()} == set(MESSAGE_TYPES.values())


@pytest.mark.parametrize("msg", samples(), ids=lambda m: m.type_name)
def test_round_trip(msg):
    data = frame(msg)
    got = decode_message(data)
    assert type(got) is type(msg) and got == msg
    assert frame(got) == data  # canonical: decode then encode gives the same bytes
    assert got.signed_bytes == data[:-SIGNATURE_SIZE] and got.signature == data[-SIGNATURE_SIZE:]


@pytest.mark.parametrize("msg", samples(), ids=lambda m: m.type_name)
def test_truncated_and_padded_frames(msg):
    data = frame(msg)
    for cut in sorted(
        {0, 1, 3, HEADER.size - 1, HEADER.size, HEADER.size + 1, len(data) // 2, len(data) - 1}
    ):
        with pytest.raises(FrameError):
            decode_message(data[:cut])
    with pytest.raises(FrameError):
        decode_message(data + b"\0")


def test_random_bytes_are_frame_errors():
    rng = np.random.default_rng(1)
    for size in (0, 10, 66, 67, 200, 5000):
        with pytest.raises(FrameError):
            decode_message(rng.bytes(size))


def _patch(data: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def test_header_fields_map_to_their_errors():
    data = frame(sample(UploadDone))
    assert data[4] == VERSION == 14
    with pytest.raises(FrameError, match="magic"):
        decode_message(b"XGAT" + data[4:])
    # the dealer (1), shared check keys (2), per-client reports (3), DP terms without a mechanism (4),
    # a PublicContext without the ciphertext wire (5), a signature over the frame's bytes themselves (6),
    # results one node per item (7), edge claims without their claimer's peers (8), rounds without
    # the owners' neighbourhood statements (9), secure rounds without cohort views or consistency
    # check (10), rows released unpadded (11), uniform pads (12), ciphertexts hashed for the signature
    # too (13)
    for version in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 255):
        with pytest.raises(VersionError):
            decode_message(_patch(data, 4, ">B", version))
    with pytest.raises(UnknownTypeError):
        decode_message(_patch(data, 5, ">H", 999))
    with pytest.raises(UnknownTypeError):
        decode_message(_patch(data, 5, ">H", 0))
    with pytest.raises(SizeLimitError):
        decode_message(_patch(data, 63, ">I", 65))  # UploadDone allows 64 payload bytes
    with pytest.raises(FrameError):
        decode_message(_patch(data, 63, ">I", 7))


def test_oversize_declared_payload_is_refused_from_the_header_alone():
    head = HEADER.pack(b"FGAT", VERSION, FeatureUpload.TYPE, 1, 3, SESSION, 1, FP, 2**32 - 1)
    tracemalloc.start()
    try:
        with pytest.raises(SizeLimitError):
            decode_message(head)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


def _payload_frame(type_id: int, payload: bytes) -> bytes:
    return HEADER.pack(b"FGAT", VERSION, type_id, 1, 3, SESSION, 1, FP, len(payload)) + payload + bytes(64)


def test_field_limits_are_checked_before_reading():
    # FeatureUpload (to party 2) declaring 5000 items (limit 4096), with no item bytes behind
    with pytest.raises(SizeLimitError):
        decode_message(_payload_frame(FeatureUpload.TYPE, struct.pack(">II", 2, 5000)))
    # one item whose ciphertext declares 2 GB
    item = struct.pack(">IIIHI", 2, 1, 2, 0, 2**31)
    with pytest.raises(SizeLimitError):
        decode_message(_payload_frame(FeatureUpload.TYPE, item))
    # an array declaring 2^31 x 2^31 elements
    arr = struct.pack(">IBB", 4, 3, 1) + struct.pack(">I", 2**31) + struct.pack(">I", 0)
    with pytest.raises((SizeLimitError, FrameError)):
        decode_message(_payload_frame(GraphAnnounce.TYPE, arr))
    huge = struct.pack(">IBB", 4, 3, 2) + struct.pack(">II", 2**31, 2**31)
    with pytest.raises((SizeLimitError, PayloadError)):
        decode_message(_payload_frame(GraphAnnounce.TYPE, huge))


def test_bad_values_are_payload_errors():
    ok = sample(GlobalModel)
    arrays = {"w": np.array([[1.0, np.nan]], np.float32)}
    with pytest.raises(PayloadError):
        frame(GlobalModel(round=1, fit=True, splits=("val",), arrays=arrays, **HDR))  # the sender refuses too
    data = frame(ok)
    nan = np.float32(np.nan).tobytes()
    one = np.float32(1.0).tobytes()
    sample_w = ok.arrays["w"].astype("<f4").tobytes()
    at = data.index(sample_w)
    with pytest.raises(PayloadError, match="NaN"):
        decode_message(data[:at] + nan + data[at + 4 :])
    assert one not in (nan,)
    bad_graph = GraphAnnounce(
        dim=4, owned=np.array([2, 5]), indptr=np.array([0, 2, 3]), indices=np.array([3, 5, 5]), **HDR
    )  # node 2's row does not start with 2
    with pytest.raises(PayloadError, match="itself"):
        frame(bad_graph)
    twice = GraphAnnounce(
        dim=4, owned=np.array([2, 5]), indptr=np.array([0, 3, 5]), indices=np.array([2, 7, 5, 5, 7]), **HDR
    )  # node 5's neighbourhood lists 7 once, node 2's lists nothing twice: accepted
    assert decode_message(frame(twice)) == twice
    for indices in ([2, 7, 7, 5, 2], [2, 7, 2, 5, 9]):  # 7 twice in node 2's row; node 2 itself twice
        with pytest.raises(PayloadError, match="twice"):
            frame(
                GraphAnnounce(
                    dim=4,
                    owned=np.array([2, 5]),
                    indptr=np.array([0, 3, 5]),
                    indices=np.array(indices),
                    **HDR,
                )
            )
    with pytest.raises(KeyFingerprintError):
        frame(PublicContext(party=1, preset="n4096", context=b"other", context_fingerprint=FP, **HDR))


def test_a_neighbourhood_statement_checks_its_neighbourhoods_on_both_sides():
    """Frame version 10: the statement's CSR rows obey GraphAnnounce's rules (node first, nothing
    twice, increasing nodes), it covers a node, and an owner states to another client."""
    ok = sample(NeighbourhoodStatement)
    assert decode_message(frame(ok)) == ok
    found, rows = ok.rows(np.array([5, 2, 9]), 1)
    assert found.tolist() == [True, False, False] and rows[0].tolist() == [5]  # 2 has 3 neighbours
    found, rows = ok.rows(np.array([2]), 3)
    assert found.tolist() == [True] and rows[0].tolist() == [2, 7, 5]
    empty = dataclasses.replace(
        ok, nodes=np.zeros(0, np.int64), indptr=np.array([0]), indices=np.zeros(0, np.int64)
    )
    assert empty.rows(np.array([2, 5]), 3)[0].tolist() == [False, False]  # (unchecked: never sent)
    for fields, match in [
        ({"indices": np.array([7, 2, 5, 5])}, "itself"),
        ({"indices": np.array([2, 7, 7, 5])}, "twice"),
        ({"nodes": np.array([5, 2]), "indices": np.array([5, 7, 2, 2])}, "increasing"),
        (
            {"nodes": np.zeros(0, np.int64), "indptr": np.array([0]), "indices": np.zeros(0, np.int64)},
            "at least one",
        ),
        ({"indptr": np.array([0, 3, 3]), "indices": np.array([2, 7, 5])}, "non-empty"),
        ({"recipient_party": 1}, "another client"),
    ]:
        with pytest.raises(PayloadError, match=match):
            frame(dataclasses.replace(ok, **fields))
    with pytest.raises(PayloadError, match="itself"):
        decode_message(_swap_bytes(frame(ok), _i8(2, 7, 5, 5), _i8(7, 2, 5, 5)))
    terms_fields = {"mechanism": "gaussian", "dim": 8, "seed": 0, "bits": 0, "low": -1.0, "high": 1.0}
    for eps, delta in ((0.0, 1e-5), (-1.0, 1e-5), (1.0, 0.0), (1.0, 1.0)):
        with pytest.raises(PayloadError, match="DP terms"):
            frame(PrivacyTerms(**{**terms_fields, "epsilon": eps, "delta": delta}, **HDR))
    with pytest.raises(PayloadError, match="unknown DP mechanism"):
        frame(PrivacyTerms(**{**terms_fields, "mechanism": "laplace", "epsilon": 1.0, "delta": 1e-5}, **HDR))
    with pytest.raises(PayloadError, match="low < high"):
        frame(PrivacyTerms(**{**terms_fields, "low": 1.0, "epsilon": 1.0, "delta": 1e-5}, **HDR))
    terms = frame(sample(PrivacyTerms))
    at = terms.index(np.array(4.0, ">f8").tobytes())
    for bad in (float("nan"), float("inf"), 0.0):  # received: refused as a whole
        with pytest.raises(PayloadError):
            decode_message(terms[:at] + np.array(bad, ">f8").tobytes() + terms[at + 8 :])
    with pytest.raises(PayloadError):
        frame(FeatureUpload(target=2, items=(), **HDR))
    nb = {"neighbours": np.array([[1, 4, 7, 8], [4, 1, 9, 8]]), "owners": np.zeros((2, 4), np.int64)}
    with pytest.raises(PayloadError):
        frame(
            EncodingBases(
                bucket=0, variant="vector", n=4, nodes=np.array([1, 4]), p=np.zeros((2, 3, 3)), **nb, **HDR
            )
        )


def test_bases_carry_a_known_variant_name_and_q_exactly_for_the_matrix_variant():
    rng = np.random.default_rng(1)
    p = rng.standard_normal((2, 6, 3))
    bases = {
        "bucket": 0,
        "n": 3,
        "nodes": np.array([1, 4]),
        "neighbours": np.array([[1, 2, 3], [4, 5, 6]]),
        "owners": np.zeros((2, 3), np.int64),
        "p": p,
        **HDR,
    }
    with pytest.raises(PayloadError, match="unknown variant 'tensor'"):
        frame(EncodingBases(variant="tensor", **bases))
    with pytest.raises(PayloadError, match="q must be present exactly for the matrix variant"):
        frame(EncodingBases(variant="matrix", **bases))
    with pytest.raises(PayloadError, match="q must be present exactly for the matrix variant"):
        frame(EncodingBases(variant="vector", q=p, **bases))
    got = decode_message(frame(EncodingBases(variant="matrix", q=p, **bases)))
    assert got.variant == "matrix" and type(got.variant) is str  # the wire carries the name


def _swap_bytes(data: bytes, old: bytes, new: bytes) -> bytes:
    """``data`` with the one occurrence of ``old`` replaced by ``new`` (same length; unsigned: decoding
    checks values, not signatures)."""
    assert len(old) == len(new) and data.count(old) == 1
    return data.replace(old, new)


def _i8(*values) -> bytes:
    return np.array(values, dtype="<i8").tobytes()


def test_key_set_up_messages_check_their_values_on_both_sides():
    ka = sample(KeyAnnounce)
    for field, size in (
        ("hpke", HPKE_PUBLIC),
        ("ed25519", 32),
        ("context_fingerprint", 32),
        ("binding_signature", 64),
    ):
        for bad in (b"x" * (size - 1), b"x" * (size + 1)):
            with pytest.raises(PayloadError, match=field):
                frame(dataclasses.replace(ka, **{field: bad}))
    # a context under another fingerprint, sent or received
    pc = sample(PublicContext)
    with pytest.raises(KeyFingerprintError):
        frame(dataclasses.replace(pc, context=b"contexT"))
    with pytest.raises(KeyFingerprintError):
        decode_message(_swap_bytes(frame(pc), b"context", b"contexT"))
    huge = bytes(8 * 1024 * 1024 + 1)
    with pytest.raises(SizeLimitError):
        frame(dataclasses.replace(pc, context=huge, context_fingerprint=hashlib.sha256(huge).digest()))
    # sealed check keys: one entry per distinct owner, each at most 2 KiB
    sk = sample(SealedCheckKeys)
    for fields in ({"owners": np.array([0])}, {"owners": np.array([0, 0])}, {"owners": np.array([-1, 2])}):
        with pytest.raises(PayloadError, match="owner"):
            frame(dataclasses.replace(sk, **fields))
    with pytest.raises(PayloadError):
        decode_message(_swap_bytes(frame(sk), _i8(0, 2), _i8(2, 2)))
    with pytest.raises(SizeLimitError):
        frame(dataclasses.replace(sk, sealed=(b"a" * 2049, b"b")))
    with pytest.raises(SizeLimitError):
        frame(dataclasses.replace(sk, owners=np.arange(4097), sealed=(b"a",) * 4097))
    # the roster: increasing party ids, at least one
    rr = sample(RosterReady)
    for bad in (np.zeros(0, np.int64), np.array([0, 2, 1]), np.array([1, 1]), np.array([-1, 0])):
        with pytest.raises(PayloadError, match="increasing"):
            frame(dataclasses.replace(rr, participants=bad))
    with pytest.raises(PayloadError, match="increasing"):
        decode_message(_swap_bytes(frame(rr), _i8(0, 1, 2), _i8(0, 2, 1)))
    # an upload grant: increasing party ids too, at most 4096
    grant = sample(UploadGrant)
    assert decode_message(frame(grant)) == grant
    for bad in (np.zeros(0, np.int64), np.array([3, 1]), np.array([1, 1]), np.array([-1, 0])):
        with pytest.raises(PayloadError, match="increasing"):
            frame(dataclasses.replace(grant, recipients=bad))
    with pytest.raises(PayloadError, match="increasing"):
        decode_message(_swap_bytes(frame(grant), _i8(1, 3), _i8(3, 1)))
    with pytest.raises(SizeLimitError):
        frame(dataclasses.replace(grant, recipients=np.arange(4097)))


def test_edge_claims_are_sorted_distinct_edges_with_0_1_flags():
    ec = sample(EdgeClaims)
    assert decode_message(frame(ec)) == ec
    bad_cases = {
        "k >= 1": {"edges": np.zeros((0, 2), np.int64), "uses": np.zeros(0, np.int64)},
        "one uses flag": {"uses": np.array([1, 0])},
        "(k, 2)": {"edges": np.array([[2, 7, 1], [2, 9, 1], [5, 7, 1]])},
        "0 or 1": {"uses": np.array([1, 2, 0])},
        "u32": {"edges": np.array([[-2, 7], [2, 9], [5, 7]])},
        "sorted": {"edges": np.array([[2, 9], [2, 7], [5, 7]])},
        "distinct": {"edges": np.array([[2, 7], [2, 7], [5, 7]])},
        "another client": {"peer": 1},
    }
    for match, fields in bad_cases.items():
        with pytest.raises(PayloadError, match=match if match != "(k, 2)" else r"\(k, 2\)"):
            frame(dataclasses.replace(ec, **fields))
    big = dataclasses.replace(ec, edges=np.array([[2, 7], [2, 9], [5, 2**32]]))
    with pytest.raises(PayloadError, match="u32"):
        frame(big)
    # received: unsorted edges, a flag of 2
    data = frame(ec)
    with pytest.raises(PayloadError, match="sorted"):
        decode_message(_swap_bytes(data, _i8(2, 7, 2, 9), _i8(2, 9, 2, 7)))
    with pytest.raises(PayloadError, match="0 or 1"):
        decode_message(_swap_bytes(data, _i8(1, 0, 1), _i8(1, 2, 1)))


def test_uploads_and_bases_name_their_target_neighbours_and_owners():
    fu = sample(FeatureUpload)
    got = decode_message(frame(fu))
    assert got.target == 2 and got == fu
    with pytest.raises(PayloadError, match="fit in 32"):
        frame(dataclasses.replace(fu, target=2**32))
    eb = sample(EncodingBases)
    got = decode_message(frame(eb))
    assert np.array_equal(got.neighbours, eb.neighbours) and np.array_equal(got.owners, eb.owners)
    for fields, match in (
        ({"neighbours": eb.neighbours[:, :2]}, "neighbours and owners must have shape"),
        ({"owners": eb.owners[:1]}, "neighbours and owners must have shape"),
        ({"neighbours": eb.neighbours[:, ::-1].copy()}, "start with the node itself"),
    ):
        with pytest.raises(PayloadError, match=match):
            frame(dataclasses.replace(eb, **fields))
    with pytest.raises(PayloadError, match="start with the node itself"):  # received
        decode_message(_swap_bytes(frame(eb), _i8(1, 4, 7, 4, 1, 9), _i8(7, 4, 1, 4, 1, 9)))


def test_verifier_checks_sender_signature_recipient_session_and_sequence():
    msg = sample(UploadDone)
    data = frame(msg)
    v = Verifier(ROSTER, me=3, session=SESSION)
    v.check(decode_message(data))
    with pytest.raises(SignatureError):  # signed by the wrong key
        v.check(decode_message(frame(msg, OTHER)))
    with pytest.raises(SignatureError):
        v.check(msg)  # a locally built message has no signature
    flipped = bytearray(data)
    flipped[-1] ^= 0x01
    with pytest.raises(SignatureError):
        v.check(decode_message(bytes(flipped)))
    with pytest.raises(AuthError):
        v.check(decode_message(frame(UploadDone(nodes=1, ciphertexts=1, **{**HDR, "sender": 9}))))
    with pytest.raises(WrongRecipientError):
        Verifier(ROSTER, me=2, session=SESSION).check(decode_message(data))
    with pytest.raises(ReplayError):
        Verifier(ROSTER, me=3, session=SESSION + 1).check(decode_message(data))
    v.commit(decode_message(data))
    with pytest.raises(ReplayError):
        v.check(decode_message(data))
    v.check(decode_message(frame(UploadDone(nodes=1, ciphertexts=1, **{**HDR, "seq": 6}))))


@pytest.mark.parametrize("msg", samples(), ids=lambda m: m.type_name)
def test_the_signature_covers_the_digest_of_header_and_payload(msg):
    """Version 14 signs ``SIGNING_PREFIX + SHA-256(header + payload)``, where each ciphertext's bytes
    before the SHA-256 that ends them are left out of the hash (that digest covers them); the frame's
    bytes are those of version 13. A version-13 style signature (over the hash of every byte) is
    refused, as is a version-6 one (Ed25519 over the bytes)."""
    data = frame(msg)
    head = HEADER.pack(
        b"FGAT",
        VERSION,
        type(msg).TYPE,
        msg.sender,
        msg.recipient,
        msg.session,
        msg.seq,
        msg.fingerprint,
        len(data) - HEADER.size - SIGNATURE_SIZE,
    )
    pieces: list = []
    for name, codec in type(msg).SCHEMA:
        codec.encode(getattr(msg, name), pieces, name)
    body = b"".join([head, *pieces])
    assert data[:-SIGNATURE_SIZE] == body
    kept, at = [], 0  # the hashed bytes, found here without the codec's ranges
    for ct in ciphertexts(msg):
        start = body.index(ct, at)
        kept.append(body[at:start])
        at = start + len(ct) - 32
    digest = hashlib.sha256(b"".join([*kept, body[at:]])).digest()
    assert decode_message(data).signed_digest == digest
    assert signing_input(digest) == SIGNING_PREFIX + digest
    assert len(signing_input(digest)) < HEADER.size  # never a frame of an earlier version
    assert data[-SIGNATURE_SIZE:] == SIGNER.sign(signing_input(digest))  # Ed25519 is deterministic
    verify(SIGNER.public_bytes(), signing_input(digest), data[-SIGNATURE_SIZE:])
    v = Verifier(ROSTER, me=3, session=SESSION)
    v.check(decode_message(data))
    with pytest.raises(SignatureError):  # signed the version-6 way
        v.check(decode_message(body + SIGNER.sign(body)))
    v13 = decode_message(body + SIGNER.sign(b"FGAT-frame-sha256\x00" + hashlib.sha256(body).digest()))
    with pytest.raises(SignatureError):  # another prefix (and, with ciphertexts, another digest)
        v.check(v13)


def test_a_ciphertext_is_bound_by_its_digest_and_the_signature_by_those_digests():
    """Flip a byte of a ciphertext: decoding refuses it (its own SHA-256 no longer matches, before any
    signature check). Replace a ciphertext and its digest together (the digest recomputed): the
    frame decodes, and the signature, which covers the old digest, refuses it."""
    msg = sample(EncodingResults)
    data = bytearray(frame(msg))
    ct = msg.items[0].row_blobs[1]
    at = bytes(data).index(ct)
    flipped = bytearray(data)
    flipped[at + 5] ^= 1
    with pytest.raises(SignatureError, match="do not match their SHA-256 digest"):
        decode_message(bytes(flipped))
    other = env(b"c" * 1100)  # the same length, a consistent digest
    resealed = bytes(data[:at]) + other + bytes(data[at + len(ct) :])
    forged = decode_message(resealed)
    assert forged.items[0].row_blobs[1] == other
    with pytest.raises(SignatureError):
        Verifier(ROSTER, me=3, session=SESSION).check(forged)
    Verifier(ROSTER, me=3, session=SESSION).check(decode_message(bytes(data)))
    # a ciphertext under 1 KiB (below any preset's) is refused before it is hashed, sent or received
    tiny = EncodingResults(bucket=2, items=(ResultItem(4, 0, (b"t" * 990 + bytes(32),)),), **HDR)
    with pytest.raises(SizeLimitError, match=r"1022 bytes, not in \[1 KiB, 4 MiB\]"):
        frame(tiny)
    good = frame(dataclasses.replace(tiny, items=(ResultItem(4, 0, (env(b"t"),)),)))
    at = good.index(env(b"t")) - 4
    small = good[:at] + struct.pack(">I", 1022) + good[at + 4 : at + 4 + 1022] + good[at + 4 + 1056 :]
    small = small[:63] + struct.pack(">I", len(small) - HEADER.size - SIGNATURE_SIZE) + small[67:]
    with pytest.raises(SizeLimitError, match=r"declared 1022 bytes"):
        decode_message(small)


@pytest.mark.parametrize("msg", samples(), ids=lambda m: m.type_name)
def test_any_single_bit_flip_is_rejected(msg):
    data = frame(msg)
    v = Verifier(ROSTER, me=3, session=SESSION)
    for pos in range(0, len(data), max(1, len(data) // 97)):
        for bit in (0, 7):
            flipped = bytearray(data)
            flipped[pos] ^= 1 << bit
            with pytest.raises(ProtocolError):
                v.check(decode_message(bytes(flipped)))


def test_flips_in_signed_header_fields_and_payload_are_signature_errors():
    data = frame(sample(FeatureUpload))
    v = Verifier(ROSTER, me=3, session=SESSION)
    payload = (data.index(b"ct0"), data.index(b"ct1") + 2)  # inside the ciphertext bytes
    # sender 1 -> 3 (a known party), recipient, session, seq, fingerprint, payload
    for pos, mask in (
        (10, 0x02),
        (11, 0x10),
        (15, 0x10),
        (23, 0x10),
        (30, 0x01),
        (31, 0x10),
        (50, 0x80),
        *((p, 0x10) for p in payload),
    ):
        flipped = bytearray(data)
        flipped[pos] ^= mask
        with pytest.raises(SignatureError):
            v.check(decode_message(bytes(flipped)))
    unknown = bytearray(data)
    unknown[7] ^= 0x10
    with pytest.raises(AuthError):
        v.check(decode_message(bytes(unknown)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_fuzz_random_bytes(data):
    try:
        decode_message(data)
    except ProtocolError:
        pass


FRAMES = [frame(m) for m in samples()]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_mutated_frames(data):
    raw = bytearray(data.draw(st.sampled_from(FRAMES)))
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "set", "cut", "insert"]))
        pos = data.draw(st.integers(0, max(0, len(raw) - 1)))
        if kind == "flip" and raw:
            raw[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set" and raw:
            raw[pos] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            del raw[pos:]
        else:
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        msg = decode_message(bytes(raw))
    except ProtocolError:
        return
    try:  # what decodes must still fail or pass verification cleanly
        Verifier(ROSTER, me=3, session=SESSION).check(msg)
    except ProtocolError:
        pass
