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
