r"""The layers' projections and bias adds with cheap bias gradients.

A bias added to ``[N, D]`` rows has the gradient :math:`\sum_n g_{n,:}`, a
column sum over the N rows.  Autograd computes it as ``grad.sum(0)``, which on
CUDA runs ATen's generic reduction: for the few-hundred-wide rows of an
attention layer it reached 0.4-0.6 TB/s on an H100 (session 11,
docs/KERNELS.md), and a Transformer layer's four projections spent 0.24 ms of
a 2.7 ms forward+backward in it.  The same sum as a matrix-vector product
:math:`g^\top \mathbf{1}` runs in cuBLAS' GEMV at memory speed.

:func:`linear` (``x W^T + b``, the projection) and :func:`add_bias` (``x + b``,
the layers' output bias) are autograd functions whose backward does exactly
that; the other gradients are autograd's own formulas (``g W`` and ``g^T x``).
Under autocast they compute in the autocast dtype as ``F.linear`` would (the
inputs cast, the gradients returned in each input's own dtype).  They are used
on GPU-bound CUDA calls with autograd on, outside ``torch.compile`` only
(:func:`_use`): on the CPU the reduction is not the bottleneck, small eager
calls would feel the autograd Function's host time, and Inductor generates its
own reductions.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor


def _column_sum(g2: Tensor) -> Tensor:
    """``g2.sum(0)`` for a 2-D ``g2``, as a GEMV against ones (fp32 accumulation
    in cuBLAS for fp16/bf16 as in ATen's reduction)."""
    return torch.mv(g2.t(), g2.new_ones(g2.size(0)))


def _autocast_dtype(x: Tensor) -> Optional[torch.dtype]:
    if x.is_cuda and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return None


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor],
                dtype: Optional[torch.dtype]) -> Tensor:
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        if dtype is not None:   # autocast: compute in its dtype, as F.linear would
            x, weight = x.to(dtype), weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        dx_t, dw_t, db_t = ctx.dtypes
        grad = grad.to(x.dtype)
        g2 = grad.reshape(-1, grad.size(-1))
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = (grad @ weight).to(dx_t)
        if ctx.needs_input_grad[1]:
            dw = (g2.t() @ x.reshape(-1, x.size(-1))).to(dw_t)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = _column_sum(g2).to(db_t)
        return dx, dw, db, None


class _AddBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, bias: Tensor) -> Tensor:
        ctx.bias_shape, ctx.bias_dtype = bias.shape, bias.dtype
        return x + bias

    @staticmethod
    def backward(ctx, grad: Tensor):
        db = None
        if ctx.needs_input_grad[1]:
            g2 = grad.reshape(-1, ctx.bias_shape.numel())
            db = _column_sum(g2).view(ctx.bias_shape).to(ctx.bias_dtype)
        return grad if ctx.needs_input_grad[0] else None, db


def _use(x: Tensor, rows: int, width: int) -> bool:
    """Whether the GEMV form pays: a GPU-bound CUDA call with autograd on,
    outside torch.compile (:func:`._padded.gpu_bound`: an autograd Function adds
    ~8 us of host time forward and ~24 us over forward+backward, which small
    eager calls would feel).  The choice depends on the call's size only, never
    on whether a CUDA graph is being captured: a replayed step computes what the
    same eager step computes (tests/train/test_graphed.py)."""
    if not x.is_cuda or torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return False
    from ._padded import gpu_bound   # (_padded imports this module)
    return gpu_bound(rows, 1, width)


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, weight, bias)`` whose bias gradient is a GEMV (see the
    module docstring); ``F.linear`` itself where that does not pay (no bias, CPU,
    small eager calls, torch.compile, no grad)."""
    if bias is None or not _use(x, x.numel() // max(x.size(-1), 1), weight.size(0)):
        return F.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias, _autocast_dtype(x))


def add_bias(x: Tensor, bias: Tensor) -> Tensor:
    """``x + bias`` (``bias`` of the shape of ``x``'s trailing dimensions) whose
    bias gradient is a GEMV; the plain sum where that does not pay."""
    if (bias.dim() == 0 or bias.dim() > x.dim() or x.shape[x.dim() - bias.dim():] != bias.shape
            or not _use(x, x.numel() // max(bias.numel(), 1), bias.numel())):
        return x + bias
    return _AddBias.apply(x, bias)


def apply_linear(lin, x: Tensor) -> Tensor:
    """``lin(x)`` through :func:`linear` when ``lin`` is a plain linear map
    (a 2-D initialised ``weight`` and an optional ``bias``, no hooks), else
    ``lin(x)`` itself."""
    w = getattr(lin, "weight", None)
    if (isinstance(w, Tensor) and getattr(lin, "bias", None) is not None
            and not isinstance(w, torch.nn.parameter.UninitializedParameter)
            and w.dim() == 2 and type(lin).forward in _PLAIN_FORWARDS
            and not (lin._forward_hooks or lin._forward_pre_hooks or _global_hooks())):
        return linear(x, w, lin.bias)
    return lin(x)


def _global_hooks() -> bool:
    m = torch.nn.modules.module
    return bool(m._global_forward_hooks or m._global_forward_pre_hooks)


def _plain_forwards():
    fw = {torch.nn.Linear.forward}
    try:
        from torch_geometric.nn.dense.linear import Linear as PygLinear
        fw.add(PygLinear.forward)
    except ImportError:  # pragma: no cover
        pass
    return fw


_PLAIN_FORWARDS = _plain_forwards()


# --------------------------------------------------------------------------- #
# several projections of one input as one GEMM
# --------------------------------------------------------------------------- #

def pad_heads(t: Tensor, heads: int, chans: int, width: int) -> Tensor:
    """Rows of a ``[heads * chans, ...]`` weight / bias padded with zeros to
    ``width`` per head (:mod:`._padded`)."""
    if width == chans:
        return t
    v = t.reshape(heads, chans, -1)
    return F.pad(v, (0, 0, 0, width - chans)).reshape(heads * width, *t.shape[1:])


def _unpad_rows(t: Tensor, heads: int, chans: int, width: int) -> Tensor:
    """The inverse of :func:`pad_heads`: rows ``chans..width-1`` of every head
    of a ``[heads * width, ...]`` tensor dropped (one copy; ``t`` itself when
    nothing is padded)."""
    if width == chans:
        return t
    return t.view(heads, width, -1)[:, :chans].reshape(heads * chans, *t.shape[1:])


def _stack_padded(ts, heads: int, chans: int, width: int) -> Tensor:
    """``torch.cat([pad_heads(t, heads, chans, width) for t in ts])`` as one
    concatenation and one pad (three kernels for any number of maps)."""
    t = ts[0] if len(ts) == 1 else torch.cat(ts)
    return pad_heads(t, len(ts) * heads, chans, width)   # (n maps = n x heads heads)


def padded_params(ws, bs, heads: int, chans: int, width: int):
    """``(W, b)``: the weights ``ws`` (``[heads * chans, in]`` each) and biases
    ``bs`` (``[heads * chans]`` each, or ``None``) stacked, rows padded with
    zeros to ``width`` per head (:func:`_stack_padded` of each).  On CUDA one
    op and one kernel (``dfgnn_C::stack_pad_heads``, cuda/pad_heads.cu) instead
    of ~10 ATen ops and 6 kernels: a GPU-bound call rebuilds them from the
    current parameters every time, before its GEMM can start (host time,
    docs/KERNELS.md, session 17).  No autograd: the caller differentiates."""
    if ws[0].is_cuda and len(ws) <= 8 and not torch.compiler.is_compiling() \
            and _uniform(ws, 2, heads * chans) \
            and (bs is None or (_uniform(bs, 1, heads * chans)
                                and bs[0].element_size() == ws[0].element_size())):
        # (checked here: the op's own checks throw C++ exceptions, which must not
        # be what a caller relies on)
        from ..ops.fused import _ext
        w, b = _ext().stack_pad_heads(list(ws), [] if bs is None else list(bs),
                                      heads, chans, width)
        return w, (None if bs is None else b)
    return (_stack_padded(ws, heads, chans, width),
            None if bs is None else _stack_padded(bs, heads, chans, width))


class _PaddedParams(torch.autograd.Function):
    """:func:`padded_params` of one map with autograd: the gradients of the
    padded weight and bias are theirs with the padding rows dropped (one
    autograd node and one op instead of a pad and its backward per tensor)."""

    @staticmethod
    def forward(ctx, meta, w, b):
        ctx.meta = meta
        wp, bp = padded_params([w], None if b is None else [b], *meta)
        return wp, bp

    @staticmethod
    def backward(ctx, dw, db):
        heads, chans, width = ctx.meta
        return (None, None if dw is None else _unpad_rows(dw, heads, chans, width),
                None if db is None else _unpad_rows(db, heads, chans, width))


def padded_weight(w: Tensor, b: Optional[Tensor], heads: int, chans: int, width: int):
    """``(pad_heads(w), pad_heads(b))``, differentiable, from one op on CUDA
    (:func:`padded_params`); the ATen pads themselves while compiling
    (Inductor traces and fuses them; the CUDA op has no fake kernel)."""
    if torch.compiler.is_compiling():
        return (pad_heads(w, heads, chans, width),
                None if b is None else pad_heads(b, heads, chans, width))
    if not torch.is_grad_enabled() or not (w.requires_grad or (b is not None and b.requires_grad)):
        return padded_params([w], None if b is None else [b], heads, chans, width)
    return _PaddedParams.apply((heads, chans, width), w, b)


def _uniform(ts, dim: int, rows: int) -> bool:
    """Tensors of one dtype and device, ``dim`` dimensions, ``rows`` rows and
    one shape: what ``dfgnn_C::stack_pad_heads`` takes."""
    t0 = ts[0]
    return all(t.dim() == dim and t.size(0) == rows and t.shape == t0.shape
               and t.dtype == t0.dtype and t.device == t0.device for t in ts)


def _affine(x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
    """``x W^T (+ b)`` as one GEMM."""
    return x @ w.t() if b is None else torch.addmm(b, x, w.t())


def _bias_grad(g: Tensor, gemv: bool) -> Tensor:
    """The column sum of a 2-D gradient: a GEMV where :func:`_use` said so."""
    return _column_sum(g) if gemv else g.sum(0)


def _project(meta, x: Tensor, params):
    """The GEMM of :class:`_Projections`: ``(x, W)`` as used (in the autocast
    dtype) and the ``n`` column-block views ``[N, heads, width]``."""
    heads, chans, width, dtype = meta[:4]
    ws, bs = params[0::2], params[1::2]   # (biases: all tensors, or all None)
    w, b = padded_params(ws, None if bs[0] is None else bs, heads, chans, width)
    if dtype is not None:   # autocast: compute in its dtype, as F.linear would
        x, w = x.to(dtype), w.to(dtype)
        b = None if b is None else b.to(dtype)
    y = _affine(x, w, b)
    return x, w, tuple(t.view(-1, heads, width) for t in y.split(heads * width, dim=1))


def _block_buffer(grads, n: int, w: int, dtype: torch.dtype) -> Optional[Tensor]:
    """The ``[n, len(grads) * w]`` buffer whose consecutive column blocks the
    gradients ``grads`` (``[n, heads, width]``, ``w = heads * width``) are, as
    the fused attention's backward writes them for q / k / v given as the
    blocks of one projection output (``dfgnn_C::attention_bwd_blocks``); else
    ``None`` (the caller concatenates)."""
    nb = len(grads)
    g0 = grads[0]
    if n == 0 or any(g is None or g.dtype != dtype for g in grads) or g0.dim() != 3:
        return None
    es, ptr = g0.element_size(), g0.data_ptr()
    for i, g in enumerate(grads):
        if (g.numel() != n * w or g.stride(-1) != 1 or g.stride(1) != g.size(2)
                or (n > 1 and g.stride(0) != nb * w) or g.data_ptr() != ptr + i * w * es
                or g.untyped_storage().data_ptr() != g0.untyped_storage().data_ptr()):
            return None
    if g0.storage_offset() + (n - 1) * nb * w + nb * w > g0.untyped_storage().nbytes() // es:
        return None
    return g0.as_strided((n, nb * w), (nb * w, 1))


class _Projections(torch.autograd.Function):
    """``[x W_i^T + b_i]`` for ``n`` linear maps of one ``x`` (``[heads * chans,
    in]`` weights, rows padded to ``width`` per head) as one GEMM and one
    autograd node: the outputs are column blocks of ``[N, n * heads * width]``
    (row-strided ``[N, heads, width]`` views), the backward concatenates their
    gradients once and runs one GEMM each for ``d_x`` and ``d_W`` and one column
    sum for ``d_b`` (a GEMV where :func:`_use` says so).  Replaces ``n`` linear
    layers' forward ops and their ``n`` ``AddmmBackward`` / ``TBackward`` nodes
    plus the ``n - 1`` additions of the ``d_x`` branches (the host time of an
    attention layer call).

    ``meta[5]`` is ``n``; a last ``(W, b)`` pair beyond it is an *extra* map of
    the same ``x`` computed by a GEMM of its own into its own ``[N, out]``
    tensor (the Transformer's skip projection: its output dies after the layer's
    add, where a column block would live as long as the blocks the attention
    keeps for backward), in the same autograd node: its ``d_x`` is accumulated
    into the blocks' by the same GEMM call (``addmm``), with no second node and
    no addition of ``d_x`` branches."""

    @staticmethod
    def forward(ctx, meta, x, *params):
        ws, bs = params[0::2], params[1::2]
        nb = meta[5]
        ctx.dtypes = (x.dtype, [w.dtype for w in ws], [None if b is None else b.dtype for b in bs])
        ctx.meta, ctx.n = meta, nb
        xc, w, outs = _project(meta, x, params[:2 * nb])
        if len(ws) == nb:
            ctx.save_for_backward(xc, w)
            return outs
        we, be = ws[nb], bs[nb]
        dtype = meta[3]
        if dtype is not None:
            we = we.to(dtype)
            be = None if be is None else be.to(dtype)
        ctx.save_for_backward(xc, w, we)
        ctx.extra_bias = be is not None
        return (*outs, _affine(xc, we, be))

    @staticmethod
    def backward(ctx, *grads):
        x, w = ctx.saved_tensors[:2]
        heads, chans, width, _, gemv, nb = ctx.meta
        x_dt, w_dts, b_dts = ctx.dtypes
        n = x.size(0)
        need = ctx.needs_input_grad
        g = _block_buffer(grads[:nb], n, heads * width, x.dtype)
        if g is None:
            g = torch.cat([(gi if gi is not None else x.new_zeros(n, heads, width))
                           .reshape(n, heads * width).to(x.dtype) for gi in grads[:nb]],
                          dim=1)
        dx = (g @ w) if need[1] else None
        dw = (g.t() @ x) if any(need[2:2 + 2 * nb:2]) else None
        db = _bias_grad(g, gemv) if any(need[3:3 + 2 * nb:2]) and b_dts[0] is not None else None
        # the padding rows dropped from all maps at once (one copy per kind),
        # then each map's rows as a view
        dws, dbs = ([None] * nb if d is None else
                    _unpad_rows(d, nb * heads, chans, width).split(heads * chans)
                    for d in (dw, db))
        out = []
        for i in range(nb):
            out += [None if dws[i] is None else dws[i].to(w_dts[i]),
                    None if dbs[i] is None else dbs[i].to(b_dts[i])]
        if len(ctx.saved_tensors) == 3:   # the extra map
            we = ctx.saved_tensors[2]
            ge = grads[nb]
            dwe = dbe = None
            if ge is not None:
                ge = ge.reshape(n, we.size(0)).to(x.dtype)   # (n may be 0)
                if dx is not None:
                    dx = dx.addmm_(ge, we)
                if need[2 + 2 * nb]:
                    dwe = (ge.t() @ x).to(w_dts[nb])
                if ctx.extra_bias and need[3 + 2 * nb]:
                    dbe = _bias_grad(ge, gemv).to(b_dts[nb])
            out += [dwe, dbe]
        return (None, None if dx is None else dx.to(x_dt), *out)


def _plain_params(lin):
    """``(weight, bias)`` of a linear map :class:`_Projections` and the layer
    ops can run themselves, else ``None``: a module with PyTorch's or PyG's own
    forward, no hooks, a 2-D initialised weight, a tensor or no bias.  Read
    from the module's ``_parameters`` where both are registered there (each
    lookup through ``Module.__getattr__`` costs ~1 us on a layer call's host
    path: docs/KERNELS.md, session 31), else as attributes (e.g. a
    parametrized weight)."""
    if (not isinstance(lin, torch.nn.Module) or type(lin).forward not in _PLAIN_FORWARDS
            or lin._forward_hooks or lin._forward_pre_hooks):
        return None
    params = lin._parameters
    if "weight" in params and "bias" in params:
        w, b = params["weight"], params["bias"]
    else:
        w, b = getattr(lin, "weight", None), getattr(lin, "bias", None)
    # (the common types first: isinstance against Parameter's subclasses runs
    # its metaclass's check, about a microsecond per call)
    if type(w) not in _PLAIN_TENSORS or type(b) not in _PLAIN_BIASES:
        if (not isinstance(w, Tensor) or not isinstance(b, (Tensor, type(None)))
                or isinstance(w, torch.nn.parameter.UninitializedParameter)):
            return None
    if w.dim() != 2:
        return None
    return w, b


_PLAIN_TENSORS = (torch.nn.Parameter, Tensor)
_PLAIN_BIASES = (torch.nn.Parameter, Tensor, type(None))


def _plain(lin) -> bool:
    """Whether :func:`_plain_params` takes the linear map ``lin``."""
    return _plain_params(lin) is not None


def fused_projections(lins, x: Tensor, heads: int, chans: int, width: int, extra=None):
    """``[lin(x).view(-1, heads, chans)]`` for the plain linear maps ``lins``
    (weights ``[heads * chans, in]``, biases on all or none, no hooks) of one ``x``, in
    the kernels' padded head ``width``, as column blocks of one GEMM's output
    (:class:`_Projections`; row-strided ``[N, heads, width]`` views, which the
    CUDA dot-attention kernels read as they are).  With ``extra`` (a plain
    linear map of ``x`` of any width), ``extra(x)`` as a last ``[N, out]``
    output from a GEMM of its own in the same autograd node (with autograd
    only; the caller folds it into the blocks without).  ``None`` where a map
    is not plain (the caller projects one by one)."""
    params = []
    for lin in lins:
        if (not _plain(lin) or lin.weight.size(0) != heads * chans
                or (lin.bias is None) != (lins[0].bias is None)):
            return None
        params += [lin.weight, lin.bias]
    if _global_hooks():
        return None
    nb = len(lins)
    if not torch.is_grad_enabled() or not (
            x.requires_grad or any(p is not None and p.requires_grad for p in params)):
        # nothing to differentiate (inference, validation): the GEMM without
        # the autograd Function's Python wrapper
        return _project((heads, chans, width, _autocast_dtype(x), False, nb), x, params)[2]
    if extra is not None:
        if not _plain(extra) or extra.weight.size(1) != x.size(-1):
            return None
        params += [extra.weight, extra.bias]
    # (whether the bias gradient is a GEMV is decided here: grad mode is off
    # inside an autograd Function's forward, which _use reads)
    gemv = _use(x, x.size(0), nb * heads * width)
    return _Projections.apply((heads, chans, width, _autocast_dtype(x), gemv, nb), x, *params)
