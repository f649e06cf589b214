"""GAT's forward by rows (cuda/attention_kernels.cuh: ``fwd_gat_rows_kernel``):
one lane group per work item covering all its heads, a 16-byte chunk of the
row per lane, for GAT's calls at a power of two of heads whose rows take 16
lanes or fewer (attention_launch.cuh: ``gat_rows_group``); with edge logits or
attention dropout on its ``EXTRA`` instantiation.

Its sums run in another order than ``fwd_lean_kernel``'s, so it is judged
against float64: the output by the FlashAttention rule (within a small
multiple of PyTorch's own error at the same precision: the gather / softmax /
scatter oracle run in that dtype, plus two unit roundoffs of the output's
scale), the output, alpha and every gradient (whose backward recomputes alpha
from the statistics this kernel saves) by the kernel tests' tolerances
(test_cuda_kernels.check).  CUDA only.
"""
import pytest
import torch

from pyg_dfgnn import ops, schedule
from pyg_dfgnn.graph import get_graph
from pyg_dfgnn.ops import reference as R
from _cases import KINDS, make_inputs, random_graph
from test_cuda_kernels import TOL, _unit, check, poison, rel
from test_lean_kernels import _kernels

pytestmark = pytest.mark.cuda

#: (heads, features, dtype) where the kernel runs (16-byte chunks: 4 fp32 or 8
#: fp16 / bf16 features; rows of at most 256 bytes on fewer lanes than
#: fwd_lean_kernel's): bf16 8 x 10 (the paper's GT shape), Cora's 8 x 8, two to
#: sixteen heads, groups of 4, 8 and 16 lanes
HALF_SHAPES = [(8, 10), (8, 8), (4, 16), (2, 16), (16, 8)]
CASES = ([(8, 8, torch.float32), (8, 4, torch.float32)]
         + [(H, F, dt) for dt in (torch.bfloat16, torch.float16) for H, F in HALF_SHAPES])


def _rows_ran(fn) -> bool:
    names = _kernels(fn)
    fwd = [n for n in names if n.startswith("void dfgnn::fwd_") and "merge" not in n
           and "alpha" not in n]
    assert len(fwd) == 1, names
    return "fwd_gat_rows_kernel" in fwd[0]


@pytest.mark.parametrize("split", [None, 16])
@pytest.mark.parametrize("H,F,dtype", CASES)
@pytest.mark.parametrize("kind", ["gat", "gat_bias"])
def test_rows_forward_against_float64(kind, H, F, dtype, split):
    """Output, alpha and every gradient against the float64 reference, on a
    graph with a super row (split into 16-edge segments merged after the
    kernel with ``split=16``), an isolated row and lanes without a row (the
    kernel runs at these shapes: test_rows_run_where_they_apply)."""
    ns, nd = 130, 117
    gen = torch.Generator().manual_seed(H * 100 + F + (7 if split else 0))
    ei = random_graph(ns, nd, 1300, super_node=(400, 5), generator=gen)
    check(kind, ei, ns, nd, H, F, dtype, seed=H * 1000 + F, split=split)


@pytest.mark.parametrize("split", [None, 16])
@pytest.mark.parametrize("edge,dropout", [(True, 0.0), (False, 0.3), (True, 0.5)])
@pytest.mark.parametrize("H,F,dtype", [(8, 8, torch.float32), (8, 10, torch.bfloat16),
                                       (4, 16, torch.float16), (16, 8, torch.bfloat16),
                                       (2, 16, torch.bfloat16)])
@pytest.mark.parametrize("kind", ["gat", "gat_bias"])
def test_rows_edge_logits_and_dropout_against_float64(kind, H, F, dtype, edge, dropout, split):
    """Edge logits (``a_edge`` in the original edge order, read through the
    CSR permutation) and attention dropout (the same Philox mask as the
    reference: tests compare the kernel with it exactly) on the kernel's EXTRA
    instantiation: output, alpha (after dropout) and every gradient against
    float64."""
    ns, nd = 130, 117
    gen = torch.Generator().manual_seed(H * 100 + F + int(dropout * 10))
    ei = random_graph(ns, nd, 1300, super_node=(400, 5), generator=gen)
    check(kind, ei, ns, nd, H, F, dtype, edge=edge, dropout=dropout, seed=H * 1000 + F,
          split=split)


@pytest.mark.parametrize("H,F,dtype", [(8, 8, torch.float32), (8, 4, torch.float32),
                                       (8, 10, torch.bfloat16), (8, 10, torch.float16),
                                       (16, 8, torch.bfloat16), (2, 16, torch.float16)])
def test_rows_output_within_pytorchs_error(H, F, dtype):
    """The FlashAttention rule on a PATTERN-sized problem (2,000 rows of ~50
    edges and a super row of 3,000): the output's max error against float64
    within 2x that of the gather / softmax / scatter oracle (PyG's softmax)
    run in the same dtype, plus two unit roundoffs of the output's largest
    value; the same inputs for both."""
    n = 2000
    gen = torch.Generator().manual_seed(H * F)
    ei = random_graph(n, n, 50 * n, super_node=(3000, 7), generator=gen).cuda()
    g = get_graph(ei, (n, n))
    inp = make_inputs(KINDS["gat_bias"], n, n, ei.size(1), H, F, dtype, "cuda",
                      generator=gen)
    poison()
    out = ops.gat_attention(g, inp["val"], inp["src"], inp["dst"], bias=inp["att"])[0]
    ref = R.naive_attention(KINDS["gat"], ei, n, inp["dst"].double(), inp["src"].double(),
                            inp["val"].double(), None, inp["att"].double(), 1.0, 0.2)[0]
    torch_out = R.naive_attention(KINDS["gat"], ei, n, inp["dst"], inp["src"], inp["val"],
                                  None, inp["att"], 1.0, 0.2)[0]
    assert torch.isfinite(out).all()
    err = float((out.double() - ref).abs().max())
    err_torch = float((torch_out.double() - ref).abs().max())
    scale = float(ref.abs().max())
    assert err <= 2 * err_torch + 2 * _unit(dtype) * scale, (err, err_torch, scale)


@pytest.mark.parametrize("H,F,C,dtype", [(8, 10, 9, torch.bfloat16), (4, 16, 13, torch.float16),
                                         (8, 8, 7, torch.bfloat16), (8, 8, 5, torch.float32)])
def test_rows_narrow_output_with_bias(H, F, C, dtype):
    """A bias ``[H, C]`` with ``C < F`` (a layer's heads projected into the
    kernels' padded width): the output ``[N, H, C]`` stored per element with
    the bias, and every gradient, against float64."""
    n = 150
    gen = torch.Generator().manual_seed(C)
    ei = random_graph(n, n, 1500, super_node=(500, 3), generator=gen).cuda()
    g = get_graph(ei, (n, n))

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).cuda()
    x64, as64, ad64, b64 = r(n, H, F), r(n, H), r(n, H), r(H, C)
    ours = [t.to(dtype).requires_grad_(True) for t in (x64, as64, ad64, b64)]
    ref = [t.to(dtype).double().requires_grad_(True) for t in (x64, as64, ad64, b64)]
    poison()
    out = ops.gat_attention(g, ours[0], ours[1], ours[2], bias=ours[3])[0]
    want = R.naive_attention(KINDS["gat"], ei, n, ref[2], ref[1], ref[0], None, ref[3],
                             1.0, 0.2)[0]
    assert out.shape == (n, H, C)
    gout = r(n, H, C)
    errs = {"out": rel(out, want)}
    gs = torch.autograd.grad(out, ours, gout.to(dtype))
    rs = torch.autograd.grad(want, ref, gout)
    for name, a, b in zip(("x", "a_src", "a_dst", "bias"), gs, rs):
        errs["d_" + name] = rel(a, b)
    assert all(e < TOL[dtype] for e in errs.values()), errs


@pytest.mark.parametrize("edge,dropout", [(False, 0.0), (True, 0.3)])
@pytest.mark.parametrize("H,F,dtype", [(8, 10, torch.bfloat16), (8, 8, torch.float32)])
def test_rows_with_int64_indices(H, F, dtype, edge, dropout, monkeypatch):
    """The kernel's int64 instantiation (graphs past int32 indices), forced on
    a small graph: output, alpha and every gradient against float64; it ran on
    an int64 CSR."""
    import pyg_dfgnn.graph as graph_mod
    monkeypatch.setattr(graph_mod, "_INT32_MAX", 16)
    gen = torch.Generator().manual_seed(H + F)
    ei = random_graph(130, 117, 1300, super_node=(400, 5), generator=gen)
    check("gat_bias", ei, 130, 117, H, F, dtype, edge=edge, dropout=dropout, seed=F,
          split=16)
    g = get_graph(ei.cuda(), (130, 117))
    assert g.col.dtype == torch.int64
    x = torch.randn(130, H, F, generator=gen).to("cuda", dtype)
    a = torch.randn(130, H, generator=gen).to("cuda", dtype)
    assert _rows_ran(lambda: ops.gat_attention(g, x, a, a[:117], dropout=dropout))


def test_rows_run_where_they_apply(monkeypatch):
    """The kernel runs for GAT's calls at every case above, with a bias
    narrower than the heads, edge logits and attention dropout too; not where
    the row takes more than 16 lanes (fp32 8 x 10: 20 chunks; bf16 8 x 20;
    4 x 64) or no fewer than fwd_lean_kernel's groups (fp32 4 x 16 and 2 x 16,
    bf16 1 x 32), at 3 x 8 (heads not a power of two), at bf16 8 x 4 (a chunk
    over three heads), under ``PYG_DFGNN_LEAN=0`` or ``PYG_DFGNN_GAT_ROWS=0``,
    or with a forced group.  A malformed setting is an error naming the
    variable."""
    for var in ("PYG_DFGNN_GAT_ROWS", "PYG_DFGNN_LEAN"):
        monkeypatch.delenv(var, raising=False)
    gen = torch.Generator().manual_seed(2)
    n = 60
    ei = random_graph(n, n, 400, generator=gen).cuda()
    g = get_graph(ei, (n, n))

    def ran(H, F, dtype=torch.float32, edge=False, dropout=0.0, C=None):
        x = torch.randn(n, H, F, generator=gen).to("cuda", dtype)
        a = torch.randn(n, H, generator=gen).to("cuda", dtype)
        e = torch.randn(ei.size(1), H, generator=gen).to("cuda", dtype) if edge else None
        b = None if C is None else torch.randn(H, C, generator=gen).to("cuda", dtype)
        return _rows_ran(lambda: ops.gat_attention(g, x, a, a, e, dropout=dropout, bias=b))

    for H, F, dtype in CASES:
        assert ran(H, F, dtype), (H, F, dtype)
    assert ran(8, 10, torch.bfloat16, C=9) and ran(8, 8, C=5)
    assert not ran(8, 10) and not ran(8, 20, torch.bfloat16) and not ran(4, 64, torch.bfloat16)
    assert not ran(4, 16) and not ran(2, 16) and not ran(1, 32, torch.bfloat16)
    assert not ran(3, 8, torch.bfloat16) and not ran(8, 4, torch.bfloat16)
    assert ran(8, 10, torch.bfloat16, edge=True) and ran(8, 8, dropout=0.3)
    assert ran(8, 10, torch.bfloat16, edge=True, dropout=0.6)
    with schedule.override(group=4):
        assert not ran(8, 10, torch.bfloat16)
    monkeypatch.setenv("PYG_DFGNN_GAT_ROWS", "0")
    assert not ran(8, 10, torch.bfloat16)
    monkeypatch.setenv("PYG_DFGNN_GAT_ROWS", "1")
    assert ran(8, 10, torch.bfloat16)
    monkeypatch.setenv("PYG_DFGNN_LEAN", "0")
    assert not ran(8, 10, torch.bfloat16)
    monkeypatch.delenv("PYG_DFGNN_LEAN")
    monkeypatch.setenv("PYG_DFGNN_GAT_ROWS", "yes")
    with pytest.raises(RuntimeError, match="PYG_DFGNN_GAT_ROWS"):
        ran(8, 10, torch.bfloat16)
