"""Drop-in :class:`torch_geometric.nn.GATConv` running the fused GAT kernel."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn.conv.gat_conv import GATConv as _PyGGATConv
from torch_geometric.typing import Adj, OptPairTensor, OptTensor, Size, SparseTensor

from ..graph import CSRGraph
from ..ops import GAT, _check_float, _op_seed, gat_attention, gat_node_attention
from ..ops.fused import gat_layer_on
from ..schedule import plan_for
from ._padded import gpu_bound, kernel_width, paddable, padded_linear, unpad
from ._fused import (FusedAttentionMixin, attention_weights, check_sparse_loops,
                     common_dtype, resolve_adjacency)


def _folded_logits(lin, x: Tensor, atts) -> Optional[Tensor]:
    r"""GAT's node logits :math:`a_k = \sum_c (x W^\top)_{hc}\,\mathrm{att}_{k,hc}` for
    every ``att`` in ``atts``, as one small GEMM with the attention vectors
    folded into the projection weight: :math:`x\,(\sum_c \mathrm{att}_{hc}
    W_{hc,:})^\top`, ``[N, len(atts) * H]``.  This reads ``x`` once instead of
    materialising two ``[N, H, C]`` products of the projected features
    (exact in exact arithmetic; autograd carries the gradients of ``W`` and
    ``att``).  ``None`` when the projection is not a plain bias-free linear
    map with an initialised weight (PyG's own formula is used then)."""
    w = getattr(lin, "weight", None)
    if (not isinstance(w, Tensor) or isinstance(w, torch.nn.parameter.UninitializedParameter)
            or getattr(lin, "bias", None) is not None or w.dim() != 2):
        return None
    heads, chans = atts[0].shape[-2:]
    wv = w.view(heads, chans, w.size(1))
    fold = torch.cat([torch.einsum("hc,hci->hi", a.reshape(heads, chans), wv) for a in atts])
    if x.dtype != fold.dtype and not torch.is_autocast_enabled(x.device.type):
        return None
    return torch.nn.functional.linear(x, fold)


#: whether eager CUDA calls take the one-op layer path (:meth:`GATConv._layer_op`);
#: the tests switch it off to compare with the path of several ops
LAYER_OP = [True]

#: devices whose eager calls take :func:`pyg_dfgnn.ops.gat_node_attention` (the
#: node logits inside the op; CUDA: a logits kernel and one autograd node).  On
#: the CPU the logits are one folded GEMM (:func:`_folded_logits`), cheaper
#: than the op's node-wise pass there.
_NODE_LOGITS_DEVICES = ("cuda",)


def _epilogue_bias(conv, x_src: Tensor, res: Optional[Tensor]) -> Optional[Tensor]:
    r"""The layer's bias as the fused op's ``bias [H, C]`` (added in the kernel's
    epilogue instead of a pass over the output), or ``None`` where PyG's own
    epilogue must run: no bias, a residual (added before the bias), averaged
    heads (``concat=False`` with ``H > 1``), more than 32 heads (the backward
    would take :math:`\Delta` from the output minus the bias instead of GAT's
    exact single-gather sum), or a bias of another dtype than the features
    (autocast: PyG's ``out + bias`` promotes the result to the bias' dtype).
    Value rows the layer projected into the kernels' padded width
    (:mod:`._padded`) are fine: the op writes the output in the bias' width
    ``C``, so nothing slices the padding out."""
    if not _bias_in_epilogue(conv, x_src, res):
        return None
    return conv.bias.view(conv.heads, conv.out_channels)


def _bias_in_epilogue(conv, x_src: Tensor, res: Optional[Tensor]) -> bool:
    """Whether the fused op adds the layer's bias (:func:`_epilogue_bias`)."""
    b, H, C = conv._member("bias"), conv.heads, conv.out_channels
    return not (b is None or res is not None or not (conv.concat or H == 1) or H > 32
                or b.dtype != x_src.dtype or b.numel() != H * C)


class GATConv(FusedAttentionMixin, _PyGGATConv):
    r"""The graph attentional operator from the `"Graph Attention Networks"
    <https://arxiv.org/abs/1710.10903>`_ paper, with PyG's exact interface.

    A subclass of :class:`torch_geometric.nn.GATConv`: constructor, defaults,
    parameters, :meth:`reset_parameters`, ``state_dict`` keys and ``repr`` are
    PyG's own, so

    .. code-block:: python

        from pyg_dfgnn.nn import GATConv  # instead of torch_geometric.nn

    is the only change a model needs.  The attention (score, edge softmax,
    dropout, aggregation) runs as one fused op on a cached CSR view of the
    graph (:func:`pyg_dfgnn.ops.gat_attention`); self-loops are added to that
    cached view instead of to ``edge_index`` on every call, and the bias is
    added in the kernel's epilogue where PyG's result allows it
    (:func:`_epilogue_bias`).  On eager CUDA calls on one node set the node
    logits :math:`a^{src}, a^{dst}` are computed by the op as well
    (:func:`pyg_dfgnn.ops.gat_node_attention`: one pass over the projected
    features, no ``[N, H, C]`` products, one autograd node).

    Falls back to PyG's own message passing (same results, unfused) in
    explain mode, with message-passing hooks, ``decomposed_layers > 1``,
    ``flow="target_to_source"`` or a non-``"add"`` aggregation, when a
    subclass overrides ``message``/``edge_update``/..., and under
    :func:`torch.jit.trace`.

    .. note::
        With :obj:`return_attention_weights`, the returned weights are the
        post-dropout coefficients in PyG's edge order, but detached from the
        autograd graph.

    See :class:`torch_geometric.nn.GATConv` for the arguments.
    """

    _pyg_cls = _PyGGATConv

    def _layer_op(self, x: Tensor, edge_index: Adj) -> Optional[Tensor]:
        """The call's output from one op and one autograd node
        (:func:`pyg_dfgnn.ops.fused.gat_layer_on`: projection, node logits,
        attention and bias in C++, forward and backward), or ``None`` where
        that path does not apply and :meth:`forward` runs the usual one.

        It applies to the common eager CUDA call on one node set: ``x [N,
        in]`` in fp32 / bf16 / fp16 with every parameter in its dtype and on
        its device, no autocast, a plain bias-free projection ``lin`` (no
        hooks), no residual, concatenated heads (or one), a bias the kernel's
        epilogue adds (:func:`_epilogue_bias`) or none, and an ``edge_index``
        tensor (edge features, ``size`` and attention weights take the usual
        path).  Heads the kernels pad on GPU-bound calls are projected into
        their padded width by the op.  It computes what that path
        computes (the same kernels, the projection's GEMMs as autograd's
        formulas; the dropout seed drawn alike) with a few host calls instead
        of about twenty (host time per call: docs/KERNELS.md, session 30)."""
        if not self._layer_op_applies(LAYER_OP, x, edge_index):
            return None
        H, C = self.heads, self.out_channels
        if self.res is not None or not (self.concat or H == 1):
            return None
        member = self._member
        maps = self._layer_op_maps((member("lin"),), H * C, x)
        wb = None if maps is None else maps[0]
        att_src, att_dst = member("att_src"), member("att_dst")
        if (wb is None or wb[1] is not None
                or any(t.dtype != x.dtype or t.device != x.device for t in (att_src, att_dst))
                or att_src.dim() not in (2, 3) or att_src.shape[-2:] != (H, C)
                or att_dst.shape != att_src.shape):
            return None
        # the value rows' head width: the kernels' padded width on GPU-bound
        # calls whose C they do not take as it is (nn/_padded.py), as the path
        # of several ops projects them; the op pads the weight, not the rows
        width = kernel_width(C, x, H, 0)
        g = self._layer_op_graph(x, edge_index, self.add_self_loops)
        if g is None:
            return None
        # (last: the bias the kernel adds, by the rule of the usual path, which
        # this path takes wherever that rule keeps a bias out of the kernel;
        # passed as the parameter itself, [H * C], which the op views [H, C]:
        # no view node in the autograd graph)
        fold = _bias_in_epilogue(self, x, None)
        b = member("bias")
        bias = b if fold else None
        if b is not None and (not fold or b.device != x.device):
            return None
        slope = _check_float("negative_slope", self.negative_slope)
        p = self._fused_dropout
        return gat_layer_on(g, plan_for(g, GAT, width, H, x.dtype), x, wb[0], att_src, att_dst,
                            bias, slope, p, _op_seed(p), width)

    def _node_logits(self, x, x_in_src: Optional[Tensor], x_in_dst: Optional[Tensor],
                     x_src: Tensor, x_dst: Optional[Tensor], lin):
        """PyG's ``alpha_src`` / ``alpha_dst`` (``None`` without target features),
        as one GEMM with the attention vectors folded into the projection where
        that pays (:func:`_folded_logits`)."""
        alpha_src = alpha_dst = None
        H, C = self.heads, self.out_channels
        # the fold pays on GPU-bound calls only (nn/_padded.py: GPU_BOUND_ELEMENTS)
        fold = not x_src.is_cuda or gpu_bound(x_src.size(0), H, C)
        lin_s = lin_d = lin
        if fold and lin is None:
            lin_s, lin_d = self.lin_src, self.lin_dst
        if fold and isinstance(x, Tensor) and lin_s is lin_d:   # one GEMM for both logits
            both = _folded_logits(lin_s, x, (self.att_src, self.att_dst))
            if both is not None:
                alpha_src, alpha_dst = both[:, :H], both[:, H:]
        elif fold:
            alpha_src = _folded_logits(lin_s, x_in_src, (self.att_src,))
            if x_dst is not None and x_in_dst is not None:
                alpha_dst = _folded_logits(lin_d, x_in_dst, (self.att_dst,))
        if alpha_src is None:
            alpha_src = (unpad(x_src, C) * self.att_src).sum(dim=-1)
        if alpha_dst is None and x_dst is not None:
            alpha_dst = (unpad(x_dst, C) * self.att_dst).sum(-1)
        return alpha_src, alpha_dst

    def forward(  # noqa: F811
        self,
        x: Union[Tensor, OptPairTensor],
        edge_index: Adj,
        edge_attr: OptTensor = None,
        size: Size = None,
        return_attention_weights: Optional[bool] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]], Tuple[Tensor, SparseTensor]]:
        r"""Runs the forward pass of the module (arguments as in PyG)."""
        reason = self._fused_fallback_reason(x)
        if reason is not None:
            self._fused_fallback(reason, x)
            return super().forward(x, edge_index, edge_attr, size, return_attention_weights)
        if (edge_attr is None and size is None and not return_attention_weights
                and isinstance(x, Tensor)):
            out = self._layer_op(x, edge_index)
            if out is not None:
                return out

        H, C = self.heads, self.out_channels
        res: Optional[Tensor] = None
        x_in_src: Optional[Tensor] = x if isinstance(x, Tensor) else x[0]
        x_in_dst: Optional[Tensor] = x if isinstance(x, Tensor) else x[1]

        # Node transformations, verbatim from PyG:
        lin = self.lin   # (a submodule: each self.lin is a Module.__getattr__ call)
        if isinstance(x, Tensor):
            assert x.dim() == 2, "Static graphs not supported in 'GATConv'"
            if self.res is not None:
                res = self.res(x)
            if lin is not None:
                # value rows in the kernels' padded head width where that pays
                # (nn/_padded.py); PyG's lin(x).view(-1, H, C) otherwise
                width = kernel_width(C, x, H, 0)
                if width != C and not paddable(lin, H, C):
                    width = C
                x_src = x_dst = padded_linear(lin, x, H, C, width)
            else:
                assert self.lin_src is not None and self.lin_dst is not None
                x_src = self.lin_src(x).view(-1, H, C)
                x_dst = self.lin_dst(x).view(-1, H, C)
        else:
            x_src, x_dst = x
            assert x_src.dim() == 2, "Static graphs not supported in 'GATConv'"
            if x_dst is not None and self.res is not None:
                res = self.res(x_dst)
            if lin is not None:
                x_src = lin(x_src).view(-1, H, C)
                if x_dst is not None:
                    x_dst = lin(x_dst).view(-1, H, C)
            else:
                assert self.lin_src is not None and self.lin_dst is not None
                x_src = self.lin_src(x_src).view(-1, H, C)
                if x_dst is not None:
                    x_dst = self.lin_dst(x_dst).view(-1, H, C)

        # eager CUDA calls on one node set: the op computes the node logits
        # itself (ops.gat_node_attention: no [N, H, C] products, one autograd
        # node); otherwise they are computed here
        node = (x_src is x_dst and x_src.device.type in _NODE_LOGITS_DEVICES
                and x_src.dtype != torch.float64 and not torch.compiler.is_compiling())
        alpha_src = alpha_dst = None
        if not node:
            alpha_src, alpha_dst = self._node_logits(x, x_in_src, x_in_dst, x_src, x_dst, lin)

        # The annotations below mirror PyG's: its Inspector caches class sources by
        # class *name*, so the templates of PyG's own propagate/edge_updater (used
        # on fallback) are generated from this class's source, not PyG's.
        # propagate_type: (x: OptPairTensor, alpha: Tensor)
        # edge_updater_type: (alpha: OptPairTensor, edge_attr: OptTensor)
        num_nodes: Optional[int] = None
        if self.add_self_loops:
            check_sparse_loops(edge_index, self.edge_dim)
            num_nodes = x_src.size(0)
            if x_dst is not None:
                num_nodes = min(num_nodes, x_dst.size(0))
            if size is not None and isinstance(edge_index, Tensor):
                num_nodes = min(size)
        adj = resolve_adjacency(
            edge_index, size, x_src.size(0), None if x_dst is None else x_dst.size(0),
            loops=num_nodes, fill_value=self.fill_value, edge_attr=edge_attr,
            use_edge_attr=self.lin_edge is not None,
            need_adj=bool(return_attention_weights))

        alpha_edge: Optional[Tensor] = None
        if adj.edge_attr is not None and adj.graph.num_edges > 0:
            alpha_edge = (self._fused_edge_features(adj.edge_attr) * self.att_edge).sum(-1)
        n = x_src.size(0)
        if node and not (isinstance(adj.graph, CSRGraph) and adj.graph.num_src == n
                         and adj.graph.num_dst == n):
            node = False   # (a size argument made the graph rectangular)
            alpha_src, alpha_dst = self._node_logits(x, x_in_src, x_in_dst, x_src, x_dst, lin)
        if node:
            x_src, alpha_edge = common_dtype(x_src, alpha_edge)
            bias = _epilogue_bias(self, x_src, res)
            out, alpha = gat_node_attention(
                adj.graph, x_src, self.att_src, self.att_dst, alpha_edge, self.negative_slope,
                self._fused_dropout, bool(return_attention_weights), bias)
        else:
            if alpha_dst is None:  # bipartite without target features: a_dst = 0
                alpha_dst = alpha_src.new_zeros(adj.graph.num_dst, H)
            x_src, alpha_src, alpha_dst, alpha_edge = common_dtype(
                x_src, alpha_src, alpha_dst, alpha_edge)
            bias = _epilogue_bias(self, x_src, res)
            out, alpha = gat_attention(adj.graph, x_src, alpha_src, alpha_dst, alpha_edge,
                                       self.negative_slope, self._fused_dropout,
                                       bool(return_attention_weights), bias)
        out = self._fused_merge_heads(out, res, add_bias_here=bias is None)
        if return_attention_weights:
            return attention_weights(out, adj.adj, alpha)
        return out
