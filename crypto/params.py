"""CKKS parameter presets for the encrypted pre-training round.

What the server computes is one layer of *plaintext-coefficient multiply-adds*
(``out = sum_j c_j * ct_j`` with real plaintext vectors ``c_j``), so every preset has a
modulus chain of exactly three primes::

    [q0, q1, p]     q0: what is left after the single rescale (holds the result),
                    q1: the prime divided out by that rescale (== the scale, see below),
                    p:  SEAL's "special" key-switching prime. Fresh ciphertexts live at q0*q1.

Scale. TenSEAL encodes the plaintext coefficients at the vector's scale and, after rescaling,
*overwrites* the ciphertext scale with that same value instead of the true
``scale**2 / q1``. With the customary ``scale = 2**40`` and ``q1`` the 40-bit prime that SEAL picks
(1099511480321 for N=8192, i.e. ``2**40 * (1 - 1.3e-7)``) every result is off by a relative
1.3e-7 -- an absolute 2.3e-5 for a value of 170 (measured), which alone breaks the 1e-5 target.
We therefore set the scale to *exactly* ``q1`` (a float, exact because ``q1 < 2**53``); the
relative error then vanishes and the measured error drops from 2.3e-5 to 8e-8 at [60,40,60].

Security. The HomomorphicEncryption.org standard (Albrecht et al. 2018, Table 1, classical
attacks, ternary secret -- what SEAL samples) bounds ``log2(q0*q1*p)`` for 128-bit security by
:data:`HE_STANDARD_MAX_LOG_Q_128`. :class:`CkksPreset` refuses to exist above that bound.

Measured presets (2-core VM, tenseal 0.3.18, symmetric encryption; two runs of
``python -m fedgat.crypto.measure``; ms per operation, bytes per enveloped ciphertext; error =
max abs error of ``sum_{t<170} c_t h_t`` with ``c, h ~ U[-1, 1]`` per slot, bound =
:meth:`CkksPreset.error_bound` for ``|c|, |h| <= 1``):

===========  =====  ========  =====  =====  ========  =====  =======  =======  =====  ======  =======
preset       N      bits      log q  enc    mul+resc  dec    fresh B  result   pub    error   bound
===========  =====  ========  =====  =====  ========  =====  =======  =======  =====  ======  =======
n4096        4096   46,37,26  109    0.9    0.55      0.18   85.1K    47.2K    141K   4e-7    1.1e-6
n8192        8192   60,40,60  160    1.7    1.2       0.37   204.9K   123.0K   363K   1e-7    3.0e-7
n8192-small  8192   46,37,46  129    1.8    1.1       0.40   170.1K   94.3K    318K   8e-7    2.4e-6
n16384       16384  60,40,60  160    3.6    2.4       0.75   409.7K   245.8K   722K   2e-7    6.3e-7
===========  =====  ========  =====  =====  ========  =====  =======  =======  =====  ======  =======

(ct + ct add: 0.01-0.05 ms; public-key encryption instead of symmetric: 1.7 / 3.3 ms at
N = 4096 / 8192. Values up to |170| in a slot decrypt with the same error.)

Bytes at the floor. A ciphertext is 2 polynomials of N coefficients per RNS prime of its level,
each uniform below its prime, so its information floor is :meth:`CkksPreset.floor_bytes`
``= 2 N sum(bits) / 8``: fresh (``q0 q1``) 85.0 KB / result (``q0``) 47.1 KB at ``n4096``. The wire
form (:mod:`fedgat.crypto.compact`) is exactly that plus a 74-byte envelope (1.001x / 1.002x);
TenSEAL's own bytes (zstd, which only drops the zero top bytes of each 64-bit word) were
103.6 / 55.7 KB (1.22x / 1.18x) at ``n4096`` and 235.2 / 131.3 KB (1.15x / 1.07x) at ``n8192``.
Results are at the lowest level already (one rescale leaves ``q0``); fresh uploads must keep
``q1`` for the server's rescale, so nothing can be modulus-switched lower before it is sent.
Per useful slot a result costs 23.0 B at the 46-bit ``q0`` presets and 30.0 B at the 60-bit ones,
i.e. 5.76x / 7.5x float32 when every slot holds a value (divide by the slot utilisation,
:func:`fedgat.crypto.measure.floor_report`).

Smallest preset per variant (``fedgat bench presets``, :mod:`fedgat.benchmarks.presets`: the
encrypted round against its plaintext twin on the same partition and bases, max abs error over
every decrypted encoding value; synthetic graph of 120 nodes, 32 features, 2 clients, seed 0):

=======  ===========  =======  =======  ===========  =======
variant  preset       error    moved    preset       error
=======  ===========  =======  =======  ===========  =======
vector   **n4096**    9.1e-8   20.5 MB  n8192-small  1.7e-7
vector   n8192        2.6e-8   51.3 MB  n16384       3.9e-8
matrix   **n4096**    9.4e-8   20.8 MB  n8192-small  2.0e-7
matrix   n8192        2.0e-8   51.5 MB  n16384       5.4e-8
=======  ===========  =======  =======  ===========  =======

(Measured before the upload pads of frame version 12. With version 12's uniform pads,
:meth:`CkksPreset.pad_bound`: 5.6e-8 / 6.7e-8 at ``n4096``, 3.1e-7 / 2.8e-7 at ``n8192`` and
2.6e-7 / 3.0e-7 at ``n16384``, whose larger pads cost precision; 8.6e-8 / 1.0e-7 at
``n8192-small``. With version 13's Gaussian pads (3x their variance): 7.0e-8 / 5.6e-8 at
``n4096``, 4.8e-7 / 4.7e-7 at ``n8192``, 1.2e-7 / 1.0e-7 at ``n8192-small``, 4.6e-7 / 4.9e-7 at
``n16384``, ``benchmarks/results/presets_frame_v13.json``.)

Every preset meets 1e-5 for both variants with >= 30x margin there, and ``n4096`` moves the fewest
bytes (n8192-small 41 MB, n16384 102 MB), so it is the smallest for both. (Encoding values on that
graph stay below 1.1; on Cora they reach the hundreds, where the measured ``|value| = 170``
column above still gives 4e-7.) Smaller parameters are not among the accepted presets: N = 2048
allows 54 bits of modulus in all, too few for a scale of ~2**34 plus headroom.

* ``n4096`` is the cheapest preset that meets the 1e-5 target (>= 10x measured margin): the
  smallest ring that holds three primes of useful size, the fewest RNS limbs, the smallest
  ciphertexts and, because the rotation-free packing replicates each node's features across the
  slots (:mod:`fedgat.crypto.packing`), the smallest upload per node. Its special prime is small
  (26 bits): fine because the server never key-switches (no relinearisation, no rotation); do not
  use it with relinearisation or Galois keys.
* ``n8192-small`` shows what a small remaining modulus buys for downloads: with the compact wire
  form bytes scale exactly with the bits, so a 46-bit ``q0`` instead of 60 bits shrinks a result
  ciphertext by 46/60 (123.0 KB -> 94.3 KB, -23 %). Going lower costs precision: ``q0`` must
  hold ``scale * max|value|`` and the scale must stay >= ~2**35 for 1e-5 over 170 terms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import PresetError

__all__ = [
    "DEFAULT_PRESET",
    "DEFAULT_WIRE",
    "ENVELOPE_OVERHEAD_BYTES",
    "HE_STANDARD_MAX_LOG_Q_128",
    "PRESETS",
    "WIRES",
    "CkksPreset",
    "get_preset",
    "max_log_q_128",
]

#: Max ``log2(q)`` (total coefficient modulus incl. the special prime) for 128-bit security,
#: HomomorphicEncryption.org standard, classical attacks, ternary (uniform {-1,0,1}) secret.
HE_STANDARD_MAX_LOG_Q_128: dict[int, int] = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}

#: bytes of the ciphertext envelope around the compact form (:func:`fedgat.crypto.packing.serialize`):
#: magic, version, level, key fingerprint, length (42) and SHA-256 (32)
ENVELOPE_OVERHEAD_BYTES = 74

#: The ciphertext wire formats a session may agree on (``PretrainConfig.wire``, ``--wire``); every
#: party's contexts carry the session's (:attr:`fedgat.crypto.context.CkksContext.wire`), write it
#: and accept nothing else (:func:`fedgat.crypto.packing.deserialize`).
#:
#: * ``"compact"`` (envelope version 2, the default): every RNS coefficient bit-packed at its
#:   prime's width (:mod:`fedgat.crypto.compact`), so a ciphertext is its byte floor plus 74 B.
#:   Costs CPU, because TenSEAL gives no raw coefficient access: the sender decompresses SEAL's
#:   zstd stream and packs it, the receiver rebuilds an uncompressed stream (measured at ``n4096``
#:   on 2 cores: ~1.9 ms to serialise a fresh upload instead of TenSEAL's 1.2 ms, +0.34 ms per result
#:   on the server, loads about the same (``benchmarks/results/server_profile.md``); about +120
#:   CPU-s for a Cora round, which saves ~2.9 GB).
#: * ``"tenseal"`` (envelope version 1): TenSEAL's own bytes (a protobuf around SEAL's
#:   zstd-compressed stream) as the body: ~16-22 % more bytes (1.22x / 1.18x the floor at
#:   ``n4096``, 1.15x / 1.07x at ``n8192``: :data:`TENSEAL_WIRE_BYTES`), no packing CPU; the
#:   receiver hands the received bytes to TenSEAL/SEAL's own parser after the envelope's checks.
WIRES: tuple[str, ...] = ("compact", "tenseal")
DEFAULT_WIRE = "compact"

#: measured bytes of one ``"tenseal"``-wire envelope (fresh, result) per preset: TenSEAL 0.3.x,
#: mean of random ciphertexts (zstd's output varies by about +-0.3 %); estimates only
#: (:meth:`CkksPreset.wire_bytes`); receivers hold envelopes to the upper bound of
#: :func:`fedgat.crypto.packing.envelope_bytes`
TENSEAL_WIRE_BYTES: dict[str, tuple[int, int]] = {
    "n4096": (103_490, 55_670),
    "n8192": (235_130, 131_290),
    "n8192-small": (208_080, 111_510),
    "n16384": (459_730, 262_370),
}


def check_wire(wire: str) -> str:
    """``wire`` if it is one of :data:`WIRES`, else ``ValueError`` naming the accepted values."""
    if not isinstance(wire, str) or wire not in WIRES:
        raise ValueError(f"unknown ciphertext wire {wire!r}: expected one of {', '.join(WIRES)}")
    return wire


#: Upload pads (:func:`fedgat.crypto.tags.release_rows`, known break 22 in SECURITY.md): the pads'
#: part of a result slot, ``sum_u C_ku rho_u`` with ``rho`` Gaussian of sd ``sigma`` (frame version
#: 13; uniform on ``(-A, A)`` in version 12), is Gaussian of sd ``sigma ||C_k||`` and stays within
#: ``PAD_TAIL sigma ||C_k||`` but with probability ``2 Phi(-PAD_TAIL)`` (~2e-19), in feature and tag
#: slots alike (the check vectors have norm < 1)
PAD_TAIL = 9.0
#: the share of a result slot's range (:attr:`CkksPreset.max_abs_value`) the pads may take; the
#: rest holds the data and the tags' PRF part (below ``PAD_TAIL ||C_k||``). With unit-norm rows a
#: data slot is at most ``||C_k|| sqrt(n)`` (all ``n`` neighbours one-hot in that column), which fits
#: the other half for any ``n`` up to ``PretrainLimits.max_neighbours`` (vector) or 2,800 (matrix);
#: in practice it is below 2 (Cora: 1.0 vector, 1.3 matrix; the pads' part at most 45 / 21 of its
#: 128 at ``n4096``)
PAD_RANGE_SHARE = 0.5
#: the largest error the pads may bring a result to (:meth:`CkksPreset.error_bound` of
#: :data:`PAD_REFERENCE_TERMS` terms of values up to ``A``; the encodings' target is 1e-5)
PAD_ERROR = 4e-6
PAD_REFERENCE_TERMS = 256

_MAX_PRIME_BITS = 60  # SEAL limit per prime
_MIN_PRIME_BITS = 20
_MAX_EXACT_SCALE_BITS = 52  # the scale is the rescale prime as a float: must be exact in a double


def max_log_q_128(poly_modulus_degree: int) -> int:
    """HE-standard 128-bit bound on ``log2(q)`` for ring degree ``poly_modulus_degree``."""
    try:
        return HE_STANDARD_MAX_LOG_Q_128[poly_modulus_degree]
    except KeyError:
        raise PresetError(
            f"poly_modulus_degree {poly_modulus_degree} is not one of {sorted(HE_STANDARD_MAX_LOG_Q_128)}"
        ) from None


@dataclass(frozen=True)
class CkksPreset:
    """A CKKS parameter set for one plaintext-coefficient multiply-add layer.

    ``coeff_mod_bit_sizes = (q0, q1, p)``: the global scale is the prime of ``q1`` bits itself
    (``scale_bits == q1``). Construction fails with :class:`PresetError` when the total modulus
    exceeds the HE-standard 128-bit bound or the chain cannot do one rescale.
    """

    name: str
    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        bits = tuple(int(b) for b in self.coeff_mod_bit_sizes)
        object.__setattr__(self, "coeff_mod_bit_sizes", bits)
        n = self.poly_modulus_degree
        limit = max_log_q_128(n)
        if len(bits) != 3:
            raise PresetError(
                f"{self.name}: expected 3 primes (q0, q1 = scale, special), got {len(bits)}; the "
                "server does exactly one plaintext multiply and one rescale"
            )
        for b in bits:
            if not _MIN_PRIME_BITS <= b <= _MAX_PRIME_BITS:
                raise PresetError(f"{self.name}: prime size {b} outside [{_MIN_PRIME_BITS}, 60] bits")
        if bits[1] > _MAX_EXACT_SCALE_BITS:
            raise PresetError(f"{self.name}: scale prime of {bits[1]} bits is not exact in a float")
        if bits[0] <= bits[1] + 1:
            raise PresetError(f"{self.name}: q0 ({bits[0]} bits) leaves no headroom over the scale")
        total = sum(bits)
        if total > limit:
            raise PresetError(
                f"{self.name}: log2(q) = {total} exceeds the 128-bit HE-standard bound {limit} for N = {n}"
            )

    # --- derived quantities -------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2

    @property
    def scale_bits(self) -> int:
        """Bits of the global scale (the scale is the ``q1`` prime itself, just below 2**bits)."""
        return self.coeff_mod_bit_sizes[1]

    @property
    def total_log_q(self) -> int:
        return sum(self.coeff_mod_bit_sizes)

    @property
    def max_log_q(self) -> int:
        return max_log_q_128(self.poly_modulus_degree)

    @property
    def security_bits(self) -> int:
        """Claimed classical security level (construction guarantees the 128-bit bound)."""
        return 128

    def level_bits(self, level: str) -> tuple[int, ...]:
        """Bits of the RNS primes a ciphertext at ``level`` holds: ``(q0, q1)`` fresh (the server's
        multiply + rescale needs both), ``(q0,)`` for a result (the lowest level)."""
        if level == "fresh":
            return self.coeff_mod_bit_sizes[:2]
        if level == "result":
            return self.coeff_mod_bit_sizes[:1]
        raise ValueError(f"level must be 'fresh' or 'result', got {level!r}")

    def floor_bytes(self, level: str) -> int:
        """Information floor of a ciphertext at ``level``: ``2 N sum(bits of its primes) / 8`` bytes
        (two polynomials, every coefficient uniform below its prime). The compact wire form
        (:mod:`fedgat.crypto.compact`) is exactly this."""
        return 2 * self.poly_modulus_degree * sum(self.level_bits(level)) // 8

    def wire_bytes(self, level: str, wire: str = DEFAULT_WIRE) -> int:
        """Bytes of one enveloped ciphertext at ``level`` on the wire. ``"compact"``: exact, the
        floor plus the envelope. ``"tenseal"``: typical (zstd's output depends on the coefficients,
        +-0.3 %), measured per preset (:data:`TENSEAL_WIRE_BYTES`), 1.22x the floor for a preset not
        measured; for an upper bound use :func:`fedgat.crypto.packing.envelope_bytes`."""
        floor = self.floor_bytes(level)  # ValueError for another level
        if check_wire(wire) == "compact":
            return floor + ENVELOPE_OVERHEAD_BYTES
        measured = TENSEAL_WIRE_BYTES.get(self.name)
        if measured is not None:
            return measured[0] if level == "fresh" else measured[1]
        return round(floor * 1.22) + ENVELOPE_OVERHEAD_BYTES

    @property
    def max_abs_value(self) -> float:
        """Nominal bound on ``|value|`` a result slot may hold: about ``q0 / (2 * scale)``."""
        return float(2 ** (self.coeff_mod_bit_sizes[0] - self.scale_bits - 1))

    def error_bound(
        self,
        terms: int,
        max_coeff: float = 1.0,
        max_value: float = 1.0,
        *,
        symmetric: bool = True,
        scale: float | None = None,
    ) -> float:
        """Conservative bound on the max-abs error of ``sum_{t<terms} c_t * Enc(h_t)`` over all slots.

        Noise model (coefficient-domain variances, then the canonical embedding multiplies the
        standard deviation by ``sqrt(N/2)`` and divides by the scale):

        * fresh encryption: symmetric ``sigma^2 + 1/12`` (sigma = 3.2); public-key
          ``(1 + 2N/3)/12 + 1/12`` (SEAL encrypts at the key level and divides by the special
          prime, leaving the rounding noise ``r0 + r1*s``); multiplied by ``c_t^2``;
        * plaintext-encoding rounding ``1/12``, multiplied by ``h_t^2``;
        * one rescale per term (TenSEAL rescales after every multiply): ``(1 + 2N/3)/12``.

        The max over slots is taken as ``2 ln(N)`` standard deviations: the ``r*s`` noise is a
        product of two Gaussians in the slot domain, so its tail is exponential, not Gaussian
        (measured max/std ~ 6-7 at 2048-4096 slots; the bound uses 16.6 at N=4096).
        """
        if terms < 0:
            raise ValueError("terms must be >= 0")
        n = self.poly_modulus_degree
        delta = float(scale) if scale is not None else 2.0**self.scale_bits
        v_rs = (1.0 + 2.0 * n / 3.0) / 12.0
        v_fresh = (3.2**2 + 1.0 / 12.0) if symmetric else v_rs + 1.0 / 12.0
        var = terms * (max_coeff**2 * v_fresh + max_value**2 / 12.0 + v_rs)
        z = 2.0 * math.log(n)
        return z * math.sqrt(n / 2.0 * var) / delta

    def pad_bound(self, row_norm: float = 1.0) -> float:
        """``sigma``, the standard deviation of the upload pads (Gaussian), for coefficient rows of
        norm up to ``row_norm``: the largest that keeps the pads' part of a result within
        :data:`PAD_RANGE_SHARE` of the slot range (at :data:`PAD_TAIL` deviations) and the error of
        :data:`PAD_REFERENCE_TERMS` padded terms of mean square ``sigma^2`` within :data:`PAD_ERROR`
        (or at most ``sqrt(2)`` times the unpadded one, where that is larger). Public: every party
        derives it from the session's preset and variant.

        Known break 22's verdict oracle reads ``h + rho`` instead of ``h``: a session's verdicts are
        the Gaussian mechanism's post-processing, ``(epsilon, delta)``-DP for each released row
        (:mod:`fedgat.verdict_dp`); one feature ``h`` moves a verdict by at most the total
        variation ``2 Phi(|h| / (2 sigma)) - 1`` ~ ``0.4 |h| / sigma``, a sum over ``N`` rows of
        value ``x`` by ``~0.4 sqrt(N) |x| / sigma``."""
        if row_norm <= 0:
            raise ValueError("row_norm must be positive")
        by_range = PAD_RANGE_SHARE * self.max_abs_value / (PAD_TAIL * row_norm)
        # error_bound(terms, 1, A, symmetric=False)^2 = e0^2 + A^2 * per_unit (the pads enter as the
        # plaintext-encoding rounding term): solved for A at PAD_ERROR, or at twice the variance e0^2
        e0 = self.error_bound(PAD_REFERENCE_TERMS, 1.0, 0.0, symmetric=False)
        per_unit = self.error_bound(PAD_REFERENCE_TERMS, 1.0, 1.0, symmetric=False) ** 2 - e0**2
        by_error = math.sqrt(max(PAD_ERROR**2 - e0**2, e0**2) / per_unit)
        return float(min(by_range, by_error))

    def fresh_error_bound(self, *, symmetric: bool = True, scale: float | None = None) -> float:
        """Bound on the max-abs error of a fresh encryption (no multiply, no rescale)."""
        n = self.poly_modulus_degree
        delta = float(scale) if scale is not None else 2.0**self.scale_bits
        v_fresh = (3.2**2 + 1.0 / 12.0) if symmetric else (1.0 + 2.0 * n / 3.0) / 12.0 + 1.0 / 12.0
        return 2.0 * math.log(n) * math.sqrt(n / 2.0 * v_fresh) / delta


def _preset(name: str, n: int, bits: tuple[int, ...], description: str) -> CkksPreset:
    return CkksPreset(name=name, poly_modulus_degree=n, coeff_mod_bit_sizes=bits, description=description)


PRESETS: dict[str, CkksPreset] = {
    p.name: p
    for p in (
        _preset(
            "n4096",
            4096,
            (46, 37, 26),
            "cheapest and smallest: 2048 slots, scale ~2**37, log q = 109 (the 128-bit limit); "
            "multiply-add only (small special prime: no key switching)",
        ),
        _preset("n8192", 8192, (60, 40, 60), "reference: 4096 slots, scale ~2**40, log q = 160"),
        _preset(
            "n8192-small",
            8192,
            (46, 37, 46),
            "small remaining modulus: 4096 slots, 46-bit q0 so zstd-compressed results are 15% smaller",
        ),
        _preset("n16384", 16384, (60, 40, 60), "8192 slots, scale ~2**40, log q = 160"),
    )
}

DEFAULT_PRESET = "n4096"


def get_preset(preset: str | CkksPreset) -> CkksPreset:
    """Look a preset up by name (or pass a :class:`CkksPreset` through)."""
    if isinstance(preset, CkksPreset):
        return preset
    try:
        return PRESETS[preset]
    except KeyError:
        raise PresetError(f"unknown preset {preset!r}; known: {sorted(PRESETS)}") from None
