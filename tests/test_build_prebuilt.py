"""The ahead-of-time build (setup.py, PYG_DFGNN_FORCE_BUILD=1) and how load()
picks a prebuilt library: CPU-side logic with a fake library and a fake GPU;
the real build and load are checked on a GPU by scripts/gpu_install_check.sh."""
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from pyg_dfgnn import _build

ROOT = Path(__file__).resolve().parent.parent


def test_sources_only_from_a_checkout(tmp_path, monkeypatch):
    """Installed (not editable), ``CUDA_DIR`` is ``site-packages/cuda``, which
    cuda-python owns: its files are not taken for the extension's sources."""
    (tmp_path / "other.cpp").write_text("int x;")
    monkeypatch.setattr(_build, "CUDA_DIR", tmp_path)
    assert _build.sources() == []
    (tmp_path / "dfgnn_ops.cpp").write_text("")
    assert [p.name for p in _build.sources()] == ["dfgnn_ops.cpp", "other.cpp"]


def test_parse_gencode():
    flags = ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a",
             "-gencode=arch=compute_90,code=compute_90", "-O3"]
    assert _build.parse_gencode(flags) == {"sm": ["80", "90a"], "ptx": ["90"]}
    assert _build.parse_gencode(["-gencode=arch=compute_86,code=[sm_86,compute_86]"]) == \
        {"sm": ["86"], "ptx": ["86"]}


@pytest.mark.parametrize("sm,ptx,cap,ok", [
    (["80"], [], (8, 0), True),
    (["80"], [], (8, 6), True),     # same major, newer minor
    (["86"], [], (8, 0), False),    # older minor
    (["80"], [], (9, 0), False),    # machine code does not cross majors
    (["90a"], [], (9, 0), True),
    (["90a"], [], (10, 0), False),  # arch-specific: its own GPU only
    (["100a"], [], (10, 3), False),
    ([], ["80"], (9, 0), True),     # PTX runs on newer GPUs
    ([], ["90"], (8, 0), False),
    (["80", "90"], [], (12, 0), False),
])
def test_arch_covered(sm, ptx, cap, ok):
    assert _build.arch_covered(sm, ptx, cap) is ok


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """A package folder with a fake prebuilt library, a fake sm_90 GPU, and
    load()'s state reset; torch.ops.load_library records what it is given."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    so = pkg / f"{_build.PREBUILT_NAME}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    so.write_bytes(b"")
    monkeypatch.setattr(_build, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("PYG_DFGNN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PYG_DFGNN_PREBUILT", raising=False)
    monkeypatch.delenv("PYG_DFGNN_NVCC_EXTRA", raising=False)
    monkeypatch.setattr(_build, "_cuda", _build._Once())   # (a fresh process's loader)
    monkeypatch.setattr(_build, "_origin", None)
    loaded = []
    monkeypatch.setattr(torch.ops, "load_library", lambda p: loaded.append(p))

    def no_jit():
        raise _build.BuildError("JIT build attempted")
    monkeypatch.setattr(_build, "_check_toolchain", no_jit)

    def write_info(**over):
        info = dict(_build.build_key(), sm=["90"], ptx=[], source_hash=_build._source_hash())
        info.update(over)
        (pkg / _build.PREBUILT_INFO).write_text(json.dumps(info))
    return so, loaded, write_info


def test_matching_prebuilt_is_loaded_without_compiling(fake_gpu, tmp_path):
    so, loaded, write_info = fake_gpu
    write_info()
    assert _build.prebuilt_path() == so
    assert _build.load() is torch.ops.dfgnn_C
    assert loaded == [str(so)] and _build.origin() == f"prebuilt {so}"
    assert not (tmp_path / "cache").exists()  # no JIT build folder was made


@pytest.mark.parametrize("over,reason", [
    ({"torch": "1.0.0"}, "built for torch '1.0.0'"),
    ({"cuda": "12.8"}, "built for CUDA '12.8'"),
    ({"cxx11_abi": not _build.build_key()["cxx11_abi"]}, "C++ ABI"),
    ({"sm": ["80"]}, "not for this GPU (sm_90)"),
    ({"source_hash": "0" * 16}, "sources in"),
])
def test_mismatched_prebuilt_falls_back_to_jit(fake_gpu, over, reason):
    so, loaded, write_info = fake_gpu
    write_info(**over)
    with pytest.warns(RuntimeWarning, match="building just in time") as rec:
        with pytest.raises(_build.BuildError, match="JIT build attempted"):
            _build.load()
    assert reason in str(rec[0].message) and str(so) in str(rec[0].message)
    assert loaded == []


def test_prebuilt_is_not_used_with_extra_compiler_flags(fake_gpu, monkeypatch):
    """A developer's PYG_DFGNN_NVCC_EXTRA (e.g. a kernel_ab.py A/B of a tuning
    macro) builds just in time: the prebuilt library, built without those
    flags, would silently measure the default build instead."""
    so, loaded, write_info = fake_gpu
    write_info()
    monkeypatch.setenv("PYG_DFGNN_NVCC_EXTRA", "-DDFGNN_EMIT_BLOCKS=3")
    with pytest.warns(RuntimeWarning, match="-DDFGNN_EMIT_BLOCKS=3") as rec:
        with pytest.raises(_build.BuildError, match="JIT build attempted"):
            _build.load()
    assert "PYG_DFGNN_NVCC_EXTRA" in str(rec[0].message) and loaded == []


def test_mismatched_prebuilt_without_sources_raises(fake_gpu, monkeypatch):
    so, loaded, write_info = fake_gpu
    write_info(torch="1.0.0")
    monkeypatch.setattr(_build, "sources", lambda: [])
    with pytest.raises(_build.BuildError, match="built for torch '1.0.0'.*FORCE_BUILD"):
        _build.load()
    assert loaded == []


def test_prebuilt_without_record_or_disabled(fake_gpu, monkeypatch):
    so, loaded, write_info = fake_gpu
    with pytest.warns(RuntimeWarning, match="build record"):  # no _C_build.json
        with pytest.raises(_build.BuildError, match="JIT build attempted"):
            _build.load()
    write_info()
    monkeypatch.setattr(_build._cuda, "error", None)
    monkeypatch.setenv("PYG_DFGNN_PREBUILT", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(_build.BuildError, match="JIT build attempted"):
            _build.load()
    assert loaded == []


def test_unloadable_prebuilt_falls_back(fake_gpu, monkeypatch):
    so, loaded, write_info = fake_gpu
    write_info()

    def bad(p):
        raise OSError("undefined symbol: _ZN3c10")
    monkeypatch.setattr(torch.ops, "load_library", bad)
    with pytest.warns(RuntimeWarning, match="loading it failed .*undefined symbol"):
        with pytest.raises(_build.BuildError, match="JIT build attempted"):
            _build.load()


def _setup_module():
    spec = importlib.util.spec_from_file_location("pyg_dfgnn_setup", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # __name__ is not "__main__": setup() does not run
    return mod


@pytest.mark.parametrize("value,on", [(None, False), ("0", False), ("off", False),
                                      ("", False), ("1", True), ("yes", True)])
def test_setup_force_build_switch(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("PYG_DFGNN_FORCE_BUILD", raising=False)
    else:
        monkeypatch.setenv("PYG_DFGNN_FORCE_BUILD", value)
    assert _setup_module().force_build() is on


@pytest.mark.skipif(torch.version.cuda is not None, reason="CPU-only torch behaviour")
def test_setup_force_build_without_cuda_torch_fails_clearly():
    env = dict(os.environ, PYG_DFGNN_FORCE_BUILD="1")
    r = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "PYG_DFGNN_FORCE_BUILD=1: torch" in r.stderr and "no CUDA support" in r.stderr
