r"""GCN models for the baselines: Kipf & Welling's 2-layer GCN and FedGCN's client model.

Both compute Kipf & Welling's eq. (9), :math:`Z = \hat A\,\mathrm{ReLU}(\hat A X W^{(0)})\,W^{(1)}` with
:math:`\hat A = \tilde D^{-1/2}(A + I)\tilde D^{-1/2}` (logits; the softmax is in the loss).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv

from fedgat.graph import CSR


def gcn_edge_weights(neighbourhoods: CSR) -> torch.Tensor:
    r"""Symmetric-normalised weights :math:`\hat A_{ij} = 1/\sqrt{\tilde d_i \tilde d_j}` for every entry
    of ``neighbourhoods`` (rows must include the self-loop; :math:`\tilde d` = row length), in
    :meth:`CSR.to_edge_index` order. Returns ``(nnz,)`` float32."""
    deg = torch.from_numpy(neighbourhoods.degrees()).float()
    src, dst = neighbourhoods.to_edge_index()
    return deg[src].rsqrt() * deg[dst].rsqrt()


def normalised_aggregate(x: torch.Tensor, neighbourhoods: CSR) -> torch.Tensor:
    r""":math:`\hat A X`: row :math:`i` is :math:`\sum_{j \in N(i) \cup \{i\}} x_j / \sqrt{\tilde d_i \tilde d_j}`.

    Args:
        x: ``(N, d)`` features.
        neighbourhoods: incoming neighbour rows including the self-loop.

    Returns:
        ``(N, d)`` float tensor (one sparse-dense product).
    """
    src, dst = neighbourhoods.to_edge_index()
    n = neighbourhoods.num_nodes
    a_hat = torch.sparse_coo_tensor(
        torch.stack([dst, src]), gcn_edge_weights(neighbourhoods), (n, n), check_invariants=True
    )
    return torch.sparse.mm(a_hat, x)


class GCN(nn.Module):
    """Centralised 2-layer GCN (PyG ``GCNConv``, which adds self-loops and normalises).

    ``forward(x, edge_index)``: ``x`` ``(N, d)``, ``edge_index`` ``(2, E)`` without self-loops;
    dropout on the input and the hidden layer, as in Kipf & Welling.
    """

    def __init__(self, in_channels: int, num_classes: int, hidden: int = 16, dropout: float = 0.5) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv1 = GCNConv(in_channels, hidden, cached=True)
        self.conv2 = GCNConv(hidden, num_classes, cached=True)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, p=self.dropout, training=self.training)
        h = F.dropout(F.relu(self.conv1(x, edge_index)), p=self.dropout, training=self.training)
        return self.conv2(h, edge_index)


class PrecomputedGCN(nn.Module):
    r"""FedGCN's client model: layer 1 reads the pre-computed :math:`(\hat A X)_i` rows it received,
    layer 2 is a ``GCNConv`` over the client's local edges with given (full-graph) weights.

    ``forward(ax, edge_index, edge_weight)``: ``ax`` ``(R, d)`` rows for the client's needed nodes,
    ``edge_index`` ``(2, E)`` local positions (self-loops included), ``edge_weight`` ``(E,)``.
    Returns ``(R, C)`` logits; rows of nodes whose whole neighbourhood is in ``edge_index`` (the
    owned ones) equal the centralised GCN's. Input dropout acts on :math:`\hat A X` (the client never
    sees :math:`X` of its neighbours), unlike Kipf's dropout on :math:`X`.
    """

    def __init__(self, in_channels: int, num_classes: int, hidden: int = 16, dropout: float = 0.5) -> None:
        super().__init__()
        self.dropout = dropout
        self.lin1 = nn.Linear(in_channels, hidden)
        self.conv2 = GCNConv(hidden, num_classes, normalize=False, add_self_loops=False)

    def forward(self, ax: torch.Tensor, edge_index: torch.Tensor, edge_weight: torch.Tensor) -> torch.Tensor:
        h = F.dropout(ax, p=self.dropout, training=self.training)
        h = F.dropout(F.relu(self.lin1(h)), p=self.dropout, training=self.training)
        return self.conv2(h, edge_index, edge_weight)
