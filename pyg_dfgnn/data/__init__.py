"""Data sets: generated PATTERN/CLUSTER (SBM), PyG loaders, synthetic graphs.

>>> from pyg_dfgnn.data import pattern_like_batch
>>> batch = pattern_like_batch(128, seed=0)     # ~15k nodes, ~0.76M edges
"""
from __future__ import annotations

from .sbm import (CLUSTER_PARAMS, DEFAULT_SIZES, PATTERN_PARAMS, SBMDataset,  # noqa: F401
                  generate_cluster_graph, generate_pattern_graph, generate_split,
                  pattern_like_batch)
from .datasets import (DATASET_NAMES, DataBundle, DataError, add_laplacian_pe,  # noqa: F401
                       laplacian_pe, load_data)
from .prepare import (PREPARED_KEY, PreparedDataLoader, PreparedGraph,  # noqa: F401
                      PrepareGraphs, attach_prepared, prepare_graph)
from .batching import GraphBatcher, GraphBatchLoader  # noqa: F401

__all__ = ["pattern_like_batch", "SBMDataset", "generate_pattern_graph",
           "generate_cluster_graph", "generate_split", "PATTERN_PARAMS", "CLUSTER_PARAMS",
           "DEFAULT_SIZES", "load_data", "DataBundle", "DataError", "laplacian_pe",
           "add_laplacian_pe", "DATASET_NAMES", "PrepareGraphs", "PreparedDataLoader",
           "attach_prepared", "prepare_graph", "PreparedGraph", "PREPARED_KEY",
           "GraphBatcher", "GraphBatchLoader"]
