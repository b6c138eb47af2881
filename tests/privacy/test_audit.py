"""The pooled client audit: unmitigated protocol leaks everything, each mitigation measurably less."""

import math

import pytest

from fedgat.audit import Mitigation, audit_clients, chance_reidentification
from fedgat.dp import FeatureDP
from fedgat.partition import make_partition
from fedgat.synthetic import synthetic_graph


@pytest.fixture(scope="module")
def graph():
    return synthetic_graph(num_nodes=400, num_features=24, avg_degree=5.0, seed=5)


def test_unmitigated_audit_recovers_all_foreign_neighbours(graph):
    vec = audit_clients(graph, "vector", num_clients=4, seed=0, mitigation=Mitigation(min_cross=1))
    mat = audit_clients(graph, "matrix", num_clients=4, seed=0, mitigation=Mitigation(min_cross=1))
    assert vec.scores["basis"].recovered_fraction == 1.0
    assert mat.scores["spectral"].recovered_fraction == 1.0
    assert mat.scores["m1_trace"].recovered_fraction == 1.0
    assert vec.scores["neighbour_sum"].recovered_fraction > 0.05


def test_each_mitigation_reduces_recovery(graph):
    base = audit_clients(graph, "vector", num_clients=4, seed=0, mitigation=Mitigation(min_cross=1))
    rule = audit_clients(graph, "vector", num_clients=4, seed=0, mitigation=Mitigation(min_cross=2))
    cap = audit_clients(
        graph, "vector", num_clients=4, seed=0, mitigation=Mitigation(min_cross=1, neighbour_cap=2)
    )
    dp = audit_clients(
        graph,
        "vector",
        num_clients=4,
        seed=0,
        mitigation=Mitigation(dp=FeatureDP(epsilon=1.0, mechanism="gaussian", dim=None)),
    )
    # the rule stops the sum attack; the cap shrinks the number of exposed neighbours; DP blinds all
    assert rule.scores["neighbour_sum"].recovered == 0 < base.scores["neighbour_sum"].recovered
    assert cap.scores["basis"].recovered < base.scores["basis"].recovered
    assert dp.scores["basis"].recovered_fraction == 0.0
    part = make_partition(graph, 4, seed=0)
    assert dp.scores["basis"].reidentification_rate < 10 * chance_reidentification(graph, part) + 0.05


#: run-to-run variance of a re-identification count over its mean (measured: 5 audits each at epsilon
#: 1 gave 87-134 hits, the null release 80-103, out of 3,876: about twice a Poisson count's variance,
#: because one victim's hits are correlated across the attacker's guesses)
DISPERSION = 2.0


def _at_chance(score, null) -> bool:
    """Re-identification consistent with the null release's: the difference of the two counts (both
    random: the DP noise comes from the CSPRNG, the null's shuffle from the seed) is below 3.5
    standard deviations of a difference of two overdispersed counts. A real leak is far above it
    (epsilon 16: 358 hits against the null's ~94, z ~ 9; epsilon 256: all 3,876)."""
    diff = score.reidentified - null.reidentified
    return diff < 3.5 * math.sqrt(DISPERSION * (score.reidentified + null.reidentified + 1))


def test_null_release_defines_chance_and_dp_reaches_it(graph):
    def audit(eps, null):
        dp = None if eps is None else FeatureDP(epsilon=eps, mechanism="gaussian", dim=None)
        return audit_clients(
            graph,
            "vector",
            num_clients=4,
            seed=0,
            mitigation=Mitigation(min_cross=2, dp=dp),
            null_release=null,
        ).scores

    clear, clear_null = audit(None, False), audit(None, True)
    strong, strong_null = audit(1.0, False), audit(1.0, True)
    weak, weak_null = audit(256.0, False), audit(256.0, True)
    # the null release carries no information: the basis attack falls to chance on it (a shuffled row
    # can land on a victim's own features, so chance is small but not zero) ...
    assert clear["basis"].reidentification_rate == 1.0 > 20 * clear_null["basis"].reidentification_rate
    # ... the check is not blind (weak DP is far above its null) and strong DP is at its null
    assert not _at_chance(clear["basis"], clear_null["basis"])
    assert not _at_chance(weak["basis"], weak_null["basis"])
    assert _at_chance(strong["basis"], strong_null["basis"])
    assert _at_chance(strong["neighbour_sum"], strong_null["neighbour_sum"])
    # the prior-knowledge baseline uses only the client's own nodes: identical with or without a release
    assert strong["prior_knowledge"].reidentified == strong_null["prior_knowledge"].reidentified
