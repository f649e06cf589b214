"""Swap the fused layers into ``torch_geometric.nn`` (and back).

>>> import pyg_dfgnn
>>> pyg_dfgnn.patch_pyg()            # torch_geometric.nn.GATConv is now ours
>>> pyg_dfgnn.unpatch_pyg()          # ... and PyG's again
>>> with pyg_dfgnn.nn.patched():     # only inside the block
...     model = build_model()        # code doing `from torch_geometric.nn import GATConv`

Only names looked up *after* patching see the fused classes: a module that
already did ``from torch_geometric.nn import GATConv`` keeps PyG's class.
:func:`patch_pyg` warns when it finds such a name (a module-level attribute
of the same name bound to PyG's class, outside ``torch_geometric``).
"""
from __future__ import annotations

import contextlib
import importlib
import sys
import warnings
from typing import Dict, Iterator, List, Tuple

__all__ = ["patch_pyg", "unpatch_pyg", "patched", "is_patched", "PATCHED_MODULES"]

#: modules whose attributes are swapped
PATCHED_MODULES = ("torch_geometric.nn", "torch_geometric.nn.conv")

# (module name, class name) -> PyG's original class
_originals: Dict[Tuple[str, str], type] = {}


def _layers() -> Dict[str, type]:
    from .agnn_conv import AGNNConv
    from .gat_conv import GATConv
    from .gatv2_conv import GATv2Conv
    from .transformer_conv import TransformerConv
    return {"GATConv": GATConv, "GATv2Conv": GATv2Conv,
            "TransformerConv": TransformerConv, "AGNNConv": AGNNConv}


def is_patched() -> bool:
    """Whether :func:`patch_pyg` is in effect."""
    return bool(_originals)


def _bound_elsewhere(originals: Dict[str, type]) -> List[str]:
    """``"module.Name"`` for every loaded module outside torch_geometric/pyg_dfgnn
    with a module-level attribute ``Name`` that is PyG's original class (e.g.
    after ``from torch_geometric.nn import GATConv``); these keep PyG's class."""
    found = []
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or mod_name.split(".")[0] in ("torch_geometric", "pyg_dfgnn"):
            continue
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for name, orig in originals.items():
            if d.get(name) is orig:
                found.append(f"{mod_name}.{name}")
    return found


def patch_pyg() -> None:
    """Replace ``GATConv``, ``GATv2Conv``, ``TransformerConv`` and ``AGNNConv``
    in ``torch_geometric.nn`` and ``torch_geometric.nn.conv`` by the fused
    subclasses.  Idempotent.

    Names bound before the call (``from torch_geometric.nn import GATConv`` in
    an already imported module) still refer to PyG's classes; a warning lists
    the ones found in loaded modules."""
    layers = _layers()
    for mod_name in PATCHED_MODULES:
        mod = importlib.import_module(mod_name)
        for name, cls in layers.items():
            key = (mod_name, name)
            if key not in _originals:
                _originals[key] = getattr(mod, name)
            setattr(mod, name, cls)
    stale = _bound_elsewhere({n: _originals[("torch_geometric.nn", n)] for n in layers})
    if stale:
        more = f" and {len(stale) - 5} more" if len(stale) > 5 else ""
        warnings.warn(
            f"patch_pyg(): {', '.join(stale[:5])}{more} were imported from torch_geometric "
            f"before patching and still refer to PyG's (unfused) layers. Call patch_pyg() "
            f"before importing that code, or import the layers from pyg_dfgnn.nn.",
            UserWarning, stacklevel=2)


def unpatch_pyg() -> None:
    """Restore PyG's classes.  A no-op if not patched."""
    for (mod_name, name), cls in list(_originals.items()):
        setattr(importlib.import_module(mod_name), name, cls)
        del _originals[(mod_name, name)]


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Context manager: :func:`patch_pyg` inside the block; on exit, restore
    the state found on entry (nesting-safe)."""
    was = is_patched()
    patch_pyg()
    try:
        yield
    finally:
        if not was:
            unpatch_pyg()
