"""``dfgnn train`` fast paths on CPU: prepared graphs (data.prepare_graphs),
mixed precision (precision: bf16 | fp16) and torch.compile (compile:)."""
import json
import math

import pytest
import torch
import torch._dynamo

from pyg_dfgnn import graph as G
from pyg_dfgnn.train.cli import main
from pyg_dfgnn.train.config import load_config

from .conftest import CONFIGS, fused_available

pytestmark = pytest.mark.skipif(not fused_available(), reason="pyg_dfgnn.nn not importable")


def _results(path):
    with open(path / "results.json") as f:
        return json.load(f)


def _losses(r):
    return [(h["train_loss"], h["val_loss"]) for h in r["history"]]


@pytest.mark.parametrize("model", ["gat", "gt"])
def test_prepared_graphs_hit_the_cache_and_change_nothing(tmp_path, tiny_args, model):
    """Every layer call of training and evaluation hits a prepared graph (no
    conversion at all), and the run is bitwise the same as without preparation."""
    extra = ["epochs=1", f"model.name={model}", "backend=fused", "data.batcher=pyg"]
    G.clear_cache()
    assert main(tiny_args(*extra, "data.prepare_graphs=false", out="plain")) == 0
    assert G.cache_info()["misses"] > 0          # the layers converted every batch
    G.clear_cache()
    assert main(tiny_args(*extra, "data.num_workers=2", "data.prepare_graphs=true",
                          out="prep")) == 0
    info = G.cache_info()
    assert info["misses"] == 0 and info["hits"] > 0 and info["stale"] == 0, info
    plain, prep = _results(tmp_path / "plain"), _results(tmp_path / "prep")
    # GAT asks for its looped view, the Graph Transformer for the graph as given
    assert prep["training"]["prepared_graphs"] == [model == "gat"]
    assert plain["training"]["prepared_graphs"] is None
    assert _losses(prep) == _losses(plain)
    assert prep["metrics"]["test_metric"] == plain["metrics"]["test_metric"]


@pytest.mark.parametrize("model", ["gat", "gt"])
def test_graph_batcher_converts_nothing_and_changes_nothing(tmp_path, tiny_args, model):
    """data.batcher=store: no layer call of training or evaluation converts a
    graph (the views come with the batch), and the fused run is bitwise the
    same as with PyG's DataLoader (each graph's edges are stored in target
    order, the stable order the conversion gives them anyway, so the kernels
    see the same CSR)."""
    extra = ["epochs=2", f"model.name={model}", "backend=fused"]
    G.clear_cache()
    assert main(tiny_args(*extra, "data.batcher=pyg", out="pyg")) == 0
    assert G.cache_info()["misses"] > 0
    G.clear_cache()
    assert main(tiny_args(*extra, "data.batcher=store", out="store")) == 0
    info = G.cache_info()
    assert info["misses"] == 0 and info["hits"] > 0 and info["stale"] == 0, info
    ref, ours = _results(tmp_path / "pyg"), _results(tmp_path / "store")
    assert ours["training"]["batcher"] == "store" and ref["training"]["batcher"] == "pyg"
    assert _losses(ours) == _losses(ref)
    assert ours["metrics"]["test_metric"] == ref["metrics"]["test_metric"]


def test_graph_batcher_refusal(tmp_path, tiny_args, capsys, monkeypatch):
    """Graphs the store cannot batch: auto falls back to PyG's DataLoader and
    says why; batcher=store is a config error (exit 2)."""
    import pyg_dfgnn.data.batching as batching

    def refuse(self, graphs):
        raise ValueError("GraphBatcher: attribute 'z' is a str, not a tensor")
    monkeypatch.setattr(batching.GraphBatcher, "_classify", refuse)
    assert main(tiny_args("epochs=1", "backend=fused", out="auto")) == 0
    assert "batches: PyG's DataLoader (GraphBatcher: attribute 'z'" in capsys.readouterr().out
    assert _results(tmp_path / "auto")["training"]["batcher"] == "pyg"
    assert main(tiny_args("epochs=1", "data.batcher=store", out="store")) == 2
    assert "data.batcher=store: GraphBatcher: attribute 'z'" in capsys.readouterr().err


def test_no_preparation_without_workers(tmp_path, tiny_args, capsys):
    """With data.num_workers=0 the CPU conversion would sit on the step's critical
    path: the layers convert on the device as before, and the log says so."""
    G.clear_cache()
    assert main(tiny_args("epochs=1", "backend=fused", "data.num_workers=0",
                          "data.prepare_graphs=true", "data.batcher=pyg")) == 0
    assert "graph preparation: off with data.num_workers=0" in capsys.readouterr().out
    assert _results(tmp_path / "run")["training"]["prepared_graphs"] is None
    assert G.cache_info()["misses"] > 0


def test_bf16_autocast_runs_the_fused_op_in_bf16(tmp_path, tiny_args, fused_dtypes):
    seen = fused_dtypes
    assert main(tiny_args("epochs=1", "precision=bf16", "backend=fused")) == 0
    r = _results(tmp_path / "run")
    assert r["training"]["precision"] == "bf16" and r["training"]["autocast_dtype"] == "bfloat16"
    assert r["training"]["grad_scaler"] is False
    assert seen and set(seen) == {torch.bfloat16}
    assert math.isfinite(r["metrics"]["final_train_loss"])


def test_fp16_uses_a_grad_scaler_saved_in_the_checkpoint(tmp_path, tiny_args):
    assert main(tiny_args("epochs=1", "precision=fp16", "backend=fused")) == 0
    r = _results(tmp_path / "run")
    assert r["training"]["grad_scaler"] is True and r["status"] == "completed"
    ckpt = torch.load(tmp_path / "run" / "checkpoint_last.pt", weights_only=True)
    assert ckpt["scaler"] is not None and ckpt["scaler"]["scale"] > 0
    # precision changes the maths: a resume may not change it
    rc = main(tiny_args("epochs=2", "precision=fp32", "resume=true", "backend=fused"))
    assert rc == 2


def test_compiled_tiny_model_trains_one_epoch(tmp_path, tiny_args):
    torch._dynamo.reset()
    # backend=eager: Dynamo's capture (where graph breaks happen) without code
    # generation, which takes minutes on a small CPU; the GPU run uses inductor
    assert main(tiny_args("epochs=1", "backend=fused", "compile=true",
                          "compile.backend=eager")) == 0
    r = _results(tmp_path / "run")
    assert r["training"]["compile"] == {"enabled": True, "dynamic": True, "mode": "default",
                                        "backend": "eager", "fullgraph": False}
    assert r["status"] == "completed" and r["metrics"]["final_train_loss"] > 0
    ckpt = torch.load(tmp_path / "run" / "checkpoint_last.pt", weights_only=True)
    assert not any(k.startswith("_orig_mod") for k in ckpt["model"])  # plain module's keys
    # compile does not change the maths: a resume may switch it off
    assert main(tiny_args("epochs=2", "resume=true", "backend=fused")) == 0


def test_no_graph_break_in_a_layer_on_a_prepared_graph():
    """torch.compile traces our layers on a prepared batch without a graph
    break: the layers hand the op the edge_index (a GraphRef) and the op's
    implementation looks the prepared CSR up in the graph cache when it runs
    (a hit: no conversion, no sync).  (Until session 5 the cached lookup was a
    ``torch.compiler.disable``d call in the layer: GATConv 1 break,
    TransformerConv 2.)"""
    from torch_geometric.data import Batch, Data

    from pyg_dfgnn.data import PrepareGraphs, attach_prepared
    from pyg_dfgnn.nn import GATConv, TransformerConv
    torch.manual_seed(0)
    batch = Batch.from_data_list([Data(x=torch.randn(10, 8),
                                       edge_index=torch.randint(0, 10, (2, 30)))
                                  for _ in range(3)])
    batch = attach_prepared(PrepareGraphs((False, True))(batch))
    for conv in (GATConv(8, 4, heads=2), TransformerConv(8, 4, heads=2)):
        G.clear_cache()
        attach_prepared(batch)
        torch._dynamo.reset()
        ex = torch._dynamo.explain(conv)(batch.x, batch.edge_index)
        assert ex.graph_break_count == 0, (type(conv).__name__, ex.break_reasons)
        assert G.cache_info()["misses"] == 0     # the prepared graph was used
        assert G.cache_info()["hits"] >= 1


@pytest.mark.parametrize("override, fragment", [
    ("precision=fp64", "precision: 'fp64' is not allowed; choose one of: fp32, bf16, fp16"),
    ("compile.mode=fast", "compile.mode: 'fast' is not allowed"),
    ("compile.backend=nope", "compile.backend: 'nope' is not a torch.compile backend"),
    ("compile=maybe", "compile.enabled: expected bool"),
    ("compile.speed=1", "unknown key 'compile.speed'"),
    ("data.prepare_graphs=3", "data.prepare_graphs: expected bool"),
])
def test_config_errors_exit_2_naming_the_key(tmp_path, capsys, override, fragment):
    rc = main([str(CONFIGS / "pattern_gat_quick.yaml"), override, f"out_dir={tmp_path / 'o'}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("dfgnn train: config error: "), err
    assert fragment in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_compile_key_forms():
    q = str(CONFIGS / "pattern_gat_quick.yaml")
    assert load_config(q).compile.enabled is False
    assert load_config(q, ["compile=true"]).compile.enabled is True
    c = load_config(q, ["compile.mode=max-autotune"]).compile   # a sub-key implies enabled
    assert c.enabled and c.mode == "max-autotune" and c.dynamic is True
    c = load_config(q, ["compile=true", "compile.dynamic=null", "compile=false"]).compile
    assert not c.enabled and c.dynamic is None


def test_optimizer_implementation():
    """optimizer.implementation: auto = torch's fused Adam on CUDA only (no
    per-parameter host work per step), fused / foreach as asked."""
    from pyg_dfgnn.train.config import load_config
    from pyg_dfgnn.train.trainer import _make_optimizer
    cfg = load_config(str(CONFIGS / "pattern_gat_quick.yaml"), [])
    p = [torch.nn.Parameter(torch.randn(3))]
    assert not _make_optimizer(cfg, p, torch.device("cpu")).defaults["fused"]
    assert _make_optimizer(cfg, p, torch.device("cuda")).defaults["fused"]
    for impl, want in (("fused", True), ("foreach", False)):
        cfg.optimizer.implementation = impl
        opt = _make_optimizer(cfg, p, torch.device("cpu"))
        assert bool(opt.defaults["fused"]) is want
        p[0].grad = torch.ones(3)
        opt.step()  # runs (the fused CPU kernel where asked)
