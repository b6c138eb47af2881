"""Clients encrypting on worker processes (``encrypt_workers``, :mod:`fedgat.crypto.encrypt_pool`):
the round and its messages are the ones a client encrypting in its own process makes, with and
without an upload window; a pool that fails leaves the client's state as it was."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from fedgat.crypto import encrypt_pool
from fedgat.crypto.encrypt_pool import EncryptionPool, EncryptionWorkerError
from fedgat.pipeline import max_abs_error, run_plaintext_pretraining
from fedgat.protocols import ClientState, FeatureUpload
from fedgat.protocols.messages import Abort, AbortCode

from protocol_helpers import Harness

TOL = 1e-5


@pytest.fixture
def pools(monkeypatch):
    """Every pool the clients start (the tiny round's uploads are worth a pool of 2 here)."""
    monkeypatch.setattr(encrypt_pool, "MIN_ENCRYPTIONS_PER_WORKER", 1)
    started: list[EncryptionPool] = []
    init = EncryptionPool.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        started.append(self)

    monkeypatch.setattr(EncryptionPool, "__init__", record)
    return started


def _uploads(h: Harness) -> dict[int, list[tuple[int, tuple[tuple[int, int], ...]]]]:
    """Per client: each FeatureUpload's recipient and its (node, chunk) items, in sending order."""
    return {
        c: [(m.target, tuple((i.node, i.chunk) for i in m.items)) for m in h.sent(c, FeatureUpload)]
        for c in h.roster.clients
    }


@pytest.mark.parametrize("window", [None, 1])
def test_clients_on_encryption_pools_send_the_same_uploads_and_get_the_same_encodings(
    tiny_graph, tiny_partition, pools, window
):
    inline = Harness(tiny_graph, tiny_partition, upload_batch=3, upload_window=window).start().run()
    pooled = (
        Harness(tiny_graph, tiny_partition, upload_batch=3, upload_window=window, encrypt_workers=2)
        .start()
        .run()
    )
    assert len(pools) == len(pooled.roster.clients)  # one per client, two workers each
    assert all(p.workers == 2 and p.closed for p in pools)  # closed once the uploads were sent
    assert all(c._pool is None for c in pooled.parties.clients.values())
    assert all(p.done for p in pooled.parties.all().values())
    assert _uploads(pooled) == _uploads(inline)
    got = {c: pooled.client(c).encodings for c in pooled.roster.clients}
    assert max_abs_error(got, run_plaintext_pretraining(tiny_graph, tiny_partition, "vector", seed=1)) <= TOL
    # the workers' CPU (their start-up included) is charged to the client's encryption
    spent = [pooled.client(c).encrypt_worker_cpu for c in pooled.roster.clients]
    assert sum(spent) >= sum(p.start_cpu for p in pools) > 0 and all(x > 0 for x in spent)
    assert all(pooled.client(c).cpu_timings["encrypt"] >= x for c, x in zip(pooled.roster.clients, spent))


def test_a_failed_pool_leaves_the_batch_queued_and_the_next_step_starts_a_new_one(
    tiny_graph, tiny_partition, pools, monkeypatch
):
    from fedgat.protocols import pretrain_client

    sized: list[tuple[int, int]] = []  # (client, the encryptions its pool was sized for)
    size = pretrain_client.encrypt_pool_size

    def spy(requested: int, encryptions: int) -> int:
        caller = sys._getframe(1).f_locals["self"]  # the client sizing its pool
        sized.append((caller.party_id, encryptions))
        return size(requested, encryptions)

    monkeypatch.setattr(pretrain_client, "encrypt_pool_size", spy)
    h = Harness(tiny_graph, tiny_partition, upload_batch=3, encrypt_workers=2).start()
    h.run(until=lambda: all(c.state is ClientState.UPLOADING for c in h.parties.clients.values()))
    client = h.client(h.roster.clients[0])
    snapshots = []
    step = client.step

    def watched():
        snapshots.append(client._snapshot())
        return step()

    client.step = watched  # type: ignore[method-assign]
    h.run(until=lambda: client._pool is not None)
    pool = client._pool
    assert pool is not None and len(pools) == 1 and client.has_work()
    for pid in pool.pids:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(EncryptionWorkerError):
        h.run()  # batches already encrypted ahead may still go out first
    assert client._snapshot() == snapshots[-1]  # the failed batch is still queued, nothing sent for it
    assert pool.closed and client._pool is None
    assert client.layout is not None
    left = sum(min(3, len(client.releases[r]) - start) for r, start in client._queue) * client.layout.chunks
    total = sum(len(v) for v in client.releases.values()) * client.layout.chunks
    mine = [e for c, e in sized if c == client.party_id]
    assert mine == [total] and 0 < left < total
    h.run()
    # the new pool is sized for the encryptions left, not the client's total
    assert [e for c, e in sized if c == client.party_id] == [total, left]
    assert len(pools) == len(h.roster.clients) + 1  # a new pool took over, the other clients had theirs
    assert all(p.done for p in h.parties.all().values())
    got = {c: h.client(c).encodings for c in h.roster.clients}
    assert max_abs_error(got, run_plaintext_pretraining(tiny_graph, tiny_partition, "vector", seed=1)) <= TOL


def test_an_aborted_client_stops_its_pool(tiny_graph, tiny_partition, pools):
    h = Harness(tiny_graph, tiny_partition, upload_batch=3, encrypt_workers=2).start()
    h.run(until=lambda: all(c.state is ClientState.UPLOADING for c in h.parties.clients.values()))
    client = h.client(h.roster.clients[0])
    h.run(until=lambda: client._pool is not None)
    pool = client._pool
    assert pool is not None and not pool.closed and client.has_work()
    sid = h.roster.server
    client.receive(h.craft(sid, Abort, client.party_id, code=int(AbortCode.TIMEOUT), reason="gone"))
    assert client.state is ClientState.ABORTED
    assert pool.closed and client._pool is None


def test_encrypt_workers_travel_with_the_clients_spec(tiny_graph, tiny_partition):
    from fedgat.protocols import ClientPretrain

    h = Harness(tiny_graph, tiny_partition, encrypt_workers=3)
    client = h.client(h.roster.clients[0])
    again = ClientPretrain.from_spec(client.spec())
    assert again.encrypt_workers == client.encrypt_workers == 3
    with pytest.raises(ValueError, match="encrypt_workers"):
        Harness(tiny_graph, tiny_partition, encrypt_workers=-1)


@pytest.mark.parametrize(
    ("cores", "concurrent", "want"),
    [
        (2, 1, 2),  # in process on 2 cores: the clients encrypt one after another, each on both
        (2, 10, 0),  # an engine on 2 cores: the clients already fill them
        (16, 10, 4),  # twice a client's share: the largest client gets the cores the others leave
        (16, 1, 16),  # never more than the cores
        (1, 1, 0),
    ],
)
def test_auto_encrypt_workers(cores, concurrent, want):
    from fedgat.app import auto_encrypt_workers

    assert auto_encrypt_workers(cores, concurrent) == want


def test_resolve_encrypt_workers(monkeypatch):
    from fedgat.pipeline import resolve_encrypt_workers
    from fedgat.protocols import InProcessTransport, process_engine

    monkeypatch.setattr(process_engine, "usable_cores", lambda: 16)
    assert resolve_encrypt_workers("auto", 10, InProcessTransport()) == 16
    assert resolve_encrypt_workers("auto", 10, object()) == 4  # type: ignore[arg-type]
    assert resolve_encrypt_workers(3, 10, InProcessTransport()) == 3
    # paced uploads: every in-process client holds its pool while it waits for grants
    assert resolve_encrypt_workers("auto", 10, InProcessTransport(), windowed=True) == 4
    for bad in (-1, "many"):
        with pytest.raises(ValueError, match="encrypt_workers"):
            resolve_encrypt_workers(bad, 10, InProcessTransport())


def test_a_client_whose_pool_cannot_start_warns_and_encrypts_in_its_own_process(
    tiny_graph, tiny_partition, pools, monkeypatch
):
    popen = encrypt_pool.subprocess.Popen
    monkeypatch.setattr(
        encrypt_pool.subprocess, "Popen", lambda args, **kw: popen(["/bin/sh", "-c", "exit 3"], **kw)
    )
    h = Harness(tiny_graph, tiny_partition, upload_batch=3, encrypt_workers=2).start()
    with pytest.warns(RuntimeWarning, match="encrypts in its own process"):
        h.run()
    assert pools == []  # none started
    assert all(p.done for p in h.parties.all().values())
    got = {c: h.client(c).encodings for c in h.roster.clients}
    assert max_abs_error(got, run_plaintext_pretraining(tiny_graph, tiny_partition, "vector", seed=1)) <= TOL
