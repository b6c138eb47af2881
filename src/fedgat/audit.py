"""Privacy audit: what each party can learn, measured by running the attacks against ground truth.

Client side: every client's view (its decrypted encodings: equal to the plaintext encodings built
with the same bases up to CKKS error, which `tests/crypto` and `tests/protocols` bound) is attacked
with :mod:`fedgat.attacks`; the victims are the *foreign* nodes whose features the client should not
learn. Server side: :func:`server_checks` inspects a recorded transcript of everything the server
received, and :func:`audit_server` runs every attack of a hostile server, alone or with a colluding
client, against the real protocol (:mod:`fedgat.server_attacks` for the pre-training round,
:mod:`fedgat.training_attacks` for the training rounds), each scored against the ground truth.

Mitigations, each a setting: the paper's minimum cross-client rule ``min_cross`` (k), a neighbour
cap with random sampling, and a DP release of the rows shared for cross-client use
(:class:`fedgat.dp.FeatureDP`: then the attacks are scored in the release's space, against the
noise-free release, and against a null release for chance).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedgat.attack_names import SERVER_ATTACKS, TRAINING_ATTACKS
from fedgat.attacks import (
    Recovery,
    RecoveryScore,
    basis_attack,
    m1_trace_attack,
    neighbour_sum_attack,
    prior_knowledge,
    release_decoder,
    score_recovery,
    spectral_attack,
)
from fedgat.dp import FeatureDP, LabelPredictor, block_rows
from fedgat.dp_ledger import Budget, DPLedger, MissingLedgerError
from fedgat.dp_predictor import train_predictor
from fedgat.encodings import encode
from fedgat.graph import Graph
from fedgat.methods import resolve_hparams
from fedgat.partition import Partition, check_partition, check_rule, make_partition
from fedgat.randomness import RandomSource
from fedgat.variants import VariantLike, as_variant


@dataclass(frozen=True)
class Mitigation:
    """The audited setting: ``min_cross`` (paper's k; 0, the default, is off), ``neighbour_cap``
    (None: off), ``dp`` (None: features shared in the clear, inside ciphertexts)."""

    min_cross: int = 0
    neighbour_cap: int | None = None
    dp: FeatureDP | None = None

    def __post_init__(self) -> None:
        check_rule(self.min_cross, self.neighbour_cap)  # TypeError / ValueError naming the field
        if self.dp is not None and not isinstance(self.dp, FeatureDP):
            raise TypeError(f"dp must be a fedgat.dp.FeatureDP or None, got {type(self.dp).__name__}")

    def describe(self) -> dict:
        return {
            "min_cross": self.min_cross,
            "neighbour_cap": self.neighbour_cap,
            "dp": None if self.dp is None else self.dp.describe(),
        }

    def dp_spent(self, d: int, num_classes: int) -> list[float] | None:
        """``[epsilon, delta]`` one audited release of ``d``-dimensional rows spends (composed by
        :mod:`fedgat.dp_ledger`'s accountant, as :func:`audit_clients` charges it; the audit report's
        ``dp_spent``), or None."""
        if self.dp is None:
            return None
        ledger = DPLedger(Budget(self.dp.epsilon, self.dp.delta))
        return list(ledger.charge("audited-release", self.dp.record(d, num_classes)))


@dataclass
class ClientAudit:
    """Pooled attack scores over all clients, plus per-attack raw counts."""

    scores: dict[str, RecoveryScore] = field(default_factory=dict)
    #: with DP: the ``(epsilon, delta)`` the audited release spent (:func:`client_features`' ledger)
    dp_spent: tuple[float, float] | None = None

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
    graph: Graph,
    mitigation: Mitigation,
    seed: int,
    null_release: bool = False,
    *,
    ledger: DPLedger | None = None,
    predictor: LabelPredictor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(own, shared)`` float64 rows of every node: what its owner's encodings use and what other
    clients' encodings use.

    Without DP both are the features. With ``mitigation.dp`` they follow the block layout of
    :mod:`fedgat.dp`: ``own = [x, 0]``, ``shared = [0, release]`` (:meth:`fedgat.dp.FeatureDP.release_rows`,
    randomness from a fresh CSPRNG, never from ``seed``, charged to ``ledger``, which is required;
    ``predictor``: ``label_rr``'s).

    ``null_release`` shares the rows of a random permutation of the nodes instead (released through
    the same mechanism): a release with the same distribution that carries no information on which
    node has which features. Attacks scored on it measure chance under the same scoring.
    """
    x = graph.x
    if null_release:
        x = x[torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(seed + 7919))]
    dp = mitigation.dp
    if dp is None:
        return graph.x.double(), x.double()
    if ledger is None:
        raise MissingLedgerError("the audited DP release needs a ledger to charge")
    release = dp.release_rows(x, ledger=ledger, predictor=predictor)
    return block_rows(graph.x.double(), torch.from_numpy(release))


def _decoded(recovery: Recovery, decode: Callable[[np.ndarray], np.ndarray] | None) -> Recovery:
    """The attack's guesses in feature space: block A as is plus the attacker's decoding of block B."""
    if decode is None:
        return recovery
    return Recovery(recovery.attack, recovery.targets, [decode(g) for g in recovery.guesses])


def audit_predictor(graph: Graph, part: Partition, seed: int) -> LabelPredictor:
    """``label_rr``'s predictor as a run with default hyper-parameters trains it
    (:func:`fedgat.dp_predictor.train_predictor`)."""
    predictor, _ = train_predictor(graph, part, seed, resolve_hparams("fedgat", {}))
    return predictor


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
    dp_ledger: DPLedger | None = None,
    predictor: LabelPredictor | None = None,
) -> ClientAudit:
    """Run every applicable attack on every client's view and pool the scores.

    Ground truth is what the attacker wants: the *clean* features of foreign nodes. With DP the
    attacks recover rows of the release (:func:`client_features`), which the attacker maps back to
    feature space with its best decoder (:func:`fedgat.attacks.release_decoder`, built from its own
    rows and, for ``label_rr``, the published predictor) before they are scored, so every mechanism
    is graded on the same scale as no DP. ``null_release``: the chance reference of
    :func:`client_features`. ``dp_ledger``: charged for the audited release (default with DP: an
    in-memory ledger whose budget is the mitigation's own ``(epsilon, delta)``: the audit's release
    never leaves this process, so it only reports what one release spends, ``dp_spent``).
    ``predictor``: ``label_rr``'s (default: :func:`audit_predictor`). ``partition``: audit this split
    of ``graph`` instead of the Dirichlet one of ``(num_clients, beta, seed)`` (those are then
    unused); it must have been made with the mitigation's ``min_cross`` and ``neighbour_cap``.

    Raises:
        fedgat.partition.PartitionMismatchError: ``partition`` is another graph's.
        ValueError: ``partition`` made with another minimum-cross rule or neighbour cap than
            ``mitigation``'s (the audit would report on a mitigation it did not apply), or a client id
            of ``clients`` out of range.
    """
    kind = as_variant(variant)
    if partition is not None:
        check_partition(graph, partition)
        made = (partition.min_cross, partition.neighbour_cap)
        if made != (mitigation.min_cross, mitigation.neighbour_cap):
            raise ValueError(
                f"the partition was made with min_cross={made[0]}, neighbour_cap={made[1]} but the "
                f"mitigation audited has min_cross={mitigation.min_cross}, "
                f"neighbour_cap={mitigation.neighbour_cap}; make the partition with the mitigation's"
            )
    part = partition or make_partition(
        graph,
        num_clients,
        beta=beta,
        seed=seed,
        min_cross=mitigation.min_cross,
        neighbour_cap=mitigation.neighbour_cap,
    )
    wanted = list(range(part.num_clients)) if clients is None else list(clients)
    if any(not 0 <= c < part.num_clients for c in wanted):
        raise ValueError(f"clients {wanted}: ids must lie in 0..{part.num_clients - 1}")
    dp = mitigation.dp
    if dp is not None and dp_ledger is None:
        dp_ledger = DPLedger(Budget(dp.epsilon, dp.delta))
    if dp is not None and dp.needs_predictor and predictor is None:
        predictor = audit_predictor(graph, part, seed)
    own_rows, shared = client_features(
        graph, mitigation, seed, null_release, ledger=dp_ledger, predictor=predictor
    )
    truth = graph.x.double().numpy()
    csr = part.neighbourhoods
    result = ClientAudit()
    if dp is not None and dp_ledger is not None:
        shared_source = graph.x
        if null_release:  # the permuted features client_features released
            perm = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(seed + 7919))
            shared_source = graph.x[perm]
        result.dp_spent = dp_ledger.spent(np.asarray(shared_source, dtype=np.float64))
    for cid in wanted:
        c = part.clients[cid]
        if len(c.needed) == 0:
            continue
        owned = set(c.owned.tolist())
        decode = None if dp is None else release_decoder(dp, truth[c.owned], predictor)
        enc = encode(
            kind,
            own_rows,
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
        own_blocks = {i: own_rows[i].numpy() for i in owned}  # what the neighbour sum subtracts
        result.add(score_recovery(prior, truth, neighbours, others))
        result.add(
            score_recovery(
                _decoded(neighbour_sum_attack(enc, own_blocks), decode), truth, owned_targets, others
            )
        )
        if kind.has_m2:  # M2 and M1 = h_i P_i: spectral and trace attacks; else Q_i: basis recovery
            spectral = _decoded(spectral_attack(enc, seed=seed), decode)
            result.add(score_recovery(spectral, truth, neighbours, others))
            foreign_targets = {int(i): [int(i)] for i in c.needed if int(i) not in owned}
            result.add(score_recovery(_decoded(m1_trace_attack(enc), decode), truth, foreign_targets, others))
        else:
            result.add(score_recovery(_decoded(basis_attack(enc), decode), truth, neighbours, others))
    return result


def chance_reidentification(graph: Graph, part: Partition) -> float:
    """Re-identification rate of a blind guess: 1 / (mean number of other clients' nodes)."""
    sizes = np.bincount(part.owner, minlength=part.num_clients)
    return float(np.mean(1.0 / np.maximum(graph.num_nodes - sizes, 1)))


# ------------------------------------------------------------------------------------ server side
#: what the server may receive: public keys and contexts, signed edge claims, sealed check keys it
#: cannot open, public graph metadata, ciphertexts, and in the training rounds evaluation counts and
#: the secure-aggregation messages (masked inputs, sealed shares; plaintext LocalUpdates only when
#: secure aggregation is switched off)
SERVER_ALLOWED = {
    "KeyAnnounce",
    "PublicContext",
    "PrivacyTerms",
    "EdgeClaims",
    "GraphAnnounce",
    "SealedCheckKeys",
    "NeighbourhoodStatement",
    "FeatureUpload",
    "UploadDone",
    "LocalUpdate",
    "EvaluationReport",
    "SecAggAdvert",
    "SecAggShares",
    "SecAggMasked",
    "SecAggUnmaskShares",
    "Abort",
}

SERVER_LEARNS = [
    "the graph structure: every client's owned node ids and their neighbour lists (GraphAnnounce)",
    "every client's signed claims of its cross-client edges, hence who needs which rows from whom",
    "each owner's signed statements of the neighbourhoods of its nodes another client needs (a part of its graph)",
    "degrees and neighbourhood sizes, hence the encoding sizes",
    "the number of nodes per client and the feature dimension d",
    "each client's public keys, its own public CKKS context and key fingerprint",
    (
        "the training rounds' global models (it makes them) and, with secure aggregation (default), only "
        "the weighted sum of the sampled clients' updates, their total weight and loss, and who dropped out"
    ),
    (
        "validation/test counts and losses pooled over the round's clients (inside the secure sum); "
        "per client (EvaluationReport) only when secure aggregation is switched off"
    ),
]


def _anchor_table(x: np.ndarray, dtype: type[np.floating]) -> dict[bytes, list[tuple[int, int]]]:
    """8-byte anchors -> ``(row, byte offset of the anchor in the row)`` for every row having it: each
    row's bytes from its first non-zero feature (2 float32 or 1 float64)."""
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


class RowScanner:
    """Finds copies of feature rows ``x`` (as float32 or float64) in bytes, at any byte offset: each
    row's 8-byte anchor is looked up, and a candidate counts only when the row's bytes around it
    match too (:meth:`scan`)."""

    def __init__(self, x: np.ndarray) -> None:
        self._scans = []
        for dtype in (np.float32, np.float64):
            table = _anchor_table(x, dtype)
            keys = np.array(sorted(np.frombuffer(b"".join(table), dtype=np.uint64)), dtype=np.uint64)
            self._scans.append((keys, table, [row.tobytes() for row in x.astype(dtype)]))

    def scan(self, blob: bytes) -> tuple[int, int]:
        """``(anchor candidates, verified copies of a row)`` in ``blob``."""
        candidates = hits = 0
        for keys, table, rows in self._scans:
            positions = _scan_positions(blob, keys)
            candidates += len(positions)
            hits += _verified_hits(blob, positions, table, rows)
        return candidates, hits


def longest_zero_run(blob: bytes) -> int:
    """The longest run of zero bytes in ``blob`` (a sparse feature row has runs of hundreds)."""
    raw = np.frombuffer(blob, dtype=np.uint8) == 0
    if not raw.any():
        return 0
    edges = np.diff(np.concatenate([[0], raw.astype(np.int8), [0]]))
    return int((np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).max())


def server_checks(transcript, server_id: int, x: np.ndarray, wire: str = "compact") -> dict:
    """Checks on everything the server received (a :class:`fedgat.protocols.Transcript`).

    * every message type is in :data:`SERVER_ALLOWED`;
    * every uploaded feature payload parses as a CKKS ciphertext envelope bound to the key of the
      client it is released to (each client's own public context);
    * every client announced its own key (distinct fingerprints: no shared secret key);
    * no node's feature row occurs in the server-visible bytes as float32 or float64 (8-byte anchors
      at every byte offset, each candidate verified against the row's bytes around it: a sparse
      row's anchor alone turns up in ~1 GB of ciphertext by chance), and no run of zero bytes long
      enough to hold a sparse feature row at *any* scale (a Cora row has runs of hundreds of zero
      bytes; the test is scale-free);
    * no public context the server received has a secret key or can decrypt.

    ``wire``: the session's ciphertext wire (the server's configuration, not what a message names).
    """
    from fedgat.crypto import ServerContext, deserialize
    from fedgat.protocols import FeatureUpload, PublicContext, decode_message

    received = transcript.received_by(server_id)
    types: dict[str, int] = {}
    for e in received:
        types[e.type_name] = types.get(e.type_name, 0) + 1
    unexpected = sorted(set(types) - SERVER_ALLOWED)
    scanner = RowScanner(x)
    contexts: dict[int, ServerContext] = {}
    ciphertexts = bad_ciphertexts = anchor_hits = anchor_candidates = 0
    zero_run = 0
    has_secret = cannot_decrypt = None
    for e in received:
        msg = decode_message(e.data)
        if isinstance(msg, PublicContext):
            ctx = ServerContext.from_bytes(msg.context, wire=wire)  # the session's, never the message's
            contexts[msg.party] = ctx
            has_secret = bool(has_secret) or bool(ctx.tenseal.has_secret_key())
        if isinstance(msg, FeatureUpload):
            for item in msg.items:
                ciphertexts += 1
                try:
                    vec = deserialize(contexts[msg.target], item.ciphertext, level="fresh")
                except Exception:  # noqa: BLE001 - any failure means "not a ciphertext of this key"
                    bad_ciphertexts += 1
                    continue
                if cannot_decrypt is None:
                    try:
                        vec.decrypt()
                        cannot_decrypt = False
                    except (ValueError, RuntimeError):
                        cannot_decrypt = True
                zero_run = max(zero_run, longest_zero_run(item.ciphertext))
        if e.type_name in (
            "FeatureUpload",
            "GraphAnnounce",
            "UploadDone",
            "EdgeClaims",
            "SealedCheckKeys",
            "NeighbourhoodStatement",
        ):
            candidates, hits = scanner.scan(e.payload)
            anchor_candidates += candidates
            anchor_hits += hits
    fingerprints = [ctx.fingerprint() for ctx in contexts.values()]
    min_row_zero_run = _min_feature_zero_run(x)
    checks: dict = {
        "message_types": types,
        "only_allowed_message_types": not unexpected,
        "unexpected_types": unexpected,
        "client_contexts": len(contexts),
        "distinct_client_keys": len(set(fingerprints)) == len(fingerprints) > 0,
        "uploaded_ciphertexts": ciphertexts,
        "all_uploads_are_ciphertexts_of_the_recipients_keys": ciphertexts > 0 and bad_ciphertexts == 0,
        "feature_row_anchor_candidates": anchor_candidates,
        "feature_row_anchor_hits": anchor_hits,
        "longest_zero_byte_run_in_ciphertexts": zero_run,
        "shortest_zero_byte_run_in_a_float32_feature_row": min_row_zero_run,
        "server_context_has_secret_key": has_secret,
        "server_context_cannot_decrypt": cannot_decrypt,
    }
    checks["no_feature_rows_visible"] = anchor_hits == 0 and (
        min_row_zero_run is None or zero_run < min_row_zero_run
    )
    checks["passed"] = bool(
        checks["only_allowed_message_types"]
        and checks["distinct_client_keys"]
        and checks["all_uploads_are_ciphertexts_of_the_recipients_keys"]
        and checks["no_feature_rows_visible"]
        and has_secret is False
        and cannot_decrypt is True
    )
    checks["server_learns"] = SERVER_LEARNS
    return checks


def _min_feature_zero_run(x: np.ndarray) -> int | None:
    """Shortest longest-zero-byte-run over the float32 rows of sparse features (None if dense)."""
    zero_frac = float((x == 0).mean())
    if zero_frac < 0.5:
        return None
    runs = [longest_zero_run(row.astype(np.float32).tobytes()) for row in x[: min(len(x), 500)]]
    return int(min(runs))


# ---------------------------------------------------------------------- attacks by the server


class _Steps:
    """Runs an audit's steps, reporting each one's seconds to ``log`` (None: silently)."""

    def __init__(self, log: Callable[[str], object] | None) -> None:
        self.log = log

    def run(self, name: str, step: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        out = step()
        if self.log is not None:
            self.log(f"  {name}: {time.perf_counter() - start:.0f} s")
        return out


def audit_server(
    graph: Graph,
    partition: Partition,
    variant: VariantLike = "vector",
    *,
    seed: int = 0,
    preset: str = "n4096",
    workers: int | None = None,
    upload_window: int | None = None,
    colluder: int | None = None,
    attacks: Iterable[str] = SERVER_ATTACKS,
    training_rounds: int = 3,
    strategies: Iterable[dict] | None = None,
    transcript_dir: str | None = None,
    log: Callable[[str], object] | None = None,
) -> dict:
    """Run the server-side attacks against the real protocol and check what the server received.

    An honest encrypted round runs first, recorded: :func:`server_checks` on its transcript, whether
    any two clients share a CKKS key (:func:`fedgat.server_attacks.shared_secret_key`), the
    server-plus-one-client collusion (:func:`fedgat.server_attacks.collusion_attack`, ``colluder``
    default the first client that receives foreign rows). Then the hostile rounds
    (:func:`fedgat.server_attacks.forged_results_attacks`,
    :func:`fedgat.server_attacks.fake_edges_attack`,
    :func:`fedgat.server_attacks.third_party_claims_attack`,
    :func:`fedgat.server_attacks.chosen_bases_attack`,
    :func:`fedgat.server_attacks.relabel_forgery_attack`,
    :func:`fedgat.server_attacks.row_swap_attack`,
    :func:`fedgat.server_attacks.withheld_claims_attack`,
    :func:`fedgat.server_attacks.verdict_oracle_attack`,
    :func:`fedgat.server_attacks.split_roster_attack`,
    :func:`fedgat.server_attacks.dropped_client_attack`,
    :func:`fedgat.server_attacks.colluder_forgery_attack`) and, on the clients' decrypted encodings of
    the honest round, the training attacks (:func:`fedgat.training_attacks.training_attacks`,
    ``training_rounds`` attack rounds, the aggregate attack under each of ``strategies``, default
    :data:`fedgat.training_attacks.ATTACK_STRATEGIES`).

    ``upload_window``: every encrypted round (the honest one and the hostile ones) runs with this
    upload window (:attr:`fedgat.server_attacks.AttackSetting.upload_window`; None: every upload
    before compute), so the attacks are measured against the windowed protocol too. ``log``: called
    with a line as each step ends, naming it and its seconds (the command's progress lines; most
    attacks run an encrypted round of their own).

    Returns:
        ``{"upload_window": int | None, "server": checks, "shared_secret_key": bool, "server_attacks":
        {name: {"recovered_fraction", "detected", "ran", "targets", "recovered", ...}},
        "server_attacks_not_run": [names]}``.

    Raises:
        fedgat.partition.PartitionMismatchError: ``partition`` is another graph's.
        ValueError: an unknown attack, or ``colluder`` not a client id.
    """
    check_partition(graph, partition)
    if colluder is not None and not 0 <= colluder < partition.num_clients:
        raise ValueError(f"colluder {colluder} is not a client id (0..{partition.num_clients - 1})")
    import tempfile

    from fedgat.protocols import Transcript
    from fedgat.server_attacks import (
        AttackSetting,
        chosen_bases_attack,
        colluder_forgery_attack,
        collusion_attack,
        dropped_client_attack,
        fake_edges_attack,
        first_recipient,
        forged_results_attacks,
        honest_round,
        relabel_forgery_attack,
        row_swap_attack,
        shared_secret_key,
        split_roster_attack,
        third_party_claims_attack,
        verdict_oracle_attack,
        withheld_claims_attack,
    )
    from fedgat.training_attacks import ATTACK_STRATEGIES, TrainingSetting, training_attacks

    wanted = set(attacks)
    unknown = wanted - set(SERVER_ATTACKS)
    if unknown:
        raise ValueError(f"unknown server attacks {sorted(unknown)}; known: {list(SERVER_ATTACKS)}")
    kind = as_variant(variant)
    setting = AttackSetting(graph, partition, kind.name, seed, preset, workers, upload_window=upload_window)
    truth = setting.truth
    results: dict = {}
    steps = _Steps(log)
    with tempfile.TemporaryDirectory(prefix="fedgat-audit-", dir=transcript_dir) as tmp:
        transcript = Transcript(keep_payloads=True, directory=tmp)
        parties = steps.run("the honest encrypted round, recorded", lambda: honest_round(setting, transcript))
        report: dict = {
            "upload_window": upload_window,
            "server": server_checks(
                transcript, parties.server.party_id, graph.x.numpy(), parties.server.config.wire
            ),
            "shared_secret_key": shared_secret_key(parties),
            "client_key_fingerprints": {
                c: p.key_fingerprint.hex()[:16]
                for c, p in parties.clients.items()
                if p.key_fingerprint is not None
            },
        }
        if "server_plus_one_client" in wanted:
            who = first_recipient(partition) if colluder is None else colluder
            results["server_plus_one_client"] = steps.run(
                "server_plus_one_client", lambda: collusion_attack(transcript, parties, truth, who or 0)
            )
        transcript.close()
    encodings = {c: p.encodings for c, p in parties.clients.items() if p.encodings is not None}
    forged = [n for n in ("substituted_result", "injected_ciphertexts") if n in wanted]
    if forged:
        outcomes = steps.run(" and ".join(forged), lambda: forged_results_attacks(setting))
        results.update({name: outcomes[name] for name in forged if name in outcomes})
    hostile_rounds: list[tuple[str, Callable[[], Any]]] = [
        ("fake_edges", lambda: fake_edges_attack(setting, colluder)),
        ("third_party_claims", lambda: third_party_claims_attack(setting, colluder)),
        ("chosen_bases", lambda: chosen_bases_attack(setting)),
        ("relabel_forgery", lambda: relabel_forgery_attack(setting)),
        ("row_swap", lambda: row_swap_attack(setting)),
        ("withheld_claims", lambda: withheld_claims_attack(setting)),
        ("verdict_oracle", lambda: verdict_oracle_attack(setting)),
        ("split_roster", lambda: split_roster_attack(setting)),
        ("dropped_client", lambda: dropped_client_attack(setting)),
        ("colluder_forgery", lambda: colluder_forgery_attack(setting, colluder)),
    ]
    for name, attack in hostile_rounds:
        if name in wanted:
            results[name] = steps.run(name, attack)
    training = [n for n in TRAINING_ATTACKS if n in wanted]
    if training:
        tsetting = TrainingSetting(graph, partition, encodings, seed, {"variant": kind.name})
        chosen = list(ATTACK_STRATEGIES if strategies is None else strategies)
        outcomes = steps.run(
            "the training attacks (" + ", ".join(training) + ")",
            lambda: training_attacks(tsetting, rounds=training_rounds, strategies=chosen),
        )
        results.update({name: outcomes[name] for name in training if name in outcomes})
    report["server_attacks"] = {name: results[name].as_dict() for name in SERVER_ATTACKS if name in results}
    report["server_attacks_not_run"] = [
        name for name in SERVER_ATTACKS if name not in results or not results[name].ran
    ]
    return report
