"""The DP release: calibration, accounting inputs, and that it actually blinds the attacks."""

import math

import numpy as np
import pytest
import torch

from fedgat.attacks import basis_attack, score_recovery
from fedgat.dp import FeatureDP, analytic_gaussian_sigma, classic_gaussian_sigma, gaussian_delta
from fedgat.dp_ledger import Budget, DPLedger
from fedgat.encodings import encode
from fedgat.partition import make_partition
from fedgat.randomness import RandomSource
from fedgat.synthetic import synthetic_graph


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 4.0, 16.0, 64.0, 1024.0, 1e5])
def test_analytic_sigma_meets_delta_and_is_tight(epsilon):
    sigma = analytic_gaussian_sigma(epsilon, 1e-5)
    assert gaussian_delta(sigma, epsilon, 2.0) <= 1e-5
    assert gaussian_delta(sigma * 0.99, epsilon, 2.0) > 1e-5  # smallest such sigma
    if epsilon < 1:
        assert sigma <= classic_gaussian_sigma(epsilon, 1e-5)


def test_release_statistics():
    dp = FeatureDP(epsilon=2.0, dim=32)
    x = torch.nn.functional.normalize(torch.rand(4000, 100), dim=1)
    clean = dp.project(x)
    torch.testing.assert_close(clean.norm(dim=1), torch.ones(4000))
    key = bytes(range(32))  # a test-only injected source, to check the arithmetic of the release
    _, rows = dp.release_rows(x, ledger=DPLedger(Budget(2.0, 1e-5)), _test_rng=RandomSource(key))
    release = torch.from_numpy(rows).float()
    # the Gaussian mechanism on the unit-norm projection, then renormalised (post-processing)
    z = torch.from_numpy(RandomSource(key).normal(tuple(clean.shape))).float()
    torch.testing.assert_close(release, torch.nn.functional.normalize(clean + dp.sigma * z, dim=1))
    torch.testing.assert_close(release.norm(dim=1), torch.ones(4000))
    # at epsilon 2 the release keeps a little of the signal: cosine with the truth ~ 1 / (sigma sqrt k)
    cos = (release * clean).sum(1)
    assert 0.3 / (dp.sigma * math.sqrt(32)) < cos.mean().item() < 3.0 / (dp.sigma * math.sqrt(32))
    assert math.isclose(dp.describe()["expected_noise_norm"], dp.sigma * math.sqrt(32))


def test_dp_release_blinds_the_basis_attack():
    graph = synthetic_graph(num_nodes=400, num_features=24, avg_degree=4.0, seed=3)
    part = make_partition(graph, num_clients=3, beta=1.0, seed=1)
    c = part.clients[0]
    owned = set(c.owned.tolist())
    victims = {int(i): [int(j) for j in part.neighbourhoods.row(i) if int(j) not in owned] for i in c.needed}
    others = np.flatnonzero(part.owner != 0)
    recovered = {}
    for eps in (None, 64.0, 1.0):
        dp = FeatureDP(epsilon=eps or 1.0, dim=None)
        x = dp.project(graph.x).double()
        ledger = DPLedger(Budget(dp.epsilon, dp.delta))
        shared = x if eps is None else dp.release(graph.x, ledger=ledger).double()
        enc = encode(
            "vector",
            x,
            part.neighbourhoods,
            nodes=c.needed,
            rng=2,
            shared_x=shared,
            owner=part.owner,
            viewer=0,
        )
        score = score_recovery(basis_attack(enc), x.numpy(), victims, others)
        recovered[eps] = (score.recovered_fraction, score.reidentification_rate)
    assert recovered[None] == (1.0, 1.0)
    assert recovered[1.0][0] == 0.0  # nothing recovered at cosine >= 0.99
    assert recovered[1.0][1] < 0.2 < recovered[64.0][1]
