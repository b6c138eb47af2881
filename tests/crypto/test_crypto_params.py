from __future__ import annotations

import pytest

from fedgat.crypto import PRESETS, CkksPreset, PresetError, get_preset
from fedgat.crypto.params import HE_STANDARD_MAX_LOG_Q_128, max_log_q_128


def test_he_standard_table() -> None:
    assert HE_STANDARD_MAX_LOG_Q_128 == {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_within_128_bit_bound(name: str) -> None:
    p = PRESETS[name]
    assert p.total_log_q == sum(p.coeff_mod_bit_sizes)
    assert p.total_log_q <= max_log_q_128(p.poly_modulus_degree) == p.max_log_q
    assert p.security_bits == 128
    assert p.slots == p.poly_modulus_degree // 2
    assert p.scale_bits == p.coeff_mod_bit_sizes[1]
    assert p.max_abs_value >= 170  # one layer of 170 terms with |c|, |h| <= 1 fits


def test_required_presets() -> None:
    assert PRESETS["n8192"].coeff_mod_bit_sizes == (60, 40, 60)
    assert PRESETS["n8192"].scale_bits == 40
    assert PRESETS["n16384"].poly_modulus_degree == 16384
    assert PRESETS["n4096"].total_log_q == 109  # exactly at the bound


@pytest.mark.parametrize(
    "n, bits",
    [
        (4096, (46, 37, 27)),  # 110 > 109
        (2048, (30, 22, 21)),  # 73 > 54
        (1024, (25, 20, 20)),  # 65 > 27
    ],
)
def test_preset_exceeding_bound_is_refused(n: int, bits: tuple[int, ...]) -> None:
    with pytest.raises(PresetError, match="128-bit"):
        CkksPreset("too-big", n, bits)


@pytest.mark.parametrize(
    "n, bits",
    [
        (3000, (40, 30, 30)),  # not a power of two in the table
        (8192, (60, 40)),  # no special prime
        (8192, (60, 40, 40, 60)),  # more depth than the protocol needs
        (8192, (61, 40, 60)),  # prime too big for SEAL
        (8192, (40, 40, 60)),  # no headroom over the scale
        (16384, (60, 55, 60)),  # scale not exact in a double
    ],
)
def test_malformed_presets(n: int, bits: tuple[int, ...]) -> None:
    with pytest.raises(PresetError):
        CkksPreset("bad", n, bits)


def test_get_preset() -> None:
    assert get_preset("n4096") is PRESETS["n4096"]
    assert get_preset(PRESETS["n8192"]) is PRESETS["n8192"]
    with pytest.raises(PresetError):
        get_preset("n999")


def test_error_bound_meets_target_for_every_preset() -> None:
    for p in PRESETS.values():
        assert p.error_bound(170) < 1e-5
        assert p.error_bound(170, symmetric=False) < 1e-5
        assert p.error_bound(10) < p.error_bound(170)


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("row_norm", [1.0, 5**0.5])
def test_the_upload_pads_fit_the_result_range_and_the_error_target(name: str, row_norm: float) -> None:
    """Known break 22's pads: their part of a result slot, PAD_TAIL * A * ||C_k|| at most, takes no
    more than PAD_RANGE_SHARE of the slot range, and 256 padded terms stay within PAD_ERROR (or
    sqrt(2) times the unpadded bound where that is larger)."""
    from fedgat.crypto.params import PAD_ERROR, PAD_RANGE_SHARE, PAD_REFERENCE_TERMS, PAD_TAIL

    p = PRESETS[name]
    pad = p.pad_bound(row_norm)
    assert pad > 1.0
    assert PAD_TAIL * pad * row_norm <= PAD_RANGE_SHARE * p.max_abs_value * (1 + 1e-12)
    unpadded = p.error_bound(PAD_REFERENCE_TERMS, 1.0, 1.0, symmetric=False)
    assert p.error_bound(PAD_REFERENCE_TERMS, 1.0, pad, symmetric=False) <= max(
        PAD_ERROR, 2**0.5 * unpadded
    ) * (1 + 1e-9)
    assert p.pad_bound(2 * row_norm) <= pad  # wider coefficient rows, smaller pads


def test_pad_bounds_of_the_presets() -> None:
    assert get_preset("n4096").pad_bound() == pytest.approx(14.22, abs=0.01)  # range-bound
    assert get_preset("n8192").pad_bound() == pytest.approx(818.9, abs=0.1)  # error-bound
    with pytest.raises(ValueError, match="row_norm"):
        get_preset("n4096").pad_bound(0.0)
