"""The ``dfgnn`` command: --version, info (compiles nothing), errors, Ctrl-C."""
import contextlib

import pytest

import pyg_dfgnn
from pyg_dfgnn import cli


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pyg_dfgnn {pyg_dfgnn.__version__}"


def test_info_shows_build_status_toolchain_packages_and_configs(capsys):
    from pyg_dfgnn import _build
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for key in ("pyg_dfgnn", "torch", "torch_geometric", "gpu", "nvcc:", "cache root:",
                "CUDA extension:", "optional packages:", "torch_sparse", "torch_scatter",
                "matplotlib", "tqdm", "pattern_gat_quick.yaml"):
        assert key in out, key
    assert not _build.is_built()  # info never compiles or loads the extension


def test_unknown_command_and_help(capsys):
    assert cli.main(["trian"]) == 2
    assert "choose from build, train, bench, info" in capsys.readouterr().err
    assert cli.main(["--help"]) == 0
    assert "--version" in capsys.readouterr().out


def test_ctrl_c_anywhere_is_exit_130_without_traceback(monkeypatch, capsys):
    def interrupted(argv):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "_info", interrupted)
    assert cli.main(["info"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.parametrize("cmd", ["train", "bench"])
def test_subcommand_help(cmd, capsys):
    with pytest.raises(SystemExit) if cmd == "bench" else contextlib.nullcontext():
        rc = cli.main([cmd, "--help"])
        assert rc == 0
    assert "usage: dfgnn " + cmd in capsys.readouterr().out



def test_import_is_light_so_ctrl_c_during_startup_is_handled():
    """``import pyg_dfgnn`` (what the ``dfgnn`` command does first) loads
    neither torch nor PyG: they load inside ``cli.main``, whose Ctrl-C handler
    exits 130 without a traceback."""
    import subprocess
    import sys
    code = ("import sys, pyg_dfgnn, pyg_dfgnn.cli; "
            "print(any(m in sys.modules for m in ('torch', 'torch_geometric')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
