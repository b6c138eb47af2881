"""A hostile server publishes a trap as ``label_rr``'s predictor: the release still bounds what a
recipient infers (``fedgat.dp_attacks``), measured against the ground truth."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from fedgat.dp import rr_keep_probability
from fedgat.dp_attacks import chosen_predictor_attack, trap_predictor_state
from fedgat.dp_predictor import MLPPredictor, TrainedPredictor
from fedgat.partition import make_partition
from fedgat.synthetic import synthetic_graph


@pytest.fixture(scope="module")
def setting():
    graph = synthetic_graph(num_nodes=600, num_features=16, avg_degree=4.0, seed=4)
    # bag-of-words-like rows: each word present in about half the rows, row-normalised
    rng = np.random.default_rng(0)
    words = (rng.random((graph.num_nodes, graph.num_features)) < 0.5).astype(np.float32)
    words[:, 0] = 1.0  # no empty row
    graph = dataclasses.replace(graph, x=torch.from_numpy(words / words.sum(1, keepdims=True)))
    return graph, make_partition(graph, num_clients=3, beta=1.0, seed=0)


def test_the_trap_reads_one_word():
    reference = MLPPredictor(16, 5, hidden=8).state_dict()
    trap = TrainedPredictor(trap_predictor_state(reference, feature=3), hidden=8)
    x = np.zeros((4, 16), dtype=np.float32)
    x[:, 0] = 1.0
    x[1, 3] = x[3, 3] = 1e-3  # the smallest present word on Planetoid
    assert trap.labels(x).tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_a_chosen_predictor_learns_no_more_than_epsilon_allows(setting, epsilon):
    graph, part = setting
    out = chosen_predictor_attack(graph, part, epsilon, seed=0)
    assert out.nodes == graph.num_nodes and 0.3 < out.prevalence < 0.7
    # the trap works: every client kept the server's weights and they read the word exactly ...
    assert out.trap_accuracy == 1.0
    # ... the attack is not blind: it gets what randomised response over C classes gives away
    # (report 1 with the keep probability p for a present word, (1 - p)/(C - 1) for an absent one),
    # within 4.5 standard errors (the noise is the CSPRNG's: no seed makes this exact) ...
    p = rr_keep_probability(epsilon, graph.num_classes)
    expected = 0.5 * (p + 1 - (1 - p) / (graph.num_classes - 1))
    assert abs(out.balanced_accuracy - expected) < 1.5 * out.slack
    # ... and no better than a test under epsilon-DP can be
    assert out.bound == pytest.approx(math.exp(epsilon) / (1 + math.exp(epsilon)))
    assert out.within_bound, out


def test_with_a_loose_epsilon_the_trap_hands_the_word_over(setting):
    graph, part = setting
    out = chosen_predictor_attack(graph, part, 20.0, seed=0, feature=2)
    assert out.feature == 2 and out.balanced_accuracy > 0.99
