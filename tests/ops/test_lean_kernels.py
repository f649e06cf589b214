"""The lean kernels (cuda/attention_kernels.cuh): ``fwd_lean_kernel``, the
forward of every kind (dot attention, AGNN, GATv2 and GAT),
``bwd_row_lean_kernel``, dot attention's and AGNN's backward row pass, and
``bwd_col_lean_kernel``, dot attention's and GATv2's column pass (stored,
alpha and recompute modes) and GAT's (emit-dP and atomic modes).

Calls without edge features or dropout, whose heads fit one launch column,
run kernels without the code of what such a call does not have, with
fwd_kernel's, bwd_row_kernel's and bwd_col_kernel's arithmetic in the same
order.  So their
output, saved softmax statistics and gradients must be those kernels' bit for
bit (``PYG_DFGNN_LEAN=0`` runs them everywhere); the statistics are compared
through the backward, which recomputes alpha from them.  Accuracy against
float64 is the float64 tests' (tests/ops/test_cuda_kernels.py, tests/nn),
which run the lean kernels wherever they apply.  GAT's forward by rows is
off here (``PYG_DFGNN_GAT_ROWS=0``); it has its own tests
(tests/ops/test_gat_rows.py).  CUDA only.
"""
import pytest
import torch

from pyg_dfgnn import ops, schedule
import pyg_dfgnn.graph as graph_mod
from pyg_dfgnn.graph import get_graph
from _cases import random_graph

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def _gat_forward_lean(monkeypatch):
    """GAT's forward on fwd_lean_kernel, not by rows (fwd_gat_rows_kernel,
    which sums a row in another order: tests/ops/test_gat_rows.py)."""
    monkeypatch.setenv("PYG_DFGNN_GAT_ROWS", "0")


DTYPES = [torch.float32, torch.bfloat16, torch.float16]
#: heads x features: the bench's shapes (8 x 19 runs padded to 20), one head
#: of 256 (32 lanes), a head wider than one group's tile in half precision
SHAPES = [(4, 64), (8, 10), (8, 20), (2, 128), (1, 256), (4, 16), (3, 8)]
CASES = ["dot", "dot_kv_one", "dot_shared_heads", "dot_key_scale", "dot_residual",
         "dot_strided", "agnn", "gatv2", "gat"]


def _problem(case, H, F, dtype, gen, q_scale=1.0):
    """``(graph, call, leaves)``: ``call()`` runs the op on fresh leaves;
    ``q_scale`` multiplies the queries (large: nearly saturated rows)."""
    ns, nd = 70, 61   # (not a multiple of a warp's groups: lanes without an item)
    ei = random_graph(ns, nd, 700, super_node=(300, 5), generator=gen).cuda()
    g = get_graph(ei, (ns, nd))

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to("cuda", dtype)
    if case == "agnn":
        x = r(ns, H * F)
        beta = torch.tensor(0.7, device="cuda")
        return g, (lambda x, beta: ops.agnn_attention(g, x, beta)[0]), [x, beta]
    if case == "gat":
        x, a_src, a_dst = r(ns, H, F), r(ns, H), r(nd, H) * q_scale
        return g, (lambda x, a_src, a_dst: ops.gat_attention(g, x, a_src, a_dst)[0]), \
            [x, a_src, a_dst]
    q = r(nd, H, F) * q_scale
    if case == "gatv2":
        xs, att = r(ns, H, F), r(H, F)
        return g, (lambda xs, xd, att: ops.gatv2_attention(g, xs, xd, att)[0]), [xs, q, att]
    if case == "dot_strided":
        W = H * F   # q, k, v: column blocks of one wider tensor (row stride 3 W + 8)
        y = r(ns, 3 * W + 8)
        return g, (lambda y: ops.dot_attention(
            g, y[:nd, :W].view(nd, H, F), y[:, W:2 * W].view(ns, H, F),
            y[:, 2 * W:3 * W].view(ns, H, F))[0]), [y]
    if case == "dot_shared_heads":
        x = r(ns, F)
        return g, (lambda q, x: ops.dot_attention(
            g, q, x.unsqueeze(1).expand(ns, H, F), x.unsqueeze(1).expand(ns, H, F))[0]), [q, x]
    k, v = r(ns, H, F), r(ns, H, F)
    if case == "dot_kv_one":
        return g, (lambda q, k: ops.dot_attention(g, q, k, k)[0]), [q, k]
    if case == "dot_key_scale":
        c = r(ns, H).abs() + 0.5
        return g, (lambda q, k, c: ops.dot_attention(g, q, k, k, key_scale=c)[0]), [q, k, c]
    if case == "dot_residual":
        res = r(nd, H, max(F - 3, 1))
        return g, (lambda q, k, v, res: ops.dot_attention(g, q, k, v, residual=res)[0]), \
            [q, k, v, res]
    return g, (lambda q, k, v: ops.dot_attention(g, q, k, v)[0]), [q, k, v]


def _lean_vs_plain(fn, leaves, monkeypatch, **override):
    """``{"1": (out, grads), "0": ...}``: the lean kernels and the plain ones."""
    got = {}
    for lean in ("1", "0"):
        monkeypatch.setenv("PYG_DFGNN_LEAN", lean)
        with schedule.override(**override):
            got[lean] = _run(fn, leaves, torch.Generator().manual_seed(1))
    return got


def _assert_equal(got):
    (o1, g1), (o0, g0) = got["1"], got["0"]
    assert torch.isfinite(o1).all()
    assert torch.equal(o1, o0)
    assert len(g1) == len(g0)
    for a, b in zip(g1, g0):
        assert torch.equal(a, b)


def _run(fn, leaves, gout_gen):
    xs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in leaves]
    out = fn(*xs)
    gout = torch.randn(out.shape, generator=gout_gen, dtype=torch.float64).to(out)
    grads = torch.autograd.grad(out, [t for t in xs if t.requires_grad], gout)
    return out.detach(), grads


@pytest.mark.parametrize("split", [None, 16])
@pytest.mark.parametrize("H,F", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_lean_kernels_equal_plain_ones(case, dtype, H, F, split, monkeypatch):
    """Output and every gradient (recomputed from the saved statistics) equal
    to fwd_kernel's, on a graph with a super row, an isolated row and items
    that leave lanes of the last warp without a row; ``split=16`` cuts rows
    longer than 16 edges into segments merged after the kernel."""
    if case == "gat":   # (its default backward adds row sums with atomics, in an order that
        # varies from run to run; the single-gather one is deterministic)
        monkeypatch.setenv("PYG_DFGNN_BACKWARD", "store")
    gen = torch.Generator().manual_seed(CASES.index(case) * 1000 + H * 100 + F)
    g, fn, leaves = _problem(case, H, F, dtype, gen)
    _assert_equal(_lean_vs_plain(fn, leaves, monkeypatch, split=split))


@pytest.mark.parametrize("q_scale", [1.0, 60.0])
@pytest.mark.parametrize("mode,alpha", [("store", "0"), ("store", "1"), ("recompute", "")])
@pytest.mark.parametrize("H,F,dtype", [(4, 64, torch.float32), (8, 10, torch.float32),
                                       (8, 10, torch.bfloat16), (4, 64, torch.float16),
                                       (8, 20, torch.bfloat16)])
@pytest.mark.parametrize("case", ["dot", "dot_key_scale", "agnn", "gatv2"])
def test_lean_backward_in_every_mode(case, H, F, dtype, mode, alpha, q_scale, monkeypatch):
    """The row pass writes the stored mode's per-edge arrays (pairs, or alpha
    alone with ``PYG_DFGNN_ALPHA_MODE=1``) or the recompute mode's Delta for
    the column pass, which reads them (stored, alpha) or recomputes alpha and
    dS from the row statistics (recompute) on the lean walk or the plain one
    (GATv2's row pass and AGNN's column pass, a key scale's too, are the
    plain ones either way); with queries 60x larger most rows are nearly
    saturated, so that some groups of a warp sweep their row a second time
    with the exact Delta and the others do not."""
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", mode)
    monkeypatch.setenv("PYG_DFGNN_ALPHA_MODE", alpha)
    gen = torch.Generator().manual_seed(H * 100 + F)
    g, fn, leaves = _problem(case, H, F, dtype, gen, q_scale=q_scale)
    if case == "agnn":   # (its queries are normalised: beta sets the logits' scale)
        leaves[1] = leaves[1] * q_scale
    _assert_equal(_lean_vs_plain(fn, leaves, monkeypatch))


@pytest.mark.parametrize("group", [1, 2, 4, 16, 32])
def test_lean_kernels_at_every_group_size(group, monkeypatch):
    """Forced lanes per (row, head): warps of several rows (1, 2, 4 lanes:
    the warp walks its longest row's batches) and one group per warp."""
    gen = torch.Generator().manual_seed(group)
    g, fn, leaves = _problem("dot", 8, 16, torch.float32, gen)
    _assert_equal(_lean_vs_plain(fn, leaves, monkeypatch, group=group))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_kernels_with_int64_indices(dtype, monkeypatch):
    """The kernels' int64 instantiation (graphs past int32 indices), forced
    on a small graph."""
    monkeypatch.setattr(graph_mod, "_INT32_MAX", 16)
    gen = torch.Generator().manual_seed(5)
    g, fn, leaves = _problem("dot", 4, 64, dtype, gen)
    assert g.col.dtype == torch.int64
    _assert_equal(_lean_vs_plain(fn, leaves, monkeypatch))


def _kernels(fn):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages() if e.device_type.name == "CUDA"]


def test_lean_kernels_run_where_they_apply(monkeypatch):
    """Which kernels a call launches: the lean forward for every kind
    without edge features or dropout, the lean row pass for
    dot attention and AGNN, and the lean column pass for dot attention,
    GATv2 and GAT (its atomic and single-gather modes); the plain ones with
    edge features, with dropout (and GATv2's row pass, AGNN's column pass),
    and under ``PYG_DFGNN_LEAN=0``."""
    gen = torch.Generator().manual_seed(3)
    ns = 50
    ei = random_graph(ns, ns, 300, generator=gen).cuda()
    g = get_graph(ei, (ns, ns))
    q, k, v = (torch.randn(ns, 4, 16, generator=gen).cuda().requires_grad_(True)
               for _ in range(3))
    e = torch.randn(ei.size(1), 4, 16, generator=gen).cuda()
    x = torch.randn(ns, 32, generator=gen).cuda().requires_grad_(True)
    att = torch.randn(4, 16, generator=gen).cuda()
    a = torch.randn(ns, 4, generator=gen).cuda()
    ae = torch.randn(ei.size(1), 4, generator=gen).cuda()

    def lean_ran(fn):
        """(lean forward, lean row pass, lean column pass) of one forward and
        backward."""
        names = _kernels(lambda: fn()[0].sum().backward())
        fwd = [n for n in names if "fwd_lean_kernel" in n or "fwd_kernel<" in n]
        row = [n for n in names if "bwd_row_lean_kernel" in n or "bwd_row_kernel<" in n]
        col = [n for n in names if "bwd_col_lean_kernel" in n or "bwd_col_kernel<" in n]
        assert len(fwd) == 1 and len(row) <= 1 and len(col) == 1, names
        return ("fwd_lean_kernel" in fwd[0], bool(row) and "bwd_row_lean_kernel" in row[0],
                "bwd_col_lean_kernel" in col[0])
    lean = (True, True, True)
    plain = (False, False, False)
    for mode in ("store", "recompute"):   # (the column pass in both modes)
        monkeypatch.setenv("PYG_DFGNN_BACKWARD", mode)
        assert lean_ran(lambda: ops.dot_attention(g, q, k, v)) == lean
        assert lean_ran(lambda: ops.agnn_attention(g, x, 1.0)) == (True, True, False)
        assert lean_ran(lambda: ops.gatv2_attention(g, k, q, att)) == (True, False, True)
        assert lean_ran(lambda: ops.dot_attention(g, q, k, v, e)) == plain
    monkeypatch.delenv("PYG_DFGNN_BACKWARD")
    assert lean_ran(lambda: ops.dot_attention(g, q, k, v, dropout=0.0)) == lean
    assert lean_ran(lambda: ops.dot_attention(g, q, k, v, dropout=0.3)) == plain
    assert lean_ran(lambda: ops.gatv2_attention(g, k, q, att, e)) == plain
    assert lean_ran(lambda: ops.gat_attention(g, v, a, a)) == (True, False, True)   # (atomic)
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "store")   # (its single-gather column pass)
    assert lean_ran(lambda: ops.gat_attention(g, v, a, a)) == (True, False, True)
    monkeypatch.delenv("PYG_DFGNN_BACKWARD")
    assert lean_ran(lambda: ops.gat_attention(g, v, a, a, ae)) == plain
    assert lean_ran(lambda: ops.gat_attention(g, v, a, a, dropout=0.3)) == plain
    monkeypatch.setenv("PYG_DFGNN_LEAN", "0")
    assert lean_ran(lambda: ops.dot_attention(g, q, k, v)) == plain


@pytest.mark.parametrize("dtype,feat,vec", [(torch.float32, 10, 82), (torch.bfloat16, 10, 82),
                                            (torch.bfloat16, 20, 84), (torch.float16, 20, 84),
                                            (torch.float32, 20, 4), (torch.bfloat16, 64, 8)])
def test_gat_backward_tile(dtype, feat, vec):
    """GAT's column pass runs on five chunks per lane (one lane per head: the
    VEC template argument 16 * 5 + the chunk's elements) where a head is a
    multiple of 8 bytes but not of 16, or in half precision of 4 bytes but not
    of 8; on the forward's vectors elsewhere (attention_launch.cuh, dispatch)."""
    gen = torch.Generator().manual_seed(feat)
    ns = 40
    g = get_graph(random_graph(ns, ns, 200, generator=gen).cuda(), (ns, ns))
    x = torch.randn(ns, 8, feat, generator=gen).to("cuda", dtype).requires_grad_(True)
    a = torch.randn(ns, 8, generator=gen).to("cuda", dtype)
    names = _kernels(lambda: ops.gat_attention(g, x, a, a)[0].sum().backward())
    col = [n for n in names if "bwd_col_lean_kernel" in n]
    assert len(col) == 1, names
    assert f"int, {vec}, 3" in col[0], col[0]


def test_gat_hub_cache_runs_where_it_applies(monkeypatch):
    """GAT's atomic column pass takes its hub-cache instantiation
    (``bwd_col_lean_kernel<..., true>``: attention_launch.cuh, gat_hub_min)
    on a power-law graph whose schedule splits super rows at one lane per head
    (8 x 10) and at fp32 8 x 19, not at 4 x 64 (heads over 32 features), not on
    a graph without super rows, not in the single-gather (store) mode, and
    wherever PYG_DFGNN_GAT_HUB_MIN forces it (0: nowhere)."""
    from pyg_dfgnn.data import synthetic
    monkeypatch.delenv("PYG_DFGNN_GAT_HUB_MIN", raising=False)
    monkeypatch.delenv("PYG_DFGNN_BACKWARD", raising=False)
    gen = torch.Generator().manual_seed(5)
    n = 3000
    hubby = get_graph(synthetic.powerlaw_graph(n, 40000, 2500, seed=3).cuda(), (n, n))
    flat = get_graph(random_graph(n, n, 40000, generator=gen).cuda(), (n, n))

    def hub_ran(g, heads, feat):
        x = torch.randn(n, heads, feat, generator=gen).cuda().requires_grad_(True)
        a = torch.randn(n, heads, generator=gen).cuda()
        names = _kernels(lambda: ops.gat_attention(g, x, a, a)[0].sum().backward())
        col = [k for k in names if "bwd_col_lean_kernel" in k]
        assert len(col) == 1, names
        return ", true>" in col[0]

    assert hub_ran(hubby, 8, 10) and hub_ran(hubby, 8, 19)
    assert not hub_ran(hubby, 4, 64)
    assert not hub_ran(flat, 8, 10)
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "store")
    assert not hub_ran(hubby, 8, 10)
    monkeypatch.delenv("PYG_DFGNN_BACKWARD")
    monkeypatch.setenv("PYG_DFGNN_GAT_HUB_MIN", "1")
    assert hub_ran(flat, 8, 10) and hub_ran(hubby, 4, 64)
    monkeypatch.setenv("PYG_DFGNN_GAT_HUB_MIN", "0")
    assert not hub_ran(hubby, 8, 10)
