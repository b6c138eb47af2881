"""Confirmed edges (:mod:`fedgat.protocols.pretrain_edges`): what each owner releases, decided from
its own edges and the others' signed claims, is exactly what the server's plan needs
(:func:`expected_releases`) on real partitions; an edge claimed by one side only, or a 2-hop need
without the middle owner's claim, releases nothing, and the server's :func:`check_claims` refuses
the claimer by name."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedgat.app import cross_edges, owned_neighbourhoods
from fedgat.crypto import SigningIdentity
from fedgat.partition import make_partition
from fedgat.protocols import EdgeClaims, GraphAnnounce, PayloadError, Roster, SignatureError
from fedgat.protocols.messages import (
    KeyAnnounce,
    NeighbourhoodStatement,
    claim_bytes,
    claim_keys_digest,
    neighbourhood_bytes,
)
from fedgat.protocols.pretrain_edges import (
    ClaimSet,
    LocalGraph,
    OwnerMap,
    attended_by,
    check_claims,
    check_claims_complete,
    check_foreign_neighbourhoods,
    check_statement,
    expected_releases,
    neighbourhoods_of,
    relay_targets,
    releases,
    verify_claim,
    verify_statement,
)
from fedgat.protocols.pretrain_plan import needed_from_neighbourhoods

SESSION = 5


def _claim(c: int, p: int, edges, uses, signature: bytes = bytes(64), peers=None) -> EdgeClaims:
    return EdgeClaims(
        sender=c,
        recipient=99,
        session=SESSION,
        seq=1,
        claimer=c,
        peer=p,
        edges=np.asarray(edges, dtype=np.int64).reshape(-1, 2),
        uses=np.asarray(uses, dtype=np.int64),
        peers=np.asarray([p] if peers is None else peers, dtype=np.int64),
        claim_signature=signature,
    )


def _stating(
    owner: int, recipient: int, nodes, indptr, indices, signature: bytes = bytes(64)
) -> NeighbourhoodStatement:
    return NeighbourhoodStatement(
        sender=owner,
        recipient=99,
        session=SESSION,
        seq=1,
        owner=owner,
        recipient_party=recipient,
        nodes=np.asarray(nodes, dtype=np.int64),
        indptr=np.asarray(indptr, dtype=np.int64),
        indices=np.asarray(indices, dtype=np.int64),
        statement_signature=signature,
    )


def _as_stated(owner: int, recipient: int, nodes, neighbours) -> NeighbourhoodStatement:
    """A statement whose neighbourhoods are exactly ``neighbours`` (rows of equal size): what an owner
    colluding with the server would sign to make tampered bases agree with it."""
    neighbours = np.asarray(neighbours, dtype=np.int64)
    indptr = np.arange(len(neighbours) + 1) * neighbours.shape[1]
    return _stating(owner, recipient, nodes, indptr, neighbours.ravel())


def _announce(c: int, local: LocalGraph) -> GraphAnnounce:
    return GraphAnnounce(
        sender=c,
        recipient=99,
        session=SESSION,
        seq=1,
        dim=1,
        owned=np.asarray(local.owned, dtype=np.int64),
        indptr=np.asarray(local.indptr, dtype=np.int64),
        indices=np.asarray(local.indices, dtype=np.int64),
    )


class World:
    """Every client's local graph and claims, as the clients of a round hold and send them."""

    def __init__(self, locals_: dict[int, LocalGraph]) -> None:
        self.locals = locals_
        self.claims = {
            (c, p): _claim(c, p, edges, uses, peers=sorted(lg.claims()))
            for c, lg in locals_.items()
            for p, (edges, uses) in lg.claims().items()
        }

    @classmethod
    def of(cls, graph, partition) -> World:
        out = {}
        for c, cp in enumerate(partition.clients):
            indptr, indices = owned_neighbourhoods(partition, cp.owned)
            cross, owner = cross_edges(graph, partition, c)
            out[c] = LocalGraph(np.asarray(cp.owned, dtype=np.int64), indptr, indices, cross, owner)
        return cls(out)

    def graphs(self) -> dict[int, GraphAnnounce]:
        return {c: _announce(c, lg) for c, lg in self.locals.items()}

    def relayed(self, b: int) -> ClaimSet:
        """The claims the server relays to owner ``b``."""
        keys = relay_targets(self.claims, list(self.locals))[b]
        return ClaimSet.of(self.claims[k] for k in keys)

    def releases(self, b: int, claims: ClaimSet | None = None) -> dict[int, np.ndarray]:
        others = [a for a in self.locals if a != b]
        return releases(b, self.locals[b], self.relayed(b) if claims is None else claims, others)

    def expected(self) -> dict[tuple[int, int], np.ndarray]:
        graphs = self.graphs()
        needed = {c: needed_from_neighbourhoods(g.owned, g.indices) for c, g in graphs.items()}
        return expected_releases(needed, OwnerMap(graphs))

    def check(self) -> None:
        graphs = self.graphs()
        check_claims(graphs, ClaimSet.of(self.claims.values()), OwnerMap(graphs))

    def statement(self, owner: int, recipient: int) -> NeighbourhoodStatement:
        """What an honest ``owner`` states to ``recipient`` (the neighbourhoods of its nodes the
        recipient's nodes attend over, from the claims relayed to it)."""
        lg = self.locals[owner]
        nodes = attended_by(owner, lg, self.relayed(owner), recipient)
        return _stating(owner, recipient, nodes, *neighbourhoods_of(lg.owned, lg.indptr, lg.indices, nodes))


def _assert_releases_match_the_plan(world: World) -> int:
    world.check()
    want = world.expected()
    got = {(b, a): rows for b in world.locals for a, rows in world.releases(b).items()}
    assert sorted(got) == sorted(want)
    for key, rows in want.items():
        np.testing.assert_array_equal(got[key], rows, err_msg=f"owner {key[0]} -> recipient {key[1]}")
    # every claim at once gives the same: what the server relays to an owner is all it reads
    for b in world.locals:
        full = world.releases(b, ClaimSet.of(c for k, c in world.claims.items() if k[0] != b))
        assert sorted(full) == sorted(world.releases(b))
        assert all(np.array_equal(full[a], world.releases(b)[a]) for a in full)
    return sum(len(r) for r in want.values())


def _two_hop_rows(world: World) -> int:
    """Released rows of a node adjacent to none of the recipient's nodes (only rule (c) covers them)."""
    count = 0
    for (b, a), rows in world.expected().items():
        near = set(world.locals[a].cross[:, 1].tolist())
        count += sum(int(u) not in near for u in rows)
    return count


@pytest.mark.parametrize("clients", [2, 3, 5])
def test_releases_equal_the_servers_plan_on_synthetic_partitions(small_graph, clients):
    part = make_partition(small_graph, clients, beta=1.0, seed=clients, num_layers=2, min_cross=2)
    world = World.of(small_graph, part)
    assert _assert_releases_match_the_plan(world) > 0
    if clients > 2:
        assert _two_hop_rows(world) > 0  # the 2-hop rule is exercised
    # unused cross edges (dropped by the partition's rules) are claimed but release nothing
    assert any(
        not uses.all() for _, uses in (lg.claims()[p] for lg in world.locals.values() for p in lg.peers())
    )


def test_releases_equal_the_servers_plan_on_cora(cora):
    part = make_partition(cora, 10, beta=1.0, seed=0, num_layers=2)
    world = World.of(cora, part)
    assert _assert_releases_match_the_plan(world) > 1000
    assert _two_hop_rows(world) > 0


def test_releases_equal_the_plan_with_a_neighbour_cap_and_no_cross_rule(small_graph):
    part = make_partition(small_graph, 4, beta=0.5, seed=1, num_layers=2, min_cross=0, neighbour_cap=3)
    _assert_releases_match_the_plan(World.of(small_graph, part))


# --------------------------------------------------------------------------------------- faking
def _with_fake_edge(world: World, a: int, v: int, u: int, b: int, *, attend: bool = True) -> World:
    """Client ``a`` claims an edge (v, u) to client ``b``'s node ``u`` that ``b`` does not have, and
    (``attend``) announces ``u`` in ``v``'s attention neighbourhood."""
    lg = world.locals[a]
    k = int(np.searchsorted(lg.owned, v))
    rows = [lg.indices[lg.indptr[i] : lg.indptr[i + 1]] for i in range(len(lg.owned))]
    if attend:
        rows[k] = np.append(rows[k], u)
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    fake = LocalGraph(
        lg.owned, indptr, np.concatenate(rows), np.vstack([lg.cross, [[v, u]]]), np.append(lg.cross_owner, b)
    )
    return World({**world.locals, a: fake})


def _non_adjacent(world: World, a: int, b: int) -> tuple[int, int]:
    """A node of ``a`` and a node of ``b`` with no edge between them (from ``b``'s view), whose row
    ``b`` does not release to ``a``."""
    theirs = {(int(x), int(y)) for x, y in world.locals[b].cross}
    released = set(world.releases(b).get(a, np.zeros(0)).tolist())
    for v in world.locals[a].owned:
        for u in world.locals[b].owned:
            if (int(u), int(v)) not in theirs and int(u) not in released:
                return int(v), int(u)
    raise AssertionError("no non-adjacent pair")


def test_an_edge_claimed_by_one_side_releases_nothing_and_is_refused(small_graph):
    part = make_partition(small_graph, 3, beta=1.0, seed=0, num_layers=2, min_cross=2)
    honest = World.of(small_graph, part)
    a, b = 0, 1
    v, u = _non_adjacent(honest, a, b)
    faked = _with_fake_edge(honest, a, v, u, b)
    # owner b releases to a exactly what it did before: nothing of u, nothing of u's neighbourhood
    for owner in faked.locals:
        before, after = honest.releases(owner), faked.releases(owner)
        assert sorted(before) == sorted(after)
        assert all(np.array_equal(before[r], after[r]) for r in before)
    assert u not in honest.releases(b).get(a, np.zeros(0)).tolist()
    # the server's plan (trusting the graph) would need u from b: the check refuses first, naming a
    assert u in faked.expected()[(b, a)]
    with pytest.raises(
        PayloadError, match=rf"party {a} attends over edges to party {b} that party {b} does not confirm"
    ):
        faked.check()


def test_claims_that_disagree_with_the_announced_graph_are_refused(small_graph):
    part = make_partition(small_graph, 3, beta=1.0, seed=0, num_layers=2, min_cross=2)
    world = World.of(small_graph, part)
    world.check()
    graphs = world.graphs()
    owners = OwnerMap(graphs)
    (c, p), claim = next((k, m) for k, m in world.claims.items() if m.uses.any() and not m.uses.all())
    # a used edge the claimer's graph does not announce
    extra = dict(world.claims)
    extra[(c, p)] = dataclasses.replace(claim, uses=np.ones_like(claim.uses))
    with pytest.raises(PayloadError, match=rf"party {c}'s claimed edges to party {p} do not match"):
        check_claims(graphs, ClaimSet.of(extra.values()), owners)
    # an announced cross attention pair left out of the claim
    dropped = dict(world.claims)
    dropped[(c, p)] = dataclasses.replace(claim, uses=np.zeros_like(claim.uses))
    with pytest.raises(PayloadError, match=rf"party {c}'s claimed edges to party {p}"):
        check_claims(graphs, ClaimSet.of(dropped.values()), owners)
    # an edge that does not join the claimer's node to the peer's
    q = next(x for x in world.locals if x not in (c, p))
    stolen = dict(world.claims)
    wrong = claim.edges.copy()
    wrong[:, 1] = world.locals[q].owned[0]
    stolen[(c, p)] = _claim(c, p, np.unique(wrong, axis=0), np.zeros(len(np.unique(wrong, axis=0))))
    with pytest.raises(PayloadError, match=rf"party {c}"):
        check_claims(graphs, ClaimSet.of(stolen.values()), owners)


# ------------------------------------------------------------------------------------- 2 hops
def _three_clients(fake_a_to_3: bool = False) -> World:
    """a = 0 owns {0, 1}, c = 1 owns {2, 3}, b = 2 owns {4, 5}; graph edges 0-2, 2-4, 3-5; every
    edge in both attention neighbourhoods. a needs node 2 (its neighbour), hence N(2) = {2, 0, 4}:
    b's row 4 reaches a only through c's node 2 (a 2-hop need)."""
    a_rows = [[0, 2], [1]]
    a_cross, a_owner = [[0, 2]], [1]
    if fake_a_to_3:  # a claims an edge to c's node 3 (whose neighbourhood holds b's node 5)
        a_rows = [[0, 2, 3], [1]]
        a_cross, a_owner = [[0, 2], [0, 3]], [1, 1]

    def lg(owned, rows, cross, owner):
        indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
        return LocalGraph(np.array(owned), indptr, np.concatenate(rows), np.array(cross), np.array(owner))

    return World(
        {
            0: lg([0, 1], a_rows, a_cross, a_owner),
            1: lg([2, 3], [[2, 0, 4], [3, 5]], [[2, 0], [2, 4], [3, 5]], [0, 2, 2]),
            2: lg([4, 5], [[4, 2], [5, 3]], [[4, 2], [5, 3]], [1, 1]),
        }
    )


def test_a_two_hop_need_is_released_through_the_middle_owners_claims():
    world = _three_clients()
    world.check()
    assert {k: v.tolist() for k, v in world.expected().items()} == {
        (1, 0): [2],
        (2, 0): [4],
        (0, 1): [0],
        (2, 1): [4, 5],
        (1, 2): [2, 3],
        (0, 2): [0],  # b needs node 2 (its node 4's neighbour), hence a's row 0: 2 hops the other way
    }
    _assert_releases_match_the_plan(world)
    assert world.releases(2)[0].tolist() == [4]


@pytest.mark.parametrize(
    "withheld",
    [
        (1, 2),  # c's claim that its node 2 uses b's node 4
        (1, 0),  # c's confirmation of a's edge (0, 2)
        (0, 1),  # a's claim that its node 0 uses c's node 2
    ],
)
def test_a_two_hop_need_needs_every_owners_claim(withheld):
    """Without the middle owner's claim (or the recipient's, or the middle owner's confirmation of
    it), b does not release row 4 to a; its own direct releases are unchanged."""
    world = _three_clients()
    keys = [k for k in relay_targets(world.claims, [0, 1, 2])[2] if k != withheld]
    got = world.releases(2, ClaimSet.of(world.claims[k] for k in keys))
    assert 0 not in got
    if withheld != (1, 2):
        assert got[1].tolist() == [4, 5]


def test_a_fake_edge_cannot_create_a_two_hop_need():
    """a claims an edge to c's node 3 that c does not have: b does not release 3's neighbour 5 to
    a (c's edges to a do not confirm it), and the server refuses a's claims by name."""
    world = _three_clients(fake_a_to_3=True)
    assert world.releases(2)[0].tolist() == [4]  # not 5
    assert world.releases(1)[0].tolist() == [2]  # c releases its own node 3 neither
    assert world.expected()[(2, 0)].tolist() == [4, 5]  # what a lenient server would compute
    with pytest.raises(
        PayloadError, match="party 0 attends over edges to party 1 that party 1 does not confirm"
    ):
        world.check()


def test_a_claim_over_an_owners_edge_to_a_third_client_releases_nothing():
    """a signs, as its own node's use, c's node 3 at the end of b's real edge (5, 3): b's edge exists,
    but b records node 3 as c's, so b releases a nothing more (before the red-team fix: row 5, and
    with a server that skips its check, every such row of every owner)."""
    world = _three_clients()
    a_to_c = world.claims[(0, 1)]
    claims = {  # a had no claim to b; its claims now name b too (signed, as a real client's would)
        **world.claims,
        (0, 1): _claim(0, 1, a_to_c.edges, a_to_c.uses, peers=[1, 2]),
        (0, 2): _claim(0, 2, [[3, 5]], [1], peers=[1, 2]),
    }
    relayed = ClaimSet.of(claims[k] for k in relay_targets(claims, [0, 1, 2])[2])
    assert relayed.get_used(0, 2).size == 1  # b does read the claim
    got = releases(2, world.locals[2], relayed, [0, 1])
    assert got[0].tolist() == [4] and got[1].tolist() == [4, 5]  # as without the claim
    trusting = releases(
        2, dataclasses.replace(world.locals[2], cross_owner=np.zeros(2, np.int64)), relayed, [0]
    )
    assert 5 in trusting[0].tolist()  # an owner that took its edges' ends as a's would release it


@pytest.mark.parametrize(
    ("nodes", "neighbours", "owners", "message"),
    [
        ([2], [[2, 4, 0]], [[1, 1, 0]], "other cross-client neighbours than party 1 claims"),  # b's 4 as c's
        ([2], [[2, 0]], [[1, 0]], "other cross-client neighbours than party 1 claims"),  # 4 dropped
        ([2], [[2, 0, 4]], [[2, 0, 2]], "another owner than this client knows"),  # v itself relabelled
        ([2], [[2, 0, 4, 4]], [[1, 0, 2, 2]], "repeat a neighbour"),
        (
            [2],
            [[2, 1, 4]],
            [[1, 0, 2]],
            "this client's node in a foreign node's neighbourhood it has no edge to",
        ),
        ([3], [[3, 5]], [[1, 2]], "foreign node 3, which no edge of this client reaches"),
    ],
)
def test_a_recipient_checks_its_foreign_nodes_neighbourhoods(nodes, neighbours, owners, message):
    """a needs c's node 2 (N(2) = {2, 0, 4}, 4 being b's): the honest bases pass; relabelling, dropping
    or repeating a neighbour, or naming a node a has no edge to, is refused by what a knows and c's
    signed claims, which the server relays to a (red-team review, 2026-11-27)."""
    world = _three_clients()
    claims = world.relayed(0)
    honest = {1: world.statement(1, 0)}
    assert honest[1].nodes.tolist() == [2] and honest[1].indices.tolist() == [2, 0, 4]
    check_foreign_neighbourhoods(
        0, world.locals[0], claims, np.array([2]), np.array([[2, 0, 4]]), np.array([[1, 0, 2]]), stated=honest
    )
    # the labels are checked even where c, colluding, signs the tampered neighbourhood
    agreeing = {1: _as_stated(1, 0, nodes, neighbours)}
    with pytest.raises(PayloadError, match=message):
        check_foreign_neighbourhoods(
            0,
            world.locals[0],
            claims,
            np.array(nodes),
            np.array(neighbours),
            np.array(owners),
            stated=agreeing,
        )
    withheld = ClaimSet.of(world.claims[k] for k in relay_targets(world.claims, [0, 1, 2])[0] if k != (1, 2))
    with pytest.raises(PayloadError, match="party 1's signed claims do not say"):  # c's claim to b withheld
        check_foreign_neighbourhoods(
            0,
            world.locals[0],
            withheld,
            np.array([2]),
            np.array([[2, 0, 4]]),
            np.array([[1, 0, 2]]),
            stated=honest,
        )


def _own_rows_world() -> World:
    """a = 0 owns {0, 1}, c = 1 owns {2, 3, 6}; edges 0-2, 1-6 and c's own 2-3. a needs 2 and 6, so
    c releases it 2, 3 and 6; N(2) = {2, 0, 3}, N(6) = {6, 1}."""

    def lg(owned, rows, cross, owner):
        indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
        return LocalGraph(np.array(owned), indptr, np.concatenate(rows), np.array(cross), np.array(owner))

    return World(
        {
            0: lg([0, 1], [[0, 2], [1, 6]], [[0, 2], [1, 6]], [1, 1]),
            1: lg([2, 3, 6], [[2, 0, 3], [3, 2], [6, 1]], [[2, 0], [6, 1]], [0, 0]),
        }
    )


@pytest.mark.parametrize(
    ("neighbours", "owners"),
    [
        ([[2, 0, 6]], [[1, 0, 1]]),  # c's row 3 swapped for its row 6, released to a for node 6
        ([[2, 6, 3]], [[1, 1, 1]]),  # a's node 0 dropped for c's 6 (the cross count shows it too)
        ([[2, 3, 0]], [[1, 1, 0]]),  # the same rows in another order (coefficients follow positions)
    ],
)
def test_a_foreign_nodes_own_rows_are_its_owners_statement(neighbours, owners):
    """Known break 5, closed in frame version 10: which of c's own rows N(2) holds was checked by
    nothing (each swapped row carries c's tags for itself); c's signed statement of N(2) fixes it,
    entry for entry, and bases of c's nodes before c's statement are refused."""
    world = _own_rows_world()
    claims = world.relayed(0)
    stated = {1: world.statement(1, 0)}
    assert stated[1].nodes.tolist() == [2, 6]
    assert releases(1, world.locals[1], world.relayed(1), [0])[0].tolist() == [2, 3, 6]
    honest = (np.array([2]), np.array([[2, 0, 3]]), np.array([[1, 0, 1]]))
    check_foreign_neighbourhoods(0, world.locals[0], claims, *honest, stated=stated)
    with pytest.raises(PayloadError, match="another neighbourhood than party 1's signed statement"):
        check_foreign_neighbourhoods(
            0, world.locals[0], claims, np.array([2]), np.array(neighbours), np.array(owners), stated=stated
        )
    with pytest.raises(PayloadError, match="before party 1's signed statement"):
        check_foreign_neighbourhoods(0, world.locals[0], claims, *honest, stated={})


def test_a_dropped_own_row_is_refused():
    """N(2) without c's row 3 keeps every cross-client neighbour: only c's statement shows the drop."""
    world = _own_rows_world()
    with pytest.raises(PayloadError, match="another neighbourhood than party 1's signed statement"):
        check_foreign_neighbourhoods(
            0,
            world.locals[0],
            world.relayed(0),
            np.array([2]),
            np.array([[2, 0]]),
            np.array([[1, 0]]),
            stated={1: world.statement(1, 0)},
        )


def test_a_statement_covers_exactly_the_owners_nodes_the_recipient_attends_over():
    world = _own_rows_world()
    honest = world.statement(1, 0)
    check_statement(0, world.locals[0], honest)
    lg = world.locals[1]
    for nodes in ([2], [2, 3, 6]):  # one left out; one more (3, which a does not attend over)
        other = _stating(1, 0, nodes, *neighbourhoods_of(lg.owned, lg.indptr, lg.indices, np.array(nodes)))
        with pytest.raises(PayloadError, match="covers other nodes"):
            check_statement(0, world.locals[0], other)
    with pytest.raises(PayloadError, match="is for party 2"):
        check_statement(0, world.locals[0], dataclasses.replace(honest, recipient_party=2))


def test_statements_are_signed_by_their_owner_for_the_rounds_key_set():
    signers = {p: SigningIdentity.generate() for p in range(3)}
    roster = Roster(server=2, clients=(0, 1), signing_keys={p: s.public_bytes() for p, s in signers.items()})
    keyset, other = bytes(range(32)), bytes(32)
    nodes, indptr, indices = np.array([2, 6]), np.array([0, 3, 5]), np.array([2, 0, 3, 6, 1])
    signed = neighbourhood_bytes(SESSION, 1, 0, keyset, nodes, indptr, indices)
    good = _stating(1, 0, nodes, indptr, indices, signers[1].sign(signed))
    verify_statement(good, roster, SESSION, keyset)
    for bad, kw in [
        (good, {"keyset": other}),  # another view of the round
        (good, {"session": SESSION + 1}),
        (dataclasses.replace(good, indices=np.array([2, 0, 6, 6, 1])), {}),  # a changed neighbourhood
        (_stating(1, 0, nodes, indptr, indices, signers[0].sign(signed)), {}),  # signed by another client
    ]:
        with pytest.raises(SignatureError):
            verify_statement(bad, roster, kw.get("session", SESSION), kw.get("keyset", keyset))
    with pytest.raises(PayloadError, match="not both clients"):
        verify_statement(dataclasses.replace(good, owner=2), roster, SESSION, keyset)


def test_a_recipients_node_a_capped_owner_does_not_attend_over_is_refused():
    """With a neighbour cap c's node 2 attends over b's 4 but not over a's 0, although the edge 0-2
    exists. A server that puts a's node 0 in place of b's row 4 keeps the count of cross-client
    neighbours; c's signed used claims to a say 2 does not attend over 0 (red-team review, fifth
    pass, 2026-11-27)."""

    def lg(owned, rows, cross, owner):
        indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
        return LocalGraph(np.array(owned), indptr, np.concatenate(rows), np.array(cross), np.array(owner))

    world = World(
        {
            0: lg([0, 1], [[0, 2], [1]], [[0, 2]], [1]),
            1: lg([2, 3], [[2, 4], [3, 5]], [[2, 0], [2, 4], [3, 5]], [0, 2, 2]),  # 2 does not attend over 0
            2: lg([4, 5], [[4, 2], [5, 3]], [[4, 2], [5, 3]], [1, 1]),
        }
    )
    claims = world.relayed(0)
    stated = {1: world.statement(1, 0)}
    check_foreign_neighbourhoods(
        0, world.locals[0], claims, np.array([2]), np.array([[2, 4]]), np.array([[1, 2]]), stated=stated
    )
    with pytest.raises(PayloadError, match="another neighbourhood than party 1's signed statement"):
        check_foreign_neighbourhoods(
            0, world.locals[0], claims, np.array([2]), np.array([[2, 0]]), np.array([[1, 0]]), stated=stated
        )
    # and where c, colluding, states it: c's own signed claims contradict it
    with pytest.raises(PayloadError, match="party 1's signed claims do not say it attends over"):
        check_foreign_neighbourhoods(
            0,
            world.locals[0],
            claims,
            np.array([2]),
            np.array([[2, 0]]),
            np.array([[1, 0]]),
            stated={1: _as_stated(1, 0, [2], [[2, 0]])},
        )


def test_the_server_relays_each_owner_the_claims_it_reads_and_never_its_own():
    world = _three_clients()
    relay = relay_targets(world.claims, [0, 1, 2])
    assert relay[2] == [(0, 1), (1, 0), (1, 2)]
    assert relay[0] == [(1, 0), (1, 2), (2, 1)]
    assert all(x != b for b, keys in relay.items() for x, _ in keys)


# ---------------------------------------------------------------------------- signatures, input
def _keys(party: int, seed: int = 0) -> KeyAnnounce:
    """A key announcement of ``party`` (only the fields a claim is bound to matter here)."""
    rng = np.random.default_rng(seed)
    return KeyAnnounce(
        sender=party,
        recipient=99,
        session=SESSION,
        seq=1,
        party=party,
        hpke=rng.bytes(1216),
        ed25519=bytes(32),
        context_fingerprint=rng.bytes(32),
        binding_signature=bytes(64),
    )


def test_claims_are_signed_by_their_claimer_under_its_session_keys():
    signers = {p: SigningIdentity.generate() for p in range(4)}
    roster = Roster(
        server=3, clients=(0, 1, 2), signing_keys={p: s.public_bytes() for p, s in signers.items()}
    )
    keys = _keys(0)
    digest = claim_keys_digest(keys.hpke, keys.context_fingerprint)
    edges, uses = np.array([[0, 2], [1, 3]]), np.array([1, 0])
    peers = np.array([1, 2])
    sig = signers[0].sign(claim_bytes(SESSION, 0, 1, edges, uses, digest, peers))
    ok = _claim(0, 1, edges, uses, sig, peers=peers)
    verify_claim(ok, roster, SESSION, keys)
    for bad in (
        dataclasses.replace(ok, uses=np.array([1, 1])),  # the relaying server marks an edge used
        dataclasses.replace(ok, edges=np.array([[0, 2], [1, 4]])),
        dataclasses.replace(ok, peer=2),
        dataclasses.replace(ok, peers=np.array([1])),  # the relaying server hides a peer
        dataclasses.replace(
            ok, claim_signature=signers[3].sign(claim_bytes(SESSION, 0, 1, edges, uses, digest, peers))
        ),
    ):
        with pytest.raises(SignatureError, match="party 0"):
            verify_claim(bad, roster, SESSION, keys)
    with pytest.raises(SignatureError):
        verify_claim(ok, roster, SESSION + 1, keys)
    # a claim of an earlier session that reused the id: signed under that session's keys
    with pytest.raises(SignatureError, match="this session's keys"):
        verify_claim(ok, roster, SESSION, _keys(0, seed=1))
    with pytest.raises(PayloadError, match="not both clients"):
        verify_claim(dataclasses.replace(ok, peer=3), roster, SESSION, keys)
    with pytest.raises(PayloadError, match="party 1's keys"):
        verify_claim(ok, roster, SESSION, _keys(1))


def test_a_local_graph_refuses_inconsistent_cross_edges():
    owned, indptr = np.array([0, 1]), np.array([0, 2, 3])
    with pytest.raises(PayloadError, match="attention neighbour"):
        LocalGraph(owned, indptr, np.array([0, 5, 1]), np.zeros((0, 2)), np.zeros(0))
    with pytest.raises(PayloadError, match="joins an owned node"):
        LocalGraph(owned, indptr, np.array([0, 5, 1]), np.array([[7, 5]]), np.array([1]))
    with pytest.raises(PayloadError, match="joins an owned node"):
        LocalGraph(owned, indptr, np.array([0, 1, 1]), np.array([[0, 1]]), np.array([1]))
    with pytest.raises(PayloadError, match="one owner per cross edge"):
        LocalGraph(owned, indptr, np.array([0, 5, 1]), np.array([[0, 5], [1, 6]]), np.array([1]))
    lg = LocalGraph(
        owned, indptr, np.array([0, 5, 1]), np.array([[1, 6], [0, 5], [0, 5]]), np.array([2, 1, 1])
    )
    assert lg.cross.tolist() == [[0, 5], [1, 6]] and lg.cross_owner.tolist() == [1, 2]
    assert {p: (e.tolist(), u.tolist()) for p, (e, u) in lg.claims().items()} == {
        1: ([[0, 5]], [1]),
        2: ([[1, 6]], [0]),
    }


def test_a_recipient_requires_every_claim_of_an_owner_it_borders_its_own_included():
    """a borders c: it needs c's claims to b and to a itself (a sixth review pass withheld the latter,
    then not required, and struck a's rows from c's nodes' neighbourhoods unseen), and c's signed
    peers must name a."""
    world = _three_clients()
    claims = world.relayed(0)
    check_claims_complete(0, world.locals[0], claims, [0, 1, 2])
    for withheld in [(1, 2), (1, 0)]:
        held = ClaimSet.of(
            world.claims[k] for k in relay_targets(world.claims, [0, 1, 2])[0] if k != withheld
        )
        with pytest.raises(
            PayloadError, match=f"withheld party 1's claims of its edges to parties \\[{withheld[1]}\\]"
        ):
            check_claims_complete(0, world.locals[0], held, [0, 1, 2])
    unnamed = ClaimSet(claims.edges, claims.used, {**claims.peers, 1: np.array([2])})
    with pytest.raises(PayloadError, match="do not name this client"):
        check_claims_complete(0, world.locals[0], unnamed, [0, 1, 2])
