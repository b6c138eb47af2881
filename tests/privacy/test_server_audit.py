"""Server-side audit on a real transcript of the encrypted pre-training round."""

import dataclasses

import numpy as np
import pytest
import torch

from fedgat.audit import (
    _anchor_table,
    _anchors,
    _longest_zero_run,
    _scan,
    _scan_positions,
    _verified_hits,
    server_checks,
)
from fedgat.partition import make_partition
from fedgat.pipeline import run_encrypted_pretraining
from fedgat.protocols import InProcessTransport, Transcript
from fedgat.synthetic import synthetic_graph


@pytest.fixture(scope="module")
def run():
    graph = synthetic_graph(num_nodes=400, num_features=32, avg_degree=3.0, seed=2)
    x = graph.x.clone()
    x[x < 0.15] = 0.0  # sparse rows, so the scale-free zero-run test applies too
    sparse = dataclasses.replace(graph, x=torch.nn.functional.normalize(x, dim=1), _cache={})
    part = make_partition(sparse, 3, beta=1.0, seed=0)
    transcript = Transcript(keep_payloads=True)
    result = run_encrypted_pretraining(
        sparse, part, "vector", seed=1, transport=InProcessTransport(transcript), progress=False, workers=0
    )
    return sparse, result, transcript


def test_server_sees_only_ciphertexts_and_public_metadata(run):
    graph, result, transcript = run
    checks = server_checks(transcript, result.deployment.roster.server, graph.x.numpy())
    assert checks["only_allowed_message_types"], checks["unexpected_types"]
    assert checks["uploaded_ciphertexts"] > 0 and checks["all_uploads_are_ciphertexts_of_the_session_key"]
    assert checks["feature_row_anchor_hits"] == 0
    assert checks["shortest_zero_byte_run_in_a_float32_feature_row"] is not None
    assert checks["no_feature_rows_visible"]
    assert checks["server_context_has_secret_key"] is False
    assert checks["server_context_cannot_decrypt"] is True
    assert checks["passed"]
    assert result.server_has_secret_key is False


def test_the_scans_find_a_planted_row(run):
    """The audit must not be blind: a feature row hidden in random bytes is found, at any offset."""
    graph, _, _ = run
    x = graph.x.numpy()
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        keys = np.array(sorted(np.frombuffer(b"".join(_anchors(x, dtype)), dtype=np.uint64)), dtype=np.uint64)
        noise = rng.integers(0, 256, 5000, dtype=np.uint8).tobytes()
        assert _scan(noise, keys) == 0
        planted = noise[:1237] + x[17].astype(dtype).tobytes() + noise[1237:]
        assert _scan(planted, keys) >= 1
    scaled = noise[:999] + (3.7 * x[17]).astype(np.float32).tobytes() + noise[999:]
    assert _longest_zero_run(scaled) >= _longest_zero_run(x[17].astype(np.float32).tobytes()) - 4
    assert _longest_zero_run(noise) < 8


def test_anchor_candidates_are_verified_against_the_row(run):
    """A chance 8-byte anchor match is not a leak; a copied row (or a long stretch of it) is."""
    graph, _, _ = run
    x = graph.x.numpy()
    noise = np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8).tobytes()
    for dtype in (np.float32, np.float64):
        table = _anchor_table(x, dtype)
        keys = np.array(sorted(np.frombuffer(b"".join(table), dtype=np.uint64)), dtype=np.uint64)
        rows = [r.tobytes() for r in x.astype(dtype)]
        anchor = next(iter(table))
        chance = noise[:2001] + anchor + noise[2001:]
        pos = _scan_positions(chance, keys)
        assert len(pos) >= 1 and _verified_hits(chance, pos, table, rows) == 0
        planted = noise[:1237] + rows[17] + noise[1237:]
        pos = _scan_positions(planted, keys)
        assert _verified_hits(planted, pos, table, rows) >= 1
