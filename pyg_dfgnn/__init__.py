"""pyg_dfgnn: fused (DF-GNN style) attention kernels as drop-in PyG conv layers.

>>> from pyg_dfgnn.nn import GATConv   # instead of torch_geometric.nn.GATConv
"""
from __future__ import annotations

__version__ = "0.1.0"

from .graph import CSRGraph, get_graph, build_graph, clear_cache  # noqa: F401
from . import ops  # noqa: F401  (registers the dfgnn:: custom ops)


def build(verbose: bool = False):
    """Compile (or load from cache) the CUDA extension now."""
    from . import _build
    return _build.load(verbose=verbose)


def __getattr__(name):  # lazy: keep `import pyg_dfgnn` light
    if name in ("nn", "schedule", "data", "train", "bench"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    if name in ("patch_pyg", "unpatch_pyg", "patched", "is_patched"):
        from .nn import patch
        return getattr(patch, name)
    if name == "explain_schedule":
        from .schedule import explain_schedule
        return explain_schedule
    raise AttributeError(name)
