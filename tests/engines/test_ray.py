"""The conformance checks over Ray: 4 clients hosted in 2 actors, the server's homomorphic work as
Ray tasks; plus what is particular to the Ray engine (placement, bytes only, shutdown)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from fedgat.pipeline import max_abs_error, run_encrypted_pretraining
from fedgat.protocols import Transcript
from fedgat.protocols.party_values import PartyReport, error_from_value
from fedgat.protocols.ray_engine import PartyHost, RayEngine, RayTransport

from .conformance import (
    ENCODING_ATOL,
    check_deadlines,
    check_pretraining,
    check_rejection,
    check_training,
    federation,
    reference,
)

pytestmark = [
    pytest.mark.ray,
    pytest.mark.timeout(900),
]  # generous: Ray start-up is slow on a loaded 2-core box


def test_host_refuses_non_bytes():
    host = PartyHost(threads=None)
    reply = host.deliver([(0, 1, bytearray(b"x"))], step=False)
    assert reply["error"]["party"] == 1
    assert isinstance(error_from_value(reply["error"]["exception"]), TypeError)


def test_host_places_specs_and_reports_values(monkeypatch):
    """A plain PartyHost: parties arrive as spec bytes, leave as report bytes, errors as values; no
    pickle on the way (patched to raise)."""
    import pickle

    from fedgat.app import build_pretrain_parties

    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used")

    fed = federation()
    parties = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0)
    specs = {pid: c.spec().to_bytes() for pid, c in parties.clients.items()}
    for name in ("dumps", "loads", "dump", "load"):
        monkeypatch.setattr(pickle, name, refuse)
    host = PartyHost(threads=None)
    wrong = host.place({1: specs[2]})
    assert wrong["error"]["party"] == 1 and wrong["parties"] == []
    placed = host.place({pid: specs[pid] for pid in (1, 2)})
    assert placed == {"parties": [1, 2], "error": None}
    started = host.start([1, 2])
    # keys, public context, one edge claim per bordering client, graph
    opening = [3 + len(parties.clients[pid].local.claims()) for pid in (1, 2)]
    assert started["error"] is None and [len(f) for f in started["frames"]] == opening
    assert all(type(frame[2]) is bytes for frames in started["frames"] for frame in frames)
    answer = host.report([1, 2])
    assert answer["error"] is None and host.parties == {}
    for pid, blob in answer["reports"].items():
        report = PartyReport.from_bytes(blob)
        assert (report.kind, report.party_id, report.state) == ("pretrain.client", pid, "await-roster")
        parties.clients[pid].absorb(report)
        assert parties.clients[pid].state.value == "await-roster"
        assert parties.clients[pid].holder is None  # the key pair made at start() stayed in the host
    assert host.report([7])["error"]["party"] == 7


def test_engine_shuts_down_ray_it_started():
    import ray

    if ray.is_initialized():
        pytest.skip("another test module holds Ray")
    eng = RayEngine(actors=1, num_cpus=1)
    eng.ensure_actors(1)
    eng.shutdown()
    assert not ray.is_initialized()
    eng.shutdown()  # idempotent


@pytest.fixture(scope="module")
def engine():
    eng = RayEngine(actors=2, num_cpus=2)
    try:
        yield eng
    finally:
        eng.shutdown()


def test_pretraining_conforms(engine):
    transports: list[RayTransport] = []

    def make() -> RayTransport:
        transports.append(engine.transport(server_tasks=True, transcript=Transcript(keep_payloads=False)))
        return transports[-1]

    result = check_pretraining(make)
    transport = transports[0]
    assert len(engine.actors) == 2
    # every frame was routed by the coordinator, as bytes, and the transcript saw each one
    assert len(transport.transcript) == transport.messages_sent()
    assert result.messages_up + result.messages_down == transport.messages_sent()
    assert transport.placement_seconds > 0
    # the server's homomorphic work ran as Ray tasks: one encoder per recipient, under its context,
    # each upload put into the object store once (every released row is used by its recipient)
    encoders = transport.encoders
    assert 1 <= len(encoders) <= len(result.encodings)
    assert all(e.tasks_submitted > 0 for e in encoders)  # the window: test_ray_round_interleaves...
    assert sum(e.uploads_put for e in encoders) == result.ciphertexts_up // result.layout.chunks
    # hosted parties are dropped from the actors when the run ends
    assert [m["parties"] for m in engine.memory()] == [0, 0]


def test_ray_round_interleaves_recipients_under_their_own_keys(engine):
    """:meth:`RayEncoderFactory.map_round` runs two recipients through one window of Ray tasks, their
    batches interleaved (the second recipient's first result before the first one's last), at most
    ``window`` in flight, each recipient's nodes in its order and decrypting under its own key to the
    plaintext encodings; a round below the pool threshold with ``everywhere=False`` computes in this
    process, one recipient after the other."""
    import numpy as np
    from he_helpers import assert_keyed_results_decrypt, two_recipients

    from fedgat.crypto import KeyHolderContext
    from fedgat.crypto.ray_encoder import RayEncoderFactory
    from fedgat.encodings import draw_bases

    engine.ensure_actors(1)  # Ray is up
    holders = [KeyHolderContext.generate("n4096") for _ in range(2)]
    servers, x, layout, spools, csr = two_recipients(holders, seed=81)
    bases = draw_bases("vector", csr, np.arange(12), rng=83)
    per_recipient = sum(len(b) for b in bases)
    recipients = {7: (servers[0], spools[0], 12), 9: (servers[1], spools[1], 12)}
    for everywhere in (True, False):
        made: list = []
        factory = RayEncoderFactory(2 if everywhere else None, everywhere=everywhere, on_encoder=made.append)
        factory.prepare(recipients, layout)
        results = list(factory.map_round([(7, bases), (9, bases)], layout, {7: 1, 9: 1}))
        factory.close()
        keys = [k for k, _ in results]
        assert keys.count(7) == keys.count(9) == per_recipient
        if everywhere:
            assert factory.pool_workers == 0  # closed
            assert keys.index(9) < len(keys) - 1 - keys[::-1].index(7)
            assert len(made) == 2 and all(e.tasks_submitted > 0 for e in made)
            assert 1 <= factory.max_in_flight <= factory.window == 4
        else:
            assert keys == [7] * per_recipient + [9] * per_recipient and made == []
        assert_keyed_results_decrypt(results, {7: holders[0], 9: holders[1]}, bases, x, layout)
    made = []
    factory = RayEncoderFactory(2, on_encoder=made.append)
    factory.prepare(recipients, layout)
    stream = factory.map_round([(7, bases), (9, bases)], layout)
    next(stream)  # a round stopped midway: close() lets go of what its encoders hold
    assert len(made) == 2 and any(e._uploads for e in made)
    factory.close()
    assert all(not e._uploads and e._context_ref is None for e in made)
    stream.close()
    factory.prepare(recipients, layout)
    with pytest.raises(ValueError, match="not prepared"):
        list(factory.map_round([(8, bases)], layout))
    for spool in spools:
        spool.close()


def test_a_windowed_round_runs_on_ray(engine):
    """Uploads paced one recipient at a time on Ray actors, the server's work on Ray tasks."""
    fed = federation()
    ref = reference(fed)
    transport = engine.transport(server_tasks=True)
    got = run_encrypted_pretraining(
        fed.graph, fed.partition, seed=fed.seed, transport=transport, progress=False, upload_window=1
    )
    assert max_abs_error(got.encodings, ref.plaintext) <= ENCODING_ATOL
    assert got.ciphertexts_down == ref.pretrain.ciphertexts_down
    assert 0 < got.peak_spooled_bytes < ref.pretrain.peak_spooled_bytes


def test_training_conforms(engine):
    check_training(engine.transport)


def test_rejection_surfaces_typed(engine):
    check_rejection(engine.transport)
    assert [m["parties"] for m in engine.memory()] == [0, 0]  # reset after the failure


def test_stalls_end_at_the_deadlines(engine):
    """The coordinator's manual clock reaches the actors: the hosted clients' deadlines fire there."""
    check_deadlines(engine.transport)


def test_secrets_stay_in_the_actor(engine):
    """The clients that absorbed their hosted twins' reports carry results but no key material."""
    from fedgat.pipeline import build_pretrain_parties, drive

    fed = federation()
    parties = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0)
    drive(engine.transport(), parties.all())
    for client in parties.clients.values():
        assert client.done and client.encodings is not None
        assert client.holder is None  # the CKKS secret context never left the actor


def test_demo_and_train_cli_on_ray(engine, tmp_path, capsys):
    """``fedgat demo/train --engine ray`` (Ray already up: the engine joins it and leaves it running)."""
    import json

    from fedgat.cli import main

    out = tmp_path / "demo.json"
    assert (
        main(
            [
                "demo",
                "--dataset",
                "synthetic",
                "--nodes",
                "60",
                "--clients",
                "3",
                "--rounds",
                "2",
                "--patience",
                "2",
                "--engine",
                "ray",
                "--actors",
                "2",
                "--json",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["engine"] == "ray" and report["actors"] == 2
    assert report["server_has_secret_key"] is False and report["max_abs_error_vs_plaintext"] <= 1e-5
    assert "engine ray: clients in 2 actor(s)" in capsys.readouterr().out
    out = tmp_path / "train.json"
    assert (
        main(
            [
                "train",
                "--dataset",
                "synthetic",
                "--clients",
                "3",
                "--rounds",
                "2",
                "--engine",
                "ray",
                "--json",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    summary = json.loads(out.read_text())
    assert summary["rows"][0]["rounds"] == 2 and 0.0 <= summary["test_accuracy_mean"] <= 1.0
    import ray

    assert ray.is_initialized()  # not the CLI's to stop
