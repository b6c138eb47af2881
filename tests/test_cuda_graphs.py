"""``fedgat.cuda_graphs``: what a captured step refuses, and (on a GPU) that replays step as eager
steps do. Capture itself needs CUDA; the ``cuda``-marked tests are skipped without it (CI is CPU-only)."""

from __future__ import annotations

import pytest
import torch

from fedgat.cuda_graphs import GraphedStep, capturable
from fedgat.federated import Client, LocalTask
from fedgat.strategies import ClientStrategy

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _params() -> list[torch.Tensor]:
    return [torch.nn.Parameter(torch.zeros(3))]


def test_capturable_optimisers():
    assert capturable(torch.optim.SGD(_params(), lr=0.1))
    assert not capturable(torch.optim.Adam(_params()))
    assert capturable(torch.optim.Adam(_params(), capturable=True))
    assert not capturable(torch.optim.AdamW(_params()))


def test_graphed_step_refuses_what_cannot_be_captured():
    def losses():
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="capturable=True"):
        GraphedStep(losses, torch.optim.Adam(_params()))
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        GraphedStep(losses, torch.optim.SGD(_params(), lr=0.1), warmup=0)


def test_client_strategy_builds_a_capturable_adam_on_request():
    strategy = ClientStrategy()
    assert not capturable(strategy.make_optimizer(_params(), 0.01, 0.0))
    assert capturable(strategy.make_optimizer(_params(), 0.01, 5e-4, capturable=True))


def test_client_cuda_graphs_need_a_cuda_device():
    model = torch.nn.Linear(2, 2)
    task = LocalTask((torch.zeros(1, 2),), {"train": (torch.zeros(1, dtype=torch.long),) * 2})
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device"):
        Client(0, model, task, task, cuda_graphs=True)


def test_train_speed_refuses_cuda_graphs_on_the_cpu():
    from fedgat.benchmarks import train_speed

    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device"):
        train_speed.run("synthetic", cuda_graphs=True)


@pytest.mark.cuda
@needs_cuda
def test_replays_step_as_eager_steps_do():
    """Two copies of one model, one stepped eagerly, one by a GraphedStep (warm-up, capture, replays):
    after every step their losses and weights agree, and the replays really run (weights move)."""
    torch.manual_seed(0)
    x = torch.randn(64, 16, device="cuda")
    y = torch.randint(0, 4, (64,), device="cuda")
    rows = torch.arange(0, 64, 2, device="cuda")

    def make():
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ELU(), torch.nn.Linear(32, 4)).cuda()
        return model, torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4, capturable=True)

    eager_model, eager_opt = make()
    model, opt = make()

    def losses():
        loss = torch.nn.functional.cross_entropy(model(x).index_select(0, rows), y.index_select(0, rows))
        return loss, loss

    step = GraphedStep(losses, opt, warmup=2)
    start = [p.detach().clone() for p in model.parameters()]
    for i in range(6):
        eager_opt.zero_grad()
        want = torch.nn.functional.cross_entropy(
            eager_model(x).index_select(0, rows), y.index_select(0, rows)
        )
        want.backward()
        eager_opt.step()
        got = step()
        assert step.captured == (i >= 2)
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
    assert step.replays == 4
    for p, q, p0 in zip(model.parameters(), eager_model.parameters(), start, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
        assert not torch.equal(p, p0)
