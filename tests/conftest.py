import os
import shutil
from pathlib import Path

import pytest
import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "planetoid"


def _torch_sparse_state():
    """``None`` when torch_sparse/torch_scatter are usable, else why not."""
    try:
        import torch_scatter  # noqa: F401
        import torch_sparse  # noqa: F401
    except Exception as e:
        return f"not installed ({type(e).__name__}: {e}); pip install --no-build-isolation " \
               f"torch_scatter torch_sparse"
    try:
        import torch_geometric.typing as t
        if not t.WITH_TORCH_SPARSE:
            return "installed but not usable by torch_geometric (WITH_TORCH_SPARSE is False)"
    except Exception as e:  # pragma: no cover
        return f"unusable ({type(e).__name__})"
    return None


def _optional_parts():
    lines = []
    if torch.cuda.is_available():
        lines.append(f"pyg_dfgnn: CUDA: {torch.cuda.get_device_name()} -> CUDA tests run")
    else:
        why = ("this torch is a CPU-only build" if torch.version.cuda is None
               else "torch.cuda.is_available() is False")
        lines.append(f"pyg_dfgnn: CUDA: none ({why}) -> tests marked 'cuda' are skipped")
    sparse = _torch_sparse_state()
    lines.append("pyg_dfgnn: torch_sparse: " + ("available -> SparseTensor tests run"
                 if sparse is None else f"{sparse} -> SparseTensor tests are skipped"))
    lines.append("pyg_dfgnn: shared data: " + (
        f"{SHARED} -> Cora/CiteSeer tests run" if SHARED.is_dir() else
        f"{SHARED} is absent (Planetoid raw files; nothing is downloaded) -> Cora/CiteSeer "
        f"tests are skipped"))
    return lines


def pytest_report_header(config):
    """One line per optional part: what runs and what is skipped, and why."""
    return _optional_parts()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """``-q`` hides the header: say it once at the end instead."""
    if config.option.verbose < 0:
        for line in _optional_parts():
            terminalreporter.write_line(line)


def _on_cuda_device(item) -> bool:
    """A test parametrised with ``device="cuda"`` (or ``"cuda:N"``)."""
    callspec = getattr(item, "callspec", None)
    dev = callspec.params.get("device") if callspec is not None else None
    return isinstance(dev, str) and dev.split(":")[0] == "cuda"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # A test run on device "cuda" is a CUDA test whether or not its author
    # marked it: `pytest -m cuda` selects by marker, and device-parametrised
    # CUDA cases without one were silently deselected on GPU machines
    # (session 15).  (Run before the -m deselection: tryfirst.)
    for item in items:
        if _on_cuda_device(item) and item.get_closest_marker("cuda") is None:
            item.add_marker(pytest.mark.cuda)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def planetoid_root(tmp_path):
    """A temporary Planetoid root with Cora/CiteSeer raw files copied from ../shared."""
    if not SHARED.is_dir():
        pytest.skip("../shared/data/planetoid is absent")
    for name in ("Cora", "CiteSeer"):
        src = SHARED / name / "raw"
        if src.is_dir():
            shutil.copytree(src, tmp_path / name / "raw")
    return str(tmp_path)
