"""Key set-up without a dealer (:mod:`fedgat.protocols.pretrain_keys`): each client's HPKE session
keys, its signed key announcement, its public CKKS context checked against the announced
fingerprint, and check keys sealed to each owner that neither the server nor another owner can read
or replace."""

from __future__ import annotations

import dataclasses
import hashlib
import pickle

import numpy as np
import pytest

from fedgat.crypto import KeyHolderContext, SigningIdentity
from fedgat.crypto.tags import CheckKeys
from fedgat.protocols import (
    AuthError,
    KeyAnnounce,
    KeyFingerprintError,
    PayloadError,
    PublicContext,
    Roster,
    SealedCheckKeys,
    SignatureError,
)
from fedgat.protocols.messages import key_binding_bytes, sealed_keys_bytes
from fedgat.protocols.messages_pretrain import HPKE_PUBLIC
from fedgat.protocols.pretrain_keys import (
    SessionKeys,
    check_announce,
    load_public_context,
    open_check_keys,
    seal_check_keys,
)

SESSION = 123
#: the round's key-set fingerprint both sides hold (keyset_fingerprint of the roster's keys)
KEYSET = bytes(range(32))
SIGNERS = {p: SigningIdentity.generate() for p in range(4)}
ROSTER = Roster(server=3, clients=(0, 1, 2), signing_keys={p: s.public_bytes() for p, s in SIGNERS.items()})
HDR = {"sender": 3, "recipient": 0, "session": SESSION, "seq": 1}


@pytest.fixture(scope="module")
def holders() -> dict[int, KeyHolderContext]:
    return {c: KeyHolderContext.generate("n4096") for c in (1, 2)}


@pytest.fixture(scope="module")
def hpke() -> dict[int, SessionKeys]:
    return {c: SessionKeys.generate() for c in (0, 1, 2)}


def announce(
    party: int, keys: SessionKeys, fp: bytes, *, signer: int | None = None, **override
) -> KeyAnnounce:
    fields = {
        "party": party,
        "hpke": keys.public_bytes(),
        "ed25519": ROSTER.signing_key(party),
        "context_fingerprint": fp,
    }
    fields.update(override)
    sig = SIGNERS[party if signer is None else signer].sign(
        key_binding_bytes(
            SESSION, fields["party"], fields["hpke"], fields["ed25519"], fields["context_fingerprint"]
        )
    )
    return KeyAnnounce(**HDR, **fields, binding_signature=override.get("binding_signature", sig))


# ---------------------------------------------------------------------------------- session keys
def test_session_keys_are_fresh_sized_and_never_pickled():
    a, b = SessionKeys.generate(), SessionKeys.generate()
    assert len(a.public_bytes()) == HPKE_PUBLIC == 1216 and a.public_bytes() != b.public_bytes()
    again = SessionKeys.from_private_bytes(a.private_bytes())
    assert again.public_bytes() == a.public_bytes() and len(a.private_bytes()) == 96
    with pytest.raises(ValueError):
        SessionKeys.from_private_bytes(a.private_bytes()[:-1])
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(a)
    assert "private" in repr(a) and a.private_bytes().hex() not in repr(a)


# ------------------------------------------------------------------------------- key announcement
def test_a_signed_announcement_is_accepted_and_any_substitution_refused(hpke, holders):
    fp = holders[1].fingerprint()
    ok = announce(1, hpke[1], fp)
    check_announce(ok, ROSTER, SESSION)
    # the server (or anyone) substitutes the HPKE key, the context fingerprint, the party
    for change in ({"hpke": hpke[2].public_bytes()}, {"context_fingerprint": holders[2].fingerprint()}):
        with pytest.raises(SignatureError, match="party 1"):
            check_announce(dataclasses.replace(ok, **change), ROSTER, SESSION)
    with pytest.raises(AuthError, match="not the roster's"):  # party 2's claimed with party 1's keys
        check_announce(dataclasses.replace(ok, party=2), ROSTER, SESSION)
    with pytest.raises(SignatureError):  # another session
        check_announce(ok, ROSTER, SESSION + 1)
    # signed by the server's key, with the server's key announced as the client's
    with pytest.raises(AuthError, match="not the roster's"):
        check_announce(announce(1, hpke[1], fp, signer=3, ed25519=ROSTER.signing_key(3)), ROSTER, SESSION)
    with pytest.raises(SignatureError):
        check_announce(announce(1, hpke[1], fp, signer=3), ROSTER, SESSION)
    # the server is no client
    with pytest.raises(AuthError, match="not a client"):
        check_announce(announce(3, hpke[1], fp), ROSTER, SESSION)
    # a malformed HPKE key, validly signed by its client: refused as a payload
    mlkem_bad = b"\xff" * (HPKE_PUBLIC - 32) + hpke[1].public_bytes()[-32:]  # coefficients >= q
    with pytest.raises(PayloadError, match="malformed HPKE public key"):
        check_announce(announce(1, hpke[1], fp, hpke=mlkem_bad), ROSTER, SESSION)


# ------------------------------------------------------------------------------- public contexts
def _context_msg(holder: KeyHolderContext, party: int = 1, **override) -> PublicContext:
    fields = {
        "party": party,
        "preset": "n4096",
        "context": holder.public_context_bytes(),
        "context_fingerprint": holder.fingerprint(),
    }
    fields.update(override)
    return PublicContext(**HDR, **fields)


def test_a_public_context_must_be_the_announced_one(hpke, holders):
    announced = announce(1, hpke[1], holders[1].fingerprint())
    ctx = load_public_context(_context_msg(holders[1]), announced, "n4096")
    assert ctx.fingerprint() == holders[1].fingerprint() and not ctx.tenseal.has_secret_key()
    # another client's context (its own fingerprint, not the announced one)
    with pytest.raises(KeyFingerprintError, match="party 1"):
        load_public_context(_context_msg(holders[2]), announced, "n4096")
    # the announced fingerprint over other bytes
    with pytest.raises(KeyFingerprintError):
        load_public_context(
            _context_msg(holders[1], context=holders[2].public_context_bytes()), announced, "n4096"
        )
    with pytest.raises(PayloadError, match="preset"):
        load_public_context(_context_msg(holders[1], preset="n8192"), announced, "n4096")


def test_a_context_with_the_secret_key_is_refused_even_when_announced(hpke, holders):
    secret = holders[1].secret_context_bytes()
    fp = hashlib.sha256(secret).digest()
    announced = announce(1, hpke[1], fp)
    with pytest.raises(PayloadError, match="private part"):
        load_public_context(
            _context_msg(holders[1], context=secret, context_fingerprint=fp), announced, "n4096"
        )


# ---------------------------------------------------------------------------------- check keys
def _sealed(
    recipient: int, hpke: dict, keys: dict[int, CheckKeys], session: int = SESSION
) -> SealedCheckKeys:
    fields = seal_check_keys(
        session, recipient, SIGNERS[recipient], keys, {b: hpke[b].public_bytes() for b in keys}, KEYSET
    )
    return SealedCheckKeys(**HDR, **fields)


def test_each_owner_opens_exactly_its_own_check_keys(hpke):
    keys = {0: CheckKeys.generate(), 2: CheckKeys.generate()}
    msg = _sealed(1, hpke, keys)
    assert msg.owners.tolist() == [0, 2] and all(keys[0].prf not in s for s in msg.sealed)
    for b in (0, 2):
        assert open_check_keys(msg, b, hpke[b], ROSTER, SESSION, KEYSET) == keys[b]
    # the recipient itself, or an owner with no entry
    with pytest.raises(PayloadError, match="no other client"):
        open_check_keys(msg, 1, hpke[1], ROSTER, SESSION, KEYSET)
    only0 = _sealed(1, hpke, {0: keys[0]})
    with pytest.raises(PayloadError, match="no entry for party 2"):
        open_check_keys(only0, 2, hpke[2], ROSTER, SESSION, KEYSET)
    # owner 2 cannot open owner 0's entry, even relabelled and re-signed by the recipient
    relabel = SealedCheckKeys(
        **HDR,
        **{
            **seal_check_keys(SESSION, 1, SIGNERS[1], {0: keys[0]}, {0: hpke[0].public_bytes()}, KEYSET),
            "owners": np.array([2]),
        },
    )
    with pytest.raises(SignatureError):
        open_check_keys(relabel, 2, hpke[2], ROSTER, SESSION, KEYSET)


def test_the_relaying_server_can_neither_replace_nor_reorder_check_keys(hpke):
    keys = {0: CheckKeys.generate(), 2: CheckKeys.generate()}
    msg = _sealed(1, hpke, keys)
    # the server seals keys of its own choosing to owner 0 (it knows the public HPKE keys)
    rogue = _sealed(1, hpke, {0: CheckKeys.generate(), 2: keys[2]})
    swapped = dataclasses.replace(msg, sealed=(rogue.sealed[0], msg.sealed[1]))
    with pytest.raises(SignatureError, match="party 1"):
        open_check_keys(swapped, 0, hpke[0], ROSTER, SESSION, KEYSET)
    # entries swapped between owners
    with pytest.raises(SignatureError):
        open_check_keys(
            dataclasses.replace(msg, sealed=msg.sealed[::-1]), 0, hpke[0], ROSTER, SESSION, KEYSET
        )
    # one bit flipped inside an entry
    flipped = bytearray(msg.sealed[0])
    flipped[-1] ^= 1
    with pytest.raises(SignatureError):
        open_check_keys(
            dataclasses.replace(msg, sealed=(bytes(flipped), msg.sealed[1])),
            0,
            hpke[0],
            ROSTER,
            SESSION,
            KEYSET,
        )
    # signed by another client, or replayed into another session
    with pytest.raises(SignatureError):
        open_check_keys(
            dataclasses.replace(msg, keys_signature=SIGNERS[2].sign(b"x")),
            0,
            hpke[0],
            ROSTER,
            SESSION,
            KEYSET,
        )
    with pytest.raises(SignatureError):
        open_check_keys(msg, 0, hpke[0], ROSTER, SESSION + 1, KEYSET)
    # a validly signed entry that does not open (sealed to another HPKE key): AuthError
    wrong = SealedCheckKeys(
        **HDR, **seal_check_keys(SESSION, 1, SIGNERS[1], {0: keys[0]}, {0: hpke[2].public_bytes()}, KEYSET)
    )
    with pytest.raises(AuthError, match="do not open"):
        open_check_keys(wrong, 0, hpke[0], ROSTER, SESSION, KEYSET)
    # an entry sealed for this owner in another session (the HPKE info binds it), re-signed
    other = _sealed(1, hpke, {0: keys[0]}, session=SESSION + 1)
    resigned = SealedCheckKeys(
        **HDR,
        recipient_party=1,
        owners=other.owners,
        sealed=other.sealed,
        keys_signature=SIGNERS[1].sign(sealed_keys_bytes(SESSION, 1, other.sealed, other.owners, KEYSET)),
    )
    with pytest.raises(AuthError):
        open_check_keys(resigned, 0, hpke[0], ROSTER, SESSION, KEYSET)
    # signed over another key set: the server showed the recipient other participants than owner 0
    with pytest.raises(SignatureError, match="over this round's participants"):
        open_check_keys(msg, 0, hpke[0], ROSTER, SESSION, bytes(32))
    # the genuine message still opens
    assert open_check_keys(msg, 0, hpke[0], ROSTER, SESSION, KEYSET) == keys[0]
