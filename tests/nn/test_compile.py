"""torch.compile: the layers compile and match eager.  On a plain edge_index
the op converts the graph itself (``dfgnn::graph_attention_fwd``), so a layer
traces without a graph break; the adjacency types and options that need the
converted graph in Python (SparseTensor/EdgeIndex inputs, attention weights,
self-loop edge features) break once at the cached conversion."""
import pytest
import torch
import torch._dynamo

from pyg_dfgnn.graph import get_graph
from pyg_dfgnn.nn import AGNNConv, GATConv, TransformerConv
from pyg_dfgnn.ops import agnn_attention, dot_attention, gat_attention, gatv2_attention

from ._equiv import random_edge_index

N, F_IN, E = 30, 8, 90


class Net(torch.nn.Module):
    def __init__(self, conv1, conv2):
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2

    def forward(self, x, edge_index, edge_attr):
        x = self.conv1(x, edge_index, edge_attr).relu()
        return self.conv2(x, edge_index)


def _nets():
    torch.manual_seed(0)
    return {
        "gat": Net(GATConv(F_IN, 4, heads=2, edge_dim=3), GATConv(8, 3)),
        "transformer": Net(TransformerConv(F_IN, 4, heads=2, edge_dim=3, beta=True),
                           TransformerConv(8, 3)),
    }


@pytest.mark.parametrize("name", ["gat", "transformer"])
def test_compiled_model_matches_eager(name):
    model = _nets()[name]
    x = torch.randn(N, F_IN)
    ei = random_edge_index(N, N, E, seed=1)
    ea = torch.randn(E, 3)
    expect = model(x, ei, ea)
    expect.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=False, backend="aot_eager")
    for _ in range(2):  # second call: no recompilation needed, same result
        out = compiled(x, ei, ea)
        torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-6)
    model.zero_grad()
    compiled(x, ei, ea).square().sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-5, atol=1e-6, msg=n)


def _breaks(model, *args):
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(*args)
    return explanation.graph_break_count, [str(r.reason) for r in explanation.break_reasons]


@pytest.mark.parametrize("name", ["gat", "gatv2", "transformer", "transformer_edge", "agnn"])
@pytest.mark.parametrize("training", [False, True])
def test_no_graph_break_on_edge_index(name, training):
    from pyg_dfgnn.nn import GATv2Conv
    torch.manual_seed(0)
    conv = {"gat": lambda: GATConv(F_IN, 4, heads=2, dropout=0.3),
            "gatv2": lambda: GATv2Conv(F_IN, 4, heads=2),
            "transformer": lambda: TransformerConv(F_IN, 4, heads=2, beta=True),
            "transformer_edge": lambda: TransformerConv(F_IN, 4, heads=2, edge_dim=3),
            "agnn": lambda: AGNNConv()}[name]()
    conv.train(training)
    x, ei = torch.randn(N, F_IN), random_edge_index(N, N, E, seed=5)
    args = (x, ei, torch.randn(E, 3)) if name == "transformer_edge" else (x, ei)
    n, reasons = _breaks(conv, *args)
    assert n == 0, reasons
    # dynamic shapes (symbolic sizes and floats) trace as one graph as well
    torch._dynamo.reset()
    torch.compile(conv, dynamic=True, fullgraph=True, backend="eager")(*args)


def test_graph_breaks_only_at_graph_conversion():
    """GAT with edge features and self-loops builds the loop features from the
    converted graph: that call breaks, at the conversion only."""
    model = _nets()["gat"].eval()
    x, ei, ea = torch.randn(N, F_IN), random_edge_index(N, N, E, seed=2), torch.randn(E, 3)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(x, ei, ea)
    assert explanation.graph_break_count >= 1
    for reason in explanation.break_reasons:
        assert "disable" in str(reason.reason), reason.reason
        assert any("resolve_adjacency" in (frame.line or "") or "_fused.py" in frame.filename
                   for frame in reason.user_stack), reason.user_stack


def test_agnn_compiles():
    torch.manual_seed(0)
    conv = AGNNConv()
    x, ei = torch.randn(N, F_IN), random_edge_index(N, N, E, seed=3)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(conv, backend="aot_eager")(x, ei), conv(x, ei))


def test_fused_ops_fullgraph():
    """Each fused op traces into one graph (fullgraph=True) with its backward."""
    g = get_graph(random_edge_index(N, N, E, seed=4), (N, N))
    H, C = 2, 4
    t = {k: torch.randn(*s, requires_grad=True) for k, s in dict(
        x=(N, H, C), xd=(N, H, C), a_s=(N, H), a_d=(N, H), att=(H, C), e=(E, H, C),
        ae=(E, H), x2=(N, C)).items()}
    beta = torch.tensor([1.5], requires_grad=True)

    def f(x, xd, a_s, a_d, att, e, ae, x2, beta):
        return (gat_attention(g, x, a_s, a_d, ae, 0.2, 0.0, False)[0].sum()
                + gatv2_attention(g, x, xd, att, e)[0].sum()
                + dot_attention(g, xd, x, x, e)[0].square().sum()
                + agnn_attention(g, x2, beta)[0].square().sum())
    args = list(t.values()) + [beta]
    expect = f(*args)
    expect_grads = torch.autograd.grad(expect, args)
    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = cf(*args)
    torch.testing.assert_close(out, expect)
    for a, b in zip(torch.autograd.grad(out, args), expect_grads):
        torch.testing.assert_close(a, b)


def test_compiled_layer_reports_bad_edge_index():
    """The conversion inside the compiled op validates as the eager path does:
    an out-of-range index is a ValueError naming edge_index, not a crash."""
    torch.manual_seed(0)
    conv = TransformerConv(F_IN, 4, heads=2)
    x = torch.randn(N, F_IN)
    bad = random_edge_index(N, N, E, seed=6)
    bad[0, 3] = N + 5
    torch._dynamo.reset()
    compiled = torch.compile(conv, dynamic=True, backend="aot_eager")
    with pytest.raises(ValueError, match="edge_index"):
        compiled(x, bad)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["gat", "gatv2", "transformer"])
def test_padded_cuda_calls_compile_without_graph_breaks(name, monkeypatch):
    """CUDA calls that project into the kernels' padded head width (9 -> 10
    here; every call is made GPU-bound) compile without a graph break and
    match eager: while compiling the padding is ATen ops (the one-kernel
    ``stack_pad_heads`` op has no fake kernel; nn/_glue.py, padded_weight)."""
    from pyg_dfgnn.nn import GATv2Conv, _padded
    monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    torch.manual_seed(0)
    conv = {"gat": lambda: GATConv(F_IN, 9, heads=2),
            "gatv2": lambda: GATv2Conv(F_IN, 9, heads=2),
            "transformer": lambda: TransformerConv(F_IN, 9, heads=2)}[name]().cuda()
    x = torch.randn(N, F_IN, device="cuda")
    ei = random_edge_index(N, N, E, seed=5).cuda()
    assert _padded.kernel_width(9, x, 2) == 10
    n, reasons = _breaks(conv, x, ei)
    assert n == 0, reasons
    torch._dynamo.reset()
    xs = x.clone().requires_grad_(True)
    out = torch.compile(conv, dynamic=True, fullgraph=True, backend="aot_eager")(xs, ei)
    expect = conv(x.clone().requires_grad_(True), ei)
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)
    out.square().sum().backward()
    assert xs.grad is not None and torch.isfinite(xs.grad).all()
