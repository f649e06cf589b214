"""Dot attention's q / k / v as row-strided column blocks of one tensor (what
``nn.TransformerConv`` hands over: the blocks of one projection GEMM's output,
``nn/_glue.py: fused_projections``).  The CUDA kernels read them with a row
stride; the result must be the one of contiguous copies: the same kernels on
the same numbers, so equal to the last bit."""
import pytest
import torch

from pyg_dfgnn import ops
from pyg_dfgnn.graph import get_graph
from _cases import random_graph

#: cuda: marked, so `pytest -m cuda` runs it on a GPU machine (skipped without one)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,F,extra", [(8, 12, 0), (4, 16, 0), (2, 64, 8), (8, 10, 0),
                                           (8, 20, 1), (1, 8, 3)])
@pytest.mark.parametrize("edge", [False, True])
def test_column_blocks_equal_contiguous_rows(device, dtype, heads, F, extra, edge):
    """``extra`` trailing columns make the row stride longer than three blocks
    (8 x 20 + 1: a stride that is not a 16-byte multiple, which the op copies;
    8 x 10: a width the op pads).  Outputs and the gradients of q, k, v and the
    edge features are equal to the contiguous call's."""
    n = 80
    gen = torch.Generator().manual_seed(heads * 100 + F)
    ei = random_graph(n, n, 500, super_node=(200, 3), generator=gen).to(device)
    g = get_graph(ei, (n, n))
    width = heads * F
    y = torch.randn(n, 3 * width + extra, generator=gen).to(device, dtype).requires_grad_(True)
    q, k, v = (y[:, i * width:(i + 1) * width].view(n, heads, F) for i in range(3))
    e = torch.randn(ei.size(1), heads, F, generator=gen).to(device, dtype) if edge else None
    if e is not None:
        e.requires_grad_(True)
    qc, kc, vc = (t.detach().contiguous().requires_grad_(True) for t in (q, k, v))
    ec = e.detach().clone().requires_grad_(True) if edge else None
    assert not q.is_contiguous() and q.stride(0) == 3 * width + extra
    out, _ = ops.dot_attention(g, q, k, v, e)
    ref, _ = ops.dot_attention(g, qc, kc, vc, ec)
    assert torch.equal(out, ref)
    gout = torch.randn(out.shape, generator=gen).to(device, dtype)
    ins = (y,) + ((e,) if edge else ())
    got = torch.autograd.grad(out, ins, gout)
    want = torch.autograd.grad(ref, (qc, kc, vc) + ((ec,) if edge else ()), gout)
    dy = got[0]
    for i, w in enumerate(want[:3]):
        assert torch.equal(dy[:, i * width:(i + 1) * width].view(n, heads, F), w)
    assert (dy[:, 3 * width:] == 0).all()
    if edge:
        assert torch.equal(got[1], want[3])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,F", [(4, 64), (8, 8), (1, 16), (8, 10), (3, 12)])
def test_keys_and_values_shared_by_the_heads(device, dtype, heads, F):
    """Keys and values given as one row per node that every head reads
    (``x[:, None].expand(N, H, F)``, head stride 0: what
    ``nn.TransformerConv``'s aggregate-then-project forward passes).  The CUDA
    kernels read the row where each head would have its own (no copy is
    made: ``ops._rows``); the output and q's gradient must equal the call
    on contiguous copies (the same kernels on the same numbers), and x's
    gradient the sum over the heads of the copies' key and value gradients
    (up to the order of that sum: ``heads`` roundings of its largest term)."""
    n = 90
    gen = torch.Generator().manual_seed(heads * 100 + F)
    ei = random_graph(n, n, 600, super_node=(300, 3), generator=gen).to(device)
    g = get_graph(ei, (n, n))
    x = torch.randn(n, F, generator=gen).to(device, dtype).requires_grad_(True)
    q = torch.randn(n, heads, F, generator=gen).to(device, dtype).requires_grad_(True)
    xs = x.unsqueeze(1).expand(n, heads, F)
    if heads > 1 and device == "cuda":
        assert ops._rows(xs, True) is xs   # (read as it is)
    kc, vc = (xs.detach().contiguous().requires_grad_(True) for _ in range(2))
    qc = q.detach().clone().requires_grad_(True)
    out, _ = ops.dot_attention(g, q, xs, xs)
    ref, _ = ops.dot_attention(g, qc, kc, vc)
    assert torch.equal(out, ref)
    gout = torch.randn(out.shape, generator=gen).to(device, dtype)
    dq, dx = torch.autograd.grad(out, (q, x), gout)
    wq, wk, wv = torch.autograd.grad(ref, (qc, kc, vc), gout)
    assert torch.equal(dq, wq)
    want = (wk.double() + wv.double()).sum(1)
    scale = float(want.abs().max())
    assert float((dx.double() - want).abs().max()) <= (heads + 1) * torch.finfo(dtype).eps * scale


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,F", [(4, 64), (8, 8), (2, 32), (3, 12)])
def test_shared_keys_and_values_with_a_key_scale_against_float64(device, dtype, heads, F):
    """The same keys-are-values rows shared by the heads with a key scale (on
    CUDA AGNN's kernels then run, which load each gathered row once per edge
    and head; ``nn.TransformerConv``'s aggregate-then-project forward passes a
    scale of ones): output and the gradients of q, x and the scale against
    float64, within 2x the error of the call on contiguous copies without the
    one-row layout (the dot kernels, keys scaled by a copy) + 4 roundings of
    the dtype on each tensor's scale."""
    n = 90
    gen = torch.Generator().manual_seed(heads * 1000 + F)
    ei = random_graph(n, n, 600, super_node=(300, 3), generator=gen).to(device)
    g = get_graph(ei, (n, n))
    x64 = torch.randn(n, F, generator=gen, dtype=torch.float64).to(device)
    q64 = torch.randn(n, heads, F, generator=gen, dtype=torch.float64).to(device)
    c64 = (0.5 + torch.rand(n, heads, generator=gen, dtype=torch.float64)).to(device)
    gout = torch.randn(n, heads, F, generator=gen, dtype=torch.float64).to(device)

    def run(t, shared):
        x, q, c = (v.to(t).requires_grad_(True) for v in (x64, q64, c64))
        xs = x.unsqueeze(1).expand(n, heads, F)
        kv = xs if shared else xs.contiguous()
        out, _ = ops.dot_attention(g, q, kv, kv if shared else xs.contiguous(), key_scale=c)
        grads = torch.autograd.grad(out, (q, x, c), gout.to(t))
        return [out.detach()] + list(grads)

    want = run(torch.float64, False)
    ours = run(dtype, True)
    base = run(dtype, False)
    u = torch.finfo(dtype).eps
    for name, w, o, b in zip(("out", "q", "x", "key_scale"), want, ours, base):
        err = float((o.double() - w).abs().max())
        err_base = float((b.double() - w).abs().max())
        assert err <= 2 * err_base + 4 * u * float(w.abs().max()), (name, err, err_base)
