"""Every Python source of the package compiles without a warning (an invalid
escape sequence in a docstring's math is a SyntaxWarning today and an error in
a later Python)."""
import warnings
from pathlib import Path

import pyg_dfgnn


def test_sources_compile_without_warnings():
    root = Path(pyg_dfgnn.__file__).parent
    paths = sorted(root.rglob("*.py"))
    assert paths
    for path in paths:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compile(path.read_text(encoding="utf-8"), str(path), "exec")
