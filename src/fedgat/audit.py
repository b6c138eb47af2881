"""Privacy audit: what each party can learn, measured by running the attacks against ground truth.

Client side: every client's view (its decrypted encodings: equal to the plaintext encodings built
with the same bases up to CKKS error, which `tests/crypto` and `tests/protocols` bound) is attacked
with :mod:`fedgat.attacks`; the victims are the *foreign* nodes whose features the client should not
learn. Server side: :func:`server_checks` inspects a recorded transcript of everything the server
received.

Mitigations, each a setting: the paper's minimum cross-client rule ``min_cross`` (k), a neighbour
cap with random sampling, and a DP release of the features shared for cross-client use
(:class:`fedgat.dp.FeatureDP`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from fedgat.attacks import (
    RecoveryScore,
    basis_attack,
    m1_trace_attack,
    neighbour_sum_attack,
    prior_knowledge,
    score_recovery,
    spectral_attack,
)
from fedgat.dp import FeatureDP
from fedgat.encodings import encode
from fedgat.graph import Graph
from fedgat.partition import Partition, make_partition
from fedgat.randomness import RandomSource
from fedgat.variants import VariantLike, as_variant


@dataclass(frozen=True)
class Mitigation:
    """The audited setting: ``min_cross`` (paper's k; 1 disables), ``neighbour_cap`` (None: off),
    ``dp`` (None: features shared in the clear, inside ciphertexts)."""

    min_cross: int = 2
    neighbour_cap: int | None = None
    dp: FeatureDP | None = None

    def describe(self) -> dict:
        return {
            "min_cross": self.min_cross,
            "neighbour_cap": self.neighbour_cap,
            "dp": None if self.dp is None else self.dp.describe(),
        }


@dataclass
class ClientAudit:
    """Pooled attack scores over all clients, plus per-attack raw counts."""

    scores: dict[str, RecoveryScore] = field(default_factory=dict)

    def add(self, score: RecoveryScore) -> None:
        old = self.scores.get(score.attack)
        if old is None:
            self.scores[score.attack] = score
            return
        victims = old.victims + score.victims
        mean = (
            (old.mean_cosine * old.victims + score.mean_cosine * score.victims) / victims if victims else 0.0
        )
        self.scores[score.attack] = RecoveryScore(
            score.attack,
            victims,
            old.recovered + score.recovered,
            mean,
            old.reidentified + score.reidentified,
        )

    def as_dict(self) -> dict[str, dict]:
        return {name: s.as_dict() for name, s in self.scores.items()}


def client_features(
    graph: Graph, mitigation: Mitigation, seed: int, null_release: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(clean, shared)`` float64 features: what owners use and what other clients' encodings use.

    ``null_release`` shares the features of a random permutation of the nodes instead (released
    through the same mechanism): a release with the same distribution that carries no information on
    which node has which features. Attacks scored on it measure chance under the same scoring.
    """
    x = graph.x
    if null_release:
        x = x[torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(seed + 7919))]
    clean = graph.x.double() if mitigation.dp is None else mitigation.dp.project(graph.x).double()
    if mitigation.dp is None:
        return clean, x.double()
    return clean, mitigation.dp.release(x, torch.Generator().manual_seed(seed)).double()


def audit_clients(
    graph: Graph,
    variant: VariantLike,
    num_clients: int = 10,
    beta: float = 1.0,
    seed: int = 0,
    mitigation: Mitigation = Mitigation(),
    clients: Iterable[int] | None = None,
    partition: Partition | None = None,
    null_release: bool = False,
) -> ClientAudit:
    """Run every applicable attack on every client's view and pool the scores.

    Ground truth is what the attacker wants: the *clean* features of foreign nodes (projected when
    the DP release projects, since that is all any party's model ever uses). ``null_release``: the
    chance reference of :func:`client_features`.
    """
    kind = as_variant(variant)
    part = partition or make_partition(
        graph,
        num_clients,
        beta=beta,
        seed=seed,
        min_cross=mitigation.min_cross,
        neighbour_cap=mitigation.neighbour_cap,
    )
    clean, shared = client_features(graph, mitigation, seed, null_release)
    truth = clean.numpy()
    csr = part.neighbourhoods
    result = ClientAudit()
    for cid in range(part.num_clients) if clients is None else clients:
        c = part.clients[cid]
        if len(c.needed) == 0:
            continue
        owned = set(c.owned.tolist())
        enc = encode(
            kind,
            clean,
            csr,
            nodes=c.needed,
            rng=RandomSource.from_seed(f"audit-{seed}-{cid}"),
            shared_x=shared,
            owner=part.owner,
            viewer=cid,
        )
        own_feats = {i: truth[i] for i in owned}
        others = np.flatnonzero(part.owner != cid)
        full = {int(i): [int(j) for j in csr.row(i)] for i in c.needed}
        neighbours = {i: [j for j in v if j not in owned] for i, v in full.items()}
        owned_targets = {i: v for i, v in neighbours.items() if i in owned}
        prior = prior_knowledge({i: v for i, v in full.items() if neighbours[i]}, own_feats)
        result.add(score_recovery(prior, truth, neighbours, others))
        result.add(score_recovery(neighbour_sum_attack(enc, own_feats), truth, owned_targets, others))
        if kind.has_m2:  # M2 and M1 = h_i P_i: spectral and trace attacks; else Q_i: basis recovery
            result.add(score_recovery(spectral_attack(enc, seed=seed), truth, neighbours, others))
            foreign_targets = {int(i): [int(i)] for i in c.needed if int(i) not in owned}
            result.add(score_recovery(m1_trace_attack(enc), truth, foreign_targets, others))
        else:
            result.add(score_recovery(basis_attack(enc), truth, neighbours, others))
    return result


def chance_reidentification(graph: Graph, part: Partition) -> float:
    """Re-identification rate of a blind guess: 1 / (mean number of other clients' nodes)."""
    sizes = np.bincount(part.owner, minlength=part.num_clients)
    return float(np.mean(1.0 / np.maximum(graph.num_nodes - sizes, 1)))


# ------------------------------------------------------------------------------------ server side
#: what the server may receive: public keys, the public context, relayed wrapped keys, public graph
#: metadata, ciphertexts, and (in training rounds) model weights and evaluation counts
SERVER_ALLOWED = {
    "KeyAnnounce",
    "PublicContext",
    "WrappedKeyDelivery",
    "GraphAnnounce",
    "FeatureUpload",
    "UploadDone",
    "LocalUpdate",
    "EvaluationReport",
    "Abort",
}

SERVER_LEARNS = [
    "the graph structure: every client's owned node ids and their neighbour lists (GraphAnnounce)",
    "degrees and neighbourhood sizes, hence the encoding sizes",
    "the number of nodes per client and the feature dimension d",
    "each client's public keys, the CKKS public context and the key fingerprint",
    "model weights and training-node counts of every FedAvg round (plaintext; no secure aggregation)",
    "per-client validation/test correct counts (EvaluationReport)",
]


def _anchors(x: np.ndarray, dtype: type[np.floating]) -> dict[bytes, int]:
    """8-byte anchors: each node's row bytes from its first non-zero feature (2 float32 or 1 float64)."""
    out = {}
    rows = x.astype(dtype)
    width = 8 // np.dtype(dtype).itemsize
    for i, row in enumerate(rows):
        nz = np.flatnonzero(row)
        if len(nz) == 0:
            continue
        start = min(int(nz[0]), len(row) - width)
        out[row[start : start + width].tobytes()] = i
    return out


def _anchor_table(x: np.ndarray, dtype: type[np.floating]) -> dict[bytes, list[tuple[int, int]]]:
    """Anchor bytes -> ``(row, byte offset of the anchor in the row)`` for every row having it."""
    table: dict[bytes, list[tuple[int, int]]] = {}
    rows = x.astype(dtype)
    size = np.dtype(dtype).itemsize
    width = 8 // size
    for i, row in enumerate(rows):
        nz = np.flatnonzero(row)
        if len(nz) == 0:
            continue
        start = min(int(nz[0]), len(row) - width)
        table.setdefault(row[start : start + width].tobytes(), []).append((i, start * size))
    return table


def _scan_positions(blob: bytes, keys: np.ndarray) -> np.ndarray:
    """Byte offsets in ``blob`` where any 8-byte key (sorted uint64) occurs."""
    raw = np.frombuffer(blob, dtype=np.uint8)
    found = []
    for offset in range(8):
        usable = (len(raw) - offset) // 8 * 8
        if usable <= 0 or len(keys) == 0:
            continue
        words = raw[offset : offset + usable].view(np.uint64)
        pos = np.searchsorted(keys, words)
        pos[pos == len(keys)] = 0
        found.append(offset + 8 * np.flatnonzero(keys[pos] == words))
    return np.sort(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def _scan(blob: bytes, keys: np.ndarray) -> int:
    """Occurrences of any 8-byte key (sorted uint64) at any byte offset of ``blob``."""
    return len(_scan_positions(blob, keys))


def _verified_hits(
    blob: bytes, positions: np.ndarray, table: dict, rows: list[bytes], reach: int = 32
) -> int:
    """Anchor hits that extend to the row's bytes around the anchor (``reach`` bytes each side).

    An 8-byte anchor of a sparse row is weak (its first non-zero value and a zero, shared by every
    row with as many words), so random ciphertext bytes can contain one by chance; a real copy of
    the row also matches the bytes around it (zeros before the first non-zero, the values after).
    """
    hits = 0
    for p in positions.tolist():
        for i, off in table.get(blob[p : p + 8], ()):
            row = rows[i]
            lo, hi = max(0, off - reach), min(len(row), off + 8 + reach)
            if p - (off - lo) >= 0 and hi - lo >= 16 and blob[p - (off - lo) : p + (hi - off)] == row[lo:hi]:
                hits += 1
                break
    return hits


def _longest_zero_run(blob: bytes) -> int:
    raw = np.frombuffer(blob, dtype=np.uint8) == 0
    if not raw.any():
        return 0
    edges = np.diff(np.concatenate([[0], raw.astype(np.int8), [0]]))
    return int((np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).max())


def server_checks(transcript, server_id: int, x: np.ndarray) -> dict:
    """Checks on everything the server received (a :class:`fedgat.protocols.Transcript`).

    * every message type is in :data:`SERVER_ALLOWED`;
    * every uploaded feature payload parses as a CKKS ciphertext envelope bound to the session key;
    * no node's feature row occurs in the server-visible bytes as float32 or float64 (8-byte anchors
      at every byte offset, each candidate verified against the row's bytes around it: a sparse
      row's anchor alone turns up in ~1 GB of ciphertext by chance), and no run of zero bytes long enough to hold a sparse feature
      row at *any* scale (a Cora row has runs of hundreds of zero bytes; the test is scale-free);
    * the public context the server received has no secret key and cannot decrypt.
    """
    from fedgat.crypto import ServerContext, deserialize
    from fedgat.protocols import FeatureUpload, PublicContext, decode_message

    received = transcript.received_by(server_id)
    types: dict[str, int] = {}
    for e in received:
        types[e.type_name] = types.get(e.type_name, 0) + 1
    unexpected = sorted(set(types) - SERVER_ALLOWED)
    scans = []
    for dtype in (np.float32, np.float64):
        table = _anchor_table(x, dtype)
        keys = np.array(sorted(np.frombuffer(b"".join(table), dtype=np.uint64)), dtype=np.uint64)
        scans.append((keys, table, [row.tobytes() for row in x.astype(dtype)]))
    ctx = None
    ciphertexts = bad_ciphertexts = anchor_hits = anchor_candidates = 0
    longest_zero_run = 0
    context_checks: dict[str, bool] = {}
    for e in received:
        msg = decode_message(e.data)
        if isinstance(msg, PublicContext):
            ctx = ServerContext.from_bytes(msg.context)
            context_checks["server_context_has_secret_key"] = bool(ctx.tenseal.has_secret_key())
        if isinstance(msg, FeatureUpload):
            for item in msg.items:
                ciphertexts += 1
                try:
                    if ctx is None:
                        raise ValueError("ciphertext before the public context")
                    vec = deserialize(ctx, item.ciphertext, level="fresh")
                except Exception:  # noqa: BLE001 - any failure means "not a ciphertext of this key"
                    bad_ciphertexts += 1
                    continue
                if "server_context_cannot_decrypt" not in context_checks:
                    try:
                        vec.decrypt()
                        context_checks["server_context_cannot_decrypt"] = False
                    except (ValueError, RuntimeError):
                        context_checks["server_context_cannot_decrypt"] = True
                longest_zero_run = max(longest_zero_run, _longest_zero_run(item.ciphertext))
        if e.type_name in ("FeatureUpload", "GraphAnnounce", "UploadDone", "WrappedKeyDelivery"):
            for keys, table, rows in scans:
                positions = _scan_positions(e.payload, keys)
                anchor_candidates += len(positions)
                anchor_hits += _verified_hits(e.payload, positions, table, rows)
    min_row_zero_run = _min_feature_zero_run(x)
    checks = {
        "message_types": types,
        "only_allowed_message_types": not unexpected,
        "unexpected_types": unexpected,
        "uploaded_ciphertexts": ciphertexts,
        "all_uploads_are_ciphertexts_of_the_session_key": ciphertexts > 0 and bad_ciphertexts == 0,
        "feature_row_anchor_candidates": anchor_candidates,
        "feature_row_anchor_hits": anchor_hits,
        "longest_zero_byte_run_in_ciphertexts": longest_zero_run,
        "shortest_zero_byte_run_in_a_float32_feature_row": min_row_zero_run,
        **context_checks,
    }
    checks["no_feature_rows_visible"] = anchor_hits == 0 and (
        min_row_zero_run is None or longest_zero_run < min_row_zero_run
    )
    checks["passed"] = bool(
        checks["only_allowed_message_types"]
        and checks["all_uploads_are_ciphertexts_of_the_session_key"]
        and checks["no_feature_rows_visible"]
        and not context_checks.get("server_context_has_secret_key", True)
        and context_checks.get("server_context_cannot_decrypt", False)
    )
    checks["server_learns"] = SERVER_LEARNS
    return checks


def _min_feature_zero_run(x: np.ndarray) -> int | None:
    """Shortest longest-zero-byte-run over the float32 rows of sparse features (None if dense)."""
    zero_frac = float((x == 0).mean())
    if zero_frac < 0.5:
        return None
    runs = [_longest_zero_run(row.astype(np.float32).tobytes()) for row in x[: min(len(x), 500)]]
    return int(min(runs))
