"""``dfgnn train`` on a user's graph: data.name=file (a torch.save'd Data) and
data.name=pyg (a torch_geometric.datasets class), full batch and sampled."""
import json

import pytest
import torch
from torch_geometric.data import Data

from pyg_dfgnn.train.cli import main
from pyg_dfgnn.train.config import ConfigError, load_config

from .conftest import CONFIGS

# a 2-layer GAT of width 8 on a 60-node graph
SMALL = ["model.name=gat", "model.readout=linear", "model.hidden=8", "model.heads=2",
         "model.layers=2", "scheduler.name=none", "log.progress=false", "device=cpu",
         "checkpoint.enabled=false", "data.normalize_features=false"]
CFG = str(CONFIGS / "cora_gat.yaml")


def _save_graph(path, n=60, masks=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (6 * n,), generator=g)
    dst = torch.randint(0, n, (6 * n,), generator=g)
    d = Data(x=torch.randn(n, 5, generator=g), edge_index=torch.stack([src, dst]),
             y=torch.randint(0, 3, (n,), generator=g))
    if masks:
        perm = torch.randperm(n, generator=g)
        for i, k in enumerate(("train_mask", "val_mask", "test_mask")):
            m = torch.zeros(n, dtype=torch.bool)
            m[perm[i * n // 3:(i + 1) * n // 3]] = True
            d[k] = m
    torch.save(d, path)
    return d


def _run(tmp_path, *extra, out="run"):
    rc = main([CFG] + SMALL + [f"out_dir={tmp_path / out}"] + list(extra))
    results = None
    if (tmp_path / out / "results.json").is_file():
        results = json.loads((tmp_path / out / "results.json").read_text())
    return rc, results


@pytest.mark.parametrize("loader", ["full", "neighbor"])
def test_file_dataset_trains(tmp_path, loader):
    d = _save_graph(tmp_path / "g.pt")
    extra = ["data.loader=neighbor", "data.num_neighbors=[3, 3]", "batch_size=8"] \
        if loader == "neighbor" else []
    rc, r = _run(tmp_path, "data.name=file", f"data.path={tmp_path / 'g.pt'}", "epochs=2",
                 *extra)
    assert rc == 0
    assert r["dataset"]["name"] == "file:g.pt" and "its train/val/test masks" in \
        r["dataset"]["source"]
    assert r["dataset"]["stats"]["train/val/test"] == [20, 20, 20]
    assert r["dataset"]["num_classes"] == int(d.y.max()) + 1
    assert len(r["history"]) == 2 and r["metrics"]["test_metric"] is not None
    if loader == "neighbor":   # ceil(20 / 8) sampled steps per epoch
        assert [h["steps"] for h in r["history"]] == [3, 3]


def test_file_without_masks_gets_a_seeded_split(tmp_path):
    _save_graph(tmp_path / "g.pt", masks=False)
    args = ["data.name=file", f"data.path={tmp_path / 'g.pt'}", "epochs=1",
            "data.split=[0.5, 0.25, 0.25]"]
    rc, r = _run(tmp_path, *args)
    assert rc == 0 and r["dataset"]["stats"]["train/val/test"] == [30, 15, 15]
    assert "random 50/25/25 % split" in r["dataset"]["source"]
    rc, r2 = _run(tmp_path, *args, out="again")
    assert r2["history"][0]["train_loss"] == r["history"][0]["train_loss"]   # same split


@pytest.mark.parametrize("what,match", [
    ("missing", "data.path: file not found"),
    ("no_y", "data.path: file .* has no 'y'"),
    ("range", r"data.path: edge_index of file .* holds node ids outside \[0, 60\)"),
    ("garbage", "data.path: cannot read"),
])
def test_file_errors_exit_2_naming_the_key(tmp_path, capsys, what, match):
    import re
    p = tmp_path / "g.pt"
    if what != "missing":
        d = _save_graph(p)
        if what == "no_y":
            del d.y
            torch.save(d, p)
        elif what == "range":
            d.edge_index[1, 3] = 60
            torch.save(d, p)
        elif what == "garbage":
            p.write_bytes(b"not a torch file")
    rc, _ = _run(tmp_path, "data.name=file", f"data.path={p}", "epochs=1")
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dfgnn train: config error: "), err
    assert re.search(match, err[0]), err


@pytest.mark.parametrize("overrides,match", [
    (["data.name=file"], "data.path is required for data.name=file"),
    (["data.name=pyg"], "data.pyg_class is required"),
    (["data.name=pyg", "data.pyg_class=Planetod"], "did you mean 'Planetoid'"),
    (["data.name=pyg", "data.pyg_class=GCNConv"], "not a data set class"),
    (["data.path=/x.pt"], "data.path is only used with data.name=file"),
    (["data.pyg_kwargs.name=Cora"], "data.pyg_kwargs is only used with data.name=pyg"),
    (["data.split=[0.8, 0.3, 0.1]"], "data.split: give 3 fractions"),
    (["data.split=[0.8, 0.2]"], "data.split: give 3 fractions"),
    (["data.eval=layerwise"], "data.eval=layerwise needs data.loader=neighbor"),
    (["data.eval=sampled"], "needs data.loader=neighbor"),
    (["data.eval_batch_size=0"], "data.eval_batch_size: must be > 0"),
    (["max_steps_per_epoch=0"], "max_steps_per_epoch: must be > 0"),
])
def test_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(CFG, overrides)


def test_pyg_kwargs_override_forms():
    a = load_config(CFG, ["data.name=pyg", "data.pyg_class=Planetoid",
                          "data.pyg_kwargs.name=Cora"])
    b = load_config(CFG, ["data.name=pyg", "data.pyg_class=Planetoid",
                          "data.pyg_kwargs={name: Cora, split: full}"])
    assert a.data.pyg_kwargs == {"name": "Cora"}
    assert b.data.pyg_kwargs == {"name": "Cora", "split": "full"}
    with pytest.raises(ConfigError, match="data.pyg_kwargs: expected mapping"):
        load_config(CFG, ["data.name=pyg", "data.pyg_class=Planetoid", "data.pyg_kwargs=3"])


def test_pyg_class_dataset(tmp_path, planetoid_root, capsys):
    base = ["data.name=pyg", "data.pyg_class=Planetoid", f"data.root={planetoid_root}"]
    rc, r = _run(tmp_path, *base, "data.pyg_kwargs.name=Cora", "epochs=1")
    assert rc == 0, capsys.readouterr().err
    assert r["dataset"]["name"] == "Planetoid(name='Cora')"
    assert r["dataset"]["stats"]["num_nodes"] == 2708 and r["dataset"]["num_classes"] == 7
    assert r["dataset"]["stats"]["train/val/test"] == [140, 500, 1000]   # its public split
    capsys.readouterr()
    # no raw files and data.download=false: exit 2 naming data.root, nothing downloaded
    rc, _ = _run(tmp_path, *base, "data.pyg_kwargs.name=PubMed", "epochs=1", out="b")
    err = capsys.readouterr().err
    assert rc == 2 and "config error: data.root: the raw files of" in err
    assert "PubMed" in err and "data.download=true" in err
    # a keyword the class does not take
    rc, _ = _run(tmp_path, *base, "data.pyg_kwargs={name: Cora, colour: red}", "epochs=1",
                 out="c")
    assert rc == 2 and "config error: data.pyg_kwargs:" in capsys.readouterr().err
