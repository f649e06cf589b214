"""The fused attention op as a ``torch.library`` custom op.

``dfgnn::attention_fwd`` / ``dfgnn::attention_bwd`` are opaque to
torch.compile (no graph breaks inside), have fake (meta) implementations for
tracing, and are tied together by ``register_autograd``.  On CUDA tensors they
call the C++/CUDA extension (``torch.ops.dfgnn_C.*``, built just in time); on
CPU tensors (float32 / bfloat16) the C++ CPU extension
(``torch.ops.dfgnn_cpu.*``, built just in time with the host compiler; see
:func:`pyg_dfgnn._build.cpu_ops`); float64, other devices, and CPU without a
compiler or with ``PYG_DFGNN_CPU_KERNELS=0`` (and float16 on CPU) run the
pure-PyTorch reference in
:mod:`pyg_dfgnn.ops.reference`.

Schedule arguments (see :mod:`pyg_dfgnn.schedule`): ``sched = [group, slots,
t_slots]`` with ``group`` = lanes per (row, head) (0 = automatic) and the
number of partial-result slots of split rows / columns, ``work [W, 4]`` = optional list of
``(row, edge_begin, edge_end, slot)`` items (``slot < 0``: write the row's
output directly, otherwise a partial result merged later), ``merge [R, 3]`` =
``(row, slot_begin, slot_end)`` of split rows.  ``t_work`` / ``t_merge`` are
the same for the transposed CSR in backward.
"""
from __future__ import annotations

import contextlib
from typing import Any, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ..schedule import plan_for
from . import reference as ref


_C_OPS: list = []

#: the CUDA backward's column-pass modes (docs/KERNELS.md): ``store`` keeps each
#: edge's alpha and dS (fp32, ``E x H x 8`` bytes while a layer's backward runs;
#: GAT with up to 32 heads keeps one fp32 array, ``E x H x 4`` bytes, for its
#: single-gather backward; dot attention at fp32 / fp16 heads under 128 bytes
#: without edge features keeps alpha alone, ``E x H x 4`` bytes, and forms dS
#: in the column pass), ``recompute`` recomputes them from the row
#: statistics (nothing per edge, a slower column pass), ``auto`` stores unless
#: that would take over a quarter of the device memory not yet allocated
BACKWARD_MODES = ("store", "recompute", "auto")

#: how the CUDA layer ops' fp32 projection GEMMs run (``cuda/fp32_gemm.cu``;
#: docs/KERNELS.md, session 45): ``ieee`` by cuBLAS' fp32 GEMM; ``split`` on
#: the bf16 tensor cores, each fp32 operand the exact sum of three bf16 parts
#: and the six products above 2^-24 of the result accumulated in fp32 (error
#: that of the fp32 accumulation: ~3-4x cuBLAS' fp32 GEMM's, against 1000x for
#: TF32); ``auto`` splits where the product N x K x M reaches 2^30 (the
#: 100k-node graphs; PATTERN's batches are host-bound and keep ``ieee``) on
#: sm_80 and newer.  Split: the Transformer's and GAT's forward projections,
#: GATv2's in calls that record no gradient; GATv2's with autograd and the
#: backward's GEMMs stay ``ieee`` in every mode
FP32_MATMUL_MODES = ("ieee", "auto", "split")


class _ForcedMode:
    """A process-wide mode of the CUDA library, forced by the caller or
    ``None`` (its environment variable or rule decides): stored here and
    handed to the library's ``setter`` op (``-1`` for ``None``, else the
    mode's index; the op returns ``-2`` for a value it refuses, since an
    exception thrown from an argument-less op crashed the process on the H100
    build) when the library is loaded, and on every change after."""

    def __init__(self, modes: Tuple[str, ...], setter: str, what: str):
        self.modes, self.setter, self.what = modes, setter, what
        self.mode: Optional[str] = None

    def apply(self, ops) -> None:
        code = -1 if self.mode is None else self.modes.index(self.mode)
        if getattr(ops, self.setter)(code) == -2:
            raise RuntimeError(f"pyg_dfgnn: the CUDA library refused {self.what} {self.mode!r}")

    def set(self, mode: Optional[str]) -> Optional[str]:
        if mode is not None and mode not in self.modes:
            raise ValueError(f"'mode' must be one of {', '.join(map(repr, self.modes))} or "
                             f"None, got {mode!r}")
        prev, self.mode = self.mode, mode
        if _C_OPS:
            self.apply(_C_OPS[0])
        return prev


@contextlib.contextmanager
def _scoped(setter, mode: Optional[str]):
    """``setter(mode)`` for the ``with`` block, the previous mode restored on exit."""
    prev = setter(mode)
    try:
        yield
    finally:
        setter(prev)


_BACKWARD = _ForcedMode(BACKWARD_MODES, "set_backward_mode", "backward mode")
_FP32_MATMUL = _ForcedMode(FP32_MATMUL_MODES, "set_fp32_gemm_mode", "fp32 matmul mode")


def _ext():
    """``torch.ops.dfgnn_C`` (built or loaded on first use; looked up once)."""
    if _C_OPS:
        return _C_OPS[0]
    from .. import _build
    _build.load()
    ops = torch.ops.dfgnn_C
    for forced in (_BACKWARD, _FP32_MATMUL):
        if forced.mode is not None:
            forced.apply(ops)
    _C_OPS.append(ops)
    return _C_OPS[0]


def set_backward_mode(mode: Optional[str]) -> Optional[str]:
    """Force the CUDA backward's column-pass mode for this process:
    ``"store"``, ``"recompute"`` or ``"auto"`` (see :data:`BACKWARD_MODES`);
    ``None`` gives the choice back to the ``PYG_DFGNN_BACKWARD`` environment
    variable (default ``auto``), which a forced mode overrides.  Both modes
    give the same gradients to a few fp32 roundings; ``recompute`` trades
    column-pass time for the per-edge memory.  GAT without edge features
    keeps nothing per edge in ``auto`` and ``recompute`` (its destination
    rows' sums are added atomically: gradients equal to a few roundings, not
    bit-reproducible) unless ``torch.use_deterministic_algorithms`` is on,
    when ``auto`` stores.  Returns the previous setting.  The CPU kernels have
    one mode only and ignore it."""
    return _BACKWARD.set(mode)


def backward_mode(mode: Optional[str]):
    """:func:`set_backward_mode` for the ``with`` block, restored on exit."""
    return _scoped(set_backward_mode, mode)


def set_fp32_matmul(mode: Optional[str]) -> Optional[str]:
    """Force how the CUDA layer ops' fp32 projection GEMMs run for this
    process: ``"ieee"``, ``"split"`` or ``"auto"`` (see
    :data:`FP32_MATMUL_MODES`); ``None`` gives the choice back to the
    ``PYG_DFGNN_FP32_MATMUL`` environment variable (default ``auto``), which a
    forced mode overrides.  Returns the previous setting.  Half-precision
    inputs, the CPU and the backward's GEMMs are not affected."""
    return _FP32_MATMUL.set(mode)


def fp32_matmul(mode: Optional[str]):
    """:func:`set_fp32_matmul` for the ``with`` block, restored on exit."""
    return _scoped(set_fp32_matmul, mode)


def linears(x: Tensor, maps) -> List[Tensor]:
    """``[x W^T + b]`` for the ``(W, b)`` pairs of ``maps`` (``b`` may be
    ``None``) on one ``x [N, K]``, without autograd: on CUDA fp32 inputs by the
    extension's rule (:data:`FP32_MATMUL_MODES`: ``x`` split once for all
    maps), elsewhere ``addmm`` / ``mm``, and there too where autograd would
    record the call (the op has no backward).  The caller validated the
    shapes, dtypes and devices."""
    grad = torch.is_grad_enabled() and (x.requires_grad or any(
        t is not None and t.requires_grad for m in maps for t in m))
    if x.is_cuda and x.dtype == torch.float32 and not grad \
            and not torch.compiler.is_compiling():
        return list(_ext().linears(x, [w for w, _ in maps], [b for _, b in maps]))
    return [torch.addmm(b, x, w.t()) if b is not None else torch.mm(x, w.t())
            for w, b in maps]


def _seed_int(seed: Optional[Tensor]) -> int:
    if seed is None:
        return 0
    n = seed.numel()
    if n == 1:
        return int(seed.item())   # one dispatcher call (a CPU tensor: no sync)
    return int(seed.reshape(-1)[0]) if n else 0


def _seed_as_int(impl):
    """The registered kernel of an op (``attention_fwd`` / ``attention_bwd``)
    for the device implementation ``impl``, which takes the op's seed tensor
    (argument 15 of both) as a Python int."""
    def kernel(*args):
        return impl(*args[:15], _seed_int(args[15]), *args[16:])
    kernel.__doc__ = impl.__doc__
    return kernel


@torch.library.custom_op("dfgnn::attention_fwd", mutates_args=())
def attention_fwd(kind: int, rowptr: Tensor, col: Tensor, perm: Optional[Tensor],
                  t_rowptr: Tensor, t_col: Tensor, t_perm: Tensor, dst_feat: Tensor,
                  src_feat: Tensor, value: Optional[Tensor], edge: Optional[Tensor], att: Optional[Tensor], scale: float,
                  negative_slope: float, dropout_p: float, seed: Optional[Tensor],
                  need_alpha: bool, sched: List[int], work: Optional[Tensor],
                  merge: Optional[Tensor], t_work: Optional[Tensor],
                  t_merge: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """Forward: ``(out [N_dst, H, F], lse [2, N_dst, H], alpha)``.

    ``lse`` holds the saved softmax statistics of every (row, head): ``lse[0]``
    the row max ``m`` of the pre-dropout scores (``-inf`` for a row without
    edges), ``lse[1]`` ``log(l)``, ``l = sum_j exp(s_ij - m)`` (``0`` for a row
    without edges); float32, float64 for float64 inputs.  The backward
    recomputes ``alpha = exp((s - m) - log(l))``.  The transposed CSR
    (``t_*``) is unused here but saved for backward.  ``att`` is GATv2's
    attention vector ``[H, F]``; for GAT it is an optional output bias
    ``[H, C]`` added in the epilogue (its gradient: the column sum of
    ``grad_out``), and ``out`` has its ``C <= F`` features per head; for dot
    attention an optional key scale ``c [N_src, H]``: the keys are ``c_j k_j``
    (AGNN's ``k = v = x``, ``c = 1 / |x|``: keys that are the values are
    gathered once per edge)."""
    return ref.attention_forward(kind, rowptr, col, perm, dst_feat, src_feat, value, edge,
                                 att, scale, negative_slope, dropout_p, _seed_int(seed),
                                 need_alpha)


def _cuda_fwd(kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst_feat, src_feat, value,
              edge, att, scale, negative_slope, dropout_p, seed: int, need_alpha, sched, work,
              merge, t_work, t_merge):
    """The CUDA forward with the dropout seed as a Python int."""
    if src_feat.dtype == torch.float64:  # the kernels are fp32/fp16/bf16: exact reference
        return ref.attention_forward(kind, rowptr, col, perm, dst_feat, src_feat, value, edge,
                                     att, scale, negative_slope, dropout_p, seed, need_alpha)
    return tuple(_ext().attention_fwd(kind, rowptr, col, perm, t_rowptr, t_col, t_perm,
                                      dst_feat, src_feat, value, edge, att, scale,
                                      negative_slope, dropout_p, seed, need_alpha,
                                      sched, work, merge, t_work, t_merge))


_attention_fwd_cuda = attention_fwd.register_kernel("cuda")(_seed_as_int(_cuda_fwd))


def _cpu_ops(kind, src_feat, value):
    """The CPU extension's ops for these inputs, or ``None`` for the reference
    (float64/float16, a missing value, CPU kernels disabled or not buildable)."""
    if src_feat.dtype not in (torch.float32, torch.bfloat16):
        return None
    if kind != ref.GATV2 and value is None:
        return None
    from .. import _build
    return _build.cpu_ops()


def cpu_path(dtype: torch.dtype) -> str:
    """Which implementation CPU tensors of ``dtype`` run (for reports):
    ``"C++ CPU kernels"`` or ``"reference path (<why>)"``."""
    if dtype not in (torch.float32, torch.bfloat16):
        return f"reference path ({str(dtype).replace('torch.', '')})"
    from .. import _build
    if not _build.cpu_kernels_enabled():
        return "reference path (PYG_DFGNN_CPU_KERNELS=0)"
    if _build.cpu_ops() is None:
        return "reference path (CPU kernels not built)"
    return "C++ CPU kernels"


def _cpu_fwd(kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst_feat, src_feat, value,
             edge, att, scale, negative_slope, dropout_p, seed: int, need_alpha, sched, work,
             merge, t_work, t_merge, ops=False):
    """The CPU forward with the dropout seed as a Python int; ``ops``: the
    :func:`_cpu_ops` choice when the caller made it already."""
    if ops is False:
        ops = _cpu_ops(kind, src_feat, value)
    if ops is None:
        return ref.attention_forward(kind, rowptr, col, perm, dst_feat, src_feat, value, edge,
                                     att, scale, negative_slope, dropout_p, seed, need_alpha)
    return tuple(ops.attention_fwd(kind, rowptr, col, perm, t_rowptr, t_col, t_perm,
                                   dst_feat, src_feat, value, edge, att, scale,
                                   negative_slope, dropout_p, seed, need_alpha,
                                   sched, work, merge, t_work, t_merge))


_attention_fwd_cpu = attention_fwd.register_kernel("cpu")(_seed_as_int(_cpu_fwd))


def _out_dtype(kind, src_feat, value):
    return value.dtype if (value is not None and kind != ref.GATV2) else src_feat.dtype


def _feat_shape(kind, src_feat, value):
    return (value if (value is not None and kind != ref.GATV2) else src_feat).shape


def _fwd_outputs_like(kind, src_feat, value, num_dst, num_edges, need_alpha, att=None):
    """Empty ``(out, lse, alpha)`` of a forward (the fake implementations);
    GAT's output has its bias' width (``att [H, C]``)."""
    shp = _feat_shape(kind, src_feat, value)
    H, Fd = shp[1], shp[2]
    if kind == ref.GAT and att is not None:
        Fd = att.shape[-1]
    dt = _out_dtype(kind, src_feat, value)
    lse_dt = torch.float64 if src_feat.dtype == torch.float64 else torch.float32
    out = src_feat.new_empty((num_dst, H, Fd), dtype=dt)
    lse = src_feat.new_empty((2, num_dst, H), dtype=lse_dt)  # [row max m, log(l)]
    alpha = src_feat.new_empty((num_edges, H) if need_alpha else (0,), dtype=dt)
    return out, lse, alpha


@attention_fwd.register_fake
def _attention_fwd_fake(kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst_feat,
                        src_feat, value, edge, att, scale, negative_slope, dropout_p, seed,
                        need_alpha, sched, work, merge, t_work, t_merge):
    return _fwd_outputs_like(kind, src_feat, value, rowptr.shape[0] - 1, col.shape[0],
                             need_alpha, att)


@torch.library.custom_op("dfgnn::attention_bwd", mutates_args=())
def attention_bwd(kind: int, rowptr: Tensor, col: Tensor, perm: Optional[Tensor],
                  t_rowptr: Tensor, t_col: Tensor, t_perm: Tensor, dst_feat: Tensor,
                  src_feat: Tensor, value: Optional[Tensor], edge: Optional[Tensor],
                  att: Optional[Tensor], scale: float, negative_slope: float,
                  dropout_p: float, seed: Optional[Tensor], out: Tensor, lse: Tensor,
                  grad_out: Tensor, sched: List[int], work: Optional[Tensor],
                  merge: Optional[Tensor], t_work: Optional[Tensor],
                  t_merge: Optional[Tensor]) -> List[Tensor]:
    return ref.attention_backward(kind, rowptr, col, perm, dst_feat, src_feat, value, edge,
                                  att, scale, negative_slope, dropout_p, _seed_int(seed),
                                  out, lse, grad_out)


def _cuda_bwd(kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst_feat, src_feat, value,
              edge, att, scale, negative_slope, dropout_p, seed: int, out, lse, grad_out, sched,
              work, merge, t_work, t_merge, fold=False, blocks=False):
    """The CUDA backward with the dropout seed as a Python int.  ``fold``: where
    AGNN's kernels run (keys passed as the values, with a key scale), the key
    and value gradients come back as one (``d_src``, with an empty ``d_value``:
    ``dfgnn_C::attention_bwd_folded``), which only a caller whose keys and
    values are one autograd input may ask for (:class:`EagerAttention`).
    ``blocks``: dot attention's q / k / v given as the column blocks of one
    ``[N, 3 H F]`` buffer get their gradients as the same blocks of one new
    buffer (``dfgnn_C::attention_bwd_blocks``: views sharing it, which the
    custom op may not return; :class:`EagerAttention` asks for them)."""
    if src_feat.dtype == torch.float64:
        return ref.attention_backward(kind, rowptr, col, perm, dst_feat, src_feat, value,
                                      edge, att, scale, negative_slope, dropout_p, seed, out,
                                      lse, grad_out)
    ext = _ext()
    op = (ext.attention_bwd_folded if fold else
          ext.attention_bwd_blocks if blocks else ext.attention_bwd)
    return list(op(kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst_feat, src_feat,
                   value, edge, att, scale, negative_slope, dropout_p, seed, out, lse,
                   grad_out.contiguous(), sched, work, merge, t_work, t_merge))


_attention_bwd_cuda = attention_bwd.register_kernel("cuda")(_seed_as_int(_cuda_bwd))


def _cpu_bwd(kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst_feat, src_feat, value,
             edge, att, scale, negative_slope, dropout_p, seed: int, out, lse, grad_out, sched,
             work, merge, t_work, t_merge, ops=False):
    """The CPU backward with the dropout seed as a Python int; ``ops`` as in
    :func:`_cpu_fwd` (the forward's choice: it depends on the inputs only)."""
    if ops is False:
        ops = _cpu_ops(kind, src_feat, value)
    if ops is None:
        return ref.attention_backward(kind, rowptr, col, perm, dst_feat, src_feat, value,
                                      edge, att, scale, negative_slope, dropout_p, seed, out,
                                      lse, grad_out)
    return list(ops.attention_bwd(kind, rowptr, col, perm, t_rowptr, t_col, t_perm,
                                  dst_feat, src_feat, value, edge, att, scale,
                                  negative_slope, dropout_p, seed, out, lse,
                                  grad_out, sched, work, merge, t_work, t_merge))


_attention_bwd_cpu = attention_bwd.register_kernel("cpu")(_seed_as_int(_cpu_bwd))


def _bwd_outputs_like(src_feat, *inputs):
    """Empty gradients of ``(dst, src, value, edge, att)`` (the fake
    implementations): like each input, a distinct empty tensor when absent."""
    return [torch.empty_like(t) if t is not None else src_feat.new_empty((0,))
            for t in inputs]


@attention_bwd.register_fake
def _attention_bwd_fake(kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst_feat,
                        src_feat, value, edge, att, scale, negative_slope, dropout_p, seed,
                        out, lse, grad_out, sched, work, merge, t_work, t_merge):
    return _bwd_outputs_like(src_feat, dst_feat, src_feat, value, edge, att)


def _setup_context(ctx, inputs, output):
    (kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst_feat, src_feat, value, edge,
     att, scale, negative_slope, dropout_p, seed, need_alpha, sched, work, merge, t_work,
     t_merge) = inputs
    out, lse, alpha = output
    ctx.kind, ctx.scale, ctx.slope, ctx.p, ctx.sched = kind, scale, negative_slope, \
        dropout_p, sched
    ctx.save_for_backward(rowptr, col, perm, t_rowptr, t_col, t_perm, dst_feat, src_feat,
                          value, edge, att, seed, out, lse, work, merge, t_work, t_merge)
    ctx.mark_non_differentiable(lse, alpha)


def _backward(ctx, grad_out, _grad_lse, _grad_alpha):
    (rowptr, col, perm, t_rowptr, t_col, t_perm, dst_feat, src_feat, value, edge, att, seed,
     out, lse, work, merge, t_work, t_merge) = ctx.saved_tensors
    need = ctx.needs_input_grad
    if not any(need):
        return (None,) * 22
    grads = attention_bwd(ctx.kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst_feat, src_feat,
                value, edge, att, ctx.scale, ctx.slope, ctx.p, seed, out, lse, grad_out,
                ctx.sched, work, merge, t_work, t_merge)
    return (None,) * 7 + _input_grads(grads, value, edge, att) + (None,) * 10


def _input_grads(grads, value, edge, att) -> tuple:
    """The backward's ``(d_dst, d_src, d_value, d_edge, d_att)`` with ``None``
    for the absent inputs (their gradients are empty placeholders)."""
    d_dst, d_src, d_value, d_edge, d_att = grads

    def opt(t, x):
        return t if (x is not None and t.numel() == x.numel()) else None
    return (d_dst, d_src, opt(d_value, value), opt(d_edge, edge), opt(d_att, att))


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


class _CSR(NamedTuple):
    """The index tensors of a CSR graph (what :class:`~pyg_dfgnn.graph.CSRGraph`
    holds), for :func:`attention`'s flat argument list."""

    rowptr: Tensor
    col: Tensor
    perm: Optional[Tensor]
    t_rowptr: Tensor
    t_col: Tensor
    t_perm: Tensor


class _Sched(NamedTuple):
    """A schedule (what :class:`~pyg_dfgnn.schedule.Plan` holds)."""

    sched: List[int]
    work: Optional[Tensor]
    merge: Optional[Tensor]
    t_work: Optional[Tensor]
    t_merge: Optional[Tensor]


def _eager_function(name: str, fwd, bwd, doc: str, cpu: bool) -> type:
    """An autograd Function running ``fwd`` / ``bwd`` (the per-device
    implementations of ``dfgnn::attention_fwd`` / ``attention_bwd``, seed as a
    Python int) directly.

    ``apply(meta, dst_feat, src_feat, value, edge, att)`` with ``meta = (kind,
    graph, plan, scale, negative_slope, dropout_p, seed, need_alpha)``:
    ``graph`` has the CSR index tensors as attributes (a
    :class:`~pyg_dfgnn.graph.CSRGraph`), ``plan`` the schedule (a
    :class:`~pyg_dfgnn.schedule.Plan`), ``seed`` is an int.  Only the
    differentiable inputs are arguments of their own and saved tensors: the
    graph and plan are never differentiated (they stay on the context), and
    6 arguments instead of the op's 22 (7 saved tensors instead of 18) cut the
    Function's own host time by more than half.  Absent gradients of
    ``lse``/``alpha`` are not materialised (they are never used).  An optional
    ninth entry of ``meta``, an object with a ``value`` attribute, receives the
    folded AGNN backward's score sum (:class:`pyg_dfgnn.ops._AGNNPrologue`).
    """

    def forward(ctx, meta, dst_feat, src_feat, value, edge, att):
        kind, g, plan, scale, negative_slope, dropout_p, seed, need_alpha = meta[:8]
        extra = {}
        if cpu:   # choose the CPU kernels once for forward and backward
            extra["ops"] = ctx.ops = _cpu_ops(kind, src_feat, value)
        output = fwd(kind, g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm, dst_feat,
                     src_feat, value, edge, att, scale, negative_slope, dropout_p, seed,
                     need_alpha, plan.sched, plan.work, plan.merge, plan.t_work, plan.t_merge,
                     **extra)
        out, lse, alpha = output
        ctx.meta = meta
        ctx.kv = src_feat is value   # (one autograd input for keys and values)
        ctx.save_for_backward(dst_feat, src_feat, value, edge, att, out, lse)
        ctx.mark_non_differentiable(lse, alpha)
        ctx.set_materialize_grads(False)
        return output

    def backward(ctx, grad_out, _grad_lse, _grad_alpha):
        if grad_out is None:   # (out unused: only lse/alpha, which have no gradient)
            return (None,) * 6
        dst_feat, src_feat, value, edge, att, out, lse = ctx.saved_tensors
        kind, g, plan, scale, slope, p, seed = ctx.meta[:7]
        # (CUDA: keys that are the values get one gradient, the values' None)
        # (CUDA: q / k / v that are column blocks of one buffer get gradients
        # laid out alike, see _cuda_bwd)
        extra = {"ops": ctx.ops} if cpu else {"fold": ctx.kv, "blocks": True}
        grads = bwd(kind, g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm, dst_feat,
                    src_feat, value, edge, att, scale, slope, p, seed, out, lse, grad_out,
                    plan.sched, plan.work, plan.merge, plan.t_work, plan.t_merge, **extra)
        if len(grads) > 5:   # (folded AGNN: the row pass's score sum, for beta's gradient)
            if len(ctx.meta) > 8 and ctx.meta[8] is not None:
                ctx.meta[8].value = grads[5]
            grads = grads[:5]
        return (None,) + _input_grads(grads, value, edge, att)

    return type(name, (torch.autograd.Function,),
                {"__doc__": doc, "forward": staticmethod(forward),
                 "backward": staticmethod(backward)})


EagerAttention = _eager_function("EagerAttention", _cuda_fwd, _cuda_bwd, """
    The same forward/backward pair as ``dfgnn::attention_fwd`` for eager CUDA
    calls, without the custom-op dispatch layers: those cost ~0.35 ms of host
    time per forward+backward (measured on the device machine with
    ``scripts/profile_op.py --host``), as much as the kernels themselves on a
    PATTERN batch.  Arguments: see :func:`attention_on`.
    Under ``torch.compile`` (and on other devices) the custom op is used.""", cpu=False)

EagerAttentionCPU = _eager_function("EagerAttentionCPU", _cpu_fwd, _cpu_bwd, """
    :class:`EagerAttention` for eager CPU calls: the CPU implementations of
    the custom ops (C++ kernels, or the reference where they do not apply)
    without the dispatch layers, which cost about as much as the kernels on
    small graphs (PATTERN batches).""", cpu=True)


def attention_on(kind: int, graph, plan, dst_feat: Tensor, src_feat: Tensor,
                 value: Optional[Tensor], edge: Optional[Tensor], att: Optional[Tensor],
                 scale: float, negative_slope: float, dropout_p: float,
                 seed: Optional[Tensor], need_alpha: bool,
                 sink: Any = None) -> Tuple[Tensor, Tensor, Tensor]:
    """``attention_fwd`` with autograd on a CSR ``graph`` (index tensors as
    attributes: :class:`~pyg_dfgnn.graph.CSRGraph`) and its schedule ``plan``
    (:class:`~pyg_dfgnn.schedule.Plan`), by the cheapest correct route: the
    :class:`EagerAttention` / :class:`EagerAttentionCPU` functions for eager
    CUDA / CPU calls, the custom op while compiling or tracing, for float64 and
    on other devices.  ``sink``: see :class:`EagerAttention` (eager CUDA calls
    with autograd only; ignored elsewhere)."""
    if src_feat.dtype != torch.float64 and not torch.compiler.is_compiling():
        cuda = src_feat.is_cuda
        if cuda or src_feat.is_cpu:
            s = _seed_int(seed)
            # no gradient to record (inference, validation): the implementation
            # itself, without the autograd Function's Python wrapper
            if not (torch.is_grad_enabled() and (
                    dst_feat.requires_grad or src_feat.requires_grad
                    or (value is not None and value.requires_grad)
                    or (edge is not None and edge.requires_grad)
                    or (att is not None and att.requires_grad))):
                g = graph
                return (_cuda_fwd if cuda else _cpu_fwd)(
                    kind, g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm, dst_feat,
                    src_feat, value, edge, att, scale, negative_slope, dropout_p, s,
                    need_alpha, plan.sched, plan.work, plan.merge, plan.t_work, plan.t_merge)
            return (EagerAttention if cuda else EagerAttentionCPU).apply(
                (kind, graph, plan, scale, negative_slope, dropout_p, s, need_alpha, sink),
                dst_feat, src_feat, value, edge, att)
    g = graph
    return attention_fwd(kind, g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm,
                         dst_feat, src_feat, value, edge, att, scale, negative_slope,
                         dropout_p, seed, need_alpha, plan.sched, plan.work, plan.merge,
                         plan.t_work, plan.t_merge)


def attention_residual_on(kind: int, graph, plan, dst_feat: Tensor, src_feat: Tensor,
                          value: Optional[Tensor], edge: Optional[Tensor], residual: Tensor,
                          scale: float, negative_slope: float, dropout_p: float,
                          seed: Optional[Tensor], need_alpha: bool
                          ) -> Tuple[Tensor, Tensor, Tensor]:
    """Dot attention's forward with ``residual [N_dst, H, C]`` added in the
    kernels' epilogue (``dfgnn_C::attention_fwd_residual``): ``(out [N_dst,
    H, C], lse, alpha)``.  Eager CUDA calls without autograd only (the op
    has no backward; :func:`pyg_dfgnn.ops.dot_attention` decides)."""
    g = graph
    return tuple(_ext().attention_fwd_residual(
        kind, g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm, dst_feat, src_feat,
        value, edge, None, scale, negative_slope, dropout_p, _seed_int(seed), need_alpha,
        plan.sched, plan.work, plan.merge, plan.t_work, plan.t_merge, residual))


# --------------------------------------------------------------------------- #
# GAT with its node logits computed next to the attention
# --------------------------------------------------------------------------- #

def _logits_math_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def gat_logits_ref(x: Tensor, att_src: Tensor, att_dst: Tensor) -> Tuple[Tensor, Tensor]:
    """GAT's node logits ``a[n, h] = sum_{c < C} x[n, h, c] att[h, c]`` for
    ``x [N, H, F >= C]`` and ``att [H, C]`` (or PyG's ``[1, H, C]``): products
    and sums in fp32 (float64 for float64 ``x``), rounded once to ``x``'s
    dtype, as the CUDA op computes them.  Differentiable (torch ops)."""
    H, C = x.size(1), att_src.size(-1)
    dt = _logits_math_dtype(x)
    xs = x[..., :C].to(dt)
    return tuple((xs * a.reshape(H, C).to(dt)).sum(-1).to(x.dtype) for a in (att_src, att_dst))


def _gat_logits(x: Tensor, att_src: Tensor, att_dst: Tensor) -> Tuple[Tensor, Tensor]:
    if x.is_cuda and x.dtype != torch.float64:
        return tuple(_ext().gat_logits(x, att_src, att_dst))
    with torch.no_grad():
        return gat_logits_ref(x, att_src, att_dst)


def _gat_logits_bwd(x: Tensor, att_src: Tensor, att_dst: Tensor, d_src: Tensor, d_dst: Tensor,
                    d_x: Tensor) -> Tuple[Tensor, Tensor]:
    """Adds the logits' share ``d_src att_src + d_dst att_dst`` to ``d_x`` (in
    place) and returns ``(d_att_src, d_att_dst)`` shaped and typed like the
    attention vectors (sums in fp32, float64 for float64 ``x``)."""
    if x.is_cuda and x.dtype != torch.float64:
        return tuple(_ext().gat_logits_bwd(x, att_src, att_dst, d_src, d_dst, d_x))
    H, C = x.size(1), att_src.size(-1)
    dt = _logits_math_dtype(x)
    xs = x[..., :C].to(dt)
    ws, wd = (a.reshape(H, C).to(dt) for a in (att_src, att_dst))
    gs, gd = d_src.to(dt).unsqueeze(-1), d_dst.to(dt).unsqueeze(-1)
    d_x[..., :C] = (d_x[..., :C].to(dt) + gs * ws + gd * wd).to(d_x.dtype)
    return ((gs * xs).sum(0).to(att_src.dtype).view_as(att_src),
            (gd * xs).sum(0).to(att_dst.dtype).view_as(att_dst))


def _gat_node_fwd(g, plan, x, att_src, att_dst, edge, bias, slope, p, seed: int, need_alpha,
                  ops=False):
    """The logits and the fused forward: ``((out, lse, alpha), a_src, a_dst)``;
    ``ops`` as in :func:`_cpu_fwd`."""
    a_src, a_dst = _gat_logits(x, att_src, att_dst)
    extra = {} if x.is_cuda else {"ops": ops}
    output = (_cuda_fwd if x.is_cuda else _cpu_fwd)(
        ref.GAT, g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm, a_dst, a_src, x, edge,
        bias, 1.0, slope, p, seed, need_alpha, plan.sched, plan.work, plan.merge, plan.t_work,
        plan.t_merge, **extra)
    return output, a_src, a_dst


class EagerGATNodeAttention(torch.autograd.Function):
    """GAT's attention with the node logits computed from ``x`` and the
    attention vectors inside the same autograd node (eager CUDA and CPU
    calls; :func:`pyg_dfgnn.ops.gat_node_attention`): forward = the logits
    op (one pass over ``x``, no ``[N, H, C]`` products) + the fused
    attention; backward = the fused backward + the logits' backward (one pass
    over ``x`` and ``d_x``: their share of ``d_x`` added in place, ``d_att``
    summed in fp32).  One
    Function instead of the layer's four logit ops and their four autograd
    nodes: the host time of a layer call.

    ``apply(meta, x, att_src, att_dst, edge, bias)``, ``meta = (graph, plan,
    negative_slope, dropout_p, seed, need_alpha)``; returns ``(out, lse,
    alpha)`` like :func:`attention_on`."""

    @staticmethod
    def forward(ctx, meta, x, att_src, att_dst, edge, bias):
        g, plan, slope, p, seed, need_alpha = meta
        # (the CPU kernels are chosen once for forward and backward)
        ctx.ops = None if x.is_cuda else _cpu_ops(ref.GAT, x, x)
        (out, lse, alpha), a_src, a_dst = _gat_node_fwd(g, plan, x, att_src, att_dst, edge, bias,
                                                        slope, p, seed, need_alpha, ctx.ops)
        ctx.meta = meta
        ctx.save_for_backward(x, att_src, att_dst, a_src, a_dst, edge, bias, out, lse)
        ctx.mark_non_differentiable(lse, alpha)
        ctx.set_materialize_grads(False)
        return out, lse, alpha

    @staticmethod
    def backward(ctx, grad_out, _grad_lse, _grad_alpha):
        if grad_out is None:
            return (None,) * 6
        x, att_src, att_dst, a_src, a_dst, edge, bias, out, lse = ctx.saved_tensors
        g, plan, slope, p, seed, _ = ctx.meta
        cuda = x.is_cuda
        extra = {} if cuda else {"ops": ctx.ops}
        grads = (_cuda_bwd if cuda else _cpu_bwd)(
            ref.GAT, g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm, a_dst, a_src, x,
            edge, bias, 1.0, slope, p, seed, out, lse, grad_out, plan.sched, plan.work,
            plan.merge, plan.t_work, plan.t_merge, **extra)
        d_dst, d_src, d_x, d_edge, d_bias = _input_grads(grads, x, edge, bias)
        d_as, d_ad = _gat_logits_bwd(x, att_src, att_dst, d_src, d_dst, d_x)
        return None, d_x, d_as, d_ad, d_edge, d_bias


def gat_node_attention_on(graph, plan, x: Tensor, att_src: Tensor, att_dst: Tensor,
                          edge: Optional[Tensor], bias: Optional[Tensor],
                          negative_slope: float, dropout_p: float, seed: Optional[Tensor],
                          need_alpha: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """:class:`EagerGATNodeAttention` for an eager CUDA / CPU call whose ``x`` is
    not float64 (the caller checks); without autograd to record, its forward
    alone."""
    s = _seed_int(seed)
    meta = (graph, plan, negative_slope, dropout_p, s, need_alpha)
    if not (torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, att_src, att_dst, edge, bias))):
        return _gat_node_fwd(graph, plan, x, att_src, att_dst, edge, bias, negative_slope,
                             dropout_p, s, need_alpha)[0]
    return EagerGATNodeAttention.apply(meta, x, att_src, att_dst, edge, bias)


def _layer_graph_args(graph, plan) -> tuple:
    """The graph and schedule arguments the layer ops (``dfgnn_C::*_layer``)
    take after their tensors: ``rowptr, col, perm, t_rowptr, t_col, t_perm,
    sched, work, merge, t_work, t_merge``."""
    g = graph
    return (g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm, plan.sched, plan.work,
            plan.merge, plan.t_work, plan.t_merge)


def gat_layer_on(graph, plan, x: Tensor, weight: Tensor, att_src: Tensor, att_dst: Tensor,
                 bias: Optional[Tensor], negative_slope: float, dropout_p: float,
                 seed: int, width: int) -> Tensor:
    """A GAT layer's call on one node set, ``[N, H * C]``, as one op and one
    autograd node (``dfgnn_C::gat_layer``, eager CUDA calls): the projection
    ``h = x W^T`` viewed ``[N, H, width]`` (``weight [H * C, in]``, each head's
    rows zero-padded by the op to the kernels' head ``width >= C``:
    :func:`pyg_dfgnn.nn._padded.kernel_width`), the node logits
    of :func:`gat_node_attention_on` (``att_src`` / ``att_dst`` ``[1, H, C]``
    or ``[H, C]``), the fused attention with ``bias [H * C]`` or ``[H, C]`` (or
    ``None``; the op views it ``[H, C]``, so no view node records it) in
    its epilogue; its backward is the fused backward, the logits' backward and
    the projection's two GEMMs, in C++.  The caller validated everything: one
    dtype and device for all tensors, ``x [N, in]`` with ``N`` the graph's
    source and destination nodes, the schedule ``plan`` for ``(GAT, width,
    H, x.dtype)`` (:class:`pyg_dfgnn.nn.GATConv`).  ``seed`` is the op's seed
    argument (:func:`pyg_dfgnn.ops._op_seed`: ``-1`` draws it in the op)."""
    return _ext().gat_layer(x, weight, att_src, att_dst, bias, *_layer_graph_args(graph, plan),
                            negative_slope, dropout_p, seed, width)


def transformer_layer_on(graph, plan, x: Tensor, lins, heads: int, chans: int, width: int,
                         scale: float, dropout_p: float, seed: int, gemv: bool,
                         keep_attn: bool = False) -> Tensor:
    """A Transformer layer's call on one node set (concatenated heads, no beta,
    no edge features), ``[N, heads * chans]``, as one op and
    one autograd node (``dfgnn_C::transformer_layer``, eager CUDA calls):
    q / k / v from one GEMM in the kernels' head ``width`` (weights stacked
    and zero-padded by one kernel), the skip projection, the fused dot
    attention, ``attention[..., :chans] + skip`` (or without a skip: its
    ``(weight, bias)`` ``(None, None)``); the backward's bias
    gradients are column sums, GEMVs where ``gemv``; with ``keep_attn`` the
    op keeps the attention output for the backward's Delta = <dO, O> at any
    head width (the layer's calls below the GPU-bound size: no Delta pass and
    no second skip GEMM in the backward, for one ``[N, heads, width]`` tensor
    more between forward and backward).  ``lins`` are the
    query, key, value and skip maps' ``(weight, bias)`` pairs (biases ``None``
    on q / k / v alike, on the skip alone).  The caller validated everything:
    one dtype and device, ``[heads * chans, in]`` weights, ``x [N, in]`` with ``N`` the graph's
    source and destination nodes, the schedule ``plan`` for ``(DOT, width,
    heads, x.dtype)`` (:class:`pyg_dfgnn.nn.TransformerConv`); ``seed`` as
    for :func:`gat_layer_on`."""
    (wq, bq), (wk, bk), (wv, bv), (ws, bs) = lins
    return _ext().transformer_layer(x, wq, bq, wk, bk, wv, bv, ws, bs,
                                    *_layer_graph_args(graph, plan), scale, dropout_p,
                                    seed, heads, chans, width, gemv, keep_attn)


def gatv2_layer_on(graph, plan, x: Tensor, lin_l, lin_r, att: Tensor, bias: Optional[Tensor],
                   heads: int, chans: int, width: int, negative_slope: float,
                   dropout_p: float, seed: int, gemv_proj: bool,
                   gemv_bias: bool, keep_attn: bool = False) -> Tensor:
    """A GATv2 layer's call on one node set (concatenated heads, no residual,
    no edge features), ``[N, heads * chans]``, as one op and one autograd node
    (``dfgnn_C::gatv2_layer``, eager CUDA calls): ``x_l`` / ``x_r`` projected in
    the kernels' head ``width`` (``lin_l`` / ``lin_r`` as ``(weight, bias)``;
    ``lin_r`` ``None``: shared weights), the fused GATv2 attention with ``att``
    (``[1, heads, chans]`` or ``[heads, chans]``) padded alike, the first
    ``chans`` columns + ``bias``; the bias gradients as column sums, GEMVs
    where ``gemv_proj`` / ``gemv_bias``; ``keep_attn`` as for
    :func:`transformer_layer_on` (no Delta pass in the backward).  The caller
    validated everything (:class:`pyg_dfgnn.nn.GATv2Conv`); ``plan`` is the schedule for ``(GATV2,
    width, heads, x.dtype)``; ``seed`` as for :func:`gat_layer_on`."""
    wr, br = lin_r if lin_r is not None else (None, None)
    return _ext().gatv2_layer(x, lin_l[0], lin_l[1], wr, br, att, bias,
                              *_layer_graph_args(graph, plan), negative_slope, dropout_p,
                              seed, heads, chans, width, gemv_proj, gemv_bias, keep_attn)


def agnn_layer_on(graph, plan, x: Tensor, beta: Tensor, eps: float) -> Tensor:
    """An AGNN layer's call on one node set, ``[N, F]``, as one op and one
    autograd node (``dfgnn_C::agnn_layer``, eager CUDA calls): the prologue
    kernel, the dot attention with keys = values = ``x`` and the key scale,
    and their backward kernels, beta's gradient from the row pass's score sum
    (:func:`pyg_dfgnn.ops.agnn_attention`'s two autograd Functions in one C++
    node).  The caller validated everything: a contiguous ``x [N, F]`` and a
    one-element ``beta`` of its dtype and device, the graph's N source and
    destination nodes, the schedule ``plan`` for ``(DOT, F, 1, x.dtype)``
    (:class:`pyg_dfgnn.nn.AGNNConv`)."""
    return _ext().agnn_layer(x, beta, *_layer_graph_args(graph, plan), eps)


def attention(*args) -> Tuple[Tensor, Tensor, Tensor]:
    """``attention_fwd(*args)`` (the op's 22 arguments) with autograd, by the
    cheapest correct route (:func:`attention_on`)."""
    kind = args[0]
    return attention_on(kind, _CSR(*args[1:7]), _Sched(*args[17:22]), *args[7:17])


# --------------------------------------------------------------------------- #
# the op on an edge_index (torch.compile)
# --------------------------------------------------------------------------- #

def _impls(t: Tensor):
    """The (forward, backward) implementations for tensors like ``t``."""
    if t.is_cuda:
        return _attention_fwd_cuda, _attention_bwd_cuda
    if t.device.type == "cpu":
        return _attention_fwd_cpu, _attention_bwd_cpu
    return ((lambda *a: attention_fwd(*a)), (lambda *a: attention_bwd(*a)))


#: the ops on an edge_index look the CSR up in Python when they run, which a
#: CUDA graph replay would skip (it would reuse the first batch's CSR): Inductor
#: must not capture them (``compile.mode=reduce-overhead`` partitions the graph
#: around them or runs without CUDA graphs)
_GRAPH_OP_TAGS = ((torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe")
                  else ())


def _graph_op(name: str):
    """``torch.library.custom_op(name)`` with :data:`_GRAPH_OP_TAGS` where this
    torch's ``custom_op`` takes tags (the capture check in :func:`_resolved`
    guards either way)."""
    import inspect
    kw = {"tags": _GRAPH_OP_TAGS} if (
        _GRAPH_OP_TAGS and "tags" in inspect.signature(torch.library.custom_op).parameters) \
        else {}
    return torch.library.custom_op(name, mutates_args=(), **kw)


def plan_of(graph, kind: int, src_feat: Tensor, value: Optional[Tensor]):
    """The schedule (:func:`pyg_dfgnn.schedule.plan_for`) of one call."""
    feat = value if value is not None else src_feat
    return plan_for(graph, kind, feat.size(-1) if feat.dim() == 3 else 1, src_feat.size(1),
                    src_feat.dtype)


def _resolved(kind: int, edge_index: Tensor, num_src: int, num_dst: int, self_loops: int,
              src_feat: Tensor, value: Optional[Tensor]):
    """The cached CSR conversion of ``edge_index`` and its schedule."""
    if edge_index.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "pyg_dfgnn: dfgnn::graph_attention_fwd/bwd look the graph up when they run and "
            "cannot be captured in a CUDA graph (a replay would reuse the captured batch's "
            "graph); use torch.compile mode 'default' or 'max-autotune-no-cudagraphs', or "
            "call the CSR op (dfgnn::attention_fwd) on a prepared CSRGraph")
    from ..graph import GraphRef
    graph = GraphRef(edge_index, num_src, num_dst,
                     None if self_loops < 0 else self_loops).resolve()
    return graph, plan_of(graph, kind, src_feat, value)


@_graph_op("dfgnn::graph_attention_fwd")
def graph_attention_fwd(kind: int, edge_index: Tensor, num_src: int, num_dst: int,
                        self_loops: int, dst_feat: Tensor, src_feat: Tensor,
                        value: Optional[Tensor], edge: Optional[Tensor], att: Optional[Tensor],
                        scale: float, negative_slope: float, dropout_p: float,
                        seed: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """:func:`attention_fwd` on an ``edge_index`` ``[2, E]`` (PyG's layout)
    instead of a CSR: the op converts it with the graph cache
    (:func:`pyg_dfgnn.graph.get_graph`, ``self_loops < 0`` = none) when it
    runs.  Output sizes depend on ``num_dst`` and the feature shapes only, so
    torch.compile traces a layer around it without a graph break.  Returns
    ``(out, lse)``; ``edge`` is in ``edge_index``'s order."""
    fwd, _ = _impls(src_feat)
    graph, plan = _resolved(kind, edge_index, num_src, num_dst, self_loops, src_feat, value)
    out, lse, _ = fwd(kind, graph.rowptr, graph.col, graph.perm, graph.t_rowptr, graph.t_col,
                      graph.t_perm, dst_feat, src_feat, value, edge, att, scale,
                      negative_slope, dropout_p, seed, False, plan.sched, plan.work,
                      plan.merge, plan.t_work, plan.t_merge)
    return out, lse


@graph_attention_fwd.register_fake
def _graph_attention_fwd_fake(kind, edge_index, num_src, num_dst, self_loops, dst_feat,
                              src_feat, value, edge, att, scale, negative_slope, dropout_p,
                              seed):
    return _fwd_outputs_like(kind, src_feat, value, num_dst, 0, False, att)[:2]


@_graph_op("dfgnn::graph_attention_bwd")
def graph_attention_bwd(kind: int, edge_index: Tensor, num_src: int, num_dst: int,
                        self_loops: int, dst_feat: Tensor, src_feat: Tensor,
                        value: Optional[Tensor], edge: Optional[Tensor], att: Optional[Tensor],
                        scale: float, negative_slope: float, dropout_p: float,
                        seed: Optional[Tensor], out: Tensor, lse: Tensor,
                        grad_out: Tensor) -> List[Tensor]:
    """Backward of :func:`graph_attention_fwd` (the conversion is a cache hit)."""
    _, bwd = _impls(src_feat)
    graph, plan = _resolved(kind, edge_index, num_src, num_dst, self_loops, src_feat, value)
    return list(bwd(kind, graph.rowptr, graph.col, graph.perm, graph.t_rowptr, graph.t_col,
                    graph.t_perm, dst_feat, src_feat, value, edge, att, scale, negative_slope,
                    dropout_p, seed, out, lse, grad_out.contiguous(), plan.sched, plan.work,
                    plan.merge, plan.t_work, plan.t_merge))


@graph_attention_bwd.register_fake
def _graph_attention_bwd_fake(kind, edge_index, num_src, num_dst, self_loops, dst_feat,
                              src_feat, value, edge, att, scale, negative_slope, dropout_p,
                              seed, out, lse, grad_out):
    return _bwd_outputs_like(src_feat, dst_feat, src_feat, value, edge, att)


def _graph_setup_context(ctx, inputs, output):
    (kind, edge_index, num_src, num_dst, self_loops, dst_feat, src_feat, value, edge, att,
     scale, negative_slope, dropout_p, seed) = inputs
    out, lse = output
    ctx.args = (kind, num_src, num_dst, self_loops, scale, negative_slope, dropout_p)
    ctx.save_for_backward(edge_index, dst_feat, src_feat, value, edge, att, seed, out, lse)
    ctx.mark_non_differentiable(lse)


def _graph_backward(ctx, grad_out, _grad_lse):
    edge_index, dst_feat, src_feat, value, edge, att, seed, out, lse = ctx.saved_tensors
    kind, num_src, num_dst, self_loops, scale, slope, p = ctx.args
    grads = graph_attention_bwd(
        kind, edge_index, num_src, num_dst, self_loops, dst_feat, src_feat, value, edge, att,
        scale, slope, p, seed, out, lse, grad_out)
    return (None,) * 5 + _input_grads(grads, value, edge, att) + (None,) * 4


graph_attention_fwd.register_autograd(_graph_backward, setup_context=_graph_setup_context)


def graph_attention(kind: int, ref, dst_feat: Tensor, src_feat: Tensor,
                    value: Optional[Tensor], edge: Optional[Tensor], att: Optional[Tensor],
                    scale: float, negative_slope: float, dropout_p: float,
                    seed: Optional[Tensor]) -> Tensor:
    """``out`` of :func:`graph_attention_fwd` for a
    :class:`~pyg_dfgnn.graph.GraphRef` ``ref``, with autograd."""
    loops = -1 if ref.self_loops is None else ref.self_loops
    out, _ = graph_attention_fwd(kind, ref.edge_index, ref.num_src, ref.num_dst, loops,
                                 dst_feat, src_feat, value, edge, att, scale, negative_slope,
                                 dropout_p, seed)
    return out
