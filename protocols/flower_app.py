r"""FedGAT on Flower (1.41 Message API): the same sans-IO protocol, carried by Flower messages.

Who runs what:

* the **ServerApp** (:data:`serverapp`, launched by the SuperLink) hosts the fedgat *server* party
  (:class:`~fedgat.protocols.pretrain.ServerPretrain`, then :class:`~fedgat.protocols.fedavg.ServerRounds`)
  and drives it with the ordinary :class:`~fedgat.protocols.driver.Driver` over a
  :class:`FlowerServerTransport`;
* each **ClientApp** instance (:data:`clientapp`, one per SuperNode) hosts one fedgat *client* party
  (:class:`~fedgat.protocols.pretrain.ClientPretrain` / ``DealerSide``, then
  :class:`~fedgat.protocols.fedavg.ClientRounds`); its party id is the SuperNode's
  ``node_config["partition-id"]``, the number of clients ``num-partitions`` (or the run config's
  ``num-clients``).

Frames are the protocol's signed byte frames, unchanged. A Flower message carries, for one party,
every frame queued for it (an ``ArrayRecord`` of raw ``uint8`` arrays under ``"frames"``, so Flower
chunks big ones into 5 MB pieces) plus a small ``ConfigRecord`` (phase, set-up of a new phase,
status). Message types: ``query.fedgat_hello`` (identities), ``query.fedgat_pretrain`` (the
encrypted pre-training round) and ``train.fedgat_rounds`` (FedAvg). One Flower exchange (push to
every party with queued frames, pull their replies) happens whenever the server party is idle:
nothing queued locally and no streamed work (or more than ``flush-bytes`` queued). The client side
delivers the frames in order, runs its party until it has no streamed work left (e.g. encrypts and
uploads all its rows) and replies with every frame it produced. The protocol needs only per-pair
FIFO order, which this keeps.

FedAvg: the protocol's own ``GlobalModel``/``LocalUpdate``/``EvaluationReport`` frames, not Flower's
``FedAvg`` strategy. One protocol end to end: signed updates bound to the session and the CKKS key
fingerprint, the aggregation, evaluation and early stopping of :meth:`fedgat.federated.Server.fit`
(what :func:`fedgat.pipeline.train_fedgat` runs in process), so both engines give the same model.

Client state: Flower 1.41 runs every message in a fresh ``flwr-clientapp`` process, so a party
cannot stay in memory. After each message the client's parties (keys, CKKS secret context,
decrypted encodings, model and optimiser) are pickled into ``Context.state``, which the SuperNode
keeps locally ("will never leave the system it's running from"), or into a file under the node
config's ``state-dir``. Pickle is only ever read back from that local state, never from the network.
The state holds the party's private keys and the CKKS secret key: protect the SuperNode's database
(``--database``) and ``state-dir`` like any key store.

Roster: the protocol assumes the roster (party id -> Ed25519 key) is pinned out of band. With the run
config's ``roster`` (a JSON file, :func:`write_roster`), the server and every client holding the
same file (node config ``roster``) refuse any other key; each party then uses its own
``identity`` file (:func:`generate_identity`). Without it (local runs, tests) each party makes fresh
keys, the server collects them in the ``hello`` exchange and every party logs the roster's
fingerprint: *trust on first use* through Flower's (TLS, node-authenticated) channel, where the
SuperLink operator could substitute keys. Use pinned rosters across organisations.

Requires ``flwr`` (``pip install "fedgat[flower]"``); :mod:`fedgat` itself never imports it.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import os
import pickle
import secrets
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

FLOWER_HINT = 'the Flower engine needs flwr 1.41: pip install "fedgat[flower]"'


class FlowerUnavailableError(ImportError):
    """flwr is not installed (install the ``flower`` extra)."""


try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise FlowerUnavailableError(f"{FLOWER_HINT} ({_exc})") from _exc

from fedgat.approx import fit_score
from fedgat.crypto import KeyHolderContext, SigningIdentity, WrappingIdentity
from fedgat.encodings import BucketBases, EncodingBucket, Encodings
from fedgat.federated import Client, strategy_from_hparams
from fedgat.graph import Graph
from fedgat.methods import resolve_hparams
from fedgat.models import FedGAT
from fedgat.partition import Partition, make_partition
from fedgat.pipeline import COMPACT_TOLERANCE, _bases_rng, _owned_neighbourhoods, _split_tasks

from .driver import Driver
from .fedavg import ClientRounds, ServerRounds, state_to_arrays
from .messages import HEADER
from .party import Party
from .pretrain import ClientPretrain, DealerSide, PretrainConfig, ServerPretrain
from .roster import Identity, Roster
from .transport import Delivery, Transport

__all__ = [
    "FLOWER_HINT",
    "FlowerEngineError",
    "FlowerRunConfig",
    "FlowerServerTransport",
    "FlowerTimeoutError",
    "FlowerUnavailableError",
    "RemotePartyError",
    "RosterMismatchError",
    "clientapp",
    "generate_identity",
    "load_encodings",
    "load_graph",
    "roster_fingerprint",
    "save_encodings",
    "serverapp",
    "write_roster",
]

log = logging.getLogger("flwr").getChild("fedgat")  # Flower's handlers show it in the run's logs

HELLO = "query.fedgat_hello"
PRETRAIN = "query.fedgat_pretrain"
ROUNDS = "train.fedgat_rounds"
_META = "fedgat"
_FRAMES = "frames"
_STATE = "fedgat.state"
_FRAME_STYPE = "fedgat.frame"


# ============================================================================================ errors
class FlowerEngineError(RuntimeError):
    """Base class of the Flower engine's errors."""


class FlowerTimeoutError(FlowerEngineError):
    """Nodes did not connect, or replies did not arrive, within the configured time."""


class RemotePartyError(FlowerEngineError):
    """A ClientApp raised (Flower error reply) or its party aborted or ended in a wrong state."""


class RosterMismatchError(FlowerEngineError):
    """A key differs from the pinned roster, or the parties do not form a valid roster."""


# ============================================================================================ config
@dataclass(frozen=True)
class FlowerRunConfig:
    """The run config (``[tool.flwr.app.config]``, ``flwr run --run-config``), shared by all parties.

    Attributes:
        num_clients: clients (``partition-id`` 0..K-1); the server is party K.
        dataset: ``"synthetic"`` or a Planetoid name (``"cora"``...) read from ``data_dir``.
        data_dir: dataset root ("": ``$FEDGAT_DATA``, else the user cache).
        synthetic_nodes, synthetic_features, synthetic_classes, synthetic_train_per_class,
            synthetic_seed: the synthetic graph (:func:`fedgat.synthetic.synthetic_graph`; a fifth of
            the nodes validate, a quarter test).
        beta, seed: Dirichlet split and seed (the split of :func:`fedgat.pipeline.run_encrypted_fedgat`;
            the seed also seeds the initial model).
        variant, preset, chunks: encodings variant, CKKS preset, chunks per ciphertext (0: auto).
        bases_seed: seeds the server's bases (-1: CSPRNG; set only to compare with a plaintext twin
            or with the in-process engine).
        hparams: JSON object of FedGAT hyper-parameter overrides (:func:`fedgat.methods.default_hparams`).
        dealer: the client that generates the CKKS key.
        server_workers: processes for the server's homomorphic compute (0: in process).
        upload_batch: rows per FeatureUpload.
        round_timeout: seconds to wait for the replies of one exchange (and for nodes to connect).
        flush_bytes: send queued frames once this many bytes wait, even while the server computes.
        output_dir: where the server writes ``summary.json`` and the model ("": nowhere).
        roster: pinned roster JSON ("": trust on first use, see the module docstring).
        server_identity: the server's identity JSON ("": fresh keys).
    """

    num_clients: int = 2
    dataset: str = "synthetic"
    data_dir: str = ""
    synthetic_nodes: int = 200
    synthetic_features: int = 16
    synthetic_classes: int = 4
    synthetic_train_per_class: int = 10
    synthetic_seed: int = 0
    beta: float = 1.0
    seed: int = 0
    variant: str = "vector"
    preset: str = "n4096"
    chunks: int = 0
    bases_seed: int = -1
    hparams: str = "{}"
    dealer: int = 0
    server_workers: int = 0
    upload_batch: int = 32
    round_timeout: float = 600.0
    flush_bytes: int = 256 << 20
    output_dir: str = ""
    roster: str = ""
    server_identity: str = ""

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> FlowerRunConfig:
        """Read the kebab-case keys of a Flower run config; unknown keys are ignored."""
        kwargs = {}
        for name, default in cls.__dataclass_fields__.items():
            key = name.replace("_", "-")
            if key in run_config:
                kind = type(default.default)
                kwargs[name] = kind(run_config[key])
        return cls(**kwargs)

    def hyper(self) -> dict:
        """Resolved FedGAT hyper-parameters (:func:`fedgat.methods.resolve_hparams`)."""
        try:
            overrides = json.loads(self.hparams or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"run config hparams is not a JSON object: {exc}") from exc
        if not isinstance(overrides, dict):
            raise TypeError("run config hparams must be a JSON object")
        return resolve_hparams("fedgat", {"variant": self.variant, **overrides})


def load_graph(cfg: FlowerRunConfig) -> Graph:
    """The run's graph: synthetic, or a Planetoid dataset from ``data_dir`` / ``$FEDGAT_DATA``."""
    if cfg.dataset == "synthetic":
        from fedgat.synthetic import synthetic_graph

        n = cfg.synthetic_nodes
        return synthetic_graph(num_nodes=n, num_classes=cfg.synthetic_classes,
                               num_features=cfg.synthetic_features,
                               train_per_class=cfg.synthetic_train_per_class, num_val=n // 5,
                               num_test=n // 4, seed=cfg.synthetic_seed)
    from fedgat.data import load_dataset

    return load_dataset(cfg.dataset, cfg.data_dir or None)


def make_run_partition(graph: Graph, cfg: FlowerRunConfig) -> Partition:
    """The split :func:`fedgat.pipeline.run_encrypted_fedgat` uses for the same arguments."""
    hp = cfg.hyper()
    return make_partition(graph, cfg.num_clients, cfg.beta, cfg.seed, num_layers=2,
                          min_cross=hp["min_cross"], neighbour_cap=hp["neighbour_cap"])


def _model_fn(num_features: int, num_classes: int, hp: dict) -> Callable[[], torch.nn.Module]:
    """The model of :func:`fedgat.pipeline.train_fedgat`."""
    score = fit_score(hp["psi"], hp["degree"], hp["domain"], hp["fit"])

    def model_fn() -> torch.nn.Module:
        return FedGAT(num_features, num_classes, hidden=hp["hidden"], heads=hp["heads"],
                      dropout=hp["dropout"], feature_dropout=hp["feature_dropout"], score=score)

    return model_fn


# ================================================================================= roster, identities
def generate_identity(path: str | Path, *, client: bool = True) -> dict[str, str]:
    """Write fresh private keys (JSON, mode 0600) to ``path``; return the public keys (hex) to
    publish for the roster."""
    ident = Identity.generate(client=client)
    data = {"ed25519_private": ident.signer.private_bytes().hex()}
    if ident.wrapping is not None:
        data["x25519_private"] = ident.wrapping.private_bytes().hex()
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    return {"ed25519": ident.signer.public_bytes().hex()}


def _read_identity(path: str | Path, *, client: bool) -> Identity:
    data = json.loads(Path(path).read_text())
    signer = SigningIdentity.from_private_bytes(bytes.fromhex(data["ed25519_private"]))
    wrapping = WrappingIdentity.from_private_bytes(bytes.fromhex(data["x25519_private"])) if client else None
    return Identity(signer, wrapping)


def write_roster(path: str | Path, *, server: int, dealer: int, signing_keys: Mapping[int, str | bytes]) -> str:
    """Write a roster JSON (party id -> Ed25519 public key, hex); returns its fingerprint."""
    keys = {int(k): (v.hex() if isinstance(v, bytes) else v) for k, v in signing_keys.items()}
    roster = _roster_from_json({"server": server, "dealer": dealer, "signing_keys": keys})
    Path(path).write_text(json.dumps(_roster_to_json(roster), indent=2))
    return roster_fingerprint(roster)


def _roster_to_json(roster: Roster) -> dict:
    return {"server": roster.server, "dealer": roster.dealer, "clients": list(roster.clients),
            "signing_keys": {str(p): roster.signing_keys[p].hex() for p in sorted(roster.signing_keys)}}


def _roster_from_json(data: Mapping[str, Any]) -> Roster:
    try:
        keys = {int(p): bytes.fromhex(k) for p, k in data["signing_keys"].items()}
        server = int(data["server"])
        clients = tuple(int(c) for c in data.get("clients", sorted(p for p in keys if p != server)))
        return Roster(server=server, dealer=int(data["dealer"]), clients=clients, signing_keys=keys)
    except (KeyError, TypeError, ValueError) as exc:
        raise RosterMismatchError(f"malformed roster: {exc}") from exc


def roster_fingerprint(roster: Roster) -> str:
    """SHA-256 of the canonical roster JSON (compare it out of band when rosters are not pinned)."""
    blob = json.dumps(_roster_to_json(roster), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def _check_pinned(roster: Roster, pinned_path: str) -> None:
    pinned = _roster_from_json(json.loads(Path(pinned_path).read_text()))
    if _roster_to_json(pinned) != _roster_to_json(roster):
        raise RosterMismatchError(f"the session's roster {roster_fingerprint(roster)[:16]} is not the pinned "
                                  f"roster {roster_fingerprint(pinned)[:16]} ({pinned_path})")


# ======================================================================================= wire format
def frames_record(frames: list[bytes]) -> ArrayRecord:
    """Frames as raw ``uint8`` arrays, in order (Flower chunks arrays above 5 MB)."""
    return ArrayRecord({f"{i:08d}": Array(dtype="uint8", shape=(len(f),), stype=_FRAME_STYPE, data=bytes(f))
                        for i, f in enumerate(frames)})


def record_frames(record: ArrayRecord | None) -> list[bytes]:
    """The frames of :func:`frames_record`, in order."""
    if record is None:
        return []
    out = []
    for key in sorted(record):
        arr = record[key]
        if arr.stype != _FRAME_STYPE:
            raise RemotePartyError(f"array {key!r} is not a fedgat frame (stype {arr.stype!r})")
        out.append(bytes(arr.data))
    return out


def _content(meta: Mapping[str, Any], frames: list[bytes]) -> RecordDict:
    return RecordDict({_META: ConfigRecord(dict(meta)), _FRAMES: frames_record(frames)})


def _recipient(frame: bytes) -> int:
    if len(frame) < HEADER.size:
        raise RemotePartyError("a reply carries a frame shorter than the header")
    return int(HEADER.unpack_from(frame)[4])


# ======================================================================================== server side
class FlowerServerTransport(Transport):
    """Carries frames between local parties (the server) and remote ones (ClientApps) over a Flower
    :class:`~flwr.serverapp.Grid`.

    ``poll()`` hands out local deliveries; when there are none and the local parties have no streamed
    work (or ``flush_bytes`` are queued), it runs one exchange: one message of ``message_type`` to
    every remote party with queued frames or a pending :attr:`setup`, then waits for all replies and
    queues their frames. Statuses reported by the clients land in :attr:`status`.

    Args:
        grid: the ServerApp's grid.
        nodes: remote party id -> Flower node id.
        local: party ids hosted in this process.
        busy: True while a local party has streamed work (checked before an exchange).
        message_type: the Flower message type of this phase.
        timeout: seconds to wait for all replies of one exchange.
    """

    def __init__(self, grid: Grid, nodes: Mapping[int, int], local: set[int], *, busy: Callable[[], bool],
                 message_type: str, timeout: float = 600.0, flush_bytes: int = 256 << 20,
                 poll_interval: float = 0.2) -> None:
        self.grid = grid
        self.nodes = dict(nodes)
        self.local = set(local)
        self.busy = busy
        self.message_type = message_type
        self.timeout = timeout
        self.flush_bytes = flush_bytes
        self.poll_interval = poll_interval
        self.setup: dict[int, dict] = {}
        self.status: dict[int, dict] = {}
        self._local: deque[Delivery] = deque()
        self._outbox: dict[int, list[bytes]] = {pid: [] for pid in self.nodes}
        self._queued = 0
        self.exchanges = 0
        self.bytes_up = self.bytes_down = self.messages_up = self.messages_down = 0

    def _send(self, sender: int, to: int, data: bytes) -> None:
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("transports carry bytes only")
        if to in self.local:
            self._local.append(Delivery(sender, to, bytes(data)))
        elif to in self._outbox:
            self._outbox[to].append(bytes(data))
            self._queued += len(data)
            self.bytes_down += len(data)
            self.messages_down += 1
        else:
            raise KeyError(f"frame for unknown party {to}")

    def poll(self) -> Delivery | None:
        if self._local:
            return self._local.popleft()
        pending = self._queued or self.setup
        if pending and (self._queued >= self.flush_bytes or not self.busy()):
            self.exchange()
            return self._local.popleft() if self._local else None
        return None

    def exchange(self) -> None:
        """One Flower round trip with every remote party that has frames or a set-up waiting."""
        targets = sorted(pid for pid in self.nodes if self._outbox[pid] or pid in self.setup)
        if not targets:
            return
        self.exchanges += 1
        group = f"{self.message_type}-{self.exchanges}"
        messages = []
        for pid in targets:
            meta = {"party": pid}
            if pid in self.setup:
                meta["setup"] = json.dumps(self.setup[pid])
            messages.append(Message(_content(meta, self._outbox[pid]), dst_node_id=self.nodes[pid],
                                    message_type=self.message_type, group_id=group))
            self._outbox[pid] = []
        self.setup = {}
        self._queued = 0
        began = time.perf_counter()
        replies = _send_and_receive(self.grid, messages, self.timeout, self.poll_interval)
        log.info("fedgat %s: exchange %d with parties %s, %.1f s", self.message_type, self.exchanges, targets,
                 time.perf_counter() - began)
        by_party = {}
        node_party = {node: pid for pid, node in self.nodes.items()}
        for reply in replies:
            pid = node_party.get(reply.metadata.src_node_id)
            if pid is None:
                raise RemotePartyError(f"reply from unknown node {reply.metadata.src_node_id}")
            by_party[pid] = reply
        for pid in targets:  # party order: deterministic, whatever order replies came in
            reply = by_party[pid]
            meta = dict(reply.content[_META])
            self.status[pid] = meta
            if meta.get("aborted"):
                raise RemotePartyError(f"party {pid} aborted: {meta['aborted']}")
            for frame in record_frames(reply.content.get(_FRAMES)):
                self.bytes_up += len(frame)
                self.messages_up += 1
                to = _recipient(frame)
                if to in self.local:
                    self._local.append(Delivery(pid, to, frame))
                else:
                    self._send(pid, to, frame)


def _send_and_receive(grid: Grid, messages: list[Message], timeout: float,
                      poll_interval: float) -> list[Message]:
    """``Grid.send_and_receive`` with a short poll interval (its own sleeps 3 s) and typed errors."""
    ids = set(grid.push_messages(messages))
    if len(ids) != len(messages):
        raise RemotePartyError(f"the SuperLink accepted {len(ids)} of {len(messages)} messages")
    deadline = time.monotonic() + timeout
    replies: list[Message] = []
    while ids:
        got = list(grid.pull_messages(ids))
        replies += got
        ids -= {m.metadata.reply_to_message_id for m in got}
        if not ids:
            break
        if time.monotonic() > deadline:
            raise FlowerTimeoutError(f"{len(ids)} of {len(messages)} replies missing after {timeout:.0f} s")
        time.sleep(poll_interval)
    for reply in replies:
        if reply.has_error():
            raise RemotePartyError(f"node {reply.metadata.src_node_id} failed: {reply.error.reason}")
    return replies


def _wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count:
            return nodes
        if time.monotonic() > deadline:
            raise FlowerTimeoutError(f"{len(nodes)} of {count} SuperNodes connected after {timeout:.0f} s")
        time.sleep(1.0)


@dataclass
class FlowerRunResult:
    """What the ServerApp ends with (also written to ``output_dir/summary.json``)."""

    summary: dict
    final_state: dict[str, np.ndarray]
    best_state: dict[str, np.ndarray]


def run_server(grid: Grid, cfg: FlowerRunConfig) -> FlowerRunResult:
    """The ServerApp's work: hello, encrypted pre-training, FedAvg rounds (see the module docstring)."""
    start = time.perf_counter()
    k = cfg.num_clients
    server_id = k
    hp = cfg.hyper()
    nodes = _wait_for_nodes(grid, k, cfg.round_timeout)
    # --- hello: party ids, public keys, data shape -------------------------------------------------
    hello = [Message(_content({"run-seed": cfg.seed}, []), dst_node_id=n, message_type=HELLO, group_id="hello")
             for n in nodes]
    party_node: dict[int, int] = {}
    keys: dict[int, bytes] = {}
    shapes = set()
    for reply in _send_and_receive(grid, hello, cfg.round_timeout, 0.2):
        meta = reply.content[_META]
        pid = int(meta["party"])
        if not 0 <= pid < k or pid in party_node:
            raise RosterMismatchError(f"node {reply.metadata.src_node_id} claims party id {pid} "
                                      f"(expected distinct ids 0..{k - 1})")
        party_node[pid] = reply.metadata.src_node_id
        keys[pid] = bytes(meta["ed25519"])
        shapes.add((int(meta["num-features"]), int(meta["num-classes"])))
    if len(party_node) != k:
        raise RosterMismatchError(f"parties {sorted(set(range(k)) - set(party_node))} did not answer")
    if len(shapes) != 1:
        raise RemotePartyError(f"clients disagree on (features, classes): {sorted(shapes)}")
    num_features, num_classes = shapes.pop()
    identity = (_read_identity(cfg.server_identity, client=False) if cfg.server_identity
                else Identity.generate(client=False))
    keys[server_id] = identity.signer.public_bytes()
    roster = Roster(server=server_id, dealer=cfg.dealer, clients=tuple(range(k)), signing_keys=keys)
    if cfg.roster:
        _check_pinned(roster, cfg.roster)
    fingerprint = roster_fingerprint(roster)
    log.info("fedgat roster %s (%s)", fingerprint, "pinned" if cfg.roster else "trust on first use")
    roster_json = _roster_to_json(roster)

    # --- encrypted pre-training --------------------------------------------------------------------
    pconfig = PretrainConfig(session=secrets.randbits(63), variant=cfg.variant, preset=cfg.preset,
                             chunks=cfg.chunks or None)
    pserver = ServerPretrain(server_id, roster, pconfig, identity,
                             bases_rng=_bases_rng(cfg.bases_seed) if cfg.bases_seed >= 0 else None,
                             workers=cfg.server_workers)
    pre = _drive(grid, pserver, party_node, PRETRAIN, cfg, setup={
        "phase": "pretrain", "roster": roster_json,
        "config": {"session": pconfig.session, "variant": pconfig.variant, "preset": pconfig.preset,
                   "chunks": pconfig.chunks, "embed_factor": pconfig.embed_factor}})
    _check_done(pserver, pre, "pre-training")
    pre_seconds = time.perf_counter() - start
    assert pserver.context is not None
    key_fp = pserver.context.fingerprint()

    # --- FedAvg rounds -----------------------------------------------------------------------------
    torch.manual_seed(cfg.seed)
    model = _model_fn(num_features, num_classes, hp)()
    initial = model.state_dict()
    strategy = strategy_from_hparams(hp, model)
    session = secrets.randbits(63)
    rserver = ServerRounds(server_id, roster, session, identity, initial_state=initial, rounds=hp["rounds"],
                           patience=hp["patience"], strategy=strategy, fraction=hp["fraction"], seed=cfg.seed,
                           fingerprint=key_fp)
    rounds = _drive(grid, rserver, party_node, ROUNDS, cfg, setup={
        "phase": "rounds", "session": session, "fingerprint": key_fp.hex(),
        "num-features": num_features, "num-classes": num_classes})
    if rserver.result is None:
        raise RemotePartyError(f"training did not complete: {rserver.abort_reason or rserver.state}")
    fit = rserver.result
    summary = {
        "roster_fingerprint": fingerprint, "roster_pinned": bool(cfg.roster),
        "key_fingerprint": key_fp.hex(), "pretrain_session": pconfig.session, "rounds_session": session,
        "party_nodes": {str(p): n for p, n in party_node.items()},
        "best_val_accuracy": fit.best_val_accuracy, "test_accuracy": fit.test_accuracy,
        "best_round": fit.best_round, "rounds": fit.rounds, "history": fit.history,
        "pretrain": {"seconds": pre_seconds, "exchanges": pre.exchanges, "bytes_up": pre.bytes_up,
                     "bytes_down": pre.bytes_down, "messages_up": pre.messages_up,
                     "messages_down": pre.messages_down, "server_has_secret_key": pserver.has_secret_key,
                     "ciphertexts_up": pserver.ciphertexts_received,
                     "result_ciphertexts": pserver.result_ciphertexts,
                     "multiply_adds": pserver.multiply_adds},
        "training": {"exchanges": rounds.exchanges, "bytes_up": rounds.bytes_up,
                     "bytes_down": rounds.bytes_down, "messages": rounds.messages_up + rounds.messages_down},
        "wall_seconds": time.perf_counter() - start,
    }
    result = FlowerRunResult(summary, state_to_arrays(rserver.global_state), state_to_arrays(rserver.best_state))
    if cfg.output_dir:
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
        np.savez(out / "final_model.npz", **result.final_state)
        np.savez(out / "best_model.npz", **result.best_state)
    log.info("fedgat: test accuracy %.4f at round %d (%d rounds), %.1f s", fit.test_accuracy,
             fit.best_round, fit.rounds, summary["wall_seconds"])
    return result


def _drive(grid: Grid, party: Party, party_node: Mapping[int, int], message_type: str,
           cfg: FlowerRunConfig, setup: dict) -> FlowerServerTransport:
    """Run ``party`` with the Driver until the phase is idle; the first exchange carries ``setup``."""
    transport = FlowerServerTransport(grid, party_node, {party.party_id}, busy=party.has_work,
                                      message_type=message_type, timeout=cfg.round_timeout,
                                      flush_bytes=cfg.flush_bytes)
    transport.setup = {pid: setup for pid in party_node}
    driver = Driver(transport, {party.party_id: party})
    driver.start()
    driver.run()
    return transport


def _check_done(party: Party, transport: FlowerServerTransport, what: str) -> None:
    failed = [f"server: {party.abort_reason or party.state}"] if not party.done else []
    failed += [f"party {pid}: {st.get('state')}" for pid, st in sorted(transport.status.items())
               if st.get("state") != "done"]
    if failed:
        raise RemotePartyError(f"{what} did not complete: " + "; ".join(failed))


# ======================================================================================== client side
class _StatePickler(pickle.Pickler):
    """Pickles parties; keys and CKKS contexts as their private bytes (local state only)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, SigningIdentity):
            return SigningIdentity.from_private_bytes, (obj.private_bytes(),)
        if isinstance(obj, WrappingIdentity):
            return WrappingIdentity.from_private_bytes, (obj.private_bytes(),)
        if isinstance(obj, KeyHolderContext):
            return _restore_holder, (obj.secret_context_bytes(), obj.fingerprint(), obj.symmetric_encryption)
        return NotImplemented


def _restore_holder(data: bytes, fingerprint: bytes, symmetric: bool) -> KeyHolderContext:
    return KeyHolderContext.from_secret_bytes(data, expected_fingerprint=fingerprint,
                                              symmetric_encryption=symmetric)


def _dumps(state: dict) -> bytes:
    buf = io.BytesIO()
    _StatePickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    return buf.getvalue()


def _state_file(context: Context) -> Path | None:
    directory = context.node_config.get("state-dir")
    if not directory:
        return None
    return Path(str(directory)) / f"fedgat-run{context.run_id}-node{context.node_id}.pkl"


def _load_state(context: Context) -> dict:
    if _STATE not in context.state:
        return {}
    rec = context.state[_STATE]
    digest = bytes(rec["sha256"])
    path = _state_file(context)
    blob = path.read_bytes() if path is not None and not rec.get("inline", True) else bytes(rec["blob"])
    if hashlib.sha256(blob).digest() != digest:
        raise RemotePartyError("the saved client state does not match its digest")
    return pickle.loads(blob)


def _save_state(context: Context, state: dict) -> None:
    blob = _dumps(state)
    digest = hashlib.sha256(blob).digest()
    path = _state_file(context)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        tmp.replace(path)
        context.state[_STATE] = ConfigRecord({"sha256": digest, "inline": False})
    else:
        context.state[_STATE] = ConfigRecord({"sha256": digest, "inline": True, "blob": blob})


class _ReplyTransport(Transport):
    """One ClientApp invocation: the message's frames in, the party's frames out."""

    def __init__(self, me: int, server: int, frames: list[bytes]) -> None:
        self._in = deque(Delivery(server, me, f) for f in frames)
        self.out: list[bytes] = []

    def _send(self, sender: int, to: int, data: bytes) -> None:
        self.out.append(bytes(data))

    def poll(self) -> Delivery | None:
        return self._in.popleft() if self._in else None

    def idle(self) -> bool:
        return not self._in


def _party_id(context: Context, cfg: FlowerRunConfig) -> int:
    nc = context.node_config
    if "partition-id" not in nc:
        raise RemotePartyError("the SuperNode needs --node-config 'partition-id=<i> num-partitions=<K>'")
    pid = int(nc["partition-id"])
    k = int(nc.get("num-partitions", cfg.num_clients))
    if k != cfg.num_clients or not 0 <= pid < k:
        raise RosterMismatchError(f"node config partition-id={pid} num-partitions={k} does not fit a run of "
                                  f"{cfg.num_clients} clients")
    return pid


def _client_data(cfg: FlowerRunConfig) -> tuple[Graph, Partition]:
    graph = load_graph(cfg)
    return graph, make_run_partition(graph, cfg)


def _new_pretrain_party(pid: int, cfg: FlowerRunConfig, identity: Identity, roster: Roster,
                        config: PretrainConfig) -> ClientPretrain:
    """A client's pre-training party, as :func:`fedgat.pipeline.build_pretrain_parties` builds it."""
    graph, partition = _client_data(cfg)
    cp = partition.clients[pid]
    if len(cp.owned) == 0:
        raise RemotePartyError(f"client {pid} owns no node; use fewer clients")
    indptr, indices = _owned_neighbourhoods(partition, cp.owned)
    cls = DealerSide if pid == roster.dealer else ClientPretrain
    return cls(pid, roster, config, identity, owned=cp.owned, features=graph.x.numpy()[cp.owned],
               indptr=indptr, indices=indices, needed=cp.needed, dtype=torch.float64,
               upload_batch=cfg.upload_batch)


def _new_rounds_party(pid: int, cfg: FlowerRunConfig, identity: Identity, roster: Roster, setup: dict,
                      encodings: Encodings) -> ClientRounds:
    """A client's FedAvg party around the :class:`fedgat.federated.Client` of
    :func:`fedgat.pipeline.train_fedgat`, built from its decrypted encodings."""
    hp = cfg.hyper()
    graph, partition = _client_data(cfg)
    if not np.array_equal(partition.clients[pid].needed, encodings.nodes):
        raise RemotePartyError(f"client {pid}'s encodings do not cover its needed nodes in order")
    train, evaluation = _split_tasks(graph, partition, pid, encodings, COMPACT_TOLERANCE)
    model_fn = _model_fn(int(setup["num-features"]), int(setup["num-classes"]), hp)
    strategy = strategy_from_hparams(hp)
    member = Client(pid, model_fn(), train, evaluation, lr=hp["lr"], weight_decay=hp["weight_decay"],
                    local_epochs=hp["local_epochs"], strategy=strategy)
    return ClientRounds(pid, roster, int(setup["session"]), identity, client=member, strategy=strategy,
                        fingerprint=bytes.fromhex(setup["fingerprint"]))


def _identity(state: dict, context: Context) -> Identity:
    if "identity" not in state:
        path = context.node_config.get("identity")
        state["identity"] = _read_identity(str(path), client=True) if path else Identity.generate(client=True)
    return state["identity"]


def handle_message(message: Message, context: Context) -> Message:
    """The ClientApp: one message in (frames for this party), one reply out (its frames)."""
    cfg = FlowerRunConfig.from_run_config(context.run_config)
    pid = _party_id(context, cfg)
    state = _load_state(context)
    identity = _identity(state, context)
    phase = message.metadata.message_type
    if phase == HELLO:
        graph = load_graph(cfg)
        _save_state(context, state)
        meta = {"party": pid, "ed25519": identity.signer.public_bytes(),
                "num-features": graph.num_features, "num-classes": graph.num_classes}
        return Message(_content(meta, []), reply_to=message)
    meta_in = message.content[_META]
    counter = state.get("messages", 0) + 1
    state["messages"] = counter
    # every message reseeds torch: dropout is reproducible run to run (per party and message)
    torch.manual_seed(int.from_bytes(hashlib.sha256(f"{cfg.seed}:{pid}:{counter}".encode()).digest()[:8], "big"))
    new = False
    if "setup" in meta_in:
        setup = json.loads(str(meta_in["setup"]))
        roster = _roster_from_json(setup["roster"]) if "roster" in setup else state["roster"]
        if roster.signing_key(pid) != identity.signer.public_bytes():
            raise RosterMismatchError(f"the roster does not hold party {pid}'s key")
        pinned = context.node_config.get("roster") or cfg.roster
        if "roster" in setup:
            if pinned:
                _check_pinned(roster, str(pinned))
            log.info("fedgat party %d: roster %s (%s)", pid, roster_fingerprint(roster),
                     "pinned" if pinned else "trust on first use")
        state["roster"] = roster
        if setup["phase"] == "pretrain":
            c = setup["config"]
            config = PretrainConfig(session=int(c["session"]), variant=c["variant"], preset=c["preset"],
                                    chunks=c["chunks"], embed_factor=int(c["embed_factor"]))
            state["party"] = _new_pretrain_party(pid, cfg, identity, roster, config)
        elif setup["phase"] == "rounds":
            pre = state.get("party")
            if not isinstance(pre, ClientPretrain) or pre.encodings is None:
                raise RemotePartyError(f"party {pid} has no encodings: the pre-training did not complete")
            state["party"] = _new_rounds_party(pid, cfg, identity, roster, setup, pre.encodings)
        else:
            raise RemotePartyError(f"unknown phase {setup['phase']!r}")
        new = True
    party: Party | None = state.get("party")
    if party is None:
        raise RemotePartyError(f"party {pid} got frames before its phase was set up")
    transport = _ReplyTransport(pid, state["roster"].server, record_frames(message.content.get(_FRAMES)))
    driver = Driver(transport, {pid: party})
    if new:
        driver.start()
    # stop once the frames are consumed and no streamed work is left: a party's armed deadline is
    # checked on its next message, never waited for inside a ClientApp
    driver.run(until=lambda: transport.idle() and not party.has_work())
    if isinstance(party, ClientPretrain) and party.done and not state.get("exported"):
        out = context.node_config.get("output-dir")
        if out and party.encodings is not None:
            Path(str(out)).mkdir(parents=True, exist_ok=True)
            save_encodings(Path(str(out)) / f"encodings-party{pid}.npz", party.encodings)
        state["exported"] = True
    _save_state(context, state)
    status = party.state.value if hasattr(party.state, "value") else str(party.state)
    meta = {"party": pid, "state": status, "aborted": party.abort_reason or ""}
    return Message(_content(meta, transport.out), reply_to=message)


# ========================================================================================= encodings
def save_encodings(path: str | Path, enc: Encodings) -> None:
    """A client's decrypted encodings as ``.npz`` (kept on the client's machine)."""
    arrays: dict[str, np.ndarray] = {"variant": np.array(enc.variant), "nodes": enc.nodes,
                                     "buckets": np.array(len(enc.buckets))}
    for i, b in enumerate(enc.buckets):
        bb = b.bases
        fields = {"rows": bb.rows, "bnodes": bb.nodes, "neighbours": bb.neighbours, "p": bb.p, "q": bb.q,
                  "h_self": b.h_self, "K2": b.K2, "M2": b.M2, "cols": b.cols}
        for name, value in fields.items():
            if value is not None:
                arrays[f"{i}.{name}"] = value.numpy() if isinstance(value, torch.Tensor) else value
    np.savez(path, **arrays)


def load_encodings(path: str | Path) -> Encodings:
    """Read :func:`save_encodings`' file back."""
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    variant = str(data["variant"])
    buckets = []
    for i in range(int(data["buckets"])):
        def get(name: str, i: int = i) -> np.ndarray | None:
            return data.get(f"{i}.{name}")

        bases = BucketBases(variant, get("rows"), get("bnodes"), get("neighbours"), get("p"), get("q"))
        tensors = [None if get(n) is None else torch.from_numpy(get(n)) for n in ("h_self", "K2", "M2", "cols")]
        buckets.append(EncodingBucket(bases, *tensors))
    return Encodings(variant, data["nodes"], buckets)


# ============================================================================================== apps
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


# =============================================================================================== CLI
def main(argv: list[str] | None = None) -> int:
    """``python -m fedgat.protocols.flower_app keygen|roster``: keys and the pinned roster."""
    parser = argparse.ArgumentParser(prog="python -m fedgat.protocols.flower_app", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    kg = sub.add_parser("keygen", help="write a party's private identity (JSON, 0600); print its public key")
    kg.add_argument("path")
    kg.add_argument("--server", action="store_true", help="the server's identity (no X25519 key)")
    ro = sub.add_parser("roster", help="write the roster JSON every party pins; print its fingerprint")
    ro.add_argument("path")
    ro.add_argument("--server", type=int, required=True, help="the server's party id (= number of clients)")
    ro.add_argument("--dealer", type=int, default=0)
    ro.add_argument("--key", action="append", required=True, metavar="ID=HEX",
                    help="a party's Ed25519 public key (repeat for every client and the server)")
    args = parser.parse_args(argv)
    if args.command == "keygen":
        print(generate_identity(args.path, client=not args.server)["ed25519"])
    else:
        keys = dict(item.split("=", 1) for item in args.key)
        print(write_roster(args.path, server=args.server, dealer=args.dealer, signing_keys=keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
