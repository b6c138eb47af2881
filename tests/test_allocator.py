"""fedgat.allocator: with freed memory kept, a tensor allocated again after one of its size was freed
touches no new page; without (``FEDGAT_KEEP_FREED_MEMORY=0``), every page is faulted in again. Each case
runs in a fresh interpreter: the setting is process-wide."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROBE = """
import resource, torch
from fedgat.allocator import keep_freed_memory
applied = keep_freed_memory()
n = 64_000_000 // 4
x = torch.empty(n); x.fill_(1.0); del x
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
x = torch.empty(n); x.fill_(2.0)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, n * 4 // 4096)
"""


def _probe(env: dict[str, str]) -> tuple[bool, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True, env={**os.environ, **env}
    ).stdout.split()
    return out[0] == "True", int(out[1]), int(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_tensor_allocated_again_reuses_the_freed_pages():
    applied, faults, pages = _probe({})
    assert applied and faults < pages // 20
    applied, faults, pages = _probe({"FEDGAT_KEEP_FREED_MEMORY": "0"})
    assert not applied and faults > pages * 9 // 10


def test_the_command_line_keeps_freed_memory():
    code = (
        "from fedgat import allocator, cli\n"
        "cli.main(['train', '--dataset', 'synthetic', '--method', 'gcn', '--rounds', '1', '--quiet'])\n"
        "print(allocator._applied)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert run.stdout.strip().splitlines()[-1] == str(sys.platform.startswith("linux"))
