"""pyg_dfgnn.nn.TransformerConv against torch_geometric.nn.TransformerConv."""
import gc

import pytest
import torch
import torch_geometric.nn as pyg_nn

from pyg_dfgnn.nn import TransformerConv

from ._equiv import (DEVICES, E, FORMATS, F_IN, HAS_CUDA, N,
                     assert_layer_op_equals_several_ops, check_bias_grad_over_kept_ones,
                     check_core, check_equivalence, check_backward_modes_against_float64,
                     check_backward_over_saved_projections, check_formats,
                     check_layer_op_against_float64, check_layer_op_guards,
                     check_split_fp32_against_float64,
                     check_small_calls_keep_attention,
                     check_state_dict_round_trip,
                     dropout_runs, feats, layer_op_case, layer_op_equality_cases,
                     layer_op_node, make_adj, random_edge_index,
                     saved_projection_cases)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("edge_dim", [None, 4])
@pytest.mark.parametrize("beta,root_weight", [(False, True), (True, True), (False, False)])
@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("heads", [1, 3])
def test_core(device, heads, concat, beta, root_weight, edge_dim):
    check_core(pyg_nn.TransformerConv, TransformerConv, device, heads, edge_dim,
               concat=concat, beta=beta,
               root_weight=root_weight)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ret", [False, True])
@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("edge_dim", [None, 3])
@pytest.mark.parametrize("fmt", FORMATS)
def test_formats(device, fmt, edge_dim, bipartite, ret):
    check_formats(pyg_nn.TransformerConv, TransformerConv, device, fmt, edge_dim, bipartite, ret,
                  beta=True)


@pytest.mark.parametrize("device", DEVICES)
def test_bias_false_lazy_and_return_false(device):
    ei = random_edge_index(N, N, E, seed=5, device=device)
    x = feats(N, F_IN, device)
    ea = feats(E, 2, device, seed=1)
    kw = dict(in_channels=-1, out_channels=4, heads=2, bias=False, edge_dim=2)
    # TransformerConv returns the weights for any bool, False included
    out, _ = check_equivalence(pyg_nn.TransformerConv, TransformerConv, kw, (x, ei),
                               dict(edge_attr=ea, return_attention_weights=False),
                               device=device, lazy=True)
    assert isinstance(out, tuple)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_graphs(device):
    kw = dict(in_channels=F_IN, out_channels=4, heads=2, edge_dim=2)
    no_edges = torch.empty(2, 0, dtype=torch.long, device=device)
    ea = feats(0, 2, device)
    _, ours = check_equivalence(pyg_nn.TransformerConv, TransformerConv, kw,
                                (feats(N, F_IN, device), no_edges), dict(edge_attr=ea),
                                device=device)
    assert torch.isfinite(ours).all()
    check_equivalence(pyg_nn.TransformerConv, TransformerConv, kw,
                      (feats(0, F_IN, device), no_edges), dict(edge_attr=ea), device=device)


def test_edge_attr_without_edge_dim_goes_to_pyg():
    """PyG adds raw edge features to the values when ``edge_dim`` is None;
    the fused path cannot, so it hands the call to PyG (identical result)."""
    ei = random_edge_index(N, N, E)
    x = feats(N, F_IN, "cpu")
    check_equivalence(pyg_nn.TransformerConv, TransformerConv,
                      dict(in_channels=F_IN, out_channels=4, heads=2), (x, ei),
                      dict(edge_attr=feats(E, 4, "cpu")), fallback="edge_dim")


def test_dropout_training_statistics():
    """In training, the output uses dropped attention (unbiased), while the
    returned weights are PyG's pre-dropout softmax."""
    conv = TransformerConv(F_IN, 4, heads=2, dropout=0.5, root_weight=False)
    _, _, _, alpha_eval, alpha1 = dropout_runs(conv, 0.15)
    torch.testing.assert_close(alpha1, alpha_eval)
    assert conv._alpha is None


def test_state_dict_round_trip():
    check_state_dict_round_trip(pyg_nn.TransformerConv, TransformerConv,
                                in_channels=(6, 5), out_channels=4, heads=3, edge_dim=2, beta=True)


@pytest.mark.parametrize("fmt", ["edge_index", "SparseTensor"])
def test_direct_propagate_call(fmt):
    """Calling ``propagate`` directly (as a subclass's forward might) works."""
    ei = random_edge_index(N, N, E)
    adj, _ = make_adj(ei, fmt, N, N)
    ref, ours = (cls(F_IN, 4, heads=2).double() for cls in
                 (pyg_nn.TransformerConv, TransformerConv))
    ours.load_state_dict(ref.state_dict())
    q, k, v = (torch.randn(N, 2, 4, dtype=torch.float64) for _ in range(3))
    a = ref.propagate(adj, query=q, key=k, value=v, edge_attr=None)
    b = ours.propagate(adj, query=q, key=k, value=v, edge_attr=None)
    torch.testing.assert_close(a, b)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,chans", [(4, 64), (8, 10), (8, 19)])
@pytest.mark.parametrize("nodes", [600, 60000])
@pytest.mark.parametrize("bipartite", [False, True])
def test_inference_adds_the_root_weight_in_the_kernel(dtype, heads, chans, nodes, bipartite,
                                                      monkeypatch):
    """Without autograd (inference, validation) the root weight ``x_i W_r``
    is the op's residual, added in the kernel's epilogue where the kernels run
    at the head width itself (not padded): on host-bound calls (600 nodes:
    four projections), GPU-bound ones (60,000: one GEMM, the skip read as its
    column block) and bipartite ones; padded heads add it after the op.
    Against PyG's layer in float64 with the same weights, within 2x the error
    of PyG's layer in the same dtype on the GPU (+ 4 roundoffs).  (The path of
    several ops; the one-op path's C++ folds the same way:
    test_layer_op_equals_the_path_of_several_ops.)"""
    from pyg_dfgnn.nn import transformer_conv
    monkeypatch.setattr(transformer_conv, "LAYER_OP", [False])
    # (the residual in the kernel, not the aggregate-then-project forward,
    # which 4 x 64 on 32 input features would take: test_aggregate_then_project_*)
    monkeypatch.setattr(transformer_conv, "FACTORIZE", ["off"])
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
    from test_key_scale import spy_ext
    used = spy_ext(monkeypatch, "attention_fwd_residual")
    torch.manual_seed(heads * chans + nodes)
    nd = nodes // 2 if bipartite else nodes
    ei = torch.stack([torch.randint(0, nodes, (5 * nodes,)), torch.randint(0, nd, (5 * nodes,))])
    ref = pyg_nn.TransformerConv((32, 24) if bipartite else 32, chans, heads=heads)
    ours = TransformerConv((32, 24) if bipartite else 32, chans, heads=heads)
    ours.load_state_dict(ref.state_dict())
    x = (torch.randn(nodes, 32), torch.randn(nd, 24)) if bipartite else torch.randn(nodes, 32)
    xs = x if bipartite else (x,)
    want = ref.double()(tuple(t.double() for t in xs) if bipartite else x.double(), ei)
    ref_low = pyg_nn.TransformerConv((32, 24) if bipartite else 32, chans, heads=heads)
    ref_low.load_state_dict(ref.state_dict())
    ref_low, ours = ref_low.cuda().to(dtype).eval(), ours.cuda().to(dtype).eval()
    xc = tuple(t.cuda().to(dtype) for t in xs)
    eic = ei.cuda()
    with torch.no_grad():
        got = ours(xc if bipartite else xc[0], eic)
        base = ref_low(xc if bipartite else xc[0], eic)
    from pyg_dfgnn.nn._padded import kernel_width
    from pyg_dfgnn.ops import DOT
    fold = kernel_width(chans, xc[0], heads, DOT, pad_small=True) == chans
    assert bool(used) == fold, (used, fold)
    assert got.shape == want.shape and got.dtype == dtype
    err = float((got.double().cpu() - want).abs().max())
    err_pyg = float((base.double().cpu() - want).abs().max())
    u = torch.finfo(dtype).eps
    assert err <= 2 * err_pyg + 4 * u * float(want.abs().max()), (err, err_pyg)


# ---------------------------------------------------------------------------- layer op
@layer_op_equality_cases(
    pytest.param(dict(heads=8, out_channels=10, root_weight=False), id="noroot8x10"),
    pytest.param(dict(heads=8, out_channels=19, root_weight=False), id="noroot8x19"),
    gpu_bound=True)
def test_layer_op_equals_the_path_of_several_ops(kw, dtype, train, gpu_bound, monkeypatch,
                                                 deterministic):
    """An eager CUDA call on one node set (concatenated heads, no beta or edge
    features; with or without the root weight, as the GT model's layers) runs
    as one op and one autograd node (``dfgnn_C::transformer_layer``: q / k / v
    from one GEMM in the kernels' head width, the skip projection, the
    attention, the skip added).  With
    autograd its output is that of the layer's path of several ops on the
    same inputs and dropout seed, bit for bit, and its gradients within 16
    roundings (its backward's Delta comes from the output less the skip:
    assert_layer_op_equals_several_ops): on calls below the GPU-bound size and
    above it (forced: the padded widths, GEMV bias gradients), in eval mode
    and with attention dropout.  Without autograd the
    one op folds the skip into the GEMM as the path of several ops does only on
    GPU-bound calls: its output within 2 roundings of the dtype of the other's."""
    from pyg_dfgnn.nn import _padded, transformer_conv
    if gpu_bound:
        monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    conv, x, ei, grad = layer_op_case(TransformerConv, kw, dtype, train)
    assert_layer_op_equals_several_ops(transformer_conv, conv, x, ei, grad,
                                       "TransformerLayerFn", monkeypatch,
                                       delta_from_output=True)
    with torch.no_grad():
        monkeypatch.setattr(transformer_conv, "LAYER_OP", [True])
        torch.manual_seed(1)
        a = conv(x, ei)
        monkeypatch.setattr(transformer_conv, "LAYER_OP", [False])
        torch.manual_seed(1)
        b = conv(x, ei)
    u = torch.finfo(dtype).eps
    scale = float(b.abs().max())
    torch.testing.assert_close(a, b, rtol=2 * u, atol=2 * u * scale)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_small_calls_keep_the_attention_output(monkeypatch):
    """At 8 x 10, whose output is the attention output plus the skip, calls below
    the GPU-bound size keep the attention output for the backward's Delta and
    run no Delta pass; GPU-bound calls take Delta from the output
    (check_small_calls_keep_attention)."""
    check_small_calls_keep_attention(TransformerConv, dict(heads=8, out_channels=10),
                                     "TransformerLayerFn", monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kw", [dict(heads=8, out_channels=10), dict(heads=8, out_channels=19),
                                dict(heads=4, out_channels=64)])
def test_layer_op_against_float64(kw):
    """The one-op path in fp32 against PyG's layer in float64 with the same
    weights, within 2x PyG's own fp32 error."""
    check_layer_op_against_float64(pyg_nn.TransformerConv, TransformerConv,
                                   dict(in_channels=F_IN, **kw), "TransformerLayerFn")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kw", [dict(heads=8, out_channels=19), dict(heads=4, out_channels=64),
                                dict(heads=4, out_channels=16, root_weight=False)])
def test_layer_op_split_fp32_against_float64(kw, monkeypatch):
    """The one-op path with its fp32 projections split on the bf16 tensor
    cores (check_split_fp32_against_float64)."""
    check_split_fp32_against_float64(pyg_nn.TransformerConv, TransformerConv,
                                     dict(in_channels=F_IN, **kw), "TransformerLayerFn",
                                     monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_op_gemv_bias_gradients_over_kept_ones(dtype, monkeypatch):
    """The one-op path's GEMV column sums read a ones vector the op keeps per
    (device, dtype, stream) and grows (``dfgnn_ops.cpp: ones_like_rows``).
    The skip bias's gradient is the column sum of the output gradient:
    :func:`check_bias_grad_over_kept_ones` (grown vectors, a side stream,
    CUDA graphs, an outgrown vector a graph still reads)."""
    from pyg_dfgnn.nn import _padded
    monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)   # (GEMV column sums)
    torch.manual_seed(0)
    conv = TransformerConv(F_IN, 10, heads=8).to("cuda", dtype)
    check_bias_grad_over_kept_ones(conv, conv.lin_skip.bias, "TransformerLayerFn", dtype)


@saved_projection_cases
def test_backward_over_saved_projections(kw, dtype, mode, monkeypatch, deterministic):
    """A backward that frees the graph writes d k / d v over k / v (the same
    gradients as a backward that keeps it, 2 [N, H, W] blocks less
    memory), except where a recomputing column pass splits a head over two
    feature tiles (1 x 512): there the gradients go to a buffer of their own.
    Between forward and backward it holds its projections, output and softmax
    statistics, and the attention output besides only at heads of 128 bytes or
    more (4 x 64, 1 x 512)."""
    check_backward_over_saved_projections(TransformerConv, kw, dtype, mode,
                                          "TransformerLayerFn", 2, 2, 3, monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["recompute", "alpha"])
def test_narrow_heads_backward_keeps_one_delta(mode, monkeypatch):
    """At narrow heads (8 x 10) the layer op keeps its output, not the
    attention's, and its backward takes Delta = <dO, O> from the output less
    the skip (``row_delta``: an ``[N, H]`` fp32 array).  In the recomputing and
    alpha modes the row pass writes the Delta it used (the exact one where it
    re-sweeps a nearly saturated row) over that array instead of into a
    second one, which the column pass reads.  So the backward's peak above
    what the forward left is d q, the alpha mode's per-edge alphas and one
    Delta (fp32 heads of 10 run unpadded, so the output gradient is not
    copied, and the column pass writes d k / d v over k / v); a second Delta
    would exceed it by half an array.  The gradients match float64 in both
    modes, also with nearly saturated rows (a query weight x 30)."""
    from pyg_dfgnn.data import pattern_like_batch
    from pyg_dfgnn.nn import _padded
    from pyg_dfgnn.ops import backward_mode
    monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    H, C, f_in = 8, 10, 16
    torch.manual_seed(0)
    ei = pattern_like_batch(64, seed=0).edge_index.cuda()
    n, E = int(ei.max()) + 1, ei.size(1)
    conv = TransformerConv(f_in, C, heads=H).cuda()
    x = torch.randn(n, f_in, device="cuda", requires_grad=True)
    grad = torch.randn(n, H * C, device="cuda")
    assert _padded.kernel_width(C, x, H, 2) == C
    dq, delta = n * H * C * 4, n * H * 4
    alphas = E * H * 4 if mode == "alpha" else 0   # (fp32 dot attention's default)
    peaks = []
    with backward_mode("store" if mode == "alpha" else "recompute"):
        for _ in range(2):   # (measured on the second: GEMV's kept ones vector is made once)
            out = conv(x, ei)
            assert "TransformerLayerFn" in layer_op_node(out)
            x.grad = None
            conv.zero_grad(set_to_none=True)
            gc.collect()   # (cyclic garbage freed inside the measure would lower the peak)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out.backward(grad)
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated() - base)
            del out
    bound = dq + alphas + delta
    assert peaks[1] <= bound + delta // 2, (peaks, bound, delta)
    check_backward_modes_against_float64(
        pyg_nn.TransformerConv, TransformerConv, dict(in_channels=32, out_channels=C, heads=H),
        "TransformerLayerFn", "lin_query.weight", mode, torch.float32, monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["recompute", "alpha"])
@pytest.mark.parametrize("kw", [dict(heads=8, out_channels=10), dict(heads=8, out_channels=19)],
                         ids=["8x10", "8x19"])
def test_narrow_heads_bf16_backward_against_float64(kw, mode, monkeypatch):
    """The same in bf16 on GPU-bound calls (heads of 10 as they are, on the
    kernels' five 4-byte vectors; 19 padded to 20): the recomputing and the
    (opt-in) alpha backward, whose row pass writes its Delta over the one
    taken from the output, within 2x PyG's own bf16 error against float64 (+ 4
    bf16 roundings), with and without nearly saturated rows.  (At this size the bf16 backward's peak
    lies in the projections' column sums, not at the Delta: its memory is
    measured in docs/BENCHMARKS.md, session 39.)"""
    check_backward_modes_against_float64(
        pyg_nn.TransformerConv, TransformerConv, dict(in_channels=32, **kw),
        "TransformerLayerFn", "lin_query.weight", mode, torch.bfloat16, monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_layer_op_only_where_it_applies():
    """The path of several ops runs where the one-op path does not apply: beta,
    averaged heads, edge features, a pair of inputs, and the cases every layer
    shares (check_layer_op_guards)."""
    torch.manual_seed(0)
    ei = random_edge_index(N, N, E, device="cuda")
    x = feats(N, F_IN, "cuda", torch.float32).requires_grad_()
    node = "TransformerLayerFn"
    conv = TransformerConv(F_IN, 4, heads=2).cuda().eval()
    for kw in (dict(beta=True), dict(concat=False), dict(edge_dim=3)):
        other = TransformerConv(F_IN, 4, heads=2, **kw).cuda()
        args = (torch.randn(E, 3, device="cuda"),) if "edge_dim" in kw else ()
        assert node not in layer_op_node(other(x, ei, *args)), kw
    assert node not in layer_op_node(conv((x, x), ei))
    check_layer_op_guards(conv, x, ei, node, conv.lin_key)


# ------------------------------------------------------- aggregate, then project
FACTORIZED_CASES = [
    pytest.param(dict(in_channels=16, out_channels=16, heads=4), id="4x16"),
    pytest.param(dict(in_channels=16, out_channels=16, heads=1, root_weight=False), id="1x16-noroot"),
    pytest.param(dict(in_channels=8, out_channels=8, heads=3, bias=False), id="3x8-nobias"),
    pytest.param(dict(in_channels=16, out_channels=10, heads=8), id="8x10-wider-in"),
    pytest.param(dict(in_channels=8, out_channels=19, heads=2, root_weight=False, bias=False),
                 id="2x19-noroot-nobias"),
]


def check_aggregate_then_project(kw, device, dtype, nodes, mode, monkeypatch, big=False,
                                 factor=2.0):
    """The aggregate-then-project forward (``transformer_conv.FACTORIZE``) of
    an eval call without autograd, on a graph with destination rows that have
    no edges (they get no value bias), against PyG's layer in float64 with the
    same weights: within ``factor`` (2) x the error of PyG's layer in ``dtype`` + 4
    roundings of ``dtype`` on the output's scale.  Weights of scale 1 (not
    PyG's initialisation) make the scores of order ten: softmaxes far from
    uniform, so a wrong score, bias or head would show."""
    from pyg_dfgnn.nn import transformer_conv as tc
    from ._equiv import record_results
    monkeypatch.setattr(tc, "FACTORIZE", [mode])
    calls = record_results(monkeypatch, tc, "_aggregate_then_project")
    gen = torch.Generator().manual_seed(nodes + kw["heads"] * kw["out_channels"])
    ei = random_edge_index(nodes, nodes, 8 * nodes, seed=nodes)
    ei = ei[:, ei[1] % 7 != 3].to(device)     # every 7th destination without edges
    ref = pyg_nn.TransformerConv(**kw).double()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
    state = {k: v.to(dtype) for k, v in ref.state_dict().items()}
    ref.load_state_dict({k: v.double() for k, v in state.items()})   # (the rounded weights)
    low = pyg_nn.TransformerConv(**kw).to(device, dtype).eval()
    ours = TransformerConv(**kw).to(device, dtype).eval()
    low.load_state_dict(state)
    ours.load_state_dict(state)
    x = torch.randn(nodes, kw["in_channels"], generator=gen).to(dtype)
    ref = ref.to(device).eval()
    u = torch.finfo(dtype).eps
    for step in range(2):
        if step:   # weights changed in place: the folded weights are formed again
            with torch.no_grad():
                for m in (ref, low, ours):
                    m.lin_query.weight.mul_(-2)
        with torch.no_grad():
            want = ref(x.double().to(device), ei)
            base = low(x.to(device), ei)
            got = ours(x.to(device), ei)
        assert len(calls) == step + 1, "the aggregate-then-project forward did not run"
        assert got.shape == want.shape and got.dtype == dtype
        err = float((got.double() - want).abs().max())
        err_pyg = float((base.double() - want).abs().max())
        assert err <= factor * err_pyg + 4 * u * float(want.abs().max()), (step, err, err_pyg)
    # autograd, training with dropout, or auto mode on a small call: not taken
    calls.clear()
    ours(x.to(device), ei)
    ours.dropout = 0.3
    with torch.no_grad():
        ours.train()(x.to(device), ei)
    assert not calls


@pytest.mark.parametrize("kw", FACTORIZED_CASES)
def test_aggregate_then_project_against_float64_cpu(kw, monkeypatch):
    """On the CPU (``FACTORIZE = "on"``; auto takes only GPU-bound CUDA calls)."""
    check_aggregate_then_project(kw, "cpu", torch.float32, 60, "on", monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kw", FACTORIZED_CASES)
def test_aggregate_then_project_against_float64_cuda(kw, dtype, monkeypatch):
    """On CUDA, forced (``"on"``), on a small graph: the kernels' shared-head
    keys and values at each of these shapes (8 x 10 with 16 input features
    gathers rows wider than a head)."""
    check_aggregate_then_project(kw, "cuda", dtype, 300, "on", monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("heads,chans,fin", [(4, 64, 64), (1, 256, 64), (2, 128, 32)])
def test_aggregate_then_project_auto_on_gpu_bound_calls(heads, chans, fin, dtype, monkeypatch):
    """``"auto"`` takes it on a call whose input rows are no wider than a head
    (4 x 64 on 64 features: the bench's 4 x 64 shape) and whose gathered
    bytes saved pass ``FACTORIZE_MIN_SAVED_BYTES`` (the helper's graph: 8
    edges per node, every 7th destination without edges; 30 % above)."""
    from pyg_dfgnn.nn import transformer_conv as tc
    per_edge = heads * (2 * chans - fin) * torch.finfo(dtype).bits // 8
    nodes = int(1.3 * tc.FACTORIZE_MIN_SAVED_BYTES / (per_edge * 8 * 6 / 7)) + 1
    check_aggregate_then_project(dict(in_channels=fin, out_channels=chans, heads=heads), "cuda",
                                 dtype, nodes, "auto", monkeypatch)


def test_factorize_pays_at_the_measured_crossover():
    """``"auto"``'s rule against the synchronised eval calls it was read from
    (H200, docs/KERNELS.md, session 46: the factorized / one-op time in
    brackets): E H (2C - D) bytes saved of at least 450 MB."""
    from pyg_dfgnn.nn.transformer_conv import _factorize_pays as pays
    pattern, small, uniform = 763502, 320000, 1600000
    assert pays(pattern, 4, 64, 64, 4)          # PATTERN x128 4x64 fp32 (0.92x)
    assert not pays(pattern, 4, 64, 64, 2)      # ... bf16 (1.10x)
    assert pays(pattern, 2, 128, 64, 2)         # ... 2x128 bf16 (0.79x)
    assert not pays(small, 4, 64, 64, 2)        # 20k nodes 4x64 bf16 (1.16x)
    assert pays(small, 2, 128, 64, 4)           # ... 2x128 fp32 (0.88x)
    assert not pays(uniform, 1, 64, 64, 2)      # uniform 100k 1x64 bf16 (1.08x)
    assert pays(uniform, 4, 64, 64, 2)          # ... 4x64 bf16 (0.89x)
    assert not pays(uniform, 8, 19, 64, 4)      # input rows wider than 2C: never


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kw", [dict(in_channels=64, out_channels=64, heads=4),
                                dict(in_channels=16, out_channels=10, heads=8)])
def test_aggregate_then_project_split_fp32(kw, monkeypatch):
    """With its two GEMMs (q~ and the skip) split on the bf16 tensor cores
    (``ops.fp32_matmul("split")``): within 6x PyG's fp32 error (the split
    GEMM's 6 K + 3 accumulated terms per output: tests/ops/test_fp32_matmul.py)."""
    from pyg_dfgnn.ops import fp32_matmul
    with fp32_matmul("split"):
        check_aggregate_then_project(kw, "cuda", torch.float32, 300, "on", monkeypatch,
                                     factor=6.0)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_aggregate_then_project_auto_only_where_it_pays(monkeypatch):
    """``"auto"`` leaves host-bound calls and input rows wider than a head to
    the other paths."""
    from pyg_dfgnn.nn import transformer_conv as tc
    from ._equiv import record_results
    calls = record_results(monkeypatch, tc, "_aggregate_then_project")
    # (20000 nodes at 4 x 64, 80k edges: GPU-bound by nn/_padded.py's rule,
    # which auto used before session 46, but 82 MB saved)
    for nodes, fin, heads, chans in ((600, 64, 4, 64), (20000, 64, 4, 64), (20000, 64, 8, 19),
                                     (20000, 72, 4, 64)):
        conv = TransformerConv(fin, chans, heads=heads).cuda().eval()
        ei = random_edge_index(nodes, nodes, 4 * nodes, device="cuda")
        with torch.no_grad():
            conv(torch.randn(nodes, fin, device="cuda"), ei)
    assert not calls


def test_aggregate_then_project_keeps_folded_weights_while_unchanged(monkeypatch):
    """The folded weights are formed once for repeated eval calls, again after
    an in-place change (version counter) or a new tensor assigned to
    ``.data`` (storage), and on every call under ``strict_cache()`` (a write
    through ``.data`` in place, which no counter sees) or with inference-mode
    parameters (no counters).  Every output against PyG's layer with the
    weights of the moment, in float64 (CPU, ``FACTORIZE = "on"``)."""
    from pyg_dfgnn import graph as graph_module
    from pyg_dfgnn.nn import transformer_conv as tc
    from ._equiv import record_results
    monkeypatch.setattr(tc, "FACTORIZE", ["on"])
    folds = record_results(monkeypatch, tc, "_folded_weights")
    kw = dict(in_channels=8, out_channels=8, heads=2)
    ei = random_edge_index(40, 40, 200, seed=3)
    x = torch.randn(40, 8, dtype=torch.float64)
    ref = pyg_nn.TransformerConv(**kw).double().eval()
    ours = TransformerConv(**kw).double().eval()
    ours.load_state_dict(ref.state_dict())

    def check(n_folds):
        with torch.no_grad():
            torch.testing.assert_close(ours(x, ei), ref(x, ei), rtol=1e-10, atol=1e-10)
        assert len(folds) == n_folds, (len(folds), n_folds)

    monkeypatch.setattr(tc, "_FACTORIZE_DTYPES", tc._FACTORIZE_DTYPES + (torch.float64,))
    check(1)
    check(1)                                   # (kept)
    with torch.no_grad():
        for m in (ref, ours):
            m.lin_key.weight.mul_(1.5)         # version counter
    check(2)
    w = torch.randn_like(ref.lin_query.weight)
    ref.lin_query.weight.data = w.clone()
    ours.lin_query.weight.data = w.clone()     # storage
    check(3)
    old = graph_module.strict_cache(True)
    try:
        for m in (ref, ours):
            m.lin_value.bias.data.add_(1.0)    # no counter moves: strict mode folds again
        check(4)
        check(5)
    finally:
        graph_module.strict_cache(old)
    with torch.inference_mode():
        inf = TransformerConv(**kw).double().eval()
        inf.load_state_dict(ref.state_dict())
        assert inf.lin_query.weight.is_inference()
        for _ in range(2):
            torch.testing.assert_close(inf(x, ei), ref(x, ei), rtol=1e-10, atol=1e-10)
    assert len(folds) == 7


def test_aggregate_then_project_guards(monkeypatch):
    """Where the path would skip what PyG's layer does, PyG's ``forward``
    runs instead (CPU, ``FACTORIZE = "on"``): a forward hook on a projection
    or a global module hook (which are then called), attention weights
    requested, a pair of inputs, and a wrong feature width (PyG's own error
    from the linear map)."""
    from pyg_dfgnn.nn import transformer_conv as tc
    from ._equiv import record_results
    monkeypatch.setattr(tc, "FACTORIZE", ["on"])
    calls = record_results(monkeypatch, tc, "_aggregate_then_project")
    conv = TransformerConv(8, 8, heads=2).eval()
    ei = random_edge_index(30, 30, 120, seed=4)
    x = torch.randn(30, 8)
    with torch.no_grad():
        conv(x, ei)
        assert len(calls) == 1
        seen: list = []
        h = conv.lin_key.register_forward_hook(lambda *a: seen.append(1))
        conv(x, ei)
        h.remove()
        g = torch.nn.modules.module.register_module_forward_hook(lambda *a: seen.append(2))
        try:
            conv(x, ei)
        finally:
            g.remove()
        assert 1 in seen and 2 in seen and len(calls) == 1
        conv(x, ei, return_attention_weights=True)
        conv((x, x), ei)
        assert len(calls) == 1
        with pytest.raises(RuntimeError):
            conv(torch.randn(30, 9), ei)
        conv(x, ei)
        assert len(calls) == 2
