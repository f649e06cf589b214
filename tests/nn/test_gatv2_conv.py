"""pyg_dfgnn.nn.GATv2Conv against torch_geometric.nn.GATv2Conv."""
import pytest
import torch
import torch_geometric.nn as pyg_nn

from pyg_dfgnn.nn import GATv2Conv

from ._equiv import (DEVICES, E, FORMATS, F_IN, HAS_CUDA, N,
                     assert_layer_op_equals_several_ops, check_core, check_equivalence,
                     check_backward_modes_against_float64,
                     check_backward_over_saved_projections, check_formats,
                     check_layer_op_against_float64, check_layer_op_guards,
                     check_small_calls_keep_attention,
                     check_state_dict_round_trip,
                     dropout_runs, feats, layer_op_case, layer_op_equality_cases,
                     layer_op_node, random_edge_index, saved_projection_cases)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("edge_dim", [None, 4])
@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("heads", [1, 3])
def test_core(device, heads, concat, loops, edge_dim):
    check_core(pyg_nn.GATv2Conv, GATv2Conv, device, heads, edge_dim,
               concat=concat, add_self_loops=loops)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ret", [False, True])
@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("edge_dim", [None, 3])
@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("fmt", FORMATS)
def test_formats(device, fmt, loops, edge_dim, bipartite, ret):
    check_formats(pyg_nn.GATv2Conv, GATv2Conv, device, fmt, edge_dim, bipartite, ret,
                  add_self_loops=loops)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", [dict(share_weights=True), dict(residual=True),
                                     dict(bias=False, concat=False, residual=True),
                                     dict(fill_value=1.5, negative_slope=0.05)])
def test_options(device, options):
    ei = random_edge_index(N, N, E, seed=6, device=device)
    x = feats(N, F_IN, device)
    ea = feats(E, 2, device, seed=1)
    kw = dict(in_channels=F_IN, out_channels=4, heads=2, edge_dim=2, **options)
    check_equivalence(pyg_nn.GATv2Conv, GATv2Conv, kw, (x, ei), dict(edge_attr=ea),
                      device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_lazy_and_pair_input(device):
    ns, nd = 10, 7
    ei = random_edge_index(ns, nd, E, seed=8, device=device)
    x = (feats(ns, F_IN, device), feats(nd, F_IN, device, seed=3))
    kw = dict(in_channels=-1, out_channels=4, heads=2, residual=True)
    check_equivalence(pyg_nn.GATv2Conv, GATv2Conv, kw, (x, ei),
                      dict(return_attention_weights=True), device=device, lazy=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loops", [True, False])
def test_empty_graphs(device, loops):
    kw = dict(in_channels=F_IN, out_channels=4, heads=2, add_self_loops=loops)
    no_edges = torch.empty(2, 0, dtype=torch.long, device=device)
    _, ours = check_equivalence(pyg_nn.GATv2Conv, GATv2Conv, kw,
                                (feats(N, F_IN, device), no_edges), device=device)
    assert torch.isfinite(ours).all()
    check_equivalence(pyg_nn.GATv2Conv, GATv2Conv, kw, (feats(0, F_IN, device), no_edges),
                      device=device)


def test_edge_attr_without_edge_dim_is_pygs_behaviour():
    """PyG asserts on edge features without ``edge_dim``: so do we (via PyG)."""
    ei = random_edge_index(N, N, E)
    x = feats(N, F_IN, "cpu")
    check_equivalence(pyg_nn.GATv2Conv, GATv2Conv, dict(in_channels=F_IN, out_channels=4),
                      (x, ei), dict(edge_attr=feats(E + N, 2, "cpu")))


def test_dropout_training_statistics():
    _, _, _, alpha_eval, alpha1 = dropout_runs(GATv2Conv(F_IN, 4, heads=2, dropout=0.5), 0.15)
    kept = alpha1 != 0
    assert 0.3 < kept.double().mean() < 0.7
    torch.testing.assert_close(alpha1[kept], 2 * alpha_eval[kept])


def test_state_dict_round_trip():
    check_state_dict_round_trip(pyg_nn.GATv2Conv, GATv2Conv, in_channels=(6, 5), out_channels=4,
                                heads=3, edge_dim=2, residual=True)


# ---------------------------------------------------------------------------- layer op
@layer_op_equality_cases(
    pytest.param(dict(heads=8, out_channels=10, share_weights=True), id="shared"),
    pytest.param(dict(heads=2, out_channels=8, add_self_loops=False), id="noloops"),
    gpu_bound=True)
def test_layer_op_equals_the_path_of_several_ops(kw, dtype, train, gpu_bound, monkeypatch,
                                                 deterministic):
    """An eager CUDA call on one node set (concatenated heads, no residual or
    edge features) runs as one op and one autograd node
    (``dfgnn_C::gatv2_layer``: the projections in the kernels' head width, the
    attention, the bias).  Its output is that of the layer's path of several
    ops on the same inputs and dropout seed, bit for bit, and its gradients
    within 16 roundings (its backward's Delta comes from the output less the
    bias: assert_layer_op_equals_several_ops): below the GPU-bound size and
    above it (forced: padded widths, GEMV bias gradients), with shared
    weights, in eval mode and with dropout."""
    from pyg_dfgnn.nn import _padded, gatv2_conv
    if gpu_bound:
        monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    conv, x, ei, grad = layer_op_case(GATv2Conv, kw, dtype, train)
    assert_layer_op_equals_several_ops(gatv2_conv, conv, x, ei, grad, "Gatv2LayerFn",
                                       monkeypatch,
                                       delta_from_output=True)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_small_calls_keep_the_attention_output(monkeypatch):
    """At 8 x 10, whose output is the attention output plus the bias, calls below
    the GPU-bound size keep the attention output for the backward's Delta and
    run no Delta pass; GPU-bound calls take Delta from the output
    (check_small_calls_keep_attention)."""
    check_small_calls_keep_attention(GATv2Conv, dict(heads=8, out_channels=10), "Gatv2LayerFn",
                                     monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kw", [dict(heads=8, out_channels=10), dict(heads=8, out_channels=19),
                                dict(heads=4, out_channels=64)])
def test_layer_op_against_float64(kw):
    """The one-op path in fp32 against PyG's layer in float64 with the same
    weights, within 2x PyG's own fp32 error."""
    check_layer_op_against_float64(pyg_nn.GATv2Conv, GATv2Conv, dict(in_channels=F_IN, **kw),
                                   "Gatv2LayerFn")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kw", [dict(heads=8, out_channels=19), dict(heads=4, out_channels=64)])
def test_layer_op_projections_stay_ieee(kw, monkeypatch, deterministic):
    """On calls that record gradients GATv2's projections run cuBLAS' fp32
    GEMM in every fp32 matmul mode (``ops.fp32_matmul``; cuda/dfgnn_ops.cpp,
    gatv2_forward: its gradients jump where z crosses 0, and the split GEMM's
    rounding moved more edges across it): output and gradients bit-equal
    under "split" and "ieee", on GPU-bound calls (padded heads) too
    (deterministic backward)."""
    from pyg_dfgnn.data import pattern_like_batch
    from pyg_dfgnn.nn import _padded
    from pyg_dfgnn.ops import fp32_matmul
    for bound in (False, True):
        if bound:
            monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
        ei = pattern_like_batch(4, seed=1).edge_index.cuda()
        conv = GATv2Conv(F_IN, **kw).cuda()
        x = torch.randn(int(ei.max()) + 1, F_IN, device="cuda")
        res = []
        for mode in ("split", "ieee"):
            xs = x.clone().requires_grad_()
            conv.zero_grad(set_to_none=True)
            with fp32_matmul(mode):
                out = conv(xs, ei)
                assert "Gatv2LayerFn" in layer_op_node(out)
                out.backward(torch.ones_like(out))
            res.append([out.detach(), xs.grad] + [p.grad for p in conv.parameters()])
        for a, b in zip(*res):
            assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kw", [dict(heads=4, out_channels=64),
                                dict(heads=8, out_channels=19),
                                dict(heads=8, out_channels=19, share_weights=True),
                                dict(heads=2, out_channels=16, bias=False)],
                         ids=["4x64", "8x19", "8x19-shared", "2x16-nobias"])
def test_nograd_forward_split_fp32_against_float64(kw, monkeypatch):
    """Without autograd the projections may run split on the bf16 tensor
    cores (``ops.fp32_matmul("split")``; the output is continuous in them,
    unlike the gradients): the forward against PyG's layer in float64 on a
    PATTERN batch, within 6x PyG's fp32 error (the split GEMM's 6 K + 3
    accumulated terms) + 4 fp32 roundings of the output's scale, on plain and
    GPU-bound calls (padded heads: both maps padded in one launch, or one);
    the split ran (the output differs from "ieee"'s)."""
    from pyg_dfgnn.data import pattern_like_batch
    from pyg_dfgnn.nn import _padded
    from pyg_dfgnn.ops import fp32_matmul
    gen = torch.Generator().manual_seed(kw["heads"] * kw["out_channels"])
    ei = pattern_like_batch(6, seed=2).edge_index.cuda()
    n = int(ei.max()) + 1
    ref = pyg_nn.GATv2Conv(F_IN, **kw).double()
    with torch.no_grad():
        for p in ref.parameters():   # (scale 1: scores of order ten, far from uniform)
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    state = {k: v.float() for k, v in ref.state_dict().items()}
    ref.load_state_dict({k: v.double() for k, v in state.items()})   # (the rounded weights)
    low = pyg_nn.GATv2Conv(F_IN, **kw).cuda()
    ours = GATv2Conv(F_IN, **kw).cuda()
    low.load_state_dict(state)
    ours.load_state_dict(state)
    x = torch.randn(n, F_IN, generator=gen).cuda()
    ref = ref.cuda()
    u = torch.finfo(torch.float32).eps
    for bound in (False, True):
        if bound:
            monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
        with torch.no_grad():
            want = ref(x.double(), ei)
            base = low(x, ei)
            outs = {}
            for mode in ("split", "ieee"):
                with fp32_matmul(mode):
                    outs[mode] = ours(x, ei)
        err = float((outs["split"].double() - want).abs().max())
        err_pyg = float((base.double() - want).abs().max())
        assert err <= 6.0 * err_pyg + 4 * u * float(want.abs().max()), (bound, err, err_pyg)
        assert not torch.equal(outs["split"], outs["ieee"]), bound


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["recompute", "alpha"])
def test_narrow_heads_backward_against_float64(mode, dtype, monkeypatch):
    """At 8 x 10 on GPU-bound calls (bf16 heads padded to 12) the backward
    takes Delta from the output less the bias; the recomputing and the
    (opt-in) alpha mode's row pass writes the Delta it used (re-swept in a
    nearly saturated row) over it, and the column pass reads it there: within
    2x PyG's own error against float64, with and without saturated rows (att
    x 30)."""
    check_backward_modes_against_float64(
        pyg_nn.GATv2Conv, GATv2Conv, dict(in_channels=32, heads=8, out_channels=10),
        "Gatv2LayerFn", "att", mode, dtype, monkeypatch)


@saved_projection_cases
def test_backward_over_saved_projections(kw, dtype, mode, monkeypatch, deterministic):
    """A backward that frees the graph writes d x_l over x_l (the same
    gradients as a backward that keeps it, 1 [N, H, W] block less
    memory), except where a recomputing column pass splits a head over two
    feature tiles (1 x 512): there the gradients go to a buffer of their own.
    Between forward and backward it holds its projections, output and softmax
    statistics, and the attention output besides only at heads of 128 bytes or
    more (4 x 64, 1 x 512)."""
    check_backward_over_saved_projections(GATv2Conv, kw, dtype, mode, "Gatv2LayerFn", 1, 1,
                                          2, monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_layer_op_only_where_it_applies():
    """The path of several ops runs where the one-op path does not apply:
    averaged heads, a residual, edge features, a pair of inputs, and the cases
    every layer shares (check_layer_op_guards)."""
    torch.manual_seed(0)
    ei = random_edge_index(N, N, E, device="cuda")
    x = feats(N, F_IN, "cuda", torch.float32).requires_grad_()
    node = "Gatv2LayerFn"
    conv = GATv2Conv(F_IN, 4, heads=2, edge_dim=3).cuda().eval()
    for kw in (dict(concat=False), dict(residual=True)):
        assert node not in layer_op_node(GATv2Conv(F_IN, 4, heads=2, **kw).cuda()(x, ei)), kw
    assert node not in layer_op_node(conv(x, ei, torch.randn(E, 3, device="cuda")))
    assert node not in layer_op_node(conv((x, x), ei))
    check_layer_op_guards(conv, x, ei, node, conv.lin_l)
