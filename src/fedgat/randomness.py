"""Cryptographically secure randomness for the encodings' secret bases.

The bases and ratios ``r`` that obfuscate the FedGAT encodings are drawn by the party that builds
the encodings (the server). numpy's generators are not cryptographically secure, so by default we
draw from a ChaCha20 keystream keyed with 32 bytes from ``os.urandom``; a seed makes the stream
reproducible for tests and for plaintext-vs-encrypted comparisons of the *bases*.

Differential-privacy noise (:mod:`fedgat.dp`) never comes from a seeded stream: it is always drawn
from ``RandomSource()`` (a fresh ``os.urandom`` key), so nothing public reproduces it.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

_TWO_PI = 2.0 * np.pi


def check_seed(seed: object, *, text: bool = False, none: bool = False) -> None:
    """Refuse a seed that is not an integer >= 0 (nor a string with ``text``, nor None with ``none``):
    a float or bool would seed another stream than the integer it looks like, silently.

    Raises:
        TypeError: another type; ValueError: a negative integer.
    """
    if seed is None and none or isinstance(seed, str) and text:
        return
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        allowed = " or ".join(["an integer", *(["a string"] if text else []), *(["None"] if none else [])])
        raise TypeError(f"seed must be {allowed}, got {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")


class RandomSource:
    """A ChaCha20-keystream random source with numpy-shaped draws.

    Args:
        key: 32-byte ChaCha20 key; ``None`` draws one from ``os.urandom`` (the default, secure).
    """

    def __init__(self, key: bytes | None = None) -> None:
        key = os.urandom(32) if key is None else key
        if len(key) != 32:
            raise ValueError(f"RandomSource key must be 32 bytes, got {len(key)}")
        self._encryptor = Cipher(algorithms.ChaCha20(key, b"\0" * 16), mode=None).encryptor()
        self.seeded = False

    @classmethod
    def from_seed(cls, seed: int | str | bytes) -> RandomSource:
        """A reproducible stream for tests and public choices (bases); never for DP noise, and never
        with a guessable seed where the stream must stay secret in deployment."""
        material = seed if isinstance(seed, bytes) else str(seed).encode()
        source = cls(hashlib.sha256(b"fedgat-random-source:" + material).digest())
        source.seeded = True
        return source

    def _uint64(self, count: int) -> np.ndarray:
        raw = self._encryptor.update(b"\0" * (8 * count))
        return np.frombuffer(raw, dtype=np.uint64)

    def uniform(self, shape: tuple[int, ...] | int, low: float = 0.0, high: float = 1.0) -> np.ndarray:
        """Uniform float64 draws on the open interval (low, high), 53 random bits each."""
        count = int(np.prod(shape))
        u = ((self._uint64(count) >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
        return (low + (high - low) * u).reshape(shape)

    def normal(self, shape: tuple[int, ...] | int) -> np.ndarray:
        """Standard normal float64 draws (Box-Muller)."""
        count = int(np.prod(shape))
        half = (count + 1) // 2
        u1, u2 = self.uniform(half), self.uniform(half)
        radius = np.sqrt(-2.0 * np.log(u1))
        z = np.concatenate([radius * np.cos(_TWO_PI * u2), radius * np.sin(_TWO_PI * u2)])
        return z[:count].reshape(shape)

    def orthogonal(self, batch: int, size: int) -> np.ndarray:
        """``(batch, size, size)`` Haar-random orthogonal matrices (QR with sign fix)."""
        q, r = np.linalg.qr(self.normal((batch, size, size)))
        signs = np.sign(np.diagonal(r, axis1=1, axis2=2))
        signs[signs == 0] = 1.0
        return q * signs[:, None, :]

    def choice_without_replacement(self, population: int, k: int) -> np.ndarray:
        """``k`` distinct indices from ``range(population)`` (random keys, argsort)."""
        return np.argsort(self.uniform(population))[:k]


def as_random_source(rng: RandomSource | int | None) -> RandomSource:
    """Accept a RandomSource, an int seed (reproducible) or None (secure default)."""
    if isinstance(rng, RandomSource):
        return rng
    if rng is None:
        return RandomSource()
    return RandomSource.from_seed(rng)
