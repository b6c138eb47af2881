"""Where training runs: ``cpu``, ``cuda`` (``cuda:N``) or ``auto``, and moving a client's data there.

:func:`resolve_device` turns what a user typed (``--device``) into a :class:`torch.device` and fails
with a typed error before any work: :class:`DeviceError` for a string that names no device fedgat
trains on, :class:`DeviceUnavailableError` when CUDA is asked for and this machine has none (or not
that many GPUs). ``auto`` is the first CUDA device when one is available, else the CPU.

What lives on the device during training: the model (parameters and buffers), its optimiser's state,
the client's inputs -- :class:`~fedgat.encodings.Encodings` through :meth:`Encodings.to
<fedgat.encodings.Encodings.to>`, edge indices, labels and target rows (:func:`to_device`). What does
not: the global weights the server keeps, aggregates (FedAvg, secure aggregation, DP-FedAvg) and
checkpoints -- they are CPU tensors, and a client's weights cross to the CPU once per round, at the
protocol boundary (:meth:`fedgat.federated.Client.fit`). The encrypted pre-training round (TenSEAL)
runs on the CPU whatever the device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "DEVICE_CHOICES",
    "DeviceError",
    "DeviceUnavailableError",
    "describe_device",
    "resolve_device",
    "synchronize",
    "to_device",
]

#: what ``--device`` takes besides ``cuda:N``
DEVICE_CHOICES = ("cpu", "cuda", "auto")
_CUDA_INDEX = re.compile(r"cuda:(\d+)")


class DeviceError(ValueError):
    """A device fedgat cannot train on: a string that is not ``cpu``, ``cuda``, ``cuda:N`` or ``auto``."""


class DeviceUnavailableError(DeviceError):
    """CUDA was asked for and this machine has no CUDA device (or no device of that index)."""


def resolve_device(spec: str | torch.device | None = "cpu") -> torch.device:
    """The :class:`torch.device` for ``spec``: ``"cpu"`` (also None), ``"cuda"`` (the current CUDA
    device, with its index), ``"cuda:N"``, ``"auto"`` (CUDA when available, else CPU), or a
    ``torch.device`` of type cpu or cuda (checked the same way).

    Raises:
        DeviceError: any other string or device type (``"gpu"``, ``"mps"``, ``"cuda:x"``, ...).
        DeviceUnavailableError: CUDA asked for (``cuda``, ``cuda:N``) without CUDA, or ``N`` beyond the
            GPUs this machine has.
    """
    if spec is None:
        return torch.device("cpu")
    text = str(spec).strip().lower()
    if text == "cpu":
        return torch.device("cpu")
    if text == "auto":
        return _cuda(None) if torch.cuda.is_available() else torch.device("cpu")
    if text == "cuda":
        return _cuda(None)
    match = _CUDA_INDEX.fullmatch(text)
    if match:
        return _cuda(int(match.group(1)))
    raise DeviceError(f"unknown device {str(spec)!r}; choose cpu, cuda, cuda:N or auto")


def _cuda(index: int | None) -> torch.device:
    if not torch.cuda.is_available():
        asked = "cuda" if index is None else f"cuda:{index}"
        raise DeviceUnavailableError(
            f"device {asked} asked for, but CUDA is not available here (torch {torch.__version__}, "
            "built with CUDA " + (torch.version.cuda or "none") + "); use --device cpu or auto"
        )
    count = torch.cuda.device_count()
    if index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if index >= count:
        raise DeviceUnavailableError(f"device cuda:{index} asked for, but this machine has {count} GPU(s)")
    return torch.device("cuda", index)


def describe_device(device: torch.device | str) -> str:
    """``"cpu"``, or ``"cuda:0 (NVIDIA H100 80GB HBM3)"``: the device and, for CUDA, its name."""
    device = torch.device(device)
    if device.type != "cuda":
        return str(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on ``device`` (CUDA kernels run asynchronously; a timer must wait for
    them); nothing on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(value: Any, device: torch.device | str, memo: dict[int, Any] | None = None) -> Any:
    """``value`` with every tensor moved to ``device``: tensors (``Tensor.to``), objects with a
    ``to(device)`` that returns the moved object (:class:`~fedgat.encodings.Encodings`), tuples,
    lists and mappings of them (rebuilt); anything else (numpy arrays, numbers, strings) unchanged.

    ``memo`` (object id -> moved object) makes an object reached twice move once, so that two tasks
    sharing their inputs still share them on the device.
    """
    memo = {} if memo is None else memo
    key = id(value)
    if key in memo:
        return memo[key]
    if isinstance(value, torch.Tensor):
        out: Any = value.to(device)
    elif isinstance(value, tuple):
        out = tuple(to_device(v, device, memo) for v in value)
    elif isinstance(value, list):
        out = [to_device(v, device, memo) for v in value]
    elif isinstance(value, Mapping):
        out = {k: to_device(v, device, memo) for k, v in value.items()}
    elif callable(getattr(value, "to", None)) and not isinstance(value, torch.nn.Module):
        out = value.to(device)
    else:
        out = value
    memo[key] = out
    return out
