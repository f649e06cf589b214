"""End-to-end ``dfgnn train`` runs on CPU: results.json, checkpoints, resume, errors."""
import json
import subprocess
import sys

import pytest
import torch

from pyg_dfgnn.train.cli import main

from .conftest import CONFIGS, REPO, fused_available


def _results(path):
    with open(path / "results.json") as f:
        return json.load(f)


def test_quick_config_tiny_run_writes_results(tmp_path, tiny_args, capsys):
    rc = main(tiny_args("epochs=1", "backend=pyg"))
    assert rc == 0
    out = capsys.readouterr().out
    assert "source = built-in SBM generator" in out          # says which source is used
    assert "epoch    1/1" in out and "peak mem" in out
    run = tmp_path / "run"
    for f in ("results.json", "checkpoint_last.pt", "checkpoint_best.pt", "config.yaml",
              "train.log"):
        assert (run / f).is_file(), f
    r = _results(run)
    assert r["config"]["epochs"] == 1 and r["config"]["data"]["num_train"] == 16
    assert r["dataset"]["name"] == "PATTERN" and "generator" in r["dataset"]["source"]
    m = r["metrics"]
    assert m["metric"] == "mean_class_acc" and m["best_epoch"] == 1
    assert 0.0 <= m["test_metric"] <= 100.0 and m["final_train_loss"] > 0
    assert r["timings"]["epochs_run"] == 1 and r["timings"]["train_s"] > 0
    env = r["environment"]
    assert env["backend"] == "pyg" and env["torch"] == torch.__version__
    assert "torch_geometric" in env and "gpu" in env
    assert len(r["history"]) == 1 and r["stop_reason"] == "max epochs"


class _FakeTTY:
    def __init__(self, tty):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass


@pytest.mark.parametrize("tty, progress, shown", [(True, "true", True), (False, "true", False),
                                                  (True, "false", False)])
def test_progress_bar_only_on_a_tty(tmp_path, tiny_args, monkeypatch, tty, progress, shown):
    fake = _FakeTTY(tty)
    monkeypatch.setattr(sys, "stderr", fake)
    args = [a for a in tiny_args("epochs=1", "backend=pyg") if not a.startswith("log.progress")]
    assert main(args + [f"log.progress={progress}"]) == 0
    assert ("epoch 1/1" in fake.text) is shown, fake.text


def test_console_script_and_module_entry_point(tmp_path, tiny_args):
    args = tiny_args("epochs=1", "backend=pyg", "data.num_train=8", out="m")
    proc = subprocess.run([sys.executable, "-m", "pyg_dfgnn", "train"] + args,
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "m" / "results.json").is_file()
    bad = subprocess.run([sys.executable, "-m", "pyg_dfgnn", "train",
                          str(CONFIGS / "pattern_gat_quick.yaml"), "model.heads=x"],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert bad.returncode == 2 and "model.heads" in bad.stderr


def test_resume_continues_exactly(tmp_path, tiny_args):
    # two epochs in one go ...
    assert main(tiny_args("epochs=2", "backend=pyg", out="full")) == 0
    # ... equal one epoch + resume=true for the second
    assert main(tiny_args("epochs=1", "backend=pyg", out="split")) == 0
    assert main(tiny_args("epochs=2", "backend=pyg", "resume=true", out="split")) == 0
    full, split = _results(tmp_path / "full"), _results(tmp_path / "split")
    assert split["resumed_from"].endswith("checkpoint_last.pt")
    assert [h["epoch"] for h in split["history"]] == [1, 2]
    for a, b in zip(full["history"], split["history"]):
        for k in ("train_loss", "val_loss", "val_metric"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k
    assert full["metrics"]["test_metric"] == pytest.approx(split["metrics"]["test_metric"])
    # resume from an explicit checkpoint path into another directory
    ckpt = tmp_path / "split" / "checkpoint_last.pt"
    assert main(tiny_args("epochs=3", "backend=pyg", f"resume={ckpt}", out="third")) == 0
    third = _results(tmp_path / "third")
    assert [h["epoch"] for h in third["history"]] == [1, 2, 3]


def test_resume_errors_before_training(tmp_path, tiny_args, capsys):
    rc = main(tiny_args("epochs=1", "backend=pyg", f"resume={tmp_path / 'none.pt'}"))
    assert rc == 1
    assert "checkpoint not found" in capsys.readouterr().err
    assert not (tmp_path / "run" / "results.json").exists()


def test_missing_planetoid_files_is_a_clear_error(tmp_path, capsys):
    rc = main([str(CONFIGS / "cora_gat.yaml"), f"data.root={tmp_path}",
               f"out_dir={tmp_path / 'out'}", "backend=pyg"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "raw files not found" in err and "data.root" in err


def test_early_stopping_and_plateau_stop(tmp_path, tiny_args):
    assert main(tiny_args("epochs=6", "backend=pyg", "early_stopping.patience=1",
                          "early_stopping.monitor=val_metric", "optimizer.lr=1e-6",
                          "scheduler.name=none",
                          out="es")) == 0
    r = _results(tmp_path / "es")
    assert r["stop_reason"].startswith("early stopping") and len(r["history"]) < 6
    # benchmarking-gnns rule: stop once the plateau scheduler's lr is below min_lr
    assert main(tiny_args("epochs=6", "backend=pyg", "scheduler.name=plateau",
                          "optimizer.lr=1e-3", "scheduler.min_lr=2e-3", out="lr")) == 0
    r = _results(tmp_path / "lr")
    assert "min_lr" in r["stop_reason"] and len(r["history"]) < 6


@pytest.mark.parametrize("model", ["gt", "agnn"])
def test_other_models_run(tmp_path, tiny_args, model):
    extra = ["model.name=" + model, "epochs=1", "backend=pyg"]
    if model == "gt":
        extra += ["model.lap_pe=true", "model.lap_pe_dim=3"]
    else:
        extra += ["data.name=CLUSTER"]
    assert main(tiny_args(*extra, out=model)) == 0
    r = _results(tmp_path / model)
    assert r["model"]["name"] == model and r["model"]["parameters"] > 0


@pytest.mark.parametrize("name", ["synthetic_uniform", "synthetic_powerlaw"])
def test_synthetic_scale_config_runs_small(tmp_path, name):
    pytest.importorskip("pyg_dfgnn.data.synthetic")
    rc = main([str(CONFIGS / "powerlaw_gat.yaml"), f"data.name={name}", "data.num_nodes=500",
               "data.num_edges=4000", "data.max_degree=100", "data.num_features=8",
               "epochs=2", "backend=pyg", f"out_dir={tmp_path / name}", "log.progress=false"])
    assert rc == 0
    r = _results(tmp_path / name)
    assert r["dataset"]["stats"] == {"num_nodes": 500, "num_edges": 4000}
    assert "pyg_dfgnn.data.synthetic" in r["dataset"]["source"]
    assert not (tmp_path / name / "checkpoint_last.pt").exists()   # checkpoint.enabled=false


def test_cora_gat_reaches_sane_accuracy(tmp_path, planetoid_root):
    backend = "fused" if fused_available() else "pyg"
    rc = main([str(CONFIGS / "cora_gat.yaml"), f"data.root={planetoid_root}",
               f"out_dir={tmp_path / 'cora'}", "epochs=30", f"backend={backend}",
               "checkpoint.enabled=false", "log.progress=false"])
    assert rc == 0
    r = _results(tmp_path / "cora")
    assert r["dataset"]["source"].startswith("PyG Planetoid 'Cora'")
    assert r["metrics"]["metric"] == "acc"
    assert r["metrics"]["test_metric"] > 70.0, r["metrics"]
    assert r["metrics"]["best_val_metric"] > 70.0


@pytest.mark.skipif(not fused_available(), reason="pyg_dfgnn.nn is not importable")
@pytest.mark.parametrize("model", ["gat", "gt", "agnn"])
def test_fused_and_pyg_backends_give_the_same_loss(model):
    from pyg_dfgnn.data import pattern_like_batch
    from pyg_dfgnn.train.config import load_config
    from pyg_dfgnn.train.metrics import weighted_cross_entropy
    from pyg_dfgnn.train.models import build_model

    cfg = load_config(str(CONFIGS / "pattern_gat_quick.yaml"),
                      [f"model.name={model}", "model.hidden=16", "model.heads=2"])
    batch = pattern_like_batch(4, seed=1)

    def run(backend, dtype):
        torch.manual_seed(0)
        net = build_model(cfg.model, 3, 2, True, backend).to(dtype)
        net.train()
        loss = weighted_cross_entropy(net(batch.x, batch.edge_index), batch.y, 2)
        loss.backward()
        return loss.item(), {n: p.grad for n, p in net.named_parameters() if p.grad is not None}

    # float32 (what training uses): same loss
    l_pyg, _ = run("pyg", torch.float32)
    l_fused, _ = run("fused", torch.float32)
    assert l_fused == pytest.approx(l_pyg, rel=1e-5, abs=1e-6)
    # float64: same loss and same gradients for every parameter (in float32 BatchNorm's
    # backward can amplify rounding differences of the attention sums)
    l_pyg, g_pyg = run("pyg", torch.float64)
    l_fused, g_fused = run("fused", torch.float64)
    assert l_fused == pytest.approx(l_pyg, rel=1e-10)
    assert g_fused.keys() == g_pyg.keys()
    for name, g in g_pyg.items():
        torch.testing.assert_close(g_fused[name], g, rtol=1e-7, atol=1e-9)


@pytest.mark.skipif(not fused_available(), reason="pyg_dfgnn.nn is not importable")
def test_fused_and_pyg_training_runs_match(tmp_path, tiny_args):
    for backend in ("pyg", "fused"):
        assert main(tiny_args("epochs=1", f"backend={backend}", out=backend)) == 0
    a, b = _results(tmp_path / "pyg"), _results(tmp_path / "fused")
    assert a["environment"]["backend"] == "pyg" and b["environment"]["backend"] == "fused"
    for k in ("train_loss", "val_loss"):
        assert a["history"][0][k] == pytest.approx(b["history"][0][k], rel=1e-4), k
