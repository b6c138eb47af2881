"""The Flower engine (:mod:`fedgat.protocols.flower_app`) against the in-process reference.

``test_deployment_conforms`` starts Flower's local deployment runtime -- ``flower-superlink
--insecure`` and one ``flower-supernode`` per client on free localhost ports, each in its own
process group, with a temporary ``FLWR_HOME`` and telemetry off -- submits the app with
``flwr run``, and compares what the ServerApp and the ClientApps wrote with the in-process
reference of :mod:`.conformance` (same federation, seeds and hyper-parameters): identical bases,
decrypted encodings within ``ENCODING_ATOL``, the same ciphertext, message and multiply-add counts,
the same rounds, accuracies and (within ``LOSS_RTOL``) losses, and the same final weights.
``test_grid_conforms`` runs the same ServerApp and ClientApp code without the runtime (a grid that
calls the ClientApp handler in process), which keeps failures of the app itself quick to read.
The ``kept_run`` tests check the ClientApps' saved state (:mod:`fedgat.protocols.flower_state`):
values under the client's own HMAC key, no pickle, tampered, foreign, rolled-back and old pickled
state refused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedgat.pipeline import max_abs_error

from .conformance import DROPOUT_HPARAMS, ENCODING_ATOL, LOSS_RTOL, federation, reference

pytestmark = pytest.mark.flower

REPO = Path(__file__).resolve().parents[2]
#: the fewest clients the default protocol trains with (secure aggregation refuses cohorts below 3)
CLIENTS = 3
NODES = 96
SEED = 0
#: the conformance checks' hyper-parameters with two rounds: every round costs a few Flower
#: exchanges, each of which starts a ClientApp process per client (Flower 1.41 runs one per message).
#: Dropout on: each client's masks come from its own stream, carried in its state across messages
HPARAMS = {**DROPOUT_HPARAMS, "rounds": 2}
#: the run config of the conformance federation (:func:`.conformance.federation`)
RUN_CONFIG = {
    "num-clients": CLIENTS,
    "dataset": "synthetic",
    "synthetic-nodes": NODES,
    "synthetic-features": 16,
    "synthetic-classes": 4,
    "synthetic-train-per-class": 4,
    "synthetic-seed": SEED,
    "seed": SEED,
    "bases-seed": SEED,
    "hparams": json.dumps(HPARAMS),
    "round-timeout": 180.0,
}
#: flwr run: one fresh ClientApp process per client and message is slow on a loaded machine (3
#: clients, 4 pre-training and ~10 secure-aggregation training exchanges: ~550 s on a busy 2-core box)
DEPLOYMENT_TIMEOUT = 1080.0


@pytest.fixture(scope="module")
def fed():
    return federation(num_nodes=NODES, clients=CLIENTS, seed=SEED)


@pytest.fixture(scope="module")
def training_reference(fed):
    """In-process FedAvg rounds with :data:`HPARAMS` on the plaintext twin's encodings, and the
    weights of their last GlobalModel (the final global model)."""
    from fedgat.pipeline import train_fedgat
    from fedgat.protocols import GlobalModel, InProcessTransport, Transcript, decode_message

    transcript = Transcript()
    result = train_fedgat(
        fed.graph,
        fed.partition,
        reference(fed).plaintext,
        seed=fed.seed,
        transport=InProcessTransport(transcript),
        progress=False,
        **HPARAMS,
    )
    last = [e for e in transcript if e.type_name == "GlobalModel"][-1]
    msg = decode_message(last.data)
    assert isinstance(msg, GlobalModel)
    return result, msg.arrays


def check_flower_run(
    fed, training_reference, summary: dict, encodings: dict, final_weights: dict[str, np.ndarray], want=None
) -> None:
    """The checks of :func:`.conformance.check_pretraining` and :func:`.conformance.check_training`
    that apply to a run whose parties live in other processes (the engine hosts them itself);
    ``want``: the in-process pre-training to match (default the conformance reference's)."""
    ref = reference(fed)
    want = ref.pretrain if want is None else want
    # --- pre-training: same bases exactly, same encodings up to CKKS noise, same counts --------------
    assert sorted(encodings) == sorted(want.encodings)
    for c, enc in encodings.items():
        other = want.encodings[c]
        assert np.array_equal(enc.nodes, other.nodes), f"client {c}: other nodes"
        assert len(enc.buckets) == len(other.buckets), f"client {c}: other buckets"
        for a, b in zip(enc.buckets, other.buckets):
            for name in ("rows", "nodes", "p", "q"):
                x, y = getattr(a.bases, name), getattr(b.bases, name)
                assert (x is None and y is None) or np.array_equal(x, y), f"client {c}: other bases ({name})"
    assert max_abs_error(encodings, want.encodings) <= ENCODING_ATOL
    assert max_abs_error(encodings, ref.plaintext) <= ENCODING_ATOL
    pre = summary["pretrain"]
    assert pre["server_has_secret_key"] is False
    assert pre["ciphertexts_up"] == want.ciphertexts_up
    assert pre["result_ciphertexts"] == want.result_ciphertexts
    assert pre["multiply_adds"] == want.multiply_adds
    assert (pre["messages_up"], pre["messages_down"]) == (want.messages_up, want.messages_down)
    # --- training: same rounds, accuracies, losses (rtol) and final weights ---------------------------
    training, want_weights = training_reference
    fit = training.fit
    assert summary["rounds"] == fit.rounds and summary["best_round"] == fit.best_round
    assert summary["training"]["messages"] == training.messages
    assert summary["best_val_accuracy"] == fit.best_val_accuracy
    assert summary["test_accuracy"] == fit.test_accuracy or (
        math.isnan(summary["test_accuracy"]) and math.isnan(fit.test_accuracy)
    )
    for mine, theirs in zip(summary["history"], fit.history, strict=True):
        assert mine.keys() == theirs.keys()
        assert mine["clients"] == theirs["clients"]
        for key, value in theirs.items():
            if key.endswith("_accuracy"):
                assert mine[key] == value, f"round {theirs['round']}: {key} differs"
            elif key.endswith("_loss"):
                assert mine[key] == pytest.approx(value, rel=LOSS_RTOL), f"round {theirs['round']}: {key}"
    assert list(final_weights) == list(want_weights)
    for name, value in want_weights.items():
        np.testing.assert_allclose(final_weights[name], value, rtol=0, atol=1e-5, err_msg=name)


def _read_outputs(out: Path) -> tuple[dict, dict, dict]:
    from fedgat.protocols.flower_app import load_encodings

    summary = json.loads((out / "server" / "summary.json").read_text())
    encodings = {c: load_encodings(out / f"client{c}" / f"encodings-party{c}.npz") for c in range(CLIENTS)}
    with np.load(out / "server" / "final_model.npz") as z:
        weights = {k: z[k] for k in z.files}
    return summary, encodings, weights


# ================================================================================ without the runtime
class _InProcessGrid:
    """A Grid that hands every message straight to the ClientApp handler (one Context per node,
    kept across messages like a SuperNode keeps it)."""

    def __init__(self, run_config: dict, node_configs: list[dict]) -> None:
        from flwr.app import Context, RecordDict
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
        self.contexts = {
            100 + i: Context(
                run_id=1, node_id=100 + i, node_config=nc, state=RecordDict(), run_config=run_config
            )
            for i, nc in enumerate(node_configs)
        }
        self._replies: dict = {}
        self._count = 0

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        from fedgat.protocols.flower_app import handle_message

        ids = []
        for msg in messages:
            self._count += 1
            mid = f"m{self._count}"
            msg.metadata.__dict__["_message_id"] = mid
            node = msg.metadata.dst_node_id
            reply = handle_message(msg, self.contexts[node])
            reply.metadata.__dict__["_src_node_id"] = node
            reply.metadata.__dict__["_reply_to_message_id"] = mid
            self._replies[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        return [self._replies.pop(i) for i in list(ids) if i in self._replies]


def test_grid_conforms(fed, training_reference, tmp_path):
    from fedgat.protocols.flower_app import FlowerRunConfig, run_server

    out = tmp_path / "out"
    nodes = [
        {"partition-id": c, "num-partitions": CLIENTS, "output-dir": str(out / f"client{c}")}
        for c in range(CLIENTS)
    ]
    run_config = {**RUN_CONFIG, "output-dir": str(out / "server")}
    grid = _InProcessGrid(run_config, nodes)
    run_server(grid, FlowerRunConfig.from_run_config(run_config))  # type: ignore[arg-type]
    check_flower_run(fed, training_reference, *_read_outputs(out))


def _no_pickle(monkeypatch):
    import pickle

    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used")

    for name in ("dumps", "loads", "dump", "load", "Pickler", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)


@pytest.fixture
def kept_run(tmp_path, monkeypatch):
    """A one-round grid run without pickle: client 0 with an identity file and ``state-dir``, the
    others with generated keys and their state inline in ``Context.state``; the grid and the paths."""
    from fedgat.protocols.flower_app import FlowerRunConfig, generate_identity, run_server

    generate_identity(tmp_path / "client0.json")
    nodes = [
        {
            "partition-id": 0,
            "num-partitions": CLIENTS,
            "identity": str(tmp_path / "client0.json"),
            "state-dir": str(tmp_path / "state0"),
        },
        *({"partition-id": c, "num-partitions": CLIENTS} for c in range(1, CLIENTS)),
    ]
    run_config = {**RUN_CONFIG, "hparams": json.dumps({**HPARAMS, "rounds": 1})}
    grid = _InProcessGrid(run_config, nodes)
    _no_pickle(monkeypatch)
    summary = run_server(grid, FlowerRunConfig.from_run_config(run_config)).summary  # type: ignore[arg-type]
    monkeypatch.undo()
    assert summary["rounds"] == 1
    return grid, tmp_path


def test_client_state_is_values_under_the_clients_key(kept_run):
    from fedgat.protocols import ClientRounds
    from fedgat.protocols.flower_state import STATE, load_client

    grid, tmp = kept_run
    ctx0, ctx1 = grid.contexts[100], grid.contexts[101]
    a, b = load_client(ctx0, 0), load_client(ctx1, 1)
    for store, ctx in ((a, ctx0), (b, ctx1)):
        assert isinstance(store.party, ClientRounds) and store.party.last_round >= 1
        assert store.messages > 3 and store.exported and store.roster is not None
        again = load_client(ctx, store.party_id)
        assert again.party.snapshot() == store.party.snapshot()
    # client 0: a 0600 file, its digest in Context.state, no private key anywhere in the store
    files = list((tmp / "state0").iterdir())
    assert len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o600
    assert (tmp / "state0").stat().st_mode & 0o777 == 0o700
    rec = ctx0.state.config_records[STATE]
    assert rec["inline"] is False and "identity" not in rec and "blob" not in rec
    blob = files[0].read_bytes()
    assert a.identity.signer.private_bytes() not in blob
    # client 1: generated keys kept beside the state (nothing else to keep them in)
    rec1 = ctx1.state.config_records[STATE]
    assert rec1["inline"] is True and isinstance(rec1["identity"], bytes)


def test_client_modules_import_no_pickle():
    import ast
    import inspect

    from fedgat.protocols import flower_client, flower_state, party_state

    for module in (flower_state, flower_client, party_state):
        tree = ast.parse(inspect.getsource(module))
        names = {
            a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names
        }
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {n for n in names if "pickle" in n}, module.__name__


def test_client_state_refuses_tampered_foreign_and_pickled(kept_run):
    from flwr.app import ConfigRecord, Context, RecordDict

    from fedgat.protocols.flower_state import (
        STATE,
        ForeignStateError,
        SavedStateError,
        StateAuthenticationError,
        load_client,
        save_client,
    )

    grid, tmp = kept_run
    ctx0, ctx1 = grid.contexts[100], grid.contexts[101]

    def record(ctx) -> dict:
        return dict(ctx.state.config_records[STATE])

    def with_record(ctx, rec: dict, node_id: int | None = None):
        state = RecordDict()
        state[STATE] = ConfigRecord(rec)
        return Context(
            run_id=ctx.run_id,
            node_id=ctx.node_id if node_id is None else node_id,
            node_config=ctx.node_config,
            state=state,
            run_config=ctx.run_config,
        )

    # inline state with one byte changed, anywhere
    rec1 = record(ctx1)
    for i in (12, len(rec1["blob"]) // 2, len(rec1["blob"]) - 1):
        bad = bytearray(rec1["blob"])
        bad[i] ^= 1
        with pytest.raises(StateAuthenticationError):
            load_client(with_record(ctx1, {**rec1, "blob": bytes(bad)}), 1)
    # the same (authentic) state on another node, or claimed by another party
    with pytest.raises(ForeignStateError, match="node"):
        load_client(with_record(ctx1, rec1, node_id=999), 1)
    with pytest.raises(ForeignStateError, match="party 1"):
        load_client(with_record(ctx1, rec1), 0)
    # another client's state under client 0's key file: it does not verify
    path = next((tmp / "state0").iterdir())
    good = path.read_bytes()
    with pytest.raises(StateAuthenticationError):
        load_client(with_record(ctx0, {**record(ctx0), "inline": True, "blob": rec1["blob"]}), 0)
    # a state-dir file altered, or rolled back to an older authentic state
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(StateAuthenticationError, match="digest"):
        load_client(ctx0, 0)
    path.write_bytes(good)
    newer = record(ctx0)
    store = load_client(ctx0, 0)
    store.messages -= 1
    save_client(ctx0, store)  # an older state, authentic, in the file
    assert path.read_bytes() != good
    ctx0.state[STATE] = ConfigRecord(newer)
    with pytest.raises(StateAuthenticationError, match="rolled back"):
        load_client(ctx0, 0)
    # the old pickled format is never read
    old = {"sha256": b"\0" * 32, "inline": True, "blob": b"\x80\x05N."}
    with pytest.raises(SavedStateError, match="never unpickles"):
        load_client(with_record(ctx1, old), 1)


def test_pinned_roster(tmp_path):
    """With identity files and a pinned roster every party refuses any other key; the run goes
    through when the roster is the pinned one."""
    from fedgat.crypto import SigningIdentity
    from fedgat.protocols.flower_app import (
        FlowerRunConfig,
        RosterMismatchError,
        generate_identity,
        main,
        run_server,
        write_roster,
    )

    keys = {c: generate_identity(tmp_path / f"client{c}.json")["ed25519"] for c in range(CLIENTS)}
    assert (tmp_path / "client0.json").stat().st_mode & 0o777 == 0o600
    assert main(["keygen", str(tmp_path / "server.json"), "--server"]) == 0
    private = json.loads((tmp_path / "server.json").read_text())["ed25519_private"]
    keys[CLIENTS] = SigningIdentity.from_private_bytes(bytes.fromhex(private)).public_bytes()
    good = write_roster(tmp_path / "roster.json", server=CLIENTS, signing_keys=keys)
    forged = {**keys, 1: keys[0]}
    write_roster(tmp_path / "forged.json", server=CLIENTS, signing_keys=forged)

    def run(client_roster: str) -> dict:
        nodes = [
            {
                "partition-id": c,
                "num-partitions": CLIENTS,
                "identity": str(tmp_path / f"client{c}.json"),
                "roster": str(tmp_path / client_roster),
            }
            for c in range(CLIENTS)
        ]
        run_config = {
            **RUN_CONFIG,
            "hparams": json.dumps({**HPARAMS, "rounds": 1}),
            "roster": str(tmp_path / "roster.json"),
            "server-identity": str(tmp_path / "server.json"),
        }
        return run_server(
            _InProcessGrid(run_config, nodes), FlowerRunConfig.from_run_config(run_config)
        ).summary

    summary = run("roster.json")
    assert summary["roster_pinned"] is True and summary["roster_fingerprint"] == good
    with pytest.raises(RosterMismatchError, match="pinned"):
        run("forged.json")


def test_files_of_the_dealer_era_still_read(tmp_path):
    """An identity file with an X25519 key and a roster with a ``"dealer"`` (written before the dealer
    was removed) still read: the X25519 key is ignored, the dealer entry too (with a deprecation
    warning); the roster pins the same parties, and nothing new is written with either."""
    from fedgat.protocols.flower_app import generate_identity, main, write_roster
    from fedgat.protocols.flower_roster import check_pinned, read_identity, roster_from_json, roster_to_json

    keys = {p: generate_identity(tmp_path / f"party{p}.json")["ed25519"] for p in range(CLIENTS + 1)}
    ident = json.loads((tmp_path / "party0.json").read_text())
    assert set(ident) == {"ed25519_private"}
    old = tmp_path / "old-identity.json"
    old.write_text(json.dumps({**ident, "x25519_private": "11" * 32}))
    assert read_identity(old).signer.public_bytes().hex() == keys[0]
    assert (
        main(
            ["roster", str(tmp_path / "roster.json"), "--server", str(CLIENTS)]
            + [f"--key={p}={k}" for p, k in keys.items()]
        )
        == 0
    )
    new = json.loads((tmp_path / "roster.json").read_text())
    assert "dealer" not in new
    legacy = {**new, "dealer": 0}
    (tmp_path / "legacy.json").write_text(json.dumps(legacy))
    with pytest.warns(DeprecationWarning, match="dealer"):
        roster = roster_from_json(legacy)
    assert roster_to_json(roster) == new
    with pytest.warns(DeprecationWarning):
        check_pinned(roster_from_json(new), str(tmp_path / "legacy.json"))
    with pytest.raises(SystemExit):  # the option is gone
        main(["roster", str(tmp_path / "r.json"), "--server", "2", "--dealer", "0", "--key", f"0={keys[0]}"])
    assert write_roster(tmp_path / "again.json", server=CLIENTS, signing_keys=keys)


class _Records(logging.Handler):
    """The messages logged on the engine's logger (Flower's logger may not propagate to caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_client_never_pins_the_run_configs_roster(tmp_path):
    """The run config is the server operator's: a client takes no roster from it. Here it names a
    forged roster; the clients (no node config ``roster``) ignore it, say so, and trust on first use."""
    from fedgat.protocols.flower_app import FlowerRunConfig, generate_identity, run_server, write_roster

    keys = {c: generate_identity(tmp_path / f"client{c}.json")["ed25519"] for c in range(CLIENTS)}
    keys[CLIENTS] = generate_identity(tmp_path / "server.json")["ed25519"]
    write_roster(tmp_path / "roster.json", server=CLIENTS, signing_keys=keys)
    write_roster(tmp_path / "forged.json", server=CLIENTS, signing_keys={**keys, 1: keys[0]})
    nodes = [
        {"partition-id": c, "num-partitions": CLIENTS, "identity": str(tmp_path / f"client{c}.json")}
        for c in range(CLIENTS)
    ]
    run_config = {
        **RUN_CONFIG,
        "hparams": json.dumps({**HPARAMS, "rounds": 1}),
        "server-identity": str(tmp_path / "server.json"),
    }
    server_cfg = FlowerRunConfig.from_run_config({**run_config, "roster": str(tmp_path / "roster.json")})
    grid = _InProcessGrid({**run_config, "roster": str(tmp_path / "forged.json")}, nodes)
    records = _Records()
    logger = logging.getLogger("flwr").getChild("fedgat")
    logger.addHandler(records)
    try:
        summary = run_server(grid, server_cfg).summary  # type: ignore[arg-type]
    finally:
        logger.removeHandler(records)
    assert summary["roster_pinned"] is True and summary["rounds"] == 1
    for c in range(CLIENTS):
        assert any(f"party {c}: ignoring the run config's roster" in line for line in records.lines)
        assert any(f"party {c}: roster " in line and "trust on first use" in line for line in records.lines)
        assert not any(f"party {c}: roster " in line and "(pinned)" in line for line in records.lines)


class _RosterSwapGrid(_InProcessGrid):
    """An in-process grid whose carrier adds a roster to the FedAvg set-up: the one first sent for
    party 0, one with another server key for party 1."""

    def __init__(self, run_config: dict, node_configs: list[dict]) -> None:
        super().__init__(run_config, node_configs)
        self.first: dict | None = None

    def push_messages(self, messages):
        from fedgat.crypto import SigningIdentity
        from fedgat.protocols.flower_wire import META, PRETRAIN, ROUNDS

        for msg in messages:
            meta = msg.content.config_records[META]
            if "setup" not in meta:
                continue
            setup = json.loads(str(meta["setup"]))
            if msg.metadata.message_type == PRETRAIN:
                self.first = setup["roster"]
            elif msg.metadata.message_type == ROUNDS and self.first is not None:
                roster = json.loads(json.dumps(self.first))
                if meta["party"] == 1:
                    other = SigningIdentity.generate().public_bytes().hex()
                    roster["signing_keys"][str(roster["server"])] = other
                meta["setup"] = json.dumps({**setup, "roster": roster})
        return super().push_messages(messages)


def test_client_refuses_a_changed_roster():
    """Trust on first use keeps the first roster for the run: the same roster again is accepted, a
    different one later is refused with a typed error and the kept roster stays."""
    from fedgat.protocols.flower_app import FlowerRunConfig, RosterChangedError, run_server
    from fedgat.protocols.flower_roster import roster_from_json, roster_to_json
    from fedgat.protocols.flower_state import load_client

    nodes = [{"partition-id": c, "num-partitions": CLIENTS} for c in range(CLIENTS)]
    run_config = {**RUN_CONFIG, "hparams": json.dumps({**HPARAMS, "rounds": 1})}
    grid = _RosterSwapGrid(run_config, nodes)
    with pytest.raises(RosterChangedError, match="party 1: the server sent roster .* refusing the change"):
        run_server(grid, FlowerRunConfig.from_run_config(run_config))  # type: ignore[arg-type]
    assert grid.first is not None
    first = roster_to_json(roster_from_json(grid.first))
    for c in range(CLIENTS):
        store = load_client(grid.contexts[100 + c], c)
        assert store.roster is not None and roster_to_json(store.roster) == first


def test_a_terminal_refusal_is_saved_before_the_clientapp_raises(monkeypatch):
    """A result that fails its check ends the recipient's session; the ClientApp raises, and the
    aborted state it leaves is saved first (a restarted ClientApp must not accept the next probe)."""
    from fedgat.protocols import EncodingResults, ResultRejectedError
    from fedgat.protocols.flower_app import FlowerRunConfig, run_server
    from fedgat.protocols.flower_state import load_client
    from fedgat.protocols.pretrain_server import ServerPretrain

    step = ServerPretrain.step
    swapped: list[int] = []

    def swapping(self):  # the first batch for party 1 with two items as long: their ciphertexts swapped
        out = step(self)
        for k, m in enumerate(out):
            if isinstance(m, EncodingResults) and m.recipient == 1 and len(m.items) >= 2 and not swapped:
                a, b = m.items[0], m.items[1]
                if len(a.row_blobs) != len(b.row_blobs):
                    continue
                items = (
                    dataclasses.replace(a, row_blobs=b.row_blobs),
                    dataclasses.replace(b, row_blobs=a.row_blobs),
                )
                out[k] = dataclasses.replace(m, items=items + m.items[2:])
                swapped.append(a.node)
        return out

    monkeypatch.setattr(ServerPretrain, "step", swapping)
    nodes = [{"partition-id": c, "num-partitions": CLIENTS} for c in range(CLIENTS)]
    run_config = {**RUN_CONFIG, "hparams": json.dumps({**HPARAMS, "rounds": 1})}
    grid = _InProcessGrid(run_config, nodes)
    with pytest.raises(ResultRejectedError):
        run_server(grid, FlowerRunConfig.from_run_config(run_config))  # type: ignore[arg-type]
    assert swapped
    party = load_client(grid.contexts[101], 1).party
    assert (
        party is not None and party.state_name() == "aborted" and "ResultRejectedError" in party.abort_reason
    )


# =================================================================================== the deployment
def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port} after {timeout:.0f} s")


class LocalDeployment:
    """flower-superlink + one flower-supernode per client on localhost, each in its own process
    group (so their SuperExec and ClientApp children go down with them); logs under ``root/logs``."""

    def __init__(self, root: Path, clients: int) -> None:
        self.root = root
        self.clients = clients
        self.procs: list[subprocess.Popen] = []
        self.logs = root / "logs"
        self.logs.mkdir(parents=True)
        home = root / "flwr-home"
        home.mkdir()
        self.env = {
            **os.environ,
            "FLWR_HOME": str(home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.25",
            "PYTHONUNBUFFERED": "1",
            "FEDGAT_DATA": os.environ.get("FEDGAT_DATA", ""),
        }
        bindir = Path(sys.executable).parent
        self.env["PATH"] = f"{bindir}{os.pathsep}{self.env.get('PATH', '')}"
        self.bindir = bindir
        self.link_port, *self.node_ports = _free_ports(1 + clients)
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "fedgat-test"\n\n[superlink.fedgat-test]\n'
            f'address = "127.0.0.1:{self.link_port}"\ninsecure = true\n'
        )

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            args, cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        link = self._spawn(
            "superlink",
            [
                str(self.bindir / "flower-superlink"),
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.link_port),
            ],
        )
        _wait_port(self.link_port, link)
        out = self.root / "out"
        for c, port in enumerate(self.node_ports):
            config = (
                f"partition-id={c} num-partitions={self.clients} "
                f"output-dir='{out / f'client{c}'}' state-dir='{self.root / f'state{c}'}'"
            )
            self._spawn(
                f"supernode{c}",
                [
                    str(self.bindir / "flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{self.link_port}",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--node-config",
                    config,
                ],
            )

    def run(self, run_config: dict, timeout: float) -> tuple[int | None, str]:
        """``flwr run`` of the repository's app on this deployment, streaming its logs until the run
        ends; returns the exit status (None: timed out) and the output."""
        overrides = self.root / "run-config.toml"  # a file: values with spaces do not survive the CLI string
        overrides.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in run_config.items()))
        try:
            done = subprocess.run(
                [
                    str(self.bindir / "flwr"),
                    "run",
                    str(REPO),
                    "fedgat-test",
                    "--run-config",
                    str(overrides),
                    "--stream",
                ],
                check=False,
                cwd=self.root,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return None, out
        return done.returncode, done.stdout

    def logs_tail(self, chars: int = 3000) -> str:
        parts = []
        for path in sorted(self.logs.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs:  # the whole group: SuperExec and ClientApp children too
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


@pytest.fixture
def deployment():
    root = Path(tempfile.mkdtemp(prefix="fedgat-flower-"))
    dep = LocalDeployment(root, CLIENTS)
    try:
        dep.start()
        yield dep
    finally:
        dep.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(1200)
def test_deployment_conforms(fed, training_reference, deployment):
    out = deployment.root / "out"
    start = time.monotonic()
    rc, output = deployment.run({**RUN_CONFIG, "output-dir": str(out / "server")}, DEPLOYMENT_TIMEOUT)
    elapsed = time.monotonic() - start
    summary_path = out / "server" / "summary.json"
    assert summary_path.is_file(), (
        f"no summary after {elapsed:.0f} s (flwr run: exit status {rc})\n"
        f"{output[-6000:]}\n{deployment.logs_tail()}"
    )
    summary, encodings, weights = _read_outputs(out)
    print("\n".join(line for line in output.splitlines() if "fedgat" in line))
    print(
        f"flower deployment: {CLIENTS} clients, flwr run {elapsed:.1f} s, app {summary['wall_seconds']:.1f} s, "
        f"{summary['pretrain']['exchanges']} + {summary['training']['exchanges']} exchanges"
    )
    assert summary["roster_pinned"] is False and len(summary["party_nodes"]) == CLIENTS
    check_flower_run(fed, training_reference, summary, encodings, weights)


def test_a_node_encrypts_on_the_workers_its_node_config_allows(
    fed, training_reference, tmp_path, monkeypatch
):
    """``encrypt-workers`` in a node's config: its client encrypts on a pool of its own processes
    (the tiny round's uploads made worth a pool of 2 here), and the run is the one without pools."""
    from fedgat.crypto import encrypt_pool
    from fedgat.protocols.flower_app import FlowerRunConfig, run_server

    monkeypatch.setattr(encrypt_pool, "MIN_ENCRYPTIONS_PER_WORKER", 1)
    started = []
    init = encrypt_pool.EncryptionPool.__init__

    def record(self, contexts, layout, workers):
        init(self, contexts, layout, workers)
        started.append(workers)

    monkeypatch.setattr(encrypt_pool.EncryptionPool, "__init__", record)
    out = tmp_path / "out"
    nodes = [
        {"partition-id": c, "num-partitions": CLIENTS, "output-dir": str(out / f"client{c}")}
        | ({"encrypt-workers": 2} if c == 0 else {})
        for c in range(CLIENTS)
    ]
    run_config = {**RUN_CONFIG, "output-dir": str(out / "server")}
    grid = _InProcessGrid(run_config, nodes)
    run_server(grid, FlowerRunConfig.from_run_config(run_config))  # type: ignore[arg-type]
    assert started == [2]  # node 0 only
    check_flower_run(fed, training_reference, *_read_outputs(out))


def test_a_windowed_pretraining_runs_on_flower(fed, training_reference, tmp_path):
    """``upload-window=1`` in the run config: the server grants uploads one recipient at a time and
    the nodes follow; the run is the in-process windowed round message for message (grants
    included), and trains as the run without a window."""
    from fedgat.pipeline import run_encrypted_pretraining
    from fedgat.protocols.flower_app import FlowerRunConfig, run_server

    windowed = run_encrypted_pretraining(
        fed.graph, fed.partition, seed=fed.seed, progress=False, workers=0, upload_window=1
    )
    assert windowed.messages_down > reference(fed).pretrain.messages_down  # the grants
    out = tmp_path / "out"
    nodes = [
        {"partition-id": c, "num-partitions": CLIENTS, "output-dir": str(out / f"client{c}")}
        for c in range(CLIENTS)
    ]
    run_config = {**RUN_CONFIG, "output-dir": str(out / "server"), "upload-window": 1}
    grid = _InProcessGrid(run_config, nodes)
    run_server(grid, FlowerRunConfig.from_run_config(run_config))  # type: ignore[arg-type]
    summary, encodings, weights = _read_outputs(out)
    assert summary["pretrain"]["upload_window"] == 1
    check_flower_run(fed, training_reference, summary, encodings, weights, want=windowed)


@pytest.mark.parametrize("bad", [-1, "-2"])
def test_a_negative_upload_window_is_refused(bad):
    from fedgat.protocols.flower_app import FlowerRunConfig

    with pytest.raises(ValueError, match="upload-window"):
        FlowerRunConfig.from_run_config({"upload-window": bad})


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_node_refuses_a_bad_upload_window(bad):
    from fedgat.protocols.flower_client import RemotePartyError, _upload_window

    with pytest.raises(RemotePartyError, match="upload_window"):
        _upload_window(bad)
    assert _upload_window(None) is None and _upload_window(3) == 3


@pytest.mark.parametrize(("given", "want"), [(3, 3), ("2", 2), (0, 0)])
def test_a_node_reads_encrypt_workers(given, want):
    from types import SimpleNamespace

    from fedgat.protocols.flower_client import _encrypt_workers

    assert _encrypt_workers(SimpleNamespace(node_config={"encrypt-workers": given})) == want  # type: ignore[arg-type]
    assert _encrypt_workers(SimpleNamespace(node_config={})) == 0  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, "two", True, 2.7, float("inf"), "-1"])
def test_a_node_refuses_a_bad_encrypt_workers(bad):
    from types import SimpleNamespace

    from fedgat.protocols.flower_client import RemotePartyError, _encrypt_workers

    with pytest.raises(RemotePartyError, match="encrypt-workers"):
        _encrypt_workers(SimpleNamespace(node_config={"encrypt-workers": bad}))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("node", "hp", "want"),
    [
        ({}, {"fraction": 1.0}, 3),
        ({"min-cohort": "3"}, {"fraction": 1.0}, 3),
        ({"secure-aggregation": "allow-plaintext"}, {"fraction": 0.5}, None),
        ({"max-update-epsilon": 8}, {"fraction": 1.0, "update_dp_epsilon": 4.0}, 3),
        ({"max-update-epsilon": "8"}, {"fraction": 1.0, "update_dp_epsilon": 8.0}, 3),
        (
            {"max-update-epsilon": 4, "max-update-delta": "1e-3"},
            {"fraction": 1.0, "update_dp_epsilon": 4.0},
            3,
        ),
    ],
)
def test_a_nodes_training_policy(node, hp, want):
    from types import SimpleNamespace

    from fedgat.methods import resolve_hparams
    from fedgat.protocols.flower_client import _training_policy

    hp = resolve_hparams("fedgat", {"rounds": 10, **hp})
    got = _training_policy(0, SimpleNamespace(node_config=node), hp, CLIENTS)  # type: ignore[arg-type]
    assert (got and got.min_cohort) == want


@pytest.mark.parametrize(
    ("node", "hp", "message"),
    [
        (
            {},
            {"fraction": 0.5},
            r"samples 2 of 3 clients per round \(fraction 0.5\), below this node's cohort minimum of 3",
        ),
        ({"min-cohort": 4}, {"fraction": 1.0}, "below this node's cohort minimum of 4"),
        ({"min-cohort": 2}, {"fraction": 1.0}, "min-cohort must be a count >= 3, got 2"),
        (
            {"secure-aggregation": "off"},
            {"fraction": 1.0},
            "secure-aggregation must be one of required, allow-plaintext",
        ),
        (
            {"max-update-epsilon": 8},
            {"fraction": 1.0},
            r"update_dp_epsilon=None at update_dp_delta=1e-05, which is epsilon inf at delta 1e-05",
        ),
        ({"max-update-epsilon": 8}, {"fraction": 1.0, "update_dp_epsilon": 9.0}, "which is epsilon 9 at"),
        # a red-team review: a large delta bought a small stated epsilon with 37x less noise
        (
            {"max-update-epsilon": 1},
            {"fraction": 1.0, "update_dp_epsilon": 1.0, "update_dp_delta": 0.5},
            r"update_dp_delta=0.5, which is epsilon \d+(\.\d+)? at delta 1e-05",
        ),
        (
            {"max-update-epsilon": "many"},
            {"fraction": 1.0},
            r"max-update-epsilon must be a number in \(0, inf\)",
        ),
        ({"max-update-epsilon": 0}, {"fraction": 1.0}, r"max-update-epsilon must be a number in \(0, inf\)"),
        (
            {"max-update-epsilon": 8, "max-update-delta": 1.5},
            {"fraction": 1.0, "update_dp_epsilon": 1.0},
            r"max-update-delta must be a number in \(0, 1\)",
        ),
        # DP-FedAvg's noise shares add up only in a secure sum, whatever the node allows
        (
            {"secure-aggregation": "allow-plaintext"},
            {"fraction": 0.5, "update_dp_epsilon": 8.0},
            "under DP-FedAvg: DP-FedAvg needs secure aggregation",
        ),
    ],
)
def test_a_node_refuses_what_its_policy_does_not_allow(node, hp, message):
    from types import SimpleNamespace

    from fedgat.methods import resolve_hparams
    from fedgat.protocols.flower_app import NodePolicyError
    from fedgat.protocols.flower_client import _training_policy

    hp = resolve_hparams("fedgat", {"rounds": 10, **hp})
    with pytest.raises(NodePolicyError, match=message):
        _training_policy(0, SimpleNamespace(node_config=node), hp, CLIENTS)  # type: ignore[arg-type]


class _UpdateCounter(_InProcessGrid):
    """An in-process grid that counts the training frames the clients send the server, by type."""

    def __init__(self, run_config: dict, node_configs: list[dict]) -> None:
        super().__init__(run_config, node_configs)
        self.types: dict[str, int] = {}

    def pull_messages(self, ids):
        from fedgat.protocols.flower_wire import message_frames
        from fedgat.protocols.messages import decode_message

        replies = super().pull_messages(ids)
        for reply in replies:
            for frame in message_frames(reply):
                name = type(decode_message(frame)).__name__
                self.types[name] = self.types.get(name, 0) + 1
        return replies


def test_the_run_config_cannot_turn_secure_aggregation_off():
    """The run config is the server operator's: hyper-parameters that sample fewer clients per round
    than the cohort minimum used to send every client's update in the clear (red-team review,
    2026-11-27). Clients refuse the run before training, unless their node config allows
    plaintext, and only then does the server see individual updates."""
    from fedgat.protocols.flower_app import FlowerRunConfig, NodePolicyError, run_server

    run_config = {**RUN_CONFIG, "hparams": json.dumps({**HPARAMS, "rounds": 1, "fraction": 0.5})}
    nodes = [{"partition-id": c, "num-partitions": CLIENTS} for c in range(CLIENTS)]
    grid = _UpdateCounter(run_config, nodes)
    with pytest.raises(
        NodePolicyError, match="its updates would reach the server without secure aggregation"
    ):
        run_server(grid, FlowerRunConfig.from_run_config(run_config))  # type: ignore[arg-type]
    assert grid.types.get("LocalUpdate", 0) == 0
    allowing = [{**n, "secure-aggregation": "allow-plaintext"} for n in nodes]
    grid = _UpdateCounter(run_config, allowing)
    run_server(grid, FlowerRunConfig.from_run_config(run_config))  # type: ignore[arg-type]
    assert grid.types.get("LocalUpdate", 0) == 2  # one round, 2 of 3 clients: the reference case


@pytest.mark.parametrize(
    ("node", "preset", "message"),
    [
        ({}, "n4096", None),
        ({"max-verdict-epsilon": 0.03}, "n8192", None),
        ({"max-verdict-epsilon": "2"}, "n4096", None),
        ({"max-verdict-epsilon": 0.03}, "n4096", r"cost up to epsilon 0\.72\d* .*this node allows 0\.03"),
        ({"max-verdict-epsilon": 0.03}, "n8192-small", "this node allows 0.03"),
        ({"max-verdict-epsilon": "few"}, "n8192", r"max-verdict-epsilon must be a number in \(0, inf\)"),
        ({"verdict-budget": 1.0}, "n4096", "verdict-budget needs verdict-ledger"),
    ],
)
def test_a_nodes_verdict_policy(node, preset, message, tmp_path):
    """Known break 22: the server's set-up chooses the preset, hence the pads' sigma; a node's own
    config bounds what a session's verdicts may cost its rows (``max-verdict-epsilon``, counted as
    every row to each of the 2 other clients), whatever the server asks (a seventeenth review pass:
    a node that wanted n8192 was given n4096 and 216x the epsilon)."""
    from types import SimpleNamespace

    from fedgat.protocols import PretrainConfig
    from fedgat.protocols.flower_app import NodePolicyError
    from fedgat.protocols.flower_client import _verdict_policy

    config = PretrainConfig(session=1, preset=preset)
    roster = SimpleNamespace(clients=[0, 1, 2])
    context = SimpleNamespace(node_config=node)
    if message is None:
        assert _verdict_policy(0, context, config, roster) is None  # type: ignore[arg-type]
    else:
        with pytest.raises(NodePolicyError, match=message):
            _verdict_policy(0, context, config, roster)  # type: ignore[arg-type]
    ledger = _verdict_policy(  # type: ignore[arg-type]
        0,
        SimpleNamespace(node_config={"verdict-ledger": str(tmp_path / "l.json"), "verdict-budget": "3"}),
        config,
        roster,
    )
    assert ledger is not None and ledger.budget.epsilon == 3.0 and ledger.budget.delta == 1e-5


@pytest.mark.parametrize("policy", ["max-verdict-epsilon", "verdict-ledger"])
def test_a_node_refuses_a_pretraining_its_verdict_policy_does_not_allow(policy, tmp_path):
    """End to end on the in-process grid: nodes that allow less than the session's verdicts cost
    (the run's n4096 pads; or a ledger whose budget one session passes) refuse the set-up before
    they upload anything, and the refused charge leaves the ledger file unwritten."""
    from fedgat.protocols.flower_app import FlowerRunConfig, NodePolicyError, run_server

    ledger = tmp_path / "verdicts.json"
    extra = (
        {"max-verdict-epsilon": 0.03}
        if policy == "max-verdict-epsilon"
        else {"verdict-ledger": str(ledger), "verdict-budget": 0.1}
    )
    nodes = [{"partition-id": c, "num-partitions": CLIENTS, **extra} for c in range(CLIENTS)]
    grid = _UpdateCounter(RUN_CONFIG, nodes)
    with pytest.raises(
        NodePolicyError, match="max-verdict-epsilon" if policy == "max-verdict-epsilon" else "budget"
    ):
        run_server(grid, FlowerRunConfig.from_run_config(RUN_CONFIG))  # type: ignore[arg-type]
    assert grid.types.get("FeatureUpload", 0) == 0 and not ledger.exists()


@pytest.mark.parametrize(
    ("node", "hp", "message"),
    [
        ({"update-budget": 8}, {"update_dp_epsilon": 4.0}, "update-budget needs update-ledger"),
        ({"update-ledger": "{path}"}, {"update_dp_epsilon": 4.0}, "needs the owner's budget"),
        ({"update-ledger": "{path}", "update-budget": 8}, {}, "trains without DP-FedAvg"),
        (
            {"update-ledger": "{path}", "update-budget": "a lot"},
            {"update_dp_epsilon": 4.0},
            "update-budget must",
        ),
        (
            {"update-ledger": "{path}", "update-budget": 8, "update-budget-delta": 2},
            {"update_dp_epsilon": 4.0},
            r"update-budget-delta must be a number in \(0, 1\)",
        ),
        # an eighteenth review pass: one file for both would let neither charge see the other
        (
            {"update-ledger": "{path}", "update-budget": 8, "verdict-ledger": "{path}"},
            {"update_dp_epsilon": 4.0},
            "update-ledger and verdict-ledger name one file",
        ),
    ],
)
def test_a_nodes_update_ledger_refuses_what_it_cannot_account(node, hp, message, tmp_path):
    """A node's ``update-ledger`` needs a budget to start, and refuses a run whose updates carry no
    DP-FedAvg noise; nothing is written."""
    from types import SimpleNamespace

    from fedgat.methods import resolve_hparams
    from fedgat.protocols.flower_app import NodePolicyError
    from fedgat.protocols.flower_client import _update_policy

    path = tmp_path / "updates.json"
    node = {k: (str(path) if v == "{path}" else v) for k, v in node.items()}
    hp = resolve_hparams("fedgat", {"rounds": 10, "fraction": 1.0, **hp})
    with pytest.raises(NodePolicyError, match=message):
        _update_policy(0, SimpleNamespace(node_config=node), hp)  # type: ignore[arg-type]
    assert not path.exists()


def test_a_nodes_update_ledger_adds_up_the_runs_a_server_starts(tmp_path):
    """An eighth review pass: ``max-update-epsilon`` bounds one run, and a server could start any
    number of runs, each with a fresh DP-FedAvg budget. With ``update-ledger`` every run's releases
    are charged to the node's whole dataset before it trains: a budget of 6 admits one run at
    epsilon 4, then refuses the next (two compose to 5.99), whatever ``max-update-epsilon`` allows,
    and leaves the file as it was."""
    from types import SimpleNamespace

    from fedgat.dp_fedavg import UPDATE_UNIT
    from fedgat.dp_ledger import DPLedger
    from fedgat.methods import resolve_hparams
    from fedgat.protocols.flower_app import NodePolicyError
    from fedgat.protocols.flower_client import _training_policy, _update_policy

    path = tmp_path / "updates.json"
    node = {"update-ledger": str(path), "update-budget": "5.9", "max-update-epsilon": 4}
    context = SimpleNamespace(node_config=node)
    hp = resolve_hparams("fedgat", {"rounds": 10, "fraction": 1.0, "update_dp_epsilon": 4.0})
    assert _training_policy(0, context, hp, CLIENTS) is not None  # type: ignore[arg-type]
    _update_policy(0, context, hp)  # type: ignore[arg-type]
    spent = DPLedger(None, path).spent(UPDATE_UNIT)[0]
    assert spent == pytest.approx(4.0, rel=1e-3)
    written = path.read_bytes()
    assert _training_policy(0, context, hp, CLIENTS) is not None  # type: ignore[arg-type]
    with pytest.raises(NodePolicyError, match=r"would bring it to 5\.99\d* at delta 1e-05, over the budget"):
        _update_policy(0, context, hp)  # type: ignore[arg-type]
    assert path.read_bytes() == written


def test_a_node_refuses_the_training_its_update_ledger_cannot_pay_for(tmp_path):
    """End to end on the in-process grid: nodes whose update ledger a run of DP-FedAvg would pass
    refuse at the rounds' set-up, after the pre-training, before any training frame leaves them;
    the refused charge writes nothing."""
    from fedgat.protocols.flower_app import FlowerRunConfig, NodePolicyError, run_server

    hp = {**HPARAMS, "rounds": 1, "fraction": 1.0, "update_dp_epsilon": 4.0}
    run_config = {**RUN_CONFIG, "hparams": json.dumps(hp)}
    ledgers = [tmp_path / f"updates-{c}.json" for c in range(CLIENTS)]
    nodes = [
        {"partition-id": c, "num-partitions": CLIENTS, "update-ledger": str(ledgers[c]), "update-budget": 3}
        for c in range(CLIENTS)
    ]
    grid = _UpdateCounter(run_config, nodes)
    with pytest.raises(NodePolicyError, match="update-ledger: DP release refused"):
        run_server(grid, FlowerRunConfig.from_run_config(run_config))  # type: ignore[arg-type]
    from fedgat.protocols import messages_rounds, messages_secagg

    assert grid.types.get("FeatureUpload", 0) > 0  # the pre-training ran
    training = {n for m in (messages_rounds, messages_secagg) for n in dir(m) if n[0].isupper()}
    assert not training & set(grid.types) and not any(p.exists() for p in ledgers)


def test_a_run_sets_up_each_phase_once(tmp_path):
    """An eighteenth review pass: within one Flower run a server repeated the pre-training and the
    training, and each training phase built a fresh DP-FedAvg budget (4 releases per node where
    ``max-update-epsilon`` 4 pays for 2: epsilon 5.99). A node now sets up each phase once per run:
    the server's second pre-training is refused before anything is uploaded, and no training frame
    follows it."""
    from fedgat.protocols.flower_app import FlowerRunConfig, NodePolicyError, generate_identity, run_server

    generate_identity(tmp_path / "server.json")
    hp = {**HPARAMS, "rounds": 1, "fraction": 1.0, "update_dp_epsilon": 4.0}
    run_config = {**RUN_CONFIG, "hparams": json.dumps(hp), "server-identity": str(tmp_path / "server.json")}
    nodes = [{"partition-id": c, "num-partitions": CLIENTS, "max-update-epsilon": 4} for c in range(CLIENTS)]
    grid = _UpdateCounter(run_config, nodes)
    cfg = FlowerRunConfig.from_run_config(run_config)
    run_server(grid, cfg)  # type: ignore[arg-type]
    first = dict(grid.types)
    with pytest.raises(NodePolicyError, match="already set up its pretrain phase"):
        run_server(grid, cfg)  # type: ignore[arg-type]
    assert grid.types == first  # nothing uploaded, nothing trained


def test_the_app_config_lists_every_run_config_key_with_its_default():
    """pyproject's ``[tool.flwr.app.config]`` (what ``flwr run`` starts from) names every field of
    :class:`FlowerRunConfig`, each with the field's default."""
    import dataclasses
    import tomllib

    from fedgat.protocols.flower_app import FlowerRunConfig

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    defaults = FlowerRunConfig()
    want = {f.name.replace("_", "-"): getattr(defaults, f.name) for f in dataclasses.fields(FlowerRunConfig)}
    assert config == want
