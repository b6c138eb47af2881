r"""What every party of the pre-training round agrees on before it starts: the session's
parameters (:class:`PretrainConfig`), phase deadlines (:class:`PretrainTimeouts`) and resource
limits (:class:`PretrainLimits`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedgat.crypto import DEFAULT_PRESET, DEFAULT_WIRE, SlotLayout, check_wire, get_preset
from fedgat.crypto.tags import TAG_COLUMNS
from fedgat.dp import FeatureDP
from fedgat.variants import Variant, VariantLike, as_variant

from .errors import ConfigMismatchError
from .messages import MAX_NODES, PrivacyTerms

__all__ = ["CLIENT_KIND", "PretrainConfig", "PretrainLimits", "PretrainTimeouts", "bases_bytes"]

MiB = 1 << 20
GiB = 1 << 30
CLIENT_KIND = "fedgat.pretrain.client"


@dataclass(frozen=True)
class PretrainTimeouts:
    """Seconds per phase (None: wait forever). Server: ``keys`` from its start until it holds every
    client's keys, context, claims and graph; ``upload`` from then until every UploadDone. Clients:
    ``keys`` until the roster is ready and the check keys of every recipient arrived; ``download``
    without any bases or results message.

    With an upload window (:attr:`PretrainConfig.upload_window`) the deadlines count waiting, not
    working: the server's ``upload`` restarts at each grant and after each of its compute steps and
    does not fire while it has a complete recipient to compute; a client's ``download`` restarts at
    each grant, bases or results message and after each of its upload steps, and does not fire while
    it has granted rows to send. A client waiting for a grant waits for the other owners' uploads
    and the server's compute of the recipients before it: give clients longer deadlines than that."""

    keys: float | None = None
    upload: float | None = None
    download: float | None = None


@dataclass(frozen=True)
class PretrainLimits:
    """Resource limits, checked before work of that size starts.

    Attributes:
        max_dim: largest feature dimension a client may announce.
        max_nodes: most nodes in the session (all clients together).
        max_neighbours: largest attention neighbourhood (``n``; the matrix variant's encodings grow
            as ``4 n^2`` rows per node).
        max_bases_bytes: the server's memory for the bases it draws (``p`` and ``q``, float64).
        max_encoding_bytes: a client's memory for its decrypted encodings.
    """

    max_dim: int = 1 << 16
    max_nodes: int = MAX_NODES
    max_neighbours: int = 1 << 12
    max_bases_bytes: int = 4 * GiB
    max_encoding_bytes: int = 8 * GiB


def bases_bytes(variant: VariantLike, sizes: np.ndarray, embed_factor: int) -> int:
    """Bytes of the float64 bases the server draws for nodes with neighbourhood ``sizes``
    (:meth:`fedgat.variants.Variant.bases_bytes`)."""
    return as_variant(variant).bases_bytes(sizes, embed_factor)


@dataclass(frozen=True)
class PretrainConfig:
    """Session parameters every party agrees on out of band, with the roster.

    Attributes:
        session: the session id (u64) every message, claim, key binding and sealed check key is bound to.
        variant: "vector" or "matrix" encodings (a :class:`~fedgat.variants.Variant` is accepted and
            stored by name); :attr:`kind` is the variant itself.
        preset: CKKS preset name (:data:`fedgat.crypto.PRESETS`).
        chunks: feature chunks per node in the slot layout; None picks
            :meth:`~fedgat.crypto.SlotLayout.for_dimension` (3 chunks for Cora at n4096).
        embed_factor: vector variant's ``m = embed_factor * n``.
        dp: differential privacy of the rows shared across clients (:class:`fedgat.dp.FeatureDP`;
            None: off). With it the rows a client releases to others are its DP release, the server
            computes on the release's width only, and a client's encodings follow the block layout
            of :mod:`fedgat.dp`: its own clean rows in the first ``d`` columns, every other node's
            release in the last ``w``.
            Every party must hold the same terms: they are exchanged (:class:`PrivacyTerms`) and a
            mismatch is refused (:class:`~fedgat.protocols.errors.ConfigMismatchError`).
            The terms are public and shared with the server, so the owner's ledger is not part of
            them: each client is built with its own :class:`~fedgat.dp_ledger.DPLedger`
            (``ClientPretrain(ledger=...)``), charged before its release is drawn.
        wire: the ciphertext wire (:data:`fedgat.crypto.params.WIRES`): ``"compact"`` (default;
            envelope version 2, every coefficient at its prime's width: bytes at the floor, more
            CPU to pack and unpack) or ``"tenseal"`` (envelope version 1, TenSEAL's own bytes: ~16-22 %
            more bytes, less CPU). Every party's contexts write and accept this wire only; each
            client names it in its :class:`PublicContext` and a party configured with another is
            refused at key set-up (:class:`~fedgat.protocols.errors.ConfigMismatchError`).
        upload_window: None (default): every client uploads all its released rows at once and the
            server computes once every upload is in, so its spool holds the whole round's uploads.
            ``W >= 1``: uploads go recipient by recipient, ``W`` recipients open at a time: a client
            uploads the rows it releases to a recipient only after the server's
            :class:`~fedgat.protocols.messages.UploadGrant` for it, the server computes each
            recipient as soon as its uploads are in and deletes its spool, then grants the next one.
            The server's disk then holds at most ``W`` recipients' uploads instead of all of them
            (at ogbn-arxiv's size ~130 GB in all), and with ``W >= 2`` its compute overlaps the
            clients' uploads. Recipients are computed in order, whatever order their uploads
            complete in.
            The bases are drawn when the roster is ready, so a client receives its bases and results
            while it may still be uploading (what it learns does not change; see ``SECURITY.md``).
            Clients refuse a grant in a session without a window
            (:class:`~fedgat.protocols.errors.ConfigMismatchError`).
    """

    session: int
    variant: str = "vector"
    preset: str = DEFAULT_PRESET
    chunks: int | None = None
    embed_factor: int = 1
    dp: FeatureDP | None = None
    wire: str = DEFAULT_WIRE
    upload_window: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "variant", as_variant(self.variant).name)  # ValueError: unknown name
        check_wire(self.wire)  # ValueError: unknown wire
        if not 0 <= self.session < 2**64:
            raise ValueError("session must be a u64")
        if self.dp is not None and not isinstance(self.dp, FeatureDP):
            raise TypeError(f"dp must be a FeatureDP or None, not {type(self.dp).__name__}")
        if self.upload_window is not None and (
            isinstance(self.upload_window, bool)
            or not isinstance(self.upload_window, int)
            or self.upload_window < 1
        ):
            raise ValueError(f"upload_window must be None or a positive int, got {self.upload_window!r}")

    @property
    def kind(self) -> Variant:
        """The :class:`~fedgat.variants.Variant` of the session's encodings."""
        return as_variant(self.variant)

    @property
    def upload_pad(self) -> float:
        """``sigma``: every row an owner releases is padded with Gaussian values of sd ``sigma`` from a
        PRF under the recipient's check key (:func:`fedgat.crypto.tags.release_rows`), so that a
        recipient's verdicts are post-processing of the Gaussian mechanism and the server cannot make
        them a test of a foreign feature (known break 22 in SECURITY.md): ``(epsilon, delta)``-DP
        per row and session, :mod:`fedgat.verdict_dp`. Derived from the preset and the variant
        (:meth:`fedgat.crypto.params.CkksPreset.pad_bound`): 14.2 at ``n4096`` (vector; 6.4
        matrix), 819 at ``n8192``."""
        return get_preset(self.preset).pad_bound(self.kind.max_coefficient_row_norm())

    @staticmethod
    def row_width(dim: int) -> int:
        """Values per released row: the ``dim`` features and the tag columns
        (:data:`fedgat.crypto.tags.TAG_COLUMNS`)."""
        return dim + TAG_COLUMNS

    def dp_fields(self) -> dict:
        """The :class:`PrivacyTerms` fields of :attr:`dp` (which must be set)."""
        assert self.dp is not None
        dp = self.dp
        return {
            "mechanism": dp.mechanism,
            "epsilon": float(dp.epsilon),
            "delta": float(dp.delta),
            "dim": 0 if dp.dim is None else int(dp.dim),
            "seed": int(dp.seed),
            "bits": 0 if dp.bits is None else int(dp.bits),
            "low": float(dp.bounds[0]),
            "high": float(dp.bounds[1]),
        }

    def check_terms(self, msg: PrivacyTerms, who: str) -> None:
        """Refuse announced DP terms that differ from :attr:`dp` (or any terms without DP).

        Raises:
            ConfigMismatchError: the terms differ.
        """
        got = {k: getattr(msg, k) for k in PrivacyTerms.SCHEMA_FIELDS}
        if self.dp is None:
            raise ConfigMismatchError(
                f"{who} runs the session with DP terms {got}; this party runs it without DP"
            )
        if got != self.dp_fields():
            raise ConfigMismatchError(f"{who} runs the session with DP terms {got}, not {self.dp_fields()}")

    def layout(self, d: int, slots: int) -> SlotLayout:
        if self.chunks is None:
            return SlotLayout.for_dimension(d, slots)
        return SlotLayout(d, slots, self.chunks)

    def rows_per_node(self, n: int, ship_m2: bool = False) -> int:
        """Computed rows ``R`` of a node with ``n`` neighbours (all but :math:`h_i`). ``ship_m2``:
        as in the paper's protocol, which also computes the matrix variant's ``m^2`` rows of ``M2``
        (this one lets clients derive them, :meth:`fedgat.encodings.BucketBases.m2_map`);
        :meth:`fedgat.variants.Variant.computed_rows`."""
        return self.kind.computed_rows(n, self.embed_factor, ship_m2)
