"""Tag columns (:mod:`fedgat.crypto.tags`): an honest combination of tagged rows passes
:func:`check_share` at CKKS-level noise; any other combination, a substituted row, a scaled or
recombined result, a non-finite or out-of-range one is refused, naming the node and the owners."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgat.crypto import tags
from fedgat.crypto.tags import (
    TAG_COLUMNS,
    TAG_TOLERANCE,
    CheckKeys,
    ResultCheckError,
    check_share,
    check_shares,
    prf_tags,
    tag_columns,
)

SESSION = 42
D = 16
NOISE = 1e-6  # CKKS noise of a result at n4096 is ~1e-7..1e-6


def _unit(rng: np.random.Generator, n: int, d: int = D) -> np.ndarray:
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class Share:
    """One node's foreign share for recipient ``a``: sources owned by two owners, each releasing its
    rows with tag columns under the pair key ``a`` gave it; ``spare`` rows are released too (what a
    server could substitute)."""

    def __init__(self, seed: int, n_f: int = 5, rows: int = 4, spare: int = 3) -> None:
        rng = np.random.default_rng(seed)
        check_seed = rng.bytes(32)
        self.keys = {7: CheckKeys(rng.bytes(32), check_seed), 9: CheckKeys(rng.bytes(32), check_seed)}
        ids = rng.choice(10_000, size=n_f + spare, replace=False)
        self.ids, self.spare_ids = ids[:n_f], ids[n_f:]
        self.owners = np.where(np.arange(n_f) % 2 == 0, 7, 9)
        self.spare_owners = np.full(spare, 7)
        self.h, self.spare_h = _unit(rng, n_f), _unit(rng, spare)
        self.tagged = self.release(self.ids, self.owners, self.h)
        self.spare_tagged = self.release(self.spare_ids, self.spare_owners, self.spare_h)
        # row 0: the node itself (a foreign source), then rows like the bases' coefficients
        self.c = np.vstack([np.eye(1, n_f), rng.uniform(-2.0, 2.0, (rows - 1, n_f))])
        self.vectors = check_seed_vectors(check_seed)
        self.noise = rng.standard_normal((rows, D + TAG_COLUMNS)) * NOISE

    def release(self, ids: np.ndarray, owners: np.ndarray, h: np.ndarray) -> np.ndarray:
        """What the owners encrypt: features then tag columns, each owner under its own pair key."""
        out = np.zeros((len(ids), D + TAG_COLUMNS))
        out[:, :D] = h
        for o, k in self.keys.items():
            at = owners == o
            out[at, D:] = tag_columns(k, SESSION, ids[at], h[at])
        return out

    def prf(self) -> np.ndarray:
        out = np.zeros((len(self.ids), TAG_COLUMNS))
        for o, k in self.keys.items():
            at = self.owners == o
            out[at] = prf_tags(k.prf, SESSION, self.ids[at])
        return out

    def honest(self) -> np.ndarray:
        return self.c @ self.tagged + self.noise

    def check(self, decrypted: np.ndarray, **kw) -> np.ndarray:
        return check_share(
            decrypted, self.c, self.prf(), self.vectors, node=int(self.ids[0]), owners=(7, 9), **kw
        )


def check_seed_vectors(seed: bytes) -> np.ndarray:
    return CheckKeys(bytes(32), seed).vectors(D)


SEEDS = range(8)


# ---------------------------------------------------------------------------------- honest results
@pytest.mark.parametrize("seed", SEEDS)
def test_an_honest_combination_passes_at_ckks_noise(seed):
    s = Share(seed)
    got = s.check(s.honest())
    np.testing.assert_allclose(got, s.c @ s.h, atol=10 * NOISE)
    # DP releases: no range check, the tags still hold
    np.testing.assert_allclose(s.check(s.honest(), max_row_norm=None), s.c @ s.h, atol=10 * NOISE)


def test_noise_far_above_ckks_is_refused():
    s = Share(0)
    noisy = s.c @ s.tagged
    noisy[:, D:] += 100 * TAG_TOLERANCE * (1 + np.abs(s.c).sum(axis=1))[:, None]
    with pytest.raises(ResultCheckError, match="not the announced combination"):
        s.check(noisy)


# -------------------------------------------------------------------------------------- attacks
def _refused(s: Share, decrypted: np.ndarray, match: str = "not the announced combination", **kw):
    with pytest.raises(ResultCheckError, match=match) as info:
        s.check(decrypted, **kw)
    assert info.value.node == int(s.ids[0]) and info.value.owners == (7, 9)
    assert f"node {int(s.ids[0])}" in str(info.value)
    return info.value


@pytest.mark.parametrize("seed", SEEDS)
def test_a_substituted_row_is_refused(seed):
    """The server combines another released row (with its genuine tags) in place of a source."""
    s = Share(seed)
    for k in range(len(s.ids)):
        rows = s.tagged.copy()
        rows[k] = s.spare_tagged[k % len(s.spare_ids)]
        err = _refused(s, s.c @ rows + s.noise)
        assert "parties [7, 9]" in str(err)
    # an owner's raw row sent as the whole share (row 0 is that row; the others are not)
    raw = np.repeat(s.tagged[:1], len(s.c), axis=0)
    _refused(s, raw)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_changed_coefficient_is_refused(seed):
    s = Share(seed)
    for r in range(len(s.c)):
        for k in range(len(s.ids)):
            for delta in (0.05, -1.0):
                other = s.c.copy()
                other[r, k] += delta
                _refused(s, other @ s.tagged + s.noise)
    # a dropped source (coefficient set to zero), e.g. a server leaving an owner out
    other = s.c.copy()
    other[:, 1] = 0.0
    _refused(s, other @ s.tagged + s.noise)


@pytest.mark.parametrize("seed", SEEDS)
def test_slot_wise_recombination_is_refused(seed):
    """Feature slots of one combination with the tag slots of another (what plaintext masks could
    assemble without rotations), either way round."""
    s = Share(seed)
    other = s.c.copy()
    other[1:] = np.random.default_rng(seed + 100).uniform(-2.0, 2.0, other[1:].shape)
    honest, forged = s.c @ s.tagged, other @ s.tagged
    features_forged = np.hstack([forged[:, :D], honest[:, D:]]) + s.noise
    _refused(s, features_forged)
    tags_forged = np.hstack([honest[:, :D], forged[:, D:]]) + s.noise
    _refused(s, tags_forged)
    # and the features of the honest combination over *other* rows, with the honest tag slots
    swapped = s.tagged.copy()
    swapped[:2, :D] = s.spare_tagged[:2, :D]
    _refused(s, np.hstack([(s.c @ swapped)[:, :D], honest[:, D:]]) + s.noise)


@pytest.mark.parametrize("factor", [2.0, 0.5, -1.0, 0.0, 1.01])
def test_a_scaled_result_is_refused(factor):
    """Refused by the tags themselves: no range check (as for DP releases)."""
    for seed in SEEDS:
        s = Share(seed)
        _refused(s, factor * (s.c @ s.tagged) + s.noise, max_row_norm=None)
    s = Share(0)
    scaled_features = s.honest()
    scaled_features[:, :D] *= 1.5  # the features alone
    _refused(s, scaled_features, max_row_norm=None)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_result_is_refused(bad):
    s = Share(1)
    for at in ((0, 0), (2, D - 1), (1, D)):  # a feature slot, the last feature, a tag slot
        dec = s.honest()
        dec[at] = bad
        _refused(s, dec, "not finite")
        _refused(s, dec, "not finite", max_row_norm=None)


def test_an_out_of_range_row_is_refused_even_with_matching_tags():
    """Rows far from unit norm, tagged consistently (an owner's tags follow its rows): the tags
    hold, the range check refuses; without a range check (DP) the same result passes."""
    s = Share(2)
    big = s.h * 50.0
    tagged = s.release(s.ids, s.owners, big)
    dec = s.c @ tagged + s.noise
    _refused(s, dec, "norm")
    np.testing.assert_allclose(s.check(dec, max_row_norm=None), s.c @ big, atol=1e-4)
    # at the bound itself: sum |C| over unit rows is allowed
    aligned = np.tile(s.h[:1], (len(s.ids), 1))  # all sources equal: norms reach sum |C_k|
    c_pos = np.abs(s.c)
    tagged = s.release(s.ids, s.owners, aligned)
    check_share(c_pos @ tagged, c_pos, s.prf(), s.vectors, node=1, owners=(7,))


# ------------------------------------------------------------------------- a message at once
def _partials(seeds: range) -> dict[str, np.ndarray]:
    """Every single-owner partial of the shares ``seeds`` as a recipient holds a results message:
    coefficients and PRF tags over the node's whole neighbourhood, zero outside the owner's rows."""
    parts: dict[str, list] = {k: [] for k in ("dec", "coef", "prf", "vectors", "nodes", "owners", "mask")}
    for seed in seeds:
        s = Share(seed)
        prf = s.prf()
        for o in (7, 9):
            mine = s.owners == o
            parts["dec"].append(s.c[:, mine] @ s.tagged[mine] + s.noise)
            parts["coef"].append(s.c * mine)
            parts["prf"].append(prf * mine[:, None])
            parts["vectors"].append(s.vectors)
            parts["nodes"].append(int(s.ids[0]))
            parts["owners"].append(o)
            parts["mask"].append(mine)
    return {k: np.array(v) for k, v in parts.items()}


def _check_all(p: dict[str, np.ndarray], dec: np.ndarray | None = None, **kw) -> np.ndarray:
    return check_shares(
        p["dec"] if dec is None else dec,
        p["coef"],
        p["prf"],
        p["vectors"],
        nodes=p["nodes"],
        owners=p["owners"],
        **kw,
    )


def _check_one(p: dict[str, np.ndarray], k: int, dec: np.ndarray, **kw) -> np.ndarray:
    """:func:`check_share` of partial ``k`` on its owner's columns alone."""
    mine = p["mask"][k]
    return check_share(
        dec[k],
        p["coef"][k][:, mine],
        p["prf"][k][mine],
        p["vectors"][k],
        node=int(p["nodes"][k]),
        owners=(int(p["owners"][k]),),
        **kw,
    )


def test_checking_a_message_at_once_agrees_with_each_partial_alone():
    p = _partials(range(6))
    got = _check_all(p)
    assert got.shape == (12, 4, D)
    for k in range(12):
        np.testing.assert_allclose(got[k], _check_one(p, k, p["dec"]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("fault", ["substituted", "scaled", "nan", "out_of_range"])
def test_a_bad_partial_in_a_message_is_refused_as_alone_and_the_first_one_is_named(fault):
    """Two bad partials among twelve: the batch raises the error :func:`check_share` raises for the
    first of them (same node, owner and message), whatever the other partials hold."""
    p = _partials(range(6))
    dec = p["dec"].copy()
    for k in (9, 4):
        if fault == "substituted":  # another owner's released row in place of the first source
            dec[k] = p["coef"][k][:, p["mask"][k]] @ np.roll(Share(k // 2).tagged[p["mask"][k]], 1, axis=0)
        elif fault == "scaled":
            dec[k] *= 1.01
        elif fault == "nan":
            dec[k, 1, 2] = np.nan
        else:
            dec[k, 1, :D] *= 100.0
    with pytest.raises(ResultCheckError) as batch:
        _check_all(p, dec, max_row_norm=None if fault == "scaled" else 1.0)
    with pytest.raises(ResultCheckError) as alone:
        _check_one(p, 4, dec, max_row_norm=None if fault == "scaled" else 1.0)
    assert (batch.value.node, batch.value.owners) == (int(p["nodes"][4]), (int(p["owners"][4]),))
    assert str(batch.value) == str(alone.value)
    _check_one(p, 3, dec)  # the partials before it pass alone


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 11),
            st.integers(0, 3),
            st.integers(0, D + TAG_COLUMNS - 1),
            st.floats(-1.0, 1.0).filter(lambda x: abs(x) > 1e-9),
        ),
        max_size=4,
    ),
    st.sampled_from([1.0, None]),
)
def test_a_message_is_refused_exactly_when_some_partial_alone_is(changes, max_row_norm):
    """Any perturbation of any entries: the batch passes iff every partial passes alone, and else
    raises the error of the first partial that fails alone (random draws do not land within a
    rounding step of the bound, where the two may differ in the last bit)."""
    p = _partials(range(6))
    dec = p["dec"].copy()
    for k, r, c, delta in changes:
        dec[k, r, c] += delta
    first = None
    for k in range(len(dec)):
        try:
            _check_one(p, k, dec, max_row_norm=max_row_norm)
        except ResultCheckError as exc:
            first = exc
            break
    if first is None:
        _check_all(p, dec, max_row_norm=max_row_norm)
    else:
        with pytest.raises(ResultCheckError) as batch:
            _check_all(p, dec, max_row_norm=max_row_norm)
        assert (batch.value.node, batch.value.owners, str(batch.value)) == (
            first.node,
            first.owners,
            str(first),
        )


# ----------------------------------------------------------------------------------------- PRF
def _reference_prf(prf: bytes, session: int, nodes: np.ndarray) -> np.ndarray:
    """The documented layout: node u's T values are keystream words u*T .. u*T+T-1 of ChaCha20 keyed
    by SHA-256("fedgat/tag-prf/v1" || key || session), from block 0."""
    import hashlib

    key = hashlib.sha256(b"fedgat/tag-prf/v1" + prf + int(session).to_bytes(8, "big")).digest()
    top = int(np.max(nodes)) + 1
    enc = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    raw = np.frombuffer(enc.update(bytes(8 * TAG_COLUMNS * top)), dtype=np.uint64)
    words = ((raw >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-52 - 1.0
    return words.reshape(top, TAG_COLUMNS)[nodes]


KEY = bytes(range(32))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=40), st.integers(0, 2**64 - 1))
def test_prf_tags_are_consistent_for_any_node_subset(nodes, session):
    nodes = np.array(nodes, dtype=np.int64)
    got = prf_tags(KEY, session, nodes)
    assert got.shape == (len(nodes), TAG_COLUMNS)
    np.testing.assert_array_equal(got, _reference_prf(KEY, session, nodes))
    # each node alone gives the same values (what the other party computes for its own subset)
    for k in np.unique(np.array([0, len(nodes) - 1, len(nodes) // 2])):
        np.testing.assert_array_equal(prf_tags(KEY, session, nodes[k : k + 1])[0], got[k])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=30), st.data())
def test_prf_tags_of_any_u32_ids_agree_with_any_subset(nodes, data):
    nodes = np.array(nodes, dtype=np.int64)
    got = prf_tags(KEY, 11, nodes)
    subset = np.array(data.draw(st.lists(st.integers(0, len(nodes) - 1), min_size=1, max_size=10)))
    np.testing.assert_array_equal(prf_tags(KEY, 11, nodes[subset]), got[subset])


def test_prf_tags_depend_on_the_key_and_the_session_and_look_uniform():
    nodes = np.arange(5000)
    a = prf_tags(KEY, 1, nodes)
    assert np.all(np.abs(a) < 1.0) and abs(a.mean()) < 0.05 and abs(a.var() - 1 / 3) < 0.02
    assert len(np.unique(a)) == a.size
    assert not np.array_equal(a, prf_tags(KEY, 2, nodes))
    assert not np.array_equal(a, prf_tags(bytes(32), 1, nodes))
    assert prf_tags(KEY, 1, np.zeros(0, np.int64)).shape == (0, TAG_COLUMNS)


def test_prf_tags_cost_follows_the_node_count_not_the_id_range():
    """Node ids come from the bases a server sends: ids spread over the u32 range must not make a
    client draw (and allocate) the keystream of the whole range."""
    spread = np.array([2**32 - 1, 0, 2**31, 5, 2**32 - 3, 6], dtype=np.int64)
    tracemalloc.start()
    try:
        got = prf_tags(KEY, 1, spread)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    for k, u in enumerate(spread):  # each equals the value drawn alone, and the reference's near 0
        np.testing.assert_array_equal(got[k], prf_tags(KEY, 1, spread[k : k + 1])[0])
    np.testing.assert_array_equal(got[[1, 3, 5]], _reference_prf(KEY, 1, spread[[1, 3, 5]]))
    # a run of neighbouring ids across the gap threshold, in shuffled order
    ids = np.random.default_rng(0).permutation(np.concatenate([np.arange(0, 300, 7), np.arange(9000, 9010)]))
    np.testing.assert_array_equal(prf_tags(KEY, 3, ids), _reference_prf(KEY, 3, ids))


def test_tag_columns_are_the_prf_plus_the_check_vector_projection():
    s = Share(3)
    k = s.keys[7]
    got = tag_columns(k, SESSION, s.ids, s.h)
    np.testing.assert_allclose(got, prf_tags(k.prf, SESSION, s.ids) + s.h @ k.vectors(D).T)


# ---------------------------------------------------------------------------------- check keys
def test_check_keys_come_from_the_os_csprng_fresh_per_pair(monkeypatch):
    a, b = CheckKeys.generate(), CheckKeys.generate()
    assert a.prf != b.prf and a.check_seed != b.check_seed  # per pair: no key is shared across owners
    assert not np.allclose(a.vectors(D), b.vectors(D))
    calls = []

    def fake(n: int) -> bytes:
        calls.append(n)
        return b"\x07" * n

    monkeypatch.setattr(tags.os, "urandom", fake)
    k = CheckKeys.generate()
    assert k.prf == k.check_seed == b"\x07" * 32 and calls == [32, 32]


def test_check_keys_round_trip_and_refuse_other_lengths():
    k = CheckKeys(b"p" * 32, b"s" * 32)
    assert CheckKeys.from_bytes(k.to_bytes()) == k and len(k.to_bytes()) == 64
    for bad in (b"", b"x" * 63, b"x" * 65):
        with pytest.raises(ValueError):
            CheckKeys.from_bytes(bad)
    with pytest.raises(ValueError):
        CheckKeys(b"p" * 31, b"s" * 32)
    v = k.vectors(D)
    assert v.shape == (TAG_COLUMNS, D) and np.all(np.abs(v) < 1 / np.sqrt(D))
    np.testing.assert_array_equal(
        v, CheckKeys(b"q" * 32, b"s" * 32).vectors(D)
    )  # the seed's, not the PRF key's
    assert not np.array_equal(v, CheckKeys(b"p" * 32, b"t" * 32).vectors(D))


# ------------------------------------------------------------------------- upload pads (break 22)
def _reference_pads(prf: bytes, session: int, nodes: np.ndarray, dim: int, sigma: float, page_blocks: int):
    """The documented layout, word by word: node u's values are keystream words u*dim .. of
    ChaCha20 keyed by SHA-256("fedgat/upload-pad/v2" || key || session); block b is drawn with
    counter b mod page_blocks and page b // page_blocks in the nonce; each uniform word x on (-1, 1)
    becomes the normal quantile of (x + 1) / 2 (Python's own statistics.NormalDist)."""
    import hashlib
    from statistics import NormalDist

    key = hashlib.sha256(b"fedgat/upload-pad/v2" + prf + int(session).to_bytes(8, "big")).digest()
    out = np.empty((len(nodes), dim))
    for k, u in enumerate(nodes.tolist()):
        for c in range(dim):
            word = u * dim + c
            block, at = divmod(word, 8)
            page, counter = divmod(block, page_blocks)
            nonce = counter.to_bytes(4, "little") + page.to_bytes(8, "little") + bytes(4)
            raw = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(64))
            w = np.frombuffer(raw, dtype=np.uint64)[at]
            x = ((w >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-52 - 1.0
            out[k, c] = NormalDist().inv_cdf(min(max((x + 1) / 2, 2.0**-60), 1 - 2.0**-53))
    return sigma * out


def test_pads_are_gaussian_and_follow_the_documented_layout():
    from scipy import stats

    nodes = np.array([0, 1, 5, 2**32 - 1, 77], dtype=np.int64)
    got = tags.prf_pads(KEY, 9, nodes, 13, 14.0)
    assert got.shape == (5, 13)
    np.testing.assert_allclose(got, _reference_pads(KEY, 9, nodes, 13, 14.0, 1 << 32), rtol=1e-12, atol=1e-12)
    many = tags.prf_pads(KEY, 9, np.arange(2000), 50, 1.0).ravel()
    assert abs(many.mean()) < 0.01 and abs(many.var() - 1.0) < 0.02
    assert stats.kstest(many, "norm").pvalue > 1e-3  # N(0, 1), tails included
    assert np.all(np.isfinite(many)) and np.abs(many).max() < 8.3
    # the keystream's extreme words (its largest rounds to 1.0) stay finite and symmetric
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tags, "_stream_rows", lambda key, nodes, width: np.array([[-1.0, 1.0, 0.0]]))
        edge = tags.prf_pads(KEY, 9, np.array([0]), 3, 1.0)
    assert np.all(np.isfinite(edge)) and edge[0, 0] == -edge[0, 1] and edge[0, 0] < -8 and edge[0, 2] == 0
    assert np.array_equal(tags.prf_pads(KEY, 9, nodes, 13, 0.0), np.zeros((5, 13)))
    # their own keystream: not the tags' values, other per session and per key
    assert not np.allclose(tags.prf_pads(KEY, 9, nodes, TAG_COLUMNS, 1.0), prf_tags(KEY, 9, nodes))
    assert not np.allclose(tags.prf_pads(KEY, 10, nodes, 13, 1.0), got / 14.0)
    assert not np.allclose(tags.prf_pads(bytes(32), 9, nodes, 13, 1.0), got / 14.0)
    # ids beyond u32 could wrap the keystream position onto another node's (a sixteenth pass)
    for bad in ([2**32], [-1], [3, 3 + 2**60]):
        with pytest.raises(ValueError, match="u32"):
            tags.prf_pads(KEY, 9, np.array(bad, dtype=np.int64), 16, 1.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 400), min_size=1, max_size=12, unique=True),
    st.integers(1, 40),
    st.sampled_from([2, 3, 5, 1 << 32]),
    st.data(),
)
def test_pads_of_any_subset_agree_across_pages(ids, dim, page_blocks, data):
    """What the owner draws for its batch and the recipient for a partial's sources agree, however
    the ids fall on keystream blocks and pages (pages made tiny here to cross them often)."""
    nodes = np.array(ids, dtype=np.int64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tags, "_PAGE_BLOCKS", page_blocks)
        got = tags.prf_pads(KEY, 4, nodes, dim, 2.0)
        subset = np.array(data.draw(st.lists(st.integers(0, len(nodes) - 1), min_size=1, max_size=6)))
        np.testing.assert_array_equal(tags.prf_pads(KEY, 4, nodes[subset], dim, 2.0), got[subset])
    np.testing.assert_allclose(
        got, _reference_pads(KEY, 4, nodes, dim, 2.0, page_blocks), rtol=1e-12, atol=1e-12
    )


def test_a_released_row_is_padded_and_tagged_as_padded():
    s = Share(5)
    keys = s.keys[7]
    out = tags.release_rows(keys, SESSION, s.ids, s.h, 14.0)
    padded = s.h + tags.prf_pads(keys.prf, SESSION, s.ids, D, 14.0)
    np.testing.assert_allclose(out[:, :D], padded)
    np.testing.assert_allclose(out[:, D:], tag_columns(keys, SESSION, s.ids, padded))
    np.testing.assert_array_equal(
        tags.release_rows(keys, SESSION, s.ids, s.h, 0.0),
        np.hstack([s.h, tag_columns(keys, SESSION, s.ids, s.h)]),
    )


def _padded_partial(seed: int, pad: float, feature: float | None = None):
    """One owner's padded partial: (decrypted, coefficients, prf, vectors, offsets, honest features,
    released rows); ``feature``: the value of row 2's column 0 (the row renormalised around it)."""
    rng = np.random.default_rng(seed)
    keys = CheckKeys(rng.bytes(32), rng.bytes(32))
    ids = rng.choice(10_000, size=6, replace=False)
    h = _unit(rng, 6)
    if feature is not None:
        h[2, 1:] *= np.sqrt(1 - feature**2) / np.linalg.norm(h[2, 1:])
        h[2, 0] = feature
    c = rng.uniform(-1.0, 1.0, (4, 6)) / 3
    u = tags.release_rows(keys, SESSION, ids, h, pad)
    offsets = tags.pad_offsets(c[None], ids[None], np.ones((1, 6), bool), keys.prf, SESSION, D, pad)[0]
    return c @ u, c, prf_tags(keys.prf, SESSION, ids), keys.vectors(D), offsets, c @ h, u


def _batch_of_one(dec, c, prf, vectors, offsets):
    """:func:`check_shares` of one partial (node 3, owner 7): what :func:`check_share` returns."""
    return check_shares(
        dec[None],
        c[None],
        prf[None],
        vectors[None],
        nodes=np.array([3]),
        owners=np.array([7]),
        offsets=offsets[None],
    )[0]


def test_a_padded_partial_passes_and_comes_back_without_its_pads():
    dec, c, prf, vectors, offsets, want, _ = _padded_partial(1, 14.2)
    noisy = dec + np.random.default_rng(0).standard_normal(dec.shape) * NOISE
    got = check_share(noisy, c, prf, vectors, node=3, owners=(7,), offsets=offsets)
    np.testing.assert_allclose(got, want, atol=10 * NOISE)
    assert np.abs(dec[:, :D]).max() > 1.0  # what crossed the wire was padded
    np.testing.assert_allclose(_batch_of_one(noisy, c, prf, vectors, offsets), got)
    # the tags hold on the padded values; the pads left in, the rows are out of range
    with pytest.raises(ResultCheckError, match="norm"):
        check_share(noisy, c, prf, vectors, node=3, owners=(7,))


@pytest.mark.parametrize("pad", [0.0, 14.2])
def test_the_zero_test_reads_a_feature_only_off_unpadded_rows(pad):
    """Known break 22: the server adds lam times one column of a released row (here row 2's column 0,
    whose feature is 0 or 0.4) to a checked slot. Unpadded, the check fails iff the feature is
    non-zero; padded, it fails either way."""
    verdicts = []
    for feature in (0.0, 0.4):
        dec, c, prf, vectors, offsets, _, u = _padded_partial(2, pad, feature)
        probe = dec.copy()
        probe[1, 0] += 100.0 * u[2, 0]  # what the server can compute from the ciphertext of row 2
        try:
            check_share(probe, c, prf, vectors, node=3, owners=(7,), offsets=offsets)
            verdicts.append("accepted")
        except ResultCheckError:
            verdicts.append("refused")
    assert verdicts == (["accepted", "refused"] if pad == 0 else ["refused", "refused"])


def test_with_pads_the_verdict_never_reads_the_unpadded_share():
    """The tags alone decide a padded share's verdict. A forgery that passes the tags (built here
    with the check vectors known, as a chance pass would) and pushes a row beyond the range is
    refused unpadded, but padded it is clipped: a refusal there would be a predicate of the share
    without its pads, i.e. of unpadded foreign features (the verdict's DP, :mod:`fedgat.verdict_dp`,
    needs every verdict to be a function of the padded rows). So for the same decrypted values the
    verdict is the same whatever the pads (``offsets``) are, and the share returned stays in range."""

    def forge(dec, vectors):
        delta = np.zeros(D)
        delta[0] = 10.0  # far beyond the range bound 1 + sum |C| of row 1
        out = dec.copy()
        out[1, :D] += delta
        out[1, D:] += vectors @ delta  # tags that match: the forgery passes the tag check
        return out

    dec, c, prf, vectors, _, _, _ = _padded_partial(3, 0.0)
    with pytest.raises(ResultCheckError, match="norm"):
        check_share(forge(dec, vectors), c, prf, vectors, node=3, owners=(7,))
    dec, c, prf, vectors, offsets, want, _ = _padded_partial(3, 14.2)
    forged = forge(dec, vectors)
    limit = (1 + np.abs(c[1]).sum()) * (1 + TAG_TOLERANCE)
    for trial in range(5):  # other pads, same decrypted values: the same verdict
        other = offsets if trial == 0 else np.random.default_rng(trial).standard_normal(offsets.shape) * 14.2
        got = check_share(forged, c, prf, vectors, node=3, owners=(7,), offsets=other)
        assert np.linalg.norm(got[1]) <= limit * (1 + 1e-12)
        np.testing.assert_allclose(_batch_of_one(forged, c, prf, vectors, other), got)
    got = check_share(forged, c, prf, vectors, node=3, owners=(7,), offsets=offsets)
    np.testing.assert_allclose(got[[0, 2, 3]], want[[0, 2, 3]], atol=1e-9)  # honest rows untouched
    assert np.linalg.norm(got[1]) == pytest.approx(limit)


def test_pad_offsets_are_the_coefficients_times_each_sources_pad():
    rng = np.random.default_rng(4)
    c = rng.uniform(-1, 1, (3, 4, 5))
    sources = rng.choice(50, size=(3, 5))
    theirs = rng.random((3, 5)) < 0.6
    got = tags.pad_offsets(c, sources, theirs, KEY, 8, 7, 3.0)
    dense = tags.prf_pads(KEY, 8, sources.ravel(), 7, 3.0).reshape(3, 5, 7) * theirs[:, :, None]
    np.testing.assert_allclose(got, c @ dense, atol=1e-12)
    assert not tags.pad_offsets(c, sources, theirs, KEY, 8, 7, 0.0).any()
