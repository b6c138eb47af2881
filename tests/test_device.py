"""Devices: ``resolve_device``, moving encodings (``Encodings.to``), clients training on a device, and
``--device`` on the command line.

Without a GPU the moves are checked on torch's ``meta`` device, which every machine has: a tensor
left behind on the CPU shows up there. The tests marked ``cuda`` need a GPU and are skipped without
one (CI is CPU-only); they compare CUDA against the CPU.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedgat import cli
from fedgat.device import DeviceError, DeviceUnavailableError, describe_device, resolve_device, to_device
from fedgat.encodings import Encodings, encode
from fedgat.federated import Client, Server, strategy_from_hparams
from fedgat.layer import _PLANS, FedGATConv
from fedgat.methods import build_federation, resolve_hparams, run_method
from fedgat.synthetic import synthetic_graph

HAS_CUDA = torch.cuda.is_available()
cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def graph():
    return synthetic_graph(num_nodes=80, num_features=12, train_per_class=4, num_val=16, num_test=16, seed=3)


def _encodings(graph, variant: str) -> Encodings:
    return encode(variant, graph.x, graph.neighbourhoods(), rng=0).compact().factorise()


def _all_tensors(obj, seen=None) -> list[torch.Tensor]:
    """Every tensor reachable from ``obj`` through dataclass fields, instance attributes (cached
    properties included, once computed), dicts, lists and tuples: independent of ``tensors()``."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (np.ndarray, str, bytes, int, float, type(None))):
        return []
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return []
    return [t for item in items for t in _all_tensors(item, seen)]


def _touch_derived(enc: Encodings) -> None:
    """Build every lazily derived tensor of ``enc`` (what the layer reads)."""
    _ = enc.order, enc.flat_K2, enc.flat_h_self, enc.padded_groups
    for b in enc.buckets:
        _ = b.plain
    if enc.factorised and enc.kind.has_m2:
        _ = enc.flat_R


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def two_gpus(monkeypatch):
    """Pretend two CUDA devices exist (resolving builds torch.device objects only)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


# ------------------------------------------------------------------------------------ resolve_device
def test_resolve_cpu_and_auto_without_cuda(no_cuda):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3", torch.device("cuda", 0)])
def test_cuda_without_cuda_is_a_typed_error(no_cuda, spec):
    with pytest.raises(DeviceUnavailableError, match="CUDA is not available"):
        resolve_device(spec)


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "cuda:-1", "mps", "", "cuda0", "meta"])
def test_unknown_devices_are_refused(spec):
    with pytest.raises(DeviceError, match="unknown device") as exc:
        resolve_device(spec)
    assert not isinstance(exc.value, DeviceUnavailableError) and isinstance(exc.value, ValueError)


def test_resolve_cuda_with_gpus(two_gpus):
    assert resolve_device("cuda") == torch.device("cuda", 0)  # with its index, as tensors report it
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(DeviceUnavailableError, match="has 2 GPU"):
        resolve_device("cuda:2")


def test_describe_device_cpu():
    assert describe_device("cpu") == "cpu"


def test_run_method_refuses_cuda_without_it_before_any_work(no_cuda, graph, monkeypatch):
    import fedgat.methods

    monkeypatch.setitem(fedgat.methods._BUILDERS, "gat", lambda *a: pytest.fail("set-up ran"))
    with pytest.raises(DeviceUnavailableError):
        run_method("gat", graph, device="cuda", rounds=1)


# ------------------------------------------------------------------------------------ Encodings.to
@pytest.mark.parametrize("variant", ["vector", "matrix"])
def test_to_cpu_returns_the_same_encodings(graph, variant):
    enc = _encodings(graph, variant)
    assert enc.device == torch.device("cpu")
    assert enc.to("cpu") is enc and enc.to(torch.device("cpu")) is enc
    assert all(b.to("cpu") is b for b in enc.buckets)


@pytest.mark.parametrize("variant", ["vector", "matrix"])
def test_to_meta_moves_every_tensor_and_builds_derived_ones_there(graph, variant):
    enc = _encodings(graph, variant)
    _touch_derived(enc)  # caches on the CPU object must not follow it to the new device
    before = {k: v.clone() for k, v in enc.tensors().items()}
    moved = enc.to("meta")
    assert moved is not enc and moved.device == torch.device("meta")
    assert moved.variant == enc.variant and moved.nodes is enc.nodes
    stored = _all_tensors(moved)
    assert len(stored) == len(enc.tensors()) >= 2 * len(enc.buckets)  # every stored tensor was found
    _touch_derived(moved)
    everything = _all_tensors(moved)
    assert len(everything) > len(stored)  # the derived tensors are there too
    left = [tuple(t.shape) for t in everything if t.device.type != "meta"]
    assert not left, f"tensors left off the device: {left}"
    # shapes and dtypes travel, and the original is untouched (still on the CPU, same values)
    for key, t in moved.tensors().items():
        assert t.shape == before[key].shape and t.dtype == before[key].dtype
    assert all(t.device.type == "cpu" for t in _all_tensors(enc))
    for key, t in enc.tensors().items():
        torch.testing.assert_close(t, before[key], rtol=0, atol=0)


def test_matrix_layer_runs_on_meta_without_touching_the_cpu(graph):
    """The matrix layer's forward on encodings and weights on ``meta``: any tensor it made on the
    CPU (feature-free parts, padding masks, the output order) would fail or land on the CPU."""
    enc = _encodings(graph, "matrix").to("meta")
    layer = FedGATConv(graph.num_features, 4, heads=2).to("meta")
    out = layer(enc)
    assert out.device.type == "meta" and tuple(out.shape) == (graph.num_nodes, 8)


def test_vector_plans_are_cached_per_device(graph):
    enc = _encodings(graph, "vector")
    layer = FedGATConv(graph.num_features, 4, heads=2)
    layer(enc)
    keys = [k for k in _PLANS if k[0] == id(enc)]
    assert keys == [(id(enc), torch.float32, torch.device("cpu"))]


def test_to_device_moves_nested_values_once(graph):
    enc = _encodings(graph, "vector")
    x = torch.arange(4)
    rows = np.arange(3)
    value = ((x, enc, rows, 7), {"train": (x, x)})
    memo: dict = {}
    out = to_device(value, "meta", memo)
    (mx, menc, mrows, seven), targets = out
    assert mx.device.type == "meta" and menc.device.type == "meta"
    assert mrows is rows and seven == 7  # numpy arrays and numbers stay as they are
    assert targets["train"][0] is mx and targets["train"][1] is mx  # one move per object
    assert to_device(enc, "meta", memo) is menc


# ------------------------------------------------------------------------------------ command line
@pytest.mark.parametrize("command", ["train", "demo"])
def test_cli_cuda_graphs_need_cuda(command, tmp_path, capsys):
    out = tmp_path / "run.json"
    argv = [
        command,
        "--dataset",
        "synthetic",
        "--rounds",
        "1",
        "--quiet",
        "--cuda-graphs",
        "--json",
        str(out),
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--cuda-graphs captures CUDA work: it needs --device cuda (got --device cpu)" in err
    assert not out.exists()


def test_training_parties_refuse_cuda_graphs_off_cuda_before_any_work(graph, monkeypatch):
    """The protocol's rounds (what ``fedgat demo`` trains with) refuse ``cuda_graphs`` on the CPU
    before a party is built."""
    from fedgat import app

    monkeypatch.setattr(app, "build_rounds_server", lambda *a, **k: pytest.fail("built before the check"))
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device, not cpu"):
        app.build_training_parties(graph, None, {}, device="cpu", cuda_graphs=True)  # type: ignore[arg-type]


def test_run_method_refuses_cuda_graphs_off_cuda_before_any_work(graph, monkeypatch):
    from fedgat import methods

    monkeypatch.setitem(methods._BUILDERS, "fedgat", lambda *a: pytest.fail("set up before the check"))
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device, not cpu"):
        run_method("fedgat", graph, device="cpu", cuda_graphs=True, rounds=1)


def test_cli_train_refuses_cuda_without_it(no_cuda, tmp_path, capsys):
    out = tmp_path / "run.json"
    argv = ["train", "--dataset", "synthetic", "--method", "gcn", "--rounds", "1", "--quiet"]
    assert cli.main([*argv, "--device", "cuda", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert "fedgat train: error: --device cuda:" in err and "CUDA is not available" in err
    assert not out.exists()


@pytest.mark.parametrize("command", ["train", "demo"])
def test_cli_refuses_an_unknown_device(command, capsys):
    assert cli.main([command, "--dataset", "synthetic", "--device", "gpu", "--quiet"]) == 2
    assert "unknown device 'gpu'" in capsys.readouterr().err


def test_cli_demo_and_bench_refuse_cuda_without_it(no_cuda, tmp_path, capsys):
    assert cli.main(["demo", "--dataset", "synthetic", "--device", "cuda:0", "--quiet"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    argv = ["bench", "layer", "--dataset", "synthetic", "--device", "cuda", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    assert "CUDA is not available" in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_cli_cuda_with_a_hosted_engine_is_refused(two_gpus, capsys):
    argv = ["train", "--dataset", "synthetic", "--device", "cuda", "--engine", "process", "--quiet"]
    assert cli.main(argv) == 2
    assert "--engine process hosts them elsewhere" in capsys.readouterr().err


def test_cli_train_on_cpu_and_auto(no_cuda, tmp_path):
    import json

    for spec in ("cpu", "auto"):
        out = tmp_path / f"{spec}.json"
        argv = ["train", "--dataset", "synthetic", "--clients", "2", "--rounds", "2", "--quiet"]
        assert cli.main([*argv, "--device", spec, "--json", str(out)]) == 0
        data = json.loads(out.read_text())
        assert data["device"] == spec and 0 <= data["test_accuracy_mean"] <= 1


# ------------------------------------------------------------------------------------ on a GPU
@cuda
@needs_cuda
@pytest.mark.parametrize("variant", ["vector", "matrix"])
def test_cuda_layer_matches_cpu(graph, variant):
    enc = _encodings(graph, variant)
    torch.manual_seed(0)
    layer = FedGATConv(graph.num_features, 4, heads=2)
    want = layer(enc)
    want.square().sum().backward()
    grad = layer.lin.weight.grad.clone()
    layer.zero_grad()
    gpu_enc = enc.to("cuda")
    layer.cuda()
    got = layer(gpu_enc)
    assert got.device.type == "cuda"
    got.square().sum().backward()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(layer.lin.weight.grad.cpu(), grad, rtol=1e-3, atol=1e-5)
    # the plan of the CPU encodings and that of the CUDA ones are separate entries
    devices = {k[2].type for k in _PLANS if k[0] in (id(enc), id(gpu_enc))}
    assert variant == "matrix" or devices == {"cpu", "cuda"}


@cuda
@needs_cuda
@pytest.mark.parametrize("variant", ["vector", "matrix"])
def test_cuda_encodings_move_everything(graph, variant):
    moved = _encodings(graph, variant).to("cuda")
    _touch_derived(moved)
    everything = _all_tensors(moved)
    assert everything and all(t.device.type == "cuda" for t in everything)
    assert moved.to("cuda") is moved and moved.to(torch.device("cuda", 0)) is moved


def _servers(graph, device, strategy="fedadam", cuda_graphs=False, mu=0.0):
    hp = resolve_hparams("fedgat", {"dropout": 0.0, "feature_dropout": 0.0, "strategy": strategy, "mu": mu})
    fed = build_federation("fedgat", graph, 3, 1.0, 0, dropout=0.0, feature_dropout=0.0)
    torch.manual_seed(0)
    model = fed.model_fn()
    strategy = strategy_from_hparams(hp, model)
    members = [
        Client.from_hparams(
            i, fed.model_fn(), t, e, hp, strategy=strategy.client, device=device, cuda_graphs=cuda_graphs
        )
        for i, (t, e) in enumerate(fed.tasks)
    ]
    return Server(members, model.state_dict(), strategy.server)


@cuda
@needs_cuda
@pytest.mark.parametrize("strategy", ["fedadam", "fedavg"])
def test_cuda_training_follows_the_cpu_trajectory(graph, strategy):
    cpu, gpu = _servers(graph, "cpu", strategy), _servers(graph, "cuda", strategy)
    member = gpu.clients[0]
    assert all(p.device.type == "cuda" for p in member.model.parameters())
    assert member.train_task.targets["train"][0].device.type == "cuda"
    for _ in range(5):
        want, got = cpu.train_round(), gpu.train_round()
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-4, abs=1e-6)
    # the server's weights stay on the CPU; the optimiser's state lives with the model (FedAdam's
    # clients take plain SGD steps and keep none; FedAvg's keep Adam's moments)
    assert all(v.device.type == "cpu" for v in gpu.state.values())
    for key, value in cpu.state.items():
        torch.testing.assert_close(gpu.state[key], value, rtol=1e-3, atol=1e-5)
    moments = [s for s in member.optimizer.state.values() if s]
    assert bool(moments) == (strategy == "fedavg")
    assert all(
        t.device.type == "cuda" for s in moments for k, t in s.items() if k != "step" and torch.is_tensor(t)
    )
    update = member.fit(gpu.state)
    assert all(v.device.type == "cpu" for v in update.state.values())
    assert gpu.evaluate()["val_accuracy"] == pytest.approx(cpu.evaluate()["val_accuracy"], abs=0.05)


@cuda
@needs_cuda
def test_cli_train_on_cuda(tmp_path):
    import json

    out = tmp_path / "run.json"
    argv = ["train", "--dataset", "synthetic", "--clients", "2", "--rounds", "2", "--quiet"]
    assert cli.main([*argv, "--device", "cuda", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["device"] == "cuda"
    assert cli.main([*argv, "--rounds", "5", "--device", "cuda", "--cuda-graphs", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["device"] == "cuda"


@cuda
@needs_cuda
def test_cli_demo_trains_captured_on_cuda(tmp_path):
    """``fedgat demo --device cuda --cuda-graphs``: the encrypted round on the CPU, the protocol's
    rounds with every client's step captured on the GPU."""
    import json

    out = tmp_path / "demo.json"
    argv = ["demo", "--dataset", "synthetic", "--nodes", "120", "--clients", "2", "--rounds", "4", "--quiet"]
    assert cli.main([*argv, "--device", "cuda", "--cuda-graphs", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["training_device"].startswith("cuda")


@cuda
@needs_cuda
@pytest.mark.parametrize(("strategy", "mu"), [("fedadam", 0.0), ("fedavg", 0.0), ("fedavg", 0.5)])
def test_cuda_graphs_follow_the_eager_trajectory(graph, strategy, mu):
    """Clients whose local step is a captured CUDA graph train as eager clients do (dropout off, so
    both draw no random numbers): 3 eager warm-up rounds, the capture, then replays; FedProx's anchor
    is read from its fixed buffers at each replay."""
    eager = _servers(graph, "cuda", strategy, mu=mu)
    graphed = _servers(graph, "cuda", strategy, cuda_graphs=True, mu=mu)
    for _ in range(8):
        want, got = eager.train_round(), graphed.train_round()
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-4, abs=1e-6)
    steps = [c._graphed for c in graphed.clients if c.num_train]
    assert steps and all(
        s is not None and s.captured and s.eager_steps == 3 and s.replays == 5 for s in steps
    )
    for key, value in eager.state.items():
        torch.testing.assert_close(graphed.state[key], value, rtol=1e-3, atol=1e-5)
