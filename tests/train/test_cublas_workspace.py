"""``cublas_workspace_kib``: the cuBLAS workspace size of a training run."""
import json
import os
import subprocess
import sys

import pytest
import torch

from pyg_dfgnn.train.cli import main
from pyg_dfgnn.train.memory import (AUTO_CUBLAS_WORKSPACE_KIB, cublas_workspace_for,
                                    set_cublas_workspace)

from .conftest import REPO

CUDA = torch.device("cuda")


@pytest.fixture
def clean_env(monkeypatch):
    """No CUBLAS_WORKSPACE_CONFIG during the test, and the process's own value
    (or its absence) restored after it, whatever the code under test set."""
    for name in ("CUBLAS_WORKSPACE_CONFIG", "_PYG_DFGNN_CUBLAS_WS"):
        monkeypatch.setenv(name, "x")   # records the value to restore
        monkeypatch.delenv(name)
    return monkeypatch


def test_auto_is_small_for_captured_steps_only():
    assert cublas_workspace_for("auto", captured=True) == AUTO_CUBLAS_WORKSPACE_KIB == 1024
    assert cublas_workspace_for("auto", captured=False) is None
    assert cublas_workspace_for(512, captured=False) == 512
    assert cublas_workspace_for(0, captured=True) == 0
    assert cublas_workspace_for(None, captured=True) is None


def test_not_a_cuda_run():
    assert set_cublas_workspace(1024, torch.device("cpu")) is None


def test_null_keeps_pytorch_default(clean_env):
    msg = set_cublas_workspace(None, CUDA)
    assert "default" in msg and "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_environment_variable_when_torch_has_no_setter(clean_env):
    clean_env.delattr(torch._C, "_cuda_setCublasWorkspaceSize", raising=False)
    msg = set_cublas_workspace(512, CUDA)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":512:1"
    assert "512 KiB" in msg and ":512:1" in msg
    # a later run of the same process may set its own value (ours, not the user's)
    set_cublas_workspace(256, CUDA)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":256:1"


def test_setter_of_newer_torch(clean_env):
    calls = {}
    clean_env.setattr(torch._C, "_cuda_setCublasWorkspaceSize",
                      lambda n: calls.__setitem__("ws", n), raising=False)
    clean_env.setattr(torch._C, "_cuda_getCublasWorkspaceSize", lambda: calls["ws"],
                      raising=False)
    clean_env.setattr(torch._C, "_cuda_setCublasLtWorkspaceSize",
                      lambda n: calls.__setitem__("lt", n), raising=False)
    clean_env.setattr(torch._C, "_cuda_getCublasLtWorkspaceSize",
                      lambda: calls.get("lt", 1 << 20), raising=False)
    msg = set_cublas_workspace(64, CUDA)
    assert calls == {"ws": 64 * 1024, "lt": 64 * 1024}
    assert "cublas_workspace_size" in msg and "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_default_after_an_earlier_run_of_the_process(clean_env):
    """A later run at PyTorch's default (e.g. an eager run after a captured one
    in the same process) undoes the earlier size: the setter's reset, or the
    environment variable while cuBLAS has not read it."""
    calls = []
    clean_env.setattr(torch._C, "_cuda_setCublasWorkspaceSize",
                      lambda n: calls.append(("set", n)), raising=False)
    clean_env.setattr(torch._C, "_cuda_getCublasWorkspaceSize", lambda: 1024, raising=False)
    clean_env.setattr(torch._C, "_cuda_resetCublasWorkspaceSize",
                      lambda: calls.append(("reset",)), raising=False)
    set_cublas_workspace(1024, CUDA)
    assert set_cublas_workspace(None, CUDA) == "cublas workspace: PyTorch's default"
    assert calls == [("set", 1 << 20), ("reset",)]
    set_cublas_workspace(None, CUDA)          # nothing set since: nothing to reset
    assert calls == [("set", 1 << 20), ("reset",)]
    clean_env.delattr(torch._C, "_cuda_setCublasWorkspaceSize")
    set_cublas_workspace(512, CUDA)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":512:1"
    msg = set_cublas_workspace(None, CUDA)
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ and ":512:1" in msg


def test_user_environment_wins(clean_env):
    clean_env.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    msg = set_cublas_workspace(1024, CUDA)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert ":4096:8" in msg and "not applied" in msg


@pytest.mark.parametrize("value", ["-1", "big", "true"])
def test_bad_value_is_a_config_error(tiny_args, capsys, value):
    assert main(tiny_args(f"cublas_workspace_kib={value}")) == 2
    assert "cublas_workspace_kib" in capsys.readouterr().err


def test_recorded_in_results(tiny_args, tmp_path):
    assert main(tiny_args("cublas_workspace_kib=2048", "epochs=1", "device=cpu")) == 0
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["config"]["cublas_workspace_kib"] == 2048


_PROBE = """
import sys, torch
from pyg_dfgnn.train.memory import (AUTO_CUBLAS_WORKSPACE_KIB, cublas_workspace_for,
                                    set_cublas_workspace)
kib = None if sys.argv[1] == 'null' else int(sys.argv[1])
print(set_cublas_workspace(kib, torch.device('cuda')), file=sys.stderr)
a = torch.randn(512, 80, device='cuda'); b = torch.randn(80, 80, device='cuda')
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
torch.cuda.synchronize(); before = torch.cuda.memory_allocated()
with torch.cuda.stream(s):
    c = a @ b
torch.cuda.synchronize()
print(torch.cuda.memory_allocated() - before - c.untyped_storage().nbytes())
"""


def _workspace_bytes(kib: str) -> int:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUBLAS_WORKSPACE_CONFIG", "_PYG_DFGNN_CUBLAS_WS")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _PROBE, kib], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_workspace_allocated_on_a_new_stream_has_the_set_size():
    """What cuBLAS allocates for a (handle, stream) pair in a fresh process: the
    set size, against PyTorch's default (8 MiB before Hopper, 32 MiB since)."""
    small, default = _workspace_bytes("256"), _workspace_bytes("null")
    assert small <= 256 * 1024, small
    assert default >= 4 << 20, default


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend,expect", [
    ("fused", "cublas workspace: 1024 KiB per handle and stream"),
    ("pyg", "cublas workspace: PyTorch's default [cublas_workspace_kib: auto, eager steps]")])
def test_auto_in_a_cuda_run(tiny_args, tmp_path, clean_env, backend, expect):
    """The default (auto) on CUDA: the small workspace where the steps are
    captured (backend=fused, cuda_graphs: auto), PyTorch's where they are
    eager, logged either way."""
    assert main(tiny_args("epochs=1", "device=cuda", "cuda_graphs=auto",
                          f"backend={backend}")) == 0
    log = (tmp_path / "run" / "train.log").read_text()
    assert expect in log, log
