import os
import shutil
from pathlib import Path

import pytest
import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "planetoid"


def pytest_collection_modifyitems(config, items):
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
