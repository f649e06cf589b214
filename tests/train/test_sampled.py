"""Neighbour-sampled training (``data.loader=neighbor``): sampler, loaders, trainer, DDP."""
import json
import math

import pytest
import torch

from pyg_dfgnn.train.config import ConfigError, load_config
from pyg_dfgnn.train.sampling import (TorchNeighborSampler, expected_subgraph_size,
                                      make_loader, sample_neighbors, seed_shard)

from .conftest import CONFIGS, fused_available, torchrun_train

# a tiny synthetic power-law graph, 2-layer GAT, fan-out [4, 3]
TINY_SAMPLED = ["data.name=synthetic_powerlaw", "data.num_nodes=300", "data.num_edges=3000",
                "data.max_degree=120", "data.num_features=8", "data.num_classes=3",
                "data.loader=neighbor", "data.num_neighbors=[4, 3]", "batch_size=32",
                "model.name=gat", "model.hidden=16", "model.heads=2", "model.layers=2",
                "scheduler.name=none", "log.progress=false", "device=cpu"]


def _csc(edge_index, n):
    """colptr / row (sources of each target's in-edges) like PyG's to_csc."""
    src, dst = edge_index
    order = torch.argsort(dst * n + src)
    colptr = torch.zeros(n + 1, dtype=torch.long)
    colptr[1:] = torch.cumsum(torch.bincount(dst, minlength=n), 0)
    return colptr, src[order]


# ---------------------------------------------------------------------------- sampler
@pytest.mark.parametrize("k", [3, 8, 40])  # deg <= k, k < deg <= 4k, deg > 4k rows
def test_sample_neighbors_structure(k):
    from pyg_dfgnn.data.synthetic import powerlaw_graph
    n = 400
    ei = powerlaw_graph(n, 6000, 300, seed=1)
    colptr, row = _csc(ei, n)
    edges = set((ei[0] * n + ei[1]).tolist())
    deg = colptr[1:] - colptr[:-1]
    seed = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:50]
    torch.manual_seed(0)
    out = sample_neighbors(colptr, row, seed, [k, 2])
    node, r, c = out.node, out.row, out.col
    assert torch.equal(node[:50], seed)                     # seeds first, in order
    assert torch.unique(node).numel() == node.numel()       # every node once
    assert bool((c[1:] >= c[:-1]).all())                    # destination-major
    g = torch.stack([node[r], node[c]])
    assert all(e in edges for e in (g[0] * n + g[1]).tolist())       # real edges
    assert torch.unique(g[0] * n + g[1]).numel() == g.size(1)         # no duplicates
    assert torch.equal(row[out.edge], g[0])                 # edge = CSC position
    # hop 1: every seed gets min(deg, k) in-edges
    hop1 = torch.bincount(c[:out.num_sampled_edges[0]], minlength=50)
    assert torch.equal(hop1, torch.clamp(deg[seed], max=k))
    assert out.num_sampled_nodes[0] == 50 and sum(out.num_sampled_nodes) == node.numel()
    assert sum(out.num_sampled_edges) == r.numel()


@pytest.mark.parametrize("d,k", [(10, 5), (60, 5)])  # random-keys and rejection regimes
def test_sample_neighbors_uniform(d, k):
    # T targets with d in-edges each: every in-edge is chosen with probability k/d
    T = 3000
    colptr = torch.arange(T + 1) * d
    row = torch.arange(T * d) % 997 + T       # sources are other nodes
    colptr = torch.cat([colptr, torch.full((997,), T * d)])
    torch.manual_seed(0)
    out = sample_neighbors(colptr, row, torch.arange(T), [k])
    off = out.edge - colptr[out.node[out.col]]
    assert torch.equal(torch.bincount(out.col, minlength=T), torch.full((T,), k))
    freq = torch.bincount(off, minlength=d).double() / T
    p = k / d
    sigma = math.sqrt(p * (1 - p) / T)
    assert (freq - p).abs().max() < 5 * sigma, (freq, p)


def test_sample_neighbors_all_and_errors():
    ei = torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]])
    colptr, row = _csc(ei, 4)
    out = sample_neighbors(colptr, row, torch.tensor([0]), [-1])
    assert sorted(out.node[out.row].tolist()) == [1, 2, 3]
    with pytest.raises(ValueError, match="duplicate"):
        sample_neighbors(colptr, row, torch.tensor([0, 0]), [2])
    with pytest.raises(ValueError, match="outside"):
        sample_neighbors(colptr, row, torch.tensor([4]), [2])


def test_neighbor_loader_uses_torch_sampler_without_warning(recwarn):
    from torch_geometric.data import Data
    n = 50
    ei = torch.randint(0, n, (2, 400), generator=torch.Generator().manual_seed(0))
    ei = ei[:, ei[0] != ei[1]]
    data = Data(x=torch.randn(n, 4), edge_index=ei, y=torch.arange(n), num_nodes=n)
    s = TorchNeighborSampler(data, [3, 2])
    import torch_geometric.typing as t
    if not (t.WITH_PYG_LIB or t.WITH_TORCH_SPARSE):
        assert s.backend == "torch"
        assert not [w for w in recwarn if "pyg-lib" in str(w.message)]
    seeds = torch.tensor([5, 7, 9, 11, 13])
    batches = list(make_loader(data, s, seeds, 2))
    assert [b.batch_size for b in batches] == [2, 2, 1]
    assert torch.equal(torch.cat([b.y[:b.batch_size] for b in batches]), seeds)
    for b in batches:  # the subgraph's edges are edges of the graph, features follow n_id
        assert torch.equal(b.x, data.x[b.n_id])
        g = b.n_id[b.edge_index]
        assert set((g[0] * n + g[1]).tolist()) <= set((ei[0] * n + ei[1]).tolist())


def test_seed_shard_disjoint_equal_and_epoch_dependent():
    idx = torch.arange(100, 203)  # 103 seeds over 2 ranks: 51 each, 1 dropped
    a, b = (seed_shard(idx, 7, 3, r, 2) for r in (0, 1))
    assert a.numel() == b.numel() == 51
    assert not set(a.tolist()) & set(b.tolist())
    assert set(a.tolist()) | set(b.tolist()) <= set(idx.tolist())
    assert torch.equal(seed_shard(idx, 7, 3, 0, 2), a)        # deterministic
    assert not torch.equal(seed_shard(idx, 7, 4, 0, 2), a)    # reshuffled per epoch
    assert torch.equal(seed_shard(idx, 7, 3, 0, 1).sort().values, idx)
    with pytest.raises(ValueError, match="rank"):
        seed_shard(idx, 7, 3, 2, 2)


def test_expected_subgraph_size():
    assert expected_subgraph_size(10, [15, 10, 5], 10 ** 9, 10 ** 9) == {
        "nodes": 10 * (1 + 15 + 150 + 750), "edges": 10 * (15 + 150 + 750)}
    assert expected_subgraph_size(10, [15, 10], 100, 1000) == {"nodes": 100, "edges": 1000}
    assert expected_subgraph_size(10, [-1], 100, 1000) == {"nodes": 100, "edges": 1000}


# ---------------------------------------------------------------------------- config
@pytest.mark.parametrize("over,match", [
    (["data.num_neighbors=[4]"], "one fan-out per attention layer"),
    (["data.num_neighbors=[4, 0]"], "> 0 or -1"),
    (["data.num_neighbors=[4, x]"], r"num_neighbors\[1\]: expected int"),
    (["data.num_neighbors=4"], "expected list of int"),
    (["data.name=PATTERN"], "many small graphs"),
    (["data.loader=sampled"], "choose one of: full, neighbor"),
])
def test_config_errors(over, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, TINY_SAMPLED + over)


def test_config_yaml_list_and_override():
    cfg = load_config(str(CONFIGS / "cora_gat_sampled_quick.yaml"))
    assert cfg.data.loader == "neighbor" and cfg.data.num_neighbors == [10, 10]
    cfg = load_config(str(CONFIGS / "powerlaw_gat_sampled.yaml"), ["data.num_neighbors=[5,5,5]"])
    assert cfg.data.num_neighbors == [5, 5, 5] and cfg.data.num_nodes >= 2_000_000
    assert cfg.model.heads == 4 and cfg.model.hidden == 256 and cfg.model.layers == 3


# ---------------------------------------------------------------------------- trainer
@pytest.mark.skipif(not fused_available(), reason="pyg_dfgnn.nn not importable")
def test_sampled_training_fused_layers_seed_loss_and_resume(tmp_path, monkeypatch):
    """The fused layers run on every sampled subgraph (no fallback), the loss sees
    only the seed nodes, and resuming continues exactly."""
    from pyg_dfgnn.nn import _fused
    from pyg_dfgnn.nn import gat_conv
    from pyg_dfgnn.train import trainer
    from pyg_dfgnn.train.trainer import train

    calls = {"fused": 0, "fallback": 0, "loss_rows": []}
    real_attn, real_loss = gat_conv.gat_attention, trainer._Run._loss

    def attn(*a, **k):
        calls["fused"] += 1
        return real_attn(*a, **k)

    def fallback(self, reason, like):
        calls["fallback"] += 1
        raise AssertionError(f"fell back to PyG: {reason}")

    def loss(self, out, y):
        calls["loss_rows"].append(out.size(0))
        return real_loss(self, out, y)
    monkeypatch.setattr(gat_conv, "gat_attention", attn)
    monkeypatch.setattr(_fused.FusedAttentionMixin, "_fused_fallback", fallback)
    monkeypatch.setattr(trainer._Run, "_loss", loss)

    base = TINY_SAMPLED + [f"data.root={tmp_path / 'data'}", "backend=fused"]
    r2 = train(load_config(None, base + ["epochs=2", f"out_dir={tmp_path / 'a'}"]))
    assert calls["fused"] > 0 and calls["fallback"] == 0
    n_train = int(0.6 * 300)
    # epoch 1's training batches: ceil(180 / 32) = 6 batches of <= 32 seed rows
    assert calls["loss_rows"][:6] == [32] * 5 + [n_train - 5 * 32]
    assert r2["status"] == "completed" and len(r2["history"]) == 2
    assert all(0 <= h["val_metric"] <= 100 for h in r2["history"])

    train(load_config(None, base + ["epochs=1", f"out_dir={tmp_path / 'b'}"]))
    r = train(load_config(None, base + ["epochs=2", f"out_dir={tmp_path / 'b'}",
                                        "resume=true"]))
    a = torch.load(tmp_path / "a" / "checkpoint_last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "checkpoint_last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert r["history"][-1]["train_loss"] == r2["history"][-1]["train_loss"]


def test_sampled_training_pyg_backend_cli(tmp_path):
    from pyg_dfgnn.train.cli import main
    out = tmp_path / "run"
    rc = main([str(CONFIGS / "cora_gat_sampled_quick.yaml")] + TINY_SAMPLED
              + ["backend=pyg", "epochs=1", f"out_dir={out}", "model.readout=mlp"])
    assert rc == 0
    with open(out / "results.json") as f:
        r = json.load(f)
    assert r["config"]["data"]["loader"] == "neighbor" and r["metrics"]["test_metric"] is not None
    with open(out / "train.log") as f:
        log = f.read()
    assert "sampling: NeighborLoader, num_neighbors=[4, 3]" in log
    assert "memory estimate (backend=pyg" in log


def test_ddp_two_ranks_sampled(tmp_path):
    """torchrun, 2 gloo ranks: each samples its shard (90 of the 180 training seeds),
    rank 0 logs and writes the results and checkpoints."""
    out = tmp_path / "ddp"
    p = torchrun_train([CONFIGS / "cora_gat_sampled_quick.yaml"] + TINY_SAMPLED
                       + ["backend=pyg", f"data.root={tmp_path / 'data'}", f"out_dir={out}",
                          "epochs=2"], timeout=180)
    assert p.stdout.count("dfgnn train: cora_gat_sampled_quick") == 1  # rank 0 logs
    assert "x2 ranks (DDP, gloo)" in p.stdout
    assert "train seeds 90 per rank x 2" in p.stdout
    with open(out / "results.json") as f:
        r = json.load(f)
    assert r["environment"]["world_size"] == 2 and len(r["history"]) == 2
    assert 0 <= r["metrics"]["test_metric"] <= 100
    ckpt = torch.load(out / "checkpoint_last.pt", weights_only=True)
    assert ckpt["epoch"] == 2 and ckpt["config"]["data"]["loader"] == "neighbor"


@pytest.mark.skipif(not fused_available(), reason="pyg_dfgnn.nn is not importable")
def test_sampled_training_honours_precision(tmp_path, fused_dtypes):
    """Sampled training goes through the trainer's optimiser step: precision=bf16
    runs the fused op in bf16 in training and evaluation (it ran fp32 before)."""
    from pyg_dfgnn.train.cli import main
    seen = fused_dtypes
    out = tmp_path / "run"
    assert main([str(CONFIGS / "cora_gat_sampled_quick.yaml")] + TINY_SAMPLED
                + ["backend=fused", "epochs=1", "precision=bf16", f"out_dir={out}",
                   f"data.root={tmp_path / 'data'}", "checkpoint.enabled=false"]) == 0
    with open(out / "results.json") as f:
        r = json.load(f)
    assert r["training"]["precision"] == "bf16"
    assert seen and set(seen) == {torch.bfloat16}
    assert math.isfinite(r["metrics"]["final_train_loss"])
