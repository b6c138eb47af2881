"""Federated training: FedAvg/FedProx, clients, server, and the Table-1 methods on small graphs."""

import numpy as np
import pytest
import torch
from torch import nn

from fedgat.encodings import encode
from fedgat.federated import (
    Client,
    ClientStrategy,
    FedAdam,
    FedAvg,
    FedProx,
    LocalTask,
    Server,
    StrategyPair,
    fedavg,
    strategy_from_hparams,
)
from fedgat.gcn import GCN, normalised_aggregate
from fedgat.methods import METHODS, build_federation, pretrain_bytes, resolve_hparams, run_method
from fedgat.models import FedGAT
from fedgat.partition import make_partition


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These graphs are tiny: intra-op threads only add contention (up to 30x slower on a busy box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------------------- FedAvg


def _random_states(k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(3, 4, generator=gen), "b": torch.randn(4, generator=gen)} for _ in range(k)]


@pytest.mark.parametrize("weights", [[1, 2, 3, 4], [0, 5, 0, 2], [7, 0, 0, 0], [0.5, 0.25, 0.25, 1.0]])
def test_fedavg_is_closed_form_weighted_mean(weights):
    states = _random_states(4)
    out = fedavg(states, weights)
    total = sum(weights)
    for key in ("w", "b"):
        expected = sum(w * s[key].double() for w, s in zip(weights, states)) / total
        torch.testing.assert_close(out[key], expected.float(), rtol=1e-6, atol=1e-7)
        assert out[key].dtype == torch.float32
    assert all(out[k] is not states[0][k] for k in out)


def test_fedavg_single_positive_weight_is_exact_and_ignores_zero_weight_nans():
    states = _random_states(3)
    states[0]["w"][0, 0] = float("nan")
    out = fedavg(states, [0, 3, 0])
    assert torch.equal(out["w"], states[1]["w"]) and torch.equal(out["b"], states[1]["b"])


@pytest.mark.parametrize(
    "states, weights, match",
    [
        ([], [], "at least one"),
        (_random_states(2), [1], "2 states but 1 weights"),
        (_random_states(2), [0, 0], "positive weight"),
        (_random_states(2), [1, -1], "non-negative"),
        (_random_states(2), [1, float("nan")], "finite"),
        ([{"w": torch.zeros(2)}, {"v": torch.zeros(2)}], [1, 1], "same keys"),
        ([{"w": torch.zeros(2)}, {"w": torch.zeros(3)}], [1, 1], "shape mismatch"),
        ([{"n": torch.zeros(2, dtype=torch.long)}], [1], "floating-point"),
    ],
)
def test_fedavg_rejects_bad_input(states, weights, match):
    with pytest.raises(ValueError, match=match):
        fedavg(states, weights)


def test_fedprox_penalty_and_validation():
    model = nn.Linear(3, 2)
    anchor = {k: v.detach() + 1.0 for k, v in model.state_dict().items()}
    numel = sum(p.numel() for p in model.parameters())
    assert FedProx(0.0).client_strategy().local_penalty(model, anchor) is None
    assert FedAvg().client_strategy().local_penalty(model, anchor) is None
    assert FedProx(0.5).client_strategy().local_penalty(model, anchor).item() == pytest.approx(0.25 * numel)
    assert ClientStrategy(mu=0.5).local_penalty(model, anchor).item() == pytest.approx(0.25 * numel)
    for bad in (-1.0, float("inf")):
        with pytest.raises(ValueError, match="mu"):
            FedProx(bad)
        with pytest.raises(ValueError, match="mu"):
            ClientStrategy(mu=bad)


# -------------------------------------------------------------------------------- clients/server


def _linear_clients(num_clients, num_train=(5,), seed=0, strategy=None):
    """Clients with a linear model on random data; client i has num_train[i % len] training nodes."""
    gen = torch.Generator().manual_seed(seed)
    clients = []
    for i in range(num_clients):
        x = torch.randn(20, 4, generator=gen)
        y = (x[:, 0] > 0).long()
        n = num_train[i % len(num_train)]
        task = LocalTask(
            (x,),
            {
                "train": (torch.arange(n), y[:n]),
                "val": (torch.arange(10, 15), y[10:15]),
                "test": (torch.arange(15, 20), y[15:20]),
            },
        )
        clients.append(Client(i, nn.Linear(4, 2), task, task, strategy=strategy))
    return clients


def test_sampling_fraction_count_and_seed():
    init = nn.Linear(4, 2).state_dict()
    server = Server(_linear_clients(10), init, fraction=0.3, seed=5)
    draws = [server.sample_clients() for _ in range(20)]
    assert all(len(d) == 3 and len(set(d)) == 3 and d == sorted(d) for d in draws)
    assert len({tuple(d) for d in draws}) > 1
    again = Server(_linear_clients(10), init, fraction=0.3, seed=5)
    assert [again.sample_clients() for _ in range(20)] == draws
    other = Server(_linear_clients(10), init, fraction=0.3, seed=6)
    assert [other.sample_clients() for _ in range(20)] != draws
    assert Server(_linear_clients(10), init, fraction=1.0).sample_clients() == list(range(10))
    assert Server(_linear_clients(10), init, fraction=0.01).clients_per_round == 1
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            Server(_linear_clients(2), init, fraction=bad)


def test_round_aggregates_by_training_nodes_and_zero_train_clients_have_no_weight():
    torch.manual_seed(0)
    clients = _linear_clients(3, num_train=(4, 0, 8))
    init = nn.Linear(4, 2).state_dict()
    server = Server(clients, init)
    torch.manual_seed(1)
    server.train_round()
    # redo by hand: the clients' own updates, weighted 4 : 0 : 8
    torch.manual_seed(0)
    again = _linear_clients(3, num_train=(4, 0, 8))
    torch.manual_seed(1)
    updates = [c.fit(init) for c in again]
    assert [u.num_train for u in updates] == [4, 0, 8]
    assert updates[1].state is init  # nothing trained, global state returned
    expected = fedavg([updates[0].state, updates[2].state], [4, 8])
    for k in expected:
        torch.testing.assert_close(server.state[k], expected[k])
    # all clients still evaluate: pooled counts over 3 x 5 validation nodes
    counts = [c.evaluate(server.state)["val"] for c in clients]
    assert sum(c.count for c in counts) == 15
    assert server.evaluate()["val_accuracy"] == sum(c.correct for c in counts) / 15


def test_client_keeps_optimiser_state_across_rounds():
    client = _linear_clients(1)[0]
    init = nn.Linear(4, 2).state_dict()
    client.fit(init)
    client.fit(init)
    steps = {int(s["step"]) for s in client.optimizer.state.values()}
    assert steps == {2}


def test_fedprox_keeps_clients_closer_to_global():
    init = nn.Linear(4, 2).state_dict()

    def drift(strategy):
        torch.manual_seed(0)
        client = _linear_clients(1, num_train=(10,), strategy=strategy)[0]
        client.local_epochs = 20
        state = client.fit(init).state
        return sum((state[k] - init[k]).square().sum() for k in init).item()

    assert drift(ClientStrategy(mu=100.0)) < drift(ClientStrategy())
    assert drift(FedProx(100.0)) == drift(ClientStrategy(mu=100.0))  # a server strategy: the half it asks for


def _pooled_adam(clients, init, rounds, lr, weight_decay):
    """Centralised Adam on the pooled training loss (mean over every client's training nodes) of
    one model, the reference FedAdam with E = 1 must follow."""
    model = clients[0].model.__class__(*_shape(init))
    model.load_state_dict(init)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    total = sum(c.num_train for c in clients)
    for _ in range(rounds):
        opt.zero_grad()
        loss = (
            sum(
                nn.functional.cross_entropy(
                    model(*c.train_task.inputs)[c.train_task.targets["train"][0]],
                    c.train_task.targets["train"][1],
                    reduction="sum",
                )
                for c in clients
                if c.num_train
            )
            / total
        )
        loss.backward()
        opt.step()
    return model.state_dict()


def _shape(state):
    out_features, in_features = state["weight"].shape
    return in_features, out_features


@pytest.mark.parametrize("client_lr", [1.0, 0.05])
def test_fedadam_with_one_local_epoch_is_centralised_adam_on_the_pooled_loss(client_lr):
    """Reddi et al.'s FedAdam with E = 1 and every client sampled: the pseudo-gradient is the pooled
    gradient, so the run is torch's Adam on the pooled loss (bias correction and L2 weight decay
    included) whatever the clients' SGD step. FedAvg with per-client Adam is not."""
    torch.manual_seed(0)
    init = nn.Linear(4, 2).state_dict()
    lr, wd, rounds = 0.05, 5e-3, 12
    strategy = FedAdam(lr, wd, client_lr=client_lr)
    clients = _linear_clients(4, num_train=(3, 9, 0, 5), seed=2, strategy=strategy.client_strategy())
    server = Server(clients, init, strategy)
    for _ in range(rounds):
        server.train_round()
    expected = _pooled_adam(_linear_clients(4, num_train=(3, 9, 0, 5), seed=2), init, rounds, lr, wd)
    for key, value in expected.items():
        torch.testing.assert_close(server.state[key], value, rtol=1e-4, atol=1e-5)
    assert not torch.equal(server.state["weight"], init["weight"])
    # the per-client-Adam FedAvg run differs (the point of FedAdam)
    plain = Server(
        [
            Client(c.client_id, nn.Linear(4, 2), c.train_task, c.eval_tasks, lr=lr, weight_decay=wd)
            for c in _linear_clients(4, num_train=(3, 9, 0, 5), seed=2)
        ],
        init,
    )
    for _ in range(rounds):
        plain.train_round()
    assert (plain.state["weight"] - expected["weight"]).abs().max() > 1e-3


def test_fedadam_clients_run_sgd_and_buffers_are_averaged():
    strategy = FedAdam(0.01, parameters=["weight"])
    model = nn.Linear(3, 2)
    opt = strategy.client_strategy().make_optimizer(model.parameters(), 0.5, 0.1)
    assert isinstance(opt, torch.optim.SGD)
    assert (opt.param_groups[0]["lr"], opt.param_groups[0]["weight_decay"]) == (1.0, 0)  # client_lr, none
    current = {"weight": torch.zeros(2, 3), "bias": torch.zeros(2)}
    states = [
        {"weight": torch.full((2, 3), -1.0), "bias": torch.full((2,), 2.0)},
        {"weight": torch.full((2, 3), -3.0), "bias": torch.full((2,), 4.0)},
    ]
    out = strategy.aggregate(states, [1, 3], current)
    torch.testing.assert_close(out["bias"], torch.full((2,), 3.5))  # not trained: the FedAvg mean
    # first Adam step moves every trained entry by lr in the pseudo-gradient's opposite direction
    torch.testing.assert_close(out["weight"], torch.full((2, 3), -0.01))
    assert current["weight"].eq(0).all()  # inputs untouched
    with pytest.raises(ValueError, match="current"):
        strategy.aggregate(states, [1, 3])


def test_fedadam_and_strategy_settings_are_validated():
    for kwargs, match in (
        ({"lr": 0.0}, "lr"),
        ({"lr": 0.1, "client_lr": -1.0}, "client_lr"),
        ({"lr": 0.1, "weight_decay": -1.0}, "weight_decay"),
        ({"lr": 0.1, "betas": (0.9, 1.0)}, "betas"),
    ):
        with pytest.raises(ValueError, match=match):
            FedAdam(**kwargs)
    hp = resolve_hparams("gat", {"strategy": "fedadam"})
    assert isinstance(strategy_from_hparams(hp).server, FedAdam)
    prox = resolve_hparams("gat", {"strategy": "fedavg", "mu": 0.1})
    assert isinstance(strategy_from_hparams(prox).server, FedProx)
    with pytest.raises(ValueError, match="mu"):
        strategy_from_hparams(resolve_hparams("gat", {"strategy": "fedadam", "mu": 0.1}))
    # FedAdam is the default, so mu alone is refused with the fix in the message
    with pytest.raises(ValueError, match="--strategy fedavg --mu"):
        strategy_from_hparams(resolve_hparams("gat", {"mu": 0.1}))
    with pytest.raises(ValueError, match="strategy"):
        resolve_hparams("gat", {"strategy": "fedsgd"})


def test_strategy_halves():
    """strategy_from_hparams builds both halves; the client half is what the server half asks for, and a
    client given the server half (or nothing) trains as with the client half (or FedAvg's)."""
    for overrides, server_type, client in (
        ({}, FedAdam, ClientStrategy("sgd", lr=1.0, weight_decay=0.0)),  # the default
        ({"strategy": "fedavg"}, FedAvg, ClientStrategy()),
        ({"strategy": "fedavg", "mu": 0.1}, FedProx, ClientStrategy(mu=0.1)),
        ({"strategy": "fedadam", "client_lr": 0.5}, FedAdam, ClientStrategy("sgd", lr=0.5, weight_decay=0.0)),
    ):
        pair = strategy_from_hparams(resolve_hparams("gat", overrides))
        assert isinstance(pair, StrategyPair) and type(pair.server) is server_type
        assert pair.client == client == pair.server.client_strategy()
    model = nn.Linear(3, 2)
    adam = ClientStrategy().make_optimizer(model.parameters(), 0.01, 5e-4)
    assert isinstance(adam, torch.optim.Adam) and adam.param_groups[0]["weight_decay"] == 5e-4
    own = ClientStrategy("sgd", lr=0.2).make_optimizer(model.parameters(), 0.01, 5e-4)
    assert isinstance(own, torch.optim.SGD) and (
        own.param_groups[0]["lr"],
        own.param_groups[0]["weight_decay"],
    ) == (0.2, 5e-4)
    for kwargs in ({"optimizer": "lbfgs"}, {"lr": 0.0}, {"weight_decay": -1.0}):
        with pytest.raises(ValueError):
            ClientStrategy(**kwargs)
    assert Client(
        0, nn.Linear(4, 2), *[_linear_clients(1)[0].train_task] * 2, strategy=FedAdam(0.1, client_lr=0.3)
    ).training == ClientStrategy("sgd", lr=0.3, weight_decay=0.0)
    assert _linear_clients(1)[0].training == ClientStrategy()
    with pytest.raises(TypeError):
        Client(0, nn.Linear(4, 2), *[_linear_clients(1)[0].train_task] * 2, strategy=pair)


def test_server_requires_validation_nodes():
    task = LocalTask((torch.zeros(2, 4),), {"train": (torch.arange(2), torch.zeros(2, dtype=torch.long))})
    with pytest.raises(ValueError, match="validation"):
        Server([Client(0, nn.Linear(4, 2), task, task)], nn.Linear(4, 2).state_dict())


# ---------------------------------------------------------------------------------------- methods


def test_one_client_fedgat_equals_centralised_training(small_graph):
    """K = 1, E = 1: the federated run is plain full-batch training of the same model."""
    rounds = 5
    fed = build_federation("fedgat", small_graph, num_clients=1, seed=0)
    ((train, evaluation),) = fed.tasks
    torch.manual_seed(0)
    init = fed.model_fn().state_dict()
    client = Client(0, fed.model_fn(), train, evaluation)
    server = Server([client], init)
    torch.manual_seed(123)
    server.fit(rounds)

    model = fed.model_fn()
    model.load_state_dict(init)
    opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    rows, labels = train.targets["train"]
    torch.manual_seed(123)
    for _ in range(rounds):
        model.train()
        opt.zero_grad()
        nn.functional.cross_entropy(model(*train.inputs)[rows], labels).backward()
        opt.step()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(server.state[key], value, rtol=1e-5, atol=1e-6)
    assert not torch.equal(server.state["conv1.lin.weight"], init["conv1.lin.weight"])


def test_fedadam_fedgat_follows_adam_on_the_pooled_loss(small_graph):
    """Three FedGAT clients (dropout off, so the comparison is deterministic) under FedAdam move the
    global model exactly as Adam on the sum of their training losses would."""
    rounds, hp = 4, {"dropout": 0.0, "feature_dropout": 0.0, "strategy": "fedadam", "min_cross": 0}
    fed = build_federation("fedgat", small_graph, num_clients=3, seed=0, **hp)
    torch.manual_seed(0)
    init = fed.model_fn().state_dict()
    strategy = strategy_from_hparams(resolve_hparams("fedgat", hp))
    clients = [
        Client(i, fed.model_fn(), t, e, strategy=strategy.client) for i, (t, e) in enumerate(fed.tasks)
    ]
    server = Server(clients, init, strategy.server)
    for _ in range(rounds):
        server.train_round()

    model = fed.model_fn()
    model.load_state_dict(init)
    opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    total = sum(c.num_train for c in clients)
    for _ in range(rounds):
        opt.zero_grad()
        loss = sum(
            nn.functional.cross_entropy(
                model(*t.inputs)[t.targets["train"][0]], t.targets["train"][1], reduction="sum"
            )
            for t, _ in fed.tasks
            if t.count("train")
        )
        (loss / total).backward()
        opt.step()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(server.state[key], value, rtol=1e-4, atol=1e-5)


def test_fedgat_support_tasks_match_forward_over_all_needed_nodes(small_graph):
    """Training/eval on the targets' 1-hop support gives the logits of a forward over ``needed``."""
    g = small_graph
    fed = build_federation("fedgat", g, num_clients=3, beta=1.0, seed=2)
    part = make_partition(g, 3, 1.0, 2)
    torch.manual_seed(0)
    model = fed.model_fn().eval()
    with torch.no_grad():
        for cid, (train, evaluation) in enumerate(fed.tasks):
            needed, edges = part.local_subgraph(cid)
            full = model(encode("vector", g.x, part.neighbourhoods, nodes=needed, rng=9), edges)
            cp = part.clients[cid]
            for task, split in ((train, "train"), (evaluation[0], "val"), (evaluation[1], "test")):
                rows, labels = task.targets[split]
                nodes = getattr(cp, f"{split}_nodes")
                assert torch.equal(labels, g.y[nodes])
                ours = model(*task.inputs)[rows]
                torch.testing.assert_close(ours, full[np.searchsorted(cp.owned, nodes)], rtol=1e-4, atol=1e-4)


def test_fedgat_learns_on_synthetic_graph(small_graph):
    result = run_method("fedgat", small_graph, num_clients=3, beta=1.0, seed=0, rounds=60, patience=None)
    assert result.test_accuracy > 2 * (1 / small_graph.num_classes)
    assert result.rounds == 60 and len(result.history) == 60
    assert result.history[result.best_round - 1]["test_accuracy"] == result.test_accuracy
    assert result.best_val_accuracy == max(h["val_accuracy"] for h in result.history)


def test_early_stopping_reports_test_at_best_validation(small_graph):
    result = run_method("gat", small_graph, seed=0, rounds=300, patience=5)
    assert result.rounds == result.best_round + 5 or result.rounds == 300
    best = result.history[result.best_round - 1]
    assert (best["val_accuracy"], best["test_accuracy"]) == (result.best_val_accuracy, result.test_accuracy)
    assert all(h["val_accuracy"] <= result.best_val_accuracy for h in result.history)
    # test is evaluated only in rounds that set a new best
    assert all(
        ("test_accuracy" in h)
        == (h["val_accuracy"] >= max(g["val_accuracy"] for g in result.history[: i + 1]))
        for i, h in enumerate(result.history)
        if "test_accuracy" in h
    )


def test_test_every_round_gives_the_same_run():
    def fit(every):
        torch.manual_seed(0)
        clients = _linear_clients(3)
        for c in clients:  # labels unrelated to x: validation stops improving early
            rows, labels = c.eval_tasks[0].targets["val"]
            c.eval_tasks[0].targets["val"] = (rows, torch.randint(0, 2, labels.shape))
        server = Server(clients, nn.Linear(4, 2).state_dict())
        return server.fit(30, test_every_round=every)

    lazy, every = fit(False), fit(True)
    assert all("test_accuracy" in h for h in every.history)
    assert sum("test_accuracy" in h for h in lazy.history) < 30
    assert (lazy.best_round, lazy.test_accuracy) == (every.best_round, every.test_accuracy)


def test_distgat_uses_no_cross_client_edge(small_graph):
    g = small_graph
    fed = build_federation("distgat", g, num_clients=4, beta=1.0, seed=1)
    part = make_partition(g, 4, 1.0, 1)
    seen = set()
    for cid, (task, _) in enumerate(fed.tasks):
        owned = part.clients[cid].owned
        x, edges = task.inputs
        assert torch.equal(x, g.x[owned])
        src, dst = owned[edges[0].numpy()], owned[edges[1].numpy()]
        assert (part.owner[src] == cid).all() and (part.owner[dst] == cid).all()
        seen |= set(zip(src.tolist(), dst.tolist()))
    e = g.edge_index.numpy()
    same = part.owner[e[0]] == part.owner[e[1]]
    expected = set(zip(e[0][same].tolist(), e[1][same].tolist())) | {(i, i) for i in range(g.num_nodes)}
    assert seen == expected
    assert (~same).any()  # there were cross-client edges to drop


def test_fedgcn_aggregates_are_normalised_neighbour_sums(small_graph):
    g = small_graph
    n = g.num_nodes
    a = torch.eye(n)
    a[g.edge_index[1], g.edge_index[0]] = 1.0
    d = a.sum(1)
    a_hat = a / torch.sqrt(d[:, None] * d[None, :])
    torch.testing.assert_close(
        normalised_aggregate(g.x, g.neighbourhoods()), a_hat @ g.x, rtol=1e-5, atol=1e-6
    )


def test_fedgcn_clients_reproduce_centralised_gcn_logits(small_graph):
    """With the same weights, every client's logits at its owned val/test nodes equal the centralised
    GCN's: the pre-computed rows are (A_hat X)_i and layer 2 uses full-graph normalisation."""
    g = small_graph
    fed = build_federation("fedgcn", g, num_clients=3, beta=1.0, seed=0)
    part = make_partition(g, 3, 1.0, 0, min_cross=0)
    torch.manual_seed(0)
    central = GCN(g.num_features, g.num_classes).eval()
    client_model = fed.model_fn().eval()
    with torch.no_grad():
        client_model.lin1.weight.copy_(central.conv1.lin.weight)
        client_model.lin1.bias.copy_(central.conv1.bias)
        client_model.conv2.lin.weight.copy_(central.conv2.lin.weight)
        client_model.conv2.bias.copy_(central.conv2.bias)
        reference = central(g.x, g.edge_index)
        for cid, (_, evaluation) in enumerate(fed.tasks):
            for task, split in zip(evaluation, ("val", "test")):
                logits = client_model(*task.inputs)
                rows, _ = task.targets[split]
                nodes = getattr(part.clients[cid], f"{split}_nodes")
                torch.testing.assert_close(logits[rows], reference[nodes], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant, cap", [("vector", None), ("matrix", 4)])
def test_pretrain_bytes_equal_encodings_nbytes(small_graph, variant, cap):
    g = small_graph
    part = make_partition(g, 3, 1.0, 0, neighbour_cap=cap)
    expected = sum(
        encode(variant, g.x, part.neighbourhoods, nodes=c.needed, rng=0).nbytes() for c in part.clients
    )
    assert pretrain_bytes("fedgat", g, 3, 1.0, 0, variant=variant, neighbour_cap=cap) == expected


def test_pretrain_bytes_of_the_other_methods(small_graph):
    g = small_graph
    part = make_partition(g, 3, 1.0, 0, min_cross=0)
    assert (
        pretrain_bytes("fedgcn", g, 3, 1.0, 0)
        == sum(len(c.needed) for c in part.clients) * g.num_features * 4
    )
    for method in ("distgat", "gat", "gcn"):
        assert pretrain_bytes(method, g, 3) == 0


def test_hparams_resolution_and_errors(small_graph):
    assert resolve_hparams("fedgat", {"variant": "matrix"})["neighbour_cap"] == 16
    assert resolve_hparams("fedgat", {})["neighbour_cap"] is None
    assert resolve_hparams("fedgat", {"variant": "matrix", "neighbour_cap": None})["neighbour_cap"] is None
    with pytest.raises(ValueError, match="unknown hyper-parameter"):
        resolve_hparams("gcn", {"heads": 4})
    with pytest.raises(ValueError, match="unknown method"):
        run_method("nope", small_graph)
    with pytest.raises(ValueError, match="variant"):
        resolve_hparams("fedgat", {"variant": "tensor"})
    assert set(METHODS) == {"fedgat", "distgat", "fedgcn", "gat", "gcn"}


@pytest.mark.parametrize(
    ("method", "overrides", "match"),
    [
        ("fedgat", {"fraction": 0.0}, r"fraction must lie in \(0, 1\], got 0.0"),
        ("gcn", {"fraction": 1.01}, r"fraction must lie in \(0, 1\]"),
        ("gat", {"dropout": 1.0}, r"dropout must lie in \[0, 1\)"),
        ("fedgat", {"feature_dropout": -0.1}, r"feature_dropout must lie in \[0, 1\)"),
        ("distgat", {"strategy": "fedavg", "mu": -0.5}, r"mu must lie in \[0, inf\)"),
        ("fedgat", {"lr": float("nan")}, r"lr must lie in \(0, inf\), got nan"),
        ("fedgat", {"weight_decay": -1e-4}, r"weight_decay must lie in \[0, inf\)"),
        ("fedgat", {"domain": 0.0}, r"domain must lie in \(0, inf\)"),
        ("fedgat", {"psi": "relu"}, r"unknown psi 'relu'"),
        ("fedgat", {"min_cross": -1}, r"min_cross must be an integer >= 0"),
        ("fedgat", {"rounds": 2.5}, r"rounds must be an integer >= 1"),
        ("fedgat", {"patience": 0}, r"patience must be an integer >= 1"),
        ("fedgat", {"heads": True}, r"heads must be an integer >= 1"),
        ("fedgcn", {"update_dp_clip": 0.0}, r"update_dp_clip must lie in \(0, inf\)"),
        ("fedgat", {"fraction": None}, r"fraction must lie in \(0, 1\], got None"),
        ("gat", {"lr": None}, r"lr must lie in \(0, inf\), got None"),
        ("fedgat", {"dp_dim": 0}, r"dp_dim must be an integer >= 1"),
    ],
)
def test_hparams_out_of_range_are_refused_before_any_set_up(method, overrides, match):
    with pytest.raises(ValueError, match=match):
        resolve_hparams(method, overrides)


def test_hparams_at_the_ends_of_their_ranges_are_accepted():
    hp = resolve_hparams(
        "fedgat", {"fraction": 1.0, "dropout": 0.0, "mu": 0.0, "min_cross": 0, "patience": None, "rounds": 1}
    )
    assert (hp["fraction"], hp["dropout"], hp["patience"], hp["rounds"]) == (1.0, 0.0, None, 1)
    assert resolve_hparams("gcn", {"fraction": 1e-9})["fraction"] == 1e-9
    assert resolve_hparams("fedgat", {"dp_dim": None})["dp_dim"] is None  # the release without projection
    numpy = resolve_hparams("fedgat", {"fraction": np.float32(0.5), "rounds": np.int64(3)})
    assert (numpy["fraction"], numpy["rounds"]) == (0.5, 3)


@pytest.mark.parametrize("method", ["distgat", "fedgcn", "gcn"])
def test_every_method_runs_and_reports(small_graph, method):
    result = run_method(method, small_graph, num_clients=3, seed=0, rounds=3)
    assert 0.0 <= result.test_accuracy <= 1.0 and result.rounds == 3
    assert result.num_clients == (1 if method == "gcn" else 3)
    summary = result.to_dict()
    assert "history" not in summary and summary["method"] == method


def test_fedgat_model_is_the_public_one(small_graph):
    fed = build_federation("fedgat", small_graph, num_clients=2, feature_dropout=0.1, degree=8)
    model = fed.model_fn()
    assert isinstance(model, FedGAT)
    assert model.conv1.feature_dropout == 0.1 and model.conv1.score.degree == 8


def test_state_to_host_copies_every_entry_and_names_the_first_non_finite():
    from fedgat.federated import _state_to_host

    state = {
        "a.weight": torch.randn(3, 4),
        "a.bias": torch.randn(4),
        "steps": torch.tensor(7),  # an integer buffer, 0-dimensional
        "b.weight": torch.randn(2, 2, dtype=torch.float64),
        "scale": torch.tensor(0.5),
    }
    host, bad = _state_to_host(state)
    assert bad is None and list(host) == list(state)
    for name, value in state.items():
        assert host[name].dtype == value.dtype and host[name].shape == value.shape
        assert torch.equal(host[name], value) and host[name].data_ptr() != value.data_ptr()
    state["b.weight"][1, 0] = float("nan")
    state["scale"].fill_(float("inf"))
    assert _state_to_host(state)[1] == "b.weight"  # the first in the state's order
    assert _state_to_host({}) == ({}, None)
