"""One training step captured as a CUDA graph and replayed: the remedy for an epoch bound by launches.

A full-batch epoch of FedGAT on Cora asks a GPU for ~230 kernels that together keep it busy ~2 ms, but
dispatching them from Python takes ~6 ms (``benchmarks/results/gpu_profile_h200_vector.md``): the epoch
is bound by the host, not by the GPU. :class:`GraphedStep` records one step (loss, backward, optimiser
step) once and then launches it as a single graph, the whole-network capture of PyTorch's CUDA graphs
guide (https://pytorch.org/docs/stable/notes/cuda.html#whole-network-capture).

What capture asks of a step, and what this module does about it:

- every tensor the step reads is the same storage at every replay: parameters are updated in place
  (``load_state_dict`` copies into them), and anything else that changes between steps (a proximal
  anchor, say) is copied into a fixed buffer by the caller;
- no host synchronisation inside the step (``.item()``, boolean-mask indexing, ``nonzero``): index
  with integer tensors (``index_select``);
- an optimiser whose step counter lives on the device: :func:`capturable` says whether one is, and
  Adam must be built with ``capturable=True``;
- random numbers (dropout) come from the device's default generator, which advances its offset at
  every replay: each replay draws new masks, as eager steps do (not the same masks as an eager run).

The first ``warmup`` calls run eagerly on a side stream (as capture requires: lazy initialisation,
cuBLAS/cuSPARSE workspaces, caches keyed by the inputs); they are real steps. The next call captures
the step and replays it; from then on each call is one replay.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: eager steps before capture, by default
WARMUP_STEPS = 3

#: A step's losses: the tensor to differentiate and the one to report (often the same tensor).
StepLosses = tuple[torch.Tensor, torch.Tensor]


class GraphCaptureError(RuntimeError):
    """A step could not be captured as a CUDA graph (an operation that synchronises with the host,
    or one that CUDA cannot record); the message names the cause."""


def check_device(device: torch.device) -> None:
    """``ValueError`` unless ``device`` is a CUDA device: a CUDA graph captures CUDA work only (what
    every ``cuda_graphs=True`` entry point checks before it sets anything up)."""
    if device.type != "cuda":
        raise ValueError(f"cuda_graphs needs a CUDA device, not {device}")


def capturable(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` can run inside a CUDA graph: SGD always; Adam, AdamW and the others
    that keep a step counter only when built with ``capturable=True``."""
    if isinstance(optimizer, torch.optim.SGD):
        return True
    return all(bool(group.get("capturable", False)) for group in optimizer.param_groups)


class GraphedStep:
    """A training step that runs eagerly ``warmup`` times, then as one captured CUDA graph.

    Args:
        losses: computes the step's losses from fixed inputs: ``(objective, report)``; ``objective``
            is differentiated, ``report`` (a detached copy) is returned by each call.
        optimizer: steps the parameters from their gradients; must be :func:`capturable`.
        warmup: eager steps before capture (at least 1; PyTorch's guide uses 3 for DDP, 1 suffices
            elsewhere, a few make the caches of the first step certain).

    Calling it performs one step and returns the reported loss as a device tensor (reading it is a
    host synchronisation; do it once per round, not per step).

    Raises:
        ValueError: ``optimizer`` is not capturable, or ``warmup < 1``.
        GraphCaptureError: capture failed (on the call that captures; nothing was stepped by it).
    """

    def __init__(
        self,
        losses: Callable[[], StepLosses],
        optimizer: torch.optim.Optimizer,
        *,
        warmup: int = WARMUP_STEPS,
    ) -> None:
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1, got {warmup}")
        if not capturable(optimizer):
            raise ValueError(
                f"{type(optimizer).__name__} keeps its step count on the host: build it with capturable=True "
                "to run it inside a CUDA graph"
            )
        self.losses = losses
        self.optimizer = optimizer
        self.warmup = int(warmup)
        self.eager_steps = 0
        self.replays = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._report: torch.Tensor | None = None
        self._stream: torch.cuda.Stream | None = None

    @property
    def captured(self) -> bool:
        """Whether the step has been captured (every later call is one replay)."""
        return self._graph is not None

    def _eager(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        objective, report = self.losses()
        objective.backward()
        self.optimizer.step()
        return report.detach()

    def __call__(self) -> torch.Tensor:
        if self._graph is None and self.eager_steps < self.warmup:
            # warm-up runs on a side stream, as capture needs (the caching allocator and the
            # libraries' workspaces then belong to a stream that is not the capturing one)
            if self._stream is None:
                self._stream = torch.cuda.Stream()
            current = torch.cuda.current_stream()
            self._stream.wait_stream(current)
            with torch.cuda.stream(self._stream):
                report = self._eager()
            current.wait_stream(self._stream)
            self.eager_steps += 1
            return report
        if self._graph is None:
            self._capture()
        assert self._graph is not None and self._report is not None
        self._graph.replay()
        self.replays += 1
        return self._report.detach().clone()

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)  # the graph's backward allocates the gradients
        try:
            with torch.cuda.graph(graph):
                objective, report = self.losses()
                objective.backward()
                self.optimizer.step()
        except RuntimeError as exc:
            raise GraphCaptureError(
                f"the training step could not be captured as a CUDA graph: {exc}"
            ) from exc
        self._graph, self._report = graph, report
