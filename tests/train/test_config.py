"""Config schema: shipped configs, overrides, validation errors (before any training)."""
import textwrap

import pytest

from pyg_dfgnn.train.cli import main
from pyg_dfgnn.train.config import (ConfigError, apply_overrides, describe_schema, load_config,
                                    parse_overrides)

from .conftest import CONFIGS

TRAIN_CONFIGS = sorted(p for p in CONFIGS.glob("*.yaml") if not p.name.startswith("bench_"))


def test_shipped_configs_are_valid():
    names = {p.stem for p in TRAIN_CONFIGS}
    assert {"pattern_gat_quick", "pattern_gat", "cluster_gat", "pattern_gt", "cluster_gt",
            "pattern_agnn", "cluster_agnn", "cora_gat", "cora_agnn"} <= names
    for p in TRAIN_CONFIGS:
        cfg = load_config(str(p))
        assert cfg.name == p.stem
        assert cfg.backend == "fused"


def test_paper_settings():
    gat = load_config(str(CONFIGS / "pattern_gat.yaml"))
    assert (gat.model.layers, gat.model.hidden, gat.model.heads) == (4, 152, 8)
    assert gat.optimizer.lr == 1e-3 and gat.batch_size == 128
    assert (gat.scheduler.name, gat.scheduler.factor, gat.scheduler.patience,
            gat.scheduler.min_lr) == ("plateau", 0.5, 5, 1e-5)
    gt = load_config(str(CONFIGS / "pattern_gt.yaml"))
    assert (gt.model.name, gt.model.layers, gt.model.hidden, gt.model.heads) == ("gt", 10, 80, 8)
    assert gt.model.lap_pe
    cora = load_config(str(CONFIGS / "cora_gat.yaml"))
    assert (cora.model.hidden // cora.model.heads, cora.model.heads) == (8, 8)
    assert (cora.model.dropout, cora.optimizer.lr, cora.optimizer.weight_decay,
            cora.epochs) == (0.6, 0.005, 5e-4, 200)


def test_overrides_nested_and_top_level():
    cfg = load_config(str(CONFIGS / "pattern_gat_quick.yaml"),
                      ["model.heads=2", "model.hidden=16", "optimizer.lr=1e-2", "epochs=3",
                       "out_dir=/tmp/somewhere", "backend=pyg", "data.num_train=10",
                       "model.batch_norm=false", "resume=true", "time_limit_min=0.5"])
    assert cfg.model.heads == 2 and cfg.model.hidden == 16
    assert cfg.optimizer.lr == pytest.approx(1e-2) and isinstance(cfg.optimizer.lr, float)
    assert cfg.epochs == 3 and cfg.backend == "pyg" and cfg.data.num_train == 10
    assert cfg.model.batch_norm is False and cfg.resume is True
    assert cfg.resolved_out_dir() == "/tmp/somewhere"
    # untouched keys keep the file's values
    assert cfg.model.layers == 3 and cfg.data.name == "PATTERN"


def test_parse_overrides_yaml_scalars():
    assert parse_overrides(["a=1", "b=0.5", "c=true", "d=null", "e=text", "f=1e-3"]) == [
        ("a", 1), ("b", 0.5), ("c", True), ("d", None), ("e", "text"), ("f", "1e-3")]
    raw = apply_overrides({"model": {"heads": 8}}, [("model.heads", 4), ("data.name", "Cora")])
    assert raw == {"model": {"heads": 4}, "data": {"name": "Cora"}}


def test_default_out_dir_uses_name():
    cfg = load_config(None, ["data.name=Cora", "name=abc"])
    assert cfg.resolved_out_dir() == "runs/abc"


@pytest.mark.parametrize("overrides, fragments", [
    (["model.hedas=3"], ["unknown key 'model.hedas'", "did you mean 'model.heads'",
                         "allowed keys in 'model'"]),
    (["epcohs=3"], ["unknown key 'epcohs'", "'epochs'"]),
    (["model.heads=eight"], ["model.heads", "expected int", "'eight'"]),
    (["optimizer.lr=fast"], ["optimizer.lr", "expected float"]),
    (["backend=cuda"], ["backend", "'cuda'", "fused, pyg"]),
    (["model.name=gcn"], ["model.name", "gat, gt, agnn"]),
    (["data.name=ZINC"], ["data.name", "PATTERN, CLUSTER, Cora"]),
    (["data.source=web"], ["data.source", "auto, pyg, generated"]),
    (["device=tpu"], ["device", "auto, cpu, cuda"]),
    (["model=3"], ["'model' is a section", "model.<key>=value"]),
    (["model.hidden=30", "model.heads=4"], ["model.hidden (30)", "divisible", "model.heads (4)"]),
    (["model.dropout=1.5"], ["model.dropout", "[0, 1)"]),
    (["epochs=0"], ["epochs", "> 0"]),
    (["model.readout=conv", "model.name=agnn"], ["model.readout=conv", "gat"]),
    (["model.lap_pe=true"], ["model.lap_pe", "gt"]),
    (["data.name=Cora", "data.source=generated"], ["data.source=generated", "PATTERN"]),
    (["heads"], ["key=value"]),
])
def test_validation_errors_name_key_and_choices(overrides, fragments):
    with pytest.raises(ConfigError) as ei:
        load_config(str(CONFIGS / "pattern_gat_quick.yaml"), overrides)
    msg = str(ei.value)
    for frag in fragments:
        assert frag in msg, msg


def test_missing_dataset_and_bad_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(textwrap.dedent("""
        model: {name: gat}
        epochs: 2
    """))
    with pytest.raises(ConfigError, match=r"data.name is required .*PATTERN, CLUSTER, Cora"):
        load_config(str(p))
    p.write_text("data: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"'data' must be a mapping"):
        load_config(str(p))
    p.write_text("data: {name: Cora\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(str(p))
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))


def test_cli_rejects_invalid_config_before_training(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main([str(CONFIGS / "pattern_gat_quick.yaml"), "model.hedas=3", f"out_dir={out}"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "config error" in err and "model.hedas" in err and "model.heads" in err
    assert not out.exists()   # nothing was created, nothing trained


def test_cli_print_config_and_schema(capsys):
    assert main([str(CONFIGS / "pattern_gat_quick.yaml"), "model.heads=2", "model.hidden=8",
                 "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "heads: 2" in out and "name: PATTERN" in out
    assert main(["--schema"]) == 0
    out = capsys.readouterr().out
    assert "model.heads: int = 8" in out and "[fused | pyg]" in out
    assert any("data.name" in line for line in describe_schema())
    assert main(["-h"]) == 0
