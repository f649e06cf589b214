"""Python face of the fused kernels: one function per attention model.

Each function takes a :class:`~pyg_dfgnn.graph.CSRGraph` and node features,
validates shapes/dtypes (raising ``ValueError`` naming the argument), picks the
schedule (:mod:`pyg_dfgnn.schedule`) and calls the ``dfgnn::attention_fwd``
custom op, whose autograd runs the fused backward.  They return
``(out [N_dst, H, F], alpha)`` where ``alpha [E, H]`` are the post-dropout
attention coefficients in the graph's original edge order when
``return_alpha=True`` and ``None`` otherwise.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..graph import CSRGraph
from . import fused, reference
from .reference import DOT, GAT, GATV2

__all__ = ["gat_attention", "gatv2_attention", "dot_attention", "agnn_attention",
           "GAT", "GATV2", "DOT", "reference", "fused", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_feat(name: str, t: Tensor, rows: int, dims: int, graph: CSRGraph,
                heads: Optional[int] = None, feat: Optional[int] = None) -> None:
    if not isinstance(t, Tensor):
        raise ValueError(f"'{name}' must be a Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"'{name}' has dtype {t.dtype}; supported: float16, bfloat16, "
                         "float32, float64")
    if t.dim() != dims:
        raise ValueError(f"'{name}' must have {dims} dimensions, got shape {list(t.shape)}")
    if t.size(0) != rows:
        raise ValueError(f"'{name}' has {t.size(0)} rows, but the graph needs {rows}")
    if heads is not None and t.size(1) != heads:
        raise ValueError(f"'{name}' has {t.size(1)} heads, expected {heads}")
    if feat is not None and t.size(2) != feat:
        raise ValueError(f"'{name}' has feature size {t.size(2)}, expected {feat}")
    if t.device != graph.device:
        raise ValueError(f"'{name}' is on {t.device} but the graph is on {graph.device}")


def _seed(dropout: float, device) -> Optional[Tensor]:
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"'dropout' must be in [0, 1), got {dropout}")
    if dropout == 0.0:
        return None
    # drawn from torch's default CPU generator: torch.manual_seed reproduces it
    return torch.randint(0, 2**62, (1,), dtype=torch.long)


def _run(kind: int, graph: CSRGraph, dst_feat: Tensor, src_feat: Tensor,
         value: Optional[Tensor], edge: Optional[Tensor], att: Optional[Tensor], scale: float,
         negative_slope: float, dropout: float, return_alpha: bool
         ) -> Tuple[Tensor, Optional[Tensor]]:
    from ..schedule import plan_for
    seed = _seed(dropout, graph.device)
    dt = src_feat.dtype
    for n, t in (("dst", dst_feat), ("value", value), ("edge", edge), ("att", att)):
        if t is not None and t.dtype != dt:
            raise ValueError(f"all features must share one dtype: got {dt} and {t.dtype} "
                             f"({n})")
    heads = src_feat.size(1)
    feat = (value if value is not None else src_feat)
    plan = plan_for(graph, kind, feat.size(-1) if feat.dim() == 3 else 1, heads, dt)
    out, _lse, alpha = fused.attention(
        kind, graph.rowptr, graph.col, graph.perm, graph.t_rowptr, graph.t_col,
        graph.t_perm, dst_feat.contiguous(), src_feat.contiguous(),
        value.contiguous() if value is not None else None,
        edge.contiguous() if edge is not None else None,
        att.contiguous() if att is not None else None, float(scale), float(negative_slope),
        float(dropout), seed, bool(return_alpha), plan.sched, plan.work, plan.merge,
        plan.t_work, plan.t_merge)
    return out, (alpha if return_alpha else None)


def gat_attention(graph: CSRGraph, x: Tensor, a_src: Tensor, a_dst: Tensor,
                  a_edge: Optional[Tensor] = None, negative_slope: float = 0.2,
                  dropout: float = 0.0, return_alpha: bool = False
                  ) -> Tuple[Tensor, Optional[Tensor]]:
    r"""GAT: :math:`o_i = \sum_j \mathrm{softmax}_j(\mathrm{LeakyReLU}(a^{src}_j + a^{dst}_i
    + a^{edge}_{ij}))\, x_j`.

    ``x [N_src, H, F]``, ``a_src [N_src, H]``, ``a_dst [N_dst, H]``,
    ``a_edge [E, H]`` in original edge order.
    """
    _check_feat("x", x, graph.num_src, 3, graph)
    H = x.size(1)
    _check_feat("a_src", a_src, graph.num_src, 2, graph, H)
    _check_feat("a_dst", a_dst, graph.num_dst, 2, graph, H)
    if a_edge is not None:
        _check_feat("a_edge", a_edge, graph.num_edges, 2, graph, H)
    return _run(GAT, graph, a_dst, a_src, x, a_edge, None, 1.0, negative_slope, dropout,
                return_alpha)


def gatv2_attention(graph: CSRGraph, x_src: Tensor, x_dst: Tensor, att: Tensor,
                    x_edge: Optional[Tensor] = None, negative_slope: float = 0.2,
                    dropout: float = 0.0, return_alpha: bool = False
                    ) -> Tuple[Tensor, Optional[Tensor]]:
    r"""GATv2: :math:`o_i = \sum_j \mathrm{softmax}_j(a^\top \mathrm{LeakyReLU}(x^{src}_j +
    x^{dst}_i + x^{edge}_{ij}))\, x^{src}_j`.

    ``x_src [N_src, H, F]``, ``x_dst [N_dst, H, F]``, ``att [H, F]`` (a leading
    singleton dimension is accepted), ``x_edge [E, H, F]``.
    """
    _check_feat("x_src", x_src, graph.num_src, 3, graph)
    H, Fd = x_src.size(1), x_src.size(2)
    _check_feat("x_dst", x_dst, graph.num_dst, 3, graph, H, Fd)
    att = att.reshape(-1, *att.shape[-2:]) if att.dim() == 3 else att
    if att.dim() == 3:
        att = att[0]
    if tuple(att.shape) != (H, Fd):
        raise ValueError(f"'att' must have shape [{H}, {Fd}], got {list(att.shape)}")
    if x_edge is not None:
        _check_feat("x_edge", x_edge, graph.num_edges, 3, graph, H, Fd)
    return _run(GATV2, graph, x_dst, x_src, None, x_edge, att, 1.0, negative_slope, dropout,
                return_alpha)


def dot_attention(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor,
                  edge: Optional[Tensor] = None, scale: Optional[float] = None,
                  dropout: float = 0.0, return_alpha: bool = False
                  ) -> Tuple[Tensor, Optional[Tensor]]:
    r"""Graph Transformer: :math:`o_i = \sum_j \mathrm{softmax}_j(\mathrm{scale}\,
    \langle q_i, k_j + e_{ij}\rangle)\,(v_j + e_{ij})`.

    ``q [N_dst, H, F]``, ``k [N_src, H, F]``, ``v [N_src, H, F_v]``,
    ``edge [E, H, F]`` (added to keys and values, as in PyG's TransformerConv);
    ``scale`` defaults to :math:`1/\sqrt{F}`.
    """
    _check_feat("k", k, graph.num_src, 3, graph)
    H, Fd = k.size(1), k.size(2)
    _check_feat("q", q, graph.num_dst, 3, graph, H, Fd)
    _check_feat("v", v, graph.num_src, 3, graph, H)
    if edge is not None:
        _check_feat("edge", edge, graph.num_edges, 3, graph, H, Fd)
        if v.size(2) != Fd:
            raise ValueError("'edge' is added to keys and values, so 'v' must have the "
                             f"feature size of 'k' ({Fd}), got {v.size(2)}")
    if scale is None:
        scale = 1.0 / math.sqrt(Fd)
    return _run(DOT, graph, q, k, v, edge, None, scale, 0.2, dropout, return_alpha)


def agnn_attention(graph: CSRGraph, x: Tensor, beta: Tensor, dropout: float = 0.0,
                   return_alpha: bool = False, eps: float = 1e-12
                   ) -> Tuple[Tensor, Optional[Tensor]]:
    r"""AGNN: :math:`o_i = \sum_j \mathrm{softmax}_j(\beta \cos(x_i, x_j))\, x_j`
    for ``x [N, F]`` (single head); ``beta`` is a (learnable) scalar tensor.

    Runs the dot-product kernel with ``q = beta * x_norm``, ``k = x_norm`` and
    ``v = x``, so autograd carries the gradient of ``beta`` and of the norm.
    """
    if x.dim() != 2:
        raise ValueError(f"'x' must have shape [N, F], got {list(x.shape)}")
    xn = torch.nn.functional.normalize(x, p=2.0, dim=-1, eps=eps)
    q = (xn * beta.to(xn.dtype)).unsqueeze(1)
    if graph.num_dst != x.size(0):
        q = q[:graph.num_dst]
    out, alpha = dot_attention(graph, q, xn.unsqueeze(1), x.unsqueeze(1), None, 1.0,
                               dropout, return_alpha)
    return out.squeeze(1), alpha
