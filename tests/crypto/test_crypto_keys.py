from __future__ import annotations

import pytest

from fedgat.crypto import (
    KeyHolderContext,
    KeyMismatchError,
    KeyUnwrapError,
    ServerContext,
    SignatureError,
    SigningIdentity,
    WrapAAD,
    WrappedKey,
    WrappingIdentity,
    unwrap_secret,
    verify,
    wrap_secret,
)

SECRET = b"secret tenseal context bytes" * 100


def flip(data: bytes, pos: int, bit: int = 0) -> bytes:
    out = bytearray(data)
    out[pos] ^= 1 << bit
    return bytes(out)


# ------------------------------------------------------------------------------------ signatures
def test_sign_verify_roundtrip() -> None:
    ident = SigningIdentity.generate()
    sig = ident.sign(b"message")
    assert len(sig) == 64 and len(ident.public_bytes()) == 32
    verify(ident.public_bytes(), b"message", sig)
    again = SigningIdentity.from_private_bytes(ident.private_bytes())
    assert again.public_bytes() == ident.public_bytes()


def test_flipped_bit_anywhere_fails() -> None:
    ident = SigningIdentity.generate()
    msg = b"round 3: ciphertext digest"
    sig = ident.sign(msg)
    pub = ident.public_bytes()
    for i in range(len(sig) * 8):
        with pytest.raises(SignatureError):
            verify(pub, msg, flip(sig, i // 8, i % 8))
    for i in range(len(msg) * 8):
        with pytest.raises(SignatureError):
            verify(pub, flip(msg, i // 8, i % 8), sig)
    for i in range(len(pub) * 8):
        with pytest.raises(SignatureError):
            verify(flip(pub, i // 8, i % 8), msg, sig)


def test_malformed_inputs_raise_signature_error() -> None:
    ident = SigningIdentity.generate()
    sig = ident.sign(b"x")
    with pytest.raises(SignatureError):
        verify(ident.public_bytes()[:31], b"x", sig)
    with pytest.raises(SignatureError):
        verify(ident.public_bytes(), b"x", sig[:63])
    with pytest.raises(SignatureError):
        verify(SigningIdentity.generate().public_bytes(), b"x", sig)


def test_identities_cannot_be_pickled() -> None:
    import pickle

    with pytest.raises(TypeError):
        pickle.dumps(SigningIdentity.generate())
    with pytest.raises(TypeError):
        pickle.dumps(WrappingIdentity.generate())


# ---------------------------------------------------------------------------------- key wrapping
@pytest.fixture(scope="module")
def parties():
    dealer = SigningIdentity.generate()
    alice = WrappingIdentity.generate()
    aad = WrapAAD("dealer", "alice", 7, bytes(range(32)))
    blob = wrap_secret(SECRET, alice.public_bytes(), aad, signer=dealer).to_bytes()
    return dealer, alice, aad, blob


def test_recipient_unwraps(parties) -> None:
    dealer, alice, aad, blob = parties
    assert unwrap_secret(blob, alice, aad, signer_public=dealer.public_bytes()) == SECRET
    assert unwrap_secret(WrappedKey.from_bytes(blob), alice.private_key, aad) == SECRET
    assert SECRET not in blob


def test_server_and_wrong_recipient_cannot_unwrap(parties) -> None:
    _, _, aad, blob = parties
    server_key = WrappingIdentity.generate()  # the server has no recipient private key
    with pytest.raises(KeyUnwrapError):
        unwrap_secret(blob, server_key, aad)
    bob = WrappingIdentity.generate()
    with pytest.raises(KeyUnwrapError):
        unwrap_secret(blob, bob, WrapAAD("dealer", "bob", 7, aad.key_fingerprint))


@pytest.mark.parametrize(
    "expected",
    [
        WrapAAD("dealer", "alice", 8, bytes(range(32))),  # wrong round
        WrapAAD("dealer", "alice", 7, bytes(32)),  # wrong fingerprint
        WrapAAD("mallory", "alice", 7, bytes(range(32))),  # wrong sender
        WrapAAD("dealer", "bob", 7, bytes(range(32))),  # wrong recipient
    ],
)
def test_wrong_aad_fields_fail(parties, expected) -> None:
    _, alice, _, blob = parties
    with pytest.raises(KeyUnwrapError):
        unwrap_secret(blob, alice, expected)


def test_rebinding_aad_in_blob_fails(parties) -> None:
    """Rewriting the AAD inside the blob to what the victim expects breaks the AEAD tag."""
    _, alice, aad, blob = parties
    w = WrappedKey.from_bytes(blob)
    other = WrapAAD("dealer", "alice", 8, aad.key_fingerprint)
    forged = WrappedKey(other, w.ephemeral_public, w.nonce, w.ciphertext)
    with pytest.raises(KeyUnwrapError):
        unwrap_secret(forged.to_bytes(), alice, other)


def test_tampered_byte_fails(parties) -> None:
    dealer, alice, aad, blob = parties
    step = max(1, len(blob) // 300)
    for pos in list(range(200)) + list(range(200, len(blob), step)) + [len(blob) - 1]:
        bad = flip(blob, pos)
        with pytest.raises(KeyUnwrapError):
            unwrap_secret(bad, alice, aad, signer_public=dealer.public_bytes())
        if pos < len(blob) - 65:  # outside the signature: the AEAD alone must catch it
            with pytest.raises(KeyUnwrapError):
                unwrap_secret(bad, alice, aad)


def test_truncated_and_garbage_fail(parties) -> None:
    _, alice, aad, blob = parties
    for n in (0, 3, 4, 10, 60, len(blob) // 2, len(blob) - 1):
        with pytest.raises(KeyUnwrapError):
            unwrap_secret(blob[:n], alice, aad)
    with pytest.raises(KeyUnwrapError):
        unwrap_secret(blob + b"\x00", alice, aad)


def test_signature_required_when_signer_given(parties) -> None:
    dealer, alice, aad, _ = parties
    unsigned = wrap_secret(SECRET, alice.public_bytes(), aad).to_bytes()
    with pytest.raises(KeyUnwrapError):
        unwrap_secret(unsigned, alice, aad, signer_public=dealer.public_bytes())
    # a server substituting its own secret, signed with its own key, is rejected
    server_sig = SigningIdentity.generate()
    forged = wrap_secret(b"server-chosen", alice.public_bytes(), aad, signer=server_sig).to_bytes()
    with pytest.raises(KeyUnwrapError):
        unwrap_secret(forged, alice, aad, signer_public=dealer.public_bytes())


def test_low_order_recipient_key_refused() -> None:
    aad = WrapAAD("dealer", "alice", 1, bytes(32))
    with pytest.raises(KeyUnwrapError):
        wrap_secret(SECRET, bytes(32), aad)


def test_wrap_aad_validation() -> None:
    with pytest.raises(ValueError):
        WrapAAD("", "alice", 1, bytes(32))
    with pytest.raises(ValueError):
        WrapAAD("a", "b", -1, bytes(32))
    with pytest.raises(TypeError):
        WrapAAD("a", "b", True, bytes(32))
    with pytest.raises(ValueError):
        WrapAAD("a", "b", 1, bytes(31))
    aad = WrapAAD("a", "bc", 2**64 - 1, bytes(range(32)))
    assert WrapAAD.decode(aad.encode()) == aad
    # the encoding is injective across field boundaries
    assert WrapAAD("ab", "c", 1, bytes(32)).encode() != WrapAAD("a", "bc", 1, bytes(32)).encode()


# --------------------------------------------------------------------------------- full recipe
def test_dealer_to_client_recipe(holder, server) -> None:
    dealer_sig = SigningIdentity.generate()
    alice = WrappingIdentity.generate()
    blob = holder.wrap_for(
        alice.public_bytes(), sender_id="dealer", recipient_id="alice", round_id=0, signer=dealer_sig
    )
    # the server relays `blob` but cannot open it
    expected = WrapAAD("dealer", "alice", 0, server.fingerprint())
    with pytest.raises(KeyUnwrapError):
        unwrap_secret(blob, WrappingIdentity.generate(), expected)
    client = KeyHolderContext.from_wrapped(blob, alice, expected, dealer_public=dealer_sig.public_bytes())
    assert client.fingerprint() == holder.fingerprint() == server.fingerprint()
    assert client.public_context_bytes() == holder.public_context_bytes()


def test_unwrapped_context_must_match_fingerprint(holder, other_holder) -> None:
    """A dealer that signs a wrap of key B while the AAD names key A is caught."""
    dealer_sig = SigningIdentity.generate()
    alice = WrappingIdentity.generate()
    aad = WrapAAD("dealer", "alice", 0, holder.fingerprint())
    blob = wrap_secret(
        other_holder.secret_context_bytes(), alice.public_bytes(), aad, signer=dealer_sig
    ).to_bytes()
    with pytest.raises(KeyMismatchError):
        KeyHolderContext.from_wrapped(blob, alice, aad, dealer_public=dealer_sig.public_bytes())
    ServerContext.from_bytes(other_holder.public_context_bytes())  # sanity: that key is valid
