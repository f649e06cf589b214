"""The peak-memory estimate (pyg_dfgnn/train/memory.py), --dry-run and the refusal path."""
import pytest
import torch

from pyg_dfgnn.train import memory
from pyg_dfgnn.train.config import load_config
from pyg_dfgnn.train.memory import estimate_memory

from .conftest import CONFIGS, fused_available, saved_bytes

MODELS = [["model.name=gat", "model.readout=conv"], ["model.name=gat"], ["model.name=gt"],
          ["model.name=agnn", "model.hidden=32"]]


@pytest.mark.skipif(not fused_available(), reason="pyg_dfgnn.nn not importable")
@pytest.mark.parametrize("backend", ["fused", "pyg"])
@pytest.mark.parametrize("model_args", MODELS, ids=lambda a: "-".join(a))
def test_estimate_matches_saved_activations(backend, model_args):
    """The formula's saved part (activations + the fused CSR) against what autograd
    really keeps; its constants count whole tensors, so they agree within 1.5x
    either way on a graph where the E-terms dominate pyg (E/N = 20)."""
    from pyg_dfgnn.data.synthetic import uniform_graph
    from pyg_dfgnn.train.models import build_model, count_parameters
    N, E, F = 1000, 20000, 16
    ei = uniform_graph(N, E, seed=0)
    x = torch.randn(N, F, generator=torch.Generator().manual_seed(0))
    cfg = load_config(None, ["data.name=Cora", "model.hidden=64", "model.heads=4",
                             "model.layers=2"] + model_args)
    torch.manual_seed(0)
    m = build_model(cfg.model, F, 5, False, backend)
    measured = saved_bytes(m, x, ei)
    est = estimate_memory(cfg.model, backend, N, E, F, 5, count_parameters(m))
    saved = est.parts["activations"] + est.parts.get("graph (CSR + transpose)", 0.0)
    assert 1 / 1.5 < measured / saved < 1.5, (measured, est.parts)


def test_estimate_scaling():
    """fused: O(N D) + O(E) graph; pyg: O(E H F) messages."""
    cfg = load_config(None, ["data.name=Cora", "model.name=gat", "model.readout=conv",
                             "model.hidden=256", "model.heads=4", "model.layers=3"])
    f0, p0 = (estimate_memory(cfg.model, b, 10 ** 6, 0, 64, 8, 0) for b in ("fused", "pyg"))
    f1, p1 = (estimate_memory(cfg.model, b, 10 ** 6, 10 ** 7, 64, 8, 0) for b in ("fused", "pyg"))
    f2, p2 = (estimate_memory(cfg.model, b, 10 ** 6, 10 ** 8, 64, 8, 0) for b in ("fused", "pyg"))
    # pyg's activations exceed fused's by a term linear in E (the messages) on
    # top of what they differ by without edges (self-loop messages, and the
    # fused GAT's [N, D] output that its epilogue bias saves);
    # fused activations do not depend on E, only its index arrays do
    extra0, extra1, extra2 = (p.parts["activations"] - f.parts["activations"]
                              for f, p in ((f0, p0), (f1, p1), (f2, p2)))
    assert (extra2 - extra0) / (extra1 - extra0) == pytest.approx(10.0)
    assert f2.parts["activations"] == f1.parts["activations"]
    assert f2.parts["graph (CSR + transpose)"] / f1.parts["graph (CSR + transpose)"] > 8
    assert p2.total > 10 * f2.total
    # the exact count of one term: fused CSR + transpose, int32, E' = E + N
    assert f1.parts["graph (CSR + transpose)"] == (2 * (10 ** 6 + 1) + 4 * 11 * 10 ** 6) * 4
    with pytest.raises(ValueError, match="backend"):
        estimate_memory(cfg.model, "cuda", 1, 1, 1, 2, 0)


def test_sampled_estimate_uses_subgraph_bound():
    cfg = load_config(str(CONFIGS / "powerlaw_gat_sampled.yaml"))
    est = memory.estimate_for_config(cfg, 64, 8, 1000, cfg.data.num_nodes, cfg.data.num_edges)
    assert est.num_nodes == 1024 * (1 + 15 + 150 + 750)
    assert est.num_edges == 1024 * (15 + 150 + 750)


def _tiny(tmp_path, *extra):
    return ([str(CONFIGS / "cora_gat_sampled_quick.yaml"), "data.name=synthetic_uniform",
             "data.num_nodes=200", "data.num_edges=1000", "data.num_features=8",
             "data.num_classes=3", "device=cpu", "epochs=1", "backend=pyg",
             f"out_dir={tmp_path / 'run'}"] + list(extra))


def test_dry_run_cli(tmp_path, capsys, monkeypatch):
    from pyg_dfgnn.train.cli import main
    assert main(_tiny(tmp_path, "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "dry run: cora_gat_sampled_quick: graph 200 nodes / 1,000 edges" in out
    assert "memory estimate (backend=pyg" in out and "peak ~" in out
    assert not (tmp_path / "run" / "results.json").exists()   # nothing trained
    monkeypatch.setattr(memory, "device_free_bytes", lambda dev: (1000, "test: 1000 B free"))
    assert main(_tiny(tmp_path, "--dry-run")) == 2
    err = capsys.readouterr().err
    assert "memory_check: the run would not fit in memory: estimated peak" in err
    assert "> 1000.0 B" in err or "free on cpu" in err


def test_refusal_at_start_and_override(tmp_path, capsys, monkeypatch):
    from pyg_dfgnn.train.cli import main
    monkeypatch.setattr(memory, "device_free_bytes", lambda dev: (1000, "test: 1000 B free"))
    assert main(_tiny(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "config error: memory_check: the run would not fit" in err
    assert not (tmp_path / "run" / "checkpoint_last.pt").exists()  # refused before epoch 1
    assert main(_tiny(tmp_path, "memory_check=false", "--overwrite")) == 0
    out = capsys.readouterr().out
    assert "warning (memory_check=false): the run would not fit" in out


def test_estimate_counts_the_graph_held_for_device_sampling():
    """data.sample_on=cuda keeps the whole graph on the device: the estimate
    adds exactly what the device sampler holds (DeviceNeighborSampler.graph_bytes)."""
    from pyg_dfgnn.data import synthetic
    from pyg_dfgnn.train.sampling import DeviceNeighborSampler
    from torch_geometric.data import Data
    N, E, F_in = 300, 2000, 16
    ei = synthetic.uniform_graph(N, E, 0)
    masks = {k: torch.zeros(N, dtype=torch.bool) for k in ("train_mask", "val_mask", "test_mask")}
    data = Data(x=torch.randn(N, F_in), y=torch.zeros(N, dtype=torch.long), edge_index=ei,
                **masks)
    assert memory.device_sampling_bytes(N, ei.size(1), F_in) == \
        DeviceNeighborSampler.graph_bytes(data)
    base = load_config(str(CONFIGS / "powerlaw_gat_sampled.yaml"))
    on = load_config(str(CONFIGS / "powerlaw_gat_sampled.yaml"), ["data.sample_on=cuda"])
    off = load_config(str(CONFIGS / "powerlaw_gat_sampled.yaml"), ["data.sample_on=cpu"])
    n, e = base.data.num_nodes, base.data.num_edges
    cuda = torch.device("cuda")
    held = memory.estimate_for_config(on, 64, 8, 1000, n, e, device=cuda)
    assert held.parts["graph held for device sampling"] == memory.device_sampling_bytes(n, e, 64)
    for cfg, dev in ((off, cuda), (on, torch.device("cpu")), (on, None)):
        est = memory.estimate_for_config(cfg, 64, 8, 1000, n, e, device=dev)
        assert "graph held for device sampling" not in est.parts
        assert est.total < held.total
