"""pyg_dfgnn.nn.AGNNConv against torch_geometric.nn.AGNNConv."""
import pytest
import torch
import torch_geometric.nn as pyg_nn

from pyg_dfgnn.nn import AGNNConv

from ._equiv import (DEVICES, FORMATS, HAS_CUDA, assert_layer_op_equals_several_ops,
                     check_equivalence, check_layer_op_against_float64, check_layer_op_basics,
                     feats, layer_op_dtypes, layer_op_node, make_adj, random_edge_index)

N, F_IN, E = 12, 8, 40


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_formats(device, requires_grad, loops, fmt):
    adj, _ = make_adj(random_edge_index(N, N, E, seed=2, device=device), fmt, N, N)
    x = feats(N, F_IN, device)
    kw = dict(requires_grad=requires_grad, add_self_loops=loops)
    check_equivalence(pyg_nn.AGNNConv, AGNNConv, kw, (x, adj), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_learned_beta(device):
    """A non-default beta (after a step) and its gradient match."""
    ei = random_edge_index(N, N, E, seed=3, device=device)
    x = feats(N, F_IN, device)

    def make(cls):
        def init(**kw):
            m = cls(**kw)
            m.beta.data.fill_(2.5)
            return m
        return init
    check_equivalence(make(pyg_nn.AGNNConv), make(AGNNConv), {}, (x, ei), device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loops", [True, False])
def test_empty_graphs(device, loops):
    no_edges = torch.empty(2, 0, dtype=torch.long, device=device)
    _, ours = check_equivalence(pyg_nn.AGNNConv, AGNNConv, dict(add_self_loops=loops),
                                (feats(N, F_IN, device), no_edges), device=device)
    assert torch.isfinite(ours).all()
    check_equivalence(pyg_nn.AGNNConv, AGNNConv, dict(add_self_loops=loops),
                      (feats(0, F_IN, device), no_edges), device=device)


def test_state_dict_round_trip():
    for requires_grad in (True, False):
        ref, ours = pyg_nn.AGNNConv(requires_grad), AGNNConv(requires_grad)
        assert list(ref.state_dict()) == list(ours.state_dict())
        assert repr(ref) == repr(ours)
        ours.load_state_dict(ref.state_dict())
        ref.load_state_dict(ours.state_dict())
        assert isinstance(ours.beta, torch.nn.Parameter) == requires_grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [True, False])
def test_prologue_node_on_cuda_calls(device, requires_grad, monkeypatch):
    """CUDA calls with autograd run AGNN's prologue (norms, key scale,
    queries) as one autograd node (ops._AGNNPrologue), small graphs included;
    a row whose norm is below ``eps`` (the clamp's branch) is included.  (The
    path of several ops; the one-op path: test_layer_op_* below.)"""
    from pyg_dfgnn import ops
    from pyg_dfgnn.nn import agnn_conv
    monkeypatch.setattr(agnn_conv, "LAYER_OP", [False])
    used = []
    real = ops._AGNNPrologue.apply
    monkeypatch.setattr(ops._AGNNPrologue, "apply",
                        lambda *a: used.append(1) or real(*a))
    x = feats(N, F_IN, device).detach()
    x[5] = 0.0   # a zero row: below eps
    x.requires_grad_()
    ei = random_edge_index(N, N, E, seed=4, device=device)

    def make(cls):
        def init(**kw):
            m = cls(**kw)
            if requires_grad:
                m.beta.data.fill_(1.7)
            return m
        return init
    check_equivalence(make(pyg_nn.AGNNConv), make(AGNNConv), dict(requires_grad=requires_grad),
                      (x, ei), device=device)
    assert bool(used) == (device == "cuda")


# ---------------------------------------------------------------------------- layer op
@layer_op_dtypes
@pytest.mark.parametrize("kw", [dict(requires_grad=True), dict(requires_grad=False),
                                dict(requires_grad=True, add_self_loops=False)],
                         ids=["learned", "fixed", "noloops"])
@pytest.mark.parametrize("width", [7, 80, 256])
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_layer_op_equals_the_path_of_several_ops(kw, width, dtype, monkeypatch, deterministic):
    """An eager CUDA call runs as one op and one autograd node
    (``dfgnn_C::agnn_layer``: the prologue and the attention, forward and
    backward, beta's gradient from the row pass's score sum).  Its output and
    the gradients of x and beta are those of ``ops.agnn_attention``'s two
    autograd Functions, bit for bit; a row below ``eps`` included."""
    from pyg_dfgnn.data import pattern_like_batch
    from pyg_dfgnn.nn import agnn_conv
    torch.manual_seed(0)
    ei = pattern_like_batch(4, seed=0).edge_index.cuda()
    n = int(ei.max()) + 1
    conv = AGNNConv(**kw).to("cuda", dtype)
    if kw["requires_grad"]:
        conv.beta.data.fill_(1.7)
    x = torch.randn(n, width, device="cuda", dtype=dtype)
    x[5] = 0.0
    x.requires_grad_()
    grad = torch.randn(n, width, device="cuda", dtype=dtype)
    assert_layer_op_equals_several_ops(agnn_conv, conv, x, ei, grad, "AgnnLayerFn", monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_layer_op_against_float64():
    """The one-op path in fp32 against PyG's layer in float64, within 2x PyG's
    own fp32 error: output and x's gradient.  (beta's gradient, a sum whose
    terms may cancel, equals the path of several ops' bit for bit (above),
    which tests/ops holds against float64 in that regime.)"""
    check_layer_op_against_float64(pyg_nn.AGNNConv, AGNNConv, dict(requires_grad=True),
                                   "AgnnLayerFn", params=False)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_layer_op_only_where_it_applies():
    """The one-op path's shared cases (check_layer_op_basics: a plain call,
    inference mode, autocast, a graph met first in inference mode); the path
    of several ops for a non-contiguous x; the op in fp16 and bf16 too."""
    torch.manual_seed(0)
    ei = random_edge_index(N, N, E, device="cuda")
    x = feats(N, F_IN, "cuda", torch.float32).requires_grad_()
    node = "AgnnLayerFn"
    conv = AGNNConv(requires_grad=True).cuda()
    check_layer_op_basics(conv, x, ei, node)
    xt = torch.randn(F_IN, N, device="cuda").t().requires_grad_()
    assert node not in layer_op_node(conv(xt, ei))
    for dtype in (torch.bfloat16, torch.float16):   # half precision takes it too
        half = AGNNConv(requires_grad=True).to("cuda", dtype)
        assert node in layer_op_node(half(x.detach().to(dtype).requires_grad_(), ei))
