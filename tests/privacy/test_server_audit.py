"""Server-side audit on a real transcript of the encrypted pre-training round: what the server
received, whether any two clients share a key, and what the server plus one client can decrypt."""

import dataclasses

import numpy as np
import pytest
import torch

from fedgat.audit import RowScanner, longest_zero_run, server_checks
from fedgat.partition import make_partition
from fedgat.protocols import Transcript
from fedgat.server_attacks import AttackSetting, collusion_attack, honest_round, shared_secret_key
from fedgat.synthetic import synthetic_graph


@pytest.fixture(scope="module")
def run():
    graph = synthetic_graph(num_nodes=400, num_features=32, avg_degree=3.0, seed=2)
    x = graph.x.clone()
    x[x < 0.15] = 0.0  # sparse rows, so the scale-free zero-run test applies too
    sparse = dataclasses.replace(graph, x=torch.nn.functional.normalize(x, dim=1), _cache={})
    part = make_partition(sparse, 3, beta=1.0, seed=0)
    setting = AttackSetting(sparse, part, "vector", seed=1)
    transcript = Transcript(keep_payloads=True)
    parties = honest_round(setting, transcript)
    return setting, parties, transcript


def test_server_sees_only_ciphertexts_and_public_metadata(run):
    setting, parties, transcript = run
    checks = server_checks(transcript, parties.server.party_id, setting.graph.x.numpy())
    assert checks["only_allowed_message_types"], checks["unexpected_types"]
    assert checks["client_contexts"] == 3 and checks["distinct_client_keys"]
    assert checks["uploaded_ciphertexts"] > 0 and checks["all_uploads_are_ciphertexts_of_the_recipients_keys"]
    assert checks["feature_row_anchor_hits"] == 0
    assert checks["shortest_zero_byte_run_in_a_float32_feature_row"] is not None
    assert checks["no_feature_rows_visible"]
    assert checks["server_context_has_secret_key"] is False
    assert checks["server_context_cannot_decrypt"] is True
    assert checks["passed"]


def test_no_shared_secret_key(run):
    """Every client generated its own CKKS key; the server holds none."""
    _, parties, _ = run
    fingerprints = {c.holder.fingerprint() for c in parties.clients.values()}
    assert len(fingerprints) == len(parties.clients) == 3
    assert parties.server.has_secret_key is False
    assert shared_secret_key(parties) is False


@pytest.mark.parametrize("colluder", [0, 1, 2])
def test_server_plus_one_client_gets_only_the_clients_honest_view(run, colluder):
    """The colluder decrypts every ciphertext the server held with its own key: the rows released to
    it come out (its honest view, so the decryption is not blind), no other row does."""
    setting, parties, transcript = run
    out = collusion_attack(transcript, parties, setting.truth, colluder)
    d = out.as_dict()
    assert d["uploads_decrypted"] > 0 and d["results_decrypted"] > 0
    assert d["released_to_colluder"] > 0
    assert d["released_to_colluder_recovered"] == d["released_to_colluder"]
    assert out.targets > 0 and out.recovered == 0 and d["recovered_fraction"] == 0.0
    assert d["best_cosine_not_released"] < 0.99


def test_the_scans_find_a_planted_row(run):
    """The audit must not be blind: a feature row hidden in random bytes is found, at any offset."""
    setting, _, _ = run
    x = setting.graph.x.numpy()
    scanner = RowScanner(x)
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, 5000, dtype=np.uint8).tobytes()
    assert scanner.scan(noise)[1] == 0
    for dtype in (np.float32, np.float64):
        planted = noise[:1237] + x[17].astype(dtype).tobytes() + noise[1237:]
        assert scanner.scan(planted)[1] >= 1
    scaled = noise[:999] + (3.7 * x[17]).astype(np.float32).tobytes() + noise[999:]
    assert longest_zero_run(scaled) >= longest_zero_run(x[17].astype(np.float32).tobytes()) - 4
    assert longest_zero_run(noise) < 8


def test_anchor_candidates_are_verified_against_the_row(run):
    """A chance 8-byte anchor match is not a leak; a copied row is."""
    setting, _, _ = run
    x = setting.graph.x.numpy()
    scanner = RowScanner(x)
    noise = np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8).tobytes()
    row = x[17].astype(np.float32)
    first = int(np.flatnonzero(row)[0])
    anchor = row[first : first + 2].tobytes()  # the row's 8-byte anchor alone
    chance = noise[:2001] + anchor + noise[2001:]
    candidates, hits = scanner.scan(chance)
    assert candidates >= 1 and hits == 0
    assert scanner.scan(noise[:1237] + row.tobytes() + noise[1237:])[1] >= 1
