"""Bad calls of the functional ops raise a ValueError that names the user's
argument and says what was expected (issue 14, item 9)."""
import pytest
import torch

from pyg_dfgnn import ops
from pyg_dfgnn.graph import get_graph

NS, ND, H, F, FV = 14, 10, 2, 4, 3
EI = torch.stack([torch.arange(30) % NS, torch.arange(30) % ND])
E = EI.size(1)


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def dot(**kw):
    args = dict(q=r(ND, H, F), k=r(NS, H, F), v=r(NS, H, FV))
    args.update(kw)
    return ops.dot_attention(args.pop("graph", get_graph(EI, (NS, ND))), **args)


def gat(**kw):
    args = dict(x=r(NS, H, F), a_src=r(NS, H), a_dst=r(ND, H))
    args.update(kw)
    return ops.gat_attention(args.pop("graph", get_graph(EI, (NS, ND))), **args)


def gatv2(**kw):
    args = dict(x_src=r(NS, H, F), x_dst=r(ND, H, F), att=r(H, F))
    args.update(kw)
    return ops.gatv2_attention(args.pop("graph", get_graph(EI, (NS, ND))), **args)


def agnn(**kw):
    args = dict(x=r(NS, F), beta=torch.tensor(1.0))
    args.update(kw)
    return ops.agnn_attention(args.pop("graph", get_graph(EI, (NS, NS))), **args)


# (call, bad arguments, regex the message must match: the argument's name and
# what was expected)
CASES = [
    # dot / Transformer
    (dot, dict(q=r(NS, H, F)), r"'q' has 14 rows but the graph has 10 destination nodes"),
    (dot, dict(k=r(ND, H, F)), r"'k' has 10 rows but the graph has 14 source nodes"),
    (dot, dict(v=r(ND, H, FV)), r"'v' has 10 rows but the graph has 14 source nodes"),
    (dot, dict(q=r(ND, H + 1, F)), r"'k' has 2 heads .* but 'q' has 3"),
    (dot, dict(v=r(NS, H + 1, FV)), r"'v' has 3 heads .* but 'q' has 2"),
    (dot, dict(k=r(NS, H, F + 1)), r"'k' has 5 features .* but 'q' has 4"),
    (dot, dict(q=r(ND, F)), r"'q' must have shape \[N_dst, num_heads, features\]"),
    (dot, dict(k=r(NS, H, F, 1)), r"'k' must have shape \[N_src, num_heads, features\]"),
    (dot, dict(v=None), r"'v' must be a Tensor"),
    (dot, dict(q=[[1.0]]), r"'q' must be a Tensor of shape"),
    (dot, dict(q=r(ND, H, F).int()), r"'q' has dtype torch.int32; supported"),
    (dot, dict(v=r(NS, H, FV, dtype=torch.float64)),
     r"'v' has dtype torch.float64 but 'q' has torch.float32"),
    (dot, dict(edge=r(E - 1, H, F)), r"'edge' has 29 rows but the graph has 30 edges"),
    (dot, dict(edge=r(E, H, F + 2)), r"'edge' has 6 features .* but 'q' has 4"),
    (dot, dict(edge=r(E, H, F)), r"'edge' is added to keys and values, so 'v' must have"),
    (dot, dict(edge=r(E, H, F, dtype=torch.float16)), r"'edge' has dtype torch.float16"),
    (dot, dict(scale=float("nan")), r"'scale' must be finite"),
    (dot, dict(scale="a"), r"'scale' must be a float"),
    (dot, dict(dropout=1.0), r"'dropout' must be in \[0, 1\)"),
    (dot, dict(dropout=-0.1), r"'dropout' must be in \[0, 1\)"),
    (dot, dict(dropout="0.5"), r"'dropout' must be a float"),
    (dot, dict(graph=EI), r"'graph' must be a pyg_dfgnn.graph.CSRGraph.*get_graph"),
    # GAT
    (gat, dict(x=r(ND, H, F)), r"'x' has 10 rows but the graph has 14 source nodes"),
    (gat, dict(a_src=r(ND, H)), r"'a_src' has 10 rows but the graph has 14 source nodes"),
    (gat, dict(a_dst=r(NS, H)), r"'a_dst' has 14 rows but the graph has 10 destination"),
    (gat, dict(a_dst=r(ND, H + 1)), r"'a_dst' has 3 heads .* but 'x' has 2"),
    (gat, dict(a_src=r(NS, H, 1)), r"'a_src' must have shape \[N_src, num_heads\]"),
    (gat, dict(a_edge=r(3, H)), r"'a_edge' has 3 rows but the graph has 30 edges"),
    (gat, dict(a_dst=r(ND, H, dtype=torch.bfloat16)),
     r"'a_dst' has dtype torch.bfloat16 but 'x' has torch.float32"),
    (gat, dict(negative_slope=None), r"'negative_slope' must be a float"),
    (gat, dict(bias=r(H, F + 1)), r"'bias' has 5 features per head but 'x' has 4: it may"),
    (gat, dict(bias=r(H + 1, F)), r"'bias' has 3 heads .* but 'x' has 2"),
    (gat, dict(bias=r(H * F)), r"'bias' must have shape \[num_heads, out_features\]"),
    (gat, dict(bias=r(H, F, dtype=torch.float64)),
     r"'bias' has dtype torch.float64 but 'x' has torch.float32"),
    # GATv2
    (gatv2, dict(x_dst=r(NS, H, F)), r"'x_dst' has 14 rows but the graph has 10 destination"),
    (gatv2, dict(x_dst=r(ND, H, F + 1)), r"'x_dst' has 5 features .* but 'x_src' has 4"),
    (gatv2, dict(att=r(H, F + 1)), r"'att' has 5 features .* but 'x_src' has 4"),
    (gatv2, dict(att=r(H + 1, F)), r"'att' has 3 heads .* but 'x_src' has 2"),
    (gatv2, dict(att=r(2, H, F)), r"'att' must have shape \[num_heads, features\]"),
    (gatv2, dict(att=None), r"'att' must be a Tensor"),
    (gatv2, dict(x_edge=r(E, H)), r"'x_edge' must have shape \[N_edges|'x_edge' must have"),
    # AGNN
    (agnn, dict(x=r(NS + 1, F)), r"'x' has 15 rows but the graph has 14 source nodes"),
    (agnn, dict(x=r(NS, 1, F)), r"'x' must have shape \[N_src, features\]"),
    (agnn, dict(graph=get_graph(EI.flip(0), (ND, NS)), x=r(ND, F)),
     r"'x' has 10 rows but the graph has 14 destination nodes"),
    (agnn, dict(beta=torch.ones(3)), r"'beta' must be a float or a one-element"),
    (agnn, dict(beta="1"), r"'beta' must be a float or a one-element"),
    (agnn, dict(x=r(NS, F).long()), r"'x' has dtype torch.int64; supported"),
    (agnn, dict(eps=float("inf")), r"'eps' must be finite"),
]


@pytest.mark.parametrize("call,bad,msg", CASES,
                         ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_bad_call_names_the_argument(call, bad, msg):
    with pytest.raises(ValueError, match=msg):
        call(**bad)


@pytest.mark.parametrize("call", [dot, gat, gatv2, agnn])
def test_good_calls_pass(call):
    out, alpha = call()
    assert torch.isfinite(out).all() and alpha is None


def test_agnn_accepts_a_float_beta():
    g = get_graph(EI, (NS, NS))
    x = r(NS, F)
    a = ops.agnn_attention(g, x, 0.7)[0]
    b = ops.agnn_attention(g, x, torch.tensor([0.7]))[0]
    torch.testing.assert_close(a, b)



def test_backward_mode_is_checked_and_restored():
    """``set_backward_mode`` takes the three modes or None (ValueError naming
    the argument otherwise); the context manager restores the setting."""
    from pyg_dfgnn.ops import BACKWARD_MODES, backward_mode, set_backward_mode
    assert BACKWARD_MODES == ("store", "recompute", "auto")
    with pytest.raises(ValueError, match="'mode' must be one of 'store', 'recompute', 'auto'"):
        set_backward_mode("fast")
    with backward_mode("recompute"):
        with backward_mode("store"):
            assert set_backward_mode("store") == "store"
        assert set_backward_mode("recompute") == "recompute"
    assert set_backward_mode(None) is None
