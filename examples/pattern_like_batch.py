"""A PATTERN-like mini-batch as a PyG Batch (used e.g. for benchmarks).

    python examples/pattern_like_batch.py
"""
from pyg_dfgnn.data import pattern_like_batch

batch = pattern_like_batch(128, seed=0)
print(batch)
print(f"{batch.num_graphs} graphs, {batch.num_nodes} nodes, {batch.num_edges} edges, "
      f"{int(batch.y.sum())} pattern nodes")
