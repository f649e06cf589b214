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
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from ..graph import CSRGraph, GraphRef
from . import fused, reference
from .fused import (BACKWARD_MODES, FP32_MATMUL_MODES, backward_mode, fp32_matmul,
                    set_backward_mode, set_fp32_matmul)
from .reference import DOT, GAT, GATV2

__all__ = ["gat_attention", "gat_node_attention", "gatv2_attention", "dot_attention",
           "agnn_attention",
           "GAT", "GATV2", "DOT", "reference", "fused", "SUPPORTED_DTYPES",
           "set_backward_mode", "backward_mode", "BACKWARD_MODES",
           "set_fp32_matmul", "fp32_matmul", "FP32_MATMUL_MODES"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


#: row dimension symbols: the graph attribute giving the size, and its meaning
_ROWS = {"src": ("num_src", "source nodes", "source node"),
         "dst": ("num_dst", "destination nodes", "destination node"),
         "E": ("num_edges", "edges", "edge")}
#: other dimension symbols, bound by the first argument that has them
_DIMS = {"H": ("heads", "num_heads"), "F": ("features", "features"),
         "Fv": ("value features", "value_features"), "C": ("bias features", "out_features"),
         "Cb": ("bias features", "out_features"),
         "Cr": ("residual features", "out_features")}


def _layout(dims) -> str:
    return "[" + ", ".join(_ROWS[d][0].replace("num_", "N_") if d in _ROWS else _DIMS[d][1]
                           for d in dims) + "]"


def _check_graph(graph: Any) -> None:
    if not isinstance(graph, (CSRGraph, GraphRef)):
        raise ValueError(
            f"'graph' must be a pyg_dfgnn.graph.CSRGraph, got {type(graph).__name__}; "
            f"build one with pyg_dfgnn.graph.get_graph(edge_index, (num_src, num_dst))")


def _check_inputs(graph: CSRGraph, *specs, optional: Tuple[str, ...] = (),
                  same_dtype: Optional[Tuple[str, ...]] = None) -> Dict[str, int]:
    """Validate ``(name, tensor or None, dims)`` arguments against the graph and
    each other; every message names the user's argument and what was expected.
    ``dims`` lists one symbol per dimension (see ``_ROWS`` / ``_DIMS``); the
    arguments named in ``optional`` may be ``None``; the arguments named in
    ``same_dtype`` (default: all) must share one dtype.
    Returns the sizes bound to the non-row symbols.

    (Runs on every layer call: the graph's device is read once per call, not
    per argument: 4.5 -> 3.2 us for GAT's four arguments on the development
    CPU, docs/KERNELS.md session 27.)"""
    _check_graph(graph)
    bound: Dict[str, Tuple[int, str]] = {}
    device = graph.device
    first_name: Optional[str] = None
    first_dtype: Optional[torch.dtype] = None
    for name, t, dims in specs:
        if t is None and name in optional:
            continue
        if not isinstance(t, Tensor):
            raise ValueError(f"'{name}' must be a Tensor of shape {_layout(dims)}, got "
                             f"{type(t).__name__}")
        dtype = t.dtype
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"'{name}' has dtype {dtype}; supported: float16, bfloat16, "
                             "float32, float64")
        shape = t.shape
        if len(shape) != len(dims):
            raise ValueError(f"'{name}' must have shape {_layout(dims)} ({len(dims)} "
                             f"dimensions), got shape {list(shape)}")
        for d, sym in enumerate(dims):
            n = shape[d]
            row = _ROWS.get(sym)
            if row is not None:
                attr = row[0]
                want = getattr(graph, attr)
                if want is not None and n != want:  # (GraphRef: edges unknown with loops)
                    raise ValueError(
                        f"'{name}' has {n} rows but the graph has {want} {row[1]} "
                        f"(graph.{attr}): '{name}' needs one row per {row[2]}")
                continue
            b = bound.get(sym)
            if b is None:
                bound[sym] = (n, name)
            elif b[0] != n:
                raise ValueError(
                    f"'{name}' has {n} {_DIMS[sym][0]} (size of dimension {d}) but "
                    f"'{b[1]}' has {b[0]}; they must agree")
        if t.device != device:
            raise ValueError(f"'{name}' is on {t.device} but the graph is on {device}")
        if same_dtype is not None and name not in same_dtype:
            continue
        if first_dtype is None:
            first_name, first_dtype = name, dtype
        elif dtype != first_dtype:
            raise ValueError(f"'{name}' has dtype {dtype} but '{first_name}' has "
                             f"{first_dtype}: all inputs must share one dtype")
    return {k: v[0] for k, v in bound.items()}


def _check_narrower(name: str, width: Optional[int], feats: int, what: str) -> None:
    """A per-head width ``name`` (``None``: the argument is absent) may be
    narrower than x's ``feats`` features per head (a padded projection), not
    wider."""
    if width is not None and width > feats:
        raise ValueError(f"'{name}' has {width} features per head but 'x' has {feats}: it "
                         f"may be narrower than x's heads ({what}), not wider")


def _check_float(name: str, value: Any, finite: bool = True) -> float:
    # (torch.SymFloat/SymInt: torch.compile(dynamic=True) makes Python floats
    # symbolic; the comparisons below trace as guards, math.isfinite would not)
    if isinstance(value, bool) or not isinstance(
            value, (int, float, torch.SymFloat, torch.SymInt)):
        raise ValueError(f"'{name}' must be a float, got {type(value).__name__}")
    if finite and (value != value or value == math.inf or value == -math.inf):
        raise ValueError(f"'{name}' must be finite, got {value}")
    return value if isinstance(value, torch.SymFloat) else float(value)


def _check_dropout(dropout: float) -> float:
    dropout = _check_float("dropout", dropout)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"'dropout' must be in [0, 1), got {dropout}")
    return dropout


def _seed(dropout: float, device) -> Optional[Tensor]:
    if _check_dropout(dropout) == 0.0:
        return None
    # drawn from torch's default CPU generator: torch.manual_seed reproduces it
    return torch.randint(0, 2**62, (1,), dtype=torch.long)


def _op_seed(dropout: float) -> int:
    """The seed argument of a layer op (``dfgnn_C::*_layer``): ``-1`` where
    ``dropout`` applies, for the op to draw the value :func:`_seed` draws from
    the same generator (``layer_seed`` in cuda/dfgnn_ops.cpp), else ``0``;
    ``dropout`` checked as :func:`_seed` checks it."""
    return -1 if _check_dropout(dropout) > 0.0 else 0


def _dense(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.contiguous()


def _rows(t: Optional[Tensor], shared_heads: bool = False) -> Optional[Tensor]:
    """``t`` itself where its rows are row-strided ``[N, H, F]`` blocks (each
    row's features contiguous, what the CUDA dot-attention kernels read with a
    row stride) or, for keys and values (``shared_heads``), one row of ``F``
    features that every head reads (``x[:, None].expand(N, H, F)``: head
    stride 0), else ``t.contiguous()``."""
    if t is None or t.is_contiguous():
        return t
    if t.dim() == 3 and (t.size(2) <= 1 or t.stride(2) == 1):
        if shared_heads and t.size(1) > 1 and t.stride(1) == 0:
            if t.stride(0) >= t.size(2):
                return t
        elif (t.size(1) <= 1 or t.stride(1) == t.size(2)) and t.stride(0) >= t.size(1) * t.size(2):
            return t
    return t.contiguous()


def _shared_rows(t: Optional[Tensor]) -> Optional[Tensor]:
    """:func:`_rows` for keys and values (heads may share one row)."""
    return _rows(t, True)


def _with_residual(out: Tensor, residual: Optional[Tensor]) -> Tensor:
    """``out[..., :C] + residual`` (the residual added after the op), or ``out``."""
    if residual is None:
        return out
    C = residual.size(-1)
    return (out if out.size(-1) == C else out[..., :C]) + residual


def _run(kind: int, graph: CSRGraph, dst_feat: Tensor, src_feat: Tensor,
         value: Optional[Tensor], edge: Optional[Tensor], att: Optional[Tensor], scale: float,
         negative_slope: float, dropout: float, return_alpha: bool,
         residual: Optional[Tensor] = None,
         sink: Optional["_ScoreSum"] = None) -> Tuple[Tensor, Optional[Tensor]]:
    seed = _seed(dropout, graph.device)
    floats = (float(scale), float(negative_slope), float(dropout))
    if isinstance(graph, GraphRef):  # torch.compile: the op converts edge_index itself
        if return_alpha:
            raise ValueError("'return_alpha' needs a CSRGraph, not a GraphRef")
        feats = tuple(t.contiguous() if t is not None else None
                      for t in (dst_feat, src_feat, value, edge, att))
        return _with_residual(fused.graph_attention(kind, graph, *feats, *floats, seed),
                              residual), None
    plan = fused.plan_of(graph, kind, src_feat, value)
    # the CUDA kernels take dot attention's q / k / v row-strided (column blocks
    # of one projection GEMM: nn/_glue.py, fused_projections)
    cuda_dot = kind == DOT and graph.device.type == "cuda"
    rows = _rows if cuda_dot else _dense
    kv_rows = _shared_rows if cuda_dot else _dense
    src_r = kv_rows(src_feat)
    # keys that are the values stay one tensor: the kernels gather it once per edge
    value_r = src_r if value is src_feat else kv_rows(value)
    if residual is not None and _fold_residual(graph, residual, dst_feat, src_feat, value, edge):
        # (dot attention on an eager CUDA call without autograd: the kernel adds it)
        out, _lse, alpha = fused.attention_residual_on(
            kind, graph, plan, rows(dst_feat), src_r, value_r, _dense(edge), residual,
            *floats, seed, bool(return_alpha))
    else:
        out, _lse, alpha = fused.attention_on(
            kind, graph, plan, rows(dst_feat), src_r, value_r, _dense(edge), _dense(att),
            *floats, seed, bool(return_alpha), sink)
        out = _with_residual(out, residual)
    return out, (alpha if return_alpha else None)


def gat_attention(graph: CSRGraph, x: Tensor, a_src: Tensor, a_dst: Tensor,
                  a_edge: Optional[Tensor] = None, negative_slope: float = 0.2,
                  dropout: float = 0.0, return_alpha: bool = False,
                  bias: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    r"""GAT: :math:`o_i = \sum_j \mathrm{softmax}_j(\mathrm{LeakyReLU}(a^{src}_j + a^{dst}_i
    + a^{edge}_{ij}))\, x_j \;[+\, b]`.

    ``x [N_src, H, F]``, ``a_src [N_src, H]``, ``a_dst [N_dst, H]``,
    ``a_edge [E, H]`` in original edge order; ``bias [H, C]`` (optional) is
    added to every output row in the kernel's epilogue (a row without edges
    gets ``b``), saving the layer a pass over the output; its gradient is the
    column sum of the output gradient.  ``C <= F``: the output then has the
    first ``C`` features of every head, ``[N_dst, H, C]`` (for ``x`` projected
    into a padded width whose columns ``C..F-1`` are zero, as the layers do:
    nothing is copied to drop them).
    """
    sizes = _check_inputs(graph, ("x", x, ("src", "H", "F")), ("a_src", a_src, ("src", "H")),
                          ("a_dst", a_dst, ("dst", "H")), ("a_edge", a_edge, ("E", "H")),
                          ("bias", bias, ("H", "C")), optional=("a_edge", "bias"))
    _check_narrower("bias", sizes.get("C"), sizes["F"], "the output keeps its width")
    negative_slope = _check_float("negative_slope", negative_slope)
    return _run(GAT, graph, a_dst, a_src, x, a_edge, bias, 1.0, negative_slope, dropout,
                return_alpha)


def gat_node_attention(graph: CSRGraph, x: Tensor, att_src: Tensor, att_dst: Tensor,
                       a_edge: Optional[Tensor] = None, negative_slope: float = 0.2,
                       dropout: float = 0.0, return_alpha: bool = False,
                       bias: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    r""":func:`gat_attention` with GAT's node logits computed by the op:
    :math:`a^{src}_{n,h} = \sum_{c<C} x_{n,h,c}\,\mathrm{att}^{src}_{h,c}` and
    :math:`a^{dst}` alike, for a graph whose source and destination nodes are
    the same (``x`` gives both sides' logits, as in a GAT layer on one node
    set).

    ``x [N, H, F]``, ``att_src`` / ``att_dst [H, C]`` (PyG's ``[1, H, C]``
    accepted), ``C <= F`` (the features ``C..F-1`` of a padded projection take
    no part in the logits).  The attention vectors may have another float
    dtype than ``x`` (autocast: the layer's fp32 parameters): the logits are
    computed in fp32 (float64 for float64 ``x``) and rounded once to ``x``'s
    dtype.  ``a_edge``, ``bias``, ``dropout`` and the result as in
    :func:`gat_attention`.  Gradients reach ``x`` (through the values and the
    logits), ``att_src``, ``att_dst``, ``a_edge`` and ``bias``.

    On eager CUDA calls this is one autograd node: a node-wise logits pass over
    ``x`` (no ``[N, H, C]`` products in memory) and the fused attention, and
    in backward the fused backward and one pass over ``x`` and ``d_x`` (the
    logits' share of ``d_x`` added in place, ``d_att`` summed in fp32).
    """
    if isinstance(graph, (CSRGraph, GraphRef)) and graph.num_src != graph.num_dst:
        raise ValueError(
            f"gat_node_attention needs a graph with as many source as destination nodes "
            f"(x gives both sides' logits), got {graph.num_src} x {graph.num_dst}; use "
            f"gat_attention with the logits of each side")
    atts = []
    for name, a in (("att_src", att_src), ("att_dst", att_dst)):
        if isinstance(a, Tensor) and a.dim() == 3 and a.size(0) == 1:
            a = a[0]
        if not isinstance(a, Tensor) or a.dim() != 2 or not a.is_floating_point():
            raise ValueError(f"'{name}' must be a float Tensor of shape [num_heads, C] "
                             f"(or [1, num_heads, C]), got "
                             f"{list(a.shape) if isinstance(a, Tensor) else type(a).__name__}")
        atts.append(a)
    sizes = _check_inputs(graph, ("x", x, ("src", "H", "F")), ("att_src", atts[0], ("H", "C")),
                          ("a_edge", a_edge, ("E", "H")), ("bias", bias, ("H", "Cb")),
                          optional=("a_edge", "bias"), same_dtype=("x", "a_edge", "bias"))
    if atts[1].shape != atts[0].shape or atts[1].device != atts[0].device:
        raise ValueError(f"'att_dst' has shape {list(atts[1].shape)} on {atts[1].device} but "
                         f"'att_src' {list(atts[0].shape)} on {atts[0].device}; they must agree")
    _check_narrower("att_src", sizes["C"], sizes["F"], "the attention vectors")
    _check_narrower("bias", sizes.get("Cb"), sizes["F"], "the output keeps its width")
    negative_slope = _check_float("negative_slope", negative_slope)
    if (x.dtype == torch.float64 or isinstance(graph, GraphRef)
            or torch.compiler.is_compiling() or not (x.is_cuda or x.is_cpu)):
        a_src, a_dst = fused.gat_logits_ref(x, atts[0], atts[1])
        return _run(GAT, graph, a_dst, a_src, x, a_edge, bias, 1.0, negative_slope, dropout,
                    return_alpha)
    seed = _seed(dropout, graph.device)
    plan = fused.plan_of(graph, GAT, x, x)
    out, _lse, alpha = fused.gat_node_attention_on(
        graph, plan, x.contiguous(), att_src, att_dst, _dense(a_edge), _dense(bias),
        negative_slope, float(dropout), seed, bool(return_alpha))
    return out, (alpha if return_alpha else None)


def gatv2_attention(graph: CSRGraph, x_src: Tensor, x_dst: Tensor, att: Tensor,
                    x_edge: Optional[Tensor] = None, negative_slope: float = 0.2,
                    dropout: float = 0.0, return_alpha: bool = False
                    ) -> Tuple[Tensor, Optional[Tensor]]:
    r"""GATv2: :math:`o_i = \sum_j \mathrm{softmax}_j(a^\top \mathrm{LeakyReLU}(x^{src}_j +
    x^{dst}_i + x^{edge}_{ij}))\, x^{src}_j`.

    ``x_src [N_src, H, F]``, ``x_dst [N_dst, H, F]``, ``att [H, F]`` (a leading
    singleton dimension is accepted), ``x_edge [E, H, F]``.
    """
    if isinstance(att, Tensor) and att.dim() == 3 and att.size(0) == 1:
        att = att[0]  # PyG's parameter shape [1, H, F]
    _check_inputs(graph, ("x_src", x_src, ("src", "H", "F")),
                  ("x_dst", x_dst, ("dst", "H", "F")), ("att", att, ("H", "F")),
                  ("x_edge", x_edge, ("E", "H", "F")), optional=("x_edge",))
    negative_slope = _check_float("negative_slope", negative_slope)
    return _run(GATV2, graph, x_dst, x_src, None, x_edge, att, 1.0, negative_slope, dropout,
                return_alpha)


def _fold_residual(graph, residual: Tensor, *feats: Optional[Tensor]) -> bool:
    """Whether dot attention's ``residual`` is added in the CUDA kernels'
    epilogue (``dfgnn_C::attention_fwd_residual``): an eager CUDA call on a
    :class:`CSRGraph` in fp32 / fp16 / bf16, with the residual in the
    features' dtype, and no gradient to record (the op has no backward: with
    autograd the sum is ``out + residual``, one pass more)."""
    v = feats[2] if feats[2] is not None else feats[1]
    if not (isinstance(graph, CSRGraph) and residual.is_cuda and residual.dtype == v.dtype
            and v.dtype != torch.float64 and not torch.compiler.is_compiling()):
        return False
    return not (torch.is_grad_enabled() and (residual.requires_grad or any(
        t is not None and t.requires_grad for t in feats)))


def dot_attention(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor,
                  edge: Optional[Tensor] = None, scale: Optional[float] = None,
                  dropout: float = 0.0, return_alpha: bool = False,
                  key_scale: Optional[Tensor] = None,
                  residual: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    r"""Graph Transformer: :math:`o_i = \sum_j \mathrm{softmax}_j(\mathrm{scale}\,
    \langle q_i, k_j + e_{ij}\rangle)\,(v_j + e_{ij})`.

    ``q [N_dst, H, F]``, ``k [N_src, H, F]``, ``v [N_src, H, F_v]``,
    ``edge [E, H, F]`` (added to keys and values, as in PyG's TransformerConv);
    ``scale`` defaults to :math:`1/\sqrt{F}`.  On CUDA, ``q``, ``k`` and ``v``
    may be row-strided (each row's ``H x F`` features contiguous, rows further
    apart: column blocks of one projection GEMM's output), which the kernels
    read as they are, and ``k`` and ``v`` may be one row per node that every
    head reads (``x[:, None].expand(N, H, F)``, head stride 0: each gathered
    row then serves all heads); other layouts are copied.

    ``key_scale [N_src, H]`` (optional, not with ``edge``) scales every key:
    the scores are :math:`\mathrm{scale}\,\langle q_i, c_j k_j\rangle`; gradients
    reach it.  Passing ``k`` and ``v`` as one tensor (``k is v``), the kernels
    gather each source row once per edge instead of twice: AGNN's cosine
    scores are ``q = beta * x_norm``, ``k = v = x``, ``c = 1 / |x|``
    (:func:`agnn_attention`).

    ``residual [N_dst, H, C]`` (optional, ``C <= F_v``, not with
    ``key_scale``) is added to the output, which then has its ``C``
    features per head: :math:`o_i[:, :C] + r_i` (a Transformer layer's root
    weight :math:`x_i W_r`, or the real columns of values projected into a
    padded width).  On eager CUDA calls without autograd the kernel adds it
    in its epilogue (no pass over the output of its own); a row-strided
    ``residual`` whose heads lie ``F_v`` apart (a column block of a padded
    projection GEMM's output, sliced to ``C``) is read as it is.
    """
    sizes = _check_inputs(graph, ("q", q, ("dst", "H", "F")), ("k", k, ("src", "H", "F")),
                          ("v", v, ("src", "H", "Fv")), ("edge", edge, ("E", "H", "F")),
                          ("key_scale", key_scale, ("src", "H")),
                          ("residual", residual, ("dst", "H", "Cr")),
                          optional=("edge", "key_scale", "residual"),
                          same_dtype=("q", "k", "v", "edge", "key_scale"))
    if key_scale is not None and edge is not None:
        raise ValueError("'key_scale' cannot be combined with 'edge' (edge features are "
                         "added to the keys; scale them yourself)")
    if residual is not None:
        if key_scale is not None:
            raise ValueError("'residual' cannot be combined with 'key_scale'")
        if residual.size(2) > v.size(2):
            raise ValueError(f"'residual' has {residual.size(2)} features per head but 'v' "
                             f"has {v.size(2)}: it may be narrower (the output keeps its "
                             f"width), not wider")
    Fd = sizes["F"]
    if edge is not None and v.size(2) != Fd:
        raise ValueError("'edge' is added to keys and values, so 'v' must have the "
                         f"feature size of 'k' ({Fd}), got {v.size(2)}")
    if scale is None:
        scale = 1.0 / math.sqrt(Fd) if Fd > 0 else 1.0
    scale = _check_float("scale", scale)
    return _run(DOT, graph, q, k, v, edge, key_scale, scale, 0.2, dropout, return_alpha,
                residual)


_PROLOGUE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _agnn_prologue(x: Tensor, beta: Tensor, num_dst: int, eps: float):
    """AGNN's kernel inputs from ``x [N, F]`` and the 0-d ``beta`` (``x``'s
    dtype): the queries ``q = beta x_i c_i`` (``[num_dst, 1, F]``), the key
    scale ``c = 1 / max(|x|, eps)`` (``[N, 1]``, as ``F.normalize`` divides)
    and the norms ``|x|``.

    Eager CUDA calls without autograd to record (inference, and the forward
    of :class:`_AGNNPrologue`) run one kernel, ``dfgnn_C::agnn_prologue``: a
    warp per row, one read of ``x``, in fp32 with each output rounded once
    (ATen's five ops took 0.12 ms of a 0.63 ms forward at 1 x 256 fp32 on a
    100k-node graph, H200)."""
    if (x.is_cuda and x.dtype in _PROLOGUE_DTYPES and x.dim() == 2 and x.is_contiguous()
            and beta.dtype == x.dtype and beta.device == x.device and beta.numel() == 1
            and 0 <= num_dst <= x.size(0) and not torch.compiler.is_compiling()
            and not (torch.is_grad_enabled() and (x.requires_grad or beta.requires_grad))):
        return tuple(fused._ext().agnn_prologue(x, beta, num_dst, eps))
    n = x.norm(p=2.0, dim=-1, keepdim=True)
    c = n.clamp_min(eps).reciprocal()
    xd = x[:num_dst] if num_dst != x.size(0) else x
    cd = c[:num_dst] if num_dst != x.size(0) else c
    return (xd * (cd * beta)).unsqueeze(1), c, n


class _ScoreSum:
    r"""Where the folded AGNN backward (``dfgnn_C::attention_bwd_folded``, run by
    :class:`~pyg_dfgnn.ops.fused.EagerAttention`) leaves its row pass's fp32
    :math:`\sum_{ij} dS_{ij} s_{ij}` for :class:`_AGNNPrologue`, whose node
    runs after the attention's in the same backward."""

    __slots__ = ("value",)

    def __init__(self):
        self.value: Optional[Tensor] = None


def _prologue_node(x: Tensor, beta: Tensor) -> bool:
    """Whether AGNN's prologue runs as one autograd node (:class:`_AGNNPrologue`):
    on CUDA calls with autograd, outside torch.compile.  Its forward is one
    kernel and its backward one more, where autograd records six nodes.  It
    used to be limited to GPU-bound calls (on a host-bound PATTERN batch the
    Function's Python cost made the call 4-7 % slower, H100, session 18); with
    both kernels, forward+backward of AGNNConv at 1 x 80 on PATTERN x128
    measured 0.69-0.73x the wall time of the six nodes (H200, session 24)."""
    return (x.is_cuda and torch.is_grad_enabled() and (x.requires_grad or beta.requires_grad)
            and not torch.compiler.is_compiling())


class _AGNNPrologue(torch.autograd.Function):
    r""":func:`_agnn_prologue` as one autograd node.  With :math:`n_i = |x_i|`,
    :math:`c_i = 1 / \max(n_i, \epsilon)` and :math:`q_i = \beta c_i x_i`
    (the first ``num_dst`` rows), the gradients from :math:`dq` and :math:`dc`
    are, with :math:`s_i = \langle dq_i, x_i\rangle`,

    .. math::
        \bar{c}_i = dc_i + \beta s_i, \qquad
        dx_i = \beta c_i\, dq_i - [n_i \ge \epsilon]\, \bar{c}_i c_i^2\, x_i / n_i,
        \qquad d\beta = \sum_i c_i s_i

    (autograd's six nodes of norm, clamp, reciprocal and two products).
    Given a :class:`_ScoreSum` (a fifth argument) that the attention's
    backward filled, :math:`d\beta = \sum_{ij} dS_{ij} s_{ij} / \beta`
    instead (the scores :math:`s_{ij} = \beta \cos_{ij}` are linear in
    :math:`\beta`; where :math:`\beta = 0`, the sum above): the row pass sums
    it in fp32 from each edge's dS and score, where :math:`\sum_i c_i s_i`
    takes :math:`dq` rounded to the inputs' dtype, and :math:`d\beta` is a
    small difference of large terms (:math:`\sum_j dS_{ij} = 0`): in bf16 it
    was 0.28 off float64 on a PATTERN batch at one head of 256, PyG's own
    bf16 error being 0.02 (H200, session 29).  On
    CUDA (fp32 / fp16 / bf16) the backward is one kernel,
    ``dfgnn_C::agnn_prologue_bwd``, a warp per row, in fp32 rounded once;
    elsewhere ATen ops in the same dtype (sums in fp32, as ATen's reductions
    accumulate).

    Its third output is ``x.unsqueeze(1)``, the attention's keys and values:
    their gradient :math:`dk_i` (one tensor, the op folds keys and values)
    then reaches this node, which adds it into :math:`dx` with its own terms
    (``addcmul``) instead of autograd adding two ``[N, F]`` branches."""

    @staticmethod
    def forward(ctx, x, beta, num_dst, eps, *sink):
        q, c, n = _agnn_prologue(x, beta, num_dst, eps)   # (grad mode is off in here)
        ctx.save_for_backward(x, beta, c, n)
        ctx.num_dst, ctx.eps = num_dst, eps
        ctx.sink, ctx.n_sink = (sink[0] if sink else None), len(sink)
        ctx.set_materialize_grads(False)
        return q, c, x.unsqueeze(1)

    @staticmethod
    def backward(ctx, dq, dc, dk):
        x, beta, c, n = ctx.saved_tensors
        given = [t for t in (dq, dc, dk) if t is not None]
        if x.is_cuda and x.dtype != torch.float64 and x.is_contiguous() \
                and all(t.dtype == x.dtype and t.device == x.device for t in given):
            # (what the op would refuse never reaches it: an exception thrown
            # from these ops' C++ crashed the device's process, session 21)
            # one pass over the rows (dfgnn_C::agnn_prologue_bwd): s, cbar and
            # dx in fp32, rounded once; beta's gradient sums its fp32 c_i s_i
            dx, cs = fused._ext().agnn_prologue_bwd(
                x, None if dq is None else dq.contiguous(),
                None if dc is None else dc.contiguous(),
                None if dk is None else dk.contiguous(), c, n, beta, ctx.eps)
            dbeta = _AGNNPrologue._dbeta(ctx, beta, cs.sum()) \
                if dq is not None and ctx.needs_input_grad[1] else None
            return ((dx if ctx.needs_input_grad[0] else None), dbeta, None, None) \
                + (None,) * ctx.n_sink
        nd = ctx.num_dst
        xd, cd = x[:nd], c[:nd]
        cbar = torch.zeros_like(c) if dc is None else dc.clone()
        dx = dbeta = None
        if dq is not None:
            dq = dq.squeeze(1)
            s = torch.linalg.vecdot(dq, xd).unsqueeze(-1)   # [nd, 1]
            cbar[:nd].add_(s * beta)
            if ctx.needs_input_grad[1]:
                dbeta = _AGNNPrologue._dbeta(ctx, beta, (cd * s).sum())
        if ctx.needs_input_grad[0]:
            # the norm's term, zero where |x| < eps (the clamp's gradient)
            w = torch.where(n >= ctx.eps, cbar * c * c / n.neg(), torch.zeros_like(c))
            dx = x * w if dk is None else torch.addcmul(dk.squeeze(1), x, w)
            if dq is not None:
                dx[:nd].addcmul_(dq, cd * beta)
        return (dx, dbeta, None, None) + (None,) * ctx.n_sink

    @staticmethod
    def _dbeta(ctx, beta: Tensor, from_dq: Tensor) -> Tensor:
        """beta's gradient in its dtype: the score sum over beta where the
        attention left one (and beta is not 0), else ``from_dq``."""
        ssum = None if ctx.sink is None else ctx.sink.value
        if ssum is not None:   # (fp32: the 0-d quotient promotes beta and from_dq)
            ctx.sink.value = None
            from_dq = torch.where(beta != 0, ssum / beta, from_dq)
        return from_dq.to(beta.dtype)


def agnn_attention(graph: CSRGraph, x: Tensor, beta: Tensor, dropout: float = 0.0,
                   return_alpha: bool = False, eps: float = 1e-12
                   ) -> Tuple[Tensor, Optional[Tensor]]:
    r"""AGNN: :math:`o_i = \sum_j \mathrm{softmax}_j(\beta \cos(x_i, x_j))\, x_j`
    for ``x [N_src, F]`` (single head; the first ``N_dst`` rows are the destination
    nodes); ``beta`` is a (learnable) one-element tensor or a float.

    Runs the dot-product kernel with ``q = beta * x_norm``, ``k = v = x`` and
    the key scale ``c = 1 / max(|x|, eps)`` (so ``c_j k_j = x_norm_j``): each
    edge gathers one row of ``x``, not ``x_norm_j`` and ``x_j``.  Autograd
    carries the gradient of ``beta`` and of the norm.
    """
    _check_inputs(graph, ("x", x, ("src", "F")))
    if graph.num_dst > graph.num_src:
        raise ValueError(
            f"'x' has {x.size(0)} rows but the graph has {graph.num_dst} destination nodes "
            f"(graph.num_dst): AGNN takes the destination features from the first num_dst "
            f"rows of 'x', so it needs num_dst <= num_src")
    if isinstance(beta, (int, float)) and not isinstance(beta, bool):
        beta = torch.tensor(float(beta), device=x.device)
    if not isinstance(beta, Tensor) or beta.numel() != 1 or beta.is_complex():
        raise ValueError(f"'beta' must be a float or a one-element real tensor, got "
                         f"{type(beta).__name__}"
                         + (f" of shape {list(beta.shape)}" if isinstance(beta, Tensor) else ""))
    eps = _check_float("eps", eps)
    beta = beta.reshape(()).to(x.device, x.dtype)
    sink = None
    if _prologue_node(x, beta):
        sink = _ScoreSum()   # (beta's gradient from the attention's row pass)
        q, c, x3 = _AGNNPrologue.apply(x, beta, graph.num_dst, eps, sink)
    else:
        q, c, _ = _agnn_prologue(x, beta, graph.num_dst, eps)
        x3 = x.unsqueeze(1)
    # (q, the keys = values x3 and the key scale c are built from the checked x:
    # dot_attention's checks of them are skipped)
    out, alpha = _run(DOT, graph, q, x3, x3, None, c, 1.0, 0.2, dropout, return_alpha,
                      sink=sink)
    return out.squeeze(1), alpha
