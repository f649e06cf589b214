"""Index dtypes (issue 14, items 3 and 4).

* uint8/int8/int16 ``edge_index`` (accepted by PyG's ``propagate``) are widened
  to int64 before any index arithmetic: self-loops on more nodes than the dtype
  can count must not wrap; other dtypes raise a ``ValueError`` naming
  ``edge_index`` and the accepted dtypes.
* self-loops with ``edge_dim``: the loop edge features (every ``fill_value``
  mode) and their gradients are computed on an int64 index whatever the index
  dtype (PyG's own int32 gradient through ``add_self_loops`` is wrong, and NaN
  for ``'max'``): compared with PyG on an int64 index, in float64.
"""
import pytest
import torch
import torch_geometric.nn as pyg_nn

from pyg_dfgnn.nn import AGNNConv, GATConv, GATv2Conv, TransformerConv

from ._equiv import build_pair

F_IN = 5


def _compare(pyg_cls, our_cls, kw, x, ei_ref, ei_ours, ea=None):
    """PyG on ``ei_ref`` vs ours on ``ei_ours``: output and every gradient."""
    ref, ours = build_pair(pyg_cls, our_cls, kw, torch.float64, "cpu")
    res = []
    for m, ei in ((ref, ei_ref), (ours, ei_ours)):
        xx = x.detach().clone().requires_grad_()
        args = (xx, ei)
        kwargs = {}
        if ea is not None:
            e = ea.detach().clone().requires_grad_()
            kwargs["edge_attr"] = e
        y = m(*args, **kwargs)
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=y.dtype)
        (y * w).sum().backward()
        grads = {"x": xx.grad, **{n: p.grad for n, p in m.named_parameters()}}
        if ea is not None:
            grads["edge_attr"] = e.grad
        res.append((y.detach(), grads))
    (y_r, g_r), (y_o, g_o) = res
    torch.testing.assert_close(y_o, y_r, rtol=1e-10, atol=1e-12)
    for n in g_r:
        if g_r[n] is None:
            assert g_o[n] is None or not g_o[n].any(), n
            continue
        assert not torch.isnan(g_o[n]).any(), f"NaN in grad {n}"
        torch.testing.assert_close(g_o[n], g_r[n], rtol=1e-10, atol=1e-12, msg=n)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16])
@pytest.mark.parametrize("layer", ["gat", "gatv2", "agnn", "transformer"])
def test_small_index_dtypes_are_widened(dtype, layer):
    N = 300                                   # more nodes than uint8/int8 can count
    g = torch.Generator().manual_seed(0)
    hi = 120 if dtype == torch.int8 else 250
    ei = torch.randint(0, hi, (2, 400), generator=g)
    ei = torch.cat([ei, torch.tensor([[5, 7], [5, 7]])], 1)   # existing self-loops
    x = torch.randn(N, F_IN, generator=g, dtype=torch.float64)
    cls = {"gat": (pyg_nn.GATConv, GATConv, dict(in_channels=F_IN, out_channels=3, heads=2)),
           "gatv2": (pyg_nn.GATv2Conv, GATv2Conv,
                     dict(in_channels=F_IN, out_channels=3, heads=2)),
           "agnn": (pyg_nn.AGNNConv, AGNNConv, dict(requires_grad=True)),
           "transformer": (pyg_nn.TransformerConv, TransformerConv,
                           dict(in_channels=F_IN, out_channels=3, heads=2))}[layer]
    _compare(*cls, x, ei, ei.to(dtype))


def test_small_index_dtypes_with_attention_weights():
    ei = torch.randint(0, 200, (2, 300), generator=torch.Generator().manual_seed(1))
    x = torch.randn(300, F_IN, dtype=torch.float64)
    ref, ours = build_pair(pyg_nn.GATConv, GATConv, dict(in_channels=F_IN, out_channels=2),
                           torch.float64, "cpu")
    out_r, (adj_r, a_r) = ref(x, ei, return_attention_weights=True)
    out_o, (adj_o, a_o) = ours(x, ei.to(torch.uint8), return_attention_weights=True)
    torch.testing.assert_close(out_o, out_r)
    assert torch.equal(adj_o, adj_r) and adj_o.dtype == torch.int64
    torch.testing.assert_close(a_o, a_r)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.complex64])
def test_other_index_dtypes_name_the_argument(dtype):
    ei = torch.zeros(2, 3).to(dtype)
    with pytest.raises(ValueError, match=r"'edge_index'.*int64, int32, int16, int8 or uint8"):
        GATConv(F_IN, 2)(torch.randn(4, F_IN), ei)


FILLS = ["mean", "max", "min", "add", "sum", "mul", 0.5, None, "tensor"]


@pytest.mark.parametrize("fill", FILLS, ids=[str(f) for f in FILLS])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
@pytest.mark.parametrize("layer", ["gat", "gatv2"])
def test_loop_edge_features_all_fill_modes(layer, dtype, fill):
    N, E = 9, 30
    g = torch.Generator().manual_seed(2)
    ei = torch.randint(0, N - 1, (2, E), generator=g)   # node N-1: no incoming edges
    ei[:, 1] = ei[:, 0]                                  # a duplicate (ties for max/min)
    ei[1, 2] = ei[0, 2]                                  # an existing self-loop
    ea = torch.randn(E, 3, generator=g, dtype=torch.float64)
    ea[1] = ea[0]
    x = torch.randn(N, F_IN, generator=g, dtype=torch.float64)
    fv = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64) if fill == "tensor" else fill
    pyg_cls, our_cls = (pyg_nn.GATConv, GATConv) if layer == "gat" else \
        (pyg_nn.GATv2Conv, GATv2Conv)
    kw = dict(in_channels=F_IN, out_channels=4, heads=2, edge_dim=3, fill_value=fv)
    _compare(pyg_cls, our_cls, kw, x, ei, ei.to(dtype), ea)
