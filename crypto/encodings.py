r"""FedGAT encodings computed homomorphically: the server's side and the client's decryption.

Every feature-dependent encoding is a per-node linear map of the neighbours' features,
:math:`F_i = A_i H_i` (:meth:`fedgat.encodings.BucketBases.coefficients`), with plaintext
coefficients :math:`A_i` that the server draws itself. Under CKKS the server evaluates it with
:func:`fedgat.crypto.packing.linear_map_rows`: plaintext x ciphertext multiply-adds only, no
rotation, no relinearisation, no secret key.

Rows computed per node: *all* ``R_i + 1`` rows of :math:`A_i`:

* row 0, :math:`h_i` itself (the :math:`M_1` factor; coefficient row :math:`e_0`, the node is its
  own first neighbour), packed with the node's other rows;
* rows ``1..m``: :math:`V_i` (vector variant) or :math:`K_2` (matrix variant), ``R_i = m``
  (:meth:`fedgat.variants.Variant.computed_rows`); the matrix variant's ``m^2`` rows of :math:`M_2`
  are not computed: clients derive them from :math:`K_2` (:meth:`fedgat.variants.MatrixVariant.m2_map`).

Computing row 0 costs at most ``ceil((R+1)/k) - ceil(R/k)`` extra result ciphertexts per chunk
(``k`` blocks per ciphertext) and the multiply-adds of that group. The alternative, forwarding a
non-owner the node's uploaded (fresh, twice as large) ciphertexts, moved 46 % more download bytes
on Cora (10 clients, vector: 4.68 GB vs 3.21 GB; 90 % of its nodes are needed by a client that
does not own them) for 8 % fewer multiply-adds. The owner ignores its decrypted row 0 and uses its
own plaintext.

Differential privacy (:mod:`fedgat.dp`). In the protocol (per-recipient keys,
:class:`~fedgat.protocols.ClientPretrain`) an owner uploads for each recipient only the *release* of
each row that recipient needs, never the clean row, and computes the share of its own rows locally.
The plaintext round (:func:`fedgat.protocols.pretrain_plan.plan_round` for
:mod:`fedgat.plain_encoder`) holds both: the clean copy of node ``j`` under key ``j`` and the release
under :func:`release_key` ``(j)`` (ids are u32, so both share the int64 key space), and
:func:`plan_views` turns the drawn bases into *compute buckets* whose ``neighbours`` are those keys:
the encodings of node ``i`` for client ``c`` read the clean copy of each source ``c`` owns and the
release of every other source. Every encoder of :mod:`fedgat.crypto.encoders` runs them unchanged.

Memory: uploads are validated and spooled to disk (:class:`CiphertextSpool`), results are produced
node by node (:mod:`fedgat.crypto.encoders`), so the server never holds a dataset's ciphertexts at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from fedgat.encodings import BucketBases, EncodingBucket

from .context import CkksContext, KeyHolderContext
from .encoders import InlineEncoder
from .errors import CiphertextFormatError
from .packing import SlotLayout, decrypt_rows
from .spool import CiphertextSpool
from .tasks import NodeResult, encode_node

#: spool-key offset of a node's DP release copy (node ids are u32, spool keys int64)
RELEASE_OFFSET = 1 << 32


def release_key(node: int | np.ndarray) -> int | np.ndarray:
    """Spool key of the DP release of ``node`` (its clean upload is stored under ``node`` itself)."""
    return node + RELEASE_OFFSET


@dataclass
class ViewPlan:
    """What the server computes and whom each result goes to (:func:`plan_views`).

    Attributes:
        buckets: one compute bucket per drawn bucket, in the same order; ``neighbours`` hold spool
            keys. Without DP these are the drawn buckets themselves (one result per node).
        recipients: per computed node, in bucket then slot order (the order every encoder yields
            results), the clients that receive that result (each client exactly once per node it needs).
    """

    buckets: list[BucketBases]
    recipients: list[tuple[int, ...]]

    @property
    def num_results(self) -> int:
        return len(self.recipients)


def plan_views(
    buckets: list[BucketBases],
    pair_nodes: np.ndarray,
    pair_clients: np.ndarray,
    owner_ids: np.ndarray | None = None,
    owners: np.ndarray | None = None,
) -> ViewPlan:
    """Plan the server's homomorphic work for the ``(node, client)`` pairs ``pair_nodes[k]`` needed by
    ``pair_clients[k]`` (every node of ``buckets`` at least once, no pair twice).

    Without ``owners`` every client of a node receives the same result, computed once from the
    clean uploads. With ``owners[t]`` the client owning node ``owner_ids[t]`` (``owner_ids`` sorted;
    every source must be listed), a client receives node ``i``'s encodings computed from its own
    clean copies and every other source's release: the clients of ``i`` that own none of its
    sources share one result (all releases); each client that owns some source gets its own. A node
    therefore costs ``1 + (clients owning one of its sources)`` computations at most, instead of one
    per client that needs it.

    Raises:
        ValueError: a pair names a node of no bucket, or a source has no owner.
    """
    pair_nodes = np.asarray(pair_nodes, dtype=np.int64)
    pair_clients = np.asarray(pair_clients, dtype=np.int64)
    if not buckets:
        return ViewPlan([], [])
    ids = np.concatenate([b.nodes for b in buckets])
    where = np.argsort(ids, kind="stable")
    at = where[np.minimum(np.searchsorted(ids[where], pair_nodes), len(ids) - 1)]
    if not np.array_equal(ids[at], pair_nodes):
        raise ValueError("a (node, client) pair names a node of no bucket")
    bucket_of = np.repeat(np.arange(len(buckets)), [len(b) for b in buckets])
    slot_of = np.concatenate([np.arange(len(b)) for b in buckets])
    pg, ps = bucket_of[at], slot_of[at]
    srt = np.lexsort((pair_clients, ps, pg))  # by bucket, slot, client
    pg, ps, pc = pg[srt], ps[srt], pair_clients[srt]
    bounds = np.searchsorted(pg, np.arange(len(buckets) + 1))
    out, recipients = [], []
    for g, b in enumerate(buckets):
        s, c = ps[bounds[g] : bounds[g + 1]], pc[bounds[g] : bounds[g + 1]]
        if owners is None:
            own = np.zeros(len(s), dtype=bool)
            mask = np.zeros((0, b.n), dtype=bool)
        else:
            assert owner_ids is not None
            pos = np.minimum(np.searchsorted(owner_ids, b.neighbours), len(owner_ids) - 1)
            if not np.array_equal(owner_ids[pos], b.neighbours):
                raise ValueError("a source node has no owner")
            mask = owners[pos][s] == c[:, None]  # (pairs, n): sources owned by the pair's client
            own = mask.any(axis=1)
        shared = np.flatnonzero(~own)
        shared_slots, starts = np.unique(s[shared], return_index=True)
        own_pairs = np.flatnonzero(own)
        # variants: per slot the shared one first (pair -1), then one per owning client
        var_slot = np.concatenate([shared_slots, s[own_pairs]])
        var_pair = np.concatenate([np.full(len(shared_slots), -1), own_pairs])
        order = np.lexsort((var_pair, var_slot))
        var_slot, var_pair = var_slot[order], var_pair[order]
        groups = [tuple(x.tolist()) for x in np.split(c[shared], starts[1:])] if len(shared) else []
        groups += [(int(c[k]),) for k in own_pairs]
        recipients += [groups[k] for k in order]
        if owners is None and np.array_equal(var_slot, np.arange(len(b))):
            out.append(b)  # no viewer split: the drawn bucket itself
            continue
        keys = b.neighbours[var_slot]
        if owners is not None:
            clean = np.zeros(keys.shape, dtype=bool)
            mine = var_pair >= 0
            clean[mine] = mask[var_pair[mine]]
            keys = np.where(clean, keys, release_key(keys))
        out.append(b.take(var_slot, neighbours=keys))
    return ViewPlan(out, recipients)


@dataclass
class ShareBucket:
    """One recipient's *foreign share* of some nodes of a drawn bucket: the linear map over the
    neighbours selected by ``foreign[s]``, whose rows were released to the server under the
    recipient's key; the recipient adds the share of its own rows in plaintext. In the encrypted
    round (:func:`fedgat.protocols.pretrain_plan.plan_shares`) a share bucket holds one foreign
    ``owner``'s *partial* (``foreign`` selects that owner's neighbours), so each result is checked
    against that owner's tags alone (:mod:`fedgat.crypto.tags`). What an encoder reads: ``nodes``,
    ``neighbours[s]`` (spool keys = node ids), ``coefficients(s)``."""

    bases: BucketBases
    foreign: np.ndarray  # (B, n) bool
    #: the owner of every selected neighbour (None: any foreign owner, one result for all of them)
    owner: int | None = None
    neighbours: list[np.ndarray] = field(init=False)

    def __post_init__(self) -> None:
        self.neighbours = [self.bases.neighbours[s][self.foreign[s]] for s in range(len(self.bases))]

    @property
    def nodes(self) -> np.ndarray:
        return self.bases.nodes

    def __len__(self) -> int:
        return len(self.bases)

    def coefficients(self, slot: int) -> np.ndarray:
        """``(R + 1, n_f)``: the node's coefficient rows over its foreign neighbours."""
        return self.bases.coefficients(slot)[:, self.foreign[slot]]

    def num_feature_rows(self) -> int:
        return self.bases.num_feature_rows()

    def multiply_adds(self, layout: SlotLayout) -> int:
        """Plaintext x ciphertext multiply-adds of this share (what :func:`encode_node` spends)."""
        rows = np.where(self.foreign[:, None, :], computed_rows(self.bases), 0.0)
        return _multiply_adds(rows, layout)


def pack_maps(
    layout: SlotLayout, sources: list[np.ndarray], coefficients: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """One linear map computing several items' rows in one result (:meth:`SlotLayout.packed_order`):
    item ``i`` maps its ``sources[i]`` (spool keys) with ``coefficients[i]`` ``(rows, n_i)``, every
    item has the same ``rows``. Returns ``(keys, Q)``: the sorted union of the sources and the
    ``(count * rows, len(keys))`` coefficients in packed row order, zero where an item does not
    read a source."""
    keys = np.unique(np.concatenate(sources))
    rows = coefficients[0].shape[0]
    q = np.zeros((len(sources), rows, len(keys)))
    for i, (src, coef) in enumerate(zip(sources, coefficients, strict=True)):
        # added, not assigned: a source listed twice counts twice, as in the item's own map
        np.add.at(q[i].T, np.searchsorted(keys, src), np.asarray(coef).T)
    return keys, q.reshape(len(sources) * rows, len(keys))[layout.packed_order(len(sources), rows)]


@dataclass
class PackedShares:
    """A :class:`ShareBucket`'s partials as the server computes and sends them: consecutive nodes'
    partials share result ciphertexts, up to :meth:`SlotLayout.pack_size` of them, their whole groups
    of ``k`` rows kept apart and their tails packed in one group (:meth:`SlotLayout.packed_order`).

    Every node of a share bucket has the same rows (``R + 1``), so the pack size is the bucket's.
    On Cora (10 clients, beta 1, ``k = 4``) about a quarter of the partials have a 1-row tail and
    another quarter a 2-row one: packing them fills the result blocks 96.9 % instead of 87.3 %
    (212,418 result ciphertexts instead of 235,788) for 0.2 % fewer multiply-adds.
    What an encoder reads (:class:`~fedgat.crypto.tasks.ComputeBucket`) is per *pack*: ``nodes``
    (a pack's first node), ``neighbours`` (the union of its nodes' sources), ``coefficients``."""

    share: ShareBucket
    layout: SlotLayout
    #: the share's slots in each pack
    packs: list[np.ndarray] = field(init=False)
    #: the first node of every pack (what :class:`~fedgat.crypto.tasks.NodeResult` names)
    nodes: np.ndarray = field(init=False)
    neighbours: list[np.ndarray] = field(init=False)

    def __post_init__(self) -> None:
        n, size = len(self.share), self.layout.pack_size(self.share.num_feature_rows())
        self.packs = [np.arange(s, min(s + size, n)) for s in range(0, n, size)]
        self.nodes = self.share.nodes[np.arange(0, n, size)]
        self.neighbours = [
            self.share.neighbours[int(p[0])]
            if len(p) == 1
            else np.unique(np.concatenate([self.share.neighbours[int(s)] for s in p]))
            for p in self.packs
        ]

    @property
    def owner(self) -> int | None:
        return self.share.owner

    def pack_nodes(self, slot: int) -> tuple[int, ...]:
        """The nodes of pack ``slot``, in packed order."""
        return tuple(int(n) for n in self.share.nodes[self.packs[slot]])

    def __len__(self) -> int:
        return len(self.packs)

    def coefficients(self, slot: int) -> np.ndarray:
        """``(count * (R + 1), len(neighbours[slot]))``: the pack's rows in packed order."""
        p = self.packs[slot]
        if len(p) == 1:
            return self.share.coefficients(int(p[0]))
        keys, q = pack_maps(
            self.layout,
            [self.share.neighbours[int(s)] for s in p],
            [self.share.coefficients(int(s)) for s in p],
        )
        assert np.array_equal(keys, self.neighbours[slot])
        return q

    def num_feature_rows(self) -> int:
        """Rows per node (not per pack)."""
        return self.share.num_feature_rows()

    def num_rows(self) -> int:
        """Feature rows of all the share's nodes (the useful rows of its results)."""
        return len(self.share) * self.share.num_feature_rows()

    def result_groups(self) -> int:
        """Result groups (per chunk) of all the packs."""
        rows = self.num_feature_rows()
        return sum(self.layout.packed_groups(len(p), rows) for p in self.packs)

    def multiply_adds(self, layout: SlotLayout | None = None) -> int:
        """Plaintext x ciphertext multiply-adds of the packs (what :func:`encode_node` spends): the
        nodes' whole groups as apart, and each tail group the union of its nodes' tail sources."""
        layout = layout or self.layout
        if layout != self.layout:
            raise ValueError("a pack's multiply-adds are counted in its own layout")
        share, k = self.share, layout.blocks
        rows = np.where(share.foreign[:, None, :], computed_rows(share.bases), 0.0)  # (B, R+1, n)
        body = rows.shape[1] - rows.shape[1] % k
        total = _multiply_adds(rows[:, :body], layout) if body else 0
        if body == rows.shape[1]:
            return total
        used = np.any(rows[:, body:] != 0, axis=1)  # (B, n): sources read by each node's tail
        pack_of = np.repeat(np.arange(len(self.packs)), [len(p) for p in self.packs])
        slot, col = np.nonzero(used)
        keys = np.stack([pack_of[slot], share.bases.neighbours[slot, col]], axis=1)
        return total + len(np.unique(keys, axis=0)) * layout.chunks


def computed_rows(bases: BucketBases) -> np.ndarray:
    """``(B, R + 1, n)``: the coefficient rows the server evaluates (all, row 0 = :math:`h_i` too)."""
    return bases.coefficients()


def multiply_adds(bases: BucketBases, layout: SlotLayout) -> int:
    """Plaintext-ciphertext multiply-adds :func:`compute_node` spends on this bucket."""
    return _multiply_adds(computed_rows(bases), layout)


def _multiply_adds(rows: np.ndarray, layout: SlotLayout) -> int:
    k = layout.blocks
    total = 0
    for g in range(layout.groups(rows.shape[1])):
        used = np.any(rows[:, g * k : (g + 1) * k] != 0, axis=1)  # (B, n)
        total += int(used.sum())
    return total * layout.chunks


def compute_node(
    ctx: CkksContext, layout: SlotLayout, spool: CiphertextSpool, bases: BucketBases, slot: int
) -> NodeResult:
    """Encrypted :math:`A_i H_i` (all rows) for node ``bases.nodes[slot]`` from spooled uploads."""
    sources = [spool.get(j) for j in bases.neighbours[slot]]
    return encode_node(ctx, layout, sources, int(bases.nodes[slot]), bases.coefficients(slot))


def compute_bucket(
    ctx: CkksContext, layout: SlotLayout, spool: CiphertextSpool, bases: BucketBases
) -> Iterator[NodeResult]:
    """:func:`compute_node` for every node of a bucket, one at a time (a generator)."""
    return InlineEncoder(ctx, layout, spool).map([bases])


def decrypt_bucket(
    ctx: KeyHolderContext,
    layout: SlotLayout,
    bases: BucketBases,
    results: Iterable[NodeResult],
    own_features: dict[int, np.ndarray] | None = None,
    dtype: torch.dtype = torch.float32,
) -> EncodingBucket:
    """Client side: decrypt a bucket's results into an :class:`~fedgat.encodings.EncodingBucket`.

    ``own_features`` maps the client's own node ids to their plaintext rows: for those nodes the
    exact plaintext replaces the decrypted :math:`h_i` (row 0).
    """
    by_node = {r.node: r for r in results}
    rows = np.empty((len(bases), bases.num_feature_rows(), layout.d))
    for slot, node in enumerate(bases.nodes):
        node = int(node)
        if node not in by_node:
            raise CiphertextFormatError(f"missing encodings for node {node}")
        rows[slot] = decrypt_rows(ctx, by_node[node].row_blobs, rows.shape[1], layout, kind="result")
        if own_features is not None and node in own_features:
            rows[slot, 0] = own_features[node]
    return EncodingBucket.from_rows(bases, torch.from_numpy(rows).to(dtype))
