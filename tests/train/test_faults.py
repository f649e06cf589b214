"""A training run that survives faults: kills between checkpoint writes, damaged
checkpoints, resuming with a changed config, a diverging loss.

The runs use a tiny full-batch synthetic graph (one optimiser step per epoch,
well under a second) so that many runs stay cheap.
"""
import json
import shutil

import pytest
import torch

from pyg_dfgnn.train import trainer as T
from pyg_dfgnn.train.cli import main

from .conftest import CONFIGS

pytest.importorskip("pyg_dfgnn.data.synthetic")

SMALL = [str(CONFIGS / "powerlaw_gat.yaml"), "data.name=synthetic_uniform", "data.num_nodes=300",
         "data.num_edges=2000", "data.num_features=8", "model.hidden=16", "model.heads=2",
         "checkpoint.enabled=true", "log.progress=false", "backend=pyg", "device=cpu"]


def run(out, *extra):
    return main(SMALL + [f"out_dir={out}"] + list(extra))


def results(out):
    with open(out / "results.json") as f:
        # strict JSON: NaN / Infinity would not be valid JSON for other tools
        return json.load(f, parse_constant=lambda c: pytest.fail(f"{c} in results.json"))


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        # one Adam step moves the weights by ~lr = 5e-3: far above these tolerances
        torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-8, msg=k)


@pytest.fixture
def every_epoch_improves(monkeypatch):
    """Make every epoch 'the best' so that each writes checkpoint_best.pt (the test is
    about when files are written, not about the improvement rule)."""
    monkeypatch.setattr(T._Run, "_improved", lambda self, val: True)


# ---------------------------------------------------------------------------
# 14.6: kills between the checkpoint writes
# ---------------------------------------------------------------------------
def test_kill_between_best_and_last_write_resumes_consistently(tmp_path, monkeypatch,
                                                               every_epoch_improves):
    assert run(tmp_path / "ref", "epochs=3") == 0
    ref = results(tmp_path / "ref")

    # the same run, killed after epoch 3 wrote checkpoint_best.pt and before it wrote
    # checkpoint_last.pt (what a SIGKILL between the two writes leaves)
    real = T._atomic_save

    def killed_at_epoch_3(obj, path):
        if obj["epoch"] == 3:
            raise KeyboardInterrupt
        real(obj, path)
    monkeypatch.setattr(T, "_atomic_save", killed_at_epoch_3)
    out = tmp_path / "run"
    assert run(out, "epochs=3") == 130
    assert load(out / "checkpoint_best.pt")["epoch"] == 3
    assert load(out / "checkpoint_last.pt")["epoch"] == 2
    monkeypatch.setattr(T, "_atomic_save", real)

    assert run(out, "epochs=3", "resume=true") == 0
    r = results(out)
    assert r["metrics"]["best_epoch"] == ref["metrics"]["best_epoch"] == 3
    assert r["checkpoints"] == {"last": {"file": "checkpoint_last.pt", "epoch": 3},
                                "best": {"file": "checkpoint_best.pt", "epoch": 3}}
    best, last = load(out / "checkpoint_best.pt"), load(out / "checkpoint_last.pt")
    assert best["epoch"] == 3 and last["epoch"] == 3
    assert_same_weights(best["model"], load(tmp_path / "ref" / "checkpoint_best.pt")["model"])
    for a, b in zip(r["history"], ref["history"]):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-6)
    assert r["metrics"]["test_metric"] == pytest.approx(ref["metrics"]["test_metric"])
    assert "restored" in (out / "train.log").read_text()   # the file was put back first


@pytest.mark.parametrize("damage", ["stale", "truncated", "missing"])
def test_best_file_out_of_step_is_restored_on_resume(tmp_path, every_epoch_improves, damage):
    """The state the issue describes: checkpoint_last.pt says best epoch 2, but
    checkpoint_best.pt holds epoch 1 (or is damaged / gone)."""
    out = tmp_path / "run"
    assert run(out, "epochs=1") == 0
    shutil.copy(out / "checkpoint_best.pt", tmp_path / "epoch1.pt")
    assert run(out, "epochs=2", "resume=true") == 0
    last = load(out / "checkpoint_last.pt")
    assert last["best"]["epoch"] == 2
    best_file = out / "checkpoint_best.pt"
    if damage == "stale":
        shutil.copy(tmp_path / "epoch1.pt", best_file)
    elif damage == "truncated":
        best_file.write_bytes(best_file.read_bytes()[:1000])
    else:
        best_file.unlink()
    # resume at the end of the run: nothing to train, results.json written again
    assert run(out, "epochs=2", "resume=true") == 0
    r = results(out)
    assert r["stop_reason"].startswith("already complete")
    assert r["metrics"]["best_epoch"] == 2 and r["checkpoints"]["best"]["epoch"] == 2
    best = load(best_file)
    assert best["epoch"] == 2
    assert_same_weights(best["model"], last["model"])   # epoch 2 is last and best
    assert "restored" in (out / "train.log").read_text()


# ---------------------------------------------------------------------------
# 14.6: damaged checkpoints, resuming with a changed config
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    assert run(out, "epochs=2") == 0
    return out


def _copy(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


@pytest.mark.parametrize("damage, fragment", [
    ("truncated", "cannot read checkpoint"),
    ("garbage", "cannot read checkpoint"),
    ("empty", "cannot read checkpoint"),
    ("not_a_checkpoint", "not a dfgnn train checkpoint (missing: epoch, model, optimizer"),
])
def test_damaged_checkpoint_is_a_clear_error(finished, tmp_path, capsys, damage, fragment):
    out = _copy(finished, tmp_path)
    ckpt = out / "checkpoint_last.pt"
    data = ckpt.read_bytes()
    if damage == "truncated":
        ckpt.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        ckpt.write_bytes(bytes(range(256)) * 10)
    elif damage == "empty":
        ckpt.write_bytes(b"")
    else:
        torch.save({"weights": torch.ones(3)}, ckpt)
    capsys.readouterr()
    assert run(out, "epochs=3", "resume=true") == 1   # as 'checkpoint not found'
    err = capsys.readouterr().err
    assert err.startswith("dfgnn train: error: resume: ") and err.count("\n") == 1, err
    assert fragment in err and str(ckpt) in err and "Traceback" not in err


@pytest.mark.parametrize("change, keys", [
    (["optimizer.lr=0.05"], ["optimizer.lr (checkpoint 0.005, now 0.05)"]),
    (["optimizer.name=sgd"], ["optimizer.name (checkpoint 'adam', now 'sgd')"]),
    (["data.num_nodes=400"], ["data.num_nodes"]),
    (["seed=7", "model.hidden=32"], ["seed (checkpoint 41, now 7)", "model.hidden"]),
    (["backend=fused"], ["backend"]),
    (["checkpoint.monitor=val_loss"], ["checkpoint.monitor"]),
])
def test_resume_rejects_changed_keys(finished, tmp_path, capsys, change, keys):
    out = _copy(finished, tmp_path)
    before = (out / "checkpoint_last.pt").read_bytes()
    capsys.readouterr()
    assert run(out, "epochs=3", "resume=true", *change) == 2
    err = capsys.readouterr().err
    assert err.startswith("dfgnn train: config error: resume: ") and err.count("\n") == 1, err
    for k in keys:
        assert k in err, err
    assert "cannot change on resume" in err and "epochs" in err   # says what may change
    assert (out / "checkpoint_last.pt").read_bytes() == before    # nothing was touched


def test_resume_accepts_run_length_and_logging_changes(finished, tmp_path):
    out = _copy(finished, tmp_path)
    assert run(out, "epochs=3", "resume=true", "time_limit_min=60", "log.every=2",
               "early_stopping.patience=5", "eval_test_every=1", "name=renamed") == 0
    r = results(out)
    assert [h["epoch"] for h in r["history"]] == [1, 2, 3]
    assert r["config"]["log"]["every"] == 2 and r["config"]["optimizer"]["lr"] == 0.005


# ---------------------------------------------------------------------------
# 14.7: a diverging loss
# ---------------------------------------------------------------------------
def test_diverging_run_stops_with_an_error(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(out, "epochs=4", "optimizer.lr=1e30") == 1
    err = capsys.readouterr().err
    assert "training diverged" in err and "optimizer.lr" in err and err.count("\n") == 1, err
    r = results(out)
    assert r["status"] == "diverged" and r["stop_reason"].startswith("training diverged")
    assert r["history"] == [] and r["metrics"]["best_epoch"] is None
    assert r["metrics"]["test_metric"] is None      # no model to report
    assert r["checkpoints"] == {"last": None, "best": None}
    assert not (out / "checkpoint_last.pt").exists()


def test_nan_loss_keeps_the_last_good_checkpoint(tmp_path, capsys, monkeypatch):
    real = T._Run.train_epoch_full

    def nan_at_3(self, epoch):
        res = real(self, epoch)
        return dict(res, loss=float("nan")) if epoch == 3 else res
    monkeypatch.setattr(T._Run, "train_epoch_full", nan_at_3)
    out = tmp_path / "run"
    assert run(out, "epochs=5") == 1
    err = capsys.readouterr().err
    assert "training loss is nan in epoch 3" in err and "keeps epoch 2" in err, err
    r = results(out)
    assert r["status"] == "diverged" and "epoch 3" in r["stop_reason"]
    assert [h["epoch"] for h in r["history"]] == [1, 2]
    assert r["checkpoints"]["last"]["epoch"] == 2 and load(out / "checkpoint_last.pt")["epoch"] == 2
    assert r["metrics"]["best_epoch"] in (1, 2) and r["metrics"]["test_metric"] is not None
    assert r["metrics"]["final_test_metric"] is None   # the diverged weights are not reported
    # the kept checkpoint resumes (and, with the fault gone, finishes the run)
    monkeypatch.setattr(T._Run, "train_epoch_full", real)
    assert run(out, "epochs=3", "resume=true") == 0
    assert results(out)["status"] == "completed"
