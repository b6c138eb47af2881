"""The session's ciphertext wire (``PretrainConfig.wire``): both wires run the same round, a party
configured with another wire is refused at key set-up, and an envelope of the other wire is refused
by every party without changing its state."""

from __future__ import annotations

import dataclasses

import pytest
from fault_helpers import FaultyTransport

from fedgat.crypto import ServerContext
from fedgat.crypto.packing import envelope, tenseal_payload
from fedgat.pipeline import max_abs_error, run_plaintext_pretraining
from fedgat.protocols import PretrainConfig, Transcript, decode_message
from fedgat.protocols.errors import ConfigMismatchError, PayloadError
from fedgat.protocols.messages import (
    EncodingResults,
    FeatureUpload,
    KeyAnnounce,
    PublicContext,
    ResultItem,
    peek_type,
)
from fedgat.protocols.pretrain_values import config_from_value, config_to_value

from protocol_helpers import Harness, computing, keys_distributed, rejected

TOL = 1e-5
OTHER = {"compact": "tenseal", "tenseal": "compact"}


def _twin(ctx, wire: str) -> ServerContext:
    """``ctx``'s public key under the other wire: same fingerprint, other envelope version."""
    return ServerContext.from_bytes(ctx.public_context_bytes(), wire=wire)


def _rewire(ctx, blob: bytes, wire: str) -> bytes:
    """``blob`` (an envelope of ``ctx``'s wire) as a valid envelope of ``wire``: same key, level and
    ciphertext, a correct digest."""
    twin = _twin(ctx, wire)
    return envelope(twin, tenseal_payload(ctx, blob), blob[5])


# ---------------------------------------------------------------------------------- config
def test_the_config_validates_the_wire_and_keeps_it_as_a_value():
    assert PretrainConfig(session=1).wire == "compact"
    cfg = PretrainConfig(session=1, wire="tenseal")
    assert config_from_value(config_to_value(cfg)) == cfg
    legacy = config_to_value(PretrainConfig(session=1))
    del legacy["wire"]  # a value saved before the option: the compact wire, the only one then
    assert config_from_value(legacy).wire == "compact"
    for bad in ("zstd", "Compact", "", None):
        with pytest.raises(ValueError, match="unknown ciphertext wire"):
            PretrainConfig(session=1, wire=bad)  # type: ignore[arg-type]


def test_the_cli_lists_the_crypto_wires():
    from fedgat.cli_engine import WIRES as CLI_WIRES
    from fedgat.crypto import WIRES

    assert CLI_WIRES == WIRES


# ------------------------------------------------------------------------------ full round
def test_a_tenseal_wire_round_gives_the_compact_rounds_encodings(tiny_graph, tiny_partition):
    rounds = {w: Harness(tiny_graph, tiny_partition, wire=w).start().run() for w in ("compact", "tenseal")}
    got = {}
    for wire, h in rounds.items():
        assert all(p.done for p in h.parties.all().values())
        assert h.parties.config.wire == wire
        assert all(c.holder.wire == wire for c in h.parties.clients.values())
        assert all(ctx.wire == wire for ctx in h.server.contexts.values())
        uploads = h.sent(1, FeatureUpload)
        assert uploads and {item.ciphertext[4] for m in uploads for item in m.items} == {
            {"compact": 2, "tenseal": 1}[wire]
        }
        got[wire] = {c: h.client(c).encodings for c in h.roster.clients}
    want = run_plaintext_pretraining(tiny_graph, tiny_partition, "vector", seed=1)
    assert max_abs_error(got["compact"], want) <= TOL
    assert max_abs_error(got["tenseal"], want) <= TOL
    assert max_abs_error(got["tenseal"], got["compact"]) <= 2 * TOL
    # same plan, same ciphertext counts; the tenseal wire moves more bytes
    a, b = rounds["compact"].server, rounds["tenseal"].server
    assert a.ciphertexts_received == b.ciphertexts_received and a.nodes_computed == b.nodes_computed
    up = {
        w: sum(len(i.ciphertext) for m in h.sent(1, FeatureUpload) for i in m.items)
        for w, h in rounds.items()
    }
    assert 1.1 < up["tenseal"] / up["compact"] < 1.3


# --------------------------------------------------------------------------- key set-up
def test_a_party_configured_with_another_wire_is_refused_at_key_setup(tiny_graph, tiny_partition):
    """The server holds every PublicContext; one naming another wire is refused with a clear error
    and nothing changes (the genuine one is accepted afterwards); a client refuses a relayed one."""
    transport = FaultyTransport(Transcript())
    transport.rules.append(lambda s, r, data: "hold" if peek_type(data) == PublicContext.TYPE else None)
    h = Harness(tiny_graph, tiny_partition, transport=transport).start()
    h.run()
    server = h.server
    held = [decode_message(d) for s, r, d in transport.held if r == server.party_id]
    genuine = next(m for m in held if m.party == 1)
    assert genuine.wire == "compact"
    other = h.craft(1, PublicContext, server.party_id, **{**genuine.body(), "wire": "tenseal"})
    err = rejected(server, other, ConfigMismatchError, "'tenseal' ciphertext wire")
    assert "--wire" in str(err) and isinstance(err, PayloadError)
    with pytest.raises(PayloadError, match="unknown ciphertext wire"):  # checked on encode and decode
        h.craft(1, PublicContext, server.party_id, **{**genuine.body(), "wire": "zstd"})
    server.receive(h.craft(1, PublicContext, server.party_id, **genuine.body()))
    assert server.contexts[1].wire == "compact"
    # a client: the server relays client 1's context naming another wire (client 0 has its keys)
    client = h.client(0)
    client.receive(h.relay(h.sent(1, KeyAnnounce)[0], 0))
    assert 1 in client._peers and 1 not in client._peer_contexts
    rejected(client, h.relay(genuine, 0, wire="tenseal"), ConfigMismatchError, "wire")


def test_clients_configured_with_different_wires_do_not_start_the_round(tiny_graph, tiny_partition):
    h = Harness(tiny_graph, tiny_partition)
    c1 = h.client(1)
    c1.config = dataclasses.replace(c1.config, wire="tenseal")
    h.start()
    with pytest.raises(
        ConfigMismatchError, match="party 1 runs the session with the 'tenseal' ciphertext wire"
    ):
        h.run()
    assert not h.server.contexts.get(1)


# ------------------------------------------------------------------------ other envelopes
@pytest.mark.parametrize("wire", ["compact", "tenseal"])
def test_the_server_refuses_an_upload_in_the_other_wire(tiny_graph, tiny_partition, wire):
    h = Harness(tiny_graph, tiny_partition, wire=wire).start()
    h.run(until=lambda: keys_distributed(h))
    server = h.server
    client = h.client(1)
    # client 1's first batch, as it would send it, then the same ciphertexts in the other wire
    out = client.step()
    upload = next(m for m in out if isinstance(m, FeatureUpload))
    ctx = server.contexts[upload.target]
    items = tuple(
        dataclasses.replace(i, ciphertext=_rewire(ctx, i.ciphertext, OTHER[wire])) for i in upload.items
    )
    forged = h.craft(1, FeatureUpload, server.party_id, target=upload.target, items=items)
    rejected(server, forged, PayloadError, f"this session's wire is '{wire}'")
    server.receive(client.encode(upload))  # the genuine upload afterwards
    h.driver.emit(1, [m for m in out if m is not upload])
    h.run()
    assert all(p.done for p in h.parties.all().values())


@pytest.mark.parametrize("wire", ["compact", "tenseal"])
def test_a_client_refuses_results_in_the_other_wire(tiny_graph, tiny_partition, wire):
    """A server cannot switch a client to the other parser: results re-enveloped in the other wire
    (same key, a correct digest) are refused, nothing changes, and the genuine ones are accepted."""
    h = Harness(tiny_graph, tiny_partition, wire=wire).start()
    h.run(until=lambda: computing(h))
    server = h.server
    out = server.step()
    target = next(m for m in out if isinstance(m, EncodingResults))
    client = h.client(target.recipient)
    items = tuple(
        ResultItem(i.node, i.owner, tuple(_rewire(client.holder, b, OTHER[wire]) for b in i.row_blobs))
        for i in target.items
    )
    forged = h.craft(server.party_id, EncodingResults, target.recipient, bucket=target.bucket, items=items)
    rejected(client, forged, PayloadError, f"this session's wire is '{wire}'")
    client.receive(server.encode(target))
    h.driver.emit(server.party_id, [m for m in out if m is not target])
    h.run()
    assert all(p.done for p in h.parties.all().values())


def test_demo_and_bench_take_the_wire_option():
    from fedgat.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["demo"]).wire == "compact"
    assert parser.parse_args(["demo", "--wire", "tenseal"]).wire == "tenseal"
    assert parser.parse_args(["bench", "overhead", "--wire", "tenseal"]).wire == "tenseal"
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--wire", "zstd"])
