"""Drop-in :class:`torch_geometric.nn.GATv2Conv` running the fused GATv2 kernel."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn.conv.gatv2_conv import GATv2Conv as _PyGGATv2Conv
from torch_geometric.typing import Adj, OptTensor, PairTensor, SparseTensor

from ..ops import gatv2_attention
from ._padded import kernel_width, paddable, padded_linear
from ._fused import (FusedAttentionMixin, attention_weights, check_sparse_loops,
                     common_dtype, implied_edge_attr, resolve_adjacency)


class GATv2Conv(FusedAttentionMixin, _PyGGATv2Conv):
    r"""The GATv2 operator from the `"How Attentive are Graph Attention
    Networks?" <https://arxiv.org/abs/2105.14491>`_ paper, with PyG's exact
    interface.

    A subclass of :class:`torch_geometric.nn.GATv2Conv` (constructor,
    parameters, ``state_dict`` and ``repr`` are PyG's own) whose attention
    runs as one fused op (:func:`pyg_dfgnn.ops.gatv2_attention`) on a cached
    CSR view of the graph, self-loops included.  Falls back to PyG's own
    message passing where the fused path cannot reproduce it (explain mode,
    hooks, ``decomposed_layers > 1``, ...; see :class:`pyg_dfgnn.nn.GATConv`).

    .. note::
        With :obj:`return_attention_weights`, the returned weights are the
        post-dropout coefficients in PyG's edge order, but detached from the
        autograd graph.

    See :class:`torch_geometric.nn.GATv2Conv` for the arguments.
    """

    _pyg_cls = _PyGGATv2Conv

    def forward(  # noqa: F811
        self,
        x: Union[Tensor, PairTensor],
        edge_index: Adj,
        edge_attr: OptTensor = None,
        return_attention_weights: Optional[bool] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]], Tuple[Tensor, SparseTensor]]:
        r"""Runs the forward pass of the module (arguments as in PyG)."""
        reason = self._fused_fallback_reason(x)
        if reason is None and self.lin_edge is None and \
                implied_edge_attr(edge_index, edge_attr) is not None:
            reason = "edge features without 'edge_dim'"  # PyG asserts here
        if reason is not None:
            self._fused_fallback(reason, x)
            return super().forward(x, edge_index, edge_attr, return_attention_weights)

        H, C = self.heads, self.out_channels
        res: Optional[Tensor] = None
        x_l: OptTensor = None
        x_r: OptTensor = None

        # Node transformations, verbatim from PyG (in the kernels' padded head
        # width where C is not a multiple of the CUDA vector: nn/_padded.py)
        width = C
        if isinstance(x, Tensor):
            width = kernel_width(C, x, H)
            if width != C and not (paddable(self.lin_l, H, C) and paddable(self.lin_r, H, C)):
                width = C
        if isinstance(x, Tensor):
            assert x.dim() == 2
            if self.res is not None:
                res = self.res(x)
            x_l = padded_linear(self.lin_l, x, H, C, width)
            if self.share_weights:
                x_r = x_l
            else:
                x_r = padded_linear(self.lin_r, x, H, C, width)
        else:
            x_l, x_r = x[0], x[1]
            assert x[0].dim() == 2
            if x_r is not None and self.res is not None:
                res = self.res(x_r)
            x_l = self.lin_l(x_l).view(-1, H, C)
            if x_r is not None:
                x_r = self.lin_r(x_r).view(-1, H, C)
        assert x_l is not None
        assert x_r is not None

        # The annotations below mirror PyG's: its Inspector caches class sources by
        # class *name*, so the templates of PyG's own propagate/edge_updater (used
        # on fallback) are generated from this class's source, not PyG's.
        # propagate_type: (x: PairTensor, alpha: Tensor)
        # edge_updater_type: (x: PairTensor, edge_attr: OptTensor)
        num_nodes: Optional[int] = None
        if self.add_self_loops:
            check_sparse_loops(edge_index, self.edge_dim)
            num_nodes = min(x_l.size(0), x_r.size(0))
        adj = resolve_adjacency(
            edge_index, None, x_l.size(0), x_r.size(0), loops=num_nodes,
            fill_value=self.fill_value, edge_attr=edge_attr,
            use_edge_attr=self.lin_edge is not None,
            need_adj=bool(return_attention_weights))

        x_edge: Optional[Tensor] = None
        if adj.edge_attr is not None:
            x_edge = self._fused_edge_features(adj.edge_attr)
        att = self.att
        if width != C:
            att = torch.nn.functional.pad(att, (0, width - C))
            if x_edge is not None:
                x_edge = torch.nn.functional.pad(x_edge, (0, width - C))

        x_l, x_r, att, x_edge = common_dtype(x_l, x_r, att, x_edge)
        out, alpha = gatv2_attention(adj.graph, x_l, x_r, att, x_edge,
                                     self.negative_slope, self._fused_dropout,
                                     bool(return_attention_weights))
        out = self._fused_merge_heads(out, res)
        if return_attention_weights:
            return attention_weights(out, adj.adj, alpha)
        return out
