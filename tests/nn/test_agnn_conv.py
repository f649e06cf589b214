"""pyg_dfgnn.nn.AGNNConv against torch_geometric.nn.AGNNConv."""
import pytest
import torch
import torch_geometric.nn as pyg_nn

from pyg_dfgnn.nn import AGNNConv

from ._equiv import DEVICES, FORMATS, check_equivalence, feats, make_adj, random_edge_index

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
    a row whose norm is below ``eps`` (the clamp's branch) is included."""
    from pyg_dfgnn import ops
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
