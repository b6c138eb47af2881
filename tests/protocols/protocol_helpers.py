"""Helpers to drive a small pre-training round event by event (imported by the protocol tests)."""

from __future__ import annotations

import numpy as np

from fedgat.pipeline import PretrainParties, build_pretrain_parties
from fedgat.protocols import Driver, InProcessTransport, Transcript, encode_message


class Harness:
    """Parties of one pre-training round on an in-process transport with a transcript."""

    def __init__(self, graph, partition, variant: str = "vector", seed: int = 1, **build) -> None:
        self.graph, self.partition = graph, partition
        self.parties: PretrainParties = build_pretrain_parties(
            graph, partition, variant=variant, seed=seed, **build
        )
        self.transport = InProcessTransport(Transcript())
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

    def queued(self):
        return list(self.transport._queue)


def keys_distributed(h: Harness) -> bool:
    """Every client holds the CKKS key and nothing is in flight (uploads not yet started)."""
    return all(c.holder is not None for c in h.parties.clients.values()) and not h.transport.pending()


def unit(n: int, d: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)
