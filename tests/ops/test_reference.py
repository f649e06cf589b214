"""The reference ops (CPU path and CUDA oracle) against gather/softmax/scatter."""
import pytest
import torch

from pyg_dfgnn.graph import get_graph
from pyg_dfgnn.ops import reference as R
from _cases import KINDS, call, graph_case, leaves, make_inputs, random_graph


def naive(kind, ei, nd, inp, keep=None, scale=None):
    F = (inp["val"] if inp["val"] is not None else inp["src"]).size(-1)
    sc = scale if scale is not None else F ** -0.5
    return R.naive_attention(kind, ei, nd, inp["dst"], inp["src"], inp["val"], inp["edge"],
                             inp["att"], sc if kind == R.DOT else 1.0, 0.2, keep)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("edge", [False, True])
@pytest.mark.parametrize("bipartite", [False, True])
def test_forward_matches_naive(kind, edge, bipartite):
    k = KINDS[kind]
    ns, nd = (17, 11) if bipartite else (15, 15)
    ei = random_graph(ns, nd, 60)
    g = get_graph(ei, (ns, nd))
    inp = make_inputs(k, ns, nd, ei.size(1), 3, 5, torch.float64, "cpu", edge)
    out, alpha = call(k, g, inp, return_alpha=True)
    ref, ref_alpha = naive(k, ei, nd, inp)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(alpha, ref_alpha, rtol=1e-10, atol=1e-12)
    assert torch.isfinite(out).all()
    empty = inp["att"] if getattr(k, "bias", False) else 0   # (GAT's output bias)
    assert (out[nd - 1] == empty).all() if nd > 3 and not bipartite else True


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("edge", [False, True])
def test_gradcheck(kind, edge):
    k = KINDS[kind]
    _, g, inp = graph_case(k, 6, 5, 14, 2, 2, edge=edge)
    names = [n for n, v in inp.items() if v is not None]

    def fn(*ts):
        d = dict(inp)
        d.update(zip(names, ts))
        return call(k, g, d)[0]
    assert torch.autograd.gradcheck(fn, tuple(inp[n] for n in names))


@pytest.mark.parametrize("kind", list(KINDS))
def test_explicit_backward_matches_autograd_of_naive(kind):
    k = KINDS[kind]
    ei, g, inp = graph_case(k, 20, 20, 90, 2, 4, edge=True)
    out = call(k, g, inp)[0]
    gout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves(inp), gout)
    ref = naive(k, ei, 20, inp)[0]
    rgrads = torch.autograd.grad(ref, leaves(inp), gout)
    for a, b in zip(grads, rgrads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_dropout_mask_is_reproducible_and_unbiased():
    ei = random_graph(50, 50, 400)
    g = get_graph(ei, (50, 50))
    inp = make_inputs(R.GAT, 50, 50, ei.size(1), 2, 4, torch.float64, "cpu")
    torch.manual_seed(1)
    a = call(R.GAT, g, inp, dropout=0.5)[0]
    torch.manual_seed(1)
    b = call(R.GAT, g, inp, dropout=0.5)[0]
    c = call(R.GAT, g, inp, dropout=0.5)[0]
    assert torch.equal(a, b) and not torch.equal(a, c)
    # the mask keeps ~1-p of the edges
    keep = R.dropout_keep(123, 100000, 1, 0.3, "cpu")
    assert abs(keep.float().mean().item() - 0.7) < 0.01
    # post-dropout alpha equals the kept, rescaled alpha (PyG semantics)
    torch.manual_seed(5)
    out, alpha = call(R.GAT, g, inp, dropout=0.5, return_alpha=True)
    _, alpha0 = call(R.GAT, g, inp, return_alpha=True)
    kept = alpha != 0
    torch.testing.assert_close(alpha[kept], alpha0[kept] * 2.0)


def test_dropout_gradcheck():
    _, g, inp = graph_case(R.DOT, 6, 6, 14, 2, 2, edge=True)

    def fn(q, k, v, e):
        torch.manual_seed(7)
        return call(R.DOT, g, dict(dst=q, src=k, val=v, edge=e, att=None), dropout=0.4)[0]
    assert torch.autograd.gradcheck(fn, (inp["dst"], inp["src"], inp["val"], inp["edge"]))


def test_philox_matches_known_stream():
    # Philox4x32-10 known-answer test (Random123): counter 0, key 0 -> 0x6627e8d5
    u = R.philox_uniform(0, torch.zeros(1, dtype=torch.long))
    assert int(u.item() * 16777216) == 0x6627e8d5 >> 8


def test_empty_graphs():
    for ns, nd in ((0, 0), (5, 4)):
        ei = torch.zeros(2, 0, dtype=torch.long)
        g = get_graph(ei, (ns, nd))
        inp = make_inputs(R.DOT, ns, nd, 0, 2, 3, torch.float32, "cpu")
        out, alpha = call(R.DOT, g, inp, return_alpha=True)
        assert out.shape == (nd, 2, 3) and (out == 0).all() and alpha.shape == (0, 2)


def test_agnn_beta_gradient():
    from pyg_dfgnn.ops import agnn_attention
    ei = random_graph(6, 6, 16)
    g = get_graph(ei, (6, 6))
    x = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    beta = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, b: agnn_attention(g, x, b)[0], (x, beta))


def test_bad_feature_shapes_raise():
    ei = random_graph(6, 6, 20)
    g = get_graph(ei, (6, 6))
    inp = make_inputs(R.GAT, 6, 6, ei.size(1), 2, 3, torch.float32, "cpu")
    from pyg_dfgnn import ops
    with pytest.raises(ValueError, match="a_dst"):
        ops.gat_attention(g, inp["val"], inp["src"], inp["dst"][:3])
    with pytest.raises(ValueError, match="x"):
        ops.gat_attention(g, inp["val"].int(), inp["src"], inp["dst"])
    with pytest.raises(ValueError, match="dropout"):
        ops.gat_attention(g, inp["val"], inp["src"], inp["dst"], dropout=1.5)
    with pytest.raises(ValueError, match="a_edge"):
        ops.gat_attention(g, inp["val"], inp["src"], inp["dst"], torch.randn(3, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_saved_statistics_format(dtype):
    """``lse [2, N_dst, H]``: the row max m of the scores (-inf for an empty
    row) and log(sum_j exp(s_ij - m)) (0 for an empty row), float32 unless the
    inputs are float64 (notes/lse.md)."""
    from pyg_dfgnn.ops import fused
    from _cases import op_args
    ei = random_graph(12, 10, 40, self_loops=False)  # destination 9 has no edges
    g = get_graph(ei, (12, 10))
    inp = make_inputs(R.DOT, 12, 10, ei.size(1), 3, 4, dtype, "cpu", True)
    out, lse, _ = fused.attention_fwd(*op_args(R.DOT, g, inp, scale=0.5))
    assert lse.shape == (2, 10, 3) and lse.dtype == (
        torch.float64 if dtype == torch.float64 else torch.float32)
    d = {k: (v.double() if v is not None else None) for k, v in inp.items()}
    s = (d["dst"][ei[1]] * (d["src"][ei[0]] + d["edge"])).sum(-1) * 0.5
    for i in range(10):
        rows = s[ei[1] == i]
        if rows.numel() == 0:
            assert (lse[0, i] == float("-inf")).all() and (lse[1, i] == 0).all()
            continue
        m = rows.max(0).values
        tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
        torch.testing.assert_close(lse[0, i].double(), m, **tol)
        torch.testing.assert_close(lse[1, i].double(), (rows - m).exp().sum(0).log(), **tol)
    assert (ei[1] == 9).sum() == 0
