"""TenSEAL CKKS contexts: the key holder's (secret) and the server's (public only).

Roles
-----
* **Key holder** (every pre-training client): :meth:`KeyHolderContext.generate` creates the
  client's own CKKS key pair; the secret key never leaves the client (it is kept, as
  :meth:`~KeyHolderContext.secret_context_bytes`, only inside the client's own authenticated state,
  :mod:`fedgat.protocols.party_state`, and reloaded with :meth:`KeyHolderContext.from_secret_bytes`).
* **Everyone else** (the server, and the other clients, which encrypt the rows this client needs
  under its key): receives :meth:`KeyHolderContext.public_context_bytes` and loads it with
  :meth:`ServerContext.from_bytes`, which refuses anything that carries a secret key -- before
  TenSEAL parses it -- and anything non-canonical.

Keys that are *not* generated or shipped
---------------------------------------
* Galois (rotation) keys: none. The packing (:mod:`fedgat.crypto.packing`) is rotation-free, so
  the server never rotates. They would cost 6.1 MB (N=4096) / 17.5 MB (N=8192) on top of a
  141 KB / 364 KB public context, and key switching needs a large special prime, which the
  ``n4096`` preset deliberately does not have.
* Relinearisation keys: never serialised (the server never multiplies two ciphertexts); TenSEAL
  would add 0.28 MB (N=4096) / 0.73 MB (N=8192) to the public context.

So the public context is exactly: encryption parameters + public key + flags + scale.

Fingerprint
-----------
``fingerprint() = SHA-256(canonical public context bytes)`` (32 bytes). The canonical bytes are
TenSEAL's serialisation with the public key and no secret/relin/Galois keys; it is deterministic
(checked: identical after a secret-context round trip and after a public reload), so the key
holder, the other clients and the server compute the same fingerprint. Messages bind ciphertexts to
a key with it because TenSEAL cannot: a ciphertext made under *another* key with the same
parameters loads and decrypts to garbage without any error.

Encryption mode
---------------
Clients hold the secret key, so by default they encrypt *symmetrically* (SEAL secret-key
encryption): measured 3.6x faster at N=4096 (0.94 ms vs 3.4 ms) and 5x less fresh noise than
public-key encryption, same ciphertext size and format. TenSEAL ties the mode to the context, so
the key holder keeps a second, symmetric-mode TenSEAL context over the same secret key (its
serialised form with the ``encryption_type`` field set to symmetric); a self-test at construction
checks that it decrypts under the main context.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np
import tenseal as ts
import tenseal.sealapi

from . import wire as protobuf
from .errors import (
    CiphertextFormatError,
    ContextFormatError,
    CryptoError,
    KeyMismatchError,
    NotPublicContextError,
    PresetError,
)
from .params import DEFAULT_PRESET, DEFAULT_WIRE, PRESETS, CkksPreset, check_wire, get_preset

__all__ = ["KeyHolderContext", "ServerContext", "canonical_public_bytes", "fingerprint_of"]

# TenSEALContextProto field numbers (tenseal/proto/tensealcontext.proto)
_CTX_PARAMS = 1
_CTX_PUBLIC = 2
_CTX_PRIVATE = 3
_CTX_ENC_TYPE = 4
_ENC_ASYMMETRIC = 0
_ENC_SYMMETRIC = 1


def fingerprint_of(public_context_bytes: bytes) -> bytes:
    """SHA-256 of canonical public-context bytes: the 32-byte key fingerprint."""
    return hashlib.sha256(public_context_bytes).digest()


def canonical_public_bytes(ctx: ts.Context) -> bytes:
    """The canonical public-context bytes of ``ctx``: its public key only (no secret, Galois or
    relinearisation keys); :func:`fingerprint_of` hashes them and a server context must be them."""
    return ctx.serialize(
        save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
    )


def _primes(ctx: ts.Context) -> tuple[int, ...]:
    parms = ctx.seal_context().data.key_context_data().parms()
    return tuple(int(m.value()) for m in parms.coeff_modulus())


def _match_preset(ctx: ts.Context, presets: Iterable[CkksPreset | str] | None) -> CkksPreset:
    parms = ctx.seal_context().data.key_context_data().parms()
    n = int(parms.poly_modulus_degree())
    bits = tuple(p.bit_length() for p in _primes(ctx))
    candidates = [get_preset(p) for p in (presets if presets is not None else PRESETS.values())]
    for preset in candidates:
        if preset.poly_modulus_degree == n and preset.coeff_mod_bit_sizes == bits:
            return preset
    raise ContextFormatError(
        f"context parameters N={n}, primes of {bits} bits match no accepted preset "
        f"({[p.name for p in candidates]})"
    )


class CkksContext:
    """What the key holder and the server share: parameters, fingerprint, levels, and the session's
    ciphertext wire (:attr:`wire`)."""

    def __init__(
        self, ctx: ts.Context, preset: CkksPreset, public_bytes: bytes, wire: str = DEFAULT_WIRE
    ) -> None:
        self._ts = ctx
        self._preset = preset
        self._wire = check_wire(wire)
        self._public_bytes = public_bytes
        self._fingerprint = fingerprint_of(public_bytes)
        self._primes = _primes(ctx)
        seal = ctx.seal_context().data
        self._fresh_level = int(seal.first_context_data().chain_index())
        self._result_level = int(seal.last_context_data().chain_index())
        if not ctx.auto_rescale:
            raise ContextFormatError("auto_rescale must be on: results are rescaled after the multiply")
        scale = float(self._primes[-2])
        if ctx.global_scale != scale:
            raise ContextFormatError(
                f"global scale {ctx.global_scale!r} is not the rescale prime {self._primes[-2]} "
                "(results would carry a relative error; see fedgat.crypto.params)"
            )

    # --- identity -----------------------------------------------------------------------------
    def fingerprint(self) -> bytes:
        """32-byte SHA-256 over the canonical public context: binds ciphertexts to this key."""
        return self._fingerprint

    def public_context_bytes(self) -> bytes:
        """Canonical public context (params + public key, no secret/relin/Galois keys)."""
        return self._public_bytes

    # --- parameters ---------------------------------------------------------------------------
    @property
    def tenseal(self) -> ts.Context:
        """The wrapped TenSEAL context (primitive access; keep it out of pickles and logs)."""
        return self._ts

    @property
    def preset(self) -> CkksPreset:
        return self._preset

    @property
    def wire(self) -> str:
        """The ciphertext wire of the session this context belongs to (:data:`fedgat.crypto.params.WIRES`):
        what :func:`~fedgat.crypto.packing.serialize` writes under it and the only envelope version
        :func:`~fedgat.crypto.packing.deserialize` accepts. Fixed when the context is made or loaded
        (``wire=``), from the party's own session configuration, never from received bytes."""
        return self._wire

    @property
    def slots(self) -> int:
        return self._preset.slots

    @property
    def scale(self) -> float:
        """The exact global scale: the rescale prime q1 as a float."""
        return float(self._primes[-2])

    @property
    def primes(self) -> tuple[int, ...]:
        """(q0, q1, special) as chosen by SEAL."""
        return self._primes

    @property
    def fresh_level(self) -> int:
        """SEAL chain index of freshly encrypted ciphertexts."""
        return self._fresh_level

    @property
    def result_level(self) -> int:
        """SEAL chain index after the server's multiply + rescale."""
        return self._result_level

    @property
    def max_abs_value(self) -> float:
        """Largest ``|value|`` a result slot can hold: ``q0 / (2 scale)`` with a 1/64 margin."""
        return self._primes[0] / (2.0 * self.scale) * (1.0 - 1.0 / 64)

    def level_of(self, vec: ts.CKKSVector) -> int:
        """SEAL chain index of a single-ciphertext CKKS vector."""
        cts = vec.ciphertext()
        if len(cts) != 1:
            raise CiphertextFormatError("expected a single-ciphertext CKKS vector")
        data = self._ts.seal_context().data.get_context_data(cts[0].parms_id())
        if data is None:
            raise CiphertextFormatError("ciphertext was made with other encryption parameters")
        return int(data.chain_index())

    def error_bound(
        self, terms: int, max_coeff: float = 1.0, max_value: float = 1.0, *, symmetric: bool = True
    ) -> float:
        """:meth:`CkksPreset.error_bound` at this context's exact scale."""
        return self._preset.error_bound(terms, max_coeff, max_value, symmetric=symmetric, scale=self.scale)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(preset={self._preset.name!r}, wire={self._wire!r}, "
            f"fingerprint={self._fingerprint.hex()[:16]})"
        )

    def _encryption_context(self) -> ts.Context:
        return self._ts

    def encrypt_vector(self, values: np.ndarray) -> ts.CKKSVector:
        """Encrypt one slot vector (length ``slots``, finite, ``|x| <= max_abs_value``) under this
        context's public key (a key holder may use symmetric encryption)."""
        arr = np.asarray(values, dtype=np.float64)
        if arr.shape != (self.slots,):
            raise ValueError(f"expected a vector of {self.slots} slots, got shape {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError("values must be finite")
        if arr.size and np.max(np.abs(arr)) > self.max_abs_value:
            raise ValueError(f"|value| exceeds the preset's headroom {self.max_abs_value:.1f}")
        return ts.ckks_vector(self._encryption_context(), arr.tolist())

    def __reduce__(self):  # never pickle key material or contexts
        raise TypeError(f"{type(self).__name__} cannot be pickled; serialise it with its own methods")


class KeyHolderContext(CkksContext):
    """Client-side context holding the CKKS secret key. Build with :meth:`generate` or
    :meth:`from_secret_bytes`; never construct directly."""

    def __init__(
        self,
        ctx: ts.Context,
        preset: CkksPreset,
        *,
        symmetric_encryption: bool = True,
        wire: str = DEFAULT_WIRE,
        _token=None,
    ) -> None:
        if _token is not _PRIVATE:
            raise TypeError("use KeyHolderContext.generate / from_secret_bytes")
        if not ctx.has_secret_key():
            raise NotPublicContextError("a key-holder context needs the secret key")
        if ctx.has_galois_keys():
            raise ContextFormatError("Galois keys are not used (rotation-free packing)")
        super().__init__(ctx, preset, canonical_public_bytes(ctx), wire)
        self._secret_bytes = ctx.serialize(
            save_public_key=True, save_secret_key=True, save_galois_keys=False, save_relin_keys=False
        )
        self._enc = self._symmetric_twin() if symmetric_encryption else ctx
        self.symmetric_encryption = symmetric_encryption

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def generate(
        cls,
        preset: str | CkksPreset = DEFAULT_PRESET,
        *,
        symmetric_encryption: bool = True,
        wire: str = DEFAULT_WIRE,
    ) -> KeyHolderContext:
        """A fresh CKKS key pair for ``preset`` (no Galois keys), from SEAL's CSPRNG; its ciphertexts
        travel in the session's ``wire`` (:attr:`wire`)."""
        preset = get_preset(preset)
        check_wire(wire)
        try:
            ctx = ts.context(
                ts.SCHEME_TYPE.CKKS,
                poly_modulus_degree=preset.poly_modulus_degree,
                coeff_mod_bit_sizes=list(preset.coeff_mod_bit_sizes),
            )
        except (ValueError, RuntimeError) as exc:
            raise PresetError(f"SEAL refused preset {preset.name}: {exc}") from exc
        bits = tuple(p.bit_length() for p in _primes(ctx))
        if bits != preset.coeff_mod_bit_sizes:
            raise PresetError(f"SEAL chose primes of {bits} bits for {preset.coeff_mod_bit_sizes}")
        ctx.global_scale = float(_primes(ctx)[-2])
        return cls(ctx, preset, symmetric_encryption=symmetric_encryption, wire=wire, _token=_PRIVATE)

    @classmethod
    def from_secret_bytes(
        cls,
        data: bytes,
        *,
        expected_fingerprint: bytes | None = None,
        presets: Iterable[CkksPreset | str] | None = None,
        symmetric_encryption: bool = True,
        wire: str = DEFAULT_WIRE,
    ) -> KeyHolderContext:
        """Load a secret context (:meth:`secret_context_bytes`, e.g. from the party's own saved
        state). Checks the preset and, if given, that its fingerprint is ``expected_fingerprint``
        (:class:`KeyMismatchError` otherwise); ``wire``: the session's ciphertext wire."""
        check_wire(wire)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("secret context must be bytes")
        data = bytes(data)
        try:
            fields = protobuf.parse_fields(data)
        except ValueError as exc:
            raise ContextFormatError(f"malformed context bytes: {exc}") from exc
        enc_types = [v for (num, _, v) in fields if num == _CTX_ENC_TYPE]
        if enc_types and enc_types[-1] != _ENC_ASYMMETRIC:
            raise ContextFormatError("expected a public-key (asymmetric) TenSEAL context")
        ctx = _load_context(data)
        if not ctx.has_secret_key():
            raise NotPublicContextError("expected a secret context, got one without a secret key")
        preset = _match_preset(ctx, presets)
        out = cls(ctx, preset, symmetric_encryption=symmetric_encryption, wire=wire, _token=_PRIVATE)
        if expected_fingerprint is not None and out.fingerprint() != expected_fingerprint:
            raise KeyMismatchError("secret context does not match the expected key fingerprint")
        return out

    def _symmetric_twin(self) -> ts.Context:
        patched = self._secret_bytes + protobuf.encode_varint_field(_CTX_ENC_TYPE, _ENC_SYMMETRIC)
        twin = _load_context(patched)
        probe = np.linspace(-1.0, 1.0, self.slots)
        got = np.asarray(ts.ckks_vector(twin, probe.tolist()).decrypt(self._ts.secret_key()))
        if not np.allclose(got, probe, atol=1e-6, rtol=0):
            raise CryptoError("symmetric-mode twin context does not decrypt under the secret key")
        return twin

    # --- secrets --------------------------------------------------------------------------------
    def secret_context_bytes(self) -> bytes:
        """The serialised SECRET context: for the key holder's own authenticated state only
        (:mod:`fedgat.protocols.party_state`); never send, log or pickle it."""
        return self._secret_bytes

    def _encryption_context(self) -> ts.Context:
        return self._enc

    def decrypt_vector(self, vec: ts.CKKSVector) -> np.ndarray:
        """Decrypt a CKKS vector (loaded against any context with these parameters)."""
        return np.asarray(vec.decrypt(self._ts.secret_key()), dtype=np.float64)


class ServerContext(CkksContext):
    """Public-only context for the server: it can multiply-add but never decrypt."""

    def __init__(
        self,
        ctx: ts.Context,
        preset: CkksPreset,
        public_bytes: bytes,
        *,
        wire: str = DEFAULT_WIRE,
        _token=None,
    ) -> None:
        if _token is not _PRIVATE:
            raise TypeError("use ServerContext.from_bytes")
        if ctx.has_secret_key() or not ctx.is_public():
            raise NotPublicContextError("server context must not hold a secret key")
        super().__init__(ctx, preset, public_bytes, wire)

    @classmethod
    def from_bytes(
        cls, data: bytes, *, presets: Iterable[CkksPreset | str] | None = None, wire: str = DEFAULT_WIRE
    ) -> ServerContext:
        """Load :meth:`KeyHolderContext.public_context_bytes`; ``wire``: the session's ciphertext wire
        (the context bytes do not carry it: it is this party's own configuration).

        Refuses (:class:`NotPublicContextError`) bytes with a private part *before* TenSEAL
        parses them, and (:class:`ContextFormatError`) malformed or non-canonical bytes
        (relin/Galois keys included, symmetric contexts) or parameters of no accepted preset.
        """
        check_wire(wire)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("public context must be bytes")
        data = bytes(data)
        try:
            fields = protobuf.parse_fields(data)
        except ValueError as exc:
            raise ContextFormatError(f"malformed context bytes: {exc}") from exc
        numbers = [num for (num, _, _) in fields]
        if _CTX_PRIVATE in numbers:
            raise NotPublicContextError("refusing a context that carries a private part (secret key)")
        if any(num == _CTX_ENC_TYPE and v != _ENC_ASYMMETRIC for (num, _, v) in fields):
            raise ContextFormatError("expected a public-key (asymmetric) TenSEAL context")
        if _CTX_PARAMS not in numbers or _CTX_PUBLIC not in numbers:
            raise ContextFormatError("context bytes lack parameters or the public part")
        ctx = _load_context(data)
        if ctx.has_secret_key() or not ctx.is_public():  # defence in depth
            raise NotPublicContextError("server context must not hold a secret key")
        if ctx.has_galois_keys() or ctx.has_relin_keys():
            raise ContextFormatError("non-canonical public context: relin/Galois keys are not used")
        if not ctx.has_public_key():
            raise ContextFormatError("public context lacks the public key")
        preset = _match_preset(ctx, presets)
        if canonical_public_bytes(ctx) != data:
            raise ContextFormatError("non-canonical public context bytes")
        return cls(ctx, preset, data, wire=wire, _token=_PRIVATE)


_PRIVATE = object()


def _load_context(data: bytes) -> ts.Context:
    try:
        return ts.context_from(data)
    except (ValueError, RuntimeError, TypeError, OverflowError, MemoryError) as exc:
        raise ContextFormatError(f"TenSEAL could not load the context: {exc}") from exc
