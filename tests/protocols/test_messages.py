"""Framing: every message type round-trips; malformed, oversized and tampered frames are rejected with
the right ProtocolError subclass; decode_message never raises anything else (hypothesis)."""

from __future__ import annotations

import hashlib
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedgat.crypto import SigningIdentity
from fedgat.protocols import (
    MESSAGE_TYPES,
    Abort,
    AuthError,
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
    PayloadError,
    PrivacyTerms,
    ProtocolError,
    PublicContext,
    ReleaseUpload,
    ReplayError,
    ResultItem,
    Roster,
    SignatureError,
    SizeLimitError,
    SplitCounts,
    UnknownTypeError,
    UploadDone,
    UploadItem,
    Verifier,
    VersionError,
    WrappedKeyDelivery,
    WrongRecipientError,
    decode_message,
    encode_message,
)
from fedgat.protocols.messages import HEADER, SIGNATURE_SIZE

SIGNER = SigningIdentity.generate()
OTHER = SigningIdentity.generate()
SESSION = 77
FP = hashlib.sha256(b"context").digest()
HDR = {"sender": 1, "recipient": 3, "session": SESSION, "seq": 5, "fingerprint": FP}
ROSTER = Roster(
    server=3,
    dealer=0,
    clients=(0, 1, 2),
    signing_keys={
        0: OTHER.public_bytes(),
        1: SIGNER.public_bytes(),
        2: OTHER.public_bytes(),
        3: OTHER.public_bytes(),
    },
)


def samples() -> list:
    rng = np.random.default_rng(0)
    p = rng.standard_normal((2, 3, 3))
    return [
        KeyAnnounce(
            party=1,
            x25519=b"x" * 32,
            ed25519=b"e" * 32,
            binding_signature=b"s" * 64,
            **{**HDR, "fingerprint": bytes(32)},
        ),
        PublicContext(preset="n4096", context=b"context", context_fingerprint=FP, **HDR),
        WrappedKeyDelivery(dealer=0, target=1, key_fingerprint=FP, wrapped=b"w" * 100, **HDR),
        GraphAnnounce(
            dim=4, owned=np.array([2, 5]), indptr=np.array([0, 2, 3]), indices=np.array([2, 5, 5]), **HDR
        ),
        FeatureUpload(items=(UploadItem(2, 0, b"ct0"), UploadItem(5, 1, b"ct1")), **HDR),
        UploadDone(nodes=2, ciphertexts=4, **HDR),
        EncodingBases(bucket=0, variant="vector", n=3, nodes=np.array([1, 4]), p=p, **HDR),
        EncodingBases(
            bucket=1,
            variant="matrix",
            n=3,
            nodes=np.array([1, 4]),
            p=rng.standard_normal((2, 6, 3)),
            q=rng.standard_normal((2, 6, 3)),
            **HDR,
        ),
        EncodingResults(
            bucket=2, items=(ResultItem(4, (b"a", b"b")), ResultItem(7, (b"c",), (b"s",))), **HDR
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
        ReleaseUpload(items=(UploadItem(2, 0, b"rel0"),), **HDR),
        PrivacyTerms(epsilon=4.0, delta=1e-5, dim=64, seed=7, **HDR),
    ]


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
    data = frame(samples()[5])
    with pytest.raises(FrameError, match="magic"):
        decode_message(b"XGAT" + data[4:])
    with pytest.raises(VersionError):
        decode_message(_patch(data, 4, ">B", 2))
    with pytest.raises(UnknownTypeError):
        decode_message(_patch(data, 5, ">H", 999))
    with pytest.raises(UnknownTypeError):
        decode_message(_patch(data, 5, ">H", 0))
    with pytest.raises(SizeLimitError):
        decode_message(_patch(data, 63, ">I", 65))  # UploadDone allows 64 payload bytes
    with pytest.raises(FrameError):
        decode_message(_patch(data, 63, ">I", 7))


def test_oversize_declared_payload_is_refused_from_the_header_alone():
    head = HEADER.pack(b"FGAT", 1, FeatureUpload.TYPE, 1, 3, SESSION, 1, FP, 2**32 - 1)
    tracemalloc.start()
    try:
        with pytest.raises(SizeLimitError):
            decode_message(head)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


def _payload_frame(type_id: int, payload: bytes) -> bytes:
    return HEADER.pack(b"FGAT", 1, type_id, 1, 3, SESSION, 1, FP, len(payload)) + payload + bytes(64)


def test_field_limits_are_checked_before_reading():
    # FeatureUpload declaring 5000 items (limit 4096), with no item bytes behind
    with pytest.raises(SizeLimitError):
        decode_message(_payload_frame(FeatureUpload.TYPE, struct.pack(">I", 5000)))
    # one item whose ciphertext declares 2 GB
    item = struct.pack(">IIHI", 1, 2, 0, 2**31)
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
    ok = samples()[10]
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
    with pytest.raises(KeyFingerprintError):
        frame(PublicContext(preset="n4096", context=b"other", context_fingerprint=FP, **HDR))
    for eps, delta in ((0.0, 1e-5), (-1.0, 1e-5), (1.0, 0.0), (1.0, 1.0)):
        with pytest.raises(PayloadError, match="DP terms"):
            frame(PrivacyTerms(epsilon=eps, delta=delta, dim=8, seed=0, **HDR))
    terms = frame(samples()[-1])
    at = terms.index(np.array(4.0, ">f8").tobytes())
    for bad in (float("nan"), float("inf"), 0.0):  # received: refused as a whole
        with pytest.raises(PayloadError):
            decode_message(terms[:at] + np.array(bad, ">f8").tobytes() + terms[at + 8 :])
    with pytest.raises(PayloadError):
        frame(ReleaseUpload(items=(), **HDR))
    with pytest.raises(PayloadError):
        frame(
            EncodingBases(
                bucket=0, variant="vector", n=4, nodes=np.array([1, 4]), p=np.zeros((2, 3, 3)), **HDR
            )
        )


def test_bases_carry_a_known_variant_name_and_q_exactly_for_the_matrix_variant():
    rng = np.random.default_rng(1)
    p = rng.standard_normal((2, 6, 3))
    bases = {"bucket": 0, "n": 3, "nodes": np.array([1, 4]), "p": p, **HDR}
    with pytest.raises(PayloadError, match="unknown variant 'tensor'"):
        frame(EncodingBases(variant="tensor", **bases))
    with pytest.raises(PayloadError, match="q must be present exactly for the matrix variant"):
        frame(EncodingBases(variant="matrix", **bases))
    with pytest.raises(PayloadError, match="q must be present exactly for the matrix variant"):
        frame(EncodingBases(variant="vector", q=p, **bases))
    got = decode_message(frame(EncodingBases(variant="matrix", q=p, **bases)))
    assert got.variant == "matrix" and type(got.variant) is str  # the wire carries the name


def test_verifier_checks_sender_signature_recipient_session_and_sequence():
    msg = samples()[5]
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
    data = frame(samples()[4])
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
