"""Helpers to drive a small pre-training round event by event (imported by the protocol tests)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fedgat.pipeline import PretrainParties, build_pretrain_parties
from fedgat.protocols import (
    ClientState,
    Driver,
    InProcessTransport,
    ServerState,
    Transcript,
    decode_message,
    encode_message,
)
from fedgat.protocols.errors import ProtocolError
from fedgat.protocols.messages import peek_type


class Harness:
    """Parties of one pre-training round on an in-process transport with a transcript.

    ``transport``: another in-process transport (e.g. :class:`fault_helpers.FaultyTransport` to hold
    frames); its transcript records every frame."""

    def __init__(
        self, graph, partition, variant: str = "vector", seed: int = 1, transport=None, **build
    ) -> None:
        self.graph, self.partition = graph, partition
        self.parties: PretrainParties = build_pretrain_parties(
            graph, partition, variant=variant, seed=seed, **build
        )
        self.transport = transport if transport is not None else InProcessTransport(Transcript())
        self.driver = Driver(self.transport, self.parties.all())
        self.roster = self.parties.deployment.roster
        self._crafted = 10_000  # sequence numbers of crafted frames: above anything a party sends here

    def _next_seq(self) -> int:
        self._crafted += 1
        return self._crafted

    @property
    def server(self):
        return self.parties.server

    def client(self, c: int):
        return self.parties.clients[c]

    def start(self) -> Harness:
        self.driver.start()
        return self

    def run(self, until=None) -> Harness:
        self.driver.run(until=until)
        return self

    def craft(
        self,
        sender: int,
        cls,
        recipient: int,
        *,
        seq: int | None = None,
        session: int | None = None,
        fingerprint: bytes | None = None,
        **fields,
    ) -> bytes:
        """A frame signed by ``sender``'s real identity (what a misbehaving party could send)."""
        party = self.parties.all().get(sender)
        msg = cls(
            sender=sender,
            recipient=recipient,
            session=self.parties.config.session if session is None else session,
            seq=self._next_seq() if seq is None else seq,
            fingerprint=(party.verifier.fingerprint or bytes(32)) if fingerprint is None else fingerprint,
            **fields,
        )
        return encode_message(msg, self.parties.deployment.identities[sender].signer)

    def relay(self, msg, recipient: int, **changes) -> bytes:
        """``msg`` (a client's message) re-framed and signed by the server for ``recipient`` with some
        payload fields changed: what a hostile relaying server can send."""
        return self.craft(self.roster.server, type(msg), recipient, **{**msg.body(), **changes})

    def queued(self):
        return list(self.transport._queue)

    def sent(self, sender: int, cls, recipient: int | None = None) -> list:
        """Every ``cls`` message ``sender`` has sent so far (to ``recipient``), decoded from the
        transcript."""
        return [
            decode_message(e.data)
            for e in self.transport.transcript
            if e.sender == sender
            and (recipient is None or e.recipient == recipient)
            and peek_type(e.data) == cls.TYPE
        ]


def keys_distributed(h: Harness) -> bool:
    """Key set-up is over: the server takes uploads, every client holds its keys and the check keys
    it needs and is about to upload, and nothing is in flight (no upload has been sent yet)."""
    return (
        h.server.state is ServerState.UPLOADING
        and all(c.state is ClientState.UPLOADING and c.holder is not None for c in h.parties.clients.values())
        and not h.transport.pending()
    )


def computing(h: Harness) -> bool:
    """The server has sent the bases and computes; nothing is in flight."""
    return h.server.state is ServerState.COMPUTING and not h.transport.pending()


def rejected(party, data, error: type[Exception], match: str | None = None):
    """``data`` is refused with ``error`` and the party's snapshot is unchanged; returns the error."""
    before = party.snapshot()
    with pytest.raises(error, match=match) as info:
        party.receive(data)
    assert party.snapshot() == before
    return info.value


def refused_for_good(party, data, error: type[Exception], match: str | None = None):
    """``data`` is refused with a *terminal* ``error``: the party consumed the frame, is aborted (the
    reason is the error's constant text), holds no decrypted material and refuses the same frame
    again (as a replay: its sequence number is spent). Returns the error."""
    with pytest.raises(error, match=match) as info:
        party.receive(data)
    exc = info.value
    assert type(exc).terminal
    assert party.state_name() == "aborted" and party.aborted and str(exc) in party.abort_reason
    assert not party.next_deadline()
    assert getattr(party, "_assemblies", []) == [] and getattr(party, "encodings", None) is None
    with pytest.raises(ProtocolError):
        party.receive(data)
    return exc


def refused_at_done(
    h: Harness, party_id: int, data, error: type[Exception], match: str | None = None, rest=()
):
    """``data`` (a result that fails its check) is answered as an honest result would be, and the
    terminal ``error`` comes once the server says the results are done (known break 22: the verdict
    waits for the end, so the server learns whether some result failed, not which). ``rest``: the
    server's other messages to deliver; the round is then run to its end. Returns the error."""
    party = h.client(party_id)
    assert party.receive(data) == [] and not party.aborted
    h.driver.strict = False
    h.driver.emit(h.server.party_id, list(rest))
    h.run()
    errors = [e for pid, e in h.driver.rejected if pid == party_id and isinstance(e, error)]
    assert len(errors) == 1, h.driver.rejected
    exc = errors[0]
    if match is not None:
        assert re.search(match, str(exc)), str(exc)
    assert type(exc).terminal
    assert party.state_name() == "aborted" and party.aborted and str(exc) in party.abort_reason
    assert getattr(party, "_assemblies", []) == [] and getattr(party, "encodings", None) is None
    return exc


def unit(n: int, d: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)
