"""Fused CUDA kernels against the float64 reference (run on a GPU machine).

Every comparison draws fresh random inputs, poisons the CUDA caching
allocator with NaNs first (so an unwritten output element shows up as NaN)
and measures ||out - ref|| / ||ref|| for the output and every gradient.
"""
import contextlib
import gc

import pytest
import torch

from pyg_dfgnn import schedule
from pyg_dfgnn.graph import get_graph
from pyg_dfgnn.ops import reference as R
from _cases import KINDS, call, graph_case, leaves, make_inputs, op_args, random_graph

pytestmark = pytest.mark.cuda
# fp16/bf16: about 4 unit roundoffs (bf16 u = 2**-8).  The backward takes
# Delta = <dO, O> from the stored half-precision O (as FlashAttention-2), so
# dS carries O's rounding (measured on an H100: up to 3.2u for GATv2's d_dst).
TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 5e-3}


def poison():
    """Fill freed allocator blocks with NaN so unwritten outputs are caught."""
    if not torch.cuda.is_available():
        return
    free = torch.cuda.mem_get_info()[0]
    n = min(free // 4, 1 << 28) // 4
    t = torch.empty(n, dtype=torch.float32, device="cuda").fill_(float("nan"))
    del t


def rel(a, b):
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "non-finite values (unwritten output or overflow)"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(kind, ei, ns, nd, heads, feat, dtype, edge=False, dropout=0.0, seed=0,
          grads=True, tol=None, group=None, split=None, order=None):
    k = KINDS[kind]
    forced = group is not None or split is not None or order is not None

    def sched():
        return (schedule.override(group=group, split=split, order=order) if forced
                else contextlib.nullcontext())

    gen = torch.Generator().manual_seed(seed)
    inp = make_inputs(k, ns, nd, ei.size(1), heads, feat, dtype, "cuda", edge, gen)
    ref_inp = {n: (v.double().detach() if v is not None else None) for n, v in inp.items()}
    for v in leaves(inp) + leaves(ref_inp):
        v.requires_grad_(True)
    g = get_graph(ei.cuda(), (ns, nd))
    poison()
    torch.manual_seed(seed)
    with sched():
        out, alpha = call(k, g, inp, dropout, return_alpha=True)
    torch.manual_seed(seed)
    ref, ref_alpha = call(k, g, ref_inp, dropout, return_alpha=True)
    tol = tol or TOL[dtype]
    errs = {"out": rel(out, ref)}
    if ei.size(1):
        errs["alpha"] = rel(alpha, ref_alpha)
    if grads and ei.size(1):
        gout = torch.randn(out.shape, generator=gen, dtype=torch.float64).cuda()
        poison()
        with sched():
            gs = torch.autograd.grad(out, leaves(inp), gout.to(dtype))
        rs = torch.autograd.grad(ref, leaves(ref_inp), gout)
        names = [n for n, v in inp.items() if v is not None]
        for n, a, b in zip(names, gs, rs):
            errs["d_" + n] = rel(a, b)
    bad = {n: e for n, e in errs.items() if not e < tol}
    assert not bad, f"relative errors above {tol}: {bad} (all: {errs})"
    return errs


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("feat", [1, 3, 8, 64, 128, 256])
@pytest.mark.parametrize("edge", [False, True])
def test_fp32_matches_reference(kind, feat, edge):
    ei = random_graph(300, 280, 3000)
    check(kind, ei, 300, 280, 4, feat, torch.float32, edge=edge, seed=feat)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("feat", [6, 8, 10, 64])   # (6, 10: 4-byte vectors, unpadded)
def test_half_precision(kind, dtype, feat):
    ei = random_graph(200, 200, 2000)
    check(kind, ei, 200, 200, 2, feat, dtype, edge=True, seed=1)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("group", [4, 8, 16, 32])
@pytest.mark.parametrize("split", [0, 16])
def test_forced_schedules_agree(kind, group, split):
    ei = random_graph(150, 150, 1500, super_node=(700, 5))
    ei = torch.cat([ei, torch.stack([torch.full((500,), 7), torch.randint(0, 150, (500,))])], 1)
    check(kind, ei, 150, 150, 3, 24, torch.float32, edge=True, group=group, split=split)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("feat,dtype", [(1, torch.float32), (19, torch.float32),
                                        (300, torch.float32), (10, torch.bfloat16),
                                        (64, torch.bfloat16)])
def test_many_partials_per_split_row(kind, feat, dtype):
    """A row of 9,000 edges and a column of 3,000 cut into segments of 8:
    1,125 and 375 partial slots: the forward's merge strides each lane over
    hundreds of slots (more than its block's 128 threads take at once), the
    backward's sums walk them per feature, GAT's merges of scalars included;
    300 features: several passes / several features per thread."""
    gen = torch.Generator().manual_seed(feat)
    ei = random_graph(200, 200, 1000, super_node=(9000, 5), generator=gen)
    hub = torch.stack([torch.full((3000,), 7), torch.randint(0, 200, (3000,), generator=gen)])
    ei = torch.cat([ei, hub], 1)
    check(kind, ei, 200, 200, 2, feat, dtype, edge=True, seed=feat, split=8)


def _skewed_graph(n=400, seed=0):
    """Power-law-like in- and out-degrees: most rows hold 1-3 edges, a few
    hundreds (rows > MIN_SPLIT edges: skewed, so the automatic plan orders the
    work items by degree) -- with a row of degree 0 in between."""
    g = torch.Generator().manual_seed(seed)
    deg = (300.0 / torch.arange(1, n + 1).double() ** 1.2).long().clamp_min(1)
    deg[n // 2] = 0
    dst = torch.repeat_interleave(torch.randperm(n, generator=g), deg)
    src = torch.cat([torch.randint(0, n, (dst.numel() - 600,), generator=g),
                     torch.full((600,), 3)])           # a hub on the source side too
    return torch.stack([src, dst])


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("split,order", [(None, None), (0, "degree"), (16, "degree"),
                                         (64, "row")])
@pytest.mark.parametrize("dtype,feat", [(torch.float32, 24), (torch.bfloat16, 10)])
def test_degree_ordered_items(kind, split, order, dtype, feat):
    """Work items in descending degree (the automatic plan of a skewed CSR,
    rows and columns) give the reference's output and gradients, with and
    without split rows; row order on the same graph as the control."""
    ei = _skewed_graph()
    g = get_graph(ei.cuda(), (400, 400))
    assert schedule.is_skewed(g.max_in_degree, g.num_edges, g.num_dst)
    assert schedule.is_skewed(g.max_out_degree, g.num_edges, g.num_src)
    check(kind, ei, 400, 400, 3, feat, dtype, edge=True, seed=feat, split=split, order=order)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("feat,dtype,group", [(130, torch.float32, None),
                                              (300, torch.float32, None),
                                              (64, torch.float32, 4),
                                              (520, torch.bfloat16, None)])
def test_wide_features(kind, feat, dtype, group):
    """F wider than one register tile (several launch columns): scores, dP and
    Delta add the features outside the lane's tile from memory."""
    ei = random_graph(120, 110, 1200, super_node=(300, 3))
    check(kind, ei, 120, 110, 2, feat, dtype, edge=True, seed=feat, group=group, split=64)


@pytest.mark.parametrize("kind", list(KINDS))
def test_super_node_100k(kind):
    ei = random_graph(20000, 20000, 50000, super_node=(120000, 3))
    errs = check(kind, ei, 20000, 20000, 2, 32, torch.float32)
    g = get_graph(ei.cuda(), (20000, 20000))
    assert g.max_in_degree > 100000
    assert "super rows" in schedule.explain_schedule(g, KINDS[kind], 32, 2)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("feat,dtype,dropout,split", [(24, torch.float32, 0.0, None),
                                                      (24, torch.float32, 0.3, 16),
                                                      (8, torch.bfloat16, 0.0, None),
                                                      (64, torch.float16, 0.2, 16)])
def test_backward_modes_agree(kind, feat, dtype, dropout, split, monkeypatch):
    """The column pass recomputing alpha and dS (PYG_DFGNN_BACKWARD=recompute)
    uses the row pass's expressions on the same lane layout, so its gradients
    equal those of the stored per-edge arrays to a few fp32 roundings (measured
    on an H100: up to 6 ulps of the largest gradient; the compiler contracts
    the two kernels' products into FMAs differently), with edge features,
    dropout and split rows / columns; and both match the float64 reference.
    GAT's stored mode is its single-gather backward, which sums the exact
    Delta: its gradients differ from the recompute mode's by the bound of
    :func:`_gat_delta_bounds`."""
    k = KINDS[kind]
    ei, g, inp = _modes_case(k, feat, dtype, edge=True)
    grads = {}
    for mode in ("store", "recompute"):
        monkeypatch.setenv("PYG_DFGNN_BACKWARD", mode)
        check(kind, ei, 150, 150, 3, feat, dtype, edge=True, dropout=dropout, seed=feat,
              split=split)
        grads[mode], gout = _seeded_grads(k, g, inp, dropout, split)
    delta_err = (_gat_delta_bounds(k, g, inp, gout, dropout, feat, dtype) if k == R.GAT
                 else None)
    for n, (a, b) in enumerate(zip(grads["store"], grads["recompute"])):
        if dtype == torch.bfloat16 and k != R.GAT:
            # bf16's stored mode hands g and alpha~ over as bf16 pairs
            # (kPackedEdges), so the modes agree to the accuracy each has
            # against float64 (check() above): the triangle inequality of it
            assert rel(a, b) <= 2 * TOL[dtype], (n, rel(a, b))
            continue
        # 16 fp32 unit roundoffs of the largest gradient (then stored in dtype)
        tol = 16 * 2.0 ** -24 * b.abs().max().item()
        if delta_err is not None:   # GAT's stored mode: the exact Delta (see below),
            # and one rounding to dtype of the stored gradient
            tol = tol + delta_err[n] + _unit(dtype) * b.abs().max().item()
        elif getattr(k, "key_scale", False):
            # the kernels' dK is stored in dtype, then scaled by c (d_k = c dK) and
            # summed against k (d_c): a difference of the two modes' fp32 dK can
            # flip that intermediate rounding
            tol = tol + 2 * _unit(dtype) * b.abs().max().item()
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


def _modes_case(k, feat, dtype, edge):
    """``(edge_index, graph, inputs requiring grad)`` of the backward-mode
    comparisons: 150 nodes, a super node of 700 in-edges and a destination 7
    with 500 more (split rows and columns under a forced split), 3 heads of
    ``feat`` in ``dtype``, edge features where ``edge``."""
    ei = random_graph(150, 150, 1500, super_node=(700, 5))
    ei = torch.cat([ei, torch.stack([torch.full((500,), 7), torch.randint(0, 150, (500,))])], 1)
    g = get_graph(ei.cuda(), (150, 150))
    inp = make_inputs(k, 150, 150, ei.size(1), 3, feat, dtype, "cuda", edge,
                      torch.Generator().manual_seed(feat))
    for v in leaves(inp):
        v.requires_grad_(True)
    return ei, g, inp


def _seeded_grads(k, g, inp, dropout, split):
    """``(gradients of the leaves of inp, gout)`` of one call with dropout seed
    7 and schedule split ``split`` under a fixed uniform(-1, 1) output gradient
    (the same numbers for every backward mode a test compares)."""
    torch.manual_seed(7)
    with schedule.override(split=split):
        out = call(k, g, inp, dropout)[0]
        gout = torch.ones_like(out).uniform_(-1, 1, generator=torch.Generator("cuda").manual_seed(3))
        poison()
        return torch.autograd.grad(out, leaves(inp), gout), gout


def _unit(dtype):
    """Unit roundoff of ``dtype`` (half its machine epsilon)."""
    return torch.finfo(dtype).eps / 2


def _gat_delta_bounds(k, g, inp, gout, dropout, feat, dtype):
    """GAT's stored mode (the single-gather backward) sums the exact Delta_i =
    sum_j alpha~_ij dP_ij in fp32, the recompute mode's row pass takes <dO_i,
    O_i> from the stored output (rounded to ``dtype``).  Both are within
    B_i = (u_dtype + (F + deg_i + 2) u_fp32) sum_f |dO_if| sum_j alpha~_ij |v_jf|
    of Delta_i, which moves dS_ij by alpha_ij B_i: d_dst (sum_j alpha_ij = 1)
    and d_edge by B_i, d_src[j] by the sum of B_i over j's out-edges, d_val
    (no Delta) not at all.  Returns these bounds at their largest, in the
    order of ``leaves`` (sum_j alpha~ |v_j| from the float64 reference op on
    |v|, same dropout mask).  With an output bias b folded into the stored
    output Y = O + b, the recompute mode takes O' = (Y - b), both rounded to
    ``dtype``: |O' - O| <= u |O + b| + u |O|, i.e. B_i gains u sum_f |dO_if|
    (sum_j alpha~_ij |v_jf| + |b_f|)."""
    u = _unit(dtype)
    absin = {n: (v.detach().double() if v is not None else None) for n, v in inp.items()}
    absin["val"] = absin["val"].abs()
    bias = absin["att"]
    absin["att"] = None
    torch.manual_seed(7)
    with torch.no_grad():
        o_abs = call(k, g, absin, dropout)[0]
    deg = g.rowptr.diff().double().unsqueeze(1)
    ga = gout.double().abs()
    u_o = u if bias is None else 2 * u
    B = (u_o + (feat + deg + 2) * 2.0 ** -24) * (o_abs * ga).sum(-1)  # [N_dst, H]
    if bias is not None:
        B = B + u * (bias.abs() * ga).sum(-1)
    dst_of = torch.repeat_interleave(torch.arange(B.size(0), device=B.device),
                                     g.rowptr.diff().long())          # CSR order
    src_b = torch.zeros(inp["src"].size(0), B.size(1), dtype=B.dtype, device=B.device)
    src_b.index_add_(0, g.col.long(), B[dst_of])
    bounds = {"dst": B.max().item(), "src": src_b.max().item(), "val": 0.0,
              "edge": B.max().item(), "att": 0.0}   # (GAT's att: the bias, no Delta)
    return [bounds[n] for n, v in inp.items() if v is not None]


@pytest.mark.parametrize("kind", ["gat", "gat_bias"])
@pytest.mark.parametrize("heads", [1, 3, 8, 32, 33])
@pytest.mark.parametrize("split", [None, 16])
def test_gat_single_gather_heads(kind, heads, split, monkeypatch):
    """GAT's stored-mode backward maps lanes to (edge, head) pairs of a warp
    (32 // H edges per step, per-head tree sums): every head count up to 32,
    and 33 heads (the two-pass backward, which takes Delta from the stored
    output, minus the folded bias), with dropout, edge features and split
    rows / columns, with and without an output bias, against the float64
    reference."""
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "store")
    ei = random_graph(150, 140, 1500, super_node=(700, 5))
    ei = torch.cat([ei, torch.stack([torch.full((300,), 7), torch.randint(0, 140, (300,))])], 1)
    check(kind, ei, 150, 140, heads, 16, torch.float32, edge=True, dropout=0.2,
          seed=heads, split=split)


@pytest.mark.parametrize("kind", ["gat", "gat_bias"])
@pytest.mark.parametrize("heads", [1, 3, 8, 32])
@pytest.mark.parametrize("split", [None, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gat_atomic_backward(kind, heads, split, dtype, monkeypatch):
    """GAT without edge features stores nothing per edge in the default mode:
    Delta from the stored output, the destination rows' sums added atomically
    by the column pass, then the exact-Delta correction (cuda/attention_kernels.cuh,
    kColAtomic).  Every head count of the single-gather mapping, with and
    without the output bias, dropout, split rows / columns (a super row and a
    super column), against the float64 reference."""
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "auto")
    ei = random_graph(150, 140, 1500, super_node=(700, 5))
    ei = torch.cat([ei, torch.stack([torch.full((300,), 7), torch.randint(0, 140, (300,))])], 1)
    check(kind, ei, 150, 140, heads, 16, dtype, dropout=0.2, seed=heads, split=split)


@pytest.mark.parametrize("mode", ["auto", "store"])
@pytest.mark.parametrize("heads,feat", [(8, 10), (8, 20), (4, 64), (1, 256), (3, 8), (2, 6)])
@pytest.mark.parametrize("split", [None, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gat_atomic_backward_lean(heads, feat, split, dtype, mode, monkeypatch):
    """GAT's backward without dropout, where its column pass is the lean one
    (bwd_col_lean_kernel: no edge features, no dropout, the head in one launch
    column) in the atomic (auto) and single-gather (store) modes: the paper
    shapes' widths -- 10 and 20 on five-chunk tiles, one lane per head
    (attention_launch.cuh, dispatch) --, a head of 32 lanes, 3 x 8 and 2 x 6,
    split rows / columns, against the float64 reference (the atomics' order
    varies from run to run, so the lean / plain comparison bit for bit is
    tests/ops/test_lean_kernels.py's on the deterministic single-gather
    mode)."""
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", mode)
    ei = random_graph(150, 140, 1500, super_node=(700, 5))
    ei = torch.cat([ei, torch.stack([torch.full((300,), 7), torch.randint(0, 140, (300,))])], 1)
    check("gat", ei, 150, 140, heads, feat, dtype, dropout=0.0, seed=heads * feat, split=split)


@pytest.mark.parametrize("hub_min", ["1", "40", "600"])
@pytest.mark.parametrize("heads,feat", [(8, 10), (8, 19), (4, 64), (1, 256), (3, 8)])
@pytest.mark.parametrize("split", [None, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gat_atomic_backward_hubs(heads, feat, split, dtype, hub_min, monkeypatch):
    """GAT's atomic column pass with hub rows (attention_kernels.cuh, HubCache):
    the rows of in-degree >= PYG_DFGNN_GAT_HUB_MIN add their sums in each
    block's shared-memory slots, flushed with one atomic per slot.  1: every
    row is a hub, more (row, head) keys than slots, so slots collide and
    terms fall back to the global atomics; 40: the super row (in-degree about
    700, all 140 columns) and a few others; 600: the super row alone.
    Against the float64 reference."""
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "auto")
    monkeypatch.setenv("PYG_DFGNN_GAT_HUB_MIN", hub_min)
    ei = random_graph(150, 140, 1500, super_node=(700, 5))
    ei = torch.cat([ei, torch.stack([torch.full((300,), 7), torch.randint(0, 140, (300,))])], 1)
    check("gat", ei, 150, 140, heads, feat, dtype, dropout=0.0, seed=heads * feat, split=split)


@pytest.mark.parametrize("heads,feat,dtype", [(8, 10, torch.float32), (8, 19, torch.bfloat16),
                                              (8, 19, torch.float32), (4, 64, torch.float32)])
def test_gat_atomic_backward_powerlaw_hubs(heads, feat, dtype, monkeypatch):
    """The default hub rule (gat_hub_min: a graph whose schedule splits rows,
    heads of at most 32 features, in-degree >= 2 N_src G H / 256) on a
    power-law graph with super nodes, the hubs' sums through the blocks'
    caches (4 x 64: without), against the float64 reference."""
    from pyg_dfgnn.data import synthetic
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "auto")
    monkeypatch.delenv("PYG_DFGNN_GAT_HUB_MIN", raising=False)
    ei = synthetic.powerlaw_graph(3000, 40000, 2500, seed=3)
    g = get_graph(ei.cuda(), (3000, 3000))   # (the schedule splits its super rows)
    assert g.max_in_degree > schedule.auto_split(g.num_edges, heads, 32, g.device)
    check("gat", ei, 3000, 3000, heads, feat, dtype, dropout=0.0, seed=feat)


def test_gat_hub_min_bad_value(monkeypatch):
    """A malformed PYG_DFGNN_GAT_HUB_MIN is a clear error naming it."""
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "auto")
    monkeypatch.setenv("PYG_DFGNN_GAT_HUB_MIN", "many")
    ei = random_graph(50, 50, 400)
    with pytest.raises(RuntimeError, match="PYG_DFGNN_GAT_HUB_MIN"):
        check("gat", ei, 50, 50, 2, 8, torch.float32)


@pytest.mark.parametrize("kind", ["gat", "gat_bias"])
@pytest.mark.parametrize("dropout,split", [(0.0, None), (0.3, 16)])
def test_gat_atomic_agrees_with_store(kind, dropout, split, monkeypatch):
    """The atomic backward (auto mode, no edge features) and the stored
    single-gather one: the stored mode sums the exact Delta = sum_j alpha~_ij
    dP_ij, the atomic one too in rows one edge dominates (in any order) and
    takes <dO_i, O_i> in the others: each is within the bound B of
    :func:`_gat_delta_bounds` of exact Delta, and the atomic mode's d_dst sums its centred terms
    sum_j |dS_ij| <= 2 sum_f |dO_if| sum_j alpha~_ij |v_jf| in any order (at
    most 2 B more), so the modes differ by at most 3 B besides 16 fp32
    roundings of the largest gradient (and one rounding to the dtype)."""
    k = KINDS[kind]
    ei = random_graph(150, 150, 1500, super_node=(700, 5))
    ei = torch.cat([ei, torch.stack([torch.full((500,), 7), torch.randint(0, 150, (500,))])], 1)
    g = get_graph(ei.cuda(), (150, 150))
    inp = make_inputs(k, 150, 150, ei.size(1), 3, 24, torch.float32, "cuda", False,
                      torch.Generator().manual_seed(1))
    for v in leaves(inp):
        v.requires_grad_(True)
    grads = {}
    for mode in ("store", "auto"):
        monkeypatch.setenv("PYG_DFGNN_BACKWARD", mode)
        grads[mode], gout = _seeded_grads(k, g, inp, dropout, split)
    delta_err = _gat_delta_bounds(k, g, inp, gout, dropout, 24, torch.float32)
    for n, (a, b) in enumerate(zip(grads["auto"], grads["store"])):
        tol = 16 * 2.0 ** -24 * b.abs().max().item() + 3 * delta_err[n] \
            + _unit(torch.float32) * b.abs().max().item()
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


def test_gat_atomic_backward_in_a_cuda_graph(monkeypatch):
    """GAT's atomic backward (its zeroed sums, atomics and correction passes)
    captured in a CUDA graph and replayed gives the eager gradients, within
    the bound of :func:`test_gat_atomic_agrees_with_store` for two orders of
    the atomic sums."""
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "auto")
    k = KINDS["gat_bias"]
    ei = random_graph(150, 150, 1500, super_node=(700, 5))
    g = get_graph(ei.cuda(), (150, 150))
    inp = make_inputs(k, 150, 150, ei.size(1), 4, 16, torch.float32, "cuda", False,
                      torch.Generator().manual_seed(2))
    for v in leaves(inp):
        v.requires_grad_(True)
    gout = torch.randn(150, 4, 16, device="cuda")

    def grads():   # (the upstream gradient as a static input: <out, gout>)
        return torch.autograd.grad((call(k, g, inp)[0] * gout).sum(), leaves(inp))

    eager = grads()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up off the capture
        grads()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = grads()
    graph.replay()
    torch.cuda.synchronize()
    delta_err = _gat_delta_bounds(k, g, inp, gout, 0.0, 16, torch.float32)
    for n, (a, b) in enumerate(zip(captured, eager)):
        tol = 16 * 2.0 ** -24 * b.abs().max().item() + 3 * delta_err[n]
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


@pytest.mark.parametrize("kind", ["gat", "gat_bias"])
def test_gat_backward_memory_and_determinism(kind, monkeypatch):
    """GAT's default backward keeps nothing per edge; with
    ``torch.use_deterministic_algorithms`` it takes the stored single-gather
    backward (no atomics), whose gradients are bit-identical run to run and
    which keeps one fp32 [E, H] array."""
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "auto")
    N, E, H, F = 2000, 1_000_000, 8, 8
    k = KINDS[kind]
    _, g, inp = graph_case(k, N, N, E, H, F, torch.float32, device="cuda",
                           generator=torch.Generator().manual_seed(5))
    gout = torch.randn(N, H, F, device="cuda")
    per_edge_array = E * H * 4
    extra, _ = _backward_extra(k, g, inp, gout)
    assert extra < per_edge_array / 4, extra
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        extra, g1 = _backward_extra(k, g, inp, gout)
        _, g2 = _backward_extra(k, g, inp, gout)
    finally:
        torch.use_deterministic_algorithms(was)
    assert extra >= per_edge_array
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


@pytest.mark.parametrize("heads,feat,nodes,dtype", [
    (8, 12, 3000, torch.bfloat16),   # one lane per head: 256 groups a block, 8 heads' rows
    (5, 16, 30000, torch.float32),   # 2 lanes: 128 groups, heads q, q + 5, ...; capped grid
    (3, 300, 400, torch.float32),    # one warp per head: 8 groups, 3 heads' rows
    (32, 128, 200, torch.float32),   # 16 lanes per head: 16 groups < 32 heads, a row per group
])
def test_gatv2_att_gradient_block_rows(heads, feat, nodes, dtype):
    """GATv2's att gradient is summed per block of the row pass (its groups of
    each head, in a fixed order) into one partial row per head and block, or
    per group where a block has fewer groups than heads, on the capped grid
    (cuda/attention_launch.cuh: bwd_row_grid): d_att against float64 where a
    block's groups cover all heads several times, unevenly (5 heads), fewer
    heads than groups and more heads than groups; repeated calls equal bit for
    bit (a fixed summation order)."""
    ei = random_graph(nodes, nodes, 6 * nodes, super_node=(300, 2))
    check("gatv2", ei, nodes, nodes, heads, feat, dtype, seed=heads)
    k = KINDS["gatv2"]
    g = get_graph(ei.cuda(), (nodes, nodes))
    inp = make_inputs(k, nodes, nodes, ei.size(1), heads, feat, dtype, "cuda")
    for v in leaves(inp):
        v.requires_grad_(True)
    gout = torch.randn(nodes, heads, feat, device="cuda", dtype=dtype)
    d_att = [torch.autograd.grad(call(k, g, inp)[0], inp["att"], gout)[0] for _ in range(2)]
    assert torch.equal(d_att[0], d_att[1])


@pytest.mark.parametrize("kind", ["dot", "gatv2"])
@pytest.mark.parametrize("feat,dtype,dropout,split", [(10, torch.float32, 0.0, None),
                                                      (20, torch.float32, 0.3, 16),
                                                      (8, torch.float16, 0.2, 16),
                                                      (12, torch.float16, 0.0, None),
                                                      (10, torch.bfloat16, 0.2, 16),
                                                      (20, torch.bfloat16, 0.0, None)])
def test_alpha_mode_agrees_with_store(kind, feat, dtype, dropout, split, monkeypatch):
    """The stored mode at heads under 128 bytes without edge features keeps
    alpha only (kColAlpha: the column pass forms dP itself, on the row pass's
    lane layout, and g from the row pass's Delta) -- dot attention's fp32 /
    fp16 by default, GATv2's and bf16 with ``PYG_DFGNN_ALPHA_MODE=1`` --
    with dropout and split rows / columns: both modes match the float64
    reference; in fp32 / fp16 the gradients equal those of the two-array stored
    mode (``PYG_DFGNN_ALPHA_MODE=0``) to 16 fp32 roundings of the largest
    gradient (then one rounding to dtype).  (bf16: the packed pairs round g and
    alpha~ to bf16, the alpha mode alpha, so the two differ by bf16 roundings of
    every term; the float64 checks bound both.)  The backward keeps one [E, H]
    array (fp32; bf16 inputs: bf16) and the rows' Delta [N, H] instead of two
    fp32 [E, H] arrays (bf16: one array of bf16 pairs)."""
    k = KINDS[kind]
    ei, g, inp = _modes_case(k, feat, dtype, edge=False)
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "store")
    grads, extra = {}, {}
    for mode in ("1", "0"):
        monkeypatch.setenv("PYG_DFGNN_ALPHA_MODE", mode)
        check(kind, ei, 150, 150, 3, feat, dtype, dropout=dropout, seed=feat, split=split)
        grads[mode], gout = _seeded_grads(k, g, inp, dropout, split)
        extra[mode] = _backward_extra(k, g, inp, gout)[0]
    if dtype == torch.bfloat16:
        return   # (its per-edge memory: test_bf16_alpha_mode_keeps_two_bytes_per_edge)
    for n, (a, b) in enumerate(zip(grads["1"], grads["0"])):
        tol = (16 * 2.0 ** -24 + _unit(dtype)) * b.abs().max().item()
        torch.testing.assert_close(a, b, rtol=0, atol=tol, msg=str(n))
    per_edge_array, delta = ei.size(1) * 3 * 4, 150 * 3 * 4
    assert extra["0"] - extra["1"] >= per_edge_array - delta - 512, (extra, per_edge_array)


@pytest.mark.parametrize("kind", ["dot", "gatv2"])
def test_bf16_alpha_mode_keeps_two_bytes_per_edge(kind, monkeypatch):
    """bf16's alpha mode (``PYG_DFGNN_ALPHA_MODE=1``) keeps alpha as one bf16
    per (edge, head): on a graph of 10^6 edges and 8 heads of 8 (16 bytes) the
    stored backward's peak holds that 16 MB array and not the packed (g,
    alpha~) pairs' 32 MB (the default), next to O(N H F) gradients (~1 MB);
    gradients finite and the float64 check passed on this graph."""
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "store")
    monkeypatch.setenv("PYG_DFGNN_ALPHA_MODE", "1")
    N, E, H, F = 2000, 1_000_000, 8, 8
    ei = random_graph(N, N, E, generator=torch.Generator().manual_seed(7))
    check(kind, ei, N, N, H, F, torch.bfloat16, seed=7)
    k = KINDS[kind]
    g = get_graph(ei.cuda(), (N, N))
    inp = make_inputs(k, N, N, ei.size(1), H, F, torch.bfloat16, "cuda")
    for v in leaves(inp):
        v.requires_grad_(True)
    gout = torch.randn(N, H, F, device="cuda", dtype=torch.bfloat16)
    alpha_array = ei.size(1) * H * 2
    extra, grads = _backward_extra(k, g, inp, gout)
    assert alpha_array <= extra < 2 * alpha_array - alpha_array // 4, (extra, alpha_array)
    assert all(torch.isfinite(x).all() for x in grads)
    monkeypatch.delenv("PYG_DFGNN_ALPHA_MODE")
    assert _backward_extra(k, g, inp, gout)[0] >= 2 * alpha_array


def test_backward_mode_env_is_checked(monkeypatch):
    k = KINDS["dot"]
    ei = random_graph(20, 20, 100)
    g = get_graph(ei.cuda(), (20, 20))
    inp = make_inputs(k, 20, 20, ei.size(1), 2, 8, torch.float32, "cuda")
    for v in leaves(inp):
        v.requires_grad_(True)
    out = call(k, g, inp)[0]
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "fast")
    with pytest.raises(RuntimeError, match="PYG_DFGNN_BACKWARD"):
        torch.autograd.grad(out.sum(), leaves(inp))


@pytest.mark.parametrize("kind", list(KINDS))
def test_backward_keeps_nothing_per_edge(kind, monkeypatch):
    """In recompute mode the column pass recomputes alpha and dS from the row
    statistics: the backward allocates O(N H F) (gradients, Delta), no [E, H]
    array.  A graph of 2000 nodes and 10^6 edges: one fp32 [E, H] array is
    32 MB; the gradients and Delta take ~2 MB (stored mode: 64 MB of per-edge
    arrays, also checked).  Also checks the gradients against float64 there."""
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "recompute")
    N, E, H, F = 2000, 1_000_000, 8, 8
    ei = random_graph(N, N, E, generator=torch.Generator().manual_seed(5))
    check(kind, ei, N, N, H, F, torch.float32, seed=5)   # correctness on this graph
    k = KINDS[kind]
    g = get_graph(ei.cuda(), (N, N))
    inp = make_inputs(k, N, N, ei.size(1), H, F, torch.float32, "cuda")
    for v in leaves(inp):
        v.requires_grad_(True)
    gout = torch.randn(N, H, F, device="cuda")
    extra, grads = _backward_extra(k, g, inp, gout)
    per_edge_array = ei.size(1) * H * 4
    assert extra < per_edge_array / 4, (
        f"backward allocated {extra / 2**20:.1f} MiB, an [E, H] fp32 array is "
        f"{per_edge_array / 2**20:.1f} MiB")
    assert all(torch.isfinite(x).all() for x in grads)
    # the stored mode does keep its per-edge arrays (the measurement above can
    # see them): g and pd, GAT's one dP / g array, or dot attention's alpha
    # (kColAlpha: fp32 heads of 8, no edge features)
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "store")
    arrays = 1 if k in (R.GAT, R.DOT) else 2
    assert _backward_extra(k, g, inp, gout)[0] >= arrays * per_edge_array


def _backward_extra(k, g, inp, gout):
    """Bytes the backward of one call allocates at its peak, and the gradients.
    (Garbage in reference cycles -- e.g. an earlier test's -- is collected
    first: freed by a collection inside the measured backward it would lower
    the peak over ``before`` by its size, as it once did by 7.7 MB on the H200.)"""
    out = call(k, g, inp)[0]
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    grads = torch.autograd.grad(out, leaves(inp), gout)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, grads


def test_forced_backward_mode_overrides_the_env(monkeypatch):
    """``pyg_dfgnn.ops.backward_mode`` (the training config's
    ``attention_backward``) forces the mode whatever PYG_DFGNN_BACKWARD says,
    and ``None`` hands the choice back to it; seen in the per-edge memory."""
    from pyg_dfgnn.ops import backward_mode
    N, E, H, F = 1000, 400_000, 8, 8
    k = KINDS["gat"]
    _, g, inp = graph_case(k, N, N, E, H, F, torch.float32, device="cuda",
                           generator=torch.Generator().manual_seed(6))
    gout = torch.randn(N, H, F, device="cuda")
    per_edge_array = E * H * 4
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "store")
    with backward_mode("recompute"):
        assert torch.ops.dfgnn_C.get_backward_mode() == 1
        assert _backward_extra(k, g, inp, gout)[0] < per_edge_array / 4
        with backward_mode(None):   # not forced: the environment's store (GAT: 1 array)
            assert _backward_extra(k, g, inp, gout)[0] >= per_edge_array
    assert torch.ops.dfgnn_C.get_backward_mode() == -1
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "recompute")
    with backward_mode("store"):
        assert _backward_extra(k, g, inp, gout)[0] >= per_edge_array
    # the library takes -1..2 only; other values change nothing (-2)
    assert torch.ops.dfgnn_C.set_backward_mode(5) == -2
    assert torch.ops.dfgnn_C.get_backward_mode() == -1


@pytest.mark.parametrize("kind", list(KINDS))
def test_dropout_matches_reference_mask(kind):
    ei = random_graph(100, 100, 1200)
    check(kind, ei, 100, 100, 2, 16, torch.float32, edge=True, dropout=0.4, seed=3)


@pytest.mark.parametrize("kind", list(KINDS))
def test_bipartite_and_empty(kind):
    ei = random_graph(90, 40, 500, self_loops=False)
    check(kind, ei, 90, 40, 2, 16, torch.float32, edge=True)
    ei = torch.zeros(2, 0, dtype=torch.long)
    check(kind, ei, 7, 5, 2, 16, torch.float32, grads=False)
    ei = torch.zeros(2, 0, dtype=torch.long)
    check(kind, ei, 0, 0, 2, 16, torch.float32, grads=False)


@pytest.mark.parametrize("kind", list(KINDS))
def test_int64_indices(kind):
    ei = random_graph(120, 120, 900)
    g = get_graph(ei.cuda(), (120, 120))
    g64 = type(g)(**{**g.__dict__, "plans": {}})
    for name in ("rowptr", "col", "perm", "t_rowptr", "t_col", "t_perm"):
        t = getattr(g, name)
        setattr(g64, name, t.long() if t is not None else None)
    k = KINDS[kind]
    inp = make_inputs(k, 120, 120, ei.size(1), 2, 16, torch.float32, "cuda", True)
    a = call(k, g, inp)[0]
    b = call(k, g64, inp)[0]
    assert rel(b, a) < 1e-6


@pytest.mark.parametrize("kind", list(KINDS))
def test_opcheck(kind):
    from pyg_dfgnn.ops import fused
    k = KINDS[kind]
    ei = random_graph(40, 40, 200)
    g = get_graph(ei.cuda(), (40, 40))
    inp = make_inputs(k, 40, 40, ei.size(1), 2, 8, torch.float32, "cuda", True)
    for v in leaves(inp):
        v.requires_grad_(True)
    args = op_args(k, g, inp, need_alpha=True)
    torch.library.opcheck(fused.attention_fwd, args)


@pytest.mark.parametrize("kind", list(KINDS))
def test_opcheck_graph_attention(kind):
    """The op on an edge_index (what compiled layers call) on CUDA, with a
    split schedule (super node): opcheck, and bit-identical to the CSR op."""
    from pyg_dfgnn.ops import fused
    k = KINDS[kind]
    ei = random_graph(300, 300, 4000, super_node=(2000, 1)).cuda()
    g = get_graph(ei, (300, 300))
    inp = make_inputs(k, 300, 300, ei.size(1), 2, 16, torch.float32, "cuda", True)
    for v in leaves(inp):
        v.requires_grad_(True)
    args = (int(k), ei, 300, 300, -1, inp["dst"], inp["src"], inp["val"], inp["edge"],
            inp["att"], 0.5, 0.2, 0.0, None)
    torch.library.opcheck(fused.graph_attention_fwd, args)
    out = fused.graph_attention_fwd(*args)[0]
    grads = torch.autograd.grad(out.square().sum(), leaves(inp))
    # the CSR op with the same (automatic, split) schedule and scale
    plan = schedule.plan_for(g, k, 16, 2, torch.float32)
    ref = fused.attention_fwd(*(op_args(k, g, inp)[:17] + (
        plan.sched, plan.work, plan.merge, plan.t_work, plan.t_merge)))[0]
    ref_grads = torch.autograd.grad(ref.square().sum(), leaves(inp))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("kind", list(KINDS))
def test_eager_route_equals_custom_op(kind):
    """Eager CUDA calls take ``EagerAttention`` (no custom-op dispatch); it must
    give bit-identical outputs and gradients to the registered custom op."""
    from pyg_dfgnn.ops import fused
    k = KINDS[kind]
    ei = random_graph(300, 300, 4000, super_node=(2000, 1))
    g = get_graph(ei.cuda(), (300, 300))
    inp = make_inputs(k, 300, 300, ei.size(1), 2, 16, torch.float32, "cuda", True)
    for v in leaves(inp):
        v.requires_grad_(True)
    seed = torch.tensor([1234])
    args = op_args(k, g, inp, dropout=0.25, seed=seed, need_alpha=True)
    results = []
    for fn in (fused.attention, fused.attention_fwd):
        out, lse, alpha = fn(*args)
        gr = torch.autograd.grad(out, leaves(inp), torch.ones_like(out))
        results.append((out, lse, alpha) + tuple(gr))
    assert isinstance(fused.attention(*args)[0].grad_fn, fused.EagerAttention._backward_cls)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_deterministic_backward():
    ei = random_graph(500, 500, 8000, super_node=(5000, 2))
    g = get_graph(ei.cuda(), (500, 500))
    inp = make_inputs(R.DOT, 500, 500, ei.size(1), 2, 32, torch.float32, "cuda", True)
    for v in leaves(inp):
        v.requires_grad_(True)
    with schedule.override(split=256):
        out = call(R.DOT, g, inp)[0]
        g1 = torch.autograd.grad(out, leaves(inp), torch.ones_like(out))
        out = call(R.DOT, g, inp)[0]
        g2 = torch.autograd.grad(out, leaves(inp), torch.ones_like(out))
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


def test_captured_degree_order_follows_the_replayed_graph():
    """The CUDA-graph training steps build their CSR views inside the capture
    (pyg_dfgnn/train/graphed.py), so a degree-ordered plan (automatic from
    ORDER_MIN_EDGES edges) is built by device ops in the capture too: a replay
    on other edges of the same count must order *those* rows.  Forward and
    backward of a replay on graph B equal the eager CSR-order call on B
    bit for bit (each row sums its edges in the same order either way)."""
    from pyg_dfgnn.data.batching import sorted_graph_views
    from pyg_dfgnn.ops import dot_attention
    N, E, H, F = 12000, schedule.ORDER_MIN_EDGES + 500, 2, 16
    gen = torch.Generator().manual_seed(5)

    def edges(skew):   # target-sorted, in-degrees up to ~110
        dst = (torch.rand(E, generator=gen) ** skew * N).long().clamp_max(N - 1).sort().values
        return torch.stack([torch.randint(0, N, (E,), generator=gen), dst])
    A, B = edges(1.0), edges(1.2)
    deg = [torch.bincount(e[i], minlength=N) for e in (A, B) for i in (0, 1)]
    max_out, max_in = max(int(deg[0].max()), int(deg[2].max())), max(int(deg[1].max()),
                                                                       int(deg[3].max()))
    assert max_in <= schedule.MIN_SPLIT      # no split rows: one item per row
    buf = A.cuda()
    q, k, v = (torch.randn(N, H, F, generator=gen).cuda().requires_grad_(True) for _ in range(3))
    gout = torch.randn(N, H, F, generator=gen).cuda()

    def body():
        g = sorted_graph_views(buf, N, (False,), [max_in], [max_out])[0]
        out, _ = dot_attention(g, q, k, v, None, None, 0.0)
        return (out,) + torch.autograd.grad(out, (q, k, v), gout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = body()
    buf.copy_(B.cuda())
    graph.replay()
    torch.cuda.synchronize()
    g_b = sorted_graph_views(buf, N, (False,), [max_in], [max_out])[0]
    assert "work items by degree" in schedule.plan_for(g_b, R.DOT, F, H, torch.float32).reason
    with schedule.override(order="row"):
        ref = body()
    for name, a, b in zip(("out", "d_q", "d_k", "d_v"), captured, ref):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("kind,dtype,feat,edge_bytes,rows", [("gatv2", torch.bfloat16, 12, 4, 2),
                                                             ("dot", torch.bfloat16, 12, 4, 1),
                                                             ("dot", torch.bfloat16, 20, 4, 1),
                                                             ("gatv2", torch.float32, 10, 8, 2)])
def test_auto_mode_recomputes_narrow_heads_on_short_columns(kind, dtype, feat, edge_bytes,
                                                            rows, monkeypatch):
    """``PYG_DFGNN_BACKWARD=auto`` recomputes where the stored per-edge arrays
    (E x H x edge_bytes) would outweigh ``rows`` times the source rows (twice;
    once for dot attention in fp16 / bf16) and the columns are short (at most
    32 edges per source node on average: the recomputing column pass's
    one-edge batches, cuda/attention_launch.cuh: recompute_lean): 8 heads of
    12 bf16 (GATv2, dot), of 20 bf16 (dot: the Transformer's 8 x 19) or 10
    fp32 (GATv2) at 16 edges per source column keep nothing per edge, as the
    recompute mode; at 64 per column (longer columns) auto stores, as the
    store mode.  The float64 check passes on both graphs in auto mode."""
    k, H = KINDS[kind], 8
    for ns, per_column, recomputes in ((20000, 16, True), (5000, 64, False)):
        nd = 20000
        ei = random_graph(ns, nd, ns * per_column, generator=torch.Generator().manual_seed(3))
        E = ei.size(1)
        assert (E * edge_bytes > rows * ns * feat * dtype.itemsize) and (E <= 32 * ns) == recomputes
        g = get_graph(ei.cuda(), (ns, nd))
        inp = make_inputs(k, ns, nd, E, H, feat, dtype, "cuda")
        for v in leaves(inp):
            v.requires_grad_(True)
        gout = torch.randn(nd, H, feat, device="cuda", dtype=dtype)
        extra = {}
        for mode in ("auto", "store", "recompute"):
            monkeypatch.setenv("PYG_DFGNN_BACKWARD", mode)
            extra[mode] = _backward_extra(k, g, inp, gout)[0]
        per_edge = E * H * edge_bytes
        assert extra["store"] - extra["recompute"] >= per_edge - nd * H * 4 - 2**20, extra
        same = extra["recompute" if recomputes else "store"]
        assert abs(extra["auto"] - same) < per_edge // 8, (recomputes, extra)
        monkeypatch.setenv("PYG_DFGNN_BACKWARD", "auto")
        check(kind, ei, ns, nd, H, feat, dtype, seed=per_column)
