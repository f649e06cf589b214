"""The fused layers inside PyG pipelines: DataLoader batches, NeighborLoader
mini-batches and to_hetero, compared with PyG's layers on the same weights."""
import pytest
import torch

import torch_geometric.nn as pyg_nn
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import DataLoader

from pyg_dfgnn import nn as our_nn


def _small_graphs(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        num = int(torch.randint(5, 20, (1,), generator=g))
        ei = torch.randint(0, num, (2, 4 * num), generator=g)
        out.append(Data(x=torch.randn(num, 8, generator=g), edge_index=ei))
    return out


@pytest.mark.parametrize("name,kw", [("GATConv", dict(heads=2)), ("GATv2Conv", dict(heads=2)),
                                     ("TransformerConv", dict(heads=2))])
def test_dataloader_batches(name, kw):
    ref = getattr(pyg_nn, name)(8, 4, **kw)
    ours = getattr(our_nn, name)(8, 4, **kw)
    ours.load_state_dict(ref.state_dict())
    for batch in DataLoader(_small_graphs(), batch_size=3):
        torch.testing.assert_close(ours(batch.x, batch.edge_index),
                                   ref(batch.x, batch.edge_index), rtol=1e-5, atol=1e-6)


def test_neighbor_loader_bipartite_minibatches():
    from torch_geometric.loader import NeighborLoader
    try:
        g = torch.Generator().manual_seed(1)
        data = Data(x=torch.randn(200, 8, generator=g),
                    edge_index=torch.randint(0, 200, (2, 1500), generator=g))
        loader = NeighborLoader(data, num_neighbors=[5, 3], batch_size=16)
        batches = list(loader)
    except ImportError as e:  # needs pyg-lib or torch_sparse for sampling
        pytest.skip(f"neighbour sampling unavailable: {e}")
    ref = pyg_nn.GATConv(8, 4, heads=2)
    ours = our_nn.GATConv(8, 4, heads=2)
    ours.load_state_dict(ref.state_dict())
    for b in batches[:4]:
        torch.testing.assert_close(ours(b.x, b.edge_index), ref(b.x, b.edge_index),
                                   rtol=1e-5, atol=1e-6)
        # bipartite form used by layer-wise inference: sources -> seed nodes
        xs, xd = b.x, b.x[:b.batch_size]
        mask = b.edge_index[1] < b.batch_size
        ei = b.edge_index[:, mask]
        bip_ref = pyg_nn.GATConv((8, 8), 4, heads=2, add_self_loops=False)
        bip = our_nn.GATConv((8, 8), 4, heads=2, add_self_loops=False)
        bip.load_state_dict(bip_ref.state_dict())
        torch.testing.assert_close(bip((xs, xd), ei), bip_ref((xs, xd), ei),
                                   rtol=1e-5, atol=1e-6)


def test_to_hetero():
    from torch_geometric.nn import to_hetero
    g = torch.Generator().manual_seed(2)
    data = HeteroData()
    data["paper"].x = torch.randn(30, 8, generator=g)
    data["author"].x = torch.randn(20, 8, generator=g)
    data["author", "writes", "paper"].edge_index = torch.stack(
        [torch.randint(0, 20, (80,), generator=g), torch.randint(0, 30, (80,), generator=g)])
    data["paper", "rev_writes", "author"].edge_index = \
        data["author", "writes", "paper"].edge_index.flip(0)

    class Net(torch.nn.Module):
        def __init__(self, mod):
            super().__init__()
            self.conv = mod.GATConv((-1, -1), 4, heads=2, add_self_loops=False)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    torch.manual_seed(0)
    ref = to_hetero(Net(pyg_nn), data.metadata(), aggr="sum")
    ours = to_hetero(Net(our_nn), data.metadata(), aggr="sum")
    with torch.no_grad():  # materialise the lazy weights, then copy them
        ref(data.x_dict, data.edge_index_dict)
        ours(data.x_dict, data.edge_index_dict)
    ours.load_state_dict(ref.state_dict())
    a = ours(data.x_dict, data.edge_index_dict)
    b = ref(data.x_dict, data.edge_index_dict)
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
