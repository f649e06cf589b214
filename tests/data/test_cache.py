"""Data caches survive interrupted runs: atomic writes, unreadable cache = absent."""
import os
from types import SimpleNamespace

import pytest
import torch

from pyg_dfgnn.data import SBMDataset, generate_split, load_data
from pyg_dfgnn.data.cache import atomic_torch_save, atomic_write


def _same(a, b):
    return (torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
            and torch.equal(a.edge_index, b.edge_index))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _cfg(root, **kw):
    base = dict(name="CLUSTER", root=str(root), source="auto", download=False, num_train=5,
                num_val=3, num_test=2, gen_seed=0)
    base.update(kw)
    return SimpleNamespace(**base)


def test_atomic_write_leaves_old_file_or_nothing(tmp_path):
    target = tmp_path / "f.pt"

    def dying_save(obj, path):  # writes part of the file, then the process "dies"
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_torch_save({"a": 1}, str(target), save=dying_save)
    assert not target.exists()                       # no half-written file under the name
    atomic_torch_save({"a": 1}, str(target))
    with pytest.raises(KeyboardInterrupt):
        atomic_torch_save({"a": 2}, str(target), save=dying_save)
    assert torch.load(target) == {"a": 1}            # the old complete file is kept
    assert os.listdir(tmp_path) == ["f.pt"]          # and no temporary file is left over
    with atomic_write(str(target)) as tmp:
        assert os.path.dirname(tmp) == str(tmp_path)  # same directory: os.replace is atomic
        torch.save({"a": 3}, tmp)
    assert torch.load(target) == {"a": 3}


def test_interrupted_generation_leaves_no_cache_file(tmp_path, monkeypatch):
    calls = []

    def dying_save(cls, data_list, path):
        calls.append(path)
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 partial")
        raise KeyboardInterrupt
    monkeypatch.setattr(SBMDataset, "save", classmethod(dying_save))
    with pytest.raises(KeyboardInterrupt):
        SBMDataset(str(tmp_path), "CLUSTER", split="val", seed=1, sizes=(5, 3, 2))
    assert calls
    processed = tmp_path / "generated" / "CLUSTER" / "processed"
    assert [p.name for p in processed.iterdir()] == []
    monkeypatch.undo()
    ds = SBMDataset(str(tmp_path), "CLUSTER", split="val", seed=1, sizes=(5, 3, 2))
    assert all(_same(a, b) for a, b in zip(ds, generate_split("CLUSTER", "val", 3, seed=1)))


@pytest.mark.parametrize("split", ["train", "val"])
def test_truncated_cache_is_regenerated_and_logged(tmp_path, split):
    SBMDataset(str(tmp_path), "CLUSTER", split="train", seed=2, sizes=(5, 3, 2))
    processed = tmp_path / "generated" / "CLUSTER" / "processed"
    bad = processed / f"{split}_seed2_n5-3-2_v1.pt"
    other = processed / ("test_seed2_n5-3-2_v1.pt")
    other_mtime = other.stat().st_mtime_ns
    _truncate(bad)
    with pytest.raises(Exception):
        torch.load(bad, weights_only=False)          # really unreadable
    logs = []
    ds = SBMDataset(str(tmp_path), "CLUSTER", split=split, seed=2, sizes=(5, 3, 2),
                    log_fn=logs.append)
    assert ds.generated
    ref = generate_split("CLUSTER", split, len(ds), seed=2)
    assert len(ds) == {"train": 5, "val": 3}[split]
    assert all(_same(a, b) for a, b in zip(ds, ref))
    assert any("unreadable" in m and str(bad) in m and "regenerating" in m for m in logs), logs
    assert any(m.startswith(f"generating the {split} split of CLUSTER") for m in logs), logs
    assert other.stat().st_mtime_ns == other_mtime   # only the broken split was rewritten
    torch.load(bad, weights_only=False)              # the cache file is whole again
    # without a log function the regeneration is a RuntimeWarning
    _truncate(bad)
    with pytest.warns(RuntimeWarning, match="unreadable"):
        SBMDataset(str(tmp_path), "CLUSTER", split=split, seed=2, sizes=(5, 3, 2))


def test_load_data_says_generating_only_when_it_generates(tmp_path):
    logs = []
    b = load_data(_cfg(tmp_path), log=logs.append)
    assert len(logs) == 1 and logs[0].startswith("generating CLUSTER with the built-in SBM"), logs
    assert "NOT the official CLUSTER data set" in b.source
    logs.clear()
    load_data(_cfg(tmp_path), log=logs.append)
    assert not any(m.startswith("generating") for m in logs), logs
    assert len(logs) == 1 and logs[0].startswith("loaded CLUSTER") and "cache" in logs[0], logs
    # a truncated cache on the training path: regenerated and logged, not a failure
    _truncate(tmp_path / "generated" / "CLUSTER" / "processed" / "test_seed0_n5-3-2_v1.pt")
    logs.clear()
    b = load_data(_cfg(tmp_path), log=logs.append)
    assert len(b.test) == 2
    assert any("unreadable" in m for m in logs), logs
    assert any(m.startswith("generating the test split") for m in logs), logs
    b = load_data(_cfg(tmp_path, source="generated"), log=logs.append)
    assert "data.source=generated" in b.source


def test_truncated_pyg_processed_file_is_processed_again(planetoid_root):
    cfg = _cfg(planetoid_root, name="Cora", source="auto", normalize_features=False)
    ref = load_data(cfg, log=lambda m: None).data
    processed = os.path.join(planetoid_root, "Cora", "processed", "data.pt")
    with open(processed, "rb") as f:
        data = f.read()
    with open(processed, "wb") as f:
        f.write(data[: len(data) // 3])
    logs = []
    again = load_data(cfg, log=logs.append).data
    assert any("unreadable" in m and "processing the raw files again" in m for m in logs), logs
    assert torch.equal(again.x, ref.x) and torch.equal(again.edge_index, ref.edge_index)
