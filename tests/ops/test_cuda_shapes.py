"""The shapes people train with (issue 11): every heads x features width runs a
vectorised kernel (odd widths are zero-padded to a vector in the op
registration), in fp32 and bf16, forward and every gradient against the
float64 reference; narrow heads with 1- and 2-lane groups."""
import pytest
import torch

from pyg_dfgnn import schedule
from pyg_dfgnn.graph import get_graph
from _cases import KINDS, call, make_inputs, random_graph
from test_cuda_kernels import check

pytestmark = pytest.mark.cuda

#: 1 x 152: dot attention's wide tiles (16 lanes x 3 float4 in fp32, 2 x 8 bf16)
SHAPES = [(8, 8), (8, 10), (8, 19), (4, 16), (4, 64), (2, 128), (1, 64), (1, 152), (1, 256)]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("heads,feat", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_shapes_match_reference(kind, heads, feat, dtype):
    ei = random_graph(260, 240, 2600, super_node=(900, 5))
    check(kind, ei, 260, 240, heads, feat, dtype, edge=True, seed=heads * 1000 + feat,
          split=256)


@pytest.mark.parametrize("kind", ["dot", "gatv2"])
@pytest.mark.parametrize("num_src", [240, 60000])
def test_l2_resident_launch_variants(kind, num_src):
    """Dot attention and GATv2 at 8 x 10 fp32 (8-byte vectors) launch their
    forward and row pass with more resident blocks where the gathered source
    rows fit in L2 (cuda/attention_kernels.cuh: kL2Bytes, 16 MiB): both
    launch variants against the float64 reference, 240 source nodes (the
    L2-resident one) and 60k (60000 x 80 x 4 B = 19 MB: the default one)."""
    ei = random_graph(num_src, 240, 4000, super_node=(900, 5))
    check(kind, ei, num_src, 240, 8, 10, torch.float32, edge=True, seed=num_src, split=256)


@pytest.mark.parametrize("heads,feat,dtype", [(5, 16, torch.float32), (8, 10, torch.bfloat16),
                                              (3, 64, torch.float32)])
def test_gatv2_att_gradient_on_a_capped_grid(heads, feat, dtype):
    """GATv2's row pass sums the att gradient per lane group over the (item,
    head) pairs the group takes, on a grid of at most 8 blocks per SM rounded up
    to a whole number of heads of groups (cuda/attention_launch.cuh:
    bwd_row_grid): with 40k destination rows (120k-320k pairs against at most
    ~68k groups on an H100 / H200) every group takes several pairs, and 3 and 5
    heads round the grid up.  Every gradient against float64."""
    n = 40000
    ei = random_graph(n, n, 200000, super_node=(900, 5))
    check("gatv2", ei, n, n, heads, feat, dtype, edge=True, seed=heads * 100 + feat, split=256)


@pytest.mark.parametrize("kind", ["dot", "gatv2", "dot_kscale"])
@pytest.mark.parametrize("heads,feat", [(8, 10), (8, 19), (1, 152)])
@pytest.mark.parametrize("mode", ["store", "recompute"])
@pytest.mark.parametrize("per_column", [6, 60])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_column_batch_on_short_and_long_columns(kind, heads, feat, mode, per_column, dtype,
                                                monkeypatch):
    """The wide tiles' column pass takes one edge per batch on graphs whose
    mean column length E / N_src is at most 32 (fp32: every mode but dot
    attention's alpha pass on heads of 10; fp16 / bf16: the recomputing pass),
    two on longer columns (cuda/attention_kernels.cuh: kShortColBatch;
    attention_launch.cuh: launch_col): heads of 10 (fp32: five 8-byte chunks),
    19 (padded to 20) and 152, in the stored mode (dot attention's fp32 alpha
    pass) and the recomputing one, with split rows and a super node, every
    gradient against float64."""
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", mode)
    ns, nd = 120, 240
    ei = random_graph(ns, nd, ns * per_column, super_node=(900, 5))
    assert (ei.size(1) <= 32 * ns) == (per_column < 32)
    check(kind, ei, ns, nd, heads, feat, dtype, seed=heads * feat + per_column, split=256)


@pytest.mark.parametrize("kind", ["dot", "gatv2", "dot_kscale"])
@pytest.mark.parametrize("feat", [18, 34, 66])
def test_five_chunk_tile_on_several_lanes(kind, feat):
    """fp32 widths that are a multiple of 8 bytes but not of 16, where five
    float2 chunks per lane take fewer lanes than three (cuda/attention_launch.cuh:
    dispatch, kWide8Chunks5): 18, 34, 66 on 2, 4, 8 lanes, the last lane's tile
    partly past the head (8x10 fp32 covers one lane exactly).  The lane count
    the schedule mirrors, and every gradient against float64, with split rows."""
    assert schedule.auto_group(feat, torch.float32, kind=2) == {18: 2, 34: 4, 66: 8}[feat]
    ei = random_graph(200, 180, 2400, super_node=(800, 5))
    check(kind, ei, 200, 180, 2, feat, torch.float32, edge=True, seed=feat, split=64)


@pytest.mark.parametrize("kind", ["dot", "dot_kscale"])
@pytest.mark.parametrize("feat", [2, 6, 10])
@pytest.mark.parametrize("mode", ["store", "recompute", "alpha"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_five_chunk_tile(kind, feat, mode, dtype, monkeypatch):
    """fp16 / bf16 heads of 2 mod 4 up to 10 of dot attention and AGNN run
    unpadded on one lane of five 4-byte vectors, in every pass and every
    column-pass mode (cuda/attention_launch.cuh: dispatch, half_x5_width): the
    stored pairs (PYG_DFGNN_ALPHA_MODE=0), the recomputing pass and the alpha
    pass (=1; without edge features, which that mode needs); the schedule's
    mirror (one lane, no padding), then the output, alpha and every gradient
    against float64 with split rows and a super node."""
    assert schedule.half_x5(feat, dtype, 2) and schedule.op_width(feat, dtype, 2) == feat
    assert schedule.auto_group(feat, dtype, kind=2) == 1
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "recompute" if mode == "recompute" else "store")
    monkeypatch.setenv("PYG_DFGNN_ALPHA_MODE", "1" if mode == "alpha" else "0")
    ei = random_graph(200, 180, 2400, super_node=(800, 5))
    check(kind, ei, 200, 180, 8, feat, dtype, edge=kind == "dot" and mode != "alpha", seed=feat,
          split=64)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("feat", [10, 19, 32])
def test_narrow_groups(kind, group, feat):
    ei = random_graph(150, 150, 1500, super_node=(700, 5))
    check(kind, ei, 150, 150, 3, feat, torch.float32, edge=True, group=group, split=16)


@pytest.mark.parametrize("fn,width,dtype,expected", [
    ("padded_width", 10, torch.float32, 12),
    ("padded_width", 19, torch.float32, 20),
    ("padded_width", 64, torch.float32, 64),
    ("padded_width", 10, torch.bfloat16, 12),
    ("padded_width", 19, torch.bfloat16, 20),
    ("padded_width", 16, torch.bfloat16, 16),
    # the op copies only widths that are not a multiple of the narrowest vector
    ("op_width", 10, torch.float32, 10),
    ("op_width", 6, torch.float32, 6),
    ("op_width", 19, torch.float32, 20),
    ("op_width", 64, torch.float32, 64),
    ("op_width", 10, torch.bfloat16, 12),
    ("op_width", 12, torch.bfloat16, 12),
    ("op_width", 19, torch.float16, 20),
])
def test_padded_width_mirrors_kernel(fn, width, dtype, expected):
    assert getattr(schedule, fn)(width, dtype) == expected


@pytest.mark.parametrize("width,dtype,kind,expected", [
    (10, torch.bfloat16, 0, 10),     # GAT: 4-byte vectors for halves, no copy
    (6, torch.float16, 0, 6),
    (3, torch.bfloat16, 0, 4),
    (19, torch.bfloat16, 0, 20),
    (10, torch.float32, 0, 10),
    (10, torch.bfloat16, 1, 12),     # GATv2: padded to the 8-byte vector
    (10, torch.float16, 2, 10),      # dot, AGNN: heads of 2 mod 4 up to 10 on
    (6, torch.bfloat16, 3, 6),       # five 4-byte vectors, no copy
    (14, torch.bfloat16, 2, 16),     # (wider ones pad)
    (10, torch.float32, 2, 10),
])
def test_op_width_per_kind(width, dtype, kind, expected):
    assert schedule.op_width(width, dtype, kind) == expected


def test_dot_value_width_differs_from_key_width():
    """v may be wider or narrower than q/k (no edge features): the kernel runs
    all of them at one padded width."""
    from pyg_dfgnn import ops
    ei = random_graph(120, 100, 900).cuda()
    g = get_graph(ei, (120, 100))
    gen = torch.Generator().manual_seed(3)
    for fk, fv in ((10, 24), (24, 10)):
        q = torch.randn(100, 2, fk, generator=gen, dtype=torch.float64)
        k = torch.randn(120, 2, fk, generator=gen, dtype=torch.float64)
        v = torch.randn(120, 2, fv, generator=gen, dtype=torch.float64)
        ins = [t.cuda().float().requires_grad_(True) for t in (q, k, v)]
        ref = [t.cuda().requires_grad_(True) for t in (q, k, v)]
        out, _ = ops.dot_attention(g, *ins)
        out_r, _ = ops.dot_attention(g, *ref)
        assert out.shape == (100, 2, fv)
        torch.testing.assert_close(out.double(), out_r, rtol=1e-4, atol=1e-5)
        go = torch.randn_like(out_r)
        gs = torch.autograd.grad(out, ins, go.float())
        rs = torch.autograd.grad(out_r, ref, go)
        for a, b in zip(gs, rs):
            torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["gatv2", "dot"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_tensor_on_two_sides_of_a_padded_call(kind, dtype):
    """One tensor given as two inputs of a width the op pads (8 x 19 -> 20):
    GATv2 with x_l = x_r (``share_weights``), dot attention with q = k.  The
    output and the gradient equal those of two separate copies of the tensor
    (the same kernels on the same numbers; autograd adds the two sides'
    gradients as below)."""
    from pyg_dfgnn import ops
    n, heads, feat = 300, 8, 19
    gen = torch.Generator().manual_seed(7)
    ei = random_graph(n, n, 3000, super_node=(900, 5), generator=gen)
    g = get_graph(ei.cuda(), (n, n))
    x = torch.randn(n, heads, feat, generator=gen).to("cuda", dtype).requires_grad_(True)
    x1, x2 = (x.detach().clone().requires_grad_(True) for _ in range(2))
    if kind == "gatv2":
        att = torch.randn(heads, feat, generator=gen).to("cuda", dtype)
        out, _ = ops.gatv2_attention(g, x, x, att)
        ref, _ = ops.gatv2_attention(g, x1, x2, att)
    else:
        v = torch.randn(n, heads, feat, generator=gen).to("cuda", dtype)
        out, _ = ops.dot_attention(g, x, x, v)
        ref, _ = ops.dot_attention(g, x1, x2, v)
    assert torch.equal(out, ref)
    gout = torch.randn(out.shape, generator=gen).to("cuda", dtype)
    (dx,) = torch.autograd.grad(out, (x,), gout)
    d1, d2 = torch.autograd.grad(ref, (x1, x2), gout)
    assert torch.equal(dx, d1 + d2) or torch.equal(dx, d2 + d1)
