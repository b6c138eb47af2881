r"""Confirmed edges: which rows an owner releases to whom, decided by the owner itself.

A cross-client edge counts only when the owners of *both* endpoints claim it. Each client signs,
per client it borders, an :class:`~fedgat.protocols.messages.EdgeClaims`: the graph edges between
its nodes and the peer's, and for each whether the peer's node is in the attention neighbourhood
of its own (``uses``). The server relays the claims an owner needs to check a release; it cannot
forge one (signatures) and a client can claim only its own side.

Recipient :math:`a` needs, for every node :math:`v` it needs (its own nodes and their attention
neighbours), the rows of :math:`v`'s attention neighbourhood. Owner :math:`b` therefore releases its
row :math:`u` to :math:`a` only if some :math:`v` *uses* :math:`u` and :math:`v` is needed by
:math:`a`, each fact backed by the claims of the owners involved (:func:`releases`):

* (a) :math:`v` owned by :math:`a`: :math:`a` claims ``(v, u)`` as used and :math:`b` has the edge
  ``(u, v)`` *to a node of* :math:`a`;
* (b) :math:`v` owned by :math:`b`: :math:`u \in N(v)` (:math:`b`'s own data) and :math:`a` claims a
  used edge ``(i, v)`` that :math:`b` has, to a node of :math:`a`;
* (c) :math:`v` owned by :math:`c`: :math:`c` claims ``(v, u)`` as used and :math:`b` has the edge
  to a node of :math:`c`, and :math:`a` claims a used edge ``(i, v)`` that :math:`c` claims too.

"A node of :math:`a`" is :math:`b`'s own record of who owns the other end of its edge
(:attr:`LocalGraph.cross_owner`), never the claimer's word: without it :math:`a` could claim, as its
own, a node :math:`v` of a third client that :math:`b` borders, and receive :math:`v`'s neighbours'
rows (measured before the check: 93 rows beyond the colluder's honest view on a 400-node graph with
a server that skips its claim check; the audit's ``third_party_claims``).

So neither the server nor a single client can invent a need: a fake edge of :math:`a` to
:math:`b`'s node is not in :math:`b`'s edges; a claim over :math:`b`'s edge to a third client's node
is not one of :math:`b`'s edges to :math:`a`; a fake 2-hop need must be claimed by the middle
node's honest owner. What the claims reveal: an owner learns, besides its own edges, the claimed
edges between the clients it borders and any other client (those it needs to check (c)).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from .errors import PayloadError, check_signature
from .messages import (
    EdgeClaims,
    GraphAnnounce,
    KeyAnnounce,
    NeighbourhoodStatement,
    claim_bytes,
    claim_keys_digest,
    neighbourhood_bytes,
)
from .roster import Roster

__all__ = [
    "ClaimSet",
    "LocalGraph",
    "OwnerMap",
    "attended_by",
    "check_claims",
    "check_claims_complete",
    "check_foreign_neighbourhoods",
    "check_statement",
    "expected_releases",
    "neighbourhoods_of",
    "relay_targets",
    "releases",
    "verify_claim",
    "verify_statement",
]

_SHIFT = np.int64(1 << 32)


def _keys(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.int64) * _SHIFT + np.asarray(b, dtype=np.int64)


@dataclass(frozen=True)
class LocalGraph:
    """What a client knows of the graph: its ``owned`` nodes (sorted), their attention
    neighbourhoods (``indptr``/``indices``, CSR over ``owned``, self first), and its cross-client
    graph edges ``cross`` (k, 2) = (own node, foreign node) with the foreign node's owner in
    ``cross_owner`` (an organisation knows which organisation the other end of its edge belongs to).

    Raises:
        PayloadError: an attention neighbour that is neither owned nor the end of a cross edge.
    """

    owned: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    cross: np.ndarray
    cross_owner: np.ndarray

    def __post_init__(self) -> None:
        cross = np.asarray(self.cross, dtype=np.int64).reshape(-1, 2)
        cross_owner = np.asarray(self.cross_owner, dtype=np.int64).reshape(-1)
        if len(cross_owner) != len(cross):
            raise PayloadError("one owner per cross edge")
        keys = _keys(cross[:, 0], cross[:, 1])
        order = np.unique(keys, return_index=True)[1]
        object.__setattr__(self, "cross", cross[order])
        object.__setattr__(self, "cross_owner", cross_owner[order])
        if np.any(np.isin(self.cross[:, 1], self.owned)) or not np.all(np.isin(self.cross[:, 0], self.owned)):
            raise PayloadError("a cross edge joins an owned node to a node of another client")
        src, dst = self.attention_pairs()
        foreign = ~np.isin(dst, self.owned)
        if not np.all(np.isin(_keys(src[foreign], dst[foreign]), self.cross_keys)):
            raise PayloadError("an attention neighbour of another client is not the end of a cross edge")

    @property
    def cross_keys(self) -> np.ndarray:
        return _keys(self.cross[:, 0], self.cross[:, 1])

    def attention_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(v, u)`` for every owned ``v`` and every ``u`` in its attention neighbourhood."""
        src = np.repeat(np.asarray(self.owned, dtype=np.int64), np.diff(self.indptr))
        return src, np.asarray(self.indices, dtype=np.int64)

    def claims(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per bordering client: ``(edges (k, 2) sorted, uses (k,) 0/1)`` of this client's claim."""
        src, dst = self.attention_pairs()
        used = np.isin(self.cross_keys, _keys(src, dst))
        return {
            int(p): (self.cross[self.cross_owner == p], used[self.cross_owner == p].astype(np.int64))
            for p in np.unique(self.cross_owner)
        }

    def peers(self) -> list[int]:
        return [int(p) for p in np.unique(self.cross_owner)]

    def attended(self, peer: int) -> np.ndarray:
        """The nodes of ``peer`` (as this client records their owner) that its own nodes attend over,
        sorted: the foreign nodes of ``peer``'s it needs."""
        src, dst = self.attention_pairs()
        to_peer = self.cross_owner == peer
        used = np.isin(self.cross_keys[to_peer], _keys(src, dst))
        return np.unique(self.cross[to_peer][used][:, 1])


@dataclass(frozen=True)
class ClaimSet:
    """Verified claims by ``(claimer, peer)``: ``edges`` keys (sorted) and the used subset; and per
    claimer the ``peers`` its claims name (every client it claims edges to)."""

    edges: dict[tuple[int, int], np.ndarray]
    used: dict[tuple[int, int], np.ndarray]
    peers: dict[int, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, claims: Iterable[EdgeClaims]) -> ClaimSet:
        """Raises:
        PayloadError: two claims of one claimer name different peers."""
        edges: dict[tuple[int, int], np.ndarray] = {}
        used: dict[tuple[int, int], np.ndarray] = {}
        peers: dict[int, np.ndarray] = {}
        for c in claims:
            keys = _keys(c.edges[:, 0], c.edges[:, 1])
            edges[(c.claimer, c.peer)] = keys
            used[(c.claimer, c.peer)] = keys[c.uses.astype(bool)]
            stated = np.asarray(c.peers, dtype=np.int64)
            if c.claimer in peers and not np.array_equal(peers[c.claimer], stated):
                raise PayloadError(f"party {c.claimer}'s claims name different peers")
            peers[c.claimer] = stated
        return cls(edges, used, peers)

    def missing(self, claimer: int, participants: Iterable[int]) -> list[int]:
        """The participants ``claimer`` says it claims edges to whose claim is not here."""
        inside = set(participants)
        stated = set(self.peers.get(claimer, np.zeros(0, np.int64)).tolist()) & inside
        return sorted(p for p in stated if (claimer, p) not in self.edges)

    def get_edges(self, claimer: int, peer: int) -> np.ndarray:
        return self.edges.get((claimer, peer), np.zeros(0, np.int64))

    def get_used(self, claimer: int, peer: int) -> np.ndarray:
        return self.used.get((claimer, peer), np.zeros(0, np.int64))


def verify_claim(msg: EdgeClaims, roster: Roster, session: int, keys: KeyAnnounce) -> None:
    """Check the claimer's signature over its claim (the server relays it re-framed), bound to the
    session and to the claimer's session keys ``keys`` (its announcement, already checked).

    Raises:
        PayloadError: the claimer is not a client, or ``keys`` are another party's.
        SignatureError: the signature does not verify (also: a claim made under other session keys).
    """
    if not roster.is_client(msg.claimer) or not roster.is_client(msg.peer):
        raise PayloadError(f"a claim between parties {msg.claimer} and {msg.peer}, not both clients")
    if keys.party != msg.claimer:
        raise PayloadError(f"party {msg.claimer}'s claim checked against party {keys.party}'s keys")
    digest = claim_keys_digest(keys.hpke, keys.context_fingerprint)
    check_signature(
        roster.signing_key(msg.claimer),
        claim_bytes(session, msg.claimer, msg.peer, msg.edges, msg.uses, digest, msg.peers),
        msg.claim_signature,
        f"party {msg.claimer}'s claim of its edges to {msg.peer} is not signed by it under this session's keys",
    )


def _swap(keys: np.ndarray) -> np.ndarray:
    return (keys % _SHIFT) * _SHIFT + keys // _SHIFT


def neighbourhoods_of(
    owned: np.ndarray, indptr: np.ndarray, indices: np.ndarray, nodes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)``: the CSR neighbourhoods of ``nodes`` (all in ``owned``) taken out of
    those of ``owned`` (``indptr``, ``indices``)."""
    pos = np.searchsorted(owned, nodes)
    start, sizes = indptr[pos], np.diff(indptr)[pos]
    out = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return out, indices[np.repeat(start - out[:-1], sizes) + np.arange(int(out[-1]))]


def attended_by(me: int, local: LocalGraph, claims: ClaimSet, recipient: int) -> np.ndarray:
    """Owner ``me``'s nodes that ``recipient``'s nodes attend over (sorted): ``recipient``'s used
    claims to ``me`` whose edge ``me`` has, to a node it records as ``recipient``'s. These are the
    nodes of ``me`` the recipient needs, whose neighbourhoods ``me`` releases (rule b) and states
    (:class:`~fedgat.protocols.messages.NeighbourhoodStatement`)."""
    used = claims.get_used(recipient, me)
    mine = local.cross_keys[local.cross_owner == recipient]
    return np.unique(used[np.isin(_swap(used), mine)] % _SHIFT)


def verify_statement(msg: NeighbourhoodStatement, roster: Roster, session: int, keyset: bytes) -> None:
    """Check the owner's signature over its neighbourhood statement (relayed re-framed by the
    server), bound to the session and the round's key set.

    Raises:
        PayloadError: the owner or the recipient is not a client.
        SignatureError: the signature does not verify (also: another session or key set).
    """
    if not roster.is_client(msg.owner) or not roster.is_client(msg.recipient_party):
        raise PayloadError(
            f"a statement between parties {msg.owner} and {msg.recipient_party}, not both clients"
        )
    signed = neighbourhood_bytes(
        session, msg.owner, msg.recipient_party, keyset, msg.nodes, msg.indptr, msg.indices
    )
    check_signature(
        roster.signing_key(msg.owner),
        signed,
        msg.statement_signature,
        f"party {msg.owner}'s statement of its neighbourhoods for party {msg.recipient_party} is not signed by it "
        "for this round's key set",
    )


def check_statement(me: int, local: LocalGraph, msg: NeighbourhoodStatement) -> None:
    """Recipient ``me``'s check that an owner's statement covers exactly the owner's nodes ``me``'s
    nodes attend over, as ``me`` records them (:meth:`LocalGraph.attended`).

    Raises:
        PayloadError: a statement for another recipient, or over other nodes.
    """
    if msg.recipient_party != me:
        raise PayloadError(
            f"party {msg.owner}'s statement is for party {msg.recipient_party}, not this client"
        )
    if not np.array_equal(msg.nodes, local.attended(msg.owner)):
        raise PayloadError(
            f"party {msg.owner}'s statement covers other nodes than this client's nodes attend over"
        )


def releases(
    me: int, local: LocalGraph, claims: ClaimSet, recipients: Iterable[int]
) -> dict[int, np.ndarray]:
    """Owner ``me``'s releases: recipient -> sorted owned node ids whose rows it may receive,
    from ``me``'s own graph and the verified ``claims`` of the others (see the module docstring)."""
    owned = np.asarray(local.owned, dtype=np.int64)
    keys, ends = local.cross_keys, local.cross_owner  # (own, foreign) edges of me, foreign ends' owners

    def mine(peer: int) -> np.ndarray:  # my edges to nodes that peer owns, as I know them
        return keys[ends == peer]

    src, dst = local.attention_pairs()
    out: dict[int, np.ndarray] = {}
    for a in recipients:
        if a == me:
            continue
        rows: list[np.ndarray] = []
        # (a) a's node v uses my u: a's used claim (v, u), and my edge (u, v) to a node of a
        needed_mine = attended_by(me, local, claims, a)
        rows.append(needed_mine)
        # (b) a needs my node v (a's used claim (i, v), my edge (v, i)): v's neighbourhood, mine only
        at = np.isin(src, needed_mine)
        rows.append(dst[at][np.isin(dst[at], owned)])
        # (c) c's node v uses my u (c's used claim (v, u), my edge (u, v) to a node of c) and a needs v
        #     (a's used claim (i, v), c's edge (v, i))
        for c in {k[0] for k in claims.used if k[1] == me and k[0] not in (a, me)}:
            via = claims.get_used(c, me)
            via = via[np.isin(_swap(via), mine(c))]
            need = claims.get_used(a, c)
            need = need[np.isin(_swap(need), claims.get_edges(c, a))]
            v_needed = np.unique(need % _SHIFT)
            rows.append(via[np.isin(via // _SHIFT, v_needed)] % _SHIFT)
        got = np.unique(np.concatenate(rows)) if rows else np.zeros(0, np.int64)
        if len(got):
            out[int(a)] = got
    return out


def check_claims_complete(me: int, local: LocalGraph, claims: ClaimSet, participants: Iterable[int]) -> None:
    """Recipient ``me`` holds every claim of each participant it borders (``claims``: those of the
    round's participants, to any peer), its claim to ``me`` included (a sixth review pass withheld
    that one, then not required, and struck ``me``'s rows from the owner's nodes' neighbourhoods),
    each names ``me`` among its peers, and none of them attends over a client the roster leaves out.

    The server relays a bordering client's claims to all its peers (:func:`relay_targets`), and each
    claim names, signed, all of its claimer's peers, so a withheld one shows. Without this, a server
    could withhold a bordering owner's claim, or leave out of the roster a client whose nodes that
    owner attends over, and so drop or swap that client's rows in the foreign neighbourhoods the
    recipient needs (:func:`check_foreign_neighbourhoods` counts against the claims it holds;
    red-team review, 2026-11-27: 91 rows of a left-out client dropped from 44 of a victim's nodes).
    An honest server ends such a round itself (:func:`fedgat.protocols.pretrain_plan.unsound_without`).

    Raises:
        PayloadError: a bordering client without any relayed claim, one with a claim withheld, one
            whose signed peers leave ``me`` out, or one attending over a left-out client's nodes.
    """
    inside = set(participants)
    for d in local.peers():
        if d not in inside:
            continue
        if d not in claims.peers:
            raise PayloadError(f"the server relayed no claim of party {d}, which this client borders")
        stated = [int(p) for p in claims.peers[d].tolist()]
        if me not in stated:  # the graph is undirected: d has the edges this client has to it
            raise PayloadError(f"party {d}'s signed claims do not name this client, which borders it")
        # d's claim to this client too (a sixth review pass withheld it, so that the count of d's
        # cross-client neighbours missed this client's rows, and struck them unseen)
        missing = claims.missing(d, stated)
        if missing:
            raise PayloadError(f"the server withheld party {d}'s claims of its edges to parties {missing}")
        outside = [p for p in stated if p not in inside and len(claims.get_used(d, p))]
        if outside:
            raise PayloadError(
                f"party {d} attends over nodes of parties {outside}, which the roster leaves out"
            )


def check_foreign_neighbourhoods(
    me: int,
    local: LocalGraph,
    claims: ClaimSet,
    nodes: np.ndarray,
    neighbours: np.ndarray,
    owners: np.ndarray,
    *,
    stated: Mapping[int, NeighbourhoodStatement],
) -> None:
    """Recipient ``me``'s check of the neighbourhoods and owner labels the server's bases give for
    the *foreign* nodes it needs (``nodes`` ``(B,)`` not owned by ``me``, ``neighbours`` and
    ``owners`` ``(B, n)``), against what it knows, the signed claims it holds and the owners'
    signed statements of those neighbourhoods (``stated``: owner -> its statement to ``me``,
    checked by :func:`verify_statement` and :func:`check_statement`).

    Each neighbourhood is the one its owner states, entry for entry (frame version 10; before, a
    server could swap, drop or repeat the owner's own rows in it, whose values still pass the
    owner's tags: known break 5).

    Each such node ``v`` is the end of one of ``me``'s cross edges, so ``me`` knows its owner ``d``
    (:attr:`LocalGraph.cross_owner`), and the server relays to ``me`` every claim of ``d``
    (:func:`relay_targets`: ``me`` borders ``d``). So: ``v`` is labelled ``d``; a neighbour labelled
    ``me`` is ``me``'s node at the end of its own edge to ``v``; a neighbour ``u`` labelled ``o`` (not
    ``me`` or ``d``) is in ``d``'s signed used claims to ``o`` as ``(v, u)``, and one labelled ``me``
    in ``d``'s used claims to ``me`` too (with a neighbour cap, ``me``'s edge to ``v`` need not be in
    ``v``'s neighbourhood: a fifth review pass swapped a third owner's row for such a node of
    ``me``'s); no neighbour repeats;
    and the neighbours not labelled ``d`` are as many as ``d``'s used claims from ``v`` (so none is
    dropped). These label checks hold even where an owner colluding with the server states a false
    neighbourhood: it cannot make another owner's row its own.

    Without this, a server colluding with a client C could label an honest owner's row in a
    foreign node's neighbourhood as C's, and the recipient checked that partial against the check
    keys it gave C (red-team review, 2026-11-27: a chosen delta in the recipient's encodings,
    accepted; the audit's ``relabel_forgery``).

    Raises:
        PayloadError: the first disagreement.
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    if not len(nodes):
        return
    neighbours = np.asarray(neighbours, dtype=np.int64)
    owners = np.asarray(owners, dtype=np.int64)
    ends, first = np.unique(local.cross[:, 1], return_index=True)
    at = np.minimum(np.searchsorted(ends, nodes), max(len(ends) - 1, 0))
    known = (ends[at] == nodes) if len(ends) else np.zeros(len(nodes), bool)
    if not known.all():
        v = int(nodes[~known][0])
        raise PayloadError(f"the bases give foreign node {v}, which no edge of this client reaches")
    d = local.cross_owner[first][at]  # each node's owner, as this client records it
    wide = np.broadcast_to(nodes[:, None], neighbours.shape)
    label = np.broadcast_to(d[:, None], neighbours.shape)
    if np.any((neighbours == wide) & (owners != label)) or not np.all(np.any(neighbours == wide, axis=1)):
        raise PayloadError(
            "the bases give a foreign node another owner than this client knows, or not itself"
        )
    for dd in np.unique(d).tolist():
        statement = stated.get(dd)
        if statement is None:
            raise PayloadError(
                f"the bases give nodes of party {dd} before party {dd}'s signed statement of their "
                "neighbourhoods"
            )
        found, want = statement.rows(nodes[d == dd], neighbours.shape[1])
        if not found.all() or not np.array_equal(want, neighbours[d == dd]):
            raise PayloadError(
                f"the bases give a node of party {dd} another neighbourhood than party {dd}'s signed "
                "statement"
            )
    ordered = np.sort(neighbours, axis=1)
    if np.any(ordered[:, 1:] == ordered[:, :-1]):
        raise PayloadError("the bases repeat a neighbour in a foreign node's neighbourhood")
    mine = owners == me
    if np.any(mine):
        keys = _keys(neighbours[mine], wide[mine])  # (own, foreign) edges they imply
        pos = np.minimum(np.searchsorted(local.cross_keys, keys), max(len(local.cross_keys) - 1, 0))
        ok = (
            (local.cross_keys[pos] == keys) & (local.cross_owner[pos] == label[mine])
            if len(local.cross_keys)
            else False
        )
        if not np.all(ok):
            raise PayloadError(
                "the bases put this client's node in a foreign node's neighbourhood it has no edge to"
            )
        # and the node's owner attends over it (a neighbour cap may drop an edge on its side only)
        for dd in np.unique(label[mine]).tolist():
            sel = mine & (label == dd)
            if not np.all(np.isin(_keys(wide[sel], neighbours[sel]), claims.get_used(dd, me))):
                raise PayloadError(
                    f"the bases put this client's node in a neighbourhood of party {dd}'s node that "
                    f"party {dd}'s signed claims do not say it attends over"
                )
    cross = owners != label
    third = cross & ~mine
    for dd, o in np.unique(np.stack([label[third], owners[third]], axis=1), axis=0).tolist():
        sel = third & (label == dd) & (owners == o)
        if not np.all(np.isin(_keys(wide[sel], neighbours[sel]), claims.get_used(dd, o))):
            raise PayloadError(
                f"the bases label a neighbour of party {dd}'s node as party {o}'s, which party {dd}'s "
                "signed claims do not say"
            )
    for dd in np.unique(d).tolist():
        rows = d == dd
        used = [claims.get_used(dd, p) for p in {k[1] for k in claims.used if k[0] == dd}]
        sources = np.concatenate(used) // _SHIFT if used else np.zeros(0, np.int64)
        claimed = np.searchsorted(np.sort(sources), nodes[rows], side="right") - np.searchsorted(
            np.sort(sources), nodes[rows], side="left"
        )
        if not np.array_equal(cross[rows].sum(axis=1), claimed):
            raise PayloadError(
                f"the bases give a node of party {dd} other cross-client neighbours than party {dd} claims"
            )


def relay_targets(
    claims: Iterable[tuple[int, int]], participants: Iterable[int]
) -> dict[int, list[tuple[int, int]]]:
    """Which claims the server relays to whom: to owner ``b`` every claim ``(x, y)`` with ``x != b``
    and ``y == b`` or ``x`` or ``y`` a client ``b`` borders (what :func:`releases` reads)."""
    pairs = sorted(set(claims))
    borders: dict[int, set[int]] = {}
    for x, y in pairs:
        borders.setdefault(x, set()).add(y)
    out: dict[int, list[tuple[int, int]]] = {}
    for b in participants:
        near = borders.get(b, set())
        out[b] = [(x, y) for x, y in pairs if x != b and (y == b or x in near or y in near)]
    return out


class OwnerMap:
    """Owner lookups for arrays of node ids (-1: no owner), from the announced graphs."""

    def __init__(self, graphs: Mapping[int, GraphAnnounce]) -> None:
        empty = np.zeros(0, np.int64)
        parts = list(graphs.items())
        ids = np.concatenate([g.owned for _, g in parts]) if parts else empty
        who = np.concatenate([np.full(len(g.owned), c, np.int64) for c, g in parts]) if parts else empty
        sizes = np.concatenate([np.diff(g.indptr) for _, g in parts]) if parts else empty
        self.indices = np.concatenate([g.indices for _, g in parts]) if parts else empty
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if len(sizes) else empty
        order = np.argsort(ids, kind="stable")
        self.ids, self.who, self.sizes, self.starts = ids[order], who[order], sizes[order], starts[order]

    def _at(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        nodes = np.asarray(nodes, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.ids, nodes), max(len(self.ids) - 1, 0))
        found = (self.ids[pos] == nodes) if len(self.ids) else np.zeros(len(nodes), bool)
        return pos, found

    def owner(self, nodes: np.ndarray) -> np.ndarray:
        pos, found = self._at(nodes)
        return np.where(found, self.who[pos] if len(self.ids) else -1, -1)

    def neighbours(self, nodes: np.ndarray) -> np.ndarray:
        """The attention neighbourhoods of ``nodes`` (all owned), concatenated."""
        pos, found = self._at(nodes)
        if not np.all(found):
            raise PayloadError("a needed node is owned by no client")
        sizes = self.sizes[pos]
        offsets = np.repeat(self.starts[pos] - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
        return self.indices[offsets + np.arange(int(sizes.sum()))]


def check_claims(graphs: Mapping[int, GraphAnnounce], claims: ClaimSet, owners: OwnerMap) -> None:
    """The server's check that the claims agree with the announced neighbourhoods: every claimed
    edge joins the claimer's node to the peer's, the used edges are exactly the announced
    cross-client attention pairs, and each is confirmed by the peer's claim.

    Raises:
        PayloadError: naming the client whose announcement or claim is inconsistent.
    """
    for c, g in graphs.items():
        src = np.repeat(g.owned, np.diff(g.indptr))
        dst = g.indices
        other = owners.owner(dst)
        cross = other != c
        for p in np.unique(other[cross]):
            p = int(p)
            sel = cross & (other == p)
            want = np.unique(_keys(src[sel], dst[sel]))
            if p < 0 or not np.array_equal(np.sort(claims.get_used(c, p)), want):
                raise PayloadError(
                    f"party {c}'s claimed edges to party {p} do not match its announced neighbourhoods"
                )
            if not np.all(np.isin(_swap(want), claims.get_edges(p, c))):
                raise PayloadError(
                    f"party {c} attends over edges to party {p} that party {p} does not confirm"
                )
        for p in {k[1] for k in claims.used if k[0] == c} - {int(p) for p in np.unique(other[cross])}:
            if len(claims.get_used(c, p)):
                raise PayloadError(f"party {c} claims to attend over edges to party {p} it does not announce")
    for (x, y), keys in claims.edges.items():
        if np.any(owners.owner(keys // _SHIFT) != x) or np.any(owners.owner(keys % _SHIFT) != y):
            raise PayloadError(f"party {x} claims edges that do not join its nodes to party {y}'s")
    for c in claims.peers:
        missing = claims.missing(c, graphs)
        if missing:
            raise PayloadError(f"party {c} names parties {missing} as its peers but sent no claim to them")


def expected_releases(
    needed: Mapping[int, np.ndarray], owners: OwnerMap
) -> dict[tuple[int, int], np.ndarray]:
    """``(owner, recipient) -> sorted node ids``: the rows the server needs to compute every
    recipient's foreign shares (each needed node's neighbourhood minus the recipient's own nodes)."""
    out: dict[tuple[int, int], np.ndarray] = {}
    for a, nodes in needed.items():
        rows = np.unique(owners.neighbours(nodes))
        who = owners.owner(rows)
        for b in np.unique(who):
            if int(b) != a:
                out[(int(b), a)] = rows[who == b]
    return out
