"""The JIT build finds nvcc from NVIDIA's PyPI wheels (pip install "pyg_dfgnn[cuda]")
when no system toolkit exists: a fake wheel tree stands in for the real one."""
import os
import stat
import sys

import pytest
import torch

from pyg_dfgnn import _build


def _fake_tree(root, release="13.0", major="13"):
    home = root / "nvidia" / f"cu{major}"
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "lib").mkdir()
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release "
                    f"{release}, V{release}.88'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    (home / "lib" / f"libcudart.so.{major}").write_bytes(b"")
    return home


@pytest.fixture
def wheel_env(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PYG_DFGNN_CACHE", str(tmp_path / "cache"))
    for name in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)
    import importlib
    importlib.invalidate_caches()
    return tmp_path


@pytest.mark.skipif(sys.platform != "linux", reason="fake nvcc is a shell script")
def test_finds_wheel_nvcc_and_links_cudart(wheel_env, monkeypatch):
    home = _fake_tree(wheel_env / "site")
    found = _build.pip_cuda_home()
    assert found is not None and found["home"] == home and found["release"] == "13.0"
    from torch.utils import cpp_extension
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    monkeypatch.setenv("CUDA_HOME", "")  # restored after the test
    monkeypatch.setattr(_build, "_pip_cuda", None)
    _build._use_pip_cuda(found)
    assert cpp_extension.CUDA_HOME == str(home) and os.environ["CUDA_HOME"] == str(home)
    inc, ld = _build._pip_cuda_flags()
    shim = ld[0][2:]
    link = os.path.join(shim, "libcudart.so")
    assert os.path.realpath(link) == str(home / "lib" / "libcudart.so.13")
    assert inc == [f"-I{home / 'include'}"]


@pytest.mark.skipif(sys.platform != "linux", reason="fake nvcc is a shell script")
def test_ignores_wheel_of_another_cuda_major(wheel_env):
    _fake_tree(wheel_env / "site", release="12.8", major="13")  # mislabelled tree
    assert _build.pip_cuda_home() is None


@pytest.mark.skipif(sys.platform != "linux", reason="fake nvcc is a shell script")
def test_wheels_split_over_two_site_folders(wheel_env):
    """nvcc in one site folder (a venv, pip install --target), the runtime next to
    torch in another whose ``nvidia/__init__.py`` makes it a regular package that
    hides the first from the import system: both are still found and used."""
    home = _fake_tree(wheel_env / "site")
    (home / "lib" / "libcudart.so.13").unlink()  # the runtime lives with torch
    torch_site = wheel_env / "torch_site"
    rt = torch_site / "nvidia" / "cu13"
    (rt / "include").mkdir(parents=True)
    (rt / "lib").mkdir()
    (rt / "lib" / "libcudart.so.13").write_bytes(b"")
    (torch_site / "nvidia" / "__init__.py").write_text("")
    sys.path.append(str(torch_site))
    try:
        import importlib.util
        spec = importlib.util.find_spec("nvidia")
        assert list(spec.submodule_search_locations) == [str(torch_site / "nvidia")]
        found = _build.pip_cuda_home()
    finally:
        sys.path.remove(str(torch_site))
    assert found["home"] == home and found["lib"] == rt / "lib"
    assert found["include"] == [home / "include", rt / "include"]
