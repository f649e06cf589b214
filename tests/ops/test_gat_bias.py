"""GAT's output bias in the op (``gat_attention(..., bias=b)``): the layer's
bias added in the kernels' epilogue, in the bias' width ``C <= F`` (a value
projected into a padded width), on every path: the C++ CPU kernels, the
reference (float64), the CUDA kernels and the custom op's fake (torch.compile)."""
import pytest
import torch

from pyg_dfgnn import ops, schedule
from pyg_dfgnn.graph import get_graph
from _cases import random_graph

#: cuda: marked, so `pytest -m cuda` runs it on a GPU machine (skipped without one)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _inputs(device, dtype, heads, C, pad, seed, ns=70, nd=60):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device, dtype)
    x = r(ns, heads, C)
    return (x, torch.nn.functional.pad(x, (0, pad)), r(ns, heads), r(nd, heads),
            r(heads, C)), (ns, nd)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("heads,C,pad", [(2, 5, 3), (8, 19, 1), (8, 10, 2), (1, 16, 0),
                                         (33, 5, 3)])
@pytest.mark.parametrize("split", [None, 16])
@pytest.mark.parametrize("mode", ["store", "recompute"])
def test_narrow_bias_equals_the_unpadded_call(device, dtype, heads, C, pad, split, mode,
                                              ns=70, nd=60, edges=600):
    """x with ``pad`` zero columns per head and a bias of the real width ``C``
    gives the output ``[N_dst, H, C]`` and the gradients of the call on the
    unpadded x: exactly, since the zero columns add nothing to any sum (the
    padded columns' gradient is that of zero features, not used by a layer,
    which slices its weight's padding off).  The CUDA kernels add a bias
    narrower than their width per element (it is not padded); 33 heads and
    the recomputing backward take Delta from the output minus the bias."""
    (x, xp, a_s, a_d, b), (ns, nd) = _inputs(device, dtype, heads, C, pad, heads * 100 + C,
                                              ns, nd)
    ei = random_graph(ns, nd, edges, super_node=(300, 3)).to(device)
    g = get_graph(ei, (ns, nd))
    leaves = []
    for t in (x, xp, a_s, a_d, b):
        leaves.append(t.requires_grad_(True))
    gout = torch.randn(nd, heads, C, generator=torch.Generator().manual_seed(1),
                       dtype=torch.float64).to(device, dtype)
    with schedule.override(split=split), ops.backward_mode(mode):
        o1, _ = ops.gat_attention(g, x, a_s, a_d, bias=b)
        g1 = torch.autograd.grad(o1, (x, a_s, a_d, b), gout)
        o2, _ = ops.gat_attention(g, xp, a_s, a_d, bias=b)
        g2 = torch.autograd.grad(o2, (xp, a_s, a_d, b), gout)
    assert o2.shape == (nd, heads, C) and o2.is_contiguous()
    # one kernel build, same sums (zeros added): equal up to the order of the
    # padded width's vector lanes (float64 on CUDA: the reference's atomic
    # scatter-adds, whose order varies between calls), i.e. a few roundings of
    # the largest term.  The logits' gradients sum g_ij = dS_ij LeakyReLU'
    # terms that cancel (each row's dS sum to 0), so their terms are bounded
    # instead of the result: |dS_ij| <= 2 alpha_ij max|dP|, |dP| <= |dO_i| |x_j|,
    # and a source's alpha_ij add up to at most its out-degree.
    u = torch.finfo(dtype).eps
    dp_max = float(gout.double().norm(dim=-1).max() * x.detach().double().norm(dim=-1).max())
    out_deg = int(torch.bincount(ei[0], minlength=ns).max())
    logit_terms = 2 * dp_max * max(out_deg, 1)
    for n, (a, c) in enumerate([(o1, o2)] + list(zip(g1, (g2[0][..., :C],) + g2[1:]))):
        scale = float(a.abs().max()) if n not in (2, 3) else logit_terms
        torch.testing.assert_close(a, c, rtol=0, atol=8 * u * scale + 1e-30)
    # the bias gradient is the column sum of grad_out (float64 reference)
    want_db = gout.double().sum(0)
    for db in (g1[3], g2[3]):
        torch.testing.assert_close(db.double(), want_db, rtol=0,
                                   atol=8 * u * float(gout.double().abs().sum(0).max()))
    # a destination without edges gets the bias
    empty = g.rowptr.diff() == 0
    assert empty.any() and (o2[empty] == b).all()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_narrow_bias_on_a_gpu_bound_call(dtype):
    """At 8 x 19 on 30,000 source rows (4.8M value elements, GPU-bound) the op
    pads the bias to the kernels' width (vector loads) instead of reading it
    per element: the same results as above."""
    test_narrow_bias_equals_the_unpadded_call("cuda", dtype, 8, 19, 1, None, "store",
                                              ns=30000, nd=29000, edges=200000)


def test_fake_output_has_the_bias_width():
    """torch.compile traces the op with its fake: the output's width is the bias'."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from pyg_dfgnn.ops import fused
    (x, xp, a_s, a_d, b), (ns, nd) = _inputs("cpu", torch.float32, 2, 5, 3, 0)
    ei = random_graph(ns, nd, 100)
    with FakeTensorMode(allow_non_fake_inputs=True):
        out, lse = fused.graph_attention_fwd(0, ei, ns, nd, -1, a_d, a_s, xp, None, b, 1.0,
                                             0.2, 0.0, None)
    assert tuple(out.shape) == (nd, 2, 5)
