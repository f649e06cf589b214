"""pyg_dfgnn.nn.GATConv against torch_geometric.nn.GATConv."""
import pytest
import torch
import torch_geometric.nn as pyg_nn

from pyg_dfgnn.nn import GATConv

from ._equiv import (DEVICES, E, FORMATS, F_IN, HAS_CUDA, N, SparseTensor,
                     assert_layer_op_equals_several_ops, check_bf16_against_float64,
                     check_bias_grad_over_kept_ones, check_core,
                     check_layer_op_against_float64, check_layer_op_guards,
                     check_split_fp32_against_float64,
                     check_equivalence, check_formats, check_state_dict_round_trip,
                     dropout_runs, feats, layer_op_case, layer_op_equality_cases,
                     layer_op_node, make_adj,
                     random_edge_index, record_results)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("edge_dim", [None, 4])
@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("heads", [1, 3])
def test_core(device, heads, concat, loops, edge_dim):
    check_core(pyg_nn.GATConv, GATConv, device, heads, edge_dim,
               concat=concat, add_self_loops=loops)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ret", [False, True])
@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("edge_dim", [None, 3])
@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("fmt", FORMATS)
def test_formats(device, fmt, loops, edge_dim, bipartite, ret):
    check_formats(pyg_nn.GATConv, GATConv, device, fmt, edge_dim, bipartite, ret,
                  add_self_loops=loops)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("case", ["shared_lin", "dst_none", "size", "size_dst_none"])
def test_pairs_and_size(device, case, loops):
    ns, nd = 10, 7
    ei = random_edge_index(ns, nd, E, seed=4, device=device)
    xs, xd = feats(ns, F_IN, device), feats(nd, F_IN, device, seed=5)
    kw = dict(in_channels=F_IN, out_channels=4, heads=3, add_self_loops=loops)
    call = dict(return_attention_weights=True)
    if case == "shared_lin":
        x = (xs, xd)
    elif case == "dst_none":
        x = (xs, None)
    elif case == "size":
        x = (xs, xd)
        call["size"] = (ns, nd)
    else:
        x = (xs, None)
        call["size"] = (ns, ns)
    check_equivalence(pyg_nn.GATConv, GATConv, kw, (x, ei), call, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fill_value", ["mean", "add", "max", 0.5])
@pytest.mark.parametrize("options", [dict(residual=True), dict(bias=False),
                                     dict(residual=True, concat=False, bias=False)])
def test_options(device, fill_value, options):
    ei = random_edge_index(N, N, E, seed=6, device=device)
    x = feats(N, F_IN, device)
    ea = feats(E, 2, device, seed=1)
    kw = dict(in_channels=F_IN, out_channels=4, heads=2, edge_dim=2, fill_value=fill_value,
              negative_slope=0.1, **options)
    check_equivalence(pyg_nn.GATConv, GATConv, kw, (x, ei), dict(edge_attr=ea),
                      device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_one_dim_edge_attr_and_tensor_fill(device):
    ei = random_edge_index(N, N, E, seed=6, device=device)
    x = feats(N, F_IN, device)
    ea = feats(E, 1, device, seed=1).view(-1).detach().requires_grad_()
    kw = dict(in_channels=F_IN, out_channels=4, heads=2, edge_dim=1,
              fill_value=torch.tensor([0.25], dtype=x.dtype, device=device))
    check_equivalence(pyg_nn.GATConv, GATConv, kw, (x, ei), dict(edge_attr=ea),
                      device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["SparseTensor", "torch_csr", "torch_coo"])
def test_sparse_values_as_edge_attr(device, fmt):
    """PyG uses the values of a SparseTensor (and multi-dim values of a
    torch.sparse tensor) as ``edge_attr`` when none is given."""
    ei = random_edge_index(N, N, E, seed=7, device=device)
    x = feats(N, F_IN, device)
    adj, ne = make_adj(ei, fmt, N, N)
    vals = feats(ne, 3, device, seed=2).detach()
    if fmt == "SparseTensor":
        adj = adj.set_value(vals, layout="csr")
    else:
        adj = torch.sparse_csr_tensor(adj.crow_indices(), adj.col_indices(), vals,
                                      (N, N, 3)) if fmt == "torch_csr" else \
            torch.sparse_coo_tensor(adj._indices(), vals, (N, N, 3)).coalesce()
    kw = dict(in_channels=F_IN, out_channels=4, heads=2, edge_dim=3, add_self_loops=False)
    check_equivalence(pyg_nn.GATConv, GATConv, kw, (x, adj), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_lazy_in_channels(device):
    ns, nd = 10, 7
    ei = random_edge_index(ns, nd, E, seed=8, device=device)
    x = (feats(ns, F_IN, device), feats(nd, 5, device, seed=3))
    kw = dict(in_channels=(-1, -1), out_channels=4, heads=2, residual=True)
    check_equivalence(pyg_nn.GATConv, GATConv, kw, (x, ei), device=device, lazy=True)
    kw = dict(in_channels=-1, out_channels=4, heads=2)
    check_equivalence(pyg_nn.GATConv, GATConv, kw, (feats(N, F_IN, device),
                      random_edge_index(N, N, E, device=device)), device=device, lazy=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loops", [True, False])
def test_empty_graphs(device, loops):
    kw = dict(in_channels=F_IN, out_channels=4, heads=2, add_self_loops=loops, edge_dim=2)
    no_edges = torch.empty(2, 0, dtype=torch.long, device=device)
    ea = feats(0, 2, device)
    # zero edges: zero in-degree everywhere (no NaN), bias only
    out, ours = check_equivalence(pyg_nn.GATConv, GATConv, kw, (feats(N, F_IN, device),
                                  no_edges), dict(edge_attr=ea), device=device)
    assert torch.isfinite(ours).all()
    # zero nodes
    check_equivalence(pyg_nn.GATConv, GATConv, kw, (feats(0, F_IN, device), no_edges),
                      dict(edge_attr=ea), device=device)


def test_dropout_training_statistics():
    """Attention dropout in training: masks differ from PyG's, but the output
    is random and unbiased (inverted dropout), the returned weights are the
    post-dropout ones, and eval mode is deterministic again."""
    conv = GATConv(F_IN, 4, heads=2, dropout=0.5)
    x, ei, expect, alpha_eval, alpha1 = dropout_runs(conv, 0.1)
    dropped = alpha1 == 0
    assert 0.3 < dropped.double().mean() < 0.7
    torch.testing.assert_close(alpha1[~dropped], 2 * alpha_eval[~dropped])
    conv.eval()
    torch.testing.assert_close(conv(x, ei), expect)


def test_state_dict_round_trip():
    ours = check_state_dict_round_trip(pyg_nn.GATConv, GATConv, in_channels=(6, 5),
                                       out_channels=4, heads=3, edge_dim=2, residual=True)
    assert isinstance(ours, pyg_nn.GATConv)


def test_sparse_tensor_loops_with_edge_dim_raises():
    if SparseTensor is None:
        pytest.skip("torch_sparse is not installed")
    ei = random_edge_index(N, N, E)
    adj, _ = make_adj(ei, "SparseTensor", N, N)
    with pytest.raises(NotImplementedError):
        GATConv(F_IN, 4, edge_dim=2)(torch.randn(N, F_IN), adj)


@pytest.mark.parametrize("seed", range(12))
def test_bf16_gradients_within_pygs_error(seed):
    """bf16 on the CPU (where the folded logits are always on) judged by the
    FlashAttention rule against PyG's layer in float64: every output and
    gradient within 4x PyG's own bf16 error, or 4 bf16 roundings of its largest
    value.  Inputs whose smallest GAT logit lies within 0.05 of LeakyReLU's
    kink are redrawn (``gat_logit_margin``): there a bf16 logit may take the
    other slope, and the implementation that rounds it like PyG looks right
    while the other looks 8x off (session 11: the folded logits, seed 8 of the
    unfiltered draws, one edge with |z| = 6e-4)."""
    # a small graph (112 logits), so that some draw keeps every logit 0.05 (a few
    # bf16 roundings of the logits) away from the kink
    check_bf16_against_float64(pyg_nn.GATConv, GATConv,
                               dict(in_channels=16, out_channels=16, heads=2),
                               draws=range(seed * 1000, seed * 1000 + 400), away_from_kink=True)


def _record_folds(monkeypatch) -> list:
    """What every call of ``gat_conv._bias_in_epilogue`` returns (whether the
    fused op adds the bias: asked by both paths), in call order."""
    from pyg_dfgnn.nn import gat_conv
    return record_results(monkeypatch, gat_conv, "_bias_in_epilogue")


@pytest.mark.parametrize("device", DEVICES)
def test_bias_folded_into_the_kernel_epilogue(device, monkeypatch):
    """The layer's bias goes into the fused op's epilogue (``bias [H, C]``)
    exactly where PyG's result allows it: concatenated heads or one head,
    no residual, a bias of the features' dtype, at most 32 heads.  Every case
    matches PyG's layer, forward and backward."""
    seen = _record_folds(monkeypatch)
    ei = random_edge_index(N, N, E, device=device)
    for kw, folded in [(dict(heads=3), True), (dict(heads=1, concat=False), True),
                       (dict(heads=3, concat=False), False),
                       (dict(heads=3, residual=True), False), (dict(heads=3, bias=False), False),
                       (dict(heads=33), False)]:
        seen.clear()
        check_equivalence(pyg_nn.GATConv, GATConv, dict(in_channels=F_IN, out_channels=4, **kw),
                          (feats(N, F_IN, device), ei), device=device)
        assert seen and all(b == folded for b in seen), kw


def test_bias_under_autocast_keeps_pygs_dtype(monkeypatch):
    """Under autocast PyG's ``out + bias`` promotes the bf16 attention output to
    the fp32 bias' dtype: the bias is then added outside the kernel, so the
    layer returns PyG's dtype.  (Values under autocast: test_glue.py and the
    bf16 tests, against float64.)"""
    seen = _record_folds(monkeypatch)
    torch.manual_seed(0)
    ref = pyg_nn.GATConv(F_IN, 4, heads=2)
    ours = GATConv(F_IN, 4, heads=2)
    ours.load_state_dict(ref.state_dict())
    x, ei = torch.randn(N, F_IN), random_edge_index(N, N, E)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = ref(x, ei), ours(x, ei)
    assert b.dtype == a.dtype == torch.float32
    assert seen == [False] and torch.isfinite(b).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [dict(heads=3), dict(heads=1, concat=False),
                                dict(heads=3, concat=False), dict(heads=2, residual=True),
                                dict(heads=2, edge_dim=3), dict(heads=2, bias=False),
                                dict(heads=2, add_self_loops=False)])
def test_node_logits_in_the_op(device, kw, monkeypatch):
    """The layer's node-logit path (``ops.gat_node_attention``: the logits
    computed by the op, one autograd node), which eager CUDA calls take, equals
    PyG's layer forward and backward in every configuration; forced on the CPU
    here (its own test there), on CUDA it is the default.  A rectangular
    ``size`` keeps the layer's own logits."""
    from pyg_dfgnn.nn import gat_conv
    monkeypatch.setattr(gat_conv, "_NODE_LOGITS_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(gat_conv, "LAYER_OP", [False])   # (test_layer_op_* below)
    calls = record_results(monkeypatch, gat_conv, "gat_node_attention")
    ei = random_edge_index(N, N, E, device=device)
    edge = dict(edge_attr=torch.randn(E, 3, device=device)) if "edge_dim" in kw else None
    check_equivalence(pyg_nn.GATConv, GATConv, dict(in_channels=F_IN, out_channels=4, **kw),
                      (feats(N, F_IN, device, torch.float32), ei), edge, device=device,
                      dtype=torch.float32)
    assert calls, "the node-logit path was not taken"
    calls.clear()
    check_equivalence(pyg_nn.GATConv, GATConv, dict(in_channels=F_IN, out_channels=4, **kw),
                      (feats(N, F_IN, device, torch.float32), ei), dict(size=(N, N - 2)),
                      device=device, dtype=torch.float32)
    assert not calls


# ---------------------------------------------------------------------------- layer op
@layer_op_equality_cases(
    pytest.param(dict(heads=8, out_channels=8), id="8x8"),
    pytest.param(dict(heads=1, out_channels=16, concat=False), id="1x16mean"),
    pytest.param(dict(heads=2, out_channels=8, add_self_loops=False), id="noloops"),
    pytest.param(dict(heads=8, out_channels=19, bias=False), id="8x19nobias"),
    gpu_bound=True)
def test_layer_op_equals_the_path_of_several_ops(kw, dtype, train, gpu_bound, monkeypatch,
                                                 deterministic):
    """An eager CUDA call on one node set runs as one op and one autograd node
    (``dfgnn_C::gat_layer``: projection, node logits, attention, bias).  Its
    output and every gradient (x, the projection, both attention vectors, the
    bias) are those of the layer's path of several ops on the same inputs and
    dropout seed, bit for bit; in eval mode, and with attention dropout in
    training mode; below the GPU-bound size and above it (forced), where heads
    the kernels do not take as they are (8 x 19) are projected into the
    kernels' padded width by both paths."""
    from pyg_dfgnn.nn import _padded, gat_conv
    if gpu_bound:
        monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    conv, x, ei, grad = layer_op_case(GATConv, kw, dtype, train)
    assert_layer_op_equals_several_ops(gat_conv, conv, x, ei, grad, "GatLayerFn", monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kw,gpu_bound", [
    pytest.param(dict(heads=8, out_channels=10), False, id="8x10-small"),
    pytest.param(dict(heads=4, out_channels=64, dropout=0.0), False, id="4x64-small"),
    pytest.param(dict(heads=8, out_channels=19), True, id="8x19-gpubound"),
    pytest.param(dict(heads=4, out_channels=64, dropout=0.0), True, id="4x64-gpubound")])
def test_layer_op_against_float64(kw, gpu_bound, monkeypatch):
    """The one-op path in fp32 against PyG's layer in float64 with the same
    weights, within 2x PyG's own fp32 error (the kernels' float64 tests hold
    the attention itself); also as a GPU-bound call (forced), where 8 x 19 is
    projected into the kernels' padded width."""
    from pyg_dfgnn.nn import _padded
    if gpu_bound:
        monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    check_layer_op_against_float64(pyg_nn.GATConv, GATConv, dict(in_channels=F_IN, **kw),
                                   "GatLayerFn")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out_channels", [7, 10])
def test_layer_op_half_narrow_heads_against_float64(dtype, out_channels, monkeypatch):
    """GATConv 8 x 10 and 8 x 7 as GPU-bound calls (forced) in half
    precision, whose attention runs GAT's forward by rows
    (tests/ops/test_gat_rows.py; 8 x 7 projected into heads of 8, the
    kernel storing the first 7 with the bias): output and every gradient
    against PyG's layer in float64 by the FlashAttention rule."""
    from pyg_dfgnn.nn import _padded
    monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    check_layer_op_against_float64(pyg_nn.GATConv, GATConv,
                                   dict(in_channels=F_IN, heads=8, out_channels=out_channels),
                                   "GatLayerFn", dtype=dtype)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kw", [dict(heads=8, out_channels=19), dict(heads=4, out_channels=64)])
def test_layer_op_split_fp32_against_float64(kw, monkeypatch):
    """The one-op path with its fp32 projections split on the bf16 tensor
    cores (check_split_fp32_against_float64)."""
    check_split_fp32_against_float64(pyg_nn.GATConv, GATConv, dict(in_channels=F_IN, **kw),
                                     "GatLayerFn", monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_op_bias_gradient_over_kept_ones(dtype):
    """The bias the one-op path adds in the kernel's epilogue gets its
    gradient as a GEMV column sum of the output gradient over the op's kept
    ones vector (``dfgnn_ops.cpp: attention_bwd_impl``, ``ones_like_rows``;
    it allocated and filled one per backward before):
    :func:`check_bias_grad_over_kept_ones`."""
    torch.manual_seed(0)
    conv = GATConv(F_IN, 10, heads=8).to("cuda", dtype)
    check_bias_grad_over_kept_ones(conv, conv.bias, "GatLayerFn", dtype)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_layer_op_only_where_it_applies():
    """The path of several ops runs where the one-op path does not apply: edge
    features, and the cases every layer shares (check_layer_op_guards)."""
    torch.manual_seed(0)
    ei = random_edge_index(N, N, E, device="cuda")
    conv = GATConv(F_IN, 4, heads=2, edge_dim=3).cuda().eval()
    x = feats(N, F_IN, "cuda", torch.float32).requires_grad_()
    assert "GatLayerFn" not in layer_op_node(conv(x, ei, torch.randn(E, 3, device="cuda")))
    check_layer_op_guards(conv, x, ei, "GatLayerFn", conv.lin)
