"""The ``fedgat`` command line: ``fedgat <command> [options]``.

Every module in :mod:`fedgat.commands` that defines

* ``NAME``: the sub-command's name,
* ``HELP``: one line for ``fedgat --help``,
* ``configure(parser)``: adds its arguments to an ``argparse`` sub-parser,
* ``run(args) -> int``: does the work and returns the exit status,

is a sub-command; :data:`COMMANDS` maps names to those modules. Adding a command means adding a
module, nothing here. Command modules import heavy dependencies (torch, ...) inside ``run`` so that
``fedgat --help`` stays quick.

Errors (one path for every command, :mod:`fedgat.cli_engine`): a bad argument is reported in one line
on stderr, ``fedgat <command>: error: <message>``, with exit status 2 (argparse's errors and
:class:`~fedgat.cli_engine.UsageError`, raised by the checks every command runs before any work);
fedgat's typed errors raised while a command runs (a malformed graph or owners file, a missing
dataset, a refused ciphertext: :func:`~fedgat.cli_engine.runtime_errors`) in the same form with exit
status 1. ``--debug`` shows their tracebacks instead; any other exception is a bug and keeps its
traceback. Ctrl-C and ``kill`` (SIGTERM) stop a command the same way: its clean-up runs (temporary
folders, spools and worker pools are removed) and one line says so, with exit status 130 or 143.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pkgutil
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from types import ModuleType

from fedgat import __version__, commands
from fedgat.cli_engine import ArgumentParser, UsageError, add_debug_argument, runtime_errors

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
    """The ``fedgat`` parser: one sub-parser per command, each with ``--debug``; every parser reports
    its errors in one line (:class:`fedgat.cli_engine.ArgumentParser`)."""
    parser = ArgumentParser(
        prog="fedgat", description="Federated graph attention networks (FedGAT, AAAI 2025) and baselines."
    )
    parser.add_argument("--version", action="version", version=f"fedgat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        command.set_defaults(prog=command.prog)
        module.configure(command)
        add_debug_argument(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the chosen command and return its exit status:
    0 on success, 2 for a bad argument, 1 for one of fedgat's typed errors (module docstring)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # only benchmarks with their own parser take options fedgat does not know
        if not getattr(args, "passthrough", False):
            prog = getattr(args, "prog", parser.prog)
            parser.exit(2, f"{prog}: error: unrecognized arguments: {' '.join(extra)} (see {prog} --help)\n")
        args.extra = extra
    from fedgat.allocator import keep_freed_memory

    keep_freed_memory()  # training's large tensors reuse freed memory (FEDGAT_KEEP_FREED_MEMORY=0: off)
    try:
        with _terminate_as_interrupt():
            return int(COMMANDS[args.command].run(args) or 0)
    except KeyboardInterrupt as exc:
        if getattr(args, "debug", False):
            raise
        status, what = (143, "terminated") if isinstance(exc, Terminated) else (130, "interrupted")
        print(f"{getattr(args, 'prog', 'fedgat')}: {what}", file=sys.stderr)
        return status
    except UsageError as exc:
        return _report(args, exc, 2)
    except Exception as exc:
        if not isinstance(exc, runtime_errors()):
            raise
        return _report(args, exc, 1)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the command's process so that its clean-up runs as on Ctrl-C."""


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """While a command runs, SIGTERM raises :class:`Terminated` in this process (a forked worker that
    inherits the handler dies of the signal as before). Only the main thread may set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    me = os.getpid()

    def terminate(signum: int, frame: object) -> None:
        if os.getpid() != me:  # a forked child: the default action
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _report(args: argparse.Namespace, exc: Exception, status: int) -> int:
    if getattr(args, "debug", False):
        raise exc
    message = " ".join(str(exc).split()) or type(exc).__name__
    print(f"{getattr(args, 'prog', 'fedgat')}: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
