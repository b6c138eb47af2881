"""The cost of the encrypted pre-training round without running it (:func:`estimate_pretraining`):
``fedgat demo``'s warning and memory check, the overhead benchmark's matrix estimate."""

from __future__ import annotations

import numpy as np

from fedgat.crypto import get_preset
from fedgat.crypto.evaluator import OpCounts
from fedgat.partition import Partition
from fedgat.protocols import PretrainConfig

__all__ = ["N4096_OP_SECONDS", "estimate_pretraining", "peak_spool_bytes"]

#: seconds per SEAL operation of the server's evaluator at n4096, 2-core VM (2026-11-25)
N4096_OP_SECONDS = {"encode": 0.37e-3, "multiply": 0.135e-3, "add": 0.035e-3, "rescale": 0.31e-3}


def estimate_pretraining(
    partition: Partition,
    variant: str,
    d: int,
    preset: str = "n4096",
    chunks: int | None = None,
    seconds_per_multiply_add: float | None = None,
    ship_m2: bool = False,
    wire: str = "compact",
) -> dict:
    """Cost of the pre-training round without running it: multiply-adds, ciphertexts and bytes of the
    per-recipient protocol (each client's foreign shares under its key, one partial per foreign owner
    of a node's neighbours; each released row uploaded once per client that needs it).

    ``ship_m2``: cost the paper's protocol, whose server also computes and ships the matrix variant's
    ``M2`` (this implementation's clients derive it from ``K2``).

    ``wire``: the ciphertext wire (:attr:`fedgat.protocols.pretrain.PretrainConfig.wire`): bytes are
    exact for ``"compact"`` and typical (measured, :data:`fedgat.crypto.params.TENSEAL_WIRE_BYTES`)
    for ``"tenseal"``; ``client_seconds`` is the compact wire's either way (an over-estimate for
    ``"tenseal"``, whose clients skip the packing: ~0.65 ms per upload, ~0.2 ms per result at n4096).

    Uses the dense coefficient structure of the bases (every computed row of node ``i`` uses all
    ``n_i`` neighbours) and the preset's measured sizes and timings (:mod:`fedgat.crypto.params`).
    Result ciphertexts count the packed tails (:class:`fedgat.crypto.encodings.PackedShares`);
    ``multiply_adds`` counts each partial apart, an upper bound (a packed tail group reads the union
    of its partials' sources once: 2-3 % fewer on small synthetic graphs).
    ``decrypted_bytes_float64``: the clients' decrypted encodings together, before compaction.
    ``client_seconds``: the clients' encryptions and decryptions together on one core (what
    ``--engine auto`` weighs, :func:`fedgat.cli_engine.resolve_engine`).
    """
    p = get_preset(preset)
    cfg = PretrainConfig(session=0, variant=variant, preset=preset, chunks=chunks, wire=wire)
    layout = cfg.layout(cfg.row_width(d), p.slots)
    nbh = partition.neighbourhoods
    n = nbh.degrees().astype(np.int64)
    rows = np.array([cfg.rows_per_node(int(k), ship_m2) for k in n])
    groups = -(-(rows + 1) // layout.blocks)  # h_i is computed as result row 0
    mads = down_cts = released = 0
    spooled: dict[int, int] = {}  # recipient -> rows released to it (what the server spools for it)
    uses = np.zeros(partition.num_nodes, dtype=np.int64)
    owner = partition.owner
    for c, cp in enumerate(partition.clients):
        needed = np.asarray(cp.needed, dtype=np.int64)
        uses[needed] += 1
        if not len(needed):
            continue
        # the foreign share of each needed node: its neighbours that c does not own
        sizes = n[needed]
        at = np.repeat(nbh.indptr[needed] - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
        sources = nbh.indices[at + np.arange(int(sizes.sum()))]
        foreign = (owner[sources] != c).astype(np.int64)
        per_node = (
            np.add.reduceat(foreign, np.concatenate([[0], np.cumsum(sizes)[:-1]]))
            if len(foreign)
            else foreign
        )
        # one result per (needed node, foreign owner): the partial over that owner's neighbours
        seg = np.repeat(np.arange(len(needed)), sizes)[foreign.astype(bool)]
        pairs = np.unique(seg * partition.num_clients + owner[sources][foreign.astype(bool)])
        mads += int((groups[needed] * per_node).sum()) * layout.chunks
        # partials of one owner and one bucket (one neighbourhood size) share result ciphertexts:
        # each node's whole groups, then one group per pack of tails (SlotLayout.packed_order)
        node_of, owner_of = needed[pairs // partition.num_clients], pairs % partition.num_clients
        _, first, per_size = np.unique(
            np.stack([n[node_of], owner_of]), axis=1, return_index=True, return_counts=True
        )
        for r, count in zip((rows[node_of[first]] + 1).tolist(), per_size.tolist(), strict=True):
            tail = r % layout.blocks
            packs = -(-count // layout.pack_size(r)) if tail else 0
            down_cts += (count * (r // layout.blocks) + packs) * layout.chunks
        mine = int(np.unique(sources[foreign.astype(bool)]).size)
        released += mine
        if mine:
            spooled[c] = mine
    held = np.array([cfg.rows_per_node(int(k), True) for k in n])  # M2 is held, shipped or derived
    decrypted_reals = int(((1 + held) * uses).sum()) * d
    if seconds_per_multiply_add is not None:
        server_seconds = mads * seconds_per_multiply_add
    else:
        # the server's evaluator's operations (fedgat.crypto.evaluator.OpCounts) at the n4096 costs
        # measured on the 2-core VM, larger rings scaled by their measured multiply cost
        grow = {4096: 1.0, 8192: 2.2, 16384: 4.4}.get(p.poly_modulus_degree, 3.0)
        ops = OpCounts.of_round(mads, down_cts, layout.chunks)
        server_seconds = grow * ops.seconds(N4096_OP_SECONDS)
    # compact: exact, each level's floor plus the envelope (fedgat.crypto.compact); tenseal: measured
    result_bytes, fresh_bytes = p.wire_bytes("result", wire), p.wire_bytes("fresh", wire)
    # the clients' own CKKS work on one core: encrypt + serialise each upload into its compact
    # envelope, load + decrypt each result (n4096 measured in the Cora overhead run of 2026-11-25:
    # 4.24 / 0.38 ms; the larger rings are estimates, not measured: TenSEAL's costs before the compact
    # wire, 3.4 / 0.4 ms at n8192 and 7.6 / 0.8 ms at n16384, plus the packing's share at n4096)
    encrypt_s = {4096: 4.24e-3, 8192: 5.5e-3, 16384: 11e-3}.get(p.poly_modulus_degree, 6e-3)
    decrypt_s = {4096: 0.38e-3, 8192: 0.6e-3, 16384: 1.1e-3}.get(p.poly_modulus_degree, 0.7e-3)
    encryptions = released * layout.chunks
    return {
        "multiply_adds": mads,
        "server_seconds": server_seconds,
        "result_ciphertexts_down": down_cts,
        "bytes_down": down_cts * result_bytes,
        "rows_released": released,
        "bytes_up": released * layout.chunks * fresh_bytes,
        # every upload is spooled for its recipient until that recipient is computed
        "spool_bytes_per_recipient": {c: k * layout.chunks * fresh_bytes for c, k in sorted(spooled.items())},
        "layout_chunks": layout.chunks,
        "max_rows_per_node": int(rows.max()) if len(rows) else 0,
        "decrypted_bytes_float64": decrypted_reals * 8,
        # the clients' encryptions and decryptions together, on one core (what a process engine spreads)
        "client_seconds": encryptions * encrypt_s + down_cts * decrypt_s,
    }


def peak_spool_bytes(estimate: dict, upload_window: int | None = None) -> int:
    """The most bytes of uploads the server's spool holds at once
    (:attr:`~fedgat.protocols.pretrain_server.ServerPretrain.peak_spooled_bytes`), from
    :func:`estimate_pretraining`: every upload without a window; with a window of ``W``, the most
    that ``W`` consecutive recipients (in plan order: by party id) receive."""
    sizes = list(estimate["spool_bytes_per_recipient"].values())
    if upload_window is None or upload_window >= len(sizes):
        return int(sum(sizes))
    return int(max(sum(sizes[k : k + upload_window]) for k in range(len(sizes) - upload_window + 1)))
