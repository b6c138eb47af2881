"""A client's encryption pool (:mod:`fedgat.crypto.encrypt_pool`): worker processes that hold public
contexts only make exactly what ``encrypt_rows`` makes, under the right recipient's key, and fail
loudly (a typed error, the pool closed, no process left behind)."""

from __future__ import annotations

import gc
import os
import signal
import time

import numpy as np
import pytest

from fedgat.crypto import KeyMismatchError, ServerContext, SlotLayout, decrypt_rows, deserialize, encrypt_rows
from fedgat.crypto.encrypt_pool import (
    MIN_ENCRYPTIONS_PER_WORKER,
    EncryptionPool,
    EncryptionWorkerError,
    EncryptionWorkerStartError,
    encrypt_pool_size,
)

D = 300  # two chunks at n4096 (2048 slots): several envelopes per row


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped) counts as gone
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def _gone(pids: list[int], wait: float = 5.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def two_keys(holder, other_holder):
    pubs = {
        3: ServerContext.from_bytes(holder.public_context_bytes()),
        7: ServerContext.from_bytes(other_holder.public_context_bytes()),
    }
    return {3: holder, 7: other_holder}, pubs


@pytest.fixture(scope="module")
def rows(unit_rows):
    return unit_rows(np.random.default_rng(0), 20, D)


def test_pool_encrypts_like_encrypt_rows_under_each_recipients_key(two_keys, rows):
    holders, pubs = two_keys
    layout = SlotLayout.for_dimension(D, pubs[3].slots)
    assert layout.chunks == 2
    with EncryptionPool(pubs, layout, 2) as pool:
        tickets = [(key, lo, pool.submit(key, rows[lo : lo + 4])) for lo in range(0, 20, 4) for key in (3, 7)]
        # collected out of submission order: each ticket still gets its own rows back
        for key, lo, ticket in reversed(tickets):
            blobs, cpu = pool.result(ticket)
            want = list(encrypt_rows(pubs[key], rows[lo : lo + 4], layout))
            assert len(blobs) == len(want) == 4 * layout.chunks
            assert [deserialize(pubs[key], b, level="fresh").size() for b in blobs] == [layout.slots] * len(
                blobs
            )
            got = decrypt_rows(holders[key], blobs, 4, layout, kind="fresh")
            np.testing.assert_allclose(got, rows[lo : lo + 4], atol=1e-6)
            other = 7 if key == 3 else 3
            with pytest.raises(KeyMismatchError):  # bound to its recipient's key, no other
                deserialize(pubs[other], blobs[0], level="fresh")
            assert cpu > 0
        with pytest.raises(KeyError):
            pool.result(tickets[0][2])  # each result is handed out once


def test_pool_refuses_bad_batches_before_any_worker_sees_them(two_keys, rows):
    _, pubs = two_keys
    layout = SlotLayout.for_dimension(D, pubs[3].slots)
    with EncryptionPool({3: pubs[3]}, layout, 1) as pool:
        with pytest.raises(ValueError, match="not one of the pool's"):
            pool.submit(7, rows)
        with pytest.raises(ValueError, match="shape"):
            pool.submit(3, rows[:, :-1])
        with pytest.raises(KeyError):
            pool.result(12345)
        ticket = pool.submit(3, rows[:2])
        assert len(pool.result(ticket)[0]) == 2 * layout.chunks


def test_a_worker_that_dies_raises_a_typed_error_and_the_pool_closes(two_keys, rows):
    _, pubs = two_keys
    layout = SlotLayout.for_dimension(D, pubs[3].slots)
    pool = EncryptionPool(pubs, layout, 2)
    pids = pool.pids
    ticket = pool.submit(3, rows)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(EncryptionWorkerError, match="encryption worker"):
        pool.result(ticket)
    assert pool.closed
    assert _gone(pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(3, rows)


def test_a_worker_refuses_a_context_with_a_secret_key(holder, rows):
    """The workers load what they are given as a *public* context: bytes with a secret part are
    refused there (NotPublicContextError), so a pool cannot be made to hold a secret key."""

    class Leaky:
        wire = "compact"

        def public_context_bytes(self) -> bytes:
            return holder.secret_context_bytes()

    layout = SlotLayout.for_dimension(D, holder.slots)
    with pytest.raises(EncryptionWorkerError, match="refused its contexts: NotPublicContextError") as exc:
        EncryptionPool({3: Leaky()}, layout, 2)  # type: ignore[dict-item]
    assert not isinstance(exc.value, EncryptionWorkerStartError)  # a bug to report, not to work around


def test_closing_or_dropping_a_pool_ends_its_workers(two_keys, rows):
    _, pubs = two_keys
    layout = SlotLayout.for_dimension(D, pubs[3].slots)
    pool = EncryptionPool(pubs, layout, 2)
    assert pool.start_cpu > 0  # the workers' start-up, reported with their ready answers
    pids = pool.pids
    ticket = pool.submit(3, rows)  # a batch left uncollected
    pool.close()
    pool.close()  # idempotent
    assert _gone(pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.result(ticket)
    dropped = EncryptionPool(pubs, layout, 1)
    pids = dropped.pids
    del dropped
    gc.collect()
    assert _gone(pids)


@pytest.mark.parametrize(
    ("requested", "encryptions", "want"),
    [
        (0, 10**6, 0),  # not asked for
        (8, MIN_ENCRYPTIONS_PER_WORKER * 2 - 1, 0),  # one worker's worth: stay in process
        (8, MIN_ENCRYPTIONS_PER_WORKER * 2, 2),
        (8, MIN_ENCRYPTIONS_PER_WORKER * 5 + 3, 5),
        (8, 10**6, 8),
        (1, 10**6, 0),  # one worker only moves the work
    ],
)
def test_pool_size_follows_the_uploads(requested, encryptions, want):
    assert encrypt_pool_size(requested, encryptions) == want


def test_pool_size_refuses_a_negative_request():
    with pytest.raises(ValueError):
        encrypt_pool_size(-1, 100)


def _in_a_party_host(conn, context_bytes: bytes, rows_bytes: bytes) -> None:
    """What a process-engine host is: daemonic (multiprocessing forbids it children) and refusing
    every pickle (``forbid_pickle``); a client hosted there starts its pool all the same."""
    from fedgat.process_worker import _forbid_pickle

    _forbid_pickle()
    pub = ServerContext.from_bytes(context_bytes)
    rows = np.frombuffer(rows_bytes).reshape(-1, D)
    with EncryptionPool({3: pub}, SlotLayout.for_dimension(D, pub.slots), 2) as pool:
        blobs = [b for t in [pool.submit(3, rows[:3]), pool.submit(3, rows[3:6])] for b in pool.result(t)[0]]
    for blob in blobs:
        conn.send_bytes(blob)
    conn.send_bytes(b"")


def test_a_pool_starts_inside_a_daemonic_host_that_refuses_pickles(holder, rows):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    host = ctx.Process(
        target=_in_a_party_host, args=(theirs, holder.public_context_bytes(), rows.tobytes()), daemon=True
    )
    host.start()
    try:
        assert mine.poll(120), "the host did not answer"
        blobs = list(iter(mine.recv_bytes, b""))
    finally:
        host.join(10)
    layout = SlotLayout.for_dimension(D, holder.slots)
    assert len(blobs) == 6 * layout.chunks and host.exitcode == 0
    got = decrypt_rows(holder, blobs, 6, layout, kind="fresh")
    np.testing.assert_allclose(got, rows[:6], atol=1e-6)


def test_workers_that_cannot_start_raise_a_typed_error_and_leave_nothing_behind(two_keys, monkeypatch):
    from fedgat.crypto import encrypt_pool

    _, pubs = two_keys
    started = []
    popen = encrypt_pool.subprocess.Popen

    def broken(args, **kwargs):  # an interpreter that exits at once, as one that cannot import would
        p = popen(["/bin/sh", "-c", "exit 3"], **kwargs)
        started.append(p.pid)
        return p

    monkeypatch.setattr(encrypt_pool.subprocess, "Popen", broken)
    with pytest.raises(
        EncryptionWorkerStartError, match=r"encryption worker 0 \(pid \d+\) \(exit status 3\)"
    ):
        EncryptionPool(pubs, SlotLayout.for_dimension(D, pubs[3].slots), 2)
    assert len(started) == 2 and _gone(started)


def test_a_worker_that_hangs_at_start_cannot_block_its_client(two_keys, monkeypatch):
    from fedgat.crypto import encrypt_pool

    _, pubs = two_keys
    started = []
    popen = encrypt_pool.subprocess.Popen

    def hung(args, **kwargs):  # reads nothing, answers nothing
        p = popen(["/bin/sh", "-c", "exec sleep 60"], **kwargs)
        started.append(p.pid)
        return p

    monkeypatch.setattr(encrypt_pool.subprocess, "Popen", hung)
    monkeypatch.setattr(encrypt_pool, "START_TIMEOUT", 0.5)
    clock = time.monotonic()
    with pytest.raises(EncryptionWorkerError, match=r"within 0.5 s") as exc:
        EncryptionPool(pubs, SlotLayout.for_dimension(D, pubs[3].slots), 2)
    assert not isinstance(exc.value, EncryptionWorkerStartError)
    assert time.monotonic() - clock < 10 and _gone(started)  # killed, not waited for
