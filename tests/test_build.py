"""The CUDA extension: nothing compiles at import; clear errors without CUDA."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def test_import_does_not_build():
    code = ("import pyg_dfgnn, pyg_dfgnn.nn, pyg_dfgnn._build as b; "
            "import sys; sys.exit(1 if b.is_built() else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_sources_and_cache_key():
    from pyg_dfgnn import _build
    names = {p.name for p in _build.sources()}
    kinds = ("gat", "gatv2", "dot", "agnn")   # (forward and backward in units of their own)
    assert {"dfgnn_ops.cpp", *(f"attention_{k}.cu" for k in kinds),
            *(f"attention_{k}_bwd.cu" for k in kinds)} <= names
    assert len(_build._source_hash()) == 16


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
def test_clear_error_without_cuda():
    from pyg_dfgnn import _build
    with pytest.raises(_build.BuildError, match="CUDA"):
        _build.load()


def test_cli_build_reports_error_or_builds():
    r = subprocess.run([sys.executable, "-m", "pyg_dfgnn", "build"], capture_output=True,
                       text=True)
    if torch.cuda.is_available():
        assert r.returncode == 0
    else:
        assert r.returncode == 1 and "CUDA" in r.stderr


@pytest.mark.cuda
def test_cuda_smoke_op():
    from pyg_dfgnn.graph import get_graph
    from pyg_dfgnn.ops import gat_attention
    ei = torch.randint(0, 50, (2, 300), device="cuda")
    g = get_graph(ei, (50, 50))
    x = torch.randn(50, 2, 8, device="cuda")
    a = torch.randn(50, 2, device="cuda")
    out, _ = gat_attention(g, x, a, a)
    assert out.shape == (50, 2, 8) and torch.isfinite(out).all()


def test_build_folders_are_per_checkout(tmp_path, monkeypatch):
    """Two checkouts of the same sources get build folders of their own (torch's
    JIT loader writes the sources' paths into its build file: a shared folder
    would rebuild the extension for each checkout in turn), keyed apart by the
    source folder alone."""
    import shutil

    from pyg_dfgnn import _build
    first = _build.cpu_cache_dir()
    assert first.name.endswith("-" + _build._tree_tag(_build.CPU_DIR))
    copy = tmp_path / "checkout"
    shutil.copytree(_build.CPU_DIR, copy / "cpu")
    shutil.copytree(_build.CUDA_DIR, copy / "cuda")
    monkeypatch.setattr(_build, "CPU_DIR", copy / "cpu")
    monkeypatch.setattr(_build, "CUDA_DIR", copy / "cuda")
    second = _build.cpu_cache_dir()
    assert second != first
    assert second.name.rsplit("-", 1)[0] == first.name.rsplit("-", 1)[0]   # same content key
    assert _build._tree_tag(copy / "cuda") != _build._tree_tag(Path(__file__).parents[1] / "cuda")
    assert _build._tree_tag(copy / "cuda") == _build._tree_tag(copy / "cuda" / ".." / "cuda")
