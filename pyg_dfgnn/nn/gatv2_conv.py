"""Drop-in :class:`torch_geometric.nn.GATv2Conv` running the fused GATv2 kernel."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn.conv.gatv2_conv import GATv2Conv as _PyGGATv2Conv
from torch_geometric.typing import Adj, OptTensor, PairTensor, SparseTensor

from ..ops import GATV2, _check_float, _op_seed, gatv2_attention
from ..ops.fused import gatv2_layer_on
from ..schedule import plan_for
from ._glue import _use
from ._padded import gpu_bound, kernel_width, paddable, padded_linear
from ._fused import (FusedAttentionMixin, attention_weights, check_sparse_loops,
                     common_dtype, implied_edge_attr, resolve_adjacency)

#: whether eager CUDA calls take the one-op layer path (:meth:`GATv2Conv._layer_op`);
#: the tests switch it off to compare with the path of several ops
LAYER_OP = [True]


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

    def _layer_op(self, x: Tensor, edge_index: Adj) -> Optional[Tensor]:
        """The call's output from one op and one autograd node
        (:func:`pyg_dfgnn.ops.fused.gatv2_layer_on`: the projections, the
        attention and the bias in C++, forward and backward), or ``None``
        where that path does not apply.

        It applies to the common eager CUDA call on one node set: ``x [N,
        in]`` in fp32 / fp16 / bf16 with every parameter in its dtype and on
        its device, no autocast, concatenated heads, no residual, plain
        linear maps (no hooks), and an ``edge_index`` tensor (edge features
        and attention weights take the usual path).  It computes what the
        path of several ops computes (the same kernels and GEMMs in the width
        :func:`kernel_width` gives, the bias gradients summed alike) with a
        few host calls instead of about twenty-five (docs/KERNELS.md, session
        30).  Its backward writes x_l's gradient over the x_l it saved where
        the graph is freed, and at heads under 128 bytes it keeps its output
        instead of the attention output and takes the backward's Delta from the
        output less the bias (memory: docs/KERNELS.md, session 33)."""
        if not self._layer_op_applies(LAYER_OP, x, edge_index):
            return None
        H, C = self.heads, self.out_channels
        if not self.concat or self.res is not None:
            return None
        member = self._member
        lin_l = member("lin_l")
        lins = self._layer_op_maps((lin_l,) if self.share_weights else (lin_l, member("lin_r")),
                                   H * C, x)
        att, bias = member("att"), member("bias")
        if (lins is None or att.dtype != x.dtype or att.device != x.device
                or att.shape[-2:] != (H, C) or att.dim() not in (2, 3)
                or (bias is not None and (bias.dtype != x.dtype or bias.device != x.device
                                          or bias.shape != (H * C,)))):
            return None
        g = self._layer_op_graph(x, edge_index, self.add_self_loops)
        if g is None:
            return None
        width = kernel_width(C, x, H)
        slope = _check_float("negative_slope", self.negative_slope)
        p = self._fused_dropout
        n = x.size(0)
        return gatv2_layer_on(g, plan_for(g, GATV2, width, H, x.dtype), x, lins[0],
                              lins[1] if len(lins) > 1 else None, att, bias, H, C, width, slope,
                              p, _op_seed(p), _use(x, n, H * width), _use(x, n, H * C),
                              not gpu_bound(n, H, C))

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
        if edge_attr is None and not return_attention_weights and isinstance(x, Tensor):
            out = self._layer_op(x, edge_index)
            if out is not None:
                return out

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
