"""The Flower engine's run config, the run's data and its errors (:mod:`fedgat.protocols.flower_app`).

Nothing here imports ``flwr``: the config and the data are the same for every party, and the
identity and roster tools (:mod:`fedgat.protocols.flower_roster`) work without the extra.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from fedgat.graph import Graph
from fedgat.methods import fedgat_partition, resolve_hparams
from fedgat.partition import Partition

__all__ = [
    "FLOWER_HINT",
    "FlowerEngineError",
    "FlowerRunConfig",
    "FlowerTimeoutError",
    "FlowerUnavailableError",
    "NodePolicyError",
    "RemotePartyError",
    "RosterChangedError",
    "RosterMismatchError",
    "load_graph",
    "make_run_partition",
]

FLOWER_HINT = 'the Flower engine needs flwr 1.41: pip install "fedgat[flower]"'


class FlowerUnavailableError(ImportError):
    """flwr is not installed (install the ``flower`` extra)."""


class FlowerEngineError(RuntimeError):
    """Base class of the Flower engine's errors."""


class FlowerTimeoutError(FlowerEngineError):
    """Nodes did not connect, or replies did not arrive, within the configured time."""


class RemotePartyError(FlowerEngineError):
    """A ClientApp raised (Flower error reply) or its party aborted or ended in a wrong state."""


class NodePolicyError(RemotePartyError):
    """The run config (the server operator's) asks for something this node's own config does not
    allow: training updates without secure aggregation, a cohort below the node's ``min-cohort``, or
    weaker DP-FedAvg than its ``max-update-epsilon``."""


class RosterMismatchError(FlowerEngineError):
    """A key differs from the pinned roster, or the parties do not form a valid roster."""


class RosterChangedError(RosterMismatchError):
    """A client was sent a roster other than the one it accepted first in this run (a client keeps
    the first roster it sees, pinned or trusted on first use, for the whole run)."""


@dataclass(frozen=True)
class FlowerRunConfig:
    """The run config (``[tool.flwr.app.config]``, ``flwr run --run-config``), shared by all parties.

    Attributes:
        num_clients: clients (``partition-id`` 0..K-1); the server is party K.
        dataset: ``"synthetic"`` or a Planetoid name (``"cora"``...) read from ``data_dir``.
        data_dir: dataset root ("": ``$FEDGAT_DATA``, else the user cache).
        synthetic_nodes, synthetic_features, synthetic_classes, synthetic_train_per_class,
            synthetic_seed: the synthetic graph (:func:`fedgat.synthetic.synthetic_graph`; a fifth of
            the nodes validate, a quarter test).
        beta, seed: Dirichlet split and seed (the split of :func:`fedgat.pipeline.run_encrypted_fedgat`;
            the seed also seeds the initial model and each client's dropout stream).
        variant, preset, chunks: encodings variant, CKKS preset, chunks per ciphertext (0: auto).
        wire: the ciphertext wire (``"compact"``: bytes at the floor, more CPU; ``"tenseal"``:
            ~16-22 % more bytes, less CPU; :attr:`fedgat.protocols.pretrain.PretrainConfig.wire`). A
            client whose node config pins ``wire`` refuses a session with another.
        bases_seed: seeds the server's bases (-1: CSPRNG; set only to compare with a plaintext twin
            or with the in-process engine).
        hparams: JSON object of FedGAT hyper-parameter overrides (:func:`fedgat.methods.default_hparams`).
        server_workers: processes for the server's homomorphic compute (0: in process).
        upload_batch: rows per FeatureUpload.
        upload_window: pace the pre-training's uploads recipient by recipient, that many recipients
            open at a time (:attr:`fedgat.protocols.pretrain.PretrainConfig.upload_window`: the
            server spools one recipient's uploads at a time, not the round's); 0: every upload at once.
        round_timeout: seconds to wait for the replies of one exchange (and for nodes to connect).
        flush_bytes: send queued frames once this many bytes wait, even while the server computes.
        output_dir: where the server writes ``summary.json`` and the model ("": nowhere).
        roster: the *server's* pinned roster JSON ("": trust on first use, see
            :mod:`fedgat.protocols.flower_app`). Clients never read it: the run config is set by the
            server operator, so a client pins only the roster of its own node config (``roster``).
        server_identity: the server's identity JSON ("": fresh keys).
    """

    num_clients: int = 3
    dataset: str = "synthetic"
    data_dir: str = ""
    synthetic_nodes: int = 200
    synthetic_features: int = 16
    synthetic_classes: int = 4
    synthetic_train_per_class: int = 10
    synthetic_seed: int = 0
    beta: float = 1.0
    seed: int = 0
    variant: str = "vector"
    preset: str = "n4096"
    chunks: int = 0
    wire: str = "compact"
    bases_seed: int = -1
    hparams: str = "{}"
    server_workers: int = 0
    upload_batch: int = 32
    upload_window: int = 0
    round_timeout: float = 600.0
    flush_bytes: int = 256 << 20
    output_dir: str = ""
    roster: str = ""
    server_identity: str = ""

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> FlowerRunConfig:
        """Read the kebab-case keys of a Flower run config, each converted to its field's type
        (that of the field's default); unknown keys are ignored (``dealer`` included, an option of
        versions whose pre-training had a dealer)."""
        defaults = cls()
        kwargs = {}
        for f in fields(cls):
            key = f.name.replace("_", "-")
            if key in run_config:
                kind = type(getattr(defaults, f.name))
                kwargs[f.name] = kind(run_config[key])
        out = cls(**kwargs)
        if out.upload_window < 0:
            raise ValueError(f"run config upload-window must be >= 0 (0: off), got {out.upload_window}")
        return out

    def hyper(self) -> dict:
        """Resolved FedGAT hyper-parameters (:func:`fedgat.methods.resolve_hparams`)."""
        try:
            overrides = json.loads(self.hparams or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"run config hparams is not a JSON object: {exc}") from exc
        if not isinstance(overrides, dict):
            raise TypeError("run config hparams must be a JSON object")
        ledgers = sorted(set(overrides) & set(SIMULATION_LEDGERS))
        if ledgers:
            # a server operator's run config cannot spend or bound a node's budget: the node's own
            # config does (verdict-ledger, update-ledger); silently ignoring these would mislead
            raise ValueError(
                f"run config hparams {', '.join(ledgers)}: the simulations' DP ledgers; on Flower each node "
                "keeps its own (node config verdict-ledger / update-ledger with their budgets)"
            )
        return resolve_hparams("fedgat", {"variant": self.variant, **overrides})


#: hyper-parameters of the simulations' persistent DP ledgers (:func:`fedgat.dp_ledger.owner_ledgers`),
#: which a Flower run refuses: its nodes' ledgers are their own node config
SIMULATION_LEDGERS = ("dp_budget", "dp_ledger_dir", "update_dp_budget", "update_dp_ledger_dir")


def load_graph(cfg: FlowerRunConfig) -> Graph:
    """The run's graph: synthetic, or a Planetoid dataset from ``data_dir`` / ``$FEDGAT_DATA``."""
    if cfg.dataset == "synthetic":
        from fedgat.synthetic import synthetic_graph

        n = cfg.synthetic_nodes
        return synthetic_graph(
            num_nodes=n,
            num_classes=cfg.synthetic_classes,
            num_features=cfg.synthetic_features,
            train_per_class=cfg.synthetic_train_per_class,
            num_val=n // 5,
            num_test=n // 4,
            seed=cfg.synthetic_seed,
        )
    from fedgat.data import load_dataset

    return load_dataset(cfg.dataset, cfg.data_dir or None)


def make_run_partition(graph: Graph, cfg: FlowerRunConfig) -> Partition:
    """The split :func:`fedgat.pipeline.run_encrypted_fedgat` uses for the same arguments
    (:func:`fedgat.methods.fedgat_partition`)."""
    return fedgat_partition(graph, cfg.num_clients, cfg.beta, cfg.seed, cfg.hyper())
