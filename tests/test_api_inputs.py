"""The Python API refuses wrong inputs early, with a typed error naming the problem (a walkthrough
found each of these failing deep inside, or worse, silently giving another graph's results)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedgat.audit import Mitigation, audit_clients, audit_server
from fedgat.graph import Graph
from fedgat.methods import fedgat_model_fn, run_method
from fedgat.owners import OwnersError
from fedgat.partition import PartitionMismatchError, check_partition, make_partition
from fedgat.pipeline import (
    max_abs_error,
    run_encrypted_fedgat,
    run_encrypted_pretraining,
    run_plaintext_pretraining,
    train_fedgat,
)
from fedgat.synthetic import synthetic_graph

SIZES = {"num_features": 8, "train_per_class": 4, "num_val": 24, "num_test": 24}


@pytest.fixture(scope="module")
def graph() -> Graph:
    return synthetic_graph(num_nodes=120, seed=0, **SIZES)


@pytest.fixture(scope="module")
def partition(graph):
    return make_partition(graph, 3, seed=0, num_layers=2)


def test_a_partition_of_another_graph_is_refused(graph, partition):
    """Same node count with other edges (the silent case), another node count, another split."""
    same_size = synthetic_graph(num_nodes=120, seed=1, **SIZES)
    smaller = synthetic_graph(num_nodes=100, seed=0, **SIZES)
    for other in (same_size, smaller):
        theirs = make_partition(other, 3, seed=0, num_layers=2)
        with pytest.raises(PartitionMismatchError, match="another graph"):
            run_plaintext_pretraining(graph, theirs, seed=0)
        with pytest.raises(PartitionMismatchError, match="another graph"):
            run_encrypted_pretraining(graph, theirs, seed=0, progress=False, workers=0)
        with pytest.raises(PartitionMismatchError):
            audit_clients(graph, "vector", partition=theirs)
        with pytest.raises(PartitionMismatchError):
            audit_server(graph, theirs)
    encodings = run_plaintext_pretraining(graph, partition, seed=0)
    with pytest.raises(PartitionMismatchError, match="same node count, other edges"):
        train_fedgat(same_size, partition, encodings, progress=False)
    # features do not enter: a DP release of the same graph keeps its partition
    released = Graph(**{**_fields(graph), "x": graph.x.flip(0)})
    check_partition(released, partition)
    with pytest.raises(TypeError, match="graph must be a fedgat Graph, got str"):
        run_encrypted_pretraining("cora", partition)  # type: ignore[arg-type]


def _fields(g: Graph) -> dict:
    keys = ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask", "num_classes", "name")
    return {k: getattr(g, k) for k in keys}


def test_audit_clients_refuses_a_partition_made_without_its_mitigation(graph):
    plain = make_partition(graph, 3, seed=0)
    with pytest.raises(ValueError, match="made with min_cross=0, neighbour_cap=None but the mitigation"):
        audit_clients(graph, "vector", mitigation=Mitigation(min_cross=2), partition=plain)
    ruled = make_partition(graph, 3, seed=0, min_cross=2)
    got = audit_clients(graph, "vector", mitigation=Mitigation(min_cross=2), partition=ruled)
    want = audit_clients(graph, "vector", 3, seed=0, mitigation=Mitigation(min_cross=2))
    assert {k: s.as_dict() for k, s in got.scores.items()} == {k: s.as_dict() for k, s in want.scores.items()}
    with pytest.raises(ValueError, match=r"clients \[5\]: ids must lie in 0..2"):
        audit_clients(graph, "vector", 3, clients=[5])
    with pytest.raises(ValueError, match=r"colluder 9 is not a client id \(0..2\)"):
        audit_server(graph, make_partition(graph, 3, seed=0, num_layers=2), colluder=9)


def test_owners_set_the_client_count_everywhere(graph):
    owner = np.arange(graph.num_nodes) % 3
    run = run_method("fedgat", graph, owner=owner, rounds=1)
    assert run.num_clients == 3
    assert run_method("fedgat", graph, owner=owner.astype(float), rounds=1).num_clients == 3  # as load_owners
    for call in (
        lambda: run_method("fedgat", graph, 5, owner=owner, rounds=1),
        lambda: run_encrypted_fedgat(graph, 5, owner=owner, progress=False),
    ):
        with pytest.raises(OwnersError, match="num_clients is 5 but owner names 3 clients"):
            call()
    with pytest.raises(OwnersError, match="client 1 owns no nodes"):
        run_method("distgat", graph, owner=np.where(owner == 1, 2, owner), rounds=1)


def test_bad_values_fail_before_any_work(graph, partition):
    for seed in (-1, 1.5):
        with pytest.raises(ValueError, match="seed must be an integer >= 0"):
            run_method("gcn", graph, seed=seed, rounds=1)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="seed must be"):
        run_encrypted_fedgat(graph, 3, seed=-1, progress=False)
    with pytest.raises(ValueError, match=r"dp_budget must be a pair \(epsilon, delta\) of numbers, got 8"):
        run_encrypted_fedgat(graph, 3, dp_epsilon=2.0, dp_budget=8, progress=False)
    with pytest.raises(ValueError, match="upload_batch must be an integer >= 1, got 0"):
        run_encrypted_pretraining(graph, partition, upload_batch=0, progress=False, workers=0)
    encodings = run_plaintext_pretraining(graph, partition, seed=0)
    with pytest.raises(ValueError, match=r"no encodings for clients \[2\]"):
        train_fedgat(graph, partition, {c: encodings[c] for c in (0, 1)}, progress=False)
    for bad in (-1, 1.5, True):  # the server's pool size: was refused only once the round ran
        with pytest.raises(
            ValueError, match=rf"workers must be None \(one per core\) or a count >= 0 .*{bad!r}"
        ):
            run_encrypted_fedgat(graph, 3, workers=bad, progress=False)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=rf"encrypt_workers must be 'auto' or a count >= 0, got {bad!r}"):
            run_encrypted_pretraining(graph, partition, encrypt_workers=bad, progress=False)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"min_cross": -1}, ValueError, "min_cross must be >= 0, got -1"),
        ({"min_cross": 2.0}, TypeError, "min_cross must be an integer, got 2.0"),
        ({"neighbour_cap": 0}, ValueError, "neighbour_cap must be >= 1, got 0"),
        ({"dp": 4.0}, TypeError, "dp must be a fedgat.dp.FeatureDP or None, got float"),
    ],
)
def test_a_mitigation_is_checked_when_made(graph, fields, error, message):
    with pytest.raises(error, match=message):
        Mitigation(**fields)
    if "dp" not in fields:  # the partition's own rule, as make_partition gets it
        with pytest.raises(error, match=message):
            make_partition(graph, 3, seed=0, **fields)


def test_training_follows_the_encodings_variant(graph):
    capped = make_partition(graph, 3, seed=0, num_layers=2, neighbour_cap=16)
    matrix = run_plaintext_pretraining(graph, capped, "matrix", seed=0)
    run = train_fedgat(graph, capped, matrix, rounds=1, progress=False)
    assert run.hparams["variant"] == "matrix" and run.hparams["neighbour_cap"] == 16
    with pytest.raises(ValueError, match="variant='vector' but the encodings are the matrix variant's"):
        train_fedgat(graph, capped, matrix, rounds=1, progress=False, variant="vector")


def test_a_run_summary_says_how_it_pre_trained_and_for_how_many_clients(graph):
    twin = run_encrypted_fedgat(graph, 3, seed=4, encrypted=False, rounds=1, progress=False)
    summary = twin.summary()
    assert (summary["pretraining"], summary["num_clients"], summary["seed"]) == ("plaintext twin", 3, 4)
    json.dumps(summary)


def test_graphs_compare_by_content(graph):
    assert Graph.from_pyg(graph.to_pyg()) == graph  # as to_pyg's docstring says
    assert graph != synthetic_graph(num_nodes=120, seed=1, **SIZES)
    assert graph != Graph(**{**_fields(graph), "name": "other"})
    assert {graph: 1}[graph] == 1  # hashable (by identity)


def test_the_one_call_api_paces_uploads_as_the_demo_can(graph):
    """``run_encrypted_fedgat(upload_window=)`` reaches the pre-training round (the spool then holds a
    recipient's uploads at a time, not the round's)."""
    paced = run_encrypted_fedgat(graph, 3, upload_window=1, workers=0, rounds=1, progress=False)
    assert paced.pretrain is not None and paced.pretrain.upload_window == 1
    assert paced.summary()["upload_window"] == 1 and paced.summary()["pretraining"] == "encrypted"


def test_a_newcomers_mistakes_are_named_where_they_are_made(graph, partition):
    """From a walkthrough of the Python API: each of these ended in an AttributeError or IndexError
    deep inside (some from PyG), a bare KeyError, or a ValueError that did not say why."""
    plain = run_plaintext_pretraining(graph, partition, seed=0)
    for call in (
        lambda: make_partition(graph.to_pyg(), 3),
        lambda: make_partition(graph.x.numpy(), 3),
        lambda: run_encrypted_fedgat(graph.to_pyg(), 3, progress=False),
        lambda: train_fedgat(graph.to_pyg(), partition, plain, progress=False),
        lambda: run_method("gcn", graph.x, rounds=1),
    ):
        with pytest.raises(
            TypeError, match=r"graph must be a fedgat Graph, got \w+: load_dataset .*from_pyg"
        ):
            call()
    # seeds of another type: a float or bool seeded other bases than the integer, silently
    for bad in (1.5, True):
        with pytest.raises(TypeError, match=r"seed must be an integer or None, got"):
            run_encrypted_pretraining(graph, partition, seed=bad, progress=False)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"seed must be an integer or a string, got"):
            run_plaintext_pretraining(graph, partition, seed=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"seed must be an integer, got '0'"):
        train_fedgat(graph, partition, plain, seed="0", progress=False)  # type: ignore[arg-type]
    # a result object where its encodings are meant
    pre = run_encrypted_pretraining(graph, partition, seed=0, progress=False, workers=0)
    with pytest.raises(
        TypeError, match=r"encodings must map client id -> Encodings \(pass the run's .encodings\)"
    ):
        train_fedgat(graph, partition, pre, progress=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got must map client id -> Encodings \(a run's .encodings\)"):
        max_abs_error(pre, plain)  # type: ignore[arg-type]
    # rounds with other bases: the message asks about the seed
    other = run_plaintext_pretraining(graph, partition, seed=1)
    with pytest.raises(ValueError, match=r"other nodes or bases; were both rounds run with the same seed="):
        max_abs_error(pre.encodings, other)
    assert max_abs_error(pre.encodings, plain) < 1e-5
    # another run's deployment (a bare KeyError once)
    four = make_partition(graph, 4, seed=0)
    pre4 = run_encrypted_pretraining(graph, four, seed=0, progress=False, workers=0)
    with pytest.raises(
        ValueError, match=r"the deployment's clients are \[0, 1, 2, 3\] but the partition has 3"
    ):
        train_fedgat(graph, partition, plain, deployment=pre4.deployment, progress=False)
    # client 0 without nodes: trains like any other empty client (it ended in an IndexError, reading
    # the input width off client 0's encodings)
    owner = np.array([1, 2, 3] * 40)
    empty = make_partition(graph, 4, seed=0, owner=owner)
    trained = train_fedgat(
        graph, empty, run_plaintext_pretraining(graph, empty, seed=0), rounds=1, progress=False
    )
    assert trained.fit.rounds == 1
    # a misspelt keyword lands among the hyper-parameters: the message suggests the argument
    with pytest.raises(
        ValueError, match=r"'ecnrypted': did you mean 'encrypted'\?; 'owners': did you mean 'owner'\?"
    ):
        run_encrypted_fedgat(graph, 3, owners=owner, ecnrypted=False, progress=False)


def test_results_print_short_and_hand_back_the_trained_model(graph, partition):
    """A notebook shows the last value of a cell: results used to print hundreds of kilobytes."""
    run = run_encrypted_fedgat(graph, 3, seed=0, encrypted=False, rounds=2, progress=False)
    plain = run_plaintext_pretraining(graph, partition, seed=0)
    for shown in (run, plain, partition, plain[0], plain[0].buckets[0].bases, partition.clients[0]):
        assert len(repr(shown)) < 2_000, type(shown).__name__
    assert repr(plain[0]).startswith("Encodings('vector', ") and " nodes in " in repr(plain[0])
    fit = run.training.fit
    assert fit.model_state is not None and fit.best_round >= 1
    model = fedgat_model_fn(graph.num_features, graph.num_classes, run.training.hparams)()
    model.load_state_dict(fit.model_state)  # the weights of the best validation round load as they are
