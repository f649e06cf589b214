"""Projections written straight into the padded feature layout of the kernels.

The CUDA kernels load every head's features as 16- (or 8-) byte vectors, so a
head width ``C`` that is not a multiple of the vector (8 x 10, 8 x 19, ...) is
zero-padded to ``Cp`` (:func:`pyg_dfgnn.schedule.padded_width`).  When the
op pads, that costs a copy of every feature tensor in the forward pass and of
the output and every gradient in the backward pass (measured on an H100:
0.8 ms of 5.9 ms for a Transformer 8 x 19 forward+backward on a 1.6M-edge
graph).  A layer avoids those copies by producing its projections in the padded
layout: the weight ``[H*C, in]`` is padded with zero rows to ``[H*Cp, in]``
(a tiny op on the parameter, differentiable), so ``x W_p^T`` is the projection
with zero columns, computed by the same GEMM.  The op then sees ``Cp`` and
pads nothing; the layer slices the ``C`` real columns out of the result in the
pass that adds the bias / skip connection anyway.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..schedule import half_x5, op_width, padded_width
from ._glue import apply_linear, linear, padded_weight


#: below this many projected elements (rows x heads x features) a layer call is
#: host-bound: the extra autograd ops of a weight-side rewrite (padding the
#: weight, folding the attention vectors) cost more host time than the GPU
#: passes they save, and the op's own padding (inside the C++ op, no autograd
#: nodes) is cheaper.  Measured on H100/H200 (docs/KERNELS.md): a PATTERN batch
#: (26-128 graphs, 0.5-3.9M elements) got slower, a 100k-node graph (8-26M)
#: faster.  (The Transformer pads its small calls too, where the op would: its
#: fused q / k / v GEMM makes that cheaper on both counts, see kernel_width.)
GPU_BOUND_ELEMENTS = 1 << 22


def gpu_bound(rows: int, heads: int, chans: int) -> bool:
    """Whether a layer call of this size is GPU-bound (see GPU_BOUND_ELEMENTS)."""
    return rows * heads * chans >= GPU_BOUND_ELEMENTS


def kernel_width(chans: int, x: Tensor, heads: int = 1, kind: int = -1,
                 pad_small: bool = False) -> int:
    """The head width a layer of model ``kind`` (0 GAT, 1 GATv2, 2 dot) should
    project to for the CUDA kernels on a GPU-bound call: the width the kernels
    take as it is in fp32, for GAT and for dot attention's and AGNN's fp16 /
    bf16 heads of 2 mod 4 up to 10 (:func:`pyg_dfgnn.schedule.op_width`,
    :func:`pyg_dfgnn.schedule.half_x5`), else the padded width for ``x``'s
    dtype.  On a smaller CUDA call, with ``pad_small``, the width the op would
    pad to anyway (:func:`pyg_dfgnn.schedule.op_width`: ``chans`` where the
    kernels take it as it is, e.g. 8 x 10 fp32; the padded width for those
    half heads of 2 mod 4), so that the projection
    writes it and the op copies nothing -- the Transformer's choice, whose
    q / k / v then come from one GEMM (GPU time of a forward+backward on PATTERN
    batches 0.81-0.86x, wall time 0.87-1.0x; GAT's and GATv2's own padded
    projections saved 4-9 % GPU time but cost 4-18 % more wall time there, so
    they let the op pad: docs/KERNELS.md, session 17); else ``chans``.
    ``chans`` on the CPU and in float64."""
    if not x.is_cuda or x.dtype == torch.float64:
        return chans
    dt = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else x.dtype
    if not gpu_bound(x.size(0), heads, chans):
        if not pad_small:
            return chans
        # (dot attention's and AGNN's half heads of 2 mod 4, which the op takes
        # as they are on five 4-byte vectors: padded to the 8-byte width on
        # these calls, whose gathered rows sit in L2, where three 8-byte chunks
        # are faster -- the Transformer 8 x 10 bf16 on PATTERN x128: layer GPU
        # forward+backward 1.08x on the five chunks, H200, session 40)
        return padded_width(chans, dt) if half_x5(chans, dt, kind) else op_width(chans, dt, kind)
    if kind == 0 or dt == torch.float32 or half_x5(chans, dt, kind):
        # widths the kernels take as they are stay unpadded: fp32 heads of 10 on
        # 8-byte vectors (every kind; the vector-score kinds on a tile of five
        # of them, one lane per head), GAT's half-precision widths of 2 mod 4 on
        # 4-byte vectors.  The projections, the saved output, the output
        # gradient and the input gradients are a sixth smaller at 8 x 10, and
        # the kernels are faster than at the padded 12 (layer GPU
        # forward+backward on the 100k graphs, H200: GAT 0.89-0.91x, the
        # Transformer 0.89-0.90x, GATv2 0.93x; docs/KERNELS.md, sessions 26
        # and 28), and dot attention's and AGNN's fp16 / bf16 heads of 2, 6
        # and 10 on one lane of five 4-byte vectors (schedule.half_x5, session
        # 40).  GATv2's fp16 / bf16 heads of 10 pad to 12: on 4-byte vectors
        # its kernels took 1.6-1.7x longer (session 17)
        return op_width(chans, dt, kind)
    return padded_width(chans, dt)


def paddable(lin, heads: int, chans: int) -> bool:
    """Whether ``lin`` is a plain linear map with an initialised ``[heads*chans,
    in]`` weight, whose rows :func:`padded_linear` can pad."""
    w = getattr(lin, "weight", None)
    return (isinstance(w, Tensor)
            and not isinstance(w, torch.nn.parameter.UninitializedParameter)
            and w.dim() == 2 and w.size(0) == heads * chans)


def padded_linear(lin, x: Tensor, heads: int, chans: int, width: int) -> Optional[Tensor]:
    """``lin(x)`` as ``[N, heads, width]`` with zero columns ``chans..width-1``
    in every head, from one GEMM (``lin(x)`` viewed as ``[N, heads, chans]``
    when ``width == chans``); ``None`` when padding is asked for but ``lin`` is
    not :func:`paddable`, and the caller uses its usual path.  The bias
    gradient is a GEMV on GPU-bound CUDA calls (:mod:`._glue`)."""
    if width == chans:
        return apply_linear(lin, x).view(-1, heads, chans)
    if not paddable(lin, heads, chans):
        return None
    # the padded weight and bias from one op (one kernel on CUDA) and one
    # autograd node (:func:`._glue.padded_weight`)
    wp, bp = padded_weight(lin.weight, getattr(lin, "bias", None), heads, chans, width)
    return linear(x, wp, bp).view(-1, heads, width)


def unpad(out: Tensor, chans: int) -> Tensor:
    """The ``chans`` real columns of a padded ``[N, H, width]`` result (a view)."""
    return out if out.size(-1) == chans else out[..., :chans]
