"""pyg_dfgnn: fused (DF-GNN style) attention kernels as drop-in PyG conv layers.

>>> from pyg_dfgnn.nn import GATConv   # instead of torch_geometric.nn.GATConv
"""
from __future__ import annotations

__version__ = "0.1.0"

# Nothing heavy at import time: torch, PyG and the custom ops load on first use
# (``pyg_dfgnn.nn`` / ``pyg_dfgnn.ops`` / the names below), so the ``dfgnn``
# command starts fast and a Ctrl-C while torch loads is handled by the CLI
# (exit 130) instead of printing a traceback.
_GRAPH_NAMES = ("CSRGraph", "get_graph", "build_graph", "clear_cache")


def build(verbose: bool = False):
    """Compile (or load from cache) the CUDA extension now."""
    from . import _build
    return _build.load(verbose=verbose)


def __getattr__(name):  # lazy: keep `import pyg_dfgnn` light
    if name in _GRAPH_NAMES:
        from . import graph
        return getattr(graph, name)
    if name in ("nn", "ops", "graph", "schedule", "data", "train", "bench"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    if name in ("patch_pyg", "unpatch_pyg", "patched", "is_patched"):
        from .nn import patch
        return getattr(patch, name)
    if name == "explain_schedule":
        from .schedule import explain_schedule
        return explain_schedule
    raise AttributeError(name)
