r"""Attacks an honest-but-curious client can run on the encodings it legitimately receives.

Each attack takes a client's decrypted :class:`~fedgat.encodings.Encodings` (what the protocol
delivers) and returns, per target node, its best guess of the feature vectors of the node's
neighbours. :func:`score_recovery` grades the guesses against ground truth. None of these attacks
needs anything beyond the client's own view; all are exact up to floating-point (and CKKS) error.

(a) **Neighbour sum** (the paper's own example): :math:`K_1^\top P_i K_2 = \sum_j h_j` (matrix
    variant; vector variant: :math:`\mathbf 1^\top Q_i^\top V_i`). Subtracting the neighbours the
    client owns leaves the sum of the foreign ones, which *is* the foreign feature vector when
    there is exactly one. The paper's rule (drop a lone cross-client neighbour) targets this.
(b) **Spectral attack** (matrix variant): for a random :math:`g`,
    :math:`D = \sum_s g(s) M_2(s) = \sum_j (g\cdot h_j) U_j` has eigenvalues :math:`g\cdot h_j` with
    the rank-one :math:`U_j` as eigenprojectors. With right/left eigenvectors :math:`v_j, w_j`,
    :math:`U_j = v_j w_j^\top / (w_j^\top v_j)` and :math:`h_j(s) = \operatorname{tr}(M_2(s) U_j)`,
    which recovers *every* neighbour's full feature vector (distinct eigenvalues almost surely).
(c) **M1 trace attack**: :math:`\operatorname{tr} M_1(s) = h_i(s) \operatorname{tr} P_i = n_i h_i(s)`,
    so the :math:`M_1` of a node the client does not own (the 1-hop expansion a 2-layer model
    needs) hands over that node's features. (Our wire format ships the factor :math:`h_i` itself.)
(d) **Basis recovery** (vector variant): the client needs :math:`Q_i` (or the paper's
    :math:`T_i = \sum_j u_j^{\otimes 3}`, from which :math:`Q_i` is read off by a Jennrich-style
    decomposition), and :math:`Q_i^\top V_i = H_i` returns the neighbours' features.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedgat.dp import FeatureDP, LabelPredictor
from fedgat.encodings import EncodingBucket, Encodings


@dataclass
class Recovery:
    """Guesses from one attack: ``targets[t]`` is a node whose encodings were attacked,
    ``guesses[t]`` an ``(g, d)`` array of recovered feature vectors (unordered)."""

    attack: str
    targets: list[int]
    guesses: list[np.ndarray]


def _dense(bucket: EncodingBucket) -> tuple[np.ndarray, np.ndarray | None]:
    """``K2 (B, m, d)`` and ``M2 (B, m*m, d)`` as dense float64 arrays (undo column compaction)."""
    if bucket.cols is None:
        return (
            bucket.K2.double().numpy(),
            bucket.dense_M2().double().numpy() if bucket.kind.has_m2 else None,
        )
    raise ValueError("attacks expect uncompacted encodings")


def neighbour_sum_attack(enc: Encodings, own_features: dict[int, np.ndarray]) -> Recovery:
    """(a): per target, ``sum_j h_j`` minus the neighbours the client owns; one guess per target
    (it equals the foreign neighbour exactly when there is only one)."""
    targets, guesses = [], []
    for bucket in enc.buckets:
        K2, _ = _dense(bucket)
        weights = enc.kind.sum_weights({k: t.numpy() for k, t in bucket.plain.items()})  # K1^T P or 1^T Q^T
        total = np.einsum("bm,bmd->bd", weights, K2)
        for slot, node in enumerate(bucket.bases.nodes):
            known = [own_features[int(j)] for j in bucket.bases.neighbours[slot] if int(j) in own_features]
            rest = total[slot] - (np.sum(known, axis=0) if known else 0.0)
            targets.append(int(node))
            guesses.append(rest[None, :])
    return Recovery("neighbour_sum", targets, guesses)


def spectral_attack(enc: Encodings, seed: int = 0) -> Recovery:
    """(b): eigendecompose a random combination of the ``M2(s)`` and read every ``h_j`` off."""
    if not enc.kind.has_m2:
        raise ValueError("the spectral attack targets the matrix variant")
    rng = np.random.default_rng(seed)
    targets, guesses = [], []
    for bucket in enc.buckets:
        _, M2 = _dense(bucket)
        assert M2 is not None  # the matrix variant (checked above)
        B, m = len(bucket.bases), bucket.bases.m
        M2 = M2.reshape(B, m, m, -1)
        g = rng.standard_normal(M2.shape[-1])
        D = np.einsum("bxyd,d->bxy", M2, g)
        vals, right = np.linalg.eig(D)
        left = np.linalg.inv(right)  # rows are left eigenvectors, normalised so left @ right = I
        n = bucket.bases.n
        for slot, node in enumerate(bucket.bases.nodes):
            # the n non-zero eigenvalues belong to the U_j; the other m - n are 0 (kernel of D)
            keep = np.argsort(-np.abs(vals[slot]))[:n]
            v, w = right[slot][:, keep], left[slot][keep, :]  # (m, n), (n, m)
            feats = np.einsum("jx,xyd,yj->jd", w, M2[slot], v).real  # h_j(s) = w_j^T M2(s) v_j
            targets.append(int(node))
            guesses.append(feats)
    return Recovery("spectral", targets, guesses)


def m1_trace_attack(enc: Encodings) -> Recovery:
    """(c): ``h_i = tr(M1(s)) / tr(P_i)`` for every encoded node (the paper's M1 = h_i P_i)."""
    if not enc.kind.has_m2:
        raise ValueError("M1 exists in the matrix variant")
    targets, guesses = [], []
    for bucket in enc.buckets:
        trace_p = torch.diagonal(bucket.plain["P"], dim1=1, dim2=2).sum(-1).numpy()  # = n_i
        m1_trace = bucket.h_self.double().numpy() * trace_p[:, None]  # tr(h_i(s) P_i) for all s
        for slot, node in enumerate(bucket.bases.nodes):
            targets.append(int(node))
            guesses.append((m1_trace[slot] / trace_p[slot])[None, :])
    return Recovery("m1_trace", targets, guesses)


def basis_attack(enc: Encodings) -> Recovery:
    """(d): ``Q_i^T V_i = H_i`` (vector variant)."""
    if enc.kind.has_q:
        raise ValueError("basis recovery targets the vector variant")
    targets, guesses = [], []
    for bucket in enc.buckets:
        K2, _ = _dense(bucket)
        H = np.einsum("bmn,bmd->bnd", bucket.plain["Q"].numpy(), K2)
        for slot, node in enumerate(bucket.bases.nodes):
            targets.append(int(node))
            guesses.append(H[slot])
    return Recovery("basis", targets, guesses)


def prior_knowledge(targets: dict[int, list[int]], own_feats: dict[int, np.ndarray]) -> Recovery:
    """The no-attack baseline: per target, the features of the target's neighbours the client owns.

    Every attack is graded with an oracle choice among its guesses (:func:`score_recovery` keeps, per
    victim, the guess closest to the truth), and a client's own neighbours are similar to its foreign
    ones (homophily), so a blind attacker already scores above ``1 / #candidates``. This is what
    "at chance" means for an attack: no better than guessing with what the client knew anyway.
    """
    d = len(next(iter(own_feats.values()))) if own_feats else 0
    guesses = [
        np.asarray([own_feats[j] for j in nbrs if j in own_feats]).reshape(-1, d) for nbrs in targets.values()
    ]
    return Recovery("prior_knowledge", list(targets), guesses)


def release_decoder(
    dp: FeatureDP, known: np.ndarray, predictor: LabelPredictor | None = None
) -> Callable[[np.ndarray], np.ndarray]:
    """The attacker's map from rows of a DP block layout (:mod:`fedgat.dp`, ``(g, d + w)``) back to
    feature space (``(g, d)``): block A as is, plus its best estimate of the features behind block B.

    ``gaussian``: the projection's transpose applied to the mechanism's output (the least-squares
    inverse of a projection with orthonormal rows); ``multibit``: the output itself (an unbiased
    estimate up to scale); ``label_rr``: the mean feature row of the class the release names, the
    means taken over ``known`` (the attacker's own ``(n, d)`` rows) labelled by the published
    ``predictor`` (classes it sees none of decode to zero).
    """
    d = known.shape[1]
    if dp.mechanism == "label_rr":
        if predictor is None:
            raise ValueError("decoding a label_rr release needs the published predictor")
        labels = predictor.labels(known)
        counts = np.bincount(labels, minlength=predictor.num_classes)
        means = np.zeros((predictor.num_classes, d))
        np.add.at(means, labels, known)
        means /= np.maximum(counts, 1)[:, None]
        inverse = means
    elif dp.mechanism == "gaussian":
        R = dp.projection(d)
        inverse = np.eye(d) if R is None else R.double().numpy()
    else:
        inverse = np.eye(d)

    def decode(rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.float64)
        return rows[:, :d] + rows[:, d + 1 :] @ inverse  # column d is the constant marker

    return decode


def recover_basis_from_tensor(T: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """Jennrich's algorithm: the ``u_j`` of ``T = sum_j u_j (x) u_j (x) u_j`` (orthonormal ``u_j``).

    ``T(., ., a) = U diag(U^T a) U^T``, so the eigenvectors of ``T(., ., a)`` with the ``n``
    largest ``|eigenvalues|`` are the ``u_j`` (up to sign and order). Used to show the paper's
    T-tensor form of the vector variant reveals the basis just as shipping ``Q`` does.
    """
    a = np.random.default_rng(seed).standard_normal(T.shape[2])
    vals, vecs = np.linalg.eigh(np.einsum("xyz,z->xy", T, a))
    return vecs[:, np.argsort(-np.abs(vals))[:n]]


@dataclass
class RecoveryScore:
    """How well an attack recovered the features of the targets' foreign neighbours."""

    attack: str
    victims: int  # (target, foreign neighbour) pairs
    recovered: int  # pairs with a guess at cosine >= threshold
    mean_cosine: float  # mean over pairs of the best guess's cosine
    reidentified: int  # pairs whose best guess is closest to the right node among all foreign nodes

    @property
    def recovered_fraction(self) -> float:
        return self.recovered / self.victims if self.victims else 0.0

    @property
    def reidentification_rate(self) -> float:
        return self.reidentified / self.victims if self.victims else 0.0

    def as_dict(self) -> dict:
        return {
            "attack": self.attack,
            "victims": self.victims,
            "recovered": self.recovered,
            "recovered_fraction": self.recovered_fraction,
            "mean_cosine": self.mean_cosine,
            "reidentification_rate": self.reidentification_rate,
        }


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def score_recovery(
    recovery: Recovery,
    x: np.ndarray,
    victims: dict[int, list[int]],
    candidates: np.ndarray,
    threshold: float = 0.99,
) -> RecoveryScore:
    """Grade an attack against ground truth.

    Args:
        recovery: the attack's guesses.
        x: ``(N, d)`` true features of all nodes.
        victims: target node -> the foreign neighbours whose features the client should not learn.
        candidates: node ids a recovered vector is matched against for re-identification (all
            nodes of the other clients).
        threshold: cosine at which a neighbour counts as recovered.
    """
    cand = _unit(x[candidates])
    pairs = recovered = reid = 0
    cos_sum = 0.0
    for target, guesses in zip(recovery.targets, recovery.guesses):
        foreign = victims.get(target, [])
        if not foreign or len(guesses) == 0:
            pairs += len(foreign)
            continue
        g = _unit(np.asarray(guesses, dtype=np.float64))
        cos = _unit(x[foreign]) @ g.T  # (victims, guesses)
        best = cos.argmax(axis=1)
        best_cos = cos[np.arange(len(foreign)), best]
        nearest = candidates[(g[best] @ cand.T).argmax(axis=1)]
        pairs += len(foreign)
        cos_sum += float(best_cos.sum())
        recovered += int((best_cos >= threshold).sum())
        reid += int((nearest == np.asarray(foreign)).sum())
    return RecoveryScore(recovery.attack, pairs, recovered, cos_sum / pairs if pairs else 0.0, reid)
