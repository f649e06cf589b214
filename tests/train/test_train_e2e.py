"""End-to-end ``dfgnn train`` runs on CPU: results.json, checkpoints, resume, errors."""
import functools
import json
import os
import subprocess
import sys

import pytest
import torch

from pyg_dfgnn.train.cli import main

from .conftest import CONFIGS, REPO, TINY, fused_available


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


# ----------------------------------------------------------------------------
# fused vs pyg: the same model computed in a different summation order
# ----------------------------------------------------------------------------
# Two correct float32 runs that sum in different orders drift apart over training,
# and how far depends on the CPU (vector width, threads, BLAS).  So the backends are
# compared where the result does not depend on the machine: in float64 with a tight
# tolerance, and in float32 against the float32 error that PyG's own (correct) layers
# make on the same computation, measured here against float64.
U32 = 2.0 ** -24  # float32 unit roundoff: the relative error of storing a value


def _quick_model(model, *extra):
    from pyg_dfgnn.train.config import load_config
    return load_config(str(CONFIGS / "pattern_gat_quick.yaml"), [f"model.name={model}",
                       "model.hidden=16", "model.heads=2", *extra])


def _adam_steps(cfg, backend, dtype, batches, val=None):
    """Train-mode loss of each Adam step (lr of the config) on ``batches``, the
    eval-mode loss on ``val`` after them, and the parameters; fixed initial weights."""
    from pyg_dfgnn.train.metrics import weighted_cross_entropy
    from pyg_dfgnn.train.models import build_model

    torch.manual_seed(0)
    net = build_model(cfg.model, 3, 2, True, backend).to(dtype)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.optimizer.lr)
    losses = []
    for b in batches:
        net.train()
        loss = weighted_cross_entropy(net(b.x, b.edge_index), b.y, 2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    val_loss = None
    if val is not None:
        net.eval()
        with torch.no_grad():
            val_loss = weighted_cross_entropy(net(val.x, val.edge_index), val.y, 2).item()
    return losses, val_loss, {n: p.detach().clone() for n, p in net.named_parameters()}


@functools.lru_cache(maxsize=None)
def _batch(num_graphs, seed):
    from pyg_dfgnn.data import pattern_like_batch
    return pattern_like_batch(num_graphs, seed=seed)


def _rel(a, b):
    return abs(a - b) / abs(b)


@pytest.mark.skipif(not fused_available(), reason="pyg_dfgnn.nn is not importable")
@pytest.mark.parametrize("model", ["gat", "gt", "agnn"])
def test_fused_and_pyg_backends_give_the_same_loss(model):
    from pyg_dfgnn.train.metrics import weighted_cross_entropy
    from pyg_dfgnn.train.models import build_model

    cfg = _quick_model(model)
    batch = _batch(4, 1)

    def run(backend, dtype):
        torch.manual_seed(0)
        net = build_model(cfg.model, 3, 2, True, backend).to(dtype)
        net.train()
        loss = weighted_cross_entropy(net(batch.x, batch.edge_index), batch.y, 2)
        loss.backward()
        return loss.item(), {n: p.grad for n, p in net.named_parameters() if p.grad is not None}

    # float64: same loss and same gradients for every parameter (in float32 BatchNorm's
    # backward can amplify rounding differences of the attention sums)
    l_pyg, g_pyg = run("pyg", torch.float64)
    l_fused, g_fused = run("fused", torch.float64)
    assert l_fused == pytest.approx(l_pyg, rel=1e-10)
    assert g_fused.keys() == g_pyg.keys()
    for name, g in g_pyg.items():
        torch.testing.assert_close(g_fused[name], g, rtol=1e-7, atol=1e-9)
    # float32 (what training uses): the fused loss is as close to the exact (float64)
    # loss as PyG's own float32 loss is, up to a factor 8, and never required closer
    # than the storage error of one float32 (U32)
    exact = l_pyg
    e_pyg = _rel(run("pyg", torch.float32)[0], exact)
    e_fused = _rel(run("fused", torch.float32)[0], exact)
    assert e_fused <= 8 * max(e_pyg, U32), (e_fused, e_pyg)


@pytest.mark.skipif(not fused_available(), reason="pyg_dfgnn.nn is not importable")
@pytest.mark.parametrize("model", ["gat", "gt", "agnn"])
def test_fused_and_pyg_training_steps_match_in_float64(model):
    # Three Adam steps, then the eval-mode loss (BatchNorm running statistics) on
    # held-out graphs, all in float64.  Tolerance: float64 rounding is ~1e-16 per
    # operation; the one amplifying path is Adam scaling a gradient that is zero in
    # exact arithmetic (a conv bias in front of BatchNorm) but rounding noise
    # (~1e-15) by lr/eps = 5e-3/1e-8, i.e. <= 1e-9 of parameter drift per step.
    # 1e-8 leaves a margin of 3x over three steps and is still 1e4x below the effect
    # of any wrong attention weight.
    cfg = _quick_model(model)
    batches = [_batch(4, s) for s in (1, 2, 3)]
    val = _batch(4, 9)
    loss_p, val_p, par_p = _adam_steps(cfg, "pyg", torch.float64, batches, val)
    loss_f, val_f, par_f = _adam_steps(cfg, "fused", torch.float64, batches, val)
    assert loss_f == pytest.approx(loss_p, rel=1e-8)
    assert val_f == pytest.approx(val_p, rel=1e-8)
    assert par_f.keys() == par_p.keys()
    for name, p in par_p.items():
        torch.testing.assert_close(par_f[name], p, rtol=1e-8, atol=1e-8, msg=name)


@pytest.mark.skipif(not fused_available(), reason="pyg_dfgnn.nn is not importable")
def test_fused_and_pyg_training_runs_match(tmp_path, tiny_args):
    # The real `dfgnn train` path in float32: 2 epochs of 2 batches = n = 4 Adam steps.
    epochs, steps = 2, 4
    for backend in ("pyg", "fused"):
        assert main(tiny_args(f"epochs={epochs}", f"backend={backend}", out=backend)) == 0
    a, b = _results(tmp_path / "pyg"), _results(tmp_path / "fused")
    assert a["environment"]["backend"] == "pyg" and b["environment"]["backend"] == "fused"
    assert len(a["history"]) == len(b["history"]) == epochs

    # Tolerance, derived from the float32 error of a single step:
    # e1 = relative float32 error (vs float64, same weights) of PyG's train-mode loss
    #      before and after one Adam step of the same model on graphs like the run's
    #      (floored at U32: a loss cannot be stored more exactly than that);
    # each step adds at most ~e1 to a run's deviation from the exact trajectory, so
    # after n steps each backend is within n*e1 of it, the two within 2*n*e1; a
    # factor 4 covers the variation of e1 between batches.  tol = 8 * n * e1.
    # (Measured on one CPU: e1 ~ 2e-7, differences ~ 1e-7 for tol ~ 6e-6; a wrong
    # attention weight moves these losses by >= 1e-4.)
    # Only train-mode losses (BatchNorm batch statistics) are compared: a conv bias in
    # front of BatchNorm has an exactly zero gradient, Adam turns its rounding noise
    # into steps of up to lr, and that drift reaches the eval-mode val_loss through
    # BatchNorm's running mean -- a property of the CPU, not of the code.  The val loss
    # is compared in float64 (test_fused_and_pyg_training_steps_match_in_float64).
    cfg = _quick_model("gat", *TINY)
    one = [_batch(cfg.batch_size, s) for s in (1, 2)]
    l32 = _adam_steps(cfg, "pyg", torch.float32, one)[0]
    l64 = _adam_steps(cfg, "pyg", torch.float64, one)[0]
    e1 = max(max(_rel(x, y) for x, y in zip(l32, l64)), U32)
    tol = 8 * steps * e1
    for ha, hb in zip(a["history"], b["history"]):
        assert _rel(hb["train_loss"], ha["train_loss"]) <= tol, (ha["epoch"], e1, tol)


# ----------------------------------------------------------------------------
# the command line around a run: existing out_dir, Ctrl-C, option hints
# ----------------------------------------------------------------------------
def test_a_finished_run_is_not_overwritten(tmp_path, tiny_args, capsys):
    args = tiny_args("epochs=1", "backend=pyg", "data.num_train=8")
    assert main(args) == 0
    run = tmp_path / "run"
    before = (run / "results.json").read_text()
    capsys.readouterr()
    assert main(args + ["backend=fused"]) == 2          # e.g. the other backend, same dir
    err = capsys.readouterr().err
    assert "out_dir" in err and "finished run" in err and "--overwrite" in err
    assert "resume=true" in err
    assert (run / "results.json").read_text() == before
    # --overwrite replaces the run: a fresh log, not the old one with the new appended
    assert main(args + ["--overwrite"]) == 0
    assert (run / "train.log").read_text().count("dfgnn train:") == 1


def test_an_unfinished_run_is_not_restarted_by_accident(tmp_path, tiny_args, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint_last.pt").write_bytes(b"x")
    assert main(tiny_args("epochs=1", "backend=pyg")) == 2
    assert "unfinished run" in capsys.readouterr().err
    assert (run / "checkpoint_last.pt").read_bytes() == b"x"


@pytest.mark.parametrize("checkpoint", [False, True])
def test_ctrl_c_suggests_resume_only_with_a_checkpoint(tmp_path, tiny_args, monkeypatch,
                                                        capsys, checkpoint):
    from pyg_dfgnn.train import trainer

    def interrupted(cfg):
        if checkpoint:  # interrupted after the first epoch's checkpoint
            os.makedirs(cfg.resolved_out_dir(), exist_ok=True)
            open(os.path.join(cfg.resolved_out_dir(), "checkpoint_last.pt"), "wb").close()
        raise KeyboardInterrupt
    monkeypatch.setattr(trainer, "train", interrupted)
    assert main(tiny_args("epochs=1", "backend=pyg")) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err
    assert ("resume=true" in err) is checkpoint, err


def test_dashed_option_hints_at_key_value(capsys):
    cfg = str(CONFIGS / "pattern_gat_quick.yaml")
    for argv, hint in (([cfg, "--epochs", "2"], "epochs=2"),
                       ([cfg, "--model.heads=8"], "model.heads=8"),
                       ([cfg, "--out-dir", "x"], "out_dir=x")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "unknown option" in err and hint in err, err
