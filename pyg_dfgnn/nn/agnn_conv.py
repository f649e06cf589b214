"""Drop-in :class:`torch_geometric.nn.AGNNConv` running the fused attention kernel."""
from __future__ import annotations

from torch import Tensor
from torch_geometric.nn.conv.agnn_conv import AGNNConv as _PyGAGNNConv
from torch_geometric.typing import Adj

from ..ops import agnn_attention
from ._fused import FusedAttentionMixin, common_dtype, resolve_adjacency


class AGNNConv(FusedAttentionMixin, _PyGAGNNConv):
    r"""The graph attentional propagation layer from the `"Attention-based
    Graph Neural Network for Semi-Supervised Learning"
    <https://arxiv.org/abs/1803.03735>`_ paper, with PyG's exact interface.

    A subclass of :class:`torch_geometric.nn.AGNNConv` (the learnable or
    fixed ``beta``, ``requires_grad`` and ``add_self_loops`` flags and the
    ``state_dict`` are PyG's own) whose cosine attention runs as one fused op
    (:func:`pyg_dfgnn.ops.agnn_attention`) on a cached CSR view of the graph,
    self-loops included.  Falls back to PyG's own message passing where the
    fused path cannot reproduce it (explain mode, hooks, ...; see
    :class:`pyg_dfgnn.nn.GATConv`).

    See :class:`torch_geometric.nn.AGNNConv` for the arguments.
    """

    _pyg_cls = _PyGAGNNConv

    def forward(self, x: Tensor, edge_index: Adj) -> Tensor:
        r"""Runs the forward pass of the module (arguments as in PyG)."""
        reason = self._fused_fallback_reason(x)
        if reason is None and (not isinstance(x, Tensor) or x.dim() != 2):
            reason = "node features that are not a 2-D tensor"
        if reason is not None:
            self._fused_fallback(reason, x)
            return super().forward(x, edge_index)

        # The annotations below mirror PyG's: its Inspector caches class sources by
        # class *name*, so the templates of PyG's own propagate (used
        # on fallback) are generated from this class's source, not PyG's.
        # propagate_type: (x: Tensor, x_norm: Tensor)
        N = x.size(self.node_dim)
        adj = resolve_adjacency(edge_index, None, N, N,
                                loops=N if self.add_self_loops else None)
        x, beta = common_dtype(x, self.beta)
        out, _ = agnn_attention(adj.graph, x, beta)
        return out
