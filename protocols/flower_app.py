r"""FedGAT on Flower (1.41 Message API): the same sans-IO protocol, carried by Flower messages.

Who runs what:

* the **ServerApp** (:data:`serverapp`, launched by the SuperLink) hosts the fedgat *server* party
  (:class:`~fedgat.protocols.pretrain.ServerPretrain`, then :class:`~fedgat.protocols.fedavg.ServerRounds`)
  and drives it with the ordinary :class:`~fedgat.protocols.driver.Driver` over a
  :class:`FlowerServerTransport` (:mod:`~fedgat.protocols.flower_server`);
* each **ClientApp** instance (:data:`clientapp`, one per SuperNode) hosts one fedgat *client* party
  (:class:`~fedgat.protocols.pretrain.ClientPretrain`, then
  :class:`~fedgat.protocols.fedavg.ClientRounds`); its party id is the SuperNode's
  ``node_config["partition-id"]``, the number of clients ``num-partitions`` (or the run config's
  ``num-clients``) (:mod:`~fedgat.protocols.flower_client`).

Both sides assemble their parties with the factories of :mod:`fedgat.app`, from the graph and the
partition the run config names (:class:`FlowerRunConfig`, :mod:`~fedgat.protocols.flower_config`),
exactly as the in-process pipeline does.

Frames are the protocol's signed byte frames, unchanged. A Flower message carries, for one party,
every frame queued for it (an ``ArrayRecord`` of raw ``uint8`` arrays under ``"frames"``, so Flower
chunks big ones into 5 MB pieces) plus a small ``ConfigRecord`` (phase, set-up of a new phase,
status; :mod:`~fedgat.protocols.flower_wire`). Message types: ``query.fedgat_hello`` (identities),
``query.fedgat_pretrain`` (the encrypted pre-training round) and ``train.fedgat_rounds`` (FedAvg).
One Flower exchange (push to
every party with queued frames, pull their replies) happens whenever the server party is idle:
nothing queued locally and no streamed work (or more than ``flush-bytes`` queued). The client side
delivers the frames in order, runs its party until it has no streamed work left (e.g. encrypts and
uploads all its rows) and replies with every frame it produced. The protocol needs only per-pair
FIFO order, which this keeps. A node config's ``encrypt-workers`` (default 0) lets its client encrypt
those rows on that many processes of its own machine (:mod:`fedgat.crypto.encrypt_pool`; public keys
only; the frames are the same). The run config's ``upload-window`` (default 0: off) paces the
uploads recipient by recipient (:attr:`~fedgat.protocols.pretrain.PretrainConfig.upload_window`): the
server's set-up tells the nodes, whose clients then upload only what the server has granted.

FedAvg: the protocol's own ``GlobalModel`` and secure-aggregation frames (``LocalUpdate`` and
``EvaluationReport`` only with secure aggregation off), not Flower's ``FedAvg`` strategy.
The run config, hyper-parameters included, is the server operator's; what protects a client's
update is the client's to decide, in its node config (:func:`~fedgat.protocols.flower_client._training_policy`):
``secure-aggregation`` (``required``, the default, refuses a run that samples fewer clients per round
than the cohort minimum, whose updates would travel in the clear; ``allow-plaintext`` accepts it),
``min-cohort`` (default and least 3) and ``max-update-epsilon`` with ``max-update-delta`` (default
1e-5; when set, a run without DP-FedAvg, or whose DP-FedAvg the node computes to be less private at
its own delta, is refused), bounds on one run, and ``update-ledger`` with ``update-budget``
(:func:`~fedgat.protocols.flower_client._update_policy`: every run's DP-FedAvg releases charged to
a persistent ledger, so the runs a server starts add up to at most the budget); and what protects its rows from the pre-training's verdicts
(:func:`~fedgat.protocols.flower_client._verdict_policy`: ``max-verdict-epsilon``, a bound on
what one session's verdicts may cost a row, whatever preset the server's set-up chooses, and
``verdict-ledger`` with ``verdict-budget``, a persistent budget all sessions are charged to). A
refusal is a :class:`NodePolicyError` before the client uploads or trains (a red-team review found a run config of ``{"fraction": 0.5}`` turning secure
aggregation off at every client, 2026-11-27). One protocol end to end: signed updates bound to the session and the
pre-training's key set (:func:`~fedgat.protocols.messages.keyset_fingerprint`), the aggregation,
evaluation and early stopping of :meth:`fedgat.federated.Server.fit` (what
:func:`fedgat.pipeline.train_fedgat` runs in process), so both engines give the same model.

Client state: Flower 1.41 runs every message in a fresh ``flwr-clientapp`` process, so a party
cannot stay in memory. After each message the client's party is saved as a value
(:class:`~fedgat.protocols.party_state.PartyState`: plain fields and arrays in the checkpoint
format, no pickle; its own CKKS secret context and session keys, decrypted encodings, model and
optimiser included), sealed with an HMAC keyed from the party's own private key, into
``Context.state``, which the SuperNode keeps locally, or into a 0600 file under the node config's
``state-dir`` (:mod:`~fedgat.protocols.flower_state`); tampered, foreign or rolled-back state is
refused. The state holds the client's CKKS secret key and decrypted encodings (authenticated, not
encrypted): protect the SuperNode's database (``--database``) and ``state-dir`` like any key store.

Roster: the protocol assumes the roster (party id -> Ed25519 key) is pinned out of band. The server
pins the run config's ``roster`` (a JSON file, :func:`write_roster`); each client pins only the
file of its *own* node config's ``roster`` and never the run config's (the server operator sets the
run config: a client ignores its ``roster`` and logs so). Pinned parties refuse any other key; each
party then uses its own ``identity`` file (:func:`generate_identity`). Without a pin (local runs,
tests) each party makes fresh keys, the server collects them in the ``hello`` exchange and every
party logs the roster's fingerprint (:mod:`~fedgat.protocols.flower_roster`): *trust on first use*
through Flower's (TLS, node-authenticated) channel, where the SuperLink operator could substitute
keys. Either way a client keeps the first roster it accepts in its saved state for the rest of the
run and refuses any other one (:class:`RosterChangedError`). Use pinned rosters across
organisations.

Requires ``flwr`` (``pip install "fedgat[flower]"``); :mod:`fedgat` itself never imports it.

This module holds the apps (:data:`serverapp`, :data:`clientapp`), the key and roster command line
(``python -m fedgat.protocols.flower_app keygen|roster``) and the engine's public names.
"""

from __future__ import annotations

import argparse
import sys

from .flower_config import (
    FLOWER_HINT,
    FlowerEngineError,
    FlowerRunConfig,
    FlowerTimeoutError,
    FlowerUnavailableError,
    NodePolicyError,
    RemotePartyError,
    RosterChangedError,
    RosterMismatchError,
    load_graph,
    make_run_partition,
)

try:
    from flwr.app import Context
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise FlowerUnavailableError(f"{FLOWER_HINT} ({_exc})") from _exc

from .flower_client import handle_message
from .flower_roster import generate_identity, roster_fingerprint, write_roster
from .flower_server import FlowerRunResult, FlowerServerTransport, run_server
from .flower_state import load_encodings, save_encodings
from .flower_wire import HELLO, PRETRAIN, ROUNDS, frames_record, record_frames

__all__ = [
    "FLOWER_HINT",
    "HELLO",
    "PRETRAIN",
    "ROUNDS",
    "FlowerEngineError",
    "FlowerRunConfig",
    "FlowerRunResult",
    "FlowerServerTransport",
    "FlowerTimeoutError",
    "FlowerUnavailableError",
    "NodePolicyError",
    "RemotePartyError",
    "RosterChangedError",
    "RosterMismatchError",
    "clientapp",
    "frames_record",
    "generate_identity",
    "handle_message",
    "load_encodings",
    "load_graph",
    "main",
    "make_run_partition",
    "record_frames",
    "roster_fingerprint",
    "run_server",
    "save_encodings",
    "serverapp",
    "write_roster",
]


def _server_main(grid: Grid, context: Context) -> None:
    run_server(grid, FlowerRunConfig.from_run_config(context.run_config))


#: the Flower ServerApp (``[tool.flwr.app.components] serverapp``)
serverapp = ServerApp()
serverapp.main()(_server_main)

#: the Flower ClientApp (``[tool.flwr.app.components] clientapp``)
clientapp = ClientApp()
clientapp.query("fedgat_hello")(handle_message)
clientapp.query("fedgat_pretrain")(handle_message)
clientapp.train("fedgat_rounds")(handle_message)


def main(argv: list[str] | None = None) -> int:
    """``python -m fedgat.protocols.flower_app keygen|roster``: keys and the pinned roster."""
    parser = argparse.ArgumentParser(prog="python -m fedgat.protocols.flower_app", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    kg = sub.add_parser("keygen", help="write a party's private identity (JSON, 0600); print its public key")
    kg.add_argument("path")
    kg.add_argument(
        "--server",
        action="store_true",
        help="accepted for older scripts: every party's identity is one Ed25519 key",
    )
    ro = sub.add_parser("roster", help="write the roster JSON every party pins; print its fingerprint")
    ro.add_argument("path")
    ro.add_argument("--server", type=int, required=True, help="the server's party id (= number of clients)")
    ro.add_argument(
        "--key",
        action="append",
        required=True,
        metavar="ID=HEX",
        help="a party's Ed25519 public key (repeat for every client and the server)",
    )
    args = parser.parse_args(argv)
    if args.command == "keygen":
        print(generate_identity(args.path)["ed25519"])
    else:
        keys = {int(k): v for k, v in (item.split("=", 1) for item in args.key)}
        print(write_roster(args.path, server=args.server, signing_keys=keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
