"""The in-process transport's transcript and traffic counters, and the end-to-end pipeline."""

from __future__ import annotations

import pytest
import torch

from fedgat.pipeline import run_encrypted_fedgat, run_encrypted_pretraining
from fedgat.protocols import InProcessTransport, Transcript, decode_message
from fedgat.protocols.messages import HEADER, SIGNATURE_SIZE


@pytest.mark.parametrize("spill", [False, True])
def test_transcript_records_every_frame(tiny_graph, tiny_partition, tmp_path, spill):
    transcript = Transcript(directory=tmp_path if spill else None)
    transport = InProcessTransport(transcript)
    result = run_encrypted_pretraining(
        tiny_graph, tiny_partition, seed=2, transport=transport, progress=False
    )
    server = result.deployment.server
    assert len(transcript) == transport.messages_sent()
    assert sum(e.size for e in transcript) == transport.bytes_sent()
    up = sum(e.size for e in transcript if e.recipient == server)
    down = sum(e.size for e in transcript if e.sender == server)
    assert (up, down) == (result.bytes_up, result.bytes_down)
    for entry in transcript:
        msg = decode_message(entry.data)
        assert msg.type_name == entry.type_name and (msg.sender, msg.recipient) == (
            entry.sender,
            entry.recipient,
        )
        assert len(entry.payload) == entry.size - HEADER.size - SIGNATURE_SIZE
    kinds = {e.type_name for e in transcript.received_by(server)}
    assert kinds == {
        "KeyAnnounce",
        "PublicContext",
        "EdgeClaims",
        "SealedCheckKeys",
        "NeighbourhoodStatement",
        "GraphAnnounce",
        "FeatureUpload",
        "UploadDone",
    }
    transcript.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_server_replays_its_compute_alone_once(tiny_graph, tiny_partition, workers):
    from fedgat.app import build_pretrain_parties
    from fedgat.pipeline import drive

    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=2, workers=workers)
    server = parties.server
    with pytest.raises(RuntimeError, match="finished round"):
        server.replay_compute()  # not finished
    server.keep_encoder = True
    drive(InProcessTransport(), parties.all())
    assert all(p.done for p in parties.all().values())
    timing = server.replay_compute()
    assert timing.wall > 0 and timing.cpu > 0
    # with a pool the compute runs in the (reaped) workers, whose CPU is reported apart
    assert (timing.worker_cpu > 0) == (workers > 0)
    with pytest.raises(RuntimeError, match="finished round"):
        server.replay_compute()  # closed after the first replay
    server.close()  # idempotent
    result = run_encrypted_pretraining(
        tiny_graph, tiny_partition, seed=2, progress=False, workers=workers, measure_server_alone=True
    )
    assert result.server_compute_alone > 0 and result.server_compute_alone_cpu[0] > 0


def test_one_pool_serves_every_recipient_of_a_round(tiny_graph, tiny_partition, monkeypatch):
    """With workers the server starts one process pool for the whole round (every recipient's
    context and spool loaded by each worker), not one per recipient, and closes it at the end."""
    from fedgat.app import build_pretrain_parties
    from fedgat.crypto import encoders
    from fedgat.pipeline import drive

    started: list = []
    real = encoders.ProcessPoolExecutor

    def counting(*args, **kwargs):
        started.append(kwargs.get("initializer"))
        return real(*args, **kwargs)

    monkeypatch.setattr(encoders, "ProcessPoolExecutor", counting)
    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=2, workers=2)
    drive(InProcessTransport(), parties.all())
    server = parties.server
    recipients = [c for c, shares in server.plan.shares.items() if shares]
    assert len(recipients) >= 2 and all(p.done for p in parties.all().values())
    assert [f.__name__ for f in started] == ["worker_init_from_setups"]
    assert server.workers == 2 and server.encoder_factory.pool is None  # closed with the round


def test_pool_rule_weighs_the_rounds_multiply_adds(monkeypatch):
    """With ``workers=None`` a pool starts for a round of at least AUTO_POOL_MIN_MULTIPLY_ADDS
    multiply-adds, every recipient's together (one pool serves them all), on more than one core; a
    given ``workers`` is taken as it is."""
    from fedgat.crypto import encoders

    started: list[int] = []

    class FakePool:
        def __init__(self, recipients, layout, wire, workers):
            started.append(workers)
            self.workers, self.keys = workers, frozenset(recipients)

        def close(self):
            pass

    class Ctx:
        wire = "compact"

        def public_context_bytes(self):
            return b""

    monkeypatch.setattr(encoders, "RoundPool", FakePool)
    monkeypatch.setattr(encoders.os, "cpu_count", lambda: 4)
    limit = encoders.AUTO_POOL_MIN_MULTIPLY_ADDS
    assert encoders.auto_workers(None, limit - 1) == 0 and encoders.auto_workers(None, limit) == 4
    assert encoders.auto_workers(3, 0) == 3 and encoders.auto_workers(0, 10 * limit) == 0
    factory = encoders.LocalEncoderFactory()
    half = limit // 2
    factory.prepare({1: (Ctx(), object(), half), 2: (Ctx(), object(), limit - half)}, None)  # type: ignore[dict-item, arg-type]
    assert started == [4] and factory.pool_workers == 4
    factory.prepare({1: (Ctx(), object(), limit - 1)}, None)  # type: ignore[dict-item, arg-type]
    assert started == [4] and factory.pool_workers == 0
    monkeypatch.setattr(encoders.os, "cpu_count", lambda: 1)
    factory.prepare({1: (Ctx(), object(), 100 * limit)}, None)  # type: ignore[dict-item, arg-type]
    assert started == [4]


def test_server_weighs_each_recipient_by_the_multiply_adds_its_encoder_spends(tiny_graph, tiny_partition):
    """What the server hands its encoder factory as each recipient's work is exactly the multiply-adds
    SEAL's evaluator then spends under that recipient's context, and they add up to the round's."""
    from fedgat.app import build_pretrain_parties
    from fedgat.crypto.encoders import LocalEncoderFactory
    from fedgat.crypto.evaluator import evaluator_for
    from fedgat.pipeline import drive

    weighed: dict[int, int] = {}

    class Spy(LocalEncoderFactory):
        def prepare(self, recipients, layout):
            weighed.update({c: m for c, (_, _, m) in recipients.items()})
            super().prepare(recipients, layout)

    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=2, encoder=Spy(workers=0))
    drive(InProcessTransport(), parties.all())
    server = parties.server
    assert len(weighed) >= 2 and sum(weighed.values()) == server.multiply_adds > 0
    assert server.multiply_adds == server.plan.multiply_adds(server.layout)
    for c, mads in weighed.items():
        assert evaluator_for(server.contexts[c]).ops.multiplies == mads


def test_metadata_only_transcript(tiny_graph, tiny_partition):
    transport = InProcessTransport(Transcript(keep_payloads=False))
    run_encrypted_pretraining(tiny_graph, tiny_partition, seed=2, transport=transport, progress=False)
    assert all(e.data is None and e.size > 0 for e in transport.transcript)


@pytest.mark.slow
def test_encrypted_and_plaintext_pipelines_train_alike(small_graph):
    kw = {"rounds": 30, "patience": 30, "progress": False}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: more threads only contend on a busy machine
    try:
        enc = run_encrypted_fedgat(small_graph, 4, 1.0, 0, **kw)
        plain = run_encrypted_fedgat(small_graph, 4, 1.0, 0, encrypted=False, **kw)
    finally:
        torch.set_num_threads(threads)
    assert enc.pretrain is not None and enc.pretrain.server_has_secret_key is False
    assert abs(enc.test_accuracy - plain.test_accuracy) <= 0.03
    assert enc.training.fit.best_val_accuracy > 0.4
