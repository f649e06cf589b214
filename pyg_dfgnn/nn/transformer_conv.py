"""Drop-in :class:`torch_geometric.nn.TransformerConv` running the fused
dot-product attention kernel."""
from __future__ import annotations

import math
import os
from typing import Any, Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn.conv.transformer_conv import TransformerConv as _PyGTransformerConv
from torch_geometric.typing import Adj, OptTensor, PairTensor, SparseTensor

from .. import graph as graph_module
from ..ops import DOT, _op_seed, dot_attention
from ..ops.fused import linears, transformer_layer_on
from ..schedule import plan_for
from ._fused import (FusedAttentionMixin, common_dtype, generic_propagate,
                     implied_edge_attr, resolve_adjacency)
from ._glue import _use, apply_linear, fused_projections
from ._padded import gpu_bound, kernel_width, padded_linear, unpad

#: whether eager CUDA calls take the one-op layer path
#: (:meth:`TransformerConv._layer_op`); the tests switch it off to compare with
#: the path of several ops
LAYER_OP = [True]


#: devices whose eager GPU-bound calls (:func:`._padded.gpu_bound`) project q, k
#: and v with one GEMM (:func:`._glue.fused_projections`): CUDA, where the
#: dot-attention kernels read the GEMM's column blocks row-strided (k_j and v_j
#: of a gathered row then lie side by side: the attention kernels ran 2-9 %
#: faster on an H100, docs/KERNELS.md, session 14); on the CPU the kernels take
#: contiguous rows, so the blocks would be copied.  Host-bound calls use it too
#: where they project into a padded width (8 x 10 bf16, 8 x 19: one GEMM writes
#: the padded q / k / v and the op copies nothing, session 17) or record
#: autograd (one node with the skip projection instead of four linear maps'
#: nodes and the additions of their d_x: forward+backward 0.93-0.96x on
#: PATTERN batches, H100, session 18); without autograd they keep the four
#: projections (the one GEMM measured 1.07-1.13x there).
_FUSED_PROJECTION_DEVICES = ("cuda",)

#: the aggregate-then-project forward (:func:`_aggregate_then_project`) for
#: calls that record no gradient: ``"auto"`` takes it on CUDA calls whose input
#: rows are no wider than one head (``in_channels <= out_channels``, rows a
#: 16-byte multiple) where the gathered bytes it saves pay for its extra
#: launches and GEMM (:func:`_factorize_pays`); ``"on"`` wherever it can
#: compute the call (any size, the CPU too: the tests); ``"off"`` never.  The
#: environment variable ``PYG_DFGNN_FACTORIZE`` sets it at import (A/B runs of
#: the bench).
FACTORIZE = [os.environ.get("PYG_DFGNN_FACTORIZE", "auto")]
if FACTORIZE[0] not in ("auto", "on", "off"):
    raise ValueError(f"PYG_DFGNN_FACTORIZE must be 'auto', 'on' or 'off', got {FACTORIZE[0]!r}")


#: the dtypes it takes (the tests add float64)
_FACTORIZE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: the gathered bytes per call the aggregate-then-project forward must save
#: for ``"auto"`` to take it (:func:`_factorize_pays`)
FACTORIZE_MIN_SAVED_BYTES = 450e6


def _factorize_pays(edges: int, heads: int, chans: int, fin: int, elem: int) -> bool:
    r"""Whether ``"auto"`` takes the aggregate-then-project forward for a call
    of ``edges`` edges, ``heads`` x ``chans``, ``fin`` input features and
    elements of ``elem`` bytes.  Per edge and head the one-op forward gathers
    a key and a value row (``2 chans`` elements), the factorized one the
    input row (``fin``), so it saves :math:`E H (2C - D)` elements against a
    few more launches (the folded query GEMM, the value GEMM over the heads)
    that cost about the same whatever the size.  Synchronised eval calls on
    an H200 (docs/KERNELS.md, session 46) lost up to 397 MB saved and gained
    from 492 MB: PATTERN batches of 128 graphs (764k edges) at 4 x 64 fp32
    (782 MB) 0.92x the one-op time and at 2 x 128 0.72x (fp32, 1.17 GB) /
    0.79x (bf16, 587 MB), but 4 x 64 bf16 (391 MB) 1.10x; 20k nodes / 320k
    edges at 4 x 64 bf16 (164 MB) 1.16x, 2 x 128 fp32 (492 MB) 0.88x; 1 x 64
    bf16 on the 100k graphs (180-205 MB) 1.06-1.08x.  In between, 1 x 64 fp32
    on the 100k graphs (358-410 MB) gained 3-7 %, which this threshold gives
    up."""
    return edges * heads * (2 * chans - fin) * elem >= FACTORIZE_MIN_SAVED_BYTES


def _empty_rows(g) -> Optional[Tensor]:
    """The destination rows of ``g`` without edges (a long index, ``None`` when
    there are none), found once per graph (one host synchronisation) and kept
    in its plan cache."""
    key = "transformer_empty_rows"
    if key not in g.plans:
        idx = (g.rowptr[1:] == g.rowptr[:-1]).nonzero().view(-1)
        g.plans[key] = idx if idx.numel() else None
    return g.plans[key]


def _folded_weights(lins, heads: int, chans: int, dtype: torch.dtype):
    r"""``(M, c, b)`` of :func:`_aggregate_then_project` from q / k / v's and
    the skip map's ``(weight, bias)``: ``M [H in, in]`` stacks the heads'
    :math:`(W_k^h)^\top W_q^h`, ``c [H in]`` their :math:`(W_k^h)^\top b_q^h`
    (``None`` without a query bias), both formed in fp32 (float64 for
    float64) and rounded once to ``dtype``; ``b`` is the output's bias, the skip's plus the value's
    (``None`` where neither has one)."""
    (wq, bq), (wk, _bk), (_wv, bv), (_ws, bs) = lins
    H, C, D = heads, chans, wq.size(1)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    wk_t = wk.view(H, C, D).transpose(1, 2).to(acc)                      # [H, D, C]
    m = torch.bmm(wk_t, wq.view(H, C, D).to(acc)).to(dtype).view(H * D, D)
    c = None if bq is None else torch.bmm(wk_t, bq.view(H, C, 1).to(acc)).to(dtype).view(H * D)
    bias = bs if bv is None else (bv if bs is None else bs + bv)
    return m, c, bias


def _aggregate_then_project(g, x: Tensor, lins, heads: int, chans: int, scale: float,
                            folded) -> Tensor:
    r"""The Transformer layer's output without the key and value projections
    in the attention: with :math:`q_i^h = W_q^h x_i + b_q^h`,

    .. math::
        \langle q_i^h, W_k^h x_j + b_k^h\rangle = \langle \tilde q_i^h, x_j\rangle
        + \langle q_i^h, b_k^h\rangle, \quad
        \tilde q_i^h = (W_k^h)^\top W_q^h x_i + (W_k^h)^\top b_q^h,

    and the second term is the same for every edge of row ``i``, which the
    softmax does not see.  Since the weights :math:`\alpha_{ij}^h` of a row
    sum to 1 (0 without edges; no dropout here),

    .. math::
        \sum_j \alpha_{ij}^h (W_v^h x_j + b_v^h)
        = W_v^h z_i^h + [\deg i > 0]\, b_v^h, \quad
        z_i^h = \sum_j \alpha_{ij}^h x_j.

    So the attention runs on :math:`\tilde q` ``[N, H, in]`` with the keys and
    the values both ``x`` itself, broadcast over the heads (head stride 0: one
    gathered row of ``in`` features per edge serves every head, instead of a key
    and a value row of ``H x C`` each), and one batched GEMM projects ``z``
    into the output, adding to the skip projection's GEMM output in place.  The
    scores and outputs are PyG's up to rounding (the products
    :math:`(W_k^h)^\top W_q^h` are formed in fp32 and rounded once to ``x``'s
    dtype).  ``lins``: ``(weight, bias)`` of q / k / v and of the skip map
    (``(None, None)`` without root weight), as :meth:`TransformerConv._layer_op`
    reads them; ``folded``: :func:`_folded_weights` of them."""
    _q, _k, (wv, bv), (ws, _bs) = lins
    N, D = x.shape
    H, C = heads, chans
    m, c, bias = folded
    # (the skip GEMM before the attention: two GEMMs of GPU work queued while
    # the host prepares the attention's launch, which took longer than one
    # GEMM in half precision; both from one split of x where fp32 GEMMs run
    # on the tensor cores: ops.fused.linears)
    if ws is not None:
        qt, out = linears(x, [(m, c), (ws, bias)])
    else:
        (qt,) = linears(x, [(m, c)])
        out = (bias.expand(N, H * C).contiguous() if bias is not None
               else x.new_zeros(N, H * C))
    if bv is not None and N:
        empty = _empty_rows(g)
        if empty is not None:   # (rows without edges: no value bias)
            out.index_add_(0, empty, bv.expand(empty.numel(), H * C), alpha=-1)
    xs = x.unsqueeze(1).expand(N, H, D)
    # (the keys are the values: with a key scale of ones the kernels that load
    # each gathered row once per edge and head run (AGNN's), not the dot
    # kernels' key and value loads: the attention kernel 0.95x the time in
    # fp32, the same in bf16, 4 x 64 on the 100k graphs, H200, docs/KERNELS.md,
    # session 44)
    z, _ = dot_attention(g, qt.view(N, H, D), xs, xs, scale=scale,
                         key_scale=_ones(g, H, x))                          # [N, H, D]
    # out[:, h] += z[:, h] W_v^h^T, one strided batched GEMM over the heads
    out.view(N, H, C).transpose(0, 1).baddbmm_(z.transpose(0, 1),
                                               wv.view(H, C, D).transpose(1, 2))
    return out


def _ones(g, heads: int, x: Tensor) -> Tensor:
    """``[N_src, heads]`` ones in ``x``'s dtype, kept in the graph's plan cache."""
    key = ("transformer_ones", heads, x.dtype)
    t = g.plans.get(key)
    if t is None:
        t = g.plans[key] = torch.ones(g.num_src, heads, dtype=x.dtype, device=x.device)
    return t


class TransformerConv(FusedAttentionMixin, _PyGTransformerConv):
    r"""The graph transformer operator from the `"Masked Label Prediction:
    Unified Message Passing Model for Semi-Supervised Classification"
    <https://arxiv.org/abs/2009.03509>`_ paper, with PyG's exact interface.

    A subclass of :class:`torch_geometric.nn.TransformerConv`: PyG's own
    ``forward`` (query/key/value projections, ``concat``, ``root_weight``,
    the ``beta`` gate) runs unchanged; only :meth:`propagate` is replaced by
    one fused op (:func:`pyg_dfgnn.ops.dot_attention`: scaled dot product,
    edge softmax, dropout, aggregation, with the projected edge features
    added to keys and values as in PyG) on a cached CSR view of the graph.
    Falls back to PyG's own message passing where the fused path cannot
    reproduce it (explain mode, hooks, ``decomposed_layers > 1``, ...; see
    :class:`pyg_dfgnn.nn.GATConv`).

    .. note::
        With :obj:`return_attention_weights`, the returned weights are PyG's
        pre-dropout coefficients in PyG's edge order, detached from the
        autograd graph.

    See :class:`torch_geometric.nn.TransformerConv` for the arguments.
    """

    _pyg_cls = _PyGTransformerConv

    #: set by :meth:`forward` for the duration of one call: whether PyG's
    #: ``forward`` will return the attention weights (``self._alpha``)
    _fused_need_alpha: bool = False

    def forward(  # noqa: F811
        self,
        x: Union[Tensor, PairTensor],
        edge_index: Adj,
        edge_attr: OptTensor = None,
        return_attention_weights: Optional[bool] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]], Tuple[Tensor, SparseTensor]]:
        r"""Runs the forward pass of the module (PyG's, with a fused
        :meth:`propagate`)."""
        if return_attention_weights is None:
            out = self._fused_forward(x, edge_index, edge_attr)
            if out is not None:
                return out
        self._fused_need_alpha = isinstance(return_attention_weights, bool)
        try:
            return super().forward(x, edge_index, edge_attr, return_attention_weights)
        finally:
            self._fused_need_alpha = False

    def _layer_op(self, x: Tensor, edge_index: Adj) -> Optional[Tensor]:
        """The call's output from one op and one autograd node
        (:func:`pyg_dfgnn.ops.fused.transformer_layer_on`: the projections,
        the attention and the skip connection in C++, forward and backward),
        or ``None`` where that path does not apply.

        It applies to the common eager CUDA call on one node set: ``x [N,
        in]`` in fp32 / bf16 / fp16 with every parameter in its dtype and on
        its device, no autocast, concatenated heads, no ``beta`` (the root
        weight or none), no edge features (``edge_dim`` unset), plain linear
        maps (no hooks) with biases on all of q / k / v or none, and an
        ``edge_index`` tensor.  It computes what the path of several ops computes on such a call (the
        same kernels and GEMMs; q / k / v in the width :func:`kernel_width`
        gives, the skip as the GEMM's 4th block without autograd) with a few
        host calls instead of about thirty (host time: docs/KERNELS.md,
        session 30).  Its backward writes the key and value gradients over
        the projections it saved where the graph is freed, and at heads under
        128 bytes it keeps its output instead of the attention output and
        takes the backward's Delta from the output less the skip (memory:
        docs/KERNELS.md, session 33)."""
        if not self._layer_op_applies(LAYER_OP, x, edge_index):
            return None
        lins = self._projection_maps(x)
        if lins is None or len({wb[1] is None for wb in lins[:3]}) > 1:
            return None   # (q / k / v: biases on all or none)
        H, C = self.heads, self.out_channels
        g = self._layer_op_graph(x, edge_index, False)
        if g is None:
            return None
        width = kernel_width(C, x, H, DOT, pad_small=True)
        p = self._fused_dropout
        # (calls below the GPU-bound size keep the attention output for the
        # backward's Delta: two host calls fewer there, ops.fused.transformer_layer_on)
        return transformer_layer_on(g, plan_for(g, DOT, width, H, x.dtype), x, lins, H, C, width,
                                    1.0 / math.sqrt(C), p, _op_seed(p),
                                    _use(x, x.size(0), 3 * H * width),
                                    not gpu_bound(x.size(0), H, C))

    def _projection_maps(self, x: Tensor):
        """``[(weight, bias)]`` of q / k / v and the skip map (``(None, None)``
        without root weight) that the one-op paths run themselves
        (:meth:`_layer_op_maps`), or ``None``: not with averaged heads,
        ``beta`` or edge features."""
        member = self._member
        if not (self.concat and member("lin_beta") is None and member("lin_edge") is None):
            return None
        maps = (member("lin_query"), member("lin_key"), member("lin_value"))
        lins = self._layer_op_maps(maps + ((member("lin_skip"),) if self.root_weight else ()),
                                   self.heads * self.out_channels, x)
        if lins is not None and len(lins) == 3:   # (no root weight)
            lins.append((None, None))
        return lins

    def _factorized(self, x: Tensor, edge_index: Adj) -> Optional[Tensor]:
        """The call's output by :func:`_aggregate_then_project`, or ``None``
        where :data:`FACTORIZE` does not take it.

        It applies to a call that records no gradient (inference, validation)
        on one node set: ``x [N, in]`` in fp32 / bf16 / fp16 with every
        parameter in its dtype and on its device, no attention dropout (eval
        mode or ``dropout=0``), no autocast, concatenated heads, no ``beta``,
        no edge features, plain linear maps (no hooks) and an ``edge_index``
        tensor; in ``"auto"`` mode only on CUDA calls with ``in_channels <=
        out_channels`` and 16-byte input rows (e.g. 4 x 64 on 64 input
        features: 256 bytes of ``x`` per edge instead of 2 KiB of keys and
        values in fp32) large enough that this pays (:func:`_factorize_pays`)."""
        mode = FACTORIZE[0]
        # (not with autograd: through this composition a forward+backward took
        # 1.8-1.9x the one-op path's time and 1.47x its memory, 4 x 64 fp32 on
        # the 100k graphs, H200: docs/KERNELS.md, session 44)
        if mode == "off" or torch.is_grad_enabled() or self._fused_dropout > 0.0:
            return None
        H, C = self.heads, self.out_channels
        if mode == "auto" and not (x.dim() == 2 and x.size(1) <= C and x.is_cuda
                                   and (x.size(1) * x.element_size()) % 16 == 0
                                   and isinstance(edge_index, Tensor) and edge_index.dim() == 2
                                   and _factorize_pays(edge_index.size(1), H, C, x.size(1),
                                                       x.element_size())):
            return None   # (first: the host-bound calls it leaves pay least)
        if not self._layer_op_applies([True], x, edge_index, cpu=mode == "on",
                                      dtypes=_FACTORIZE_DTYPES):
            return None
        lins = self._projection_maps(x)
        if lins is None:
            return None
        g = self._layer_op_graph(x, edge_index, False)
        if g is None:
            return None
        return _aggregate_then_project(g, x.contiguous(), lins, H, C, 1.0 / math.sqrt(C),
                                       self._folded(lins, H, C, x))

    def _folded(self, lins, heads: int, chans: int, x: Tensor):
        """:func:`_folded_weights` of this call, kept while the parameters are
        unchanged: the same tensors, at the same version counters and
        storage, for ``x``'s dtype and device (eval calls reuse them; forming
        them on every call made the bf16 forward host-bound: docs/KERNELS.md,
        session 44).  As the graph cache on CUDA (see :mod:`pyg_dfgnn.graph`),
        a write through ``.data`` into a weight in place goes unnoticed (a
        new tensor assigned to ``.data`` does not); :func:`pyg_dfgnn.graph.
        strict_cache` (or ``PYG_DFGNN_STRICT_CACHE=1``) turns the cache off,
        and so do parameters without version counters (inference tensors)."""
        ts = [t for wb in lins for t in wb if t is not None]
        if graph_module._STRICT[0] or any(t.is_inference() for t in ts):
            self.__dict__.pop("_fused_folded", None)
            return _folded_weights(lins, heads, chans, x.dtype)
        key = [(t, t._version, t.data_ptr()) for t in ts]
        cache = self.__dict__.get("_fused_folded")
        if (cache is None or cache[1] != (x.dtype, x.device) or len(cache[0]) != len(key)
                or not all(a[0] is b[0] and a[1:] == b[1:] for a, b in zip(cache[0], key))):
            cache = (key, (x.dtype, x.device), _folded_weights(lins, heads, chans, x.dtype))
            self.__dict__["_fused_folded"] = cache
        return cache[2]

    def _fused_forward(self, x: Union[Tensor, PairTensor], edge_index: Adj,
                       edge_attr: OptTensor) -> Optional[Tensor]:
        """PyG's ``forward`` with the fused attention in place of
        :meth:`propagate`, for the common call (node features as tensors, no
        attention weights): one pass of checks and no ``self._alpha`` /
        ``_fused_need_alpha`` bookkeeping (host time).  The projections are
        written in the kernels' padded head width where that pays
        (:mod:`pyg_dfgnn.nn._padded`: head widths that are not a multiple of the
        CUDA vector, 8 x 10, 8 x 19, ..., on GPU-bound calls).  ``None`` where it
        does not apply (PyG's ``forward`` + the fused :meth:`propagate` run
        instead, falling back to PyG's message passing where needed)."""
        xs = (x, x) if isinstance(x, Tensor) else x
        if not (isinstance(xs[0], Tensor) and isinstance(xs[1], Tensor)):
            return None
        H, C = self.heads, self.out_channels
        if self._fused_fallback_reason(xs[0], xs[1]) is not None:
            return None
        if isinstance(x, Tensor) and edge_attr is None:
            out = self._factorized(x, edge_index)
            if out is None:
                out = self._layer_op(x, edge_index)
            if out is not None:
                return out
        width = kernel_width(C, xs[0], H, DOT, pad_small=True)
        lin_edge = self.lin_edge
        if lin_edge is None and implied_edge_attr(edge_index, edge_attr) is not None:
            return None
        qkv = skip = None
        lin_beta = self.lin_beta
        if (xs[0] is xs[1] and xs[0].device.type in _FUSED_PROJECTION_DEVICES
                and (width != C or torch.is_grad_enabled() or gpu_bound(xs[0].size(0), H, C))
                and not torch.compiler.is_compiling()):
            # one GEMM and one autograd node for the three projections; q / k / v
            # are its column blocks, which the CUDA kernels read row-strided
            lins = (self.lin_query, self.lin_key, self.lin_value)
            if self.concat and self.root_weight and lin_beta is None:
                if not torch.is_grad_enabled():
                    # without autograd (inference, validation) the skip projection
                    # is the GEMM's 4th block
                    qkv = fused_projections(lins + (self.lin_skip,), xs[0], H, C, width)
                    if qkv is not None:
                        skip = unpad(qkv[3], C)
                else:
                    # with it, a GEMM of its own in the same autograd node, whose
                    # output dies after the add (the q / k / v blocks live on for
                    # the backward, and a 4th block would live with them)
                    qkv = fused_projections(lins, xs[0], H, C, width, extra=self.lin_skip)
                    if qkv is not None and len(qkv) == 4:
                        skip = qkv[3].view(-1, H, C)
            if qkv is None:
                qkv = fused_projections(lins, xs[0], H, C, width)
        if qkv is not None:
            q, k, v = qkv[:3]
        else:
            q = padded_linear(self.lin_query, xs[1], H, C, width)
            k = padded_linear(self.lin_key, xs[0], H, C, width)
            v = padded_linear(self.lin_value, xs[0], H, C, width)
            if q is None or k is None or v is None:
                return None
        adj = resolve_adjacency(edge_index, None, k.size(0), q.size(0),
                                edge_attr=edge_attr, use_edge_attr=lin_edge is not None)
        edge: Optional[Tensor] = None
        if lin_edge is not None:
            assert adj.edge_attr is not None
            edge = padded_linear(lin_edge, adj.edge_attr, H, C, width)
            if edge is None:
                return None
        q, k, v, edge = common_dtype(q, k, v, edge)
        if skip is None and self.concat and self.root_weight and lin_beta is None:
            skip = apply_linear(self.lin_skip, xs[1]).view(-1, H, C)
        # the skip connection as the op's residual where the kernels run at the
        # head width itself (added in the kernel's epilogue where no gradient is
        # recorded); with padded heads the kernel's narrow, per-element store
        # with the residual made its forward 19 % slower (8 x 10 fp32 on a
        # 1.6M-edge graph, H200, session 25), so slice + add run in one pass
        fold = skip is not None and q.size(-1) == C
        out, _ = dot_attention(adj.graph, q, k, v, edge, 1.0 / math.sqrt(C),
                               self._fused_dropout, False, residual=skip if fold else None)
        if fold:
            return out.view(-1, H * C)
        out = unpad(out, C)   # [N, H, C] view of the padded result
        if skip is not None:
            return (out + skip).view(-1, H * C)
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if self.root_weight:
            x_r = apply_linear(self.lin_skip, xs[1])
            if lin_beta is not None:
                beta = lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)).sigmoid()
                out = beta * x_r + (1 - beta) * out
            else:
                out = out + x_r
        return out

    def propagate(self, edge_index: Adj, size: Optional[Tuple[int, int]] = None,
                  **kwargs: Any) -> Tensor:
        r"""Fused replacement of :meth:`MessagePassing.propagate` for the call
        ``propagate(edge_index, query=..., key=..., value=..., edge_attr=...)``
        made by PyG's ``forward``; sets ``self._alpha`` like PyG's ``message``
        when the attention weights are requested."""
        query, key, value = kwargs.get("query"), kwargs.get("key"), kwargs.get("value")
        edge_attr = kwargs.get("edge_attr")
        reason = self._fused_fallback_reason(query, key, value)
        if reason is None and (not isinstance(query, Tensor) or set(kwargs) - {
                "query", "key", "value", "edge_attr"}):
            reason = "an unexpected propagate() call"
        if reason is None and self.lin_edge is None and \
                implied_edge_attr(edge_index, edge_attr) is not None:
            reason = "edge features without 'edge_dim'"  # PyG adds them to values raw
        if reason is not None:
            self._fused_fallback(reason, query)
            return generic_propagate(self, edge_index, size=size, **kwargs)

        H, C = self.heads, self.out_channels
        adj = resolve_adjacency(edge_index, size, key.size(0), query.size(0),
                                edge_attr=edge_attr, use_edge_attr=self.lin_edge is not None)
        edge: Optional[Tensor] = None
        if self.lin_edge is not None:
            assert adj.edge_attr is not None
            edge = self.lin_edge(adj.edge_attr).view(-1, H, C)

        q, k, v, edge = common_dtype(query, key, value, edge)
        scale = 1.0 / math.sqrt(self.out_channels)
        p = self._fused_dropout
        need = self._fused_need_alpha
        out, alpha = dot_attention(adj.graph, q, k, v, edge, scale, p, need and p == 0.0)
        if need and p > 0.0:
            # PyG returns the attention *before* dropout; recompute it undropped.
            with torch.no_grad():
                _, alpha = dot_attention(adj.graph, q, k, v, edge, scale, 0.0, True)
        self._alpha = alpha
        return out
