"""The upload window (``PretrainConfig.upload_window``): uploads paced recipient by recipient, each
recipient computed as soon as its uploads are in and its spool deleted, so the server's disk holds a
window of recipients' uploads instead of the round's."""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np
import pytest
from fault_helpers import pretrain_driver

from fedgat.pipeline import max_abs_error, run_plaintext_pretraining
from fedgat.protocols import (
    ClientState,
    ConfigMismatchError,
    EncodingResults,
    FeatureUpload,
    PretrainConfig,
    ServerState,
    UploadGrant,
    UploadItem,
)
from fedgat.protocols.errors import AuthError, MissingPartyError, PayloadError, StateError
from fedgat.protocols.messages import decode_message, peek_type
from fedgat.protocols.pretrain import PretrainTimeouts
from fedgat.protocols.pretrain_values import config_from_value, config_to_value

from protocol_helpers import Harness, rejected

TOL = 1e-5


def _upload_bytes(h: Harness) -> dict[int, int]:
    """Bytes of ciphertext uploaded for each recipient (what its spool held once complete)."""
    out: dict[int, int] = {}
    for msg in (m for c in h.roster.clients for m in h.sent(c, FeatureUpload)):
        out[msg.target] = out.get(msg.target, 0) + sum(len(item.ciphertext) for item in msg.items)
    return out


@pytest.mark.parametrize(
    ("variant", "window"), [("vector", 1), ("vector", 2), ("matrix", 1), ("vector", 100)]
)
def test_a_windowed_round_matches_plaintext_and_spools_at_most_its_window(
    tiny_graph, tiny_partition, variant, window
):
    h = Harness(tiny_graph, tiny_partition, variant=variant, upload_window=window).start().run()
    server, sid = h.server, h.roster.server
    assert all(p.done for p in h.parties.all().values())
    got = {c: h.client(c).encodings for c in h.roster.clients}
    assert max_abs_error(got, run_plaintext_pretraining(tiny_graph, tiny_partition, variant, seed=1)) <= TOL
    assert server.ciphertexts_received == server.rows_released * server.layout.chunks

    # the grants: one per (owner, recipient) pair with rows to release, recipients in order
    order = sorted({r for c in h.roster.clients for r in h.client(c).releases})
    for c in h.roster.clients:
        granted = [int(r) for m in h.sent(sid, UploadGrant, c) for r in m.recipients]
        assert granted == sorted(h.client(c).releases)
    # the disk: at most `window` consecutive recipients' uploads at once, less than the round's
    sizes = _upload_bytes(h)
    bound = max(sum(sizes[r] for r in order[k : k + window]) for k in range(len(order)))
    assert 0 < server.peak_spooled_bytes <= bound
    assert bound < sum(sizes.values()) if window < len(order) else bound == sum(sizes.values())

    # every upload follows its grant
    granted_at: dict[tuple[int, int], int] = {}
    uploads, results = [], []
    for e in h.transport.transcript:
        kind = peek_type(e.data)
        if kind == UploadGrant.TYPE:
            granted_at.update(((e.recipient, int(r)), e.index) for r in decode_message(e.data).recipients)
        elif kind == FeatureUpload.TYPE:
            uploads.append(e.index)
            assert granted_at[(e.sender, decode_message(e.data).target)] < e.index
        elif kind == EncodingResults.TYPE:
            results.append(e.index)
    if window < len(order):  # a later recipient's uploads wait for an earlier one's compute
        assert min(results) < max(uploads)


def test_a_windowed_round_computes_every_recipient_on_one_pool(tiny_graph, tiny_partition, monkeypatch):
    """With a server pool, the recipients join one round pool as their uploads complete and leave it
    when computed (one spawn per round, not per recipient); the encodings are the plaintext's."""
    from fedgat.crypto import encoders

    started, added, removed = [], [], []
    init, add, remove = encoders.RoundPool.__init__, encoders.RoundPool.add, encoders.RoundPool.remove

    def spy_init(self, recipients, *args, **kwargs):
        init(self, recipients, *args, **kwargs)
        started.append(dict(recipients))

    def spy_add(self, key, *args):
        add(self, key, *args)
        added.append((key, sorted(self.keys)))

    def spy_remove(self, key):
        remove(self, key)
        removed.append(key)
        if sys.platform.startswith("linux"):  # the server deletes the spool next: no worker holds it
            for pid in self.executor._processes:
                links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
                assert not [x for x in links if "uploads-" in x], links

    monkeypatch.setattr(encoders.RoundPool, "__init__", spy_init)
    monkeypatch.setattr(encoders.RoundPool, "add", spy_add)
    monkeypatch.setattr(encoders.RoundPool, "remove", spy_remove)
    h = Harness(tiny_graph, tiny_partition, upload_window=1, workers=2).start().run()
    assert all(p.done for p in h.parties.all().values())
    order = sorted({r for c in h.roster.clients for r in h.client(c).releases})
    assert started == [{}]  # one pool, started empty by the first recipient
    assert added == [(r, [r]) for r in order] and removed == order  # one recipient in it at a time
    assert h.server.workers == 2
    got = {c: h.client(c).encodings for c in h.roster.clients}
    assert max_abs_error(got, run_plaintext_pretraining(tiny_graph, tiny_partition, "vector", seed=1)) <= TOL


def test_recipients_are_computed_in_order_whatever_order_their_uploads_complete_in(
    tiny_graph, tiny_partition
):
    # every recipient open at once, and every owner uploads the first recipient's rows last, so the
    # others' uploads complete first: the server still computes (and routes) in plan order
    h = Harness(tiny_graph, tiny_partition, upload_window=3).start()
    h.run(until=lambda: all(c.state is ClientState.UPLOADING for c in h.parties.clients.values()))
    first = min(r for c in h.roster.clients for r in h.client(c).releases)
    for c in h.roster.clients:
        h.client(c)._queue.sort(key=lambda batch: batch[0] == first)  # stable: the rest keep their order
    h.run()
    assert all(p.done for p in h.parties.all().values())
    got = {c: h.client(c).encodings for c in h.roster.clients}
    assert max_abs_error(got, run_plaintext_pretraining(tiny_graph, tiny_partition, "vector", seed=1)) <= TOL
    sid, seen = h.roster.server, []
    for e in h.transport.transcript:
        if e.sender == sid and peek_type(e.data) == EncodingResults.TYPE and e.recipient not in seen:
            seen.append(e.recipient)
    assert seen == sorted(seen) and len(seen) == 3


def test_the_server_refuses_uploads_for_a_recipient_it_has_not_granted(tiny_graph, tiny_partition):
    h = Harness(tiny_graph, tiny_partition, upload_window=1).start()
    h.run(until=lambda: all(c.state is ClientState.UPLOADING for c in h.parties.clients.values()))
    sid = h.roster.server
    granted = {int(r) for c in h.roster.clients for m in h.sent(sid, UploadGrant, c) for r in m.recipients}
    assert len(granted) == 1
    owner, recipient = next(
        (c, r) for c in h.roster.clients for r in h.client(c).releases if r not in granted
    )
    node = int(h.client(owner).releases[recipient][0])
    body = b"ct" * 600
    blob = body + hashlib.sha256(body).digest()  # a frame that decodes; its grant is what is missing
    upload = h.craft(owner, FeatureUpload, sid, target=recipient, items=(UploadItem(node, 0, blob),))
    rejected(h.server, upload, PayloadError, "before the server granted them")
    assert h.server.state is ServerState.UPLOADING
    h.run()
    assert all(p.done for p in h.parties.all().values())


def test_clients_refuse_grants_they_cannot_follow(tiny_graph, tiny_partition):
    # in a session without a window, any grant is another session's parameters
    plain = Harness(tiny_graph, tiny_partition).start()
    plain.run(until=lambda: plain.client(0).state is ClientState.UPLOADING)
    sid = plain.roster.server
    grant = plain.craft(sid, UploadGrant, 0, recipients=np.array([1]))
    rejected(plain.client(0), grant, ConfigMismatchError, "without an upload window")

    h = Harness(tiny_graph, tiny_partition, upload_window=1).start()
    h.run(until=lambda: h.client(0).state is ClientState.UPLOADING)
    client, sid = h.client(0), h.roster.server
    for names in ([1, 99], [0]):  # a party outside the round; the client itself
        rejected(client, h.craft(sid, UploadGrant, 0, recipients=np.array(names)), PayloadError, "outside")
    fresh = next(p for p in client.participants if p != 0 and p not in client._granted)
    grant = h.craft(sid, UploadGrant, 0, recipients=np.array([fresh]))
    client.receive(grant)
    again = h.craft(sid, UploadGrant, 0, recipients=np.array([fresh]))
    rejected(client, again, StateError, "already granted")
    rejected(client, h.craft(2, UploadGrant, 0, recipients=np.array([fresh])), AuthError)


def test_deadlines_run_while_a_party_waits_not_while_it_works(tiny_graph, tiny_partition):
    # every party answers, but each server step takes 31 s of the (manual) clock against an upload
    # deadline of 30 s: the server's own compute is not time it waits for the owners
    h = Harness(tiny_graph, tiny_partition, upload_window=1)
    driver = pretrain_driver(h, clients=PretrainTimeouts(download=1e5), keys=30.0, upload=30.0)
    work = h.server.step

    def slow():
        out = work()
        driver.clock.sleep(31.0)
        return out

    h.server.step = slow
    driver.start()
    driver.run()
    assert all(p.done for p in h.parties.all().values()) and not driver.failures()

    # nor does its deadline fire between a recipient's last upload and the compute it waits for
    h = Harness(tiny_graph, tiny_partition, upload_window=1).start()
    h.server.timeouts = PretrainTimeouts(upload=30.0)
    h.run(until=h.server.has_work)
    h.server.tick(h.server.now)
    assert h.server.tick(h.server.now + 31.0) == [] and h.server.state is ServerState.UPLOADING
    h.run()
    assert all(p.done for p in h.parties.all().values())

    # a client with granted uploads still to send is not waiting for the server either
    h = Harness(tiny_graph, tiny_partition, upload_window=1).start()
    h.run(until=lambda: any(c.has_work() for c in h.parties.clients.values()))
    client = next(c for c in h.parties.clients.values() if c.has_work())
    client.timeouts = PretrainTimeouts(download=10.0)
    client._arm("download", 10.0)
    assert client.tick(client.now + 100.0) == [] and client.state is ClientState.UPLOADING
    client.tick(client.now)  # re-armed from its next tick
    assert client.next_deadline() == client.now + 10.0

    # an owner that stops uploading in the first window is named, with the phase
    h = Harness(tiny_graph, tiny_partition, upload_window=1)
    driver = pretrain_driver(h, keys=30.0, upload=30.0, download=30.0)
    stalled = 0
    h.transport.rules = [
        lambda sender, to, data: (
            "drop" if sender == stalled and peek_type(data) == FeatureUpload.TYPE else None
        )
    ]
    driver.start()
    driver.run()
    err = h.server.failure
    # the others wait for a grant, not named
    assert isinstance(err, MissingPartyError) and (err.phase, err.missing) == ("upload", (stalled,))
    assert h.server.state is ServerState.ABORTED


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_the_window_is_a_positive_int_and_travels_with_the_config(bad):
    with pytest.raises(ValueError, match="upload_window"):
        PretrainConfig(session=1, upload_window=bad)
    config = PretrainConfig(session=1, upload_window=3)
    assert config_from_value(config_to_value(config)) == config
    assert config_from_value({**config_to_value(config), "upload_window": None}).upload_window is None


@pytest.mark.parametrize("window", [None, 1, 2])
def test_the_spool_estimate_is_what_the_round_spools(tiny_graph, tiny_partition, window):
    """Per recipient, the bytes the estimate says the server spools are the bytes uploaded for it in
    a real round, and :func:`peak_spool_bytes` bounds the round's measured peak for its window
    (every upload without one)."""
    from fedgat.estimate import estimate_pretraining, peak_spool_bytes

    h = Harness(tiny_graph, tiny_partition, upload_window=window).start().run()
    uploaded: dict[int, int] = {}
    for c in h.roster.clients:
        for msg in h.sent(c, FeatureUpload):
            uploaded[msg.target] = uploaded.get(msg.target, 0) + sum(len(i.ciphertext) for i in msg.items)
    est = estimate_pretraining(tiny_partition, "vector", tiny_graph.num_features)
    assert est["spool_bytes_per_recipient"] == dict(sorted(uploaded.items()))
    assert sum(uploaded.values()) == est["bytes_up"]
    peak = h.server.peak_spooled_bytes
    if window is None:
        assert peak == peak_spool_bytes(est) == est["bytes_up"]
    else:
        assert 0 < peak <= peak_spool_bytes(est, window) < est["bytes_up"]
