"""FedGAT: federated graph attention networks with a CKKS-encrypted pre-training round.

``fedgat.Graph`` (:class:`fedgat.graph.Graph`: ``Graph.from_pyg``, ``graph.to_pyg()``) is imported on
first use, so that ``import fedgat`` (and ``fedgat --help``) does not load torch.

Where to start, from Python:

* :func:`fedgat.data.load_dataset`: a graph (``"cora"``, ``"synthetic"``, a graph folder, a
  ``.npz``/``.pt`` file), or :meth:`Graph.from_pyg <fedgat.graph.Graph.from_pyg>` of your own data;
* :func:`fedgat.pipeline.run_encrypted_fedgat`: split, encrypted pre-training and FedGAT training in
  one call (``owner=`` for your own split); its result's ``summary()`` is JSON;
* step by step: :func:`fedgat.partition.make_partition`,
  :func:`fedgat.pipeline.run_encrypted_pretraining` (and :func:`~fedgat.pipeline.run_plaintext_pretraining`
  with the same ``seed=``, compared by :func:`~fedgat.pipeline.max_abs_error`),
  :func:`fedgat.pipeline.train_fedgat`;
* :func:`fedgat.methods.run_method`: the baselines (GAT, GCN, FedGCN, DistGAT);
* :mod:`fedgat.audit`: the privacy audit. ``notebooks/`` walks through each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Graph", "__version__"]

if TYPE_CHECKING:
    from fedgat.graph import Graph


def __getattr__(name: str) -> Any:
    if name == "Graph":
        from fedgat.graph import Graph

        return Graph
    raise AttributeError(f"module 'fedgat' has no attribute {name!r}")
