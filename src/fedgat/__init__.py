"""FedGAT: federated graph attention networks with a CKKS-encrypted pre-training round.

``fedgat.Graph`` (:class:`fedgat.graph.Graph`: ``Graph.from_pyg``, ``graph.to_pyg()``) is imported on
first use, so that ``import fedgat`` (and ``fedgat --help``) does not load torch.
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
