"""Limits are enforced before work starts: absurd dimensions, node counts, neighbourhoods, memory
budgets and frame sizes are refused with SizeLimitError, allocate nothing of their size, change nothing."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest
from fault_helpers import Federation

from fedgat.crypto import KeyHolderContext, SlotLayout, encrypt_rows
from fedgat.protocols import (
    EdgeClaims,
    EncodingBases,
    EvaluationReport,
    FeatureUpload,
    GraphAnnounce,
    KeyFingerprintError,
    LocalUpdate,
    PayloadError,
    SealedCheckKeys,
    ServerState,
    SizeLimitError,
    SplitCounts,
    UploadItem,
    encode_message,
)
from fedgat.protocols.frame import HEADER, MAX_NEIGHBOUR_ENTRIES, VERSION
from fedgat.protocols.pretrain import PretrainLimits

from protocol_helpers import Harness, keys_distributed

MiB = 1 << 20


def _refused(party, frame: bytes, match: str, max_peak: int = 8 * MiB) -> None:
    """``frame`` raises SizeLimitError, leaves ``party`` unchanged and allocates < ``max_peak`` beyond
    the frame's own decoding."""
    before = party.snapshot()
    tracemalloc.start()
    try:
        with pytest.raises(SizeLimitError, match=match):
            party.receive(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert party.snapshot() == before
    assert peak < max_peak, peak


def _graph(h: Harness, c: int, **override) -> bytes:
    g = h.client(c)._graph
    fields = {"dim": g.dim, "owned": g.owned, "indptr": g.indptr, "indices": g.indices, **override}
    return h.craft(c, GraphAnnounce, h.roster.server, **fields)


def test_the_server_refuses_absurd_graph_announcements(harness):
    h = harness
    server = h.server
    _refused(server, _graph(h, 1, dim=2**32 - 1), "dimension")
    server.limits = PretrainLimits(max_nodes=len(h.client(1).owned) - 1)
    _refused(server, _graph(h, 1), "nodes")
    server.limits = PretrainLimits(max_neighbours=2)
    _refused(server, _graph(h, 1), "neighbourhood")
    server.limits = PretrainLimits(max_bases_bytes=1000)
    _refused(server, _graph(h, 1), "memory")
    # a hub announcing 2^20 neighbours: refused from the sizes, no bases drawn (they would be 8 TiB)
    server.limits = PretrainLimits()
    hub = np.array([5], dtype=np.int64)
    indices = np.concatenate([hub, np.arange(10, 10 + (1 << 20), dtype=np.int64)])
    _refused(
        server,
        h.craft(
            1,
            GraphAnnounce,
            h.roster.server,
            dim=16,
            owned=hub,
            indptr=np.array([0, len(indices)]),
            indices=indices,
        ),
        "neighbourhood",
        max_peak=64 * MiB,
    )
    # cumulative: the second client's nodes push the session above max_nodes
    total = sum(len(h.client(c).owned) for c in (0, 1))
    server.limits = PretrainLimits(max_nodes=total - 1)
    server.receive(_graph(h, 0))
    _refused(server, _graph(h, 1), "session above")
    server.limits = PretrainLimits()
    server.receive(_graph(h, 1))  # within the limits it is accepted
    assert server.state is ServerState.COLLECTING and sorted(server._graphs) == [0, 1]


def test_a_client_refuses_bases_beyond_its_memory_budget(tiny_graph, tiny_partition):
    h = Harness(tiny_graph, tiny_partition, variant="matrix").start()
    h.run(until=lambda: h.server.state is ServerState.COMPUTING and not h.transport.pending())
    client = h.client(1)
    n = 1000  # matrix variant: m = 2n, rows 1 + m + m^2 = 4e6 per node -> 512 MB of float64 at d = 16
    node = int(client.owned[0])
    bases = {
        "bucket": len(client._assemblies),
        "variant": "matrix",
        "n": n,
        "nodes": np.array([node]),
        "neighbours": np.concatenate([[node], np.arange(10**6, 10**6 + n - 1)])[None],
        "owners": np.full((1, n), 1),
        "p": np.zeros((1, 2 * n, n)),
        "q": np.zeros((1, 2 * n, n)),
    }
    frame = h.craft(h.roster.server, EncodingBases, 1, **bases)
    client.limits = PretrainLimits(max_encoding_bytes=256 * MiB)
    _refused(client, frame, "decrypted encodings", max_peak=96 * MiB)  # p and q are 32 MB to decode
    client.limits = PretrainLimits(max_neighbours=999)
    _refused(client, h.craft(h.roster.server, EncodingBases, 1, **bases), "neighbourhoods", max_peak=96 * MiB)


def _payload_frame(h: Harness, sender: int, cls, payload: bytes) -> bytes:
    """A frame of ``cls`` from ``sender`` with a hand-written payload (unsigned: refused before)."""
    header = HEADER.pack(
        b"FGAT",
        VERSION,
        cls.TYPE,
        sender,
        h.roster.server,
        h.parties.config.session,
        1,
        bytes(32),
        len(payload),
    )
    return header + payload + bytes(64)


def test_the_server_refuses_oversized_claims_and_check_keys_from_their_sizes(harness):
    """Declared sizes above a field's limit are refused before anything of that size is read or
    allocated: a claim of 2^25 + 1 edges, 4097 sealed check keys, a 2 GiB sealed entry."""
    h = harness
    server = h.server
    claim = (
        struct.pack(">II", 1, 2) + struct.pack(">BB", 3, 2) + struct.pack(">II", MAX_NEIGHBOUR_ENTRIES + 1, 2)
    )
    _refused(server, _payload_frame(h, 1, EdgeClaims, claim), "exceeds", max_peak=1 * MiB)
    owners = struct.pack(">I", 1) + struct.pack(">BB", 3, 1) + struct.pack(">I", 4097)
    _refused(server, _payload_frame(h, 1, SealedCheckKeys, owners), "exceeds", max_peak=1 * MiB)
    entry = struct.pack(">I", 1) + struct.pack(">BBI", 3, 1, 1) + _i8(0) + struct.pack(">II", 1, 2**31)
    _refused(server, _payload_frame(h, 1, SealedCheckKeys, entry), "exceed", max_peak=1 * MiB)


def _i8(*values) -> bytes:
    return np.array(values, dtype="<i8").tobytes()


def test_fedavg_refuses_oversized_frames_and_absurd_counts():
    fed = Federation(rounds=2, fraction=1.0)
    parties = fed.parties()
    srv = parties[fed.sid]
    srv.start()
    ident = fed.dep.identities[0].signer
    arrays = {k: v.numpy() for k, v in srv.global_state.items()}
    base = {"sender": 0, "recipient": fed.sid, "session": 9, "round": 1, "loss": 0.5}
    big = {**arrays, "extra": np.zeros(srv.max_frame_bytes // 4, np.float32)}
    frame = encode_message(LocalUpdate(seq=1, num_train=3, arrays=big, **base), ident)
    assert len(frame) > srv.max_frame_bytes
    _refused(srv, frame, "exceeds", max_peak=1 * MiB)  # refused from its length: nothing decoded
    _refused(
        srv,
        encode_message(LocalUpdate(seq=2, num_train=2**32 - 1, arrays=arrays, **base), ident),
        "training nodes",
    )
    srv.receive(encode_message(LocalUpdate(seq=3, num_train=3, arrays=arrays, **base), ident))
    client = parties[1]
    _refused(
        client,
        encode_message(LocalUpdate(seq=4, num_train=3, arrays=big, **{**base, "recipient": 1}), ident),
        "exceeds",
        max_peak=1 * MiB,
    )
    report = EvaluationReport(
        sender=0, recipient=fed.sid, session=9, seq=5, round=2, splits=(SplitCounts("val", 1, 2**31, 0.5),)
    )
    srv._expect(2, ("val",))  # as if round 2 were under evaluation
    _refused(srv, encode_message(report, ident), "more than")


def test_ciphertexts_under_other_parameters_are_refused(harness):
    """Part 1 gap: an upload encrypted with another preset (other ring dimension and moduli), in a
    correctly bound and signed message, is refused with a typed error and changes nothing."""
    h = harness.start().run(until=lambda: keys_distributed(harness))
    other = KeyHolderContext.generate("n8192")
    target = min(h.client(1).releases)
    node = int(h.client(1).releases[target][0])
    row = np.zeros((1, h.server.layout.d))
    blob = next(encrypt_rows(other, row, SlotLayout.for_dimension(row.shape[1], other.slots)))
    frame = h.craft(1, FeatureUpload, h.roster.server, target=target, items=(UploadItem(node, 0, blob),))
    before = h.server.snapshot()
    with pytest.raises((PayloadError, KeyFingerprintError)):
        h.server.receive(frame)
    assert h.server.snapshot() == before
