r"""Pure-PyTorch reference of the fused attention ops on a destination-major CSR.

This is both the CPU execution path and the oracle the CUDA kernels are
tested against.  For every destination row :math:`i` with incoming edges
:math:`j` and every head :math:`h`:

.. math::
    s_{ij} &= \mathrm{score}(i, j) \\
    m_i &= \max_k s_{ik}, \qquad l_i = \sum_k \exp(s_{ik} - m_i) \\
    \alpha_{ij} &= \frac{\exp(s_{ij} - m_i)}{l_i + 10^{-16}}
        \approx \exp\big((s_{ij} - m_i) - \log l_i\big) \\
    o_i &= \sum_j \tilde\alpha_{ij}\, v_j, \qquad
        \tilde\alpha_{ij} = \alpha_{ij}\, \mathrm{keep}_{ij} / (1 - p)

with the score per model kind:

* ``GAT``:   :math:`s = \mathrm{LeakyReLU}(a^{src}_j + a^{dst}_i [+ a^{edge}_{ij}])`
  (``dst_feat [N_dst, H]``, ``src_feat [N_src, H]``, ``edge [E, H]``); its
  ``att [H, C]``, when given, is an output bias: :math:`o_i + b` (the layer's
  bias, folded into the kernels' epilogue), and the output keeps the first
  ``C <= F`` features of every head;
* ``GATV2``: :math:`s = \langle a, \mathrm{LeakyReLU}(x^{src}_j + x^{dst}_i [+ x^{edge}_{ij}])\rangle`
  (``[.., H, F]`` features, ``att [H, F]``; the value is ``src_feat``);
* ``DOT``:   :math:`s = \mathrm{scale}\,\langle q_i, k_j [+ e_{ij}]\rangle`, value
  :math:`v_j [+ e_{ij}]` (Graph Transformer).  Its ``att [N_src, H]``, when
  given, is a key scale :math:`c`: the keys are :math:`c_j k_j` (no edge
  features).  AGNN passes ``q = beta * x_norm``, ``k = v = x`` and
  :math:`c_j = 1 / \max(\lVert x_j \rVert, \epsilon)`, so that each edge reads one row.

The forward saves only ``out`` and the row statistics ``lse [2, N_dst, H]``
(``lse[0]`` = :math:`m_i`, ``-inf`` for a row without edges; ``lse[1]`` =
:math:`\log l_i`, ``0`` for a row without edges; float32, float64 for float64
inputs).  The backward recomputes :math:`\alpha_{ij} = \exp((s_{ij} - m_i) -
\log l_i)` from them, subtracting the max first so that the exponent's error
does not grow with :math:`|m_i|` (a single logsumexp :math:`m_i + \log l_i`
rounded to float32 would lose :math:`\log l_i` at large logits), then
(FlashAttention-2 style):
:math:`dS_{ij} = \alpha_{ij}(dP_{ij}\,\mathrm{keep}_{ij}/(1-p) - \Delta_i)` with
:math:`\Delta_i = \sum_j \tilde\alpha_{ij} dP_{ij}` (mathematically
:math:`\langle dO_i, O_i\rangle`, but summed from the recomputed terms so that
:math:`\sum_j dS_{ij}` cancels to rounding of the terms themselves: with
:math:`\langle dO_i, O_i\rangle` from the stored float32 ``O``, a nearly
saturated row's :math:`dS` had ~100x PyG's error).

Attention dropout draws its mask from a counter-based Philox4x32-10 stream
keyed by ``seed`` and indexed by ``csr_position * H + head``, so forward and
backward (and the CUDA kernels) regenerate the same mask without storing it.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

GAT, GATV2, DOT = 0, 1, 2
KIND_NAMES = {GAT: "gat", GATV2: "gatv2", DOT: "dot"}

_M32 = 0xFFFFFFFF


def _mulhilo(a: int, b: Tensor) -> Tuple[Tensor, Tensor]:
    prod = b * a  # < 2**64: the int64 wrap keeps every bit
    return (prod >> 32) & _M32, prod & _M32


def philox_uniform(seed: int, counter: Tensor) -> Tensor:
    """Philox4x32-10 of ``(counter_lo, counter_hi, 0, 0)`` with key ``seed``.

    Returns a float32 uniform in ``[0, 1)`` made of the top 24 bits of the
    first output word; the CUDA kernels compute the identical stream.
    """
    counter = counter.long()
    c0 = counter & _M32
    c1 = (counter >> 32) & _M32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0 = seed & _M32
    k1 = (seed >> 32) & _M32
    for r in range(10):
        hi0, lo0 = _mulhilo(0xD2511F53, c0)
        hi1, lo1 = _mulhilo(0xCD9E8D57, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + 0x9E3779B9) & _M32
        k1 = (k1 + 0xBB67AE85) & _M32
    return (c0 >> 8).to(torch.float32) * (1.0 / 16777216.0)


def dropout_keep(seed: int, num_edges: int, heads: int, p: float, device) -> Tensor:
    """Keep-mask ``[E, H]`` (bool) of attention dropout in CSR edge order."""
    idx = torch.arange(num_edges * heads, device=device, dtype=torch.long)
    return (philox_uniform(seed, idx) >= p).view(num_edges, heads)


def _rows(rowptr: Tensor, num_edges: int) -> Tensor:
    deg = (rowptr[1:] - rowptr[:-1]).long()
    return torch.repeat_interleave(torch.arange(deg.numel(), device=rowptr.device), deg,
                                   output_size=num_edges)


def _seg_sum(values: Tensor, rows: Tensor, n: int) -> Tensor:
    out = values.new_zeros((n,) + tuple(values.shape[1:]))
    return out.index_add_(0, rows, values)


def _edge_csr(edge: Optional[Tensor], perm: Optional[Tensor]) -> Optional[Tensor]:
    if edge is None or perm is None:
        return edge
    return edge.index_select(0, perm.long())


def _edge_orig(values: Tensor, perm: Optional[Tensor], total: int) -> Tensor:
    """Per-edge ``values`` (CSR order) in original edge order, ``total`` edges
    (the edges in no row -- past ``rowptr[-1]`` -- get zeros)."""
    if perm is None and values.size(0) == total:
        return values
    out = values.new_zeros((total,) + tuple(values.shape[1:]))
    if perm is None:
        out[:values.size(0)] = values
    else:
        out[perm.long()] = values
    return out


def _scores(kind: int, rows: Tensor, col: Tensor, dst_feat: Tensor, src_feat: Tensor,
            edge_c: Optional[Tensor], att: Optional[Tensor], scale: float,
            negative_slope: float):
    """Returns ``(s [E, H], aux)``; ``aux`` is the pre-activation for GAT/GATv2."""
    if kind == GAT:
        z = src_feat[col] + dst_feat[rows]
        if edge_c is not None:
            z = z + edge_c
        return F.leaky_relu(z, negative_slope), z
    if kind == GATV2:
        z = src_feat[col] + dst_feat[rows]
        if edge_c is not None:
            z = z + edge_c
        return (F.leaky_relu(z, negative_slope) * att).sum(-1), z
    k = src_feat[col]
    if att is not None:   # the key scale c [N_src, H]
        k = k * att[col].unsqueeze(-1)
    if edge_c is not None:
        k = k + edge_c
    return (dst_feat[rows] * k).sum(-1) * scale, k


def _value_csr(kind: int, col: Tensor, src_feat: Tensor, value: Optional[Tensor],
               edge_c: Optional[Tensor]) -> Tensor:
    if kind == GATV2 or value is None:
        return src_feat[col]
    v = value[col]
    if kind == DOT and edge_c is not None:
        v = v + edge_c
    return v


def _dleaky(z: Tensor, slope: float) -> Tensor:
    # in z's dtype: a python-scalar torch.where would round the slope to fp32
    return torch.where(z > 0, z.new_ones(()), z.new_full((), slope))


def _recompute(kind, rowptr, col, perm, dst_feat, src_feat, value, edge, att, scale,
               negative_slope):
    """Shared prologue of forward and backward: CSR helpers, features cast to
    the compute dtype (fp64 stays fp64, else fp32) and the scores ``[E, H]``."""
    nd = rowptr.numel() - 1
    # a CSR may carry unused edges after rowptr[-1] (fixed-size buffers of a
    # padded batch, pyg_dfgnn/train/graphed.py): they belong to no row
    E = int(rowptr[-1]) if rowptr.numel() else 0
    if E < col.numel():
        col = col[:E]
        perm = perm[:E] if perm is not None else None
    col_l = col.long()
    rows = _rows(rowptr, E)
    edge_c = _edge_csr(edge, perm)
    if edge_c is not None and edge_c.size(0) > E:
        edge_c = edge_c[:E]
    cdt = torch.float64 if src_feat.dtype == torch.float64 else torch.float32

    def cast(t):
        return t.to(cdt) if t is not None else None
    dst_f, src_f, val_f, edge_f, att_f = map(cast, (dst_feat, src_feat, value, edge_c, att))
    s, aux = _scores(kind, rows, col_l, dst_f, src_f, edge_f, att_f, scale, negative_slope)
    H = src_feat.size(1)
    return (E, nd, col_l, rows, cdt, dst_f, src_f, val_f, edge_f, att_f, s.view(E, H), aux,
            perm)


def attention_forward(kind: int, rowptr: Tensor, col: Tensor, perm: Optional[Tensor],
                      dst_feat: Tensor, src_feat: Tensor, value: Optional[Tensor],
                      edge: Optional[Tensor], att: Optional[Tensor], scale: float,
                      negative_slope: float, dropout_p: float, seed: int,
                      need_alpha: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """Returns ``out [N_dst, H, F]``, the saved statistics ``lse [2, N_dst, H]``
    (float32; float64 for float64 inputs: ``lse[0]`` the row max ``m`` of the
    pre-dropout scores, ``-inf`` for a row without edges, ``lse[1]`` ``log(l)``
    with ``l = sum_j exp(s_ij - m)``, ``0`` for a row without edges) and
    post-dropout ``alpha [E, H]`` in original edge order (empty unless
    ``need_alpha``)."""
    E, nd, col_l, rows, cdt, dst_f, src_f, val_f, edge_f, att_f, s, _, used = _recompute(
        kind, rowptr, col, perm, dst_feat, src_feat, value, edge, att, scale, negative_slope)
    H = s.size(1)
    m = torch.full((nd, H), float("-inf"), dtype=cdt, device=s.device)
    m = m.scatter_reduce(0, rows.view(-1, 1).expand(E, H), s, "amax", include_self=True)
    p = torch.exp(s - m[rows])
    denom = _seg_sum(p, rows, nd)
    # saved statistics [2, N_dst, H]: the row max m and log(l) apart, so that the
    # backward's exponent (s - m) - log(l) has an error independent of |m|
    log_l = torch.where(denom > 0, torch.log(denom), denom.new_zeros(()))
    lse = torch.stack([m, log_l])
    alpha = p / (denom + 1e-16)[rows]
    if dropout_p > 0.0:
        keep = dropout_keep(seed, E, H, dropout_p, s.device)
        alpha = alpha * keep / (1.0 - dropout_p)
    v = _value_csr(kind, col_l, src_f, val_f, edge_f)
    out = _seg_sum(alpha.unsqueeze(-1) * v, rows, nd)
    if kind == GAT and att_f is not None:   # GAT's output bias [H, C], C <= F
        out = out[..., :att_f.size(-1)] + att_f
    out_dtype = value.dtype if (value is not None and kind != GATV2) else src_feat.dtype
    alpha_out = _edge_orig(alpha, used, col.numel()).to(out_dtype) if need_alpha else \
        s.new_empty((0,), dtype=out_dtype)
    return out.to(out_dtype), lse, alpha_out


def attention_backward(kind: int, rowptr: Tensor, col: Tensor, perm: Optional[Tensor],
                       dst_feat: Tensor, src_feat: Tensor, value: Optional[Tensor],
                       edge: Optional[Tensor], att: Optional[Tensor], scale: float,
                       negative_slope: float, dropout_p: float, seed: int, out: Tensor,
                       lse: Tensor, grad_out: Tensor) -> List[Tensor]:
    """Explicit backward: ``[d_dst, d_src, d_value, d_edge, d_att]`` (empty when
    the input is absent), recomputing ``alpha = exp((s - m) - log(l))`` from the
    forward's ``lse = [m, log(l)]``."""
    E, nd, col_l, rows, cdt, dst_f, src_f, val_f, edge_f, att_f, s, aux, used = _recompute(
        kind, rowptr, col, perm, dst_feat, src_feat, value, edge, att, scale, negative_slope)
    E_all = col.numel()
    ns = src_feat.size(0)
    dout = grad_out.to(cdt)  # (``out`` is not needed: Delta is summed from the terms)
    H = dout.size(1)
    d_bias = None
    if kind == GAT and att is not None:   # the output bias: the output's width
        d_bias = dout.sum(0)
        dout = F.pad(dout, (0, val_f.size(-1) - dout.size(-1)))
    lse = lse.to(cdt)
    alpha = torch.exp((s - lse[0][rows]) - lse[1][rows])
    keep = torch.ones_like(alpha)
    if dropout_p > 0.0:
        keep = dropout_keep(seed, E, H, dropout_p, s.device).to(cdt) / (1.0 - dropout_p)
    v = _value_csr(kind, col_l, src_f, val_f, edge_f)
    dP = (dout[rows] * v).sum(-1)
    # Delta = sum_j alpha~ dP (not <dO, O>: see the module docstring)
    delta = _seg_sum(alpha * keep * dP, rows, nd)
    dS = alpha * (dP * keep - delta[rows])
    d_v_edge = (alpha * keep).unsqueeze(-1) * dout[rows]  # grad of value_csr [E, H, F]
    def empty():  # distinct objects: custom-op outputs must not alias
        return s.new_empty((0,))
    d_att = d_bias if d_bias is not None else empty()
    d_value = empty()
    if kind == GAT:
        g = dS * _dleaky(aux, negative_slope)
        d_dst = _seg_sum(g, rows, nd)
        d_src = _seg_sum(g, col_l, ns)
        d_edge = _edge_orig(g, used, E_all) if edge is not None else empty()
        d_value = _seg_sum(d_v_edge, col_l, ns)
    elif kind == GATV2:
        slope = _dleaky(aux, negative_slope)
        gz = dS.unsqueeze(-1) * att_f * slope
        d_dst = _seg_sum(gz, rows, nd)
        d_src = _seg_sum(gz + d_v_edge, col_l, ns)
        d_edge = _edge_orig(gz, used, E_all) if edge is not None else empty()
        d_att = (dS.unsqueeze(-1) * F.leaky_relu(aux, negative_slope)).sum(0)
    else:
        g = (dS * scale).unsqueeze(-1)
        d_dst = _seg_sum(g * aux, rows, nd)
        dk = g * dst_f[rows]
        d_src = _seg_sum(dk, col_l, ns)
        if att is not None:   # d_src is the scaled key's gradient: keys c_j k_j
            d_att = (d_src * src_f).sum(-1)
            d_src = d_src * att_f.unsqueeze(-1)
        d_value = _seg_sum(d_v_edge, col_l, ns) if value is not None else empty()
        d_edge = _edge_orig(dk + d_v_edge, used, E_all) if edge is not None else empty()

    def cast(t, like):
        return t.to(like.dtype) if (like is not None and t.numel()) else t
    return [cast(d_dst, dst_feat), cast(d_src, src_feat), cast(d_value, value),
            cast(d_edge, edge), cast(d_att, att)]


def naive_attention(kind: int, edge_index: Tensor, num_dst: int, dst_feat: Tensor,
                    src_feat: Tensor, value: Optional[Tensor], edge: Optional[Tensor],
                    att: Optional[Tensor], scale: float = 1.0, negative_slope: float = 0.2,
                    keep: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Gather + PyG softmax + scatter on an unsorted ``edge_index`` (autograd
    gives the gradients).  The independent oracle of the tests and the "native
    PyG" contender of the benchmarks.  ``keep`` is a pre-scaled dropout
    multiplier ``[E, H]`` in edge order.  GAT's ``att`` is the output bias, dot
    attention's the key scale."""
    from torch_geometric.utils import softmax
    src, dst = edge_index[0], edge_index[1]
    if kind == GAT:
        s = F.leaky_relu(src_feat[src] + dst_feat[dst] + (edge if edge is not None else 0),
                         negative_slope)
        v = src_feat if value is None else value
        vj = v[src]
    elif kind == GATV2:
        z = src_feat[src] + dst_feat[dst] + (edge if edge is not None else 0)
        s = (F.leaky_relu(z, negative_slope) * att).sum(-1)
        vj = src_feat[src]
    else:
        k = src_feat[src] * (att[src].unsqueeze(-1) if att is not None else 1)
        k = k + (edge if edge is not None else 0)
        s = (dst_feat[dst] * k).sum(-1) * scale
        vj = value[src] + (edge if edge is not None else 0)
    alpha = softmax(s, dst, num_nodes=num_dst)
    if keep is not None:
        alpha = alpha * keep
    msg = alpha.unsqueeze(-1) * vj
    out = msg.new_zeros((num_dst,) + tuple(msg.shape[1:])).index_add_(0, dst, msg)
    if kind == GAT and att is not None:   # GAT's output bias [H, C], C <= F
        out = out[..., :att.size(-1)] + att
    return out, alpha
