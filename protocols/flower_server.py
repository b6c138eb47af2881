"""The Flower engine's server side: the ServerApp's work (:func:`run_server`) and the transport that
carries the server party's frames over a Flower grid (:class:`FlowerServerTransport`).

The server party is assembled by :mod:`fedgat.app` (:func:`~fedgat.app.build_pretrain_server`,
:func:`~fedgat.app.build_rounds_server`), as in process, and driven by the ordinary
:class:`~fedgat.protocols.driver.Driver`. See :mod:`fedgat.protocols.flower_app`.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedgat.app import build_pretrain_server, build_rounds_server

from .flower_config import (
    FLOWER_HINT,
    FlowerRunConfig,
    FlowerTimeoutError,
    FlowerUnavailableError,
    RemotePartyError,
    RosterMismatchError,
)

try:
    from flwr.app import Message
    from flwr.serverapp import Grid
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise FlowerUnavailableError(f"{FLOWER_HINT} ({_exc})") from _exc

from .driver import Driver
from .fedavg import state_to_arrays
from .flower_roster import check_pinned, read_identity, roster_fingerprint, roster_to_json
from .flower_state import save_arrays
from .flower_wire import (
    HELLO,
    PRETRAIN,
    ROUNDS,
    config_bytes,
    config_int,
    config_str,
    frame_recipient,
    message_content,
    message_frames,
    message_meta,
)
from .party import Party
from .pretrain import PretrainConfig
from .roster import Identity, Roster
from .transport import Delivery, Transport

__all__ = ["FlowerRunResult", "FlowerServerTransport", "run_server", "send_and_receive", "wait_for_nodes"]

log = logging.getLogger("flwr").getChild("fedgat")  # Flower's handlers show it in the run's logs


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

    def __init__(
        self,
        grid: Grid,
        nodes: Mapping[int, int],
        local: set[int],
        *,
        busy: Callable[[], bool],
        message_type: str,
        timeout: float = 600.0,
        flush_bytes: int = 256 << 20,
        poll_interval: float = 0.2,
    ) -> None:
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
            meta: dict[str, Any] = {"party": pid}
            if pid in self.setup:
                meta["setup"] = json.dumps(self.setup[pid])
            messages.append(
                Message(
                    message_content(meta, self._outbox[pid]),
                    dst_node_id=self.nodes[pid],
                    message_type=self.message_type,
                    group_id=group,
                )
            )
            self._outbox[pid] = []
        self.setup = {}
        self._queued = 0
        began = time.perf_counter()
        replies = send_and_receive(self.grid, messages, self.timeout, self.poll_interval)
        log.info(
            "fedgat %s: exchange %d with parties %s, %.1f s",
            self.message_type,
            self.exchanges,
            targets,
            time.perf_counter() - began,
        )
        by_party = {}
        node_party = {node: pid for pid, node in self.nodes.items()}
        for reply in replies:
            sender = node_party.get(reply.metadata.src_node_id)
            if sender is None:
                raise RemotePartyError(f"reply from unknown node {reply.metadata.src_node_id}")
            by_party[sender] = reply
        for pid in targets:  # party order: deterministic, whatever order replies came in
            reply = by_party[pid]
            status = message_meta(reply)
            self.status[pid] = dict(status)
            if status.get("aborted"):
                raise RemotePartyError(f"party {pid} aborted: {config_str(status, 'aborted')}")
            for frame in message_frames(reply):
                self.bytes_up += len(frame)
                self.messages_up += 1
                to = frame_recipient(frame)
                if to in self.local:
                    self._local.append(Delivery(pid, to, frame))
                else:
                    self._send(pid, to, frame)


def send_and_receive(
    grid: Grid, messages: list[Message], timeout: float, poll_interval: float
) -> list[Message]:
    """``Grid.send_and_receive`` with a short poll interval (its own sleeps 3 s) and typed errors.

    Raises:
        FlowerTimeoutError: replies missing after ``timeout`` seconds.
        RemotePartyError: a message was refused, or a node replied with an error.
    """
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


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    """The sorted ids of the grid's nodes once ``count`` are connected.

    Raises:
        FlowerTimeoutError: fewer after ``timeout`` seconds.
    """
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


def _hello(
    grid: Grid, nodes: list[int], cfg: FlowerRunConfig
) -> tuple[dict[int, int], dict[int, bytes], int, int]:
    """The hello exchange: party id -> node id, party id -> Ed25519 key, and the data's
    ``(num_features, num_classes)``, on which every client must agree."""
    k = cfg.num_clients
    hello = [
        Message(
            message_content({"run-seed": cfg.seed}, []), dst_node_id=n, message_type=HELLO, group_id="hello"
        )
        for n in nodes
    ]
    party_node: dict[int, int] = {}
    keys: dict[int, bytes] = {}
    shapes = set()
    for reply in send_and_receive(grid, hello, cfg.round_timeout, 0.2):
        meta = message_meta(reply)
        pid = config_int(meta, "party")
        if not 0 <= pid < k or pid in party_node:
            raise RosterMismatchError(
                f"node {reply.metadata.src_node_id} claims party id {pid} (expected distinct ids 0..{k - 1})"
            )
        party_node[pid] = reply.metadata.src_node_id
        keys[pid] = config_bytes(meta, "ed25519")
        shapes.add((config_int(meta, "num-features"), config_int(meta, "num-classes")))
    if len(party_node) != k:
        raise RosterMismatchError(f"parties {sorted(set(range(k)) - set(party_node))} did not answer")
    if len(shapes) != 1:
        raise RemotePartyError(f"clients disagree on (features, classes): {sorted(shapes)}")
    num_features, num_classes = shapes.pop()
    return party_node, keys, num_features, num_classes


def run_server(grid: Grid, cfg: FlowerRunConfig) -> FlowerRunResult:
    """The ServerApp's work: hello, encrypted pre-training, FedAvg rounds (see
    :mod:`fedgat.protocols.flower_app`)."""
    start = time.perf_counter()
    k = cfg.num_clients
    server_id = k
    hp = cfg.hyper()
    nodes = wait_for_nodes(grid, k, cfg.round_timeout)
    # --- hello: party ids, public keys, data shape -------------------------------------------------
    party_node, keys, num_features, num_classes = _hello(grid, nodes, cfg)
    identity = read_identity(cfg.server_identity) if cfg.server_identity else Identity.generate()
    keys[server_id] = identity.signer.public_bytes()
    roster = Roster(server=server_id, clients=tuple(range(k)), signing_keys=keys)
    if cfg.roster:
        check_pinned(roster, cfg.roster)
    fingerprint = roster_fingerprint(roster)
    log.info("fedgat roster %s (%s)", fingerprint, "pinned" if cfg.roster else "trust on first use")

    # --- encrypted pre-training --------------------------------------------------------------------
    pconfig = PretrainConfig(
        session=secrets.randbits(63),
        variant=cfg.variant,
        preset=cfg.preset,
        chunks=cfg.chunks or None,
        wire=cfg.wire,
        upload_window=cfg.upload_window or None,
    )
    pserver = build_pretrain_server(
        roster,
        pconfig,
        identity,
        seed=cfg.bases_seed if cfg.bases_seed >= 0 else None,
        workers=cfg.server_workers,
    )
    pre_setup = {
        "phase": "pretrain",
        "roster": roster_to_json(roster),
        "config": {
            "session": pconfig.session,
            "variant": pconfig.variant,
            "preset": pconfig.preset,
            "chunks": pconfig.chunks,
            "embed_factor": pconfig.embed_factor,
            "wire": pconfig.wire,
            "upload_window": pconfig.upload_window,
        },
    }
    pre = _drive(grid, pserver, party_node, PRETRAIN, cfg, setup=pre_setup)
    _check_done(pserver, pre, "pre-training")
    pre_seconds = time.perf_counter() - start
    # the training binds every update to the pre-training's key set (every participant's CKKS key)
    key_fp = pserver.verifier.fingerprint
    if key_fp is None:
        raise RemotePartyError("pre-training ended without a key set")

    # --- FedAvg rounds -----------------------------------------------------------------------------
    session = secrets.randbits(63)
    rserver = build_rounds_server(
        roster,
        identity,
        hp,
        num_features=num_features,
        num_classes=num_classes,
        seed=cfg.seed,
        session=session,
        fingerprint=key_fp,
    )
    rounds_setup = {
        "phase": "rounds",
        "session": session,
        "fingerprint": key_fp.hex(),
        "num-features": num_features,
        "num-classes": num_classes,
    }
    rounds = _drive(grid, rserver, party_node, ROUNDS, cfg, setup=rounds_setup)
    if rserver.result is None:
        raise RemotePartyError(f"training did not complete: {rserver.abort_reason or rserver.state}")
    fit = rserver.result
    summary = {
        "roster_fingerprint": fingerprint,
        "roster_pinned": bool(cfg.roster),
        "keyset_fingerprint": key_fp.hex(),
        "pretrain_session": pconfig.session,
        "rounds_session": session,
        "party_nodes": {str(p): n for p, n in party_node.items()},
        "best_val_accuracy": fit.best_val_accuracy,
        "test_accuracy": fit.test_accuracy,
        "best_round": fit.best_round,
        "rounds": fit.rounds,
        "history": fit.history,
        "pretrain": {
            "seconds": pre_seconds,
            "exchanges": pre.exchanges,
            "bytes_up": pre.bytes_up,
            "bytes_down": pre.bytes_down,
            "messages_up": pre.messages_up,
            "messages_down": pre.messages_down,
            "server_has_secret_key": pserver.has_secret_key,
            "ciphertexts_up": pserver.ciphertexts_received,
            "result_ciphertexts": pserver.result_ciphertexts,
            "multiply_adds": pserver.multiply_adds,
            "upload_window": pconfig.upload_window,
        },
        "training": {
            "exchanges": rounds.exchanges,
            "bytes_up": rounds.bytes_up,
            "bytes_down": rounds.bytes_down,
            "messages": rounds.messages_up + rounds.messages_down,
        },
        "wall_seconds": time.perf_counter() - start,
    }
    result = FlowerRunResult(
        summary, state_to_arrays(rserver.global_state), state_to_arrays(rserver.best_state)
    )
    if cfg.output_dir:
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
        save_arrays(out / "final_model.npz", result.final_state)
        save_arrays(out / "best_model.npz", result.best_state)
    log.info(
        "fedgat: test accuracy %.4f at round %d (%d rounds), %.1f s",
        fit.test_accuracy,
        fit.best_round,
        fit.rounds,
        summary["wall_seconds"],
    )
    return result


def _drive(
    grid: Grid,
    party: Party,
    party_node: Mapping[int, int],
    message_type: str,
    cfg: FlowerRunConfig,
    setup: dict,
) -> FlowerServerTransport:
    """Run ``party`` with the Driver until the phase is idle; the first exchange carries ``setup``."""
    transport = FlowerServerTransport(
        grid,
        party_node,
        {party.party_id},
        busy=party.has_work,
        message_type=message_type,
        timeout=cfg.round_timeout,
        flush_bytes=cfg.flush_bytes,
    )
    transport.setup = {pid: setup for pid in party_node}
    driver = Driver(transport, {party.party_id: party})
    driver.start()
    driver.run()
    return transport


def _check_done(party: Party, transport: FlowerServerTransport, what: str) -> None:
    failed = [f"server: {party.abort_reason or party.state}"] if not party.done else []
    failed += [
        f"party {pid}: {st.get('state')}"
        for pid, st in sorted(transport.status.items())
        if st.get("state") != "done"
    ]
    if failed:
        raise RemotePartyError(f"{what} did not complete: " + "; ".join(failed))
