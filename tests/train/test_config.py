"""Config schema: shipped configs, overrides, validation errors (before any training)."""
import os
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


# ---------------------------------------------------------------------------
# config and environment errors: exit 2, one line naming the key, nothing loaded
# ---------------------------------------------------------------------------
def _expect_config_error(capsys, argv, *fragments, data_root=None):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("dfgnn train: config error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for frag in fragments:
        assert frag in err, err
    if data_root is not None:
        assert not data_root.exists()        # rejected before any data was loaded


@pytest.mark.parametrize("override, fragments", [
    ("optimizer.lr=.nan", ["optimizer.lr", "finite"]),
    ("optimizer.lr=.inf", ["optimizer.lr", "finite"]),
    ("optimizer.lr=1e999", ["optimizer.lr", "finite"]),
    ("scheduler.factor=2", ["scheduler.factor", "(0, 1)"]),
    ("optimizer.momentum=-0.5", ["optimizer.momentum", "[0, 1)"]),
    (f"seed={2 ** 70}", ["seed", "2**63"]),
    ("data.gen_seed=-1", ["data.gen_seed", "2**63"]),
    ("data.num_train=0", ["data.num_train", "> 0"]),
    ("data.num_test=-3", ["data.num_test", "> 0"]),
    ("out_dir=''", ["out_dir"]),
    ("data.num_nodes=-5", ["data.num_nodes", "> 0"]),
    ("data.num_edges=-1", ["data.num_edges", "> 0"]),
    ("data.num_features=0", ["data.num_features", "> 0"]),
    ("data.max_degree=-2", ["data.max_degree", "> 0"]),
    ("time_limit_min=-5", ["time_limit_min", "> 0"]),
    ("scheduler.min_lr=-1", ["scheduler.min_lr", ">= 0"]),
    ("early_stopping.min_delta=-1", ["early_stopping.min_delta", ">= 0"]),
])
def test_bad_values_exit_2_naming_the_key(tmp_path, tiny_args, capsys, override, fragments):
    _expect_config_error(capsys, tiny_args(override), *fragments, data_root=tmp_path / "data")
    assert not (tmp_path / "run").exists()


def test_synthetic_graph_sizes_are_checked(capsys, tmp_path):
    base = [str(CONFIGS / "powerlaw_gat.yaml"), f"out_dir={tmp_path / 'o'}"]
    _expect_config_error(capsys, base + ["data.num_nodes=10", "data.max_degree=5",
                                         "data.num_edges=200"], "data.num_edges", "90")
    _expect_config_error(capsys, base + ["data.num_nodes=10", "data.max_degree=20",
                                         "data.num_edges=50"],
                         "data.max_degree", "<= data.num_nodes - 1 = 9")
    _expect_config_error(capsys, base + ["data.num_nodes=1"], "data.num_nodes", ">= 2")


@pytest.mark.parametrize("text, fragments", [
    ("data: {name: PATTERN}\nout_dir: ''\n", ["out_dir", "''"]),
    ("data: {name: PATTERN}\nepochs: 2\nepochs: 3\n", ["duplicate key 'epochs'", "lines 2 and 3"]),
    ("data:\n  name: PATTERN\noptimizer:\n  lr: 0.1\n  name: adam\n  lr: 0.2\n",
     ["duplicate key 'optimizer.lr'", "lines 4 and 6"]),
    ("data: {name: PATTERN}\nname: caf\xe9\n", ["not a UTF-8 text file", "0xe9"]),
    ("data: {name: PATTERN\n", ["invalid YAML"]),
])
def test_bad_config_files_exit_2(tmp_path, capsys, text, fragments):
    p = tmp_path / "c.yaml"
    p.write_bytes(text.encode("latin-1"))
    if "out_dir" not in text:  # file-level problems name the file
        fragments = [str(p)] + fragments
    _expect_config_error(capsys, [str(p)], *fragments)


def test_config_path_that_is_a_directory(tmp_path, capsys):
    _expect_config_error(capsys, [str(tmp_path)], str(tmp_path), "is a directory")


def test_utf8_config_with_bom_is_fine(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes("\ufeffdata: {name: PATTERN}\nname: café\n".encode("utf-8"))
    assert load_config(str(p)).name == "café"


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    # a key given explicitly next to a merge ('<<') overrides the merged one: legal YAML
    p = tmp_path / "c.yaml"
    p.write_text("data: {name: PATTERN}\noptimizer:\n  <<: {lr: 0.1, name: sgd}\n  lr: 0.2\n")
    cfg = load_config(str(p))
    assert cfg.optimizer.lr == pytest.approx(0.2) and cfg.optimizer.name == "sgd"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("requested", ["cuda", "cuda:1"], ids=["plain", "index"])  # (an id
# "cuda", or a parameter named device, would make it a CUDA-only test: tests/conftest.py)
def test_device_cuda_without_cuda_exits_2_before_loading(tmp_path, tiny_args, capsys, requested):
    _expect_config_error(capsys, tiny_args(f"device={requested}"), "device", "CUDA is not available",
                         data_root=tmp_path / "data")
    assert not (tmp_path / "run").exists()


def test_unwritable_out_dir_is_found_at_start(tmp_path, tiny_args, capsys):
    # A path below a regular file can never be created, whoever runs the test
    # (root ignores permission bits, so chmod alone would not fail for root).
    (tmp_path / "file").write_text("x")
    _expect_config_error(capsys, tiny_args(out="file/run"), "out_dir",
                         str(tmp_path / "file" / "run"), data_root=tmp_path / "data")
    # out_dir itself an existing regular file
    _expect_config_error(capsys, tiny_args(out="file"), "out_dir", data_root=tmp_path / "data")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root writes into read-only directories")
def test_read_only_out_dir_is_found_at_start(tmp_path, tiny_args, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        _expect_config_error(capsys, tiny_args(out="ro"), "out_dir", "ermission denied",
                             data_root=tmp_path / "data")
    finally:
        ro.chmod(0o700)


def test_out_dir_probe_reports_a_read_only_file_system(tmp_path, tiny_args, capsys, monkeypatch):
    # Simulates what a read-only mount does to the probe (EROFS on creating a
    # file); checks that the error is reported as a config error, not that a
    # read-only mount is detected (that needs a read-only mount).
    import errno
    import tempfile

    def erofs(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(tempfile, "mkstemp", erofs)
    _expect_config_error(capsys, tiny_args(), "out_dir", "Read-only file system",
                         data_root=tmp_path / "data")
