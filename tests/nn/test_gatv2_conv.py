"""pyg_dfgnn.nn.GATv2Conv against torch_geometric.nn.GATv2Conv."""
import pytest
import torch
import torch_geometric.nn as pyg_nn

from pyg_dfgnn.nn import GATv2Conv

from ._equiv import (DEVICES, E, FORMATS, F_IN, N, check_core, check_equivalence, check_formats,
                     check_state_dict_round_trip, dropout_runs, feats, random_edge_index)


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
