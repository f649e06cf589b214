"""Dot attention's residual (``ops.dot_attention(..., residual=r)``: the
output is ``o_i[:, :C] + r_i``, a Transformer layer's root weight).  Eager
CUDA calls without autograd add it in the kernels' epilogue
(``dfgnn_C::attention_fwd_residual``); every other call adds it after the op.

Every comparison draws fresh random inputs and measures errors against float64.
Half precision follows the FlashAttention rule: the error of the folded sum
must be within a small multiple of the error of the same computation done the
unfused way at the same precision (the op's output rounded, then PyTorch's add
rounded again), plus a few unit roundoffs.
"""
import pytest
import torch

from pyg_dfgnn import ops, schedule
from pyg_dfgnn.graph import get_graph
from _cases import random_graph
from test_key_scale import spy_ext

CUDA = torch.cuda.is_available()
#: cuda: marked, so `pytest -m cuda` runs it on a GPU machine (skipped without one)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _problem(device, dtype, heads, F, C, layout, edge, seed):
    """q / k / v ``[N, H, F]`` and the residual ``[N_dst, H, C]`` laid out as
    ``layout`` says: ``contiguous``; ``block`` (the 4th column block of one
    ``[N, 4 H F]`` tensor, sliced to ``C``: what TransformerConv hands over);
    ``unaligned`` (rows that are not 16-byte aligned: the op copies them)."""
    gen = torch.Generator().manual_seed(seed)
    ns, nd = 90, 70
    ei = random_graph(ns, nd, 900, self_loops=False, super_node=(400, 3),
                      generator=gen).to(device)
    g = get_graph(ei, (ns, nd))

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    q, k, v = r(nd, heads, F), r(ns, heads, F), r(ns, heads, F)
    if F > C:   # a padded projection: zero columns C..F-1 in every head
        for t in (q, k, v):
            t[..., C:] = 0
    e = r(ei.size(1), heads, F) if edge else None
    if e is not None and F > C:
        e[..., C:] = 0
    res64 = r(nd, heads, C)
    if layout == "contiguous":
        res = res64.to(device, dtype)
    elif layout == "block":
        y = torch.randn(nd, 4 * heads * F, generator=gen, dtype=torch.float64)
        y = y.to(device, dtype)
        res = y[:, 3 * heads * F:].view(nd, heads, F)[..., :C]
        res.copy_(res64.to(dtype))
        assert not res.is_contiguous() and res.stride(1) == F
    else:
        y = torch.empty(nd * heads * C + 1, dtype=dtype, device=device)
        res = y[1:].view(nd, heads, C)
        res.copy_(res64.to(dtype))
    res64 = res.detach().to("cpu", torch.float64)
    low = [t.to(device, dtype) if t is not None else None for t in (q, k, v, e)]
    exact = [t.to(device, dtype).to("cpu", torch.float64) if t is not None else None
             for t in (q, k, v, e)]
    return g, ei, low, exact, res, res64


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,F,C", [(4, 64, 64), (8, 12, 10), (8, 20, 19), (8, 10, 10),
                                       (1, 8, 8), (2, 152, 150)])
@pytest.mark.parametrize("layout", ["contiguous", "block", "unaligned"])
@pytest.mark.parametrize("split", [None, 16])
def test_residual_against_float64(device, dtype, heads, F, C, layout, split, monkeypatch):
    """Without autograd: the output ``[N_dst, H, C]`` against float64, within
    2x the error of the unfused sum at the same precision (+ 4 roundoffs of the
    output's scale); rows without edges are the residual itself; on CUDA the
    epilogue op ran (once per call)."""
    if device == "cuda" and not CUDA:
        pytest.skip("needs CUDA")
    edge = heads == 8 and F == 12
    g, ei, low, exact, res, res64 = _problem(device, dtype, heads, F, C, layout, edge,
                                              seed=heads * 1000 + F * 10 + C)
    used = spy_ext(monkeypatch, "attention_fwd_residual") if device == "cuda" else []
    with torch.no_grad(), schedule.override(split=split):
        out, _ = ops.dot_attention(g, *low[:3], low[3], residual=res)
        o, _ = ops.dot_attention(g, *low[:3], low[3])
    assert used == ([1] if device == "cuda" else [])
    base = o[..., :C] + res
    o64, _ = ops.dot_attention(get_graph(ei.cpu(), (g.num_src, g.num_dst)), *exact[:3],
                               exact[3])
    want = o64[..., :C] + res64
    assert out.shape == (g.num_dst, heads, C) and out.dtype == dtype and out.is_contiguous()
    err = float((out.to("cpu", torch.float64) - want).abs().max())
    err_base = float((base.to("cpu", torch.float64) - want).abs().max())
    u = torch.finfo(dtype).eps
    assert err <= 2 * err_base + 4 * u * float(want.abs().max()), (err, err_base)
    empty = g.rowptr.diff() == 0
    assert empty.any() and torch.equal(out[empty], res[empty].contiguous())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_with_autograd_adds_after_the_op(device, dtype, monkeypatch):
    """With a gradient to record the residual is added after the op (the
    epilogue op has no backward): the output is the op's, sliced, plus the
    residual, and the gradients of q, k and v are those of the op without it,
    to the bit; the residual's gradient is ``grad_out``."""
    if device == "cuda" and not CUDA:
        pytest.skip("needs CUDA")
    heads, F, C = 8, 20, 19
    g, ei, low, exact, res, res64 = _problem(device, dtype, heads, F, C, "block", False, 7)
    used = spy_ext(monkeypatch, "attention_fwd_residual") if device == "cuda" else []
    leaves = [t.requires_grad_(True) for t in low[:3]]
    res = res.detach().clone().requires_grad_(True)
    out, _ = ops.dot_attention(g, *leaves, residual=res)
    assert used == []
    gout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(device, dtype)
    grads = torch.autograd.grad(out, leaves + [res], gout)
    plain = [t.detach().clone().requires_grad_(True) for t in low[:3]]
    o, _ = ops.dot_attention(g, *plain)
    assert torch.equal(out, o[..., :C] + res)
    want = torch.autograd.grad(o[..., :C], plain, gout)
    for a, w in zip(grads[:3], want):
        assert torch.equal(a, w)
    assert torch.equal(grads[3], gout)


def test_residual_is_validated():
    """Bad residuals raise ValueError naming the argument."""
    g, ei, low, exact, res, res64 = _problem("cpu", torch.float32, 2, 8, 8, "contiguous",
                                              False, 0)
    q, k, v, _ = low
    with pytest.raises(ValueError, match="'residual' has 69 rows"):
        ops.dot_attention(g, q, k, v, residual=res[:-1])
    with pytest.raises(ValueError, match="'residual' has 3 heads"):
        ops.dot_attention(g, q, k, v, residual=torch.zeros(g.num_dst, 3, 8))
    with pytest.raises(ValueError, match="'residual' has 9 features per head"):
        ops.dot_attention(g, q, k, v, residual=torch.zeros(g.num_dst, 2, 9))
    with pytest.raises(ValueError, match="'residual' must have shape"):
        ops.dot_attention(g, q, k, v, residual=torch.zeros(g.num_dst, 16))
    with pytest.raises(ValueError, match="'residual' cannot be combined with 'key_scale'"):
        ops.dot_attention(g, q, k, v, residual=res, key_scale=torch.ones(g.num_src, 2))
