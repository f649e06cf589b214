"""GAT with its node logits computed by the op (``ops.gat_node_attention``):
the logits pass, the fused attention and their backward in one autograd node.

Every comparison draws fresh random inputs and measures errors against a
float64 computation of the same formula.  Half precision follows the
FlashAttention rule: our error must be within a small multiple of the error of
PyTorch's own composition at the same precision (PyG's GAT: ``(x * att).sum``,
gather, ``torch_geometric.utils.softmax``, scatter) plus a few unit roundoffs.
"""
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.utils import scatter, softmax

from pyg_dfgnn import ops, schedule
from pyg_dfgnn.graph import get_graph
from pyg_dfgnn.ops import fused
from _cases import random_graph

CUDA = torch.cuda.is_available()
#: cuda: marked, so `pytest -m cuda` runs it on a GPU machine (skipped without one)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
DTYPES = [torch.float32, torch.bfloat16]
#: (heads, C, pad): the shapes people train with (issue 11), a padded head
#: width (the layer projects 8 x 19 / 8 x 10 into 20 / 12 on GPU-bound calls),
#: and widths with no aligned vector
SHAPES = [(8, 8, 0), (8, 10, 0), (8, 10, 2), (8, 19, 0), (8, 19, 1), (4, 16, 0), (4, 64, 0),
          (2, 128, 0), (1, 64, 0), (1, 256, 0), (3, 5, 3)]


def _unit(dtype):
    return {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8,
            torch.float16: 2.0 ** -11, torch.float64: 2.0 ** -53}[dtype]


def _problem(device, dtype, heads, C, pad, seed, edge=True, n=90, e=700):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device, dt)
    ei = random_graph(n, n, e, super_node=(250, 5), generator=gen).to(device)
    x = F.pad(r(n, heads, C), (0, pad))      # a padded projection: zero columns
    inp = dict(x=x, att_src=r(1, heads, C, dt=torch.float32),
               att_dst=r(1, heads, C, dt=torch.float32),
               a_edge=r(ei.size(1), heads) if edge else None, bias=r(heads, C))
    return ei, inp, gen


def _naive(ei, n, x, att_src, att_dst, a_edge, bias, slope=0.2):
    """PyG's GAT as PyTorch ops in the inputs' dtype (logits, gather,
    ``softmax``, scatter): the baseline of the FlashAttention rule, and in
    float64 the reference."""
    C = att_src.size(-1)
    xs = x[..., :C]
    a_s = (xs * att_src.to(x.dtype)).sum(-1)
    a_d = (xs * att_dst.to(x.dtype)).sum(-1)
    src, dst = ei[0], ei[1]
    z = a_s[src] + a_d[dst]
    if a_edge is not None:
        z = z + a_edge
    alpha = softmax(F.leaky_relu(z, slope), dst, num_nodes=n)
    return scatter(alpha.unsqueeze(-1) * xs[src], dst, 0, n, reduce="sum") + bias


def _leaves(inp):
    return [v for v in inp.values() if v is not None]


def _rel(a, b):
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "non-finite values (unwritten output or overflow)"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _errors(outs, grads, ref_out, ref_grads):
    return [_rel(outs, ref_out)] + [_rel(a, b) for a, b in zip(grads, ref_grads)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES + ([torch.float16] if CUDA else []))
@pytest.mark.parametrize("heads,C,pad", SHAPES)
@pytest.mark.parametrize("split", [None, 16])
def test_against_float64(device, dtype, heads, C, pad, split):
    """Output and the gradients of x, att_src, att_dst, a_edge and bias against
    float64; errors within 4x those of PyG's formula in the same dtype plus
    8 unit roundoffs (fp32: both are a few roundoffs)."""
    if device == "cpu" and dtype == torch.float16:
        pytest.skip("fp16 runs the reference on CPU")
    n = 90
    ei, inp, gen = _problem(device, dtype, heads, C, pad, seed=heads * 1000 + C * 10 + pad)
    ref_inp = {k: (v.double() if v is not None else None) for k, v in inp.items()}
    base_inp = {k: (v.clone() if v is not None else None) for k, v in inp.items()}
    for d in (inp, ref_inp, base_inp):
        for v in _leaves(d):
            v.requires_grad_(True)
    g = get_graph(ei, (n, n))
    with schedule.override(split=split):
        out, _ = ops.gat_node_attention(g, inp["x"], inp["att_src"], inp["att_dst"],
                                        inp["a_edge"], bias=inp["bias"])
    assert out.shape == (n, heads, C) and out.dtype == dtype
    gout = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(device)
    with schedule.override(split=split):
        grads = torch.autograd.grad(out, _leaves(inp), gout.to(dtype))
    ref = _naive(ei, n, **ref_inp)
    ref_grads = torch.autograd.grad(ref, _leaves(ref_inp), gout)
    base = _naive(ei, n, **base_inp)
    base_grads = torch.autograd.grad(base, _leaves(base_inp), gout.to(dtype))
    for a, v in zip(grads, _leaves(inp)):
        assert a.dtype == v.dtype and a.shape == v.shape
    ours = _errors(out, grads, ref, ref_grads)
    theirs = _errors(base, base_grads, ref, ref_grads)
    u = _unit(dtype)
    names = ["out", "d_x", "d_att_src", "d_att_dst", "d_edge", "d_bias"]
    bad = {nm: (a, b) for nm, a, b in zip(names, ours, theirs) if not a <= 4 * b + 8 * u}
    assert not bad, f"ours vs PyG-in-{dtype} relative errors: {bad}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dropout_equals_the_two_step_call(device, dtype):
    """With attention dropout (same seed): the one-node call equals
    ``gat_attention`` on logits computed beforehand, forward and backward, to
    a few roundings (the logits' summation order)."""
    n = 90
    ei, inp, gen = _problem(device, dtype, 4, 16, 0, seed=7)
    two = {k: (v.clone() if v is not None else None) for k, v in inp.items()}
    for d in (inp, two):
        for v in _leaves(d):
            v.requires_grad_(True)
    g = get_graph(ei, (n, n))
    torch.manual_seed(3)
    out, alpha = ops.gat_node_attention(g, inp["x"], inp["att_src"], inp["att_dst"],
                                        inp["a_edge"], 0.2, 0.3, True, inp["bias"])
    torch.manual_seed(3)
    a_s, a_d = fused.gat_logits_ref(two["x"], two["att_src"], two["att_dst"])
    out2, alpha2 = ops.gat_attention(g, two["x"], a_s, a_d, two["a_edge"], 0.2, 0.3, True,
                                     two["bias"])
    gout = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(device, dtype)
    g1 = torch.autograd.grad(out, _leaves(inp), gout)
    g2 = torch.autograd.grad(out2, _leaves(two), gout)
    assert (alpha == 0).any(), "dropout dropped nothing"
    u = _unit(dtype)
    for a, b in [(out, out2), (alpha, alpha2)] + list(zip(g1, g2)):
        tol = 64 * u * float(b.detach().abs().max()) + 1e-30
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad_and_partial_grads(device):
    """Without autograd the forward alone runs (same output); with only some
    inputs requiring grad, those get theirs."""
    n = 90
    ei, inp, gen = _problem(device, torch.float32, 2, 8, 0, seed=11)
    g = get_graph(ei, (n, n))
    with torch.no_grad():
        o1, _ = ops.gat_node_attention(g, inp["x"], inp["att_src"], inp["att_dst"],
                                       inp["a_edge"], bias=inp["bias"])
    att = inp["att_src"].clone().requires_grad_(True)
    o2, _ = ops.gat_node_attention(g, inp["x"], att, inp["att_dst"], inp["a_edge"],
                                   bias=inp["bias"])
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    (d,) = torch.autograd.grad(o2.sum(), (att,))
    assert d.shape == att.shape and torch.isfinite(d).all() and d.abs().sum() > 0


def test_bad_inputs_name_the_argument():
    n = 20
    ei = random_graph(n, n, 60)
    g = get_graph(ei, (n, n))
    x = torch.randn(n, 2, 8)
    a = torch.randn(1, 2, 8)
    with pytest.raises(ValueError, match="att_src"):
        ops.gat_node_attention(g, x, torch.randn(1, 3, 8), a)
    with pytest.raises(ValueError, match="att_dst"):
        ops.gat_node_attention(g, x, a, torch.randn(2, 4))
    with pytest.raises(ValueError, match="att_src.*narrower"):
        ops.gat_node_attention(g, x, torch.randn(2, 9), torch.randn(2, 9))
    with pytest.raises(ValueError, match="att_src"):
        ops.gat_node_attention(g, x, torch.randint(0, 3, (2, 8)), a)
    with pytest.raises(ValueError, match="'x' has 19 rows"):
        ops.gat_node_attention(g, torch.randn(19, 2, 8), a, a)
    with pytest.raises(ValueError, match="bias"):
        ops.gat_node_attention(g, x, a, a, bias=torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="a_edge"):
        ops.gat_node_attention(g, x, a, a, a_edge=torch.randn(5, 2))
    rect = get_graph(random_graph(n, n - 1, 60), (n, n - 1))
    with pytest.raises(ValueError, match="as many source as destination"):
        ops.gat_node_attention(rect, x, a, a)


@pytest.mark.cuda
@pytest.mark.parametrize("att_like_x", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,F,C,offset", [(8, 19, 19, 0), (8, 10, 10, 1), (8, 20, 19, 0),
                                              (4, 64, 64, 1), (2, 3, 2, 0), (1, 256, 256, 0),
                                              (33, 8, 8, 0), (8, 160, 150, 0), (8, 160, 160, 2),
                                              (8, 800, 790, 0), (8, 800, 800, 1)])
def test_cuda_logits_op(dtype, heads, F, C, offset, att_like_x):
    """The logits op and its backward alone against float64, including rows
    that are not 16-byte aligned (a view at an element offset into a buffer),
    attention vectors narrower than the rows and rows wider than one block's
    tile of 256 vectors (8 x 160), rows that a warp's lanes cover in more than
    one sweep of their forward slots, with the attention vectors read from
    memory instead of shared memory (8 x 800); the backward adds into ``d_x`` in place, leaves
    the columns past C untouched and sums d_att in fp32."""
    ext = fused._ext()
    n = 300
    gen = torch.Generator().manual_seed(heads * 100 + F)

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    buf = r((n + 1) * heads * F).to("cuda", dtype)
    x = buf[offset:offset + n * heads * F].view(n, heads, F)   # offset: not 16-byte aligned
    adt = dtype if att_like_x else torch.float32   # (a bf16 model's own parameters)
    a_s, a_d = r(1, heads, C).to("cuda", adt), r(1, heads, C).to("cuda", adt)
    s, d = ext.gat_logits(x, a_s, a_d)
    xd = x.double()[..., :C]
    rs, rd = (xd * a_s.double()).sum(-1), (xd * a_d.double()).sum(-1)
    u = _unit(dtype)
    for a, b, w in ((s, rs, a_s), (d, rd, a_d)):
        # fp32 sums of C products, then one rounding to x's dtype
        assert a.dtype == dtype
        bound = (C + 2) * _unit(torch.float32) * (xd.abs() * w.double().abs()).sum(-1) \
            + u * b.abs()
        assert ((a.double() - b).abs() <= bound + 1e-30).all()
    ds, dd = r(n, heads).to("cuda", dtype), r(n, heads).to("cuda", dtype)
    dx0 = r(n, heads, F).to("cuda", dtype)
    dx = dx0.clone()
    g_s, g_d = ext.gat_logits_bwd(x, a_s, a_d, ds, dd, dx)
    want = dx0.double().clone()
    want[..., :C] += ds.double().unsqueeze(-1) * a_s.double()[0] \
        + dd.double().unsqueeze(-1) * a_d.double()[0]
    assert (dx[..., C:] == dx0[..., C:]).all()
    torch.testing.assert_close(dx.double(), want, rtol=2 * u, atol=4 * u * float(want.abs().max()))
    for got, gl in ((g_s, ds), (g_d, dd)):
        exact = (gl.double().unsqueeze(-1) * xd).sum(0)
        scale = float((gl.double().abs().unsqueeze(-1) * xd.abs()).sum(0).max())
        assert got.shape == a_s.shape and got.dtype == adt
        # fp32 sums of n products of the dtype's values: (n + 2) fp32 roundings,
        # then one rounding to the vectors' dtype
        err = (got[0].double() - exact).abs()
        bound = (n + 2) * _unit(torch.float32) * scale + _unit(adt) * exact.abs() + 1e-30
        assert (err <= bound).all(), float((err - bound).max())
