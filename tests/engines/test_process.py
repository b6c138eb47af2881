"""The conformance checks over the process engine (4 clients hosted in 2 spawned worker processes), and
what is particular to it: bytes only (no pickle after start-up, on either side), a worker that dies or
stops answering surfaces as a typed error (never a hang) and costs only a fresh pool, bad input is
refused with a typed error and changes nothing, cheap worker start-up (no torch until a party needs
it), and the CLI wiring."""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
from multiprocessing import reduction

import pytest

from fedgat.app import build_pretrain_parties
from fedgat.pipeline import drive, max_abs_error, run_encrypted_pretraining
from fedgat.process_worker import WireError, WorkerLoop, decode, encode
from fedgat.protocols import InProcessTransport, MissingPartyError, ServerState, Transcript
from fedgat.protocols.hosting import MAX_FRAME_BYTES, FrameSizeError
from fedgat.protocols.pretrain import PretrainTimeouts
from fedgat.protocols.process_engine import (
    ProcessEngine,
    ProcessEngineError,
    ProcessTransport,
    WorkerDiedError,
    WorkerTimeoutError,
)

from .conformance import (
    ENCODING_ATOL,
    check_deadlines,
    check_pretraining,
    check_rejection,
    check_training,
    federation,
    reference,
)

pytestmark = pytest.mark.timeout(300)  # a hang is a failure here, not a stuck suite


@pytest.fixture(scope="module")
def engine():
    with ProcessEngine(2, forbid_pickle=True) as eng:
        yield eng


def _refuse_pickle(monkeypatch):
    """Every pickle entry point of this process raises (the workers do the same: forbid_pickle)."""

    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used on the hosted path")

    for name in ("dumps", "loads", "dump", "load"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(reduction.ForkingPickler, "dumps", refuse)
    monkeypatch.setattr(reduction.ForkingPickler, "loads", refuse)


# ------------------------------------------------------------------------------ conformance
def test_pretraining_conforms_without_pickle(engine, monkeypatch):
    engine.ensure_workers(4)  # start-up pickles (multiprocessing's bootstrap), nothing after it does
    _refuse_pickle(monkeypatch)
    transports: list[ProcessTransport] = []

    def make() -> ProcessTransport:
        transports.append(engine.transport(transcript=Transcript(keep_payloads=False)))
        return transports[-1]

    result = check_pretraining(make)  # the server computes in this process (workers=0): no pool
    transport = transports[0]
    # every frame was routed by the coordinator, as bytes, and the transcript saw each one
    assert len(transport.transcript) == transport.messages_sent()
    assert result.messages_up + result.messages_down == transport.messages_sent()
    assert result.phases["decrypt"] > 0  # the hosted clients' own clocks came back in their reports
    memory = engine.memory()
    assert [m["parties"] for m in memory] == [0, 0]  # reported and dropped
    assert all(m["torch_loaded"] and m["cpu_seconds"] > 0 for m in memory)
    assert len({m["pid"] for m in memory} | {os.getpid()}) == 3  # clients ran in two other processes


def test_hosted_clients_report_their_decryptions_while_they_run(engine):
    """A hosted client's twin learns its decryption counters after each batch of frames its host
    answers (what the progress bars read), not only from the report at the end: the observer sees
    decryptions counted before the run is over, and never more than the end's."""
    fed = federation()
    parties = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0)
    clients = parties.clients.values()
    seen: list[int] = []

    def observe(event, party_id, delivery, out) -> None:
        seen.append(sum(c.nodes_decrypted for c in clients))

    drive(engine.transport(), parties.all(), observer=observe)
    final = sum(c.nodes_decrypted for c in clients)
    assert final > 0 and 0 < max(seen) <= final
    assert seen == sorted(seen)  # counters only grow
    # the bar's total: nodes with a foreign partial, which is what the decryptions reach
    assert sum(c.nodes_to_decrypt for c in clients) == final
    local = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0)
    drive(InProcessTransport(), local.all())
    assert [c.nodes_to_decrypt for c in local.clients.values()] == [c.nodes_decrypted for c in clients]
    assert final < sum(len(c.needed) for c in clients)  # some needed nodes have no foreign partial


def test_a_windowed_round_runs_on_processes(engine):
    """Uploads paced one recipient at a time (``upload_window=1``): the hosted clients follow the
    grants and take their results while they still upload; the spool never holds the round."""
    fed = federation()
    ref = reference(fed)
    got = run_encrypted_pretraining(
        fed.graph,
        fed.partition,
        seed=fed.seed,
        transport=engine.transport(),
        progress=False,
        workers=0,
        upload_window=1,
    )
    assert max_abs_error(got.encodings, ref.plaintext) <= ENCODING_ATOL
    assert got.ciphertexts_up == ref.pretrain.ciphertexts_up
    assert got.ciphertexts_down == ref.pretrain.ciphertexts_down
    assert 0 < got.peak_spooled_bytes < ref.pretrain.peak_spooled_bytes
    # the hosted clients' copies hold no key, yet the result knows each client has its own
    assert got.shared_secret_key is False and got.server_has_secret_key is False


def test_take_progress_refuses_counters_a_party_does_not_keep():
    fed = federation()
    parties = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0)
    client = next(iter(parties.clients.values()))
    with pytest.raises(ValueError, match="unexpected progress counters"):
        client.take_progress({"nodes_decrypted": 1})
    with pytest.raises(ValueError, match="counts no progress"):
        parties.server.take_progress({"nodes_decrypted": 1})
    assert parties.server.progress() == {} and client.nodes_decrypted == 0


def test_training_conforms(engine):
    check_training(engine.transport)


def test_rejection_surfaces_typed(engine):
    check_rejection(engine.transport)
    assert [m["parties"] for m in engine.memory()] == [0, 0]  # the workers dropped their parties
    assert engine.pool_starts == 1  # a protocol error costs no new pool


def test_stalls_end_at_the_deadlines(engine):
    """The coordinator's manual clock reaches the workers: the hosted clients' deadlines fire there."""
    check_deadlines(engine.transport)


def test_a_dp_release_runs_on_processes_without_pickle(engine, monkeypatch):
    """A DP run with every client in a worker: label_rr's predictor rounds, the encrypted pre-training
    round that uploads the release (the predictor travels in the clients' specs), the FedAvg rounds."""
    from fedgat.dp_ledger import Budget, DPLedger
    from fedgat.pipeline import run_encrypted_fedgat

    fed = federation()
    engine.ensure_workers(4)
    _refuse_pickle(monkeypatch)
    ledgers = {c: DPLedger(Budget(8.0, 1e-5)) for c in range(4)}
    run = run_encrypted_fedgat(
        fed.graph,
        4,
        1.0,
        fed.seed,
        transport=engine.transport(),
        progress=False,
        workers=0,
        dp_ledgers=ledgers,
        dp_epsilon=4.0,
        dp_predictor_rounds=2,
        rounds=2,
    )
    assert run.pretrain is not None and run.training.fit.rounds == 2
    assert run.dp_spent and all(0 < eps <= 4.0 + 1e-6 for eps, _ in run.dp_spent.values())
    assert [m["parties"] for m in engine.memory()] == [0, 0]  # reported and dropped


def test_secrets_stay_in_the_worker(engine):
    """Clients that absorbed their hosted twins' reports carry results, not key material."""
    fed = federation()
    parties = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0)
    drive(engine.transport(), parties.all())
    for client in parties.clients.values():
        assert client.done and client.encodings is not None
        assert client.holder is None  # the CKKS secret context never left its worker
    # what each reported of its key is the key the server loaded from its announce: one per client
    reported = {c: client.key_fingerprint for c, client in parties.clients.items()}
    assert reported == {c: ctx.fingerprint() for c, ctx in parties.server.contexts.items()}
    assert len(set(reported.values())) == len(reported)


# ------------------------------------------------------------------------------ failures
def _run_with(engine: ProcessEngine, act, parties=None) -> None:
    """A pre-training run of ``parties`` (default: fresh ones of :func:`federation`) over ``engine``
    whose observer calls ``act(worker pids)`` once, at the first frame delivered to a hosted party."""
    if parties is None:
        fed = federation()
        parties = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0)
    done = []

    def observer(event, pid, delivery, out):
        if not done and event == "deliver" and pid != parties.server.party_id:
            done.append(True)
            act([w.process.pid for w in engine.workers])

    engine.transport().run_parties(parties.all(), observer=observer)


def test_a_killed_worker_is_a_typed_error_then_a_fresh_pool():
    with ProcessEngine(2) as engine:
        with pytest.raises(
            WorkerDiedError, match=r"process worker 1 \(pid \d+\) was killed by SIGKILL"
        ) as info:
            _run_with(engine, lambda pids: os.kill(pids[1], signal.SIGKILL))
        assert any("it hosted parties [2, 3]" in note for note in info.value.__notes__)
        assert engine.workers == []  # the pool was out of step: stopped
        assert [m["parties"] for m in engine.memory()] == []
        engine.ensure_workers(2)  # the next run starts a fresh pool
        assert [m["parties"] for m in engine.memory()] == [0, 0] and engine.pool_starts == 2


def test_death_and_silence_mid_call_are_typed_errors():
    """The engine's own liveness checks, without parties (no torch): a worker killed while a call is
    in flight is WorkerDiedError, one that stops answering is WorkerTimeoutError at its deadline."""
    with ProcessEngine(2, call_timeout=1.0) as engine:
        a, b = (w.process.pid for w in engine.ensure_workers(2))
        os.kill(a, signal.SIGSTOP)  # so that the call is surely in flight when the worker dies
        engine.call(0, "memory")
        os.kill(a, signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match=r"worker 0 .* killed by SIGKILL while answering 'memory'"):
            engine.result(0)
        os.kill(b, signal.SIGSTOP)
        engine.call(1, "memory")
        with pytest.raises(WorkerTimeoutError, match=r"worker 1 .* has not answered 'memory' within 1 s"):
            engine.result(1)
        engine.recover()  # out of step: the pool is stopped (the stopped worker killed and reaped)
        assert engine.workers == []
        with pytest.raises(ProcessLookupError):
            os.kill(b, 0)


@pytest.mark.slow
def test_a_stopped_worker_mid_run_is_a_timeout_not_a_hang():
    with ProcessEngine(2, call_timeout=3.0) as engine:
        with pytest.raises(WorkerTimeoutError, match=r"process worker 0 .* within 3 s"):
            _run_with(engine, lambda pids: os.kill(pids[0], signal.SIGSTOP))
        assert engine.workers == []


@pytest.mark.slow
def test_deadlines_fire_while_a_worker_call_is_in_flight():
    """Real time: while a stopped worker's call is in flight the coordinator waits no longer than the
    server's deadline (2 s), so the server gives up, naming that worker's clients among the missing,
    before the call's own deadline (8 s) ends the run with a WorkerTimeoutError. (The other worker's
    clients may be missing too on a loaded machine: 2 s is short.)"""
    fed = federation()
    parties = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0)
    parties.server.timeouts = PretrainTimeouts(keys=2.0, upload=2.0)
    with (
        ProcessEngine(2, call_timeout=8.0) as engine,
        pytest.raises(WorkerTimeoutError, match=r"process worker 0 .* within 8 s"),
    ):
        _run_with(engine, lambda pids: os.kill(pids[0], signal.SIGSTOP), parties)
    err = parties.server.failure  # the stop lands during the keys or the upload phase
    assert isinstance(err, MissingPartyError) and err.phase in ("keys", "upload")
    assert {0, 1} <= set(err.missing) and parties.server.state is ServerState.ABORTED  # worker 0's


def test_oversized_frame_is_refused_before_it_is_counted():
    transport = ProcessEngine(1).transport(max_frame_bytes=1024)
    assert (
        transport.max_frame_bytes == 1024
        and ProcessTransport.__init__.__kwdefaults__["max_frame_bytes"] == MAX_FRAME_BYTES
    )
    transport._send(0, 1, b"x" * 1024)  # at the limit: carried
    before = (dict(transport.traffic), transport._pending, len(transport._queue))
    with pytest.raises(FrameSizeError, match="1025 bytes from party 0 to party 1"):
        transport._send(0, 1, b"x" * 1025)
    with pytest.raises(TypeError):
        transport._send(0, 1, "not bytes")  # type: ignore[arg-type]
    assert (dict(transport.traffic), transport._pending, len(transport._queue)) == before


def test_a_bad_request_is_refused_and_changes_nothing(engine):
    fed = federation()
    parties = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0)
    engine.ensure_workers(2)
    engine.call(0, "place", {1: parties.clients[1].spec().to_bytes()})
    assert engine.result(0)["parties"] == [1]
    with pytest.raises(ProcessEngineError, match="unknown operation 'no-such-op'"):
        engine.result(engine.call(0, "no-such-op"))
    with pytest.raises(TypeError):  # wrong arguments for a real operation: a builtin, rebuilt as such
        engine.result(engine.call(0, "deliver"))
    assert engine.gather("memory")[0]["parties"] == 1  # still hosting its party, still in step
    engine.call(0, "reset")
    engine.result(0)


# ------------------------------------------------------------------------------ worker and wire
def test_wire_round_trip_and_refusals():
    value = {"op": "deliver", "args": [[[0, 3, b"\x00frame"], [3, 0, b""]], True, {7: b"spec", -1: None}]}
    value["args"].append({"nested": [1.5, "s", None, False, {2: [b"x"]}]})
    assert decode(encode(value)) == value
    assert decode(encode((1, (2, b"y")))) == [1, [2, b"y"]]  # tuples cross as lists
    for bad in ({"$b": 1}, {1: 2, "a": 3}, object(), {True: 1}, {"a": {1.5: 0}}):
        with pytest.raises(TypeError):
            encode(bad)
    good = encode({"a": b"xyz"})
    for broken in (b"", good[:6], b"XXXX" + good[4:], good[:-1], good + b"!", good[:8] + b"x" + good[9:]):
        with pytest.raises(WireError):
            decode(broken)
    forged = encode({"ab": 1}).replace(b'"ab":1', b'"$b":9')  # a reference to a blob that is not there
    with pytest.raises(WireError, match="missing blob"):
        decode(forged)


def test_worker_loop_refuses_bad_requests_and_changes_nothing():
    loop = WorkerLoop(threads=None)
    for request in (b"garbage", encode({"op": "eval", "args": []}), encode({"op": "ping"}), encode([1, 2])):
        answer = decode(loop.handle(request))
        assert answer["ok"] is False and answer["error"]["type"] == "WireError"
        assert loop.host is None  # nothing was built, nothing imported
    assert decode(loop.handle(encode({"op": "ping", "args": []})))["ok"] is True


def test_worker_starts_without_torch():
    """Start-up imports the standard library and fedgat.process_worker only (the import of the module
    itself, measured in a fresh interpreter); a worker pool answers its first ping in seconds."""
    import subprocess

    code = "import sys, fedgat.process_worker; print(sorted(m for m in ('torch', 'tenseal', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    with ProcessEngine(2) as engine:
        engine.ensure_workers(2)
        assert [m["torch_loaded"] for m in engine.memory()] == [False, False]
        assert engine.start_seconds > 0


def test_engine_arguments_are_checked():
    with pytest.raises(ValueError, match="workers must be >= 1"):
        ProcessEngine(0)
    with pytest.raises(ValueError, match="start_method"):
        ProcessEngine(start_method="fork")
    engine = ProcessEngine(1)
    engine.shutdown()
    with pytest.raises(ProcessEngineError, match="shut down"):
        engine.ensure_workers(1)


def test_engine_modules_import_no_pickle():
    import ast
    import inspect

    from fedgat import process_worker
    from fedgat.protocols import hosting, process_engine

    for module in (process_worker, process_engine, hosting):
        tree = ast.parse(inspect.getsource(module))
        names = {
            a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names
        }
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        # process_worker imports pickle only to forbid it (forbid_pickle)
        allowed = {"pickle"} if module is process_worker else set()
        assert {n for n in names if "pickle" in n} <= allowed, module.__name__


# ------------------------------------------------------------------------------ CLI
def test_cli_opens_a_process_engine():
    import argparse

    from fedgat.cli import main
    from fedgat.cli_engine import UsageError, open_engine

    args = argparse.Namespace(engine="process", actors=3, address=None, threads=2)
    engine = open_engine(args, "demo")
    assert isinstance(engine, ProcessEngine) and engine.requested_workers == 3 and engine.threads == 2
    assert engine.workers == []  # started by the first run, not before
    engine.shutdown()
    with pytest.raises(UsageError, match="--address needs --engine ray"):
        open_engine(argparse.Namespace(engine="process", actors=None, address="auto", threads=1), "demo")
    assert main(["demo", "--dataset", "synthetic", "--engine", "process", "--actors", "0"]) == 2


def test_auto_engine_spreads_only_rounds_worth_it():
    from fedgat.cli_engine import AUTO_PROCESS_MIN_SECONDS, resolve_engine

    # Cora at 10 clients: 47,946 encryptions + 235,788 decryptions, ~200 s on one core (estimate)
    assert resolve_engine("auto", 202.5, cores=2) == "process"
    assert resolve_engine("auto", 202.5, cores=1) == "inprocess"  # nothing to spread over
    assert resolve_engine("auto", AUTO_PROCESS_MIN_SECONDS / 2, cores=16) == "inprocess"
    assert resolve_engine("inprocess", 1e6, cores=16) == "inprocess"  # an explicit choice stands
    assert resolve_engine("process", 0.0, cores=1) == "process"


def test_demo_auto_stays_in_process_on_a_small_graph(tmp_path):
    """The tests' demos keep the in-process transport: their rounds are far below the threshold."""
    from fedgat.cli import main

    out = tmp_path / "demo.json"
    argv = ["demo", "--dataset", "synthetic", "--nodes", "60", "--clients", "3", "--rounds", "1"]
    assert main([*argv, "--json", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text())["engine"] == "inprocess"


@pytest.mark.slow
def test_demo_and_train_cli_on_processes(tmp_path, capsys):
    from fedgat.cli import main

    out = tmp_path / "demo.json"
    argv = ["demo", "--dataset", "synthetic", "--nodes", "60", "--clients", "3", "--rounds", "2"]
    argv += ["--patience", "2", "--engine", "process", "--actors", "2", "--json", str(out), "--quiet"]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["engine"] == "process" and report["actors"] == 2
    assert report["server_has_secret_key"] is False and report["max_abs_error_vs_plaintext"] <= 1e-5
    assert "engine process: clients in 2 worker process(es)" in capsys.readouterr().out
    out = tmp_path / "train.json"
    argv = ["train", "--dataset", "synthetic", "--clients", "3", "--rounds", "2", "--engine", "process"]
    assert main([*argv, "--json", str(out), "--quiet"]) == 0
    summary = json.loads(out.read_text())
    assert summary["rows"][0]["rounds"] == 2 and 0.0 <= summary["test_accuracy_mean"] <= 1.0


def test_a_script_without_the_main_guard_is_told_to_add_it(tmp_path):
    """A script that starts a process engine at its top level: each worker re-imports it while starting
    and dies in multiprocessing's bootstrapping check; the coordinator's error says what to do."""
    import subprocess

    start = "engine = ProcessEngine(workers=1, threads=None, start_timeout=60)\nprint(len(engine.ensure_workers(1)))\n"
    scripts = {
        "unguarded": start + "engine.shutdown()\n",
        "guarded": 'if __name__ == "__main__":\n'
        + "".join(f"    {line}\n" for line in [*start.splitlines(), "engine.shutdown()"]),
    }
    runs = {}
    for name, body in scripts.items():
        path = tmp_path / f"{name}.py"
        path.write_text("from fedgat.protocols.process_engine import ProcessEngine\n" + body)
        runs[name] = subprocess.run(
            [sys.executable, str(path)], check=False, capture_output=True, text=True, timeout=120
        )
    bad, ok = runs["unguarded"], runs["guarded"]
    assert bad.returncode != 0
    assert "WorkerDiedError" in bad.stderr  # while answering 'ping', or before it got it
    assert 'so it must start engines only under `if __name__ == "__main__":`' in bad.stderr
    assert ok.returncode == 0 and ok.stdout.strip() == "1", ok.stderr
