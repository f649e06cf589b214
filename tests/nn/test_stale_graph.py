"""A layer call after the adjacency was changed behind the version counter
equals PyG's result on the changed graph (issue 14, item 1): writes through
``.data``, through a NumPy view, and under ``torch.inference_mode``."""
import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg_nn

from pyg_dfgnn import graph as dfgraph
from pyg_dfgnn.nn import GATConv, TransformerConv

from ._equiv import build_pair, random_edge_index

N, F_IN, E = 10, 6, 30
LAYERS = {"gat": (pyg_nn.GATConv, GATConv, dict(in_channels=F_IN, out_channels=4, heads=2)),
          "transformer": (pyg_nn.TransformerConv, TransformerConv,
                          dict(in_channels=F_IN, out_channels=4, heads=2))}


def _write_data(ei, v):
    ei.data[1, :4] = v


def _write_numpy(ei, v):
    ei.numpy()[1, :4] = v.numpy()


def _write_inference(ei, v):
    with torch.inference_mode():
        ei[1, :4] = v


@pytest.mark.parametrize("write", [_write_data, _write_numpy, _write_inference],
                         ids=["data", "numpy", "inference_mode"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_after_hidden_write_equals_pyg(name, write):
    pyg_cls, our_cls, kw = LAYERS[name]
    ref, ours = build_pair(pyg_cls, our_cls, kw, torch.float64, "cpu")
    x = torch.randn(N, F_IN, dtype=torch.float64)
    ei = random_edge_index(N, N, E, seed=4)
    if write is _write_numpy:
        ei = torch.from_numpy(np.ascontiguousarray(ei.numpy()))
    ctx = torch.inference_mode() if write is _write_inference else torch.no_grad()
    with ctx:
        if write is _write_inference:
            ei = ei.clone()                               # an inference tensor
        before = ours(x, ei)
        torch.testing.assert_close(ours(x, ei), before)  # a cache hit
        new = (ei[1, :4] + torch.tensor([1, 2, 3, 4])) % N
        write(ei, new)
        assert torch.equal(ei[1, :4], new)
        got, want = ours(x, ei), ref(x, ei)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(got, before)


def test_cache_counts_stale_hits():
    dfgraph.clear_cache()
    ref, ours = build_pair(*LAYERS["gat"][:2], LAYERS["gat"][2], torch.float64, "cpu")
    x = torch.randn(N, F_IN, dtype=torch.float64)
    ei = random_edge_index(N, N, E, seed=5)
    with torch.no_grad():
        ours(x, ei)
        ei.data[1, 0] = (ei[1, 0] + 1) % N
        torch.testing.assert_close(ours(x, ei), ref(x, ei), rtol=1e-10, atol=1e-12)
    assert dfgraph.cache_info()["stale"] == 1
