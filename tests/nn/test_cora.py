"""End to end: a 2-layer GAT on Cora trained with PyG's GATConv and with ours
(same init, same seed, same feature-dropout masks) reaches the same test accuracy.

Attention dropout is off: PyG and the fused layers draw its masks from different
random streams, which would make the two runs two different random trainings
whose accuracies differ by the seed-to-seed spread (~1%), a matter of luck on a
given CPU.  Without it the runs are the same computation in a different float32
summation order; the fused attention dropout is tested in test_gat_conv.py."""
import os
import shutil

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn

from pyg_dfgnn.nn import GATConv

CORA_RAW = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data",
                        "planetoid", "Cora", "raw")
EPOCHS = 40


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    if not os.path.isdir(CORA_RAW):
        pytest.skip(f"Cora raw files not found at {os.path.normpath(CORA_RAW)}")
    from torch_geometric.datasets import Planetoid
    root = tmp_path_factory.mktemp("planetoid")
    shutil.copytree(CORA_RAW, root / "Cora" / "raw")
    return Planetoid(str(root), "Cora")


class GAT(torch.nn.Module):
    def __init__(self, conv_cls, in_channels, num_classes):
        super().__init__()
        self.conv1 = conv_cls(in_channels, 8, heads=8)
        self.conv2 = conv_cls(8 * 8, num_classes, heads=1, concat=False)

        # feature dropout from its own generator: both models see the same masks
        self.gen = torch.Generator().manual_seed(0)

    def dropout(self, x, p=0.6):
        if not self.training:
            return x
        keep = torch.rand(x.shape, generator=self.gen) >= p
        return x * keep / (1 - p)

    def forward(self, x, edge_index):
        x = self.dropout(x)
        x = F.elu(self.conv1(x, edge_index))
        x = self.dropout(x)
        return self.conv2(x, edge_index)


def _train(conv_cls, data, num_features, num_classes, init_state=None):
    torch.manual_seed(0)
    model = GAT(conv_cls, num_features, num_classes)
    if init_state is not None:
        model.load_state_dict(init_state)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(EPOCHS):
        model.train()
        opt.zero_grad()
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        assert torch.isfinite(loss)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        pred = model(data.x, data.edge_index).argmax(dim=-1)
    acc = (pred[data.test_mask] == data.y[data.test_mask]).float().mean().item()
    return acc, init


@pytest.mark.slow
def test_cora_gat_matches_pyg(cora):
    data = cora[0]
    acc_pyg, init = _train(pyg_nn.GATConv, data, cora.num_features, cora.num_classes)
    acc_ours, _ = _train(GATConv, data, cora.num_features, cora.num_classes, init)
    assert acc_pyg > 0.75, acc_pyg
    assert acc_ours > 0.75, acc_ours
    # float32 rounding moves the logits by ~1e-6 relative after 40 steps (measured:
    # train losses within 2e-6 of each other and of a float64 run); a test node changes
    # its prediction only if its top-two logits are that close, so the accuracies agree
    # to a node or two.  20 nodes (2%) of difference means the trainings diverged.
    assert abs(acc_pyg - acc_ours) <= 0.02, (acc_pyg, acc_ours)
