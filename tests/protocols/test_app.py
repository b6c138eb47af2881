"""The deployment factories of :mod:`fedgat.app`: the parties they build run the same round as the
pipeline, one party at a time as the Flower apps build them, and one summary serves every caller."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedgat import app
from fedgat.cli import main
from fedgat.crypto.tags import TAG_COLUMNS
from fedgat.methods import resolve_hparams
from fedgat.pipeline import (
    drive,
    max_abs_error,
    run_encrypted_pretraining,
    run_plaintext_pretraining,
    train_fedgat,
)
from fedgat.protocols import InProcessTransport, PretrainConfig
from fedgat.tasks import tasks_from_encodings
from fedgat.verdict_dp import verdict_epsilon

SEED = 4
TOL = 1e-5  # CKKS noise is ~1e-7 per value at n4096
HPARAMS = {"rounds": 3, "patience": None}


@pytest.mark.parametrize("variant", ["vector", "matrix"])
def test_pretrain_parties_match_the_plaintext_twin(tiny_graph, tiny_partition, variant):
    parties = app.build_pretrain_parties(tiny_graph, tiny_partition, variant=variant, seed=SEED, workers=0)
    drive(InProcessTransport(), parties.all())
    assert all(p.done for p in parties.all().values())
    got = {c: client.encodings for c, client in parties.clients.items()}
    want = run_plaintext_pretraining(tiny_graph, tiny_partition, variant, SEED)
    assert max_abs_error(got, want) <= TOL  # type: ignore[arg-type]
    assert not parties.server.has_secret_key
    parties.server.close()


def test_pooled_round_streams_every_recipients_results_together(tiny_graph, tiny_partition):
    """On the server's process pool the recipients' work is interleaved: every client's first
    results leave before any client's last ones (each client decrypts while the others do, instead
    of one client after another), and the encodings still equal the plaintext twin's."""
    from fedgat.protocols import Transcript

    parties = app.build_pretrain_parties(
        tiny_graph,
        tiny_partition,
        seed=SEED,
        workers=2,
        result_batch_bytes=1,  # one result per frame
    )
    transport = InProcessTransport(Transcript(keep_payloads=False))
    drive(transport, parties.all())
    server = parties.server.party_id
    to = [
        e.recipient for e in transport.transcript if e.sender == server and e.type_name == "EncodingResults"
    ]
    clients = sorted(set(to))
    assert len(clients) >= 2 and all(to.count(c) >= 2 for c in clients)
    first = {c: to.index(c) for c in clients}
    last = {c: len(to) - 1 - to[::-1].index(c) for c in clients}
    assert max(first.values()) < min(last.values())
    assert parties.server.workers == 2
    got = {c: client.encodings for c, client in parties.clients.items()}
    want = run_plaintext_pretraining(tiny_graph, tiny_partition, "vector", SEED)
    assert max_abs_error(got, want) <= TOL  # type: ignore[arg-type]
    parties.server.close()


@pytest.mark.parametrize("fault", ["short", "extra", "stranger"])
def test_server_refuses_an_encoder_stream_that_does_not_match_its_plan(tiny_graph, tiny_partition, fault):
    """Results are placed by recipient and plan position: a stream with one result too few, one too
    many, or one for a recipient outside the round stops the round with an error, never a result
    routed to the wrong place."""
    from fedgat.crypto.encoders import LocalEncoderFactory

    class Faulty(LocalEncoderFactory):
        def map_round(self, jobs, layout, weights=None):
            results = list(super().map_round(jobs, layout, weights))
            if fault == "short":
                results.pop()
            elif fault == "extra":
                results.append(results[-1])
            else:
                results.insert(0, (max(k for k, _ in results) + 100, results[0][1]))
            yield from results

    parties = app.build_pretrain_parties(tiny_graph, tiny_partition, seed=SEED, encoder=Faulty(workers=0))
    with pytest.raises(RuntimeError, match="fewer results|beyond the plan"):
        drive(InProcessTransport(), parties.all())
    parties.server.close()


def test_one_party_at_a_time_equals_the_whole_deployment(tiny_graph, tiny_partition):
    """What a Flower party builds for itself (its own identity, the roster) is what
    ``build_pretrain_parties`` builds for everyone."""
    deployment = app.make_deployment(tiny_partition.num_clients)
    roster = deployment.roster
    parties = app.build_pretrain_parties(
        tiny_graph, tiny_partition, seed=SEED, session=7, deployment=deployment
    )
    config = PretrainConfig(session=7)
    for c, client in parties.clients.items():
        alone = app.build_pretrain_client(
            c, tiny_graph, tiny_partition, roster, config, deployment.identities[c]
        )
        assert type(alone) is type(client) and alone.party_id == c
        np.testing.assert_array_equal(alone.owned, client.owned)
        np.testing.assert_array_equal(alone.needed, client.needed)
    server = app.build_pretrain_server(
        roster, config, deployment.identities[roster.server], seed=SEED, workers=0
    )
    assert server.party_id == parties.server.party_id == roster.server
    server.close()
    parties.server.close()


def test_training_parties_train_like_the_pipeline(tiny_graph, tiny_partition):
    encodings = run_plaintext_pretraining(tiny_graph, tiny_partition, "vector", SEED)
    parties = app.build_training_parties(tiny_graph, tiny_partition, encodings, seed=SEED, **HPARAMS)
    drive(InProcessTransport(), parties.all())
    assert parties.server.result is not None
    run = train_fedgat(tiny_graph, tiny_partition, encodings, seed=SEED, progress=False, **HPARAMS)
    assert parties.server.result.history == run.fit.history
    assert parties.hparams == run.hparams


def test_rounds_client_refuses_encodings_of_other_nodes(tiny_graph, tiny_partition):
    encodings = run_plaintext_pretraining(tiny_graph, tiny_partition, "vector", SEED)
    with pytest.raises(ValueError, match="needed nodes"):
        tasks_from_encodings(tiny_graph, tiny_partition, 0, encodings[1])
    deployment = app.make_deployment(tiny_partition.num_clients)
    with pytest.raises(ValueError, match="needed nodes"):
        app.build_rounds_client(
            0,
            tiny_graph,
            tiny_partition,
            encodings[1],
            deployment.roster,
            deployment.identities[0],
            resolve_hparams("fedgat", {}),
            session=1,
            num_features=tiny_graph.num_features,
            num_classes=tiny_graph.num_classes,
        )


def test_seeded_streams_are_reproducible():
    np.testing.assert_array_equal(app.bases_rng(SEED).uniform(3), app.bases_rng(SEED).uniform(3))
    assert not np.array_equal(app.bases_rng(None).uniform(3), app.bases_rng(None).uniform(3))  # CSPRNG


def test_pipeline_results_summarise_with_run_summary(tiny_graph, tiny_partition):
    pre = run_encrypted_pretraining(tiny_graph, tiny_partition, seed=SEED, progress=False, workers=0)
    assert pre.summary() == app.run_summary(pre)
    assert pre.summary()["server_has_secret_key"] is False
    assert pre.summary()["slot_layout"]["d"] == tiny_graph.num_features + TAG_COLUMNS  # tag columns too
    # known break 22: each owner's verdict epsilon, from its rows' recipients (at most the 2 others)
    assert round(pre.upload_pad, 4) == pre.summary()["upload_pad_sigma"] > 10
    allowed = {round(verdict_epsilon(pre.upload_pad, r), 4) for r in (0, 1, 2)}
    assert set(pre.summary()["verdict_epsilon"]) == {"0", "1", "2"}
    assert set(pre.summary()["verdict_epsilon"].values()) <= allowed and max(pre.verdict_epsilon.values()) > 0
    training = train_fedgat(tiny_graph, tiny_partition, pre.encodings, seed=SEED, progress=False, **HPARAMS)
    both = app.run_summary(pre, training)
    assert both == {**pre.summary(), **training.summary()}
    assert both["rounds"] == len(training.fit.history) == 3
    json.dumps(both)


def test_demo_reports_run_summary(tmp_path, monkeypatch):
    """``fedgat demo`` reports the summary :func:`fedgat.app.run_summary` builds, unchanged."""
    calls = []
    real = app.run_summary

    def spy(*args):
        calls.append(real(*args))
        return calls[-1]

    monkeypatch.setattr(app, "run_summary", spy)
    out = tmp_path / "demo.json"
    argv = ["demo", "--dataset", "synthetic", "--nodes", "48", "--clients", "2", "--rounds", "2", "--quiet"]
    threads = torch.get_num_threads()
    try:
        assert main([*argv, "--workers", "0", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    report = json.loads(out.read_text())
    assert len(calls) == 2  # the pre-training report as soon as it ends, then the whole run
    assert set(calls[0]) < set(calls[1])
    assert {k: report[k] for k in calls[1]} == json.loads(json.dumps(calls[1]))
