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
