"""``fedgat bench``: benchmarks from the repository's ``benchmarks/`` folder.

    fedgat bench overhead                                   # Cora, 10 clients, vector: encrypted vs plaintext
    fedgat bench overhead --dataset citeseer --clients 5 --json out.json
    fedgat bench overhead --sweep --datasets cora citeseer --client-counts 2 5 10

``overhead`` runs the pre-training round plaintext and encrypted on the same partition and bases and
reports per phase wall/CPU seconds, memory, bytes, ciphertexts, slot use, the numerical error, the
accuracy reached by training on each and the server's op-count lower bound
(``benchmarks/overhead.py``; writes JSON, Markdown and a PNG into ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType

NAME = "bench"
HELP = "benchmarks: 'overhead' (encrypted vs plaintext pre-training)"

#: the repository's benchmarks folder (the command needs a source checkout)
BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """The module ``benchmarks/<name>.py`` of the source checkout (notebooks call its functions).

    Raises:
        SystemExit: no such file (``fedgat bench`` needs a source checkout).
    """
    path = BENCHMARKS / f"{name}.py"
    if not path.is_file():
        raise SystemExit(f"fedgat bench: {path} not found (fedgat bench needs a source checkout)")
    spec = importlib.util.spec_from_file_location(f"fedgat_benchmarks_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _configure_overhead(parser: argparse.ArgumentParser) -> None:
    # mirrors benchmarks/overhead.py's add_arguments without importing it (``fedgat --help`` stays quick)
    parser.add_argument("--dataset", default="cora", choices=("cora", "citeseer", "pubmed", "synthetic"))
    parser.add_argument("--nodes", type=int, default=None, help="synthetic only: nodes (default 200)")
    parser.add_argument("--clients", type=int, default=10, help="clients (default 10)")
    parser.add_argument("--variant", default="vector", choices=("vector", "matrix"))
    parser.add_argument("--neighbour-cap", type=int, default=None)
    parser.add_argument("--preset", default="n4096", choices=("n4096", "n8192", "n8192-small", "n16384"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=None, help="server processes (default: every core)")
    parser.add_argument("--no-train", dest="train", action="store_false", help="skip the accuracy comparison")
    parser.add_argument("--rounds", type=int, default=None, help="FedAvg rounds of the accuracy comparison")
    parser.add_argument(
        "--matrix-estimate",
        action="store_true",
        help="add the matrix variant's estimate (neighbour cap 16) for the same setting",
    )
    parser.add_argument(
        "--sweep", action="store_true", help="sweep --datasets x --client-counts (no training)"
    )
    parser.add_argument("--datasets", nargs="+", default=["cora", "citeseer"])
    parser.add_argument("--client-counts", nargs="+", type=int, default=[2, 5, 10])
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    parser.add_argument(
        "--out",
        type=Path,
        default=BENCHMARKS / "results",
        help="folder for overhead.{json,md,png} (default benchmarks/results)",
    )
    parser.add_argument("--progress", action="store_true", help="progress bars")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="an earlier overhead JSON to show before/after (e.g. one taken before a protocol change)",
    )
    parser.add_argument("--baseline-label", default="baseline", help="what the baseline was")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    _configure_overhead(
        sub.add_parser(
            "overhead",
            help="encrypted vs plaintext pre-training round",
            description="encrypted vs plaintext pre-training round",
        )
    )


def run(args: argparse.Namespace) -> int:
    if args.clients < 1 or (args.nodes is not None and args.nodes < 40):
        raise SystemExit("fedgat bench overhead: --clients must be >= 1 and --nodes >= 40")
    return int(load_benchmark(args.benchmark).main_args(args) or 0)
