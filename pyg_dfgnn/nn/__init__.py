"""Drop-in replacements of PyG's attention conv layers.

Change one import line and a PyG model runs the fused attention kernels:

>>> from pyg_dfgnn.nn import GATConv  # instead of: from torch_geometric.nn import GATConv

Each class subclasses the PyG class of the same name (constructor, defaults,
parameters, ``state_dict`` and ``repr`` are PyG's own), so checkpoints move
freely between the two.  :func:`patch_pyg` / :func:`unpatch_pyg` /
:func:`patched` swap them into ``torch_geometric.nn`` for code you cannot edit.
"""
from .agnn_conv import AGNNConv
from .gat_conv import GATConv
from .gatv2_conv import GATv2Conv
from .patch import is_patched, patch_pyg, patched, unpatch_pyg
from .transformer_conv import TransformerConv

__all__ = ["GATConv", "GATv2Conv", "TransformerConv", "AGNNConv", "patch_pyg",
           "unpatch_pyg", "patched", "is_patched"]
