"""Models: FedGAT (approximate first layer from encodings + exact PyG GAT layers) and the GAT reference.

Both follow Veličković et al.'s Cora architecture by default: 8 heads x 8 hidden, ELU, dropout 0.6,
one output head. Layer 1 is where FedGAT differs: it reads encodings instead of neighbour features,
so it cannot drop per-node input features or per-edge attention weights; it drops input-feature
columns of ``W`` instead (one mask for all nodes, see :class:`~fedgat.layer.FedGATConv`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GATConv

from fedgat.approx import ScorePolynomial
from fedgat.encodings import Encodings
from fedgat.layer import FedGATConv


class FedGAT(nn.Module):
    """Two-layer FedGAT: :class:`FedGATConv` then an exact ``GATConv``.

    ``forward(encodings, edge_index)`` takes the encodings of the client's *needed* nodes (owned
    nodes plus the 1-hop expansion) and ``edge_index`` ``(2, E)`` over positions in
    ``encodings.nodes`` (self-loops included; targets are the nodes whose logits matter). Returns
    logits ``(num_needed, num_classes)``.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        hidden: int = 8,
        heads: int = 8,
        out_heads: int = 1,
        dropout: float = 0.6,
        feature_dropout: float = 0.6,
        score: ScorePolynomial | None = None,
    ) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv1 = FedGATConv(
            in_channels, hidden, heads=heads, concat=True, score=score, feature_dropout=feature_dropout
        )
        self.conv2 = GATConv(
            hidden * heads, num_classes, heads=out_heads, concat=False, dropout=dropout, add_self_loops=False
        )

    def forward(self, encodings: Encodings, edge_index: torch.Tensor) -> torch.Tensor:
        h = F.elu(self.conv1(encodings))
        h = F.dropout(h, p=self.dropout, training=self.training)
        return self.conv2(h, edge_index)


class GAT(nn.Module):
    """The exact two-layer GAT (PyG ``GATConv``) on raw features: the centralised reference.

    ``forward(x, edge_index)`` with ``edge_index`` already holding self-loops.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        hidden: int = 8,
        heads: int = 8,
        out_heads: int = 1,
        dropout: float = 0.6,
    ) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv1 = GATConv(in_channels, hidden, heads=heads, dropout=dropout, add_self_loops=False)
        self.conv2 = GATConv(
            hidden * heads, num_classes, heads=out_heads, concat=False, dropout=dropout, add_self_loops=False
        )

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, p=self.dropout, training=self.training)
        h = F.elu(self.conv1(x, edge_index))
        h = F.dropout(h, p=self.dropout, training=self.training)
        return self.conv2(h, edge_index)
