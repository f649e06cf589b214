"""``torchrun --nproc-per-node=2 ... dfgnn train`` on CPU (gloo): DDP path, rank-0 output."""
import json

import pytest
import torch

from .conftest import CONFIGS, TINY, torchrun_train


def test_ddp_two_ranks_graph_batches(tmp_path):
    out, root = tmp_path / "run", tmp_path / "data"
    proc = torchrun_train([str(CONFIGS / "pattern_gat_quick.yaml")] + TINY
                          + ["data.num_train=32", "data.num_val=15", "epochs=2", "backend=pyg",
                             f"data.root={root}", f"out_dir={out}"])
    # only rank 0 logs and writes
    assert proc.stdout.count("dfgnn train: pattern_gat_quick") == 1
    assert "x2 ranks (DDP, gloo)" in proc.stdout
    with open(out / "results.json") as f:
        r = json.load(f)
    assert r["environment"]["world_size"] == 2 and len(r["history"]) == 2
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint_best.pt", "checkpoint_last.pt", "config.yaml", "results.json", "train.log"]

    # metrics are all-reduced counts over disjoint shards: evaluating the final model
    # in one process gives the same validation accuracy and loss
    from torch_geometric.loader import DataLoader
    from pyg_dfgnn.data import SBMDataset
    from pyg_dfgnn.train.config import config_from_dict
    from pyg_dfgnn.train.metrics import ConfusionCounter
    from pyg_dfgnn.train.models import build_model
    ckpt = torch.load(out / "checkpoint_last.pt", weights_only=False)
    cfg = config_from_dict(ckpt["config"])
    net = build_model(cfg.model, 3, 2, True, "pyg")
    net.load_state_dict(ckpt["model"])
    net.eval()
    val = SBMDataset(str(root), "PATTERN", "val", seed=0, sizes=(32, 15, 8))
    counter = ConfusionCounter(2)
    assert len(val) == 15
    with torch.no_grad():
        for b in DataLoader(val, batch_size=len(val)):
            counter.update(net(b.x, b.edge_index), b.y)
    assert counter.total == sum(d.num_nodes for d in val)
    assert r["metrics"]["final_val_metric"] == pytest.approx(counter.mean_class_acc())


def test_ddp_two_ranks_full_batch_planetoid(tmp_path, planetoid_root):
    out = tmp_path / "cora"
    proc = torchrun_train([str(CONFIGS / "cora_gat.yaml"), f"data.root={planetoid_root}",
                           f"out_dir={out}", "epochs=3", "backend=pyg", "log.progress=false"])
    assert proc.stdout.count("dfgnn train: cora_gat") == 1
    with open(out / "results.json") as f:
        r = json.load(f)
    assert r["environment"]["world_size"] == 2 and len(r["history"]) == 3
    assert 0 < r["metrics"]["test_metric"] <= 100
