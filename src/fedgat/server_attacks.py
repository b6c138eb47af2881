r"""Attacks by a hostile server (alone or with colluding clients) on the encrypted pre-training round,
run against the real protocol: the real state machines of :mod:`fedgat.protocols.pretrain`, in
process, over the real transport and frames. A hostile server is a subclass of
:class:`~fedgat.protocols.ServerPretrain` that deviates where the attack says; a colluding client is
a real :class:`~fedgat.protocols.ClientPretrain` (or a subclass that deviates) whose CKKS secret key
the attacker holds. Honest parties are the unmodified classes.

Every attack is scored against ground truth, never assumed: ``recovered`` counts the foreign feature
vectors it targets that the attacker gets at cosine >= :data:`RECOVERY_COSINE` (or, for attacks whose
payoff comes later through training, that reached an honest client's training input), and
``detected`` says whether an honest party refused with a typed
:class:`~fedgat.protocols.errors.ProtocolError` before training on the attack's output.

* :func:`forged_results_attacks` -- one round with a hostile server that, for the first recipient
  it computes for (the *victim*), replaces some results: ``substituted_result`` (a single released
  row of another owner sent as a node's encoding, other coefficients, another node's combination)
  and ``injected_ciphertexts`` (chosen plaintexts encrypted under the victim's public key in place of
  an owner's rows; a ciphertext made under the attacker's own key re-enveloped as the victim's; and a
  colluding client's upload of a chosen row as another owner's node, which the server's upload check
  refuses);
* :func:`fake_edges_attack` -- a colluding client claims edges to another client's nodes that do
  not exist: once with the honest server (its claim check), once with a server that skips the check
  and hands the colluder every ciphertext it receives;
* :func:`third_party_claims_attack` -- a colluding client claims, as its own, other clients'
  nodes at the ends of an honest owner's real edges: with the honest server, and with one that skips
  its claim check;
* :func:`colluder_forgery_attack` -- the server and a colluding client forge an honest owner's
  partial for a victim with the check keys the victim gave the colluder;
* :func:`relabel_forgery_attack`, :func:`row_swap_attack`, :func:`withheld_claims_attack`,
  :func:`dropped_client_attack`, :func:`split_roster_attack` -- a server (with a colluding client
  for the first) that changes which rows, of which owner, a foreign node's neighbourhood holds in
  one victim's bases, or the claims and roster that victim checks them against;
* :func:`verdict_oracle_attack` -- the server alone adds to an honest result of the victim a scaled
  copy of one column of a foreign owner's upload, in a slot the victim checks: the victim's verdict
  (accept, or the terminal refusal) said whether that feature is zero (known break 22); padded
  uploads (frame version 12) make it refuse whatever the feature;
* :func:`collusion_attack` -- the server gives a colluding client every ciphertext it holds
  (uploads and results of an honest round); the client decrypts each with its own secret key,
  ignoring the envelopes' key fingerprints.

With :attr:`AttackSetting.upload_window` every round above runs windowed
(:attr:`~fedgat.protocols.pretrain.PretrainConfig.upload_window`): the server grants uploads
recipient by recipient (UploadGrant) and computes each recipient on its own
(``ServerPretrain._recipient_results``); the hostile servers tamper with that path too. Each attack's
``detail`` says how many UploadGrant messages its rounds' server sent (``upload_grants``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import numpy as np
import tenseal as ts
import torch

from fedgat.app import PretrainParties, bases_rng, build_pretrain_parties, cross_edges, owned_neighbourhoods
from fedgat.crypto import KeyHolderContext, SlotLayout, deserialize, encrypt_rows, serialize
from fedgat.crypto.encoders import local_encoder
from fedgat.crypto.encodings import PackedShares, pack_maps
from fedgat.crypto.packing import linear_combination, tenseal_payload
from fedgat.crypto.tags import prf_pads, release_rows
from fedgat.crypto.tasks import NodeResult, encode_node
from fedgat.encodings import Encodings
from fedgat.graph import Graph
from fedgat.partition import Partition
from fedgat.protocols import (
    ClientPretrain,
    ClientState,
    Delivery,
    Driver,
    EncodingBases,
    EncodingResults,
    EncodingsDone,
    FeatureUpload,
    GraphAnnounce,
    InProcessTransport,
    Message,
    PayloadError,
    ProtocolError,
    ResultRejectedError,
    ServerPretrain,
    ServerState,
    Transcript,
    UploadGrant,
    UploadItem,
    decode_message,
    run_parties,
)
from fedgat.protocols import pretrain_server as _pretrain_server
from fedgat.protocols.driver import Observer
from fedgat.protocols.messages import RosterReady, keyset_fingerprint, peek_type
from fedgat.protocols.pretrain_plan import (
    RoundPlan,
    needed_from_neighbourhoods,
    recipient_shares,
    share_order,
)
from fedgat.randomness import RandomSource
from fedgat.verdict_dp import verdict_epsilon

__all__ = [
    "RECOVERY_COSINE",
    "AttackOutcome",
    "AttackSetting",
    "TamperedBases",
    "chosen_bases_attack",
    "colluder_forgery_attack",
    "colluder_forgery_run",
    "collusion_attack",
    "dropped_client_attack",
    "fake_edges_attack",
    "first_recipient",
    "foreign_rows",
    "forged_results_attacks",
    "honest_round",
    "relabel_forgery_attack",
    "row_swap_attack",
    "shared_secret_key",
    "split_roster_attack",
    "statements_unchecked",
    "third_party_claims_attack",
    "third_party_edges",
    "verdict_oracle_attack",
    "withheld_claim_target",
    "withheld_claims_attack",
]

#: a vector counts as recovered at this cosine with the ground truth
RECOVERY_COSINE = 0.99

#: substitutions a hostile server tries on the victim's results (kind -> attack it belongs to)
FORGERIES = {
    "single_row": "substituted_result",
    "other_coefficients": "substituted_result",
    "other_node": "substituted_result",
    "chosen_plaintext": "injected_ciphertexts",
    "foreign_key": "injected_ciphertexts",
}


@dataclass
class AttackOutcome:
    """One attack's measured result: ``recovered`` of ``targets`` foreign vectors, ``detected`` by an
    honest party (a typed error before any training on the attack's output), ``ran`` False when the
    setting gave the attack nothing to target; ``detail`` says how."""

    name: str
    targets: int
    recovered: int
    detected: bool
    ran: bool = True
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def recovered_fraction(self) -> float:
        return self.recovered / self.targets if self.targets else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "recovered_fraction": self.recovered_fraction,
            "detected": self.detected,
            "ran": self.ran,
            "targets": self.targets,
            "recovered": self.recovered,
            **self.detail,
        }


@dataclass(frozen=True)
class AttackSetting:
    """The federation the attacks run on: a graph, its 2-layer partition, the variant, the seed of
    the server's bases, the CKKS preset, the server's worker processes (0: in process) and the
    rounds' upload window (:attr:`~fedgat.protocols.pretrain.PretrainConfig.upload_window`: None,
    every upload before compute; ``W >= 1``: uploads granted recipient by recipient, ``W`` open at a
    time, each recipient computed as soon as its uploads are in). Every round an attack builds runs
    with it."""

    graph: Graph
    partition: Partition
    variant: str = "vector"
    seed: int = 0
    preset: str = "n4096"
    workers: int | None = 0
    upload_window: int | None = None

    def __post_init__(self) -> None:
        w = self.upload_window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"upload_window must be None or a positive int, got {w!r}")

    @property
    def truth(self) -> np.ndarray:
        """Ground truth: every node's feature row (what the attacker wants)."""
        return self.graph.x.double().numpy()


# ------------------------------------------------------------------------------------ helpers
def shared_secret_key(parties: PretrainParties) -> bool:
    """Whether any two clients hold the same CKKS key (:attr:`PretrainParties.clients_share_a_key`)
    or the server holds a secret key: read from the parties of a round, never assumed."""
    return parties.clients_share_a_key or parties.server.has_secret_key


def cosines(rows: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """``(k, t)`` cosines between decrypted ``rows`` (non-finite values count as 0) and ``truth``."""
    rows = np.nan_to_num(np.asarray(rows, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    with np.errstate(all="ignore"):
        a = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-300)
        b = truth / np.maximum(np.linalg.norm(truth, axis=1, keepdims=True), 1e-300)
        out = np.nan_to_num(a @ b.T, nan=0.0, posinf=0.0, neginf=0.0)
    return out


def raw_decrypt(holder: KeyHolderContext, blob: bytes) -> np.ndarray | None:
    """What a key holder gets from any ciphertext envelope, its key fingerprint ignored: the payload
    loaded against the holder's context and decrypted with its secret key (None: it does not load).
    A ciphertext under another key with the same parameters loads and decrypts to garbage."""
    try:
        return holder.decrypt_vector(ts.ckks_vector_from(holder.tenseal, tenseal_payload(holder, blob)))
    except Exception:  # noqa: BLE001 - whatever does not load yields nothing to the attacker
        return None


def _reenvelope(ctx: Any, blob: bytes) -> bytes:
    """A ciphertext's payload under another context's envelope (that context's key fingerprint)."""
    return serialize(ctx, ts.ckks_vector_from(ctx.tenseal, tenseal_payload(ctx, blob)))


def _encode_pack(
    ctx: Any, layout: SlotLayout, node: int, parts: list[tuple[list[Any], np.ndarray]]
) -> NodeResult:
    """One result packing several partials as the honest server does
    (:meth:`~fedgat.crypto.SlotLayout.packed_order`): ``parts[i]`` = (the sources' chunk ciphertexts,
    the ``(rows, n_i)`` coefficients over them) of the ``i``-th node of the pack. The map is
    :func:`~fedgat.crypto.encodings.pack_maps` over the positions of the concatenated sources."""
    starts = np.cumsum([0] + [len(src) for src, _ in parts])
    _, packed = pack_maps(
        layout,
        [np.arange(start, start + len(src)) for start, (src, _) in zip(starts, parts, strict=False)],
        [coef for _, coef in parts],
    )
    return encode_node(ctx, layout, [s for src, _ in parts for s in src], node, packed)


def _build(
    setting: AttackSetting,
    *,
    server: Callable[[PretrainParties], ServerPretrain] | None = None,
    clients: Mapping[int, Callable[[PretrainParties], ClientPretrain]] | None = None,
    result_batch_bytes: int = 16 << 20,
) -> PretrainParties:
    """The parties of one round (:func:`fedgat.app.build_pretrain_parties`), with the server and
    some clients replaced by the given factories (each called with the honest parties)."""
    parties = build_pretrain_parties(
        setting.graph,
        setting.partition,
        variant=setting.variant,
        preset=setting.preset,
        seed=setting.seed,
        workers=setting.workers,
        result_batch_bytes=result_batch_bytes,
        upload_window=setting.upload_window,
    )
    new_server = parties.server
    if server is not None:
        parties.server.close()
        new_server = server(parties)
    new_clients = dict(parties.clients)
    for c, make in (clients or {}).items():
        new_clients[c] = make(parties)
    return PretrainParties(parties.deployment, parties.config, new_server, new_clients)


def _server_args(parties: PretrainParties, setting: AttackSetting, result_batch_bytes: int) -> dict[str, Any]:
    roster = parties.deployment.roster
    return {
        "party_id": roster.server,
        "roster": roster,
        "config": parties.config,
        "identity": parties.deployment.identities[roster.server],
        "bases_rng": bases_rng(setting.seed),
        "encoder": local_encoder(setting.workers),
        "result_batch_bytes": result_batch_bytes,
    }


class AttackDriver(Driver):
    """A :class:`~fedgat.protocols.Driver` that counts the UploadGrant messages sent
    (:attr:`upload_grants`): a windowed round's server sends them, an un-windowed one's none."""

    upload_grants = 0

    def emit(self, pid: int, messages: list) -> None:
        self.upload_grants += sum(isinstance(m, UploadGrant) for m in messages)
        super().emit(pid, messages)


def _drive(
    parties: PretrainParties,
    until: Callable[[InProcessTransport], bool] | None = None,
    observer: Observer | None = None,
) -> AttackDriver:
    """Run the round (rejections recorded, not raised: ``driver.rejected``) until idle or ``until``
    (the attack rounds arm no deadline: a round that stalls, e.g. a windowed round waiting for a
    victim that aborted, ends idle)."""
    transport = InProcessTransport()
    driver = AttackDriver(transport, parties.all(), observer, strict=False)
    try:
        driver.start()
        driver.run(until=None if until is None else (lambda: until(transport)))
    finally:
        parties.server.close()
    return driver


def _rejections(driver: Driver, party: int) -> list[ProtocolError]:
    return [exc for pid, exc in driver.rejected if pid == party]


def first_recipient(partition: Partition) -> int | None:
    """The lowest client id that needs a foreign row (the first recipient the server computes for)."""
    owner, nbh = partition.owner, partition.neighbourhoods
    for c, cp in enumerate(partition.clients):
        if any(np.any(owner[nbh.row(int(i))] != c) for i in cp.needed):
            return c
    return None


def foreign_rows(partition: Partition, client: int) -> np.ndarray:
    """The rows an honest ``client`` is released: its needed nodes' neighbours that others own."""
    nbh = partition.neighbourhoods
    rows = np.unique(np.concatenate([nbh.row(int(i)) for i in partition.clients[client].needed]))
    return rows[partition.owner[rows] != client]


# ------------------------------------------------------------------------- forged results
@dataclass
class Forgery:
    """One result the hostile server replaces: the victim's partial of ``node`` over the rows of
    ``owners`` (one owner), made as ``kind``."""

    kind: str
    victim: int
    node: int
    owners: tuple[int, ...]
    target: int | None = None  # the other owner's row a single-row substitution sends


class TamperingServer(ServerPretrain):
    """A hostile server's one hook on its results: :meth:`_tampered` sees every ``(compute bucket,
    pack, result)`` the server computes, on both compute paths -- the round's
    (:meth:`_compute_results`) and, with an upload window, each recipient's
    (:meth:`_recipient_results`) -- and yields what it sends instead."""

    def _compute_results(self) -> Iterator[tuple[int, int, NodeResult]]:
        return self._tampered(super()._compute_results())

    def _recipient_results(self, recipient: int) -> Iterator[tuple[int, int, NodeResult]]:
        return self._tampered(super()._recipient_results(recipient))

    def _tampered(
        self, results: Iterator[tuple[int, int, NodeResult]]
    ) -> Iterator[tuple[int, int, NodeResult]]:
        return results


class ForgingServer(TamperingServer):
    """A hostile server: honest until it computes, then, for each of ``len(kinds)`` recipients it
    computes for (the victims: from the ``offset``-th recipient on, in plan order), replaces one
    result with a forgery of that victim's kind (:data:`FORGERIES`): valid ciphertexts of the right
    size and level under the victim's key. One per victim, because a refusal is terminal (the victim
    aborts and checks nothing after). Without an upload window it sends each victim EncodingsDone
    right after that victim's results, so a victim completes if it accepted everything; with one it
    tampers with each recipient's own compute (:meth:`_recipient_results`) and the round ends as an
    honest windowed round does (a victim that accepted uploads its rows for the later recipients and
    completes)."""

    def __init__(
        self, *args: Any, kinds: Iterable[str] = tuple(FORGERIES), offset: int = 0, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.kinds = list(kinds)
        self.offset = offset
        self.forgeries: dict[tuple[int, int, int], Forgery] = {}  # (victim, node, owner)
        self.finished: set[int] = set()
        self._left: dict[int, int] = {}
        self._rng = np.random.default_rng(0)

    @property
    def victims(self) -> list[int]:
        return sorted({f.victim for f in self.forgeries.values()})

    @property
    def victims_finished(self) -> bool:
        """Every victim has had its results and EncodingsDone (once computing; with no victim, or
        with an upload window: the round is over)."""
        if self.plan is None or self.windowed:
            return self.done
        return set(self.victims) <= self.finished if self.victims else self.done

    def _draw_plan(self) -> list[Message]:
        # both paths draw the plan here: at compute (no window) or when the roster is ready (window)
        out = super()._draw_plan()
        assert self.plan is not None and self.plan.shares is not None
        recipients = [c for c, s in sorted(self.plan.shares.items()) if s]
        for victim, kind in zip(recipients[self.offset :], self.kinds, strict=False):
            shares = self.plan.shares[victim]
            if self._choose(victim, shares, kind):
                self._left[victim] = sum(len(b) for b in shares)
        return out

    def _choose(self, victim: int, shares: list[PackedShares], kind: str) -> bool:
        """A partial to forge as ``kind``: one with at least two sources (another node in its bucket
        for ``other_node``), the first of its pack (with ``foreign_key`` the whole pack is garbage
        under the victim's key, and the victim checks a pack's nodes in order)."""
        for b in shares:
            if kind == "other_node" and len(b.share) < 2:
                continue
            for p in b.packs:
                slot = int(p[0])
                sources = b.share.neighbours[slot]
                if len(sources) < 2:
                    continue
                node, owner = int(b.share.nodes[slot]), int(b.owner if b.owner is not None else -1)
                target = int(sources[-1]) if kind == "single_row" else None
                self.forgeries[(victim, node, owner)] = Forgery(kind, victim, node, (owner,), target)
                return True
        return False

    def _tampered(
        self, results: Iterator[tuple[int, int, NodeResult]]
    ) -> Iterator[tuple[int, int, NodeResult]]:
        assert self.plan is not None
        for g, s, result in results:
            recipient = self.plan.recipients[self.plan_position(g, s)][0]
            if recipient in self._left:
                self._left[recipient] -= 1
                bucket = self.plan.buckets[g]
                assert isinstance(bucket, PackedShares)
                forgery = self.forgeries.get(
                    (recipient, result.node, -1 if bucket.owner is None else bucket.owner)
                )
                if forgery is not None:
                    result = self._forge(recipient, bucket, s, forgery)
            yield g, s, result

    def _forge(self, recipient: int, bucket: PackedShares, s: int, forgery: Forgery) -> NodeResult:
        """The pack of the forged partial: the forged node's rows made as its kind, the other
        nodes' honest."""
        assert self.layout is not None
        ctx, layout, spool = self.contexts[recipient], self.layout, self._spool(recipient)
        share = bucket.share
        slots = [int(x) for x in bucket.packs[s]]
        node, kind = forgery.node, forgery.kind
        honest = [
            ([spool.get(int(j)) for j in share.neighbours[x]], share.coefficients(x)) for x in slots[1:]
        ]
        slot = slots[0]
        sources_ids = share.neighbours[slot]
        coef = share.coefficients(slot)
        sources = [spool.get(int(j)) for j in sources_ids]
        if kind == "single_row":  # another owner's released row, as every row of the encoding
            chosen = np.zeros_like(coef)
            chosen[:, -1] = 1.0
            return _encode_pack(ctx, layout, node, [(sources, chosen), *honest])
        if kind == "other_coefficients":  # the same rows, two sources' coefficients swapped
            swapped = coef[:, [1, 0, *range(2, coef.shape[1])]]
            return _encode_pack(ctx, layout, node, [(sources, swapped), *honest])
        if kind == "other_node":  # the honest combination of another node of the bucket (same rows)
            other = (slot + 1) % len(share)
            others = [spool.get(int(j)) for j in share.neighbours[other]]
            return _encode_pack(ctx, layout, node, [(others, share.coefficients(other)), *honest])
        if kind == "chosen_plaintext":  # chosen rows encrypted under the victim's public key
            return _encode_pack(
                ctx, layout, node, [(self._chosen_sources(ctx, len(sources_ids), layout), coef), *honest]
            )
        if kind == "foreign_key":  # computed under the attacker's own key, re-enveloped as the victim's
            own = KeyHolderContext.generate(self.config.preset, wire=self.config.wire)
            parts = [
                (self._chosen_sources(own, share.neighbours[x].size, layout), share.coefficients(x))
                for x in slots
            ]
            made = _encode_pack(own, layout, node, parts)
            return NodeResult(node, [_reenvelope(ctx, blob) for blob in made.row_blobs])
        raise ValueError(f"unknown forgery {kind!r}")

    def _chosen_sources(self, ctx: Any, n: int, layout: SlotLayout) -> list[list[Any]]:
        """``n`` chosen rows (:meth:`_chosen_rows`) encrypted under ``ctx``'s public key, as sources."""
        return [
            [deserialize(ctx, blob, level="fresh") for blob in encrypt_rows(ctx, row[None], layout)]
            for row in self._chosen_rows(n, layout)
        ]

    def _chosen_rows(self, n: int, layout: SlotLayout) -> np.ndarray:
        """Unit-norm chosen feature rows with guessed (zero) tag columns: the server knows no tag key."""
        rows = np.zeros((n, layout.d))
        assert self._dim is not None
        dim = self._dim
        x = self._rng.standard_normal((n, dim))
        rows[:, :dim] = x / np.linalg.norm(x, axis=1, keepdims=True)
        return rows

    def step(self) -> list[Message]:
        out = super().step()
        assert self.plan is not None or not self._left
        if self.windowed:  # the victim may still owe uploads: its EncodingsDone comes at the end
            return out
        for v, left in self._left.items():
            if left == 0 and v not in self.finished:
                assert self.plan is not None
                out.append(
                    self._new(
                        EncodingsDone, v, buckets=len(self.plan.views[v]), nodes=self.plan.results_for(v)
                    )
                )
                self.finished.add(v)
        return out


class InjectingClient(ClientPretrain):
    """A colluding client that, with its first upload batch, also uploads a chosen row (encrypted
    under the recipient's key, zero tag columns) as another owner's node ``node`` for ``recipient``.
    With an upload window it waits for the server's grant for ``recipient`` (when it releases rows to
    it), so that the server's check of the upload's rows is what answers, not the grant check."""

    def __init__(self, *args: Any, inject: tuple[int, int], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.inject = inject
        self.injected_seq: int | None = None

    def step(self) -> list[Message]:
        out: list[Message] = []
        recipient, node = self.inject
        granted = (
            self.config.upload_window is None or recipient in self._granted or recipient not in self.releases
        )
        if self.injected_seq is None and self.layout is not None and granted:
            row = np.zeros((1, self.layout.d))
            row[0, : self.dim] = 1.0 / np.sqrt(self.dim)
            blobs = list(encrypt_rows(self._peer_contexts[recipient], row, self.layout))
            items = tuple(UploadItem(node, k, blob) for k, blob in enumerate(blobs))
            msg = self._new(FeatureUpload, self.roster.server, target=recipient, items=items)
            self.injected_seq = msg.seq
            out.append(msg)
        return out + super().step()


def _client_args(parties: PretrainParties, c: int) -> dict[str, Any]:
    return {
        "party_id": c,
        "roster": parties.deployment.roster,
        "config": parties.config,
        "identity": parties.deployment.identities[c],
    }


def _client_graph(setting: AttackSetting, c: int) -> dict[str, Any]:
    cp = setting.partition.clients[c]
    indptr, indices = owned_neighbourhoods(setting.partition, cp.owned)
    cross, cross_owner = cross_edges(setting.graph, setting.partition, c)
    return {
        "owned": cp.owned,
        "features": setting.graph.x.numpy()[cp.owned],
        "indptr": indptr,
        "indices": indices,
        "cross": cross,
        "cross_owner": cross_owner,
        "needed": cp.needed,
        "dtype": torch.float64,
    }


def forged_results_attacks(setting: AttackSetting) -> dict[str, AttackOutcome]:
    """``substituted_result`` and ``injected_ciphertexts`` (see the module docstring).

    Each forgery kind of :data:`FORGERIES` is tried on its own victim (a refusal is terminal, so a
    victim answers one forgery): the recipients the server computes for, in order, as many rounds
    as the kinds need. With an upload window, one victim per round (same victims, in the same
    order): a victim that refuses aborts without uploading its rows for the recipients granted after
    it, so a second victim later in the same round would never be computed. In the first round a
    colluding client also uploads a chosen row as the node of a third owner that a victim needs.
    Each forged result travels in its own message, so that every rejection names its node.
    ``recovered``: forged results a victim accepted into the encodings it trains on (what the server
    could then read back through training); ``detected``: every forged result was refused with
    :class:`~fedgat.protocols.errors.ResultRejectedError` naming (locally) the node and the owner whose rows it
    should have combined, the victim aborted (it never completes), and the client's injected upload
    was refused with a typed error.
    """
    part = setting.partition
    recipients = [c for c in range(part.num_clients) if len(foreign_rows(part, c))]
    if not recipients:
        note = "no client needs a foreign row: nothing to substitute"
        return {
            name: AttackOutcome(name, 0, 0, False, ran=False, detail={"note": note})
            for name in ("substituted_result", "injected_ciphertexts")
        }
    victim = recipients[0]
    rows = foreign_rows(part, victim)
    third = [
        (int(u), int(part.owner[u])) for u in rows if part.num_clients > 2 and int(part.owner[u]) != victim
    ]
    colluder = (
        next((c for c in range(part.num_clients) if c not in (victim, third[0][1])), None) if third else None
    )
    inject = None if colluder is None else (victim, next(u for u, o in third if o != colluder))
    kinds = list(FORGERIES)
    forgeries: list[tuple[Forgery, ProtocolError | None, bool]] = []  # (forgery, refusal, victim done)
    server_refused: list[ProtocolError] = []
    per_round = len(recipients) if setting.upload_window is None else 1
    grants: list[int] = []  # UploadGrant messages each round's server sent
    for start in range(0, len(kinds), per_round):
        chunk = kinds[start : start + per_round]
        offset = start % len(recipients)

        def server(
            parties: PretrainParties, chunk: list[str] = chunk, offset: int = offset
        ) -> ServerPretrain:
            return ForgingServer(**_server_args(parties, setting, 1), kinds=chunk, offset=offset)

        clients = {}
        if start == 0 and colluder is not None and inject is not None:
            pair, who = inject, colluder

            def injecting(
                parties: PretrainParties, who: int = who, pair: tuple[int, int] = pair
            ) -> ClientPretrain:
                return InjectingClient(
                    **_client_args(parties, who), **_client_graph(setting, who), inject=pair
                )

            clients[colluder] = injecting
        parties = _build(setting, server=server, clients=clients, result_batch_bytes=1)
        hostile = parties.server
        assert isinstance(hostile, ForgingServer)

        def until(t: Any, h: ForgingServer = hostile) -> bool:
            return h.victims_finished and not t.pending()

        driver = _drive(parties, until=until)
        grants.append(driver.upload_grants)
        for f in hostile.forgeries.values():
            first = next(iter(_rejections(driver, f.victim)), None)
            forgeries.append((f, first, parties.clients[f.victim].done))
        if start == 0 and colluder is not None:
            server_refused = [
                exc
                for exc in _rejections(driver, hostile.party_id)
                if isinstance(exc, PayloadError) and f"party {colluder}" in str(exc)
            ]
    out = {}
    for name in ("substituted_result", "injected_ciphertexts"):
        mine = [(f, exc, done) for f, exc, done in forgeries if FORGERIES[f.kind] == name]
        refused = [
            f
            for f, exc, done in mine
            if isinstance(exc, ResultRejectedError)
            and (exc.node, exc.owners) == (f.node, f.owners)
            and not done
        ]
        accepted = [f for f, _, done in mine if done]
        detail: dict[str, Any] = {
            "forged": [
                {
                    "kind": f.kind,
                    "victim": f.victim,
                    "node": f.node,
                    "owners": list(f.owners),
                    "refused": f in refused,
                    "victim_completed": done,
                }
                for f, _, done in mine
            ],
            "upload_window": setting.upload_window,
            "upload_grants": grants,
            "note": (
                "one forgery per victim (a refusal is terminal); recovered counts forged results a victim "
                "accepted into the encodings it trains on; detected: each was refused with "
                "ResultRejectedError naming (locally) the node and the owner, and its victim aborted"
            ),
        }
        detected = bool(mine) and len(refused) == len(mine)
        targets, recovered = len(mine), len(accepted)
        if name == "injected_ciphertexts" and inject is not None and colluder is not None:
            detail["client_upload"] = {
                "colluder": colluder,
                "recipient": inject[0],
                "node": inject[1],
                "owner": int(part.owner[inject[1]]),
                "refused_by_server": bool(server_refused),
                "error": str(server_refused[0]) if server_refused else None,
            }
            targets += 1
            recovered += 0 if server_refused else 1
            detected = detected and bool(server_refused)
        out[name] = AttackOutcome(name, targets, recovered, detected, ran=bool(mine), detail=detail)
    return out


# ------------------------------------------------------------------------------ fake edges
class ClaimBlindServer(ServerPretrain):
    """A colluding server that skips its check of the edge claims (it relays every claim and plans
    with every announced neighbourhood) and keeps every upload, whatever an owner reports."""

    def _maybe_ready(self) -> list[Message]:
        with mock.patch.object(_pretrain_server, "check_claims", lambda *a, **k: None):
            return super()._maybe_ready()


def _fake_edge_client(setting: AttackSetting, c: int, fakes: np.ndarray) -> dict[str, Any]:
    """Client ``c``'s graph with fake edges: each fake target attached to one of its nodes, in that
    node's attention neighbourhood, as a cross edge claimed (signed) as used."""
    args = _client_graph(setting, c)
    owned, indptr, indices = args["owned"], args["indptr"], args["indices"]
    rows = [list(indices[indptr[k] : indptr[k + 1]]) for k in range(len(owned))]
    extra = []
    for n, u in enumerate(fakes.tolist()):
        k = n % len(owned)
        rows[k].append(u)
        extra.append((int(owned[k]), u))
    sizes = [len(r) for r in rows]
    args["indptr"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    args["indices"] = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows])
    args["cross"] = np.concatenate([args["cross"].reshape(-1, 2), np.asarray(extra, dtype=np.int64)])
    args["cross_owner"] = np.concatenate([args["cross_owner"], setting.partition.owner[fakes]]).astype(
        np.int64
    )
    args["needed"] = needed_from_neighbourhoods(owned, args["indices"])
    return args


def _upload_groups(messages: Iterable[FeatureUpload]) -> Iterator[tuple[int, int, int, list[bytes]]]:
    """``(sender, recipient, node, chunk blobs)`` of every row in ``messages`` (a client sends all
    chunks of a row in one message)."""
    for msg in messages:
        rows: dict[int, dict[int, bytes]] = {}
        for item in msg.items:
            rows.setdefault(item.node, {})[item.chunk] = item.ciphertext
        for node, chunks in rows.items():
            yield msg.sender, msg.target, node, [chunks[k] for k in sorted(chunks)]


def _server_uploads(transcript: Transcript, server: int) -> Iterator[FeatureUpload]:
    """Every upload the server received, in one pass over the transcript."""
    for e in transcript.entries:
        if e.recipient == server and e.type_name == "FeatureUpload" and e.data is not None:
            msg = decode_message(e.data)
            assert isinstance(msg, FeatureUpload)
            yield msg


def _decrypt_released(
    colluder: ClientPretrain, kept: Iterable[FeatureUpload], truth: np.ndarray
) -> dict[int, list[float]]:
    """node -> the cosine to its true row of every copy of it among ``kept`` (uploads the server
    received for ``colluder``), decrypted with the colluder's secret key and its pad removed (the
    colluder chose the pair key it is padded under); a copy that does not decrypt counts as -1."""
    holder, layout = colluder.holder, colluder.layout
    seen: dict[int, list[float]] = {}
    for sender, _to, node, blobs in _upload_groups(kept):
        vectors = [] if holder is None else [raw_decrypt(holder, b) for b in blobs]
        if layout is None or not vectors or any(v is None for v in vectors):
            seen.setdefault(node, []).append(-1.0)
            continue
        row = _unpadded(colluder, sender, node, layout.unpack([v for v in vectors if v is not None], 1))
        row = row[:, : truth.shape[1]]
        seen.setdefault(node, []).append(float(cosines(row, truth[[node]])[0, 0]))
    return seen


def _unpadded(colluder: ClientPretrain, sender: int, node: int, row: np.ndarray) -> np.ndarray:
    """The released feature columns of an upload ``row`` (1, width) that ``sender`` made for
    ``colluder``, its pad removed: the colluder chose the pair key it is padded under."""
    row = row[:, : colluder.dim]
    keys = colluder._my_keys.get(sender)
    if keys is None:
        return row
    return row - prf_pads(
        keys.prf, colluder.session, np.array([node]), row.shape[1], colluder.config.upload_pad
    )


def _upload_collector(server: int, recipient: int, kept: list[FeatureUpload]) -> Observer:
    """A driver observer that keeps every upload the server receives for ``recipient``."""

    def observe(event: str, pid: int, delivery: Delivery | None, out: list) -> None:
        if delivery is None or delivery.recipient != server or peek_type(delivery.data) != FeatureUpload.TYPE:
            return
        msg = decode_message(delivery.data)
        if isinstance(msg, FeatureUpload) and msg.target == recipient:
            kept.append(msg)

    return observe


def fake_edges_attack(setting: AttackSetting, colluder: int | None = None, fakes: int = 8) -> AttackOutcome:
    """A colluding client claims (signed, as attention edges) edges to ``fakes`` nodes of other
    clients that it has no edge to and would not be released honestly.

    Run twice: with the honest server, whose claim check must refuse (the claim is not confirmed by
    the owner; the round aborts with a typed error naming the colluder: ``detected``); and with a
    server that skips the check and gives the colluder every ciphertext it received for it, which
    the colluder decrypts with its key: ``recovered`` counts fake targets whose row it gets at
    cosine >= 0.99 in either run (the owners decide their releases from confirmed edges only)."""
    part, truth = setting.partition, setting.truth
    colluder = first_recipient(part) if colluder is None else colluder
    if colluder is None or part.num_clients < 2:
        return AttackOutcome(
            "fake_edges", 0, 0, False, ran=False, detail={"note": "no client to collude with"}
        )
    honest_rows = set(foreign_rows(part, colluder).tolist()) | set(part.clients[colluder].needed.tolist())
    candidates = [u for u in np.flatnonzero(part.owner != colluder).tolist() if u not in honest_rows]
    rng = np.random.default_rng(setting.seed)
    targets = np.sort(rng.choice(candidates, size=min(fakes, len(candidates)), replace=False)).astype(
        np.int64
    )
    if not len(targets):
        return AttackOutcome(
            "fake_edges", 0, 0, False, ran=False, detail={"note": "no node to fake an edge to"}
        )

    def client(parties: PretrainParties) -> ClientPretrain:
        return ClientPretrain(
            **_client_args(parties, colluder), **_fake_edge_client(setting, colluder, targets)
        )

    def blind(parties: PretrainParties) -> ServerPretrain:
        return ClaimBlindServer(**_server_args(parties, setting, 16 << 20))

    runs: dict[str, dict[str, Any]] = {}
    best = np.zeros(len(targets))
    for mode, factory in (("honest_server", None), ("claim_blind_server", blind)):
        parties = _build(setting, server=factory, clients={colluder: client})
        server = parties.server
        kept: list[FeatureUpload] = []  # what the server received for the colluder
        keep = _upload_collector(server.party_id, colluder, kept)
        driver = _drive(parties, observer=keep)
        seen = _decrypt_released(parties.clients[colluder], kept, truth)
        total = sum(len(c) for c in seen.values())
        beyond = sum(len(c) for node, c in seen.items() if node not in honest_rows)
        readable = sum(sum(v >= RECOVERY_COSINE for v in c) for c in seen.values())
        released = sum(len(seen.get(int(node), ())) for node in targets)
        for k, node in enumerate(targets.tolist()):
            best[k] = max([best[k], *seen.get(node, ())])
        reason = server.abort_reason or ""
        runs[mode] = {
            "server_refused": server.aborted and f"party {colluder} " in reason and "confirm" in reason,
            "server_error": server.abort_reason,
            "rows_released_to_colluder": total,
            "rows_released_to_colluder_recovered": int(readable),
            "rows_released_for_fake_targets": released,
            "rows_released_beyond_honest_view": int(beyond),
            "rejections": len(driver.rejected),
            "upload_grants": driver.upload_grants,
        }
    recovered = int(np.sum(best >= RECOVERY_COSINE))
    return AttackOutcome(
        "fake_edges",
        len(targets),
        recovered,
        bool(runs["honest_server"]["server_refused"]),
        detail={
            "colluder": colluder,
            "fake_targets": targets.tolist(),
            "upload_window": setting.upload_window,
            "runs": runs,
            "note": (
                "detected: the honest server's claim check refused the unconfirmed edges (typed error, round "
                "aborted); recovered: fake targets whose row the colluder decrypts from anything released to it, "
                "with the honest server or one that skips the check"
            ),
        },
    )


# ------------------------------------------------------------------- third-party claims
class _ClaimsWithExtra:
    """A client's :class:`~fedgat.protocols.pretrain_edges.LocalGraph` whose signed claims carry,
    per peer, extra used edges ``(v, u)`` (``v`` not the client's node) besides its own."""

    def __init__(self, local: Any, extra: Mapping[int, np.ndarray]) -> None:
        self._local, self._extra = local, extra

    def __getattr__(self, name: str) -> Any:
        return getattr(self._local, name)

    def claims(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        out = dict(self._local.claims())
        for peer, pairs in self._extra.items():
            edges, uses = out.get(peer, (np.zeros((0, 2), np.int64), np.zeros(0, np.int64)))
            edges = np.concatenate([edges, pairs])
            uses = np.concatenate([uses, np.ones(len(pairs), np.int64)])
            order = np.unique(edges[:, 0] * (1 << 32) + edges[:, 1], return_index=True)[1]
            out[peer] = (edges[order], uses[order])
        return out


def third_party_edges(setting: AttackSetting, colluder: int) -> dict[int, np.ndarray]:
    """Owner ``b`` -> the ``(v, u)`` pairs of ``b``'s cross edges ``(u, v)`` whose other end ``v``
    belongs to a third client (neither ``b`` nor ``colluder``): what the colluder claims as its own
    in :func:`third_party_claims_attack`."""
    owner = setting.partition.owner
    src, dst = setting.graph.edge_index.numpy()
    a, d = owner[src], owner[dst]
    third = (a != d) & (a != colluder) & (d != colluder)
    pairs = np.stack([dst[third], src[third]], axis=1).astype(np.int64)
    return {int(b): np.unique(pairs[a[third] == b], axis=0) for b in np.unique(a[third])}


def third_party_claims_attack(setting: AttackSetting, colluder: int | None = None) -> AttackOutcome:
    """A colluding client C claims (signed, as used) edges of honest owners to *third* clients'
    nodes, as if those nodes were its own: for owner ``b``'s real edge ``(u, v)`` with ``v`` of
    client ``d`` (``d`` neither ``b`` nor C), C claims ``v`` uses ``u``. The edge exists at ``b``,
    so only ``b``'s own record of who owns ``v`` can tell the claim from C's (found by a red-team
    review, 2026-11-27: 93 rows beyond C's honest view on a 400-node graph before the owners checked
    it, :func:`fedgat.protocols.pretrain_edges.releases`).

    Run twice, as :func:`fake_edges_attack`: with the honest server (its claim check refuses:
    ``detected``) and with one that skips the check and hands C every ciphertext it receives for it.
    ``targets``: the foreign rows outside C's honest view; ``recovered``: those C decrypts at cosine
    >= :data:`RECOVERY_COSINE` in either run."""
    part, truth = setting.partition, setting.truth
    colluder = first_recipient(part) if colluder is None else colluder
    extra = {} if colluder is None else third_party_edges(setting, colluder)
    if colluder is None or not extra:
        note = "no client to collude with" if colluder is None else "no edge between two other clients"
        return AttackOutcome("third_party_claims", 0, 0, False, ran=False, detail={"note": note})
    honest_rows = set(foreign_rows(part, colluder).tolist()) | set(part.clients[colluder].needed.tolist())
    outside = [u for u in np.flatnonzero(part.owner != colluder).tolist() if u not in honest_rows]

    def client(parties: PretrainParties) -> ClientPretrain:
        c = ClientPretrain(**_client_args(parties, colluder), **_client_graph(setting, colluder))
        c.local = _ClaimsWithExtra(c.local, extra)  # type: ignore[assignment]
        return c

    def blind(parties: PretrainParties) -> ServerPretrain:
        return ClaimBlindServer(**_server_args(parties, setting, 16 << 20))

    runs: dict[str, dict[str, Any]] = {}
    recovered: set[int] = set()
    for mode, factory in (("honest_server", None), ("claim_blind_server", blind)):
        parties = _build(setting, server=factory, clients={colluder: client})
        kept: list[FeatureUpload] = []
        driver = _drive(parties, observer=_upload_collector(parties.server.party_id, colluder, kept))
        seen = _decrypt_released(parties.clients[colluder], kept, truth)
        beyond = [node for node in seen if node not in honest_rows]
        recovered |= {node for node in beyond if max(seen[node]) >= RECOVERY_COSINE}
        reason = parties.server.abort_reason or ""
        runs[mode] = {
            "server_refused": parties.server.aborted and f"party {colluder}'s claimed edges" in reason,
            "server_error": parties.server.abort_reason,
            "rows_released_to_colluder": len(seen),
            "rows_released_to_colluder_recovered": sum(max(c) >= RECOVERY_COSINE for c in seen.values()),
            "rows_released_beyond_honest_view": len(beyond),
            "rejections": len(driver.rejected),
            "upload_grants": driver.upload_grants,
        }
    return AttackOutcome(
        "third_party_claims",
        len(outside),
        len(recovered),
        bool(runs["honest_server"]["server_refused"]),
        detail={
            "colluder": colluder,
            "claims": int(sum(len(p) for p in extra.values())),
            "upload_window": setting.upload_window,
            "runs": runs,
            "note": (
                "detected: the honest server's claim check refused the claims (typed error, round aborted); "
                "recovered: foreign rows outside the colluder's honest view that it decrypts from anything "
                "released to it, with the honest server or one that skips the check"
            ),
        },
    )


# ------------------------------------------------------------------- relabelled owners
class RelabelingServer(TamperingServer):
    """A server colluding with client ``colluder`` (whose secrets it holds) that, in the bases of
    ``victim`` only, labels node ``u`` in the neighbourhood of the victim's foreign needed node ``v``
    as the colluder's (the victim's partials are planned by the same labels), and computes that
    "colluder partial" of ``v`` with, in ``u``'s place, a fresh encryption under the victim's public
    key of the row ``x`` with the tag columns of the check keys the victim gave the colluder."""

    def __init__(
        self,
        *args: Any,
        colluder: ClientPretrain,
        relabel: tuple[int, int, int, int],
        x: np.ndarray,
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self.colluder, self.relabel, self.x = colluder, relabel, np.asarray(x, dtype=np.float64)
        self.forged = 0

    def _owner_labels(self, recipient: int, nodes: np.ndarray, neighbours: np.ndarray) -> np.ndarray:
        owner = super()._owner_labels(recipient, nodes, neighbours)
        victim, v, u, colluder = self.relabel
        if recipient == victim:
            owner = np.where((np.asarray(nodes) == v)[:, None] & (neighbours == u), colluder, owner)
        return owner

    def _tampered(
        self, results: Iterator[tuple[int, int, NodeResult]]
    ) -> Iterator[tuple[int, int, NodeResult]]:
        victim, v, _, colluder = self.relabel
        assert self.plan is not None
        for g, s, result in results:
            bucket = self.plan.buckets[g]
            if (
                isinstance(bucket, PackedShares)
                and self.plan.recipients[self.plan_position(g, s)][0] == victim
                and bucket.owner == colluder
                and v in bucket.pack_nodes(s)
            ):
                result = self._forge(bucket, s, result.node)
            yield g, s, result

    def _forge(self, bucket: PackedShares, s: int, first: int) -> NodeResult:
        victim, v, u, _ = self.relabel
        assert self.layout is not None
        keys = self.colluder._owner_keys[victim]  # sealed by the victim to the colluder, opened by it
        row = np.zeros(self.layout.d)
        released = release_rows(keys, self.session, np.array([u]), self.x[None], self.config.upload_pad)[0]
        row[: len(released)] = released
        ctx, spool, share = self.contexts[victim], self._spool(victim), bucket.share
        fresh = [deserialize(ctx, blob, level="fresh") for blob in encrypt_rows(ctx, row[None], self.layout)]
        parts = []
        for slot in (int(k) for k in bucket.packs[s]):
            sources = [
                fresh if (int(share.nodes[slot]) == v and int(j) == u) else spool.get(int(j))
                for j in share.neighbours[slot]
            ]
            parts.append((sources, share.coefficients(slot)))
        self.forged += 1
        return _encode_pack(ctx, self.layout, first, parts)


def relabel_target(partition: Partition) -> tuple[int, int, int, int] | None:
    """``(victim, v, u, colluder)``: the victim needs ``v``, a node it does not own; ``u`` is a
    neighbour of ``v`` owned neither by the victim nor the colluder; the colluder is a third client
    (the lowest ids that fit)."""
    owner, nbh = partition.owner, partition.neighbourhoods
    for a, cp in enumerate(partition.clients):
        for v in cp.needed[~np.isin(cp.needed, cp.owned)].tolist():
            for u in nbh.row(int(v)).tolist():
                b = int(owner[u])
                if u == v or b == a:
                    continue
                c = next((k for k in range(partition.num_clients) if k not in (a, b)), None)
                if c is not None:
                    return a, int(v), int(u), c
    return None


def relabel_forgery_attack(setting: AttackSetting) -> AttackOutcome:
    """Known break 9 (red-team review, 2026-11-27): a server colluding with client C labels an
    honest owner's row ``u`` in the neighbourhood of a foreign node ``v`` the victim needs as C's,
    and sends that partial computed from a chosen row (``h_u`` + a delta) with the tags of the check
    keys the victim gave C. Before the victim checked foreign neighbourhoods against their owners'
    signed claims (:func:`fedgat.protocols.pretrain_edges.check_foreign_neighbourhoods`) it accepted
    the partial and trained on the forged row. ``recovered``: 1 if the victim completed with
    encodings that differ from the honest round's; ``detected``: it refused the bases or the result
    with a typed error."""
    target = relabel_target(setting.partition)
    if target is None or setting.partition.num_clients < 3:
        return AttackOutcome("relabel_forgery", 0, 0, False, ran=False, detail={"note": "no target"})
    victim, v, u, colluder = target
    dim = setting.truth.shape[1]
    delta = np.full(dim, 0.1 / np.sqrt(dim))  # norm 0.1: the forged row stays inside the range check
    made: dict[str, RelabelingServer] = {}

    def server(parties: PretrainParties) -> ServerPretrain:
        made["s"] = RelabelingServer(
            **_server_args(parties, setting, 16 << 20),
            colluder=parties.clients[colluder],
            relabel=target,
            x=setting.truth[u] + delta,
        )
        return made["s"]

    parties = _build(setting, server=server)
    driver = _drive(parties)
    refusals = _rejections(driver, victim)
    accepted = parties.clients[victim].done
    return AttackOutcome(
        "relabel_forgery",
        1,
        int(accepted),
        bool(refusals) and not accepted,
        detail={
            "victim": victim,
            "node": v,
            "relabelled": u,
            "true_owner": int(setting.partition.owner[u]),
            "colluder": colluder,
            "forged_results_sent": made["s"].forged,
            "victim_completed": accepted,
            "victim_error": str(refusals[0]) if refusals else None,
            "upload_window": setting.upload_window,
        },
    )


# --------------------------------------------------------------------- withheld claims
class WithholdingServer(ServerPretrain):
    """A server that does not relay ``claim`` (a ``(claimer, peer)`` key) to ``victim``, and is honest
    otherwise: the first step of the swap a review demonstrated (with a bordering owner D's claim to B
    withheld, B's rows in D's nodes' neighbourhoods were replaced by D's, unseen)."""

    def __init__(self, *args: Any, victim: int, claim: tuple[int, int], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.victim, self.claim = victim, claim

    def _maybe_ready(self) -> list[Message]:
        real = _pretrain_server.relay_targets

        def relay(claims: Iterable[tuple[int, int]], keep: Iterable[int]) -> dict[int, list[tuple[int, int]]]:
            out = real(claims, keep)
            out[self.victim] = [k for k in out.get(self.victim, []) if k != self.claim]
            return out

        with mock.patch.object(_pretrain_server, "relay_targets", relay):
            return super()._maybe_ready()


def client_borders(setting: AttackSetting) -> set[tuple[int, int]]:
    """``(a, b)`` for every two clients joined by a graph edge (both orders: the graph is undirected)."""
    owner = setting.partition.owner
    src, dst = setting.graph.edge_index.numpy()
    a, z = owner[src], owner[dst]
    cross = a != z
    return {(int(x), int(y)) for x, y in np.unique(np.stack([a[cross], z[cross]], axis=1), axis=0)}


def withheld_claim_target(setting: AttackSetting) -> tuple[int, tuple[int, int]] | None:
    """``(victim, (d, b))``: the victim borders ``d``, and ``d`` borders ``b`` (neither the victim
    nor ``d``): a claim the server must relay to the victim."""
    part = setting.partition
    pairs = client_borders(setting)
    for victim in range(part.num_clients):
        for d in sorted({y for x, y in pairs if x == victim}):
            b = min((y for x, y in pairs if x == d and y != victim), default=None)
            if b is not None:
                return victim, (d, b)
    return None


def withheld_claims_attack(
    setting: AttackSetting, target: tuple[int, tuple[int, int]] | None = None
) -> AttackOutcome:
    """A server withholds from a victim one claim of an owner the victim borders. Since frame
    version 9 each claim names all of its claimer's peers under its signature and the victim refuses
    the roster unless it holds every claim of the clients it borders
    (:func:`fedgat.protocols.pretrain_edges.check_claims_complete`); before, it went on, and a review
    used that to swap another owner's rows in foreign neighbourhoods unseen. ``detected``: the
    victim refused, naming the withheld claim; ``recovered``: 1 if it accepted the roster without
    the claim (the step the swap needs). ``target``: ``(victim, (claimer, peer))`` (default
    :func:`withheld_claim_target`; a sixth review pass withheld the claimer's claim to the victim
    itself, then not required)."""
    target = withheld_claim_target(setting) if target is None else target
    if target is None:
        return AttackOutcome(
            "withheld_claims", 0, 0, False, ran=False, detail={"note": "no third-party claim"}
        )
    victim, claim = target

    def server(parties: PretrainParties) -> ServerPretrain:
        return WithholdingServer(**_server_args(parties, setting, 16 << 20), victim=victim, claim=claim)

    parties = _build(setting, server=server)
    driver = _drive(parties)
    refusals = _rejections(driver, victim)
    client = parties.clients[victim]
    went_on = client.state is not ClientState.AWAIT_ROSTER  # accepted the roster without the claim
    return AttackOutcome(
        "withheld_claims",
        1,
        int(went_on),
        any("withheld" in str(e) for e in refusals) and not went_on,
        detail={
            "victim": victim,
            "withheld": list(claim),
            "victim_accepted_roster": went_on,
            "victim_completed": client.done,
            "victim_error": str(refusals[0]) if refusals else None,
            "upload_window": setting.upload_window,
        },
    )


# ---------------------------------------------------------------------- dropped client
class DroppingServer(ServerPretrain):
    """A server that leaves client ``left_out`` out of the roster although other participants' nodes
    attend over its nodes (an honest server ends such a round: ``unsound_without``): it strikes the
    dropped client's nodes out of its copies of the others' graphs, so its own claim check and plan
    pass, relays the owners' neighbourhood statements checked against their announced graphs (which
    still hold the dropped client's nodes), and ignores clients that abort."""

    def __init__(self, *args: Any, left_out: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.left_out = left_out
        self._announced_graphs: dict[int, GraphAnnounce] = {}

    def _on_statement(self, msg: Message) -> list[Message]:
        struck, self._graphs = self._graphs, {**self._graphs, **self._announced_graphs}
        try:
            return super()._on_statement(msg)  # type: ignore[arg-type]
        finally:
            self._graphs = struck

    def _maybe_ready(self) -> list[Message]:
        x = self.left_out
        if self.state is ServerState.COLLECTING and x in self.participants and not self._keys_missing():
            self._announced_graphs = dict(self._graphs)
            self.participants = [c for c in self.participants if c != x]
            gone = self._graphs[x].owned
            for c in self.participants:
                g = self._graphs[c]
                kept = ~np.isin(g.indices, gone)
                sizes = np.add.reduceat(kept.astype(np.int64), g.indptr[:-1]) if len(g.indices) else kept[:0]
                indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
                self._graphs[c] = dataclasses.replace(g, indptr=indptr, indices=g.indices[kept])
        return super()._maybe_ready()

    def _on_abort(self, msg: Message) -> list[Message]:
        return []


def dropped_client_target(setting: AttackSetting) -> tuple[int, int, int] | None:
    """``(victim, d, x)``: the victim borders ``d``, ``d`` borders ``x``, the victim does not."""
    border = client_borders(setting)
    k = setting.partition.num_clients
    for v in range(k):
        for d in range(k):
            for x in range(k):
                if len({v, d, x}) == 3 and (v, d) in border and (d, x) in border and (v, x) not in border:
                    return v, d, x
    return None


def dropped_client_attack(setting: AttackSetting) -> AttackOutcome:
    """The server leaves out of the roster a client ``x`` whose nodes a participant ``d`` attends over
    (:class:`DroppingServer`). A victim that borders ``d`` but not ``x`` used to accept: ``d``'s claims
    to ``x`` were read as outside the round, and the victim completed on foreign neighbourhoods with
    ``x``'s rows dropped (a fourth red-team pass, 2026-11-27: 91 rows in 44 nodes). Now it refuses the
    roster (:func:`fedgat.protocols.pretrain_edges.check_claims_complete`), and since frame version
    10 it would refuse those bases too (``d``'s signed statements still name ``x``'s nodes).
    ``detected``: the victim refused naming the left-out client; ``recovered``: 1 if it completed."""
    target = dropped_client_target(setting)
    if target is None:
        return AttackOutcome(
            "dropped_client", 0, 0, False, ran=False, detail={"note": "no such three clients"}
        )
    victim, d, x = target

    def server(parties: PretrainParties) -> ServerPretrain:
        return DroppingServer(**_server_args(parties, setting, 16 << 20), left_out=x)

    parties = _build(setting, server=server)
    driver = _drive(parties)
    refusals = [str(e) for e in _rejections(driver, victim)]
    completed = parties.clients[victim].done
    return AttackOutcome(
        "dropped_client",
        1,
        int(completed),
        any("which the roster leaves out" in r for r in refusals) and not completed,
        detail={
            "victim": victim,
            "bordering": d,
            "dropped": x,
            "victim_completed": completed,
            "victim_error": refusals[0] if refusals else None,
            "upload_window": setting.upload_window,
        },
    )


# ------------------------------------------------------------------------ chosen bases
class TamperedBases(RandomSource):
    """A server's "randomness" for the bases that returns them off the identity the layer reads the
    neighbours' rows back with, for every neighbourhood of at least ``min_n`` nodes: ``drop`` (the
    neighbour at position 1 reads as a zero row), ``merge`` (neighbours 1 and 2 both read as
    ``h_1 + h_2``), ``scale`` (neighbour 1 reads as ``4 h_1``) or ``keep_one`` (every row but
    neighbour 1's, the node's own included, scaled by 1e-6). Everything else the server does is
    honest: the results are the announced maps of these bases, so every tag check passes."""

    MODES = ("drop", "merge", "scale", "keep_one")

    def __init__(self, variant: str, mode: str, min_n: int = 3) -> None:
        if mode not in self.MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {self.MODES}")
        super().__init__()
        self.variant, self.mode, self.min_n = variant, mode, min_n

    def orthogonal(self, batch: int, size: int) -> np.ndarray:
        q = super().orthogonal(batch, size)
        n = size if self.variant == "vector" else size // 2
        if n < self.min_n:
            return q
        q = q.copy()
        for first in (0,) if self.variant == "vector" else (0, n):  # matrix: u_1j and u_2j alike
            cols = q[:, :, first : first + n]
            if self.mode == "drop":
                cols[:, :, 1] = 0.0
            elif self.mode == "merge":
                cols[:, :, 1] = cols[:, :, 2]
            elif self.mode == "scale":
                cols[:, :, 1] *= 2.0
            else:
                keep = cols[:, :, 1].copy()
                cols *= 1e-3
                cols[:, :, 1] = keep
        return q


def _read_back_error(enc: Encodings, truth: np.ndarray) -> float:
    """Largest distance between the neighbours' rows a client's encodings give back (the variant's
    identity, as the layer reads them) and the true rows."""
    worst = 0.0
    for b in enc.buckets:
        left, c = b.bases.kind.left_inverse(b.bases.p, b.bases.q)
        back = np.einsum("bmn,bmd->bnd", left, b.K2.double().numpy()) / c
        worst = max(worst, float(np.abs(back - truth[b.bases.neighbours]).max()))
    return worst


def chosen_bases_attack(setting: AttackSetting, mode: str = "scale") -> AttackOutcome:
    """The server alone draws bases off the variant's identity (:class:`TamperedBases`), computes
    every result honestly for them, and every client used to accept: a sixth red-team pass (2026-11-27)
    dropped, merged, scaled or isolated neighbours' rows in the layer's inputs of every node with at
    least 3 neighbours, own nodes' too, unseen (732 of 732 on the test graph); isolating one row per
    node also let trap weights read single rows out of the secure aggregate. Now each client checks
    the identity on random probes (:func:`fedgat.protocols.pretrain_checks.check_basis_identity`).
    ``targets``: the clients; ``recovered``: those that completed on the tampered bases;
    ``detected``: every client refused them with a typed error."""
    clients = setting.partition.num_clients

    def server(parties: PretrainParties) -> ServerPretrain:
        args = _server_args(parties, setting, 16 << 20)
        return ServerPretrain(**{**args, "bases_rng": TamperedBases(setting.variant, mode)})

    parties = _build(setting, server=server)
    driver = _drive(parties)
    refusals = {c: [str(e) for e in _rejections(driver, c)] for c in range(clients)}
    completed = [c for c in range(clients) if parties.clients[c].done]
    errors = [
        _read_back_error(enc, setting.truth)
        for c in completed
        if (enc := parties.clients[c].encodings) is not None and enc.buckets
    ]
    refused = [c for c, r in refusals.items() if any("read their neighbours' rows back" in e for e in r)]
    return AttackOutcome(
        "chosen_bases",
        clients,
        len(completed),
        len(refused) == clients and not completed,
        detail={
            "mode": mode,
            "clients_completed": completed,
            "clients_refused": refused,
            "read_back_error": max(errors) if errors else None,
            "first_error": next((r[0] for r in refusals.values() if r), None),
            "upload_window": setting.upload_window,
        },
    )


# ---------------------------------------------------------------------- swapped own rows
class RowSwappingServer(ServerPretrain):
    """A server that, in the bases of ``victim`` only, puts row ``u2`` in place of ``u`` in the
    neighbourhood of the victim's foreign node ``v``, where ``u``, ``u2`` and ``v`` all belong to one
    owner ``d`` and ``d`` releases ``u2`` to the victim for another of its nodes; it computes ``d``'s
    partial of ``v`` over the swapped neighbourhood. The swapped row carries ``d``'s tags for ``u2``,
    so the victim's tag check passes: only ``d``'s statement of ``v``'s neighbourhood shows the swap
    (known break 5, closed in frame version 10)."""

    def __init__(self, *args: Any, swap: tuple[int, int, int, int], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.swap = swap
        self.swapped = 0

    def _draw_plan(self) -> list[Message]:
        real = _pretrain_server.plan_shares

        def swapped(*args: Any, **kw: Any) -> RoundPlan:
            plan = real(*args, **kw)
            victim, v, u, u2 = self.swap
            views = []
            for view in plan.views[victim]:
                at = (view.nodes[:, None] == v) & (view.neighbours == u)
                if at.any():
                    view = dataclasses.replace(view, neighbours=np.where(at, u2, view.neighbours))
                    self.swapped += int(at.sum())
                views.append(view)
            plan.views[victim] = views
            assert plan.shares is not None and kw.get("labels") is not None
            plan.shares[victim] = recipient_shares(victim, views, kw["labels"], kw["layout"])
            plan.buckets, plan.recipients = share_order(plan.shares)
            return plan

        with mock.patch.object(_pretrain_server, "plan_shares", swapped):
            return super()._draw_plan()


class _Agreeing:
    """An owner's statement that agrees with whatever neighbourhoods the bases give its nodes."""

    def __init__(self, neighbours: np.ndarray) -> None:
        self.neighbours = neighbours

    def rows(self, nodes: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        return np.ones(len(nodes), bool), self.neighbours[: len(nodes)]


@contextlib.contextmanager
def statements_unchecked() -> Iterator[None]:
    """Recipients check foreign neighbourhoods as before frame version 10: every other check in
    place, but each owner's statement taken to agree with whatever the bases say (what
    :func:`row_swap_attack` recovers against; for measuring that the attack has teeth)."""
    from fedgat.protocols import pretrain_client

    real = pretrain_client.check_foreign_neighbourhoods

    def lenient(
        me: int,
        local: Any,
        claims: Any,
        nodes: np.ndarray,
        neighbours: np.ndarray,
        owners: np.ndarray,
        *,
        stated: Any,
    ) -> None:
        for d in np.unique(owners[:, 0]).tolist():  # each foreign node's own label: its owner's
            sel = owners[:, 0] == d
            agree: dict[int, Any] = {d: _Agreeing(neighbours[sel])}
            real(me, local, claims, nodes[sel], neighbours[sel], owners[sel], stated=agree)

    with mock.patch.object(pretrain_client, "check_foreign_neighbourhoods", lenient):
        yield


def row_swap_target(partition: Partition) -> tuple[int, int, int, int] | None:
    """``(victim, v, u, u2)``: ``v`` is a foreign node the victim needs, ``u`` a neighbour of ``v``
    with ``v``'s owner ``d``, and ``u2`` another of ``d``'s rows released to the victim that is not
    in ``v``'s neighbourhood (the lowest ids that fit)."""
    owner, nbh = partition.owner, partition.neighbourhoods
    for a, cp in enumerate(partition.clients):
        released = foreign_rows(partition, a)
        for v in cp.needed[~np.isin(cp.needed, cp.owned)].tolist():
            d, row = int(owner[v]), nbh.row(int(v))
            others = released[(owner[released] == d) & ~np.isin(released, row)]
            own = [int(u) for u in row.tolist() if u != v and owner[u] == d]
            if own and len(others):
                return a, int(v), own[0], int(others[0])
    return None


def _node_rows(enc: Encodings, node: int) -> torch.Tensor:
    """Node ``node``'s encoding rows (:math:`h_i` and :math:`K_2` or :math:`V`), in float64."""
    for b in enc.buckets:
        at = np.flatnonzero(b.bases.nodes == node)
        if len(at):
            k = int(at[0])
            return torch.cat([b.h_self[k : k + 1], b.K2[k]]).double()
    raise KeyError(f"no encoding of node {node}")


def row_swap_attack(setting: AttackSetting) -> AttackOutcome:
    """Known break 5: the server alone swaps, in one victim's bases, a row of a foreign node's owner
    for another row that owner released to the victim (:class:`RowSwappingServer`). The values pass
    the owner's tags, so before frame version 10 the victim completed on an encoding of ``v`` over a
    neighbourhood the owner never had. Now each owner signs the neighbourhoods of its nodes a
    recipient needs (:class:`~fedgat.protocols.messages.NeighbourhoodStatement`) and the recipient
    checks its bases against them. ``detected``: the victim refused the bases with a typed error
    naming the statement; ``recovered``: 1 if it completed."""
    target = row_swap_target(setting.partition)
    if target is None:
        return AttackOutcome("row_swap", 0, 0, False, ran=False, detail={"note": "no target"})
    victim, v, u, u2 = target
    made: dict[str, RowSwappingServer] = {}

    def server(parties: PretrainParties) -> ServerPretrain:
        made["s"] = RowSwappingServer(**_server_args(parties, setting, 16 << 20), swap=target)
        return made["s"]

    parties = _build(setting, server=server)
    driver = _drive(parties)
    refusals = [str(e) for e in _rejections(driver, victim)]
    completed = parties.clients[victim].done
    error = None
    if completed:  # how far the victim's encoding of v is from the honest one (same bases)
        from fedgat.pipeline import run_plaintext_pretraining

        honest = run_plaintext_pretraining(
            setting.graph, setting.partition, setting.variant, seed=setting.seed
        )
        got = parties.clients[victim].encodings
        assert got is not None
        error = float((_node_rows(got, v) - _node_rows(honest[victim], v)).abs().max())
    return AttackOutcome(
        "row_swap",
        1,
        int(completed),
        bool(refusals) and not completed,
        detail={
            "victim": victim,
            "node": v,
            "owner": int(setting.partition.owner[v]),
            "swapped_out": u,
            "swapped_in": u2,
            "positions_swapped": made["s"].swapped,
            "victim_encoding_error": error,
            "victim_completed": completed,
            "victim_error": refusals[0] if refusals else None,
            "upload_window": setting.upload_window,
        },
    )


# ---------------------------------------------------------------------- the verdict as an oracle
class ProbingServer(TamperingServer):
    """A server that adds ``lam`` times column ``column`` of the upload of node ``target`` (under the
    victim's key, as the victim's owner sent it) into the same column of the first result it sends
    the victim: one plaintext multiply-add on ciphertexts it holds, nonzero in one slot, in block 0
    (the result's first row, which the victim reads and checks). Every other slot is left as it
    was, so the victim's tag check misses by ``lam * u[column]`` times its check vector: unpadded it
    refused iff the foreign feature is not zero (known break 22, a thirteenth review pass).

    ``target`` may name several nodes: the probe is then the *sum* of that column over their uploads
    (a statistic of an owner's rows, whose pads add up to a spread of only ``sigma sqrt(N)``: a
    sixteenth review pass)."""

    def __init__(
        self, *args: Any, victim: int, target: int | Sequence[int], column: int, lam: float, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.victim, self.column, self.lam = victim, column, lam
        self.targets = [int(target)] if isinstance(target, int | np.integer) else [int(t) for t in target]
        self.probed: int | None = None

    def _tampered(
        self, results: Iterator[tuple[int, int, NodeResult]]
    ) -> Iterator[tuple[int, int, NodeResult]]:
        assert self.plan is not None and self.layout is not None
        for g, s, result in results:
            if self.probed is None and self.plan.recipients[self.plan_position(g, s)][0] == self.victim:
                ctx, spool = self.contexts[self.victim], self._spool(self.victim)
                chunk, slot = divmod(self.column, self.layout.width)
                mask = np.zeros((len(self.targets), ctx.slots))
                mask[:, slot] = self.lam
                blobs = list(result.row_blobs)
                probe = linear_combination(ctx, [spool.get(t)[chunk] for t in self.targets], mask)
                blobs[chunk] = serialize(ctx, deserialize(ctx, blobs[chunk], level="result") + probe)
                result, self.probed = NodeResult(result.node, blobs), int(result.node)
            yield g, s, result


def verdict_oracle_target(partition: Partition, truth: np.ndarray) -> tuple[int, int] | None:
    """``(victim, j)``: the first recipient and the first foreign row released to it with both zero
    and non-zero features (else the first foreign row)."""
    victim = first_recipient(partition)
    if victim is None:
        return None
    rows = foreign_rows(partition, victim)
    if not len(rows):
        return None
    mixed = [int(j) for j in rows.tolist() if 0 < np.count_nonzero(truth[j]) < truth.shape[1]]
    return victim, (mixed[0] if mixed else int(rows[0]))


def verdict_oracle_attack(setting: AttackSetting, probes: int = 8, lam: float = 100.0) -> AttackOutcome:
    """Known break 22 (a thirteenth review pass; bounded since frame version 12): the
    server alone tries to read whether features of a foreign row are zero, one feature per
    session, off the victim's verdict (:class:`ProbingServer`). Unpadded rows gave the bit exactly;
    padded ones (:attr:`~fedgat.protocols.PretrainConfig.upload_pad`) make the term ``lam (h + rho)``
    non-zero whatever ``h``, so every probe is refused and the verdicts read nothing. The columns
    probed: half among the row's non-zero features and half
    among its zeros (the first of each; all of one kind when the row has no other), so the read-out
    is scored on both answers. ``targets``: the probes (one session each); ``recovered``: those the
    verdict answered correctly (refused iff non-zero), counted only when the verdicts varied and
    both kinds of feature were probed (a constant verdict, or a probe set whose answer the server
    knew, reads nothing); ``detected``: some probe was refused (the victim caught the server).
    Unpadded, on a bag-of-words graph (Cora: 98.7 % zeros) the zeros were which words a foreign
    paper does not contain, read without a
    refusal."""
    truth = setting.truth
    target = verdict_oracle_target(setting.partition, truth)
    if target is None:
        return AttackOutcome("verdict_oracle", 0, 0, False, ran=False, detail={"note": "no foreign row"})
    victim, j = target
    nonzero, zero = np.flatnonzero(truth[j] != 0), np.flatnonzero(truth[j] == 0)
    half = min(probes // 2, len(zero)) if len(nonzero) else 0
    columns = [*nonzero[: probes - half].tolist(), *zero[:half].tolist()]
    reads, completed, pad = [], 0, 0.0
    for column in columns:

        def server(parties: PretrainParties, column: int = column) -> ServerPretrain:
            return ProbingServer(
                **_server_args(parties, setting, 1), victim=victim, target=j, column=column, lam=lam
            )

        parties = _build(setting, server=server, result_batch_bytes=1)
        driver = _drive(parties)
        reads.append(bool(_rejections(driver, victim)))
        completed += bool(parties.clients[victim].done)
        pad = parties.config.upload_pad
    answers = truth[j, columns] != 0
    # a verdict that never varies reads nothing (nor does a probe set of one kind of feature: the
    # server knew the answer), so only a varying read-out scores
    varied = len(set(reads)) > 1 and len(set(answers.tolist())) > 1
    correct = int(np.sum(np.array(reads, dtype=bool) == answers)) if varied else 0
    return AttackOutcome(
        "verdict_oracle",
        len(columns),
        correct,
        any(reads),
        detail={
            "note": (
                "known break 22: the server alone adds lam times one column of a foreign upload into "
                "a checked slot of the victim's result, one session per probe, and reads 'non-zero' "
                "off a refusal. Unpadded (upload_pad 0) the victim refused iff the feature was "
                "non-zero; with padded rows the term is lam (h + rho), refused whatever h, and since "
                "frame version 13 (Gaussian pads) any test is bounded by the session's per-row epsilon "
                "(verdict_epsilon_per_session, one recipient, delta 1e-5). recovered: "
                "probes answered correctly, when the verdicts varied and both kinds of feature were "
                "probed (a constant verdict reads nothing); detected: some probe was refused (the "
                "victim caught the server)"
            ),
            "upload_pad": pad,
            "verdict_epsilon_per_session": verdict_epsilon(pad, 1),
            "victim": victim,
            "node": j,
            "owner": int(setting.partition.owner[j]),
            "columns": [int(c) for c in columns],
            "nonzero": [bool(a) for a in answers],
            "refused": reads,
            "sessions": len(columns),
            "victim_completed_sessions": completed,
            "lam": lam,
            "upload_window": setting.upload_window,
        },
    )


# ------------------------------------------------------------------------ split roster
class SplitRosterServer(ServerPretrain):
    """A server that shows two clients ``a`` and ``b`` (which share no edge) rosters without each
    other, and the others the full one: each message to or from ``a`` (``b``) carries the key set of
    its own view, and the plan expects no rows between them. A third pass of the red-team review
    (2026-11-27) used this view split to drop a bordering owner's claims to ``b`` from ``a``'s set, and
    then swap ``b``'s rows in foreign neighbourhoods unseen; since frame version 9 sealed check keys
    are signed over the signer's key set, and owners refuse keys of another view."""

    def __init__(self, *args: Any, hide: Mapping[int, int], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.hide = dict(hide)  # recipient -> the party left out of its roster
        self._views: dict[int, bytes] = {}
        check = self.verifier.check_fingerprint

        def check_in_view(msg: Message, **kw: Any) -> None:
            with self._in_view(msg.sender):
                check(msg, **kw)

        self.verifier.check_fingerprint = check_in_view  # type: ignore[method-assign]

    def _view(self, recipient: int) -> list[int]:
        return [c for c in self.participants if c != self.hide[recipient]]

    @contextlib.contextmanager
    def _in_view(self, party: int) -> Iterator[None]:
        view = self._views.get(party)
        saved = self.verifier.fingerprint
        if view is not None and saved is not None:
            self.verifier.fingerprint = view
        try:
            yield
        finally:
            self.verifier.fingerprint = saved

    def _new(self, cls: type, recipient: int, **fields: Any) -> Message:
        if recipient in self.hide and self.verifier.fingerprint is not None:
            if recipient not in self._views:
                prints = {c: self._announced[c].context_fingerprint for c in self._view(recipient)}
                self._views[recipient] = keyset_fingerprint(self.session, prints)
            if cls is RosterReady:
                fields["participants"] = np.array(self._view(recipient), dtype=np.int64)
            with self._in_view(recipient):
                return super()._new(cls, recipient, **fields)
        return super()._new(cls, recipient, **fields)

    def _maybe_ready(self) -> list[Message]:
        out = super()._maybe_ready()
        for r, h in self.hide.items():  # the hidden pairs exchange no rows
            for key in ((h, r), (r, h)):
                self._expected.pop(key, None)
        return out

    # it stops before computing: what is measured is whether the split view survives the exchange of
    # check keys (the review's swap of the hidden party's rows then needs a plan of its own)
    def _compute_results(self) -> Iterator[tuple[int, int, NodeResult]]:
        return iter(())

    def _recipient_results(self, recipient: int) -> Iterator[tuple[int, int, NodeResult]]:
        return iter(())


def split_roster_target(setting: AttackSetting) -> tuple[int, int] | None:
    """Two clients that share no edge (the lowest ids), or None."""
    part = setting.partition
    touching = client_borders(setting)
    for a in range(part.num_clients):
        for b in range(a + 1, part.num_clients):
            if (a, b) not in touching:
                return a, b
    return None


def split_roster_attack(setting: AttackSetting) -> AttackOutcome:
    """The server shows clients ``a`` and ``b`` (no shared edge) rosters without each other and the
    rest the full roster (:class:`SplitRosterServer`, which stops before computing). ``detected``: an
    honest party refused check keys signed over another view of the round, or a roster that leaves
    out a client its bordering owners attend over; ``recovered``: 1 if ``a``
    accepted every check key it needs on its split view and went on to upload (the state from which
    the review swapped ``b``'s rows in ``a``'s foreign neighbourhoods: 91 rows in 44 nodes, every
    client completed)."""
    target = split_roster_target(setting)
    if target is None:
        return AttackOutcome(
            "split_roster", 0, 0, False, ran=False, detail={"note": "every two clients share an edge"}
        )
    a, b = target

    def server(parties: PretrainParties) -> ServerPretrain:
        return SplitRosterServer(**_server_args(parties, setting, 16 << 20), hide={a: b, b: a})

    parties = _build(setting, server=server)
    driver = _drive(parties)
    # owners refuse check keys signed over another view; a client bordering an owner that attends over
    # the hidden party refuses the roster itself (check_claims_complete)
    signs = ("over this round's participants", "which the roster leaves out")
    refusals = [str(e) for _, e in driver.rejected if any(t in str(e) for t in signs)]
    victim = parties.clients[a]
    went_on = victim.state not in (ClientState.AWAIT_ROSTER, ClientState.AWAIT_CHECK_KEYS)
    return AttackOutcome(
        "split_roster",
        1,
        int(went_on),
        bool(refusals) and not went_on,
        detail={
            "hidden_pair": [a, b],
            "victim_participants": [int(p) for p in victim.participants],
            "victim_went_on": went_on,
            "refusals": len(refusals),
            "first_refusal": refusals[0] if refusals else None,
            "upload_window": setting.upload_window,
        },
    )


# ------------------------------------------------------------- server + one client, forging
class ColluderForgingServer(TamperingServer):
    """A server colluding with client ``colluder`` (whose secrets it holds): it adds ``delta`` (norm
    0.5) to row 0 of one partial for the first recipient other than the colluder, with the tag
    columns ``<r, delta>`` for the check vectors ``r`` that recipient gave the colluder (the PRF part
    is 0: ``delta`` has no sources). ``own`` picks the partial of the colluder's own rows (True) or
    of an honest third party's (False). It tampers with both compute paths (:class:`TamperingServer`)."""

    def __init__(self, *args: Any, colluder: ClientPretrain, own: bool, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.colluder, self.own = colluder, own
        self.victim: int | None = None
        self.target: tuple[int, int] | None = None  # (node, owner) of the forged partial
        self.delta: np.ndarray | None = None

    def _draw_plan(self) -> list[Message]:
        # both paths draw the plan here: at compute (no window) or when the roster is ready (window)
        out = super()._draw_plan()
        assert self.plan is not None and self.plan.shares is not None
        me = self.colluder.party_id
        for victim, shares in sorted(self.plan.shares.items()):
            if victim == me:
                continue
            bucket = next((b for b in shares if (b.owner == me) == self.own), None)
            if bucket is not None:
                assert bucket.owner is not None
                self.victim, self.target = victim, (int(bucket.nodes[0]), bucket.owner)
                break
        return out

    def _tampered(
        self, results: Iterator[tuple[int, int, NodeResult]]
    ) -> Iterator[tuple[int, int, NodeResult]]:
        assert self.plan is not None
        for g, s, result in results:
            bucket = self.plan.buckets[g]
            assert isinstance(bucket, PackedShares)
            if (
                self.plan.recipients[self.plan_position(g, s)][0] == self.victim
                and (result.node, bucket.owner) == self.target
            ):
                result = self._forge(bucket, s)
            yield g, s, result

    def _forge(self, bucket: PackedShares, s: int) -> NodeResult:
        """The target's pack, ``delta`` added to the target's row 0 (the others' rows honest)."""
        assert self.layout is not None and self._dim is not None
        assert self.victim is not None and self.target is not None
        d = self._dim
        vectors = self.colluder._owner_keys[self.victim].vectors(d)  # r_{victim, colluder}
        delta = np.random.default_rng(7).standard_normal(d)
        self.delta = delta * 0.5 / np.linalg.norm(delta)
        row = np.zeros(self.layout.d)
        row[:d] = self.delta
        row[d : d + vectors.shape[0]] = vectors @ self.delta
        ctx, spool, share = self.contexts[self.victim], self._spool(self.victim), bucket.share
        slots = [int(x) for x in bucket.packs[s]]  # the target first (its pack's first node)
        parts = [([spool.get(int(j)) for j in share.neighbours[x]], share.coefficients(x)) for x in slots]
        fresh = [deserialize(ctx, blob, level="fresh") for blob in encrypt_rows(ctx, row[None], self.layout)]
        sources, coef = parts[0]
        extra = np.zeros((coef.shape[0], 1))
        extra[0, 0] = 1.0  # the fresh "source" enters row 0 only
        parts[0] = ([*sources, fresh], np.hstack([coef, extra]))
        return _encode_pack(ctx, self.layout, self.target[0], parts)


def colluder_forgery_run(
    setting: AttackSetting, *, own: bool, colluder: int | None = None
) -> tuple[PretrainParties, AttackDriver, ColluderForgingServer]:
    """Run a round whose server forges one partial with ``colluder``'s keys (default the last client);
    returns the parties, the driver (its ``rejected``, ``upload_grants``) and the server (victim,
    target, delta). With an upload window a victim that refuses aborts without uploading its rows
    for the recipients after it: the round then stalls and ends idle, the others not done."""
    made: dict[str, ColluderForgingServer] = {}

    def server(parties: PretrainParties) -> ServerPretrain:
        pick = max(parties.clients) if colluder is None else colluder
        made["server"] = ColluderForgingServer(
            **_server_args(parties, setting, 16 << 20), colluder=parties.clients[pick], own=own
        )
        return made["server"]

    parties = _build(setting, server=server)
    driver = _drive(parties)
    return parties, driver, made["server"]


def colluder_forgery_attack(setting: AttackSetting, colluder: int | None = None) -> AttackOutcome:
    """``colluder_forgery``: the server and one client forge a partial of an honest third owner's
    rows for a victim, with the check keys the victim gave the colluder (which predicted every tag
    when one set of check vectors served all owners, protocol version 2). ``recovered``: 1 when the
    victim accepted the forgery into the encodings it trains on; ``detected``: it refused it with
    :class:`~fedgat.protocols.errors.ResultRejectedError` naming (locally) the node and the owner, and aborted."""
    parties, driver, server = colluder_forgery_run(setting, own=False, colluder=colluder)
    if server.victim is None or server.target is None:
        return AttackOutcome(
            "colluder_forgery", 0, 0, False, ran=False, detail={"note": "no partial of a third owner"}
        )
    first = next(iter(_rejections(driver, server.victim)), None)
    victim = parties.clients[server.victim]
    detected = (
        isinstance(first, ResultRejectedError)
        and (first.node, first.owners) == (server.target[0], (server.target[1],))
        and not victim.done
    )
    return AttackOutcome(
        "colluder_forgery",
        1,
        int(victim.done),
        detected,
        detail={
            "colluder": server.colluder.party_id,
            "victim": server.victim,
            "node": server.target[0],
            "owner": server.target[1],
            "victim_completed": victim.done,
            "upload_window": setting.upload_window,
            "upload_grants": driver.upload_grants,
            "note": (
                "server + one client add a chosen vector to an honest owner's partial with the tags the "
                "colluder's check keys predict; keys are per (recipient, owner), so they predict nothing of "
                "another owner's partial. The pair can still change the partial of the colluder's own rows"
            ),
        },
    )


# --------------------------------------------------------------------- server + one client
def honest_round(setting: AttackSetting, transcript: Transcript | None = None) -> PretrainParties:
    """An honest round of the real parties over an in-process transport (recorded in ``transcript``);
    returns the finished parties (their keys: what a colluder holds).

    Raises:
        ProtocolError: a party rejected a frame. RuntimeError: the round did not complete.
    """
    parties = _build(setting)
    transport = InProcessTransport(transcript)
    try:
        run_parties(transport, parties.all())
    finally:
        parties.server.close()
    failed = [p for p in parties.all().values() if not p.done]
    if failed:
        raise RuntimeError(f"the honest round did not complete: parties {[p.party_id for p in failed]}")
    return parties


def collusion_attack(
    transcript: Transcript, parties: PretrainParties, truth: np.ndarray, colluder: int
) -> AttackOutcome:
    """``server_plus_one_client`` on an honest round's ``transcript``: the colluder decrypts every
    ciphertext the server received (uploads) or sent (results) with its own secret key, ignoring the
    envelopes' key fingerprints, and compares what it gets with the ground truth (an upload with its
    node's row; a result's rows with the rows of the node and its neighbourhood, read from the bases
    the server sent).

    ``targets``: foreign nodes (not the colluder's) whose rows the server holds in a ciphertext made
    for another client and that were not released to the colluder; ``recovered``: those the colluder
    gets at cosine >= 0.99. The rows released to the colluder (its honest view) are counted apart."""
    client = parties.clients[colluder]
    holder, layout = client.holder, client.layout
    server = parties.server.party_id
    if holder is None or layout is None:
        raise ValueError("the round did not run: the colluder has no key")
    dim = truth.shape[1]
    mine = set(client.owned.tolist())
    released: dict[int, float] = {}  # rows made for the colluder: best cosine
    others: dict[int, float] = {}  # rows of others made for other clients: best cosine
    uploads = 0
    for sender, recipient, node, blobs in _upload_groups(_server_uploads(transcript, server)):
        uploads += 1
        vectors = [raw_decrypt(holder, b) for b in blobs]
        if any(v is None for v in vectors):
            continue
        row = layout.unpack([v for v in vectors if v is not None], 1)
        row = (_unpadded(client, sender, node, row) if recipient == colluder else row)[:, :dim]
        cos = float(cosines(row, truth[[node]])[0, 0])
        book = released if recipient == colluder else others
        book[node] = max(book.get(node, -1.0), cos)
    neighbours: dict[tuple[int, int], dict[int, np.ndarray]] = {}
    results = grants = 0
    for e in transcript.entries:
        grants += e.sender == server and e.type_name == "UploadGrant"
        if e.sender != server or e.type_name not in ("EncodingBases", "EncodingResults") or e.data is None:
            continue
        msg = decode_message(e.data)
        if isinstance(msg, EncodingBases):
            neighbours[(msg.recipient, msg.bucket)] = dict(
                zip(msg.nodes.tolist(), msg.neighbours, strict=True)
            )
            continue
        assert isinstance(msg, EncodingResults)
        for item in msg.items:
            results += 1
            vectors = [raw_decrypt(holder, b) for b in item.row_blobs]
            if any(v is None for v in vectors):
                continue
            groups = len(item.row_blobs) // layout.chunks
            rows = layout.unpack_blocks([v for v in vectors if v is not None], groups * layout.blocks)[
                :, :dim
            ]
            ids = np.asarray(neighbours[(msg.recipient, msg.bucket)][item.node], dtype=np.int64)
            best = cosines(rows, truth[ids]).max(axis=0)
            book = released if msg.recipient == colluder else others
            for u, cos in zip(ids.tolist(), best.tolist(), strict=True):
                if u not in mine:
                    book[u] = max(book.get(u, -1.0), cos)
    target_nodes = sorted(u for u in others if u not in released and u not in mine)
    recovered = sum(others[u] >= RECOVERY_COSINE for u in target_nodes)
    honest = sorted(u for u in released if u not in mine)
    return AttackOutcome(
        "server_plus_one_client",
        len(target_nodes),
        int(recovered),
        False,
        detail={
            "colluder": colluder,
            "uploads_decrypted": uploads,
            "results_decrypted": results,
            "released_to_colluder": len(honest),
            "released_to_colluder_recovered": int(sum(released[u] >= RECOVERY_COSINE for u in honest)),
            "best_cosine_not_released": max((others[u] for u in target_nodes), default=None),
            "upload_window": parties.server.config.upload_window,
            "upload_grants": int(grants),
            "note": (
                "the colluder decrypts every ciphertext the server held with its own key (fingerprints "
                "ignored); targets: foreign rows held only in ciphertexts made for other clients. Rows "
                "released to the colluder are its honest view (released_to_colluder*). Nothing to detect: "
                "the colluding pair learns without deviating from the protocol in any message"
            ),
        },
    )
