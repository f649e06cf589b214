"""Drop-in :class:`torch_geometric.nn.AGNNConv` running the fused attention kernel."""
from __future__ import annotations

from typing import Optional

from torch import Tensor
from torch_geometric.nn.conv.agnn_conv import AGNNConv as _PyGAGNNConv
from torch_geometric.typing import Adj

from ..ops import DOT, agnn_attention
from ..ops.fused import agnn_layer_on
from ..schedule import plan_for
from ._fused import FusedAttentionMixin, common_dtype, resolve_adjacency

#: whether eager CUDA calls take the one-op layer path (:meth:`AGNNConv._layer_op`);
#: the tests switch it off to compare with the path of several ops
LAYER_OP = [True]


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

    def _layer_op(self, x: Tensor, edge_index: Adj) -> Optional[Tensor]:
        """The call's output from one op and one autograd node
        (:func:`pyg_dfgnn.ops.fused.agnn_layer_on`: the prologue and the
        attention forward and backward in C++), or ``None`` where that path
        does not apply: an eager CUDA call of a contiguous ``x [N, F]`` in
        fp32 / bf16 / fp16 with ``beta`` in its dtype and on its device, no
        autocast, on an ``edge_index`` tensor.  It computes what
        :func:`pyg_dfgnn.ops.agnn_attention` computes (the same kernels; beta's
        gradient alike, bit for bit: the score sum divided by beta in fp32)
        with a few host calls instead of two Python autograd Functions and
        their ops (docs/KERNELS.md, sessions 30 and 31)."""
        beta = self._member("beta")
        if not (self._layer_op_applies(LAYER_OP, x, edge_index) and x.is_contiguous()
                and isinstance(beta, Tensor) and beta.numel() == 1
                and beta.dtype == x.dtype and beta.device == x.device):
            return None
        g = self._layer_op_graph(x, edge_index, self.add_self_loops)
        if g is None:
            return None
        return agnn_layer_on(g, plan_for(g, DOT, x.size(1), 1, x.dtype), x, beta, 1e-12)

    def forward(self, x: Tensor, edge_index: Adj) -> Tensor:
        r"""Runs the forward pass of the module (arguments as in PyG)."""
        reason = self._fused_fallback_reason(x)
        if reason is None and (not isinstance(x, Tensor) or x.dim() != 2):
            reason = "node features that are not a 2-D tensor"
        if reason is not None:
            self._fused_fallback(reason, x)
            return super().forward(x, edge_index)
        out = self._layer_op(x, edge_index)
        if out is not None:
            return out

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
