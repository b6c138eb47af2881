"""fedgat.allocator: with freed memory kept, a block ``malloc`` gives again after a block of its size was
freed touches no new page; without (``FEDGAT_KEEP_FREED_MEMORY=0``), glibc unmaps it on ``free`` and every
page is faulted in again. Each case runs in a fresh interpreter: the setting is process-wide. (Training's
gain, which this makes possible, is measured in ``benchmarks/results/graph_scale_vm_allocator*.md``.)"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

_PROBE = """
import ctypes, resource
from fedgat.allocator import keep_freed_memory
applied = keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
n = 64_000_000
block = libc.malloc(n); ctypes.memset(block, 1, n); libc.free(block)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = libc.malloc(n); ctypes.memset(block, 2, n)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, n // 4096)
"""


def _probe(keep: str) -> tuple[bool, int, int]:
    env = {**os.environ, "FEDGAT_KEEP_FREED_MEMORY": keep}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True, env=env
    ).stdout.split()
    return out[0] == "True", int(out[1]), int(out[2])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc")
def test_a_block_allocated_again_reuses_the_freed_pages():
    applied, faults, pages = _probe("1")
    assert applied and faults < pages // 512
    # unmapped and faulted in again: a fault per 4 KiB page, or per 2 MiB with transparent huge pages
    applied, faults, pages = _probe("0")
    assert not applied and faults >= pages // 512


def test_the_command_line_keeps_freed_memory():
    code = (
        "from fedgat import allocator, cli\n"
        "cli.main(['train', '--dataset', 'synthetic', '--method', 'gcn', '--rounds', '1', '--quiet'])\n"
        "print(allocator._applied)\n"
    )
    env = {**os.environ, "FEDGAT_KEEP_FREED_MEMORY": "1"}
    run = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    assert run.stdout.strip().splitlines()[-1] == str(GLIBC)
