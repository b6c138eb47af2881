"""Encrypted encodings equal the plaintext encodings built with the same bases."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from he_helpers import assert_keyed_results_decrypt, two_recipients

from fedgat.crypto import KeyHolderContext, ServerContext, SlotLayout, decrypt_rows, deserialize, encrypt_rows
from fedgat.crypto.encodings import CiphertextSpool, compute_bucket, decrypt_bucket, multiply_adds
from fedgat.crypto.errors import CiphertextFormatError, KeyMismatchError
from fedgat.encodings import draw_bases, encode_bucket

from graph_helpers import random_csr, unit_rows


@pytest.fixture(scope="module")
def keys():
    holder = KeyHolderContext.generate("n4096")
    return holder, ServerContext.from_bytes(holder.public_context_bytes())


@pytest.mark.parametrize("variant", ["vector", "matrix"])
def test_encrypted_encodings_match_plaintext(keys, variant):
    holder, server = keys
    csr = random_csr(24, 5 if variant == "vector" else 3, seed=31)
    x = unit_rows(24, 40, seed=32)
    layout = SlotLayout.for_dimension(40, server.slots)
    spool = CiphertextSpool(server, layout)
    for node, row in enumerate(x.numpy()):
        for chunk, blob in enumerate(encrypt_rows(holder, row[None], layout)):
            spool.put(node, chunk, blob)
    nodes = np.arange(24)
    own = {i: x[i].numpy() for i in range(0, 24, 2)}  # the client owns the even nodes
    worst = 0.0
    for bases in draw_bases(variant, csr, nodes, rng=5):
        results = list(compute_bucket(server, layout, spool, bases))
        # every row is computed, h_i (row 0) included
        assert all(
            len(r.row_blobs) == layout.groups(bases.num_feature_rows()) * layout.chunks for r in results
        )
        got = decrypt_bucket(holder, layout, bases, results, own_features=own, dtype=torch.float64)
        want = encode_bucket(bases, x)
        err = (got.features - want.features).abs().max().item()
        # the decrypted h_i of a node the client does not own (no plaintext substitution)
        bare = decrypt_bucket(holder, layout, bases, results, dtype=torch.float64)
        err = max(err, (bare.features - want.features).abs().max().item())
        terms = bases.n
        bound = holder.error_bound(terms, max_coeff=float(np.abs(bases.coefficients()).max()))
        assert err <= bound, (err, bound)
        worst = max(worst, err)
        assert multiply_adds(bases, layout) > 0
    assert worst < 1e-5
    spool.close()


def test_spool_rejects_duplicates_and_foreign_keys(keys):
    holder, server = keys
    layout = SlotLayout.for_dimension(8, server.slots)
    spool = CiphertextSpool(server, layout)
    blob = next(encrypt_rows(holder, np.ones((1, 8)) / np.sqrt(8), layout))
    spool.put(0, 0, blob)
    with pytest.raises(CiphertextFormatError, match="duplicate"):
        spool.put(0, 0, blob)
    other = KeyHolderContext.generate("n4096")
    foreign = next(encrypt_rows(other, np.ones((1, 8)) / np.sqrt(8), layout))
    with pytest.raises(KeyMismatchError):
        spool.put(1, 0, foreign)
    assert 1 not in spool and spool.bytes_stored == len(blob)
    spool.close()


def test_parallel_encoder_matches_serial(keys):
    from fedgat.crypto.encoders import ProcessPoolEncoder

    holder, server = keys
    csr = random_csr(16, 4, seed=41)
    x = unit_rows(16, 12, seed=42)
    layout = SlotLayout.for_dimension(12, server.slots)
    spool = CiphertextSpool(server, layout)
    for node, row in enumerate(x.numpy()):
        for chunk, blob in enumerate(encrypt_rows(holder, row[None], layout)):
            spool.put(node, chunk, blob)
    bases = draw_bases("vector", csr, np.arange(16), rng=3)
    with ProcessPoolEncoder(
        holder.public_context_bytes(), layout, spool, workers=2, chunksize=2, window=2
    ) as enc:
        parallel = list(enc.map(bases))
        assert 1 <= enc.max_in_flight <= 2  # the bounded submission window
    serial = [r for b in bases for r in compute_bucket(server, layout, spool, b)]
    assert [r.node for r in parallel] == [r.node for r in serial]
    for p, s in zip(parallel, serial):
        assert len(p.row_blobs) == len(s.row_blobs)
        a = holder.decrypt_vector(deserialize(holder, p.row_blobs[0]))
        b = holder.decrypt_vector(deserialize(holder, s.row_blobs[0]))
        np.testing.assert_allclose(a, b, atol=1e-6)
    spool.close()


def _two_recipients(keys, seed: int, dim: int = 10):
    """:func:`he_helpers.two_recipients` for the module's key and a fresh one:
    ``(holders, servers, x, layout, spools, csr)``."""
    holders = [keys[0], KeyHolderContext.generate("n4096")]
    return holders, *two_recipients(holders, seed, dim)


def test_round_pool_serves_every_recipient_under_its_own_key(keys):
    """One :class:`RoundPool` computes two recipients' encodings, each under that recipient's key and
    from its spool: each decrypts (with its own key only) to the plaintext encodings, and a recipient
    the pool was not started for is refused."""
    from fedgat.crypto.encoders import LocalEncoderFactory, ProcessPoolEncoder, RoundPool

    holders, servers, x, layout, spools, csr = _two_recipients(keys, seed=61)
    bases = draw_bases("vector", csr, np.arange(12), rng=9)
    factory = LocalEncoderFactory(workers=2)
    factory.prepare({7: (servers[0], spools[0], 12), 9: (servers[1], spools[1], 12)}, layout)
    pool = factory.pool
    assert isinstance(pool, RoundPool) and pool.keys == {7, 9} and pool.workers == 2
    try:
        for holder, server, spool in zip(holders, servers, spools, strict=True):
            enc = factory(server, layout, spool, 12)
            assert isinstance(enc, ProcessPoolEncoder) and enc.workers == 2
            results = list(enc.map(bases))
            enc.close()  # the round's pool outlives its recipients' encoders
            assert factory.pool is pool and pool.executor is not None
            it = iter(results)
            for b in bases:
                got = decrypt_bucket(
                    holder, layout, b, [next(it) for _ in range(len(b))], dtype=torch.float64
                )
                assert (got.features - encode_bucket(b, x).features).abs().max().item() < 1e-5
        with pytest.raises(ValueError, match="not one of the round pool's"):
            ProcessPoolEncoder(holders[0].public_context_bytes(), layout, spools[0], round_pool=pool, key=8)
    finally:
        factory.close()
    assert factory.pool is None and pool.executor is None
    factory.close()  # idempotent
    for spool in spools:
        spool.close()


def test_a_round_pool_hands_its_workers_setup_files_not_contexts(keys, monkeypatch):
    """ "spawn" writes a worker's initializer arguments into its start-up pipe in one piece, and the
    worker reads them only after importing ``__main__``: more than the pipe's 64 KiB holds the parent
    until then, so the workers start one after another. The recipients' public contexts (each over
    that) go to the workers as setup files, the arguments stay small, and a worker initialised from
    them holds each recipient's context and spool index as the spools have them."""
    import pickle

    from fedgat.crypto import encoders, tasks

    _, servers, _, layout, spools, _ = _two_recipients(keys, seed=67)
    started: list[dict] = []
    real = encoders.ProcessPoolExecutor

    def spying(*args, **kwargs):
        started.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(encoders, "ProcessPoolExecutor", spying)
    contexts = {7: servers[0].public_context_bytes(), 9: servers[1].public_context_bytes()}
    assert all(len(c) > 64 * 1024 for c in contexts.values())  # what the pipe could not hold
    pool = encoders.RoundPool(
        {k: (c, s) for (k, c), s in zip(contexts.items(), spools, strict=True)}, layout, "compact", 2
    )
    saved = dict(tasks._WORKER)
    try:
        (kwargs,) = started
        assert len(pickle.dumps(kwargs["initargs"])) < 4096
        kwargs["initializer"](*kwargs["initargs"])  # what each worker runs first, here in-process
        opened = tasks._WORKER["recipients"]
        assert set(opened) == {7, 9} and tasks._WORKER["wire"] == "compact"
        for (key, context), spool in zip(contexts.items(), spools, strict=True):
            ctx, reader = opened[key]
            assert ctx.public_context_bytes() == context
            assert reader._index == spool.snapshot()[1] and str(reader.path) == spool.snapshot()[0]
            reader.close()
    finally:
        tasks._WORKER.clear()
        tasks._WORKER.update(saved)
        pool.close()
    assert not any(Path(p).exists() for p in kwargs["initargs"][0].values())  # removed with the pool
    for spool in spools:
        spool.close()


def test_a_round_pool_that_fails_to_start_leaves_no_setup_files_and_late_workers_skip_gone_spools(
    keys, monkeypatch, tmp_path
):
    """A setup file that cannot be written ends the pool's construction with its private directory
    removed; a worker started after a starting recipient's spool was deleted opens the others only."""
    from fedgat.crypto import encoders, tasks

    _, servers, _, layout, spools, _ = _two_recipients(keys, seed=73)
    contexts = [server.public_context_bytes() for server in servers]
    written: list[str] = []
    real_write = encoders.write_recipient_setup

    def failing(path, context, spool):
        written.append(path)
        if len(written) == 2:
            raise OSError("disk full")
        real_write(path, context, spool)

    monkeypatch.setattr(encoders, "write_recipient_setup", failing)
    with pytest.raises(OSError, match="disk full"):
        encoders.RoundPool({7: (contexts[0], spools[0]), 9: (contexts[1], spools[1])}, layout, "compact", 2)
    assert len(written) == 2 and not Path(written[0]).parent.exists()
    monkeypatch.undo()

    setups = {}
    for key, context, spool in zip((7, 9), contexts, spools, strict=True):
        setups[key] = str(tmp_path / f"start-{key}.npz")
        tasks.write_recipient_setup(setups[key], context, spool)
    spools[0].close()  # recipient 7 left: its spool is deleted
    saved = dict(tasks._WORKER)
    try:
        tasks.worker_init_from_setups(setups, layout, "compact")
        assert set(tasks._WORKER["recipients"]) == {9}
        tasks._WORKER["recipients"][9][1].close()
    finally:
        tasks._WORKER.clear()
        tasks._WORKER.update(saved)
    spools[1].close()


def test_recipients_join_a_running_round_pool_one_after_another(keys):
    """An upload window computes recipients one by one: they join one :class:`RoundPool` (started
    by the first, :meth:`LocalEncoderFactory.add_recipient`) and leave it when done. Each decrypts
    with its own key to the plaintext encodings; a recipient that left is refused (also as a new
    joiner: workers know recipients by key), its setup file is gone, and between tasks no worker
    holds a spool file open, even one that ran none of them (a deleted spool's disk is freed)."""
    from fedgat.crypto.encoders import LocalEncoderFactory, ProcessPoolEncoder

    holders, servers, x, layout, spools, csr = _two_recipients(keys, seed=67)
    bases = draw_bases("vector", csr, np.arange(12), rng=5)
    factory = LocalEncoderFactory(workers=2)
    paths = [str(spool.snapshot()[0]) for spool in spools]

    def open_spools(pool) -> set[str]:
        held = set()
        for pid in pool.executor._processes:  # the workers (the spawned pool's own table)
            fd_dir = f"/proc/{pid}/fd"
            for fd in os.listdir(fd_dir):
                try:
                    held.add(os.readlink(os.path.join(fd_dir, fd)).removesuffix(" (deleted)"))
                except OSError:
                    pass
        return held

    pool = None
    try:
        for key, holder, server, spool in zip((7, 9), holders, servers, spools, strict=True):
            factory.add_recipient(key, server, spool, layout, round_multiply_adds=10**6)
            assert pool is None or factory.pool is pool  # started once, by the first recipient
            pool = factory.pool
            assert pool is not None and pool.keys == {key} and pool.workers == 2
            enc = factory(server, layout, spool, 12)
            assert isinstance(enc, ProcessPoolEncoder) and enc._pool is pool
            if key == 7:  # one group piece per batch: both workers run some of them
                results = [r for _, r in pool.map([(key, bases)], layout, enc, 1, 1)]
            else:  # one batch: one worker runs none of it
                results = [r for _, r in pool.map([(key, bases)], layout, enc, 10**6, 10**9)]
            enc.close()
            if sys.platform.startswith("linux"):
                assert not open_spools(pool) & set(paths)
            it = iter(results)
            for b in bases:
                got = decrypt_bucket(
                    holder, layout, b, [next(it) for _ in range(len(b))], dtype=torch.float64
                )
                assert (got.features - encode_bucket(b, x).features).abs().max().item() < 1e-5
            setup = pool._setups[key]
            factory.remove_recipient(key)
            assert not os.path.exists(setup) and key not in pool.keys
            with pytest.raises(ValueError, match="not one of the round pool's"):
                list(pool.map([(key, bases)], layout, enc))
        with pytest.raises(ValueError, match="is or was one of the round pool's"):
            factory.add_recipient(7, servers[0], spools[0], layout, round_multiply_adds=10**6)
        with pytest.raises(ValueError, match="one ciphertext wire"):
            other = ServerContext.from_bytes(holders[0].public_context_bytes(), wire="tenseal")
            factory.add_recipient(8, other, spools[0], layout, round_multiply_adds=10**6)
    finally:
        factory.close()
    assert pool is not None and pool.executor is None and pool._dir is None
    small = LocalEncoderFactory(workers=None)  # a round too small for a pool: inline, as before
    small.add_recipient(7, servers[0], spools[0], layout, round_multiply_adds=1)
    assert small.pool is None and small(servers[0], layout, spools[0], 1).workers == 0
    for spool in spools:
        spool.close()


def test_round_stream_interleaves_recipients_in_one_window(keys, monkeypatch):
    """:meth:`LocalEncoderFactory.map_round` runs two recipients through one window of the round's
    pool, their batches interleaved: the second recipient's first batch is submitted and its first
    result read before the first recipient's last one (every client decrypts while the others do),
    each recipient's nodes come back in its own order and whole even when their group pieces
    (``max_task_cost=1``) alternate with the other recipient's, at most ``window`` batches are ever in
    flight, and every result decrypts under its own recipient's key to the plaintext encodings.
    Without a pool, the same results come inline, one recipient after the other."""
    from fedgat.crypto import encoders
    from fedgat.crypto.encoders import LocalEncoderFactory
    from fedgat.crypto.tasks import pieces

    holders, servers, x, layout, spools, csr = _two_recipients(keys, seed=71, dim=600)
    bases = draw_bases("vector", csr, np.arange(12), rng=11)
    per_recipient = sum(len(b) for b in bases)
    cut = list(pieces(bases, layout.chunks, layout.blocks, max_cost=1))
    assert sum(not last for *_, last in cut) >= 4  # some nodes are cut into several pieces
    read = [0]  # results the consumer has read so far
    submitted: list[tuple[int, int]] = []  # (recipient key, results read when its batch was submitted)
    real_map = encoders.RoundPool.map

    def spying_map(self, jobs, layout, window, chunksize=32, max_task_cost=512, weights=None):
        submit = self.executor.submit

        def spy(fn, key, batch):
            submitted.append((key, read[0]))
            return submit(fn, key, batch)

        self.executor.submit = spy  # type: ignore[method-assign]
        yield from real_map(self, jobs, layout, window, 1, 1, weights)  # one group piece per batch

    monkeypatch.setattr(encoders.RoundPool, "map", spying_map)
    recipients = {7: (servers[0], spools[0], 12), 9: (servers[1], spools[1], 12)}
    for workers in (2, 0):
        factory = LocalEncoderFactory(workers=workers)
        factory.prepare(recipients, layout)
        assert factory.pool_workers == workers
        results: list[tuple[int, object]] = []
        try:
            for r in factory.map_round([(7, bases), (9, bases)], layout, {7: 1, 9: 1}):
                results.append(r)
                read[0] += 1
        finally:
            factory.close()
        keys_read = [key for key, _ in results]
        assert keys_read.count(7) == keys_read.count(9) == per_recipient
        if workers:
            first_of_9 = next(at for key, at in submitted if key == 9)
            assert first_of_9 < per_recipient  # submitted while recipient 7's results were still coming
            assert keys_read.index(9) < len(keys_read) - 1 - keys_read[::-1].index(7)  # read interleaved
            assert 1 <= factory.max_in_flight <= factory.window == 8
        else:
            assert keys_read == [7] * per_recipient + [9] * per_recipient
        assert_keyed_results_decrypt(results, {7: holders[0], 9: holders[1]}, bases, x, layout)
        submitted.clear()
        read[0] = 0
    factory = LocalEncoderFactory(workers=0)
    factory.prepare(recipients, layout)
    with pytest.raises(ValueError, match="not prepared"):
        list(factory.map_round([(8, bases)], layout))
    factory = LocalEncoderFactory(workers=1)
    factory.prepare(recipients, layout)
    try:
        with pytest.raises(ValueError, match="each key once"):
            list(factory.map_round([(7, bases), (7, bases)], layout))
    finally:
        factory.close()
    for spool in spools:
        spool.close()


def test_parallel_encoder_splits_large_nodes_into_group_pieces(keys):
    """A node above ``max_task_cost`` is computed as runs of whole result groups on the pool and
    reassembled in group order: the decryption equals the plaintext encodings."""
    from fedgat.crypto.encoders import ProcessPoolEncoder
    from fedgat.crypto.tasks import pieces as task_pieces

    holder, server = keys
    d = 600  # 3 blocks per ciphertext: a node with 6 rows needs 2 groups
    csr = random_csr(10, 5, seed=51)
    x = unit_rows(10, d, seed=52)
    layout = SlotLayout(d, server.slots, 1)
    assert layout.blocks < 6
    spool = CiphertextSpool(server, layout)
    for node, row in enumerate(x.numpy()):
        for chunk, blob in enumerate(encrypt_rows(holder, row[None], layout)):
            spool.put(node, chunk, blob)
    bases = draw_bases("vector", csr, np.arange(10), rng=7)
    pieces = list(task_pieces(bases, layout.chunks, layout.blocks, max_cost=1))
    assert len(pieces) > 10 and sum(p[3] for p in pieces) == 10  # split, one last piece per node
    with ProcessPoolEncoder(
        holder.public_context_bytes(), layout, spool, workers=1, chunksize=3, max_task_cost=1
    ) as enc:
        results = list(enc.map(bases))
    assert [r.node for r in results] == [int(n) for b in bases for n in b.nodes]
    it = iter(results)
    for b in bases:
        got = decrypt_bucket(holder, layout, b, [next(it) for _ in range(len(b))], dtype=torch.float64)
        err = (got.features - encode_bucket(b, x).features).abs().max().item()
        assert err < 1e-5, err
    spool.close()


def test_packed_partials_decrypt_to_each_nodes_own_partial(keys):
    """A recipient's partials of one owner, packed (PackedShares): each pack decrypts, unpacked, to
    the direct sum of its nodes' partials; fewer result ciphertexts, no more multiply-adds."""
    from fedgat.crypto.encodings import PackedShares, ShareBucket
    from fedgat.crypto.evaluator import evaluator_for

    holder, server = keys
    n_nodes, d = 40, 18
    csr = random_csr(n_nodes, 4, seed=7)
    x = unit_rows(n_nodes, d, seed=8).numpy()
    layout = SlotLayout.for_dimension(d, server.slots)
    spool = CiphertextSpool(server, layout)
    for node, row in enumerate(x):
        for chunk, blob in enumerate(encrypt_rows(holder, row[None], layout)):
            spool.put(node, chunk, blob)
    (bases, *_) = draw_bases("vector", csr, np.arange(n_nodes), rng=3)
    foreign = bases.neighbours % 3 == 1  # the neighbours "owner 1" holds
    share = ShareBucket(bases, foreign, owner=1)
    packed = PackedShares(share, layout)
    rows = share.num_feature_rows()
    assert layout.pack_size(rows) > 1 and any(len(p) > 1 for p in packed.packs)
    ev = evaluator_for(server)  # shared per context: count this test's operations only
    before = (ev.ops.multiplies, ev.ops.rescales)
    apart = 0
    for s in range(len(packed)):
        slots = packed.packs[s]
        sources = [spool.get(int(j)) for j in packed.neighbours[s]]
        blobs = ev.linear_map(layout, sources, packed.coefficients(s))
        assert len(blobs) == layout.packed_groups(len(slots), rows) * layout.chunks
        got = layout.unpack_items(decrypt_rows(holder, blobs, len(slots) * rows, layout), len(slots), rows)
        for i, slot in enumerate(slots.tolist()):
            want = share.coefficients(slot) @ x[share.neighbours[slot]]
            np.testing.assert_allclose(got[i], want, atol=1e-5)
            apart += layout.groups(rows) * layout.chunks
    assert packed.result_groups() * layout.chunks < apart
    multiplies, rescales = ev.ops.multiplies - before[0], ev.ops.rescales - before[1]
    assert multiplies == packed.multiply_adds(layout) <= share.multiply_adds(layout)
    assert rescales == packed.result_groups() * layout.chunks
    spool.close()
