r"""Secure aggregation maths and crypto (Bonawitz et al., CCS 2017, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning", its SecAgg protocol over a complete graph): fixed-point encoding
into :math:`\mathbb{Z}_{2^{128}}`, the masks and the PRG they come from, Shamir sharing of the
mask secrets, and sealing the shares to their recipient. No I/O, no state: the stages that use these
pieces are :mod:`~fedgat.protocols.secagg_client` and :mod:`~fedgat.protocols.secagg_server`, and
the protocol around them is :mod:`fedgat.protocols.fedavg`.

Group. A vector lives in :math:`\mathbb{Z}_{2^{128}}` as a ``(2, m)`` numpy ``uint64`` array (row 0
the low 64 bits, row 1 the high 64 bits); :func:`ring_add`, :func:`ring_neg`, :func:`ring_sub` are
vectorised with an explicit carry (numpy's unsigned arithmetic wraps modulo :math:`2^{64}`).

Fixed point (:func:`encode`, :func:`decode`). A real :math:`v` is the integer
:math:`\mathrm{round}(v \cdot 2^{F})`, :math:`F` = :data:`FRAC_BITS` = 48, in two's complement. A
client encodes :math:`(n_k w_k, n_k, n_k L_k)` (its weighted update, its weight, its weighted loss);
the server decodes the sum. Overflow bound: a sum of :math:`K` values decodes exactly when every
:math:`|v| < 2^{127 - F} / K = 2^{79} / K`; :func:`encode` refuses anything larger (or not finite)
with :class:`FixedPointOverflowError`, ``K`` being the number of possible summands (the roster's
clients). With :math:`|w| \le` ``MAX_WEIGHT_ABS`` :math:`= 10^6 < 2^{20}` and :math:`n_k \le 2^{22}`
(``MAX_NODES``), :math:`|n_k w_k| < 2^{42}`, so every admissible update fits for up to
:math:`2^{37}` clients. Rounding costs at most :math:`2^{-F-1} \approx 1.8 \cdot 10^{-15}` per client
and coordinate of :math:`\sum n_k w_k`, hence at most :math:`K \cdot 2^{-49} / \sum n_k` on the mean:
the secure mean equals the plaintext one to float64 rounding (~1e-16 relative; tested < 1e-9).

Masks. Client :math:`u` adds to its encoded input :math:`x_u` a self mask :math:`\mathrm{PRG}(b_u)`
and, for every other member :math:`v` of the round's set :math:`U_2`, :math:`\pm\mathrm{PRG}(s_{uv})`
(``+`` when :math:`u < v`), so the pairwise masks cancel in the sum:

* :math:`b_u` -- 16 random bytes (:func:`random_seed`, ``os.urandom``; never a seed);
* :math:`s_u` -- an X25519 key derived (HKDF-SHA256) from 16 random bytes, so that the secret to
  share is 16 bytes; :math:`s_{uv}` = HKDF-SHA256 of the X25519 agreement of :math:`s_u` with
  :math:`v`'s public key, bound to the session, the round, the pair, the vector length and the
  SHA-256 **digest of the global model** the client received (:func:`model_digest`): a server that
  sends different models to different clients gets masks that do not cancel -- noise, not a sum;
* PRG = ChaCha20 keystream (``cryptography``), 16 bytes per element.

Shares. :math:`s_u`'s and :math:`b_u`'s 16-byte seeds are split with Shamir (pycryptodome,
GF(:math:`2^{128}`), threshold :math:`t`, share index = position in the sorted cohort + 1) and
each pair of shares is sealed to its recipient's round key :math:`c_v` with HPKE (RFC 9180: X25519,
HKDF-SHA256, ChaCha20-Poly1305, ``cryptography``), the info string binding session, round, sender,
recipient and the digest of the cohort as the sender saw it (:func:`cohort_view`); inside, the
sender's Ed25519 signature over each share, its index, holder and view (:func:`dealt_bytes`) proves
who dealt it (HPKE's base mode alone does not authenticate the sender, and the shares travel
through the server); a holder reveals a share with its signature, so the server rebuilds a seed
from shares its dealer dealt, whatever another client reveals.

Consistency (:func:`confirm_bytes`). Before revealing anything each survivor signs the survivor set
it was told; a client reveals only with :math:`t` survivors' signatures over the same set and view
(Bonawitz et al.'s ConsistencyCheck round).
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from fedgat.crypto import SigningIdentity

from .errors import AuthError, PayloadError, check_signature

__all__ = [
    "FRAC_BITS",
    "MAX_COHORT",
    "MAX_SECAGG_ELEMS",
    "PART_COUNTS",
    "PART_UPDATE",
    "RING_BITS",
    "SEALED_SHARE_BYTES",
    "SEED_BYTES",
    "FixedPointOverflowError",
    "SecAggConfig",
    "advert_bytes",
    "b_commitment",
    "cohort_view",
    "combine_shares",
    "confirm_bytes",
    "dealt_bytes",
    "decode",
    "encode",
    "mask_input",
    "mask_key",
    "model_digest",
    "open_share",
    "pair_mask",
    "prg",
    "public_bytes",
    "random_seed",
    "ring_add",
    "ring_neg",
    "ring_sub",
    "ring_zeros",
    "seal_share",
    "self_mask",
    "split_secret",
    "unmask_sum",
]

RING_BITS = 128
#: fraction bits of the fixed-point encoding (resolution 2**-48 ~ 3.6e-15)
FRAC_BITS = 48
#: bytes of every secret that is Shamir-shared (pycryptodome's Shamir shares 16-byte secrets)
SEED_BYTES = 16
#: most clients in one secure-aggregation cohort (message list limits)
MAX_COHORT = 4096
#: most elements of one masked vector (model weights + 2): 2**24, i.e. 256 MiB on the wire
MAX_SECAGG_ELEMS = 1 << 24
#: bytes of one sealed pair of shares: HPKE enc (32) + index (2) + 2 shares (32) + a signature per
#: share (128) + tag (16)
SEALED_SHARE_BYTES = 32 + 2 + 2 * SEED_BYTES + 128 + 16

_SALT = b"fedgat/secagg/v1"
_SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)

#: the only source of secret randomness here (keys, b_u, s_u seeds); tests wrap it to count calls
_random_bytes = os.urandom


class FixedPointOverflowError(PayloadError):
    """A value that the fixed-point encoding cannot carry without the sum overflowing (or NaN/inf)."""


@dataclass(frozen=True)
class SecAggConfig:
    r"""Secure aggregation of the FedAvg updates (on by default; ``None`` in its place turns it off).

    Attributes:
        min_cohort: clients refuse a round whose cohort (sampled clients with valid signed key
            adverts) is smaller. Default 3: a server colluding with one client still faces the sum
            of at least two honest clients' updates.
        threshold_ratio: Shamir threshold :math:`t = \min(n, \max(3, \lceil r n \rceil,
            \lceil (n + m - 1)/2 \rceil))` for a cohort of :math:`n` and ``min_cohort`` :math:`m`
            (default :math:`r = 2/3`: :math:`t = \max(3, \lceil 2n/3 \rceil)` while
            :math:`m = 3`; :meth:`threshold`). A round goes on while at least :math:`t` clients
            answer each stage. Every share is bound to the cohort its dealer saw and every reveal to
            :math:`t` signed confirmations of one survivor set (frame version 11), so a server that
            shows clients different cohorts or survivor sets needs :math:`2t - n` colluding clients
            (at least :math:`\max(m - 1, \lceil n/3 \rceil)` at the default ratio) before two
            honest clients reveal for different sets: never fewer than a cohort of :math:`m` needs.
            A cohort whose members use different settings runs under the strictest (each advert
            carries its member's, signed: :meth:`agreed`).
    """

    min_cohort: int = 3
    threshold_ratio: float = 2 / 3

    def __post_init__(self) -> None:
        if not 2 <= self.min_cohort <= MAX_COHORT:
            raise ValueError(f"min_cohort must lie in [2, {MAX_COHORT}], got {self.min_cohort!r}")
        if not 0.5 < self.threshold_ratio <= 1:
            raise ValueError(f"threshold_ratio must lie in (1/2, 1], got {self.threshold_ratio!r}")

    def threshold(self, n: int) -> int:
        r"""Shamir threshold :math:`t` of a cohort of ``n`` clients:
        :math:`\min(n, \max(3, \lceil r n \rceil, \lceil (n + m - 1) / 2 \rceil))` for ``min_cohort``
        :math:`m`. The last term makes :math:`2t - n \ge m - 1`: splitting the survivors into two
        groups that each confirm their own set (one revealing a client's self mask, the other its
        mask key) takes :math:`2t - n` colluders, never fewer than the :math:`m - 1` that a cohort
        of :math:`m` needs to leave one client alone in the sum (a ninth review pass split a cohort
        of six at ``min_cohort`` 5 with two colluders, and one of five at ratio 0.6 with one)."""
        split = math.ceil((n + self.min_cohort - 1) / 2)
        share = math.ceil(Fraction(self.threshold_ratio) * n)  # exact: never below the float's r n
        return min(n, max(3, share, split))

    @classmethod
    def agreed(cls, adverts: Iterable[Any]) -> SecAggConfig:
        """The settings a cohort runs under: the largest ``min_cohort`` and ``threshold_ratio`` its
        signed adverts carry (each member and the server compute the same :meth:`threshold`, never
        below any member's own).

        Raises:
            PayloadError: an advert's settings are not valid ones.
        """
        items = list(adverts)
        try:
            for a in items:
                cls(int(a.min_cohort), float(a.threshold_ratio))
        except ValueError as exc:
            raise PayloadError(f"an advert carries invalid secure-aggregation settings ({exc})") from None
        return cls(max(int(a.min_cohort) for a in items), max(float(a.threshold_ratio) for a in items))

    def to_value(self) -> dict[str, Any]:
        return {"min_cohort": self.min_cohort, "threshold_ratio": self.threshold_ratio}

    @classmethod
    def from_value(cls, value: Mapping[str, Any] | None) -> SecAggConfig | None:
        if value is None:
            return None
        return cls(int(value["min_cohort"]), float(value["threshold_ratio"]))


def random_seed(size: int = SEED_BYTES) -> bytes:
    """``size`` (16) fresh secret bytes from the operating system's CSPRNG."""
    return _random_bytes(size)


# ------------------------------------------------------------------------------ Z_{2^128} vectors
def ring_zeros(m: int) -> np.ndarray:
    return np.zeros((2, m), dtype=np.uint64)


def ring_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b`` modulo :math:`2^{128}` (``(2, m)`` uint64 arrays, low row first)."""
    lo = a[0] + b[0]
    hi = a[1] + b[1] + (lo < a[0]).astype(np.uint64)
    return np.stack([lo, hi])


def ring_neg(a: np.ndarray) -> np.ndarray:
    """``-a`` modulo :math:`2^{128}` (two's complement)."""
    lo = (a[0] ^ _M64) + np.uint64(1)
    hi = (a[1] ^ _M64) + (lo == 0).astype(np.uint64)
    return np.stack([lo, hi])


def ring_sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return ring_add(a, ring_neg(b))


def encode(values: np.ndarray, summands: int) -> np.ndarray:
    """Fixed-point encoding of float64 ``values`` (see the module docstring) for a sum of at most
    ``summands`` such vectors.

    Raises:
        FixedPointOverflowError: a value that is not finite or has :math:`|v| \\ge 2^{79}/`
            ``summands``.
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(v)):
        raise FixedPointOverflowError("the update holds NaN or infinite values; it cannot be encoded")
    limit = math.ldexp(1.0, RING_BITS - 1 - FRAC_BITS) / max(1, int(summands))
    peak = float(np.max(np.abs(v))) if v.size else 0.0
    if peak >= limit:
        raise FixedPointOverflowError(
            f"|value| = {peak:.3g} reaches the fixed-point bound 2^{RING_BITS - 1 - FRAC_BITS}/{summands} = "
            f"{limit:.3g}: a sum of {summands} such values could overflow Z_2^{RING_BITS}"
        )
    x = np.rint(np.ldexp(v, FRAC_BITS))  # integers, exactly, below 2**127 in magnitude
    mag = np.abs(x)
    hi = np.floor(np.ldexp(mag, -64))
    lo = mag - np.ldexp(hi, 64)  # exact: 0 <= lo < 2**64
    out = np.stack([lo.astype(np.uint64), hi.astype(np.uint64)])
    neg = x < 0
    if neg.any():
        out[:, neg] = ring_neg(out[:, neg])
    return out


def decode(a: np.ndarray) -> np.ndarray:
    """Inverse of :func:`encode` for a (summed) vector: float64 values (two's complement, signed)."""
    neg = (a[1] >> np.uint64(63)).astype(bool)
    mag = a.copy()
    if neg.any():
        mag[:, neg] = ring_neg(a[:, neg])
    out = np.ldexp(mag[1].astype(np.float64), 64) + mag[0].astype(np.float64)
    out[neg] = -out[neg]
    return np.ldexp(out, -FRAC_BITS)


# ------------------------------------------------------------------------------------ PRG and keys
def _hkdf(secret: bytes, info: bytes, length: int = 32) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=_SALT, info=info).derive(secret)


def _context(session: int, round_: int) -> bytes:
    return struct.pack(">QI", session, round_)


def prg(key: bytes, m: int) -> np.ndarray:
    """``m`` pseudo-random elements of :math:`\\mathbb{Z}_{2^{128}}`: the ChaCha20 keystream of the
    32-byte ``key`` (zero nonce: every key is used once)."""
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    stream = encryptor.update(bytes(16 * m)) + encryptor.finalize()
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64).reshape(2, m)


def mask_key(seed: bytes, session: int, round_: int, party: int) -> X25519PrivateKey:
    """The X25519 mask key :math:`s_u` of ``party`` derived from its 16-byte shared seed."""
    raw = _hkdf(bytes(seed), b"mask-key" + _context(session, round_) + struct.pack(">I", party))
    return X25519PrivateKey.from_private_bytes(raw)


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def self_mask(b_seed: bytes, session: int, round_: int, party: int, m: int) -> np.ndarray:
    """:math:`\\mathrm{PRG}(b_u)` for ``party``."""
    info = b"self-mask" + _context(session, round_) + struct.pack(">IQ", party, m)
    return prg(_hkdf(bytes(b_seed), info), m)


def pair_mask(
    key: X25519PrivateKey,
    peer_public: bytes,
    session: int,
    round_: int,
    u: int,
    v: int,
    digest: bytes,
    m: int,
) -> np.ndarray:
    """:math:`\\mathrm{PRG}(s_{uv})` from ``u``'s mask key and ``v``'s public one (symmetric in u, v).

    Raises:
        PayloadError: a public key that is not a usable X25519 point (low order: zero agreement).
    """
    try:
        shared = key.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    except ValueError as exc:
        raise PayloadError(f"party {v}'s mask key is not a usable X25519 public key ({exc})") from exc
    a, b = sorted((u, v))
    info = b"pair-mask" + _context(session, round_) + struct.pack(">IIQ", a, b, m) + bytes(digest)
    return prg(_hkdf(shared, info), m)


def mask_input(
    x: np.ndarray,
    b_seed: bytes,
    key: X25519PrivateKey,
    me: int,
    peers: Mapping[int, bytes],
    session: int,
    round_: int,
    digest: bytes,
) -> np.ndarray:
    """Client ``me``'s masked input :math:`y = x + \\mathrm{PRG}(b) + \\sum_{v} \\pm \\mathrm{PRG}(s_{uv})`
    over ``peers`` (party -> mask public key), ``+`` for peers above ``me``."""
    m = x.shape[1]
    y = ring_add(x, self_mask(b_seed, session, round_, me, m))
    for v, pk in peers.items():
        p = pair_mask(key, pk, session, round_, me, v, digest, m)
        y = ring_add(y, p) if me < v else ring_sub(y, p)
    return y


def unmask_sum(
    masked: Mapping[int, np.ndarray],
    b_seeds: Mapping[int, bytes],
    dropped: Mapping[int, X25519PrivateKey],
    mask_publics: Mapping[int, bytes],
    session: int,
    round_: int,
    digest: bytes,
) -> np.ndarray:
    """The server's unmasking: :math:`\\sum_v y_v - \\sum_v \\mathrm{PRG}(b_v)` minus the pairwise
    masks the survivors ``v`` (keys of ``masked``) added for the ``dropped`` clients ``u`` (their
    reconstructed mask keys), i.e. :math:`\\sum_{v} x_v` when everyone followed the protocol."""
    m = next(iter(masked.values())).shape[1]
    total = ring_zeros(m)
    for v, y in masked.items():
        total = ring_sub(ring_add(total, y), self_mask(b_seeds[v], session, round_, v, m))
    for u, key in dropped.items():
        for v in masked:
            p = pair_mask(key, mask_publics[v], session, round_, u, v, digest, m)
            total = ring_sub(total, p) if v < u else ring_add(total, p)
    return total


# ------------------------------------------------------------------------------- digests, adverts
def model_digest(arrays: Mapping[str, np.ndarray]) -> bytes:
    """SHA-256 of a model's weights as they travel (names, dtypes, shapes, little-endian bytes, in
    order): what the server sent and what a client received hash alike."""
    h = hashlib.sha256(b"fedgat/model-digest/v1")
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        raw = name.encode("utf-8")
        h.update(struct.pack(">H", len(raw)) + raw + a.dtype.str.encode() + struct.pack(">B", a.ndim))
        h.update(b"".join(struct.pack(">Q", int(d)) for d in a.shape))
        h.update(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    return h.digest()


def b_commitment(b_seed: bytes, session: int, round_: int, party: int) -> bytes:
    """SHA-256 commitment to :math:`b_u` (published in the advert; the server checks its reconstruction)."""
    return hashlib.sha256(
        b"fedgat/secagg/b-commit/v1" + _context(session, round_) + struct.pack(">I", party) + bytes(b_seed)
    ).digest()


#: what a client's masked input carries (:attr:`SecAggAdvert.parts`, a bit set): its update (it
#: trains this round), its evaluation counts (it evaluates)
PART_UPDATE, PART_COUNTS = 1, 2


def advert_bytes(
    session: int,
    round_: int,
    party: int,
    c_pk: bytes,
    s_pk: bytes,
    b_commit: bytes,
    digest: bytes,
    parts: int,
    min_cohort: int,
    threshold_ratio: float,
) -> bytes:
    """What a client signs to bind its round keys, its :math:`b_u` commitment, the model digest, the
    parts its input carries (:data:`PART_UPDATE`, :data:`PART_COUNTS`) and its secure-aggregation
    settings (``min_cohort``, ``threshold_ratio``) to its roster identity (the advert is relayed by
    the server, which cannot forge it). Every member thus knows who adds what to the sum (a sixth
    review pass filled a valid cohort with members that contribute zeros; frame version 10) and
    every member computes the same threshold, from the strictest settings of the cohort
    (:meth:`SecAggConfig.agreed`; a tenth pass split the survivors of a cohort whose members used
    different thresholds with fewer colluders than the strictest setting allows)."""
    return (
        b"fedgat/secagg/advert/v3"
        + _context(session, round_)
        + struct.pack(">IBId", party, parts, min_cohort, threshold_ratio)
        + bytes(c_pk)
        + bytes(s_pk)
        + bytes(b_commit)
        + bytes(digest)
    )


# -------------------------------------------------------------------------------------- Shamir
def split_secret(secret: bytes, t: int, n: int) -> list[bytes]:
    """``n`` Shamir shares (indices 1..n, in order) of a 16-byte ``secret``, any ``t`` of which
    reconstruct it (pycryptodome; its polynomial coefficients come from the OS CSPRNG)."""
    shares = Shamir.split(t, n, bytes(secret), False)
    if [i for i, _ in shares] != list(range(1, n + 1)):
        raise AssertionError("unexpected Shamir share indices")
    return [bytes(s) for _, s in shares]


def combine_shares(shares: Sequence[tuple[int, bytes]]) -> bytes:
    """The 16-byte secret of ``t`` shares ``(index, share)`` (wrong shares give a wrong secret)."""
    return bytes(Shamir.combine([(int(i), bytes(s)) for i, s in shares], False))


# ------------------------------------------------------------------------------ sealed share pairs
_SHARE_BODY = struct.Struct(">H")


def cohort_view(adverts: Iterable[Any]) -> bytes:
    """SHA-256 of a cohort as one client saw it: every advert (party, keys, commitment, model digest,
    parts, settings, signature), by party. The shares a client deals and the survivor set it confirms are
    bound to it, so clients shown different cohorts cannot use each other's shares or confirmations
    (an eighth review pass showed the target a cohort of three, with threshold three, and everyone
    else one of nine, and rebuilt the target's self mask from the three; frame version 11)."""
    h = hashlib.sha256(b"fedgat/secagg/view/v1")
    for a in sorted(adverts, key=lambda a: a.party):
        h.update(struct.pack(">IBId", a.party, a.parts, a.min_cohort, a.threshold_ratio))
        for part in (a.c_pk, a.s_pk, a.b_commit, a.model_digest, a.signature):
            h.update(struct.pack(">H", len(part)) + bytes(part))
    return h.digest()


def confirm_bytes(session: int, round_: int, party: int, view: bytes, survivors: Sequence[int]) -> bytes:
    """What a survivor signs before any client reveals a share (Bonawitz et al.'s consistency check):
    the survivor set :math:`U_3` it was told, under the cohort ``view`` it dealt its shares in. A client
    reveals only with at least :math:`t` such signatures over its own :math:`U_3`, so while fewer
    than :math:`2t - n` clients collude no two honest clients reveal for different survivor sets
    (an eighth review pass, with one colluder, told each client another set and unmasked one
    client's input; frame version 11)."""
    return (
        b"fedgat/secagg/confirm/v1"
        + _context(session, round_)
        + struct.pack(">I", party)
        + bytes(view)
        + struct.pack(f">I{len(survivors)}I", len(survivors), *survivors)
    )


def _share_context(session: int, round_: int, sender: int, recipient: int, view: bytes) -> bytes:
    return (
        b"fedgat/secagg/share/v2"
        + _context(session, round_)
        + struct.pack(">II", sender, recipient)
        + bytes(view)
    )


def dealt_bytes(
    session: int, round_: int, dealer: int, holder: int, index: int, kind: bytes, share: bytes, view: bytes
) -> bytes:
    """What a dealer signs for each share it deals (``kind`` b"s": of its mask-key seed, b"b": of its
    self-mask seed): the holder, its index and the cohort view bound to the share. The holder keeps
    the signature and reveals it with the share, so the server can tell a share its dealer dealt
    from one a client made up, and rebuild a seed from the others (frame version 11; before, one
    wrong share sent the server through subsets of ``t`` shares, and past 256 of them it gave up)."""
    return (
        b"fedgat/secagg/dealt/v1"
        + _context(session, round_)
        + struct.pack(">IIH1s", dealer, holder, index, kind)
        + bytes(view)
        + bytes(share)
    )


def seal_share(
    signer: SigningIdentity,
    recipient_key: bytes,
    session: int,
    round_: int,
    sender: int,
    recipient: int,
    index: int,
    s_share: bytes,
    b_share: bytes,
    view: bytes,
) -> bytes:
    """Share ``index`` of the sender's :math:`s` and :math:`b` seeds, each signed by the sender
    (:func:`dealt_bytes`) and sealed together to the recipient's round key ``recipient_key`` (HPKE;
    info binds session, round, both parties and the sender's :func:`cohort_view`)."""
    context = _share_context(session, round_, sender, recipient, view)
    body = _SHARE_BODY.pack(index) + bytes(s_share) + bytes(b_share)
    signatures = b"".join(
        signer.sign(dealt_bytes(session, round_, sender, recipient, index, kind, share, view))
        for kind, share in ((b"s", s_share), (b"b", b_share))
    )
    sealed = _SUITE.encrypt(
        body + signatures, X25519PublicKey.from_public_bytes(bytes(recipient_key)), context
    )
    assert len(sealed) == SEALED_SHARE_BYTES
    return sealed


def open_share(
    key: X25519PrivateKey,
    sealed: bytes,
    sender_signing_key: bytes,
    session: int,
    round_: int,
    sender: int,
    recipient: int,
    index: int,
    view: bytes,
) -> tuple[bytes, bytes, bytes, bytes]:
    """``(s_share, b_share, s_signature, b_signature)`` of a :func:`seal_share` box addressed to
    ``recipient`` by ``sender`` (the signatures to reveal with the shares).

    Raises:
        AuthError: the box does not open under this key and context (tampered, another recipient,
            round, session, or a sender that saw another cohort than ``view``).
        SignatureError: the sender's signatures inside do not verify (a forged share).
        PayloadError: another share index than the recipient's.
    """
    context = _share_context(session, round_, sender, recipient, view)
    try:
        plain = _SUITE.decrypt(bytes(sealed), key, context)
    except (InvalidTag, ValueError, TypeError) as exc:
        raise AuthError(
            f"the sealed shares from party {sender} do not open for party {recipient} (tampered, or "
            "dealt for another cohort than the one this client was shown)"
        ) from exc
    size = _SHARE_BODY.size + 2 * SEED_BYTES
    if len(plain) != size + 128:
        raise PayloadError(f"the sealed shares from party {sender} have {len(plain)} bytes inside")
    (got,) = _SHARE_BODY.unpack_from(plain)
    start = _SHARE_BODY.size
    s_share, b_share = plain[start : start + SEED_BYTES], plain[start + SEED_BYTES : size]
    s_sig, b_sig = plain[size : size + 64], plain[size + 64 :]
    for kind, share, signature in ((b"s", s_share, s_sig), (b"b", b_share, b_sig)):
        data = dealt_bytes(session, round_, sender, recipient, got, kind, share, view)
        check_signature(
            sender_signing_key, data, signature, f"the shares from party {sender} are not signed by it"
        )
    if got != index:
        raise PayloadError(f"party {sender} dealt share {got} to party {recipient}, whose index is {index}")
    return s_share, b_share, s_sig, b_sig
