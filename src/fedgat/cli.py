"""The ``fedgat`` command line: ``fedgat <command> [options]``.

Every module in :mod:`fedgat.commands` that defines

* ``NAME``: the sub-command's name,
* ``HELP``: one line for ``fedgat --help``,
* ``configure(parser)``: adds its arguments to an ``argparse`` sub-parser,
* ``run(args) -> int``: does the work and returns the exit status,

is a sub-command; :data:`COMMANDS` maps names to those modules. Adding a command means adding a
module, nothing here. Command modules import heavy dependencies (torch, ...) inside ``run`` so that
``fedgat --help`` stays quick.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

from fedgat import __version__, commands

_REQUIRED = ("NAME", "HELP", "configure", "run")


def discover_commands() -> dict[str, ModuleType]:
    """Import every module of :mod:`fedgat.commands` and index those that define a command.

    Raises:
        ValueError: two modules claim the same command name.
    """
    found: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        if not all(hasattr(module, attr) for attr in _REQUIRED):
            continue
        if module.NAME in found:
            raise ValueError(
                f"command {module.NAME!r} defined twice ({found[module.NAME].__name__}, {module.__name__})"
            )
        found[module.NAME] = module
    return found


COMMANDS: dict[str, ModuleType] = discover_commands()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedgat", description="Federated graph attention networks (FedGAT, AAAI 2025) and baselines."
    )
    parser.add_argument("--version", action="version", version=f"fedgat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        module.configure(sub.add_parser(name, help=module.HELP, description=module.HELP))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the chosen command; returns its status."""
    args = build_parser().parse_args(argv)
    return int(COMMANDS[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
