"""``--engine``, ``--address`` and ``--actors``, shared by ``fedgat demo`` and ``fedgat train`` (kept
outside :mod:`fedgat.commands`, whose every module is a subcommand)."""

from __future__ import annotations

import argparse

ENGINE_CHOICES = ("inprocess", "ray")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """``--engine``, ``--address``, ``--actors`` (shared with ``fedgat train``)."""
    parser.add_argument(
        "--engine",
        default="inprocess",
        choices=ENGINE_CHOICES,
        help="where the parties run: inprocess (default) or ray (clients in Ray actors, the "
        'server\'s homomorphic work as Ray tasks; pip install "fedgat[ray]")',
    )
    parser.add_argument(
        "--address",
        default=None,
        help="ray: an existing cluster (e.g. auto, or head-ip:6379; default: start a local Ray)",
    )
    parser.add_argument(
        "--actors",
        type=int,
        default=None,
        help="ray: actors hosting the clients (default min(cluster CPUs, clients))",
    )


def open_engine(args: argparse.Namespace, command: str):
    """The :class:`~fedgat.protocols.ray_engine.RayEngine` of ``--engine ray`` (None for inprocess).

    Raises:
        SystemExit: Ray is missing, or ``--address``/``--actors`` without ``--engine ray``.
    """
    if args.engine != "ray":
        if args.address is not None or args.actors is not None:
            raise SystemExit(f"fedgat {command}: --address and --actors need --engine ray")
        return None
    if args.actors is not None and args.actors < 1:
        raise SystemExit(f"fedgat {command}: --actors must be >= 1")
    from fedgat.protocols.ray_engine import RayEngine, RayUnavailableError

    try:
        return RayEngine(args.actors, address=args.address, threads=args.threads)
    except RayUnavailableError as exc:
        raise SystemExit(f"fedgat {command}: {exc}") from None
