"""Keep freed memory in the process for reuse: glibc's ``malloc`` tuned for training's large tensors.

glibc serves a request above its mmap threshold (at most 32 MiB unless set) with a fresh ``mmap`` and
returns it to the kernel on ``free``, and trims the heap's free top back to the kernel too. A training
step allocates and frees the same tensors of hundreds of MB again and again (at 40k nodes a layer's
``V W^T`` alone is ~300 MB), so each step touched much of that memory for the first time again: a page
fault per 4 KiB page, and the kernel zeroes it (kept, a freed block is reused where the next request
fits it; torch's aligned requests do not always, so about half of those faults remained). On the development VM, where a first touch costs far more
than a rewrite once the process holds ~7.5 GiB (``benchmarks/graph_scale.py``'s probe), 3 FedAvg rounds
at 80k nodes took 19.1 s with 9.6 GiB of new pages while the pre-training's encodings were still held
(as ``fedgat demo`` holds them) and 13.6 s with 4.5 GiB once freed memory stayed; with them freed
first, 14.0 and 12.5 s (the runs overlap); at 10k-40k nodes within the VM's noise (same peak RSS and
model throughout:
``benchmarks/results/graph_scale_vm_allocator*.md``, ``benchmarks/PERFORMANCE.md``).

:func:`keep_freed_memory` raises the mmap threshold (to 1 GiB) and the trim threshold (to 2 GiB):
allocations come from the heap and freed ones stay there for the next step. Both settings are needed
(either alone changed nothing here). The cost: a process's resident memory does not shrink back after
its peak. It is process-wide, so the library never calls it on import; ``fedgat``'s command line, its
process workers and Ray actors do, and a script may (``FEDGAT_KEEP_FREED_MEMORY=0`` turns it off; for
the actors of a Ray cluster joined with ``--address``, set it in their ``runtime_env``). Elsewhere than
glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["ENV", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

#: set to ``0`` to leave the allocator as it is
ENV = "FEDGAT_KEEP_FREED_MEMORY"
#: requests up to this size come from the heap (the main thread's; another thread's pool stays capped
#: at 64 MiB and maps larger requests still)
MMAP_THRESHOLD = 1 << 30
#: free memory at the heap's top is returned to the kernel only beyond this (the largest ``int``)
TRIM_THRESHOLD = (1 << 31) - 1
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Tune glibc's ``malloc`` to keep freed memory (module docstring), once per process. Returns
    whether it is in effect: False when ``FEDGAT_KEEP_FREED_MEMORY=0``, off Linux, or where ``mallopt``
    refuses the settings (a C library other than glibc)."""
    global _applied
    if _applied is None:
        _applied = os.environ.get(ENV, "1").strip() != "0" and sys.platform.startswith("linux") and _mallopt()
    return _applied


def _mallopt() -> bool:
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # the mmap threshold first: a trim threshold alone made glibc return more pages, not fewer
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
