"""Training-epoch section: both timing modes and the backend logits check."""
import pytest
import torch

from pyg_dfgnn.bench import train_bench
from pyg_dfgnn.bench.runner import Settings

CPU = torch.device("cpu")
RUN = {"label": "tiny_gat", "seed": 0, "batch_size": 4,
       "data": {"name": "PATTERN", "source": "generated", "num_train": 8, "num_val": 1,
                "num_test": 1},
       "model": {"name": "gat", "hidden": 8, "heads": 2, "layers": 2}}


def _cfg(mode):
    return {"train": {"enabled": True, "mode": mode, "backends": ["fused", "pyg"],
                      "warmup_epochs": 1, "epochs": 2, "runs": [RUN]}}


def test_loop_mode(tmp_path):
    rows = train_bench.run_train(_cfg("loop"), Settings(), CPU, str(tmp_path))
    assert [r["contender"] for r in rows] == ["pyg", "fused"]  # baseline first
    for r in rows:
        assert r["status"] == "ok", r
        assert r["fwdbwd_ms_n"] == 2 and r["fwd_ms_n"] == 2 and r["first_ms"] > 0
        assert "bench loop" in r["note"]
    assert rows[1]["check"] == "pyg" and rows[1]["max_err"] < 1e-4


def test_fused_model_that_disagrees_is_not_timed(tmp_path, monkeypatch):
    load_data, config_from_dict, build_model, BackendError = train_bench._imports()

    class Doubled(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *a, **k):
            return 2.0 * self.m(*a, **k)

        def load_state_dict(self, sd, strict=True):
            return self.m.load_state_dict(sd, strict)

    def wrong_build(mcfg, in_dim, num_classes, categorical, backend):
        m = build_model(mcfg, in_dim, num_classes, categorical, backend)
        return Doubled(m) if backend == "fused" else m

    monkeypatch.setattr(train_bench, "_imports",
                        lambda: (load_data, config_from_dict, wrong_build, BackendError))
    rows = train_bench.run_train(_cfg("loop"), Settings(), CPU, str(tmp_path))
    by = {r["contender"]: r for r in rows}
    assert by["pyg"]["status"] == "ok"
    assert by["fused"]["status"] == "mismatch" and by["fused"].get("fwdbwd_ms") is None


def test_training_stack_missing_is_skipped(tmp_path, monkeypatch):
    def missing():
        raise ImportError("No module named 'pyg_dfgnn.train.models'")
    monkeypatch.setattr(train_bench, "_imports", missing)
    rows = train_bench.run_train(_cfg("auto"), Settings(), CPU, str(tmp_path))
    assert len(rows) == 2
    assert all(r["status"].startswith("skipped: pyg_dfgnn.train not ready") for r in rows)


@pytest.mark.parametrize("config,precision", [("pattern_gat_quick", "bf16"),
                                               ("pattern_gt", "fp32")])
def test_shipped_config_run(tmp_path, monkeypatch, config, precision):
    """A run given as a shipped config file (relative path, found from any
    working directory) plus overrides: checked against PyG (GT: with its
    Laplacian PE) and timed by the trainer in the run's precision (the rows'
    dtype), with its data under the bench's output directory rather than the
    config's own ``data.root``."""
    monkeypatch.chdir(tmp_path)
    small = {"data": {"source": "generated", "num_train": 8, "num_val": 2, "num_test": 1},
             "batch_size": 4, "model": {"hidden": 8, "out_dim": 8, "heads": 2, "layers": 2}}
    cfg = {"train": {"enabled": True, "mode": "trainer", "backends": ["fused", "pyg"],
                     "warmup_epochs": 1, "epochs": 1,
                     "runs": [{"label": "run", "config": f"configs/{config}.yaml",
                               "precision": precision, "overrides": small}]}}
    rows = train_bench.run_train(cfg, Settings(), CPU, str(tmp_path / "out"))
    assert [r["contender"] for r in rows] == ["pyg", "fused"]
    for r in rows:
        assert r["status"] == "ok", r
        assert r["dtype"] == {"bf16": "bfloat16", "fp32": "float32"}[precision]
        assert "pyg_dfgnn.train.train" in r["note"]
    assert rows[1]["check"] == "pyg" and rows[1]["max_err"] < 1e-4
    assert (tmp_path / "out" / "train_data").is_dir() and not (tmp_path / "data").exists()
    log = (tmp_path / "out" / "train" / "run_fused" / "bench_stdout.log").read_text()
    assert f"precision {precision}" in log or precision == "fp32"
