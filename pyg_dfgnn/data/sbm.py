"""Deterministic re-implementation of the benchmarking-gnns SBM generators.

PATTERN and CLUSTER (Dwivedi et al., "Benchmarking Graph Neural Networks") are
node-classification datasets drawn from stochastic block models.  When the
official files are not available under the data root (this machine is
offline), this module regenerates graphs with the *same procedure* as the
original notebooks (``data/SBMs/generate_SBM_PATTERN.ipynb`` and
``generate_SBM_CLUSTER.ipynb`` of graphdeeplearning/benchmarking-gnns, final
"v4" PATTERN settings), but from an explicit seed so the result is
reproducible.  It is *not* the official data set (the original was drawn from
an unseeded global RNG), so numbers are comparable in distribution only.

PATTERN (binary node classification: "is this node part of the planted pattern?")
    * 5 communities, each of ``randint(5, 35)`` nodes (numpy semantics: 5..34),
      edges with probability p=0.5 inside a community and q=0.35 between them;
    * node signal ``u`` uniform in {0, 1, 2} (vocabulary of 3);
    * 100 pattern instances; each is a random graph of ``randint(5, 35)``
      nodes with edge probability 0.5 and its own fixed random signal
      ``u0`` in {0, 1, 2}.  Every generated graph takes one pattern instance
      (train/val/test graphs of an instance share it, as in the original
      100/20/20 split per instance), connects each pattern node to each SBM
      node with probability q_pattern=0.5, and shuffles the node order;
    * target = 1 for pattern nodes, 0 otherwise.

CLUSTER (6-class semi-supervised clustering)
    * 6 communities of ``randint(5, 35)`` nodes, p=0.55, q=0.25;
    * node order shuffled, then in each community one random node is labelled
      with feature ``community + 1``, every other node has feature 0;
    * target = community id.

Graphs are stored like :class:`torch_geometric.datasets.GNNBenchmarkDataset`
would expose them to a model that embeds integer features: ``x`` is a long
tensor of shape ``[N]``, ``edge_index`` lists both directions of every
undirected edge (no self-loops), ``y`` is a long tensor ``[N]``.

Determinism: pattern instance ``i`` is drawn from ``default_rng([seed, 0, i])``
and graph ``k`` of split ``s`` from ``default_rng([seed, 1 + s, k])``, so a
graph does not depend on how many other graphs are generated and the same
``(seed, sizes)`` always give bit-identical data.
"""
from __future__ import annotations

import os
import os.path as osp
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch_geometric.data import InMemoryDataset

__all__ = [
    "PATTERN_PARAMS", "CLUSTER_PARAMS", "DEFAULT_SIZES", "SPLITS",
    "SBMParams", "random_pattern", "generate_pattern_graph",
    "generate_cluster_graph", "generate_split", "pattern_like_batch", "SBMDataset",
]

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class SBMParams:
    nb_clusters: int
    size_min: int
    size_max: int          # exclusive, numpy ``randint`` semantics as in the original
    p: float
    q: float
    # PATTERN only
    p_pattern: float = 0.5
    q_pattern: float = 0.5
    vocab_size: int = 3
    size_subgraph_min: int = 5
    size_subgraph_max: int = 35  # exclusive
    num_patterns: int = 100


PATTERN_PARAMS = SBMParams(nb_clusters=5, size_min=5, size_max=35, p=0.5, q=0.35,
                           p_pattern=0.5, q_pattern=0.5, vocab_size=3,
                           size_subgraph_min=5, size_subgraph_max=35, num_patterns=100)
CLUSTER_PARAMS = SBMParams(nb_clusters=6, size_min=5, size_max=35, p=0.55, q=0.25)

# Split sizes of the original data sets (train, val, test).
DEFAULT_SIZES: Dict[str, Tuple[int, int, int]] = {
    "PATTERN": (10000, 2000, 2000),
    "CLUSTER": (10000, 1000, 1000),
}


# ----------------------------------------------------------------------------
# building blocks (vectorised versions of the notebook's double loops)
# ----------------------------------------------------------------------------
def _community_sizes(rng: np.random.Generator, params: SBMParams) -> np.ndarray:
    if params.size_min == params.size_max:
        return np.full(params.nb_clusters, params.size_max, dtype=np.int64)
    return rng.integers(params.size_min, params.size_max, size=params.nb_clusters)


def _block_model(rng: np.random.Generator, c: np.ndarray, p: float, q: float) -> np.ndarray:
    """Symmetric boolean adjacency: P(edge i~j) = p if c[i]==c[j] else q, no self-loops."""
    n = c.shape[0]
    iu, ju = np.triu_indices(n, 1)
    prob = np.where(c[iu] == c[ju], p, q)
    keep = rng.random(iu.shape[0]) < prob
    W = np.zeros((n, n), dtype=bool)
    W[iu[keep], ju[keep]] = True
    W |= W.T
    return W


def random_pattern(rng: np.random.Generator, n: int, p: float) -> np.ndarray:
    """Erdos-Renyi G(n, p) adjacency (symmetric, boolean), the planted pattern."""
    return _block_model(rng, np.zeros(n, dtype=np.int64), p, p)


def _pattern_instance(seed: int, index: int, params: SBMParams) -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 0, index])
    size = int(rng.integers(params.size_subgraph_min, params.size_subgraph_max))
    W0 = random_pattern(rng, size, params.p_pattern)
    u0 = rng.integers(0, params.vocab_size, size=size)
    return W0, u0


def _to_data(W: np.ndarray, x: np.ndarray, y: np.ndarray):
    from torch_geometric.data import Data
    row, col = np.nonzero(W)
    edge_index = torch.from_numpy(np.stack([row, col]).astype(np.int64))
    return Data(x=torch.from_numpy(x.astype(np.int64)), edge_index=edge_index,
                y=torch.from_numpy(y.astype(np.int64)), num_nodes=int(W.shape[0]))


def generate_pattern_graph(rng: np.random.Generator, W0: np.ndarray, u0: np.ndarray,
                           params: SBMParams = PATTERN_PARAMS, return_raw: bool = False):
    """One PATTERN graph with the planted pattern ``(W0, u0)``.

    Returns a :class:`torch_geometric.data.Data` (``x`` long ``[N]`` in {0..vocab-1},
    ``y`` long ``[N]`` in {0, 1}); with ``return_raw=True`` returns the dict
    ``{W, x, y, communities}`` (``communities == nb_clusters`` marks pattern nodes).
    """
    sizes = _community_sizes(rng, params)
    c = np.repeat(np.arange(params.nb_clusters), sizes)
    W = _block_model(rng, c, params.p, params.q)
    u = rng.integers(0, params.vocab_size, size=c.shape[0])
    # attach the pattern: each (pattern node, SBM node) pair with prob. q_pattern
    n, n0 = W.shape[0], W0.shape[0]
    V = rng.random((n0, n)) < params.q_pattern
    W = np.block([[W, V.T], [V, W0]])
    c = np.concatenate([c, np.full(n0, params.nb_clusters)])
    u = np.concatenate([u, u0])
    # shuffle the node order
    idx = rng.permutation(W.shape[0])
    W = W[idx][:, idx]
    c = c[idx]
    u = u[idx]
    y = (c == params.nb_clusters).astype(np.int64)
    if return_raw:
        return {"W": W, "x": u, "y": y, "communities": c}
    return _to_data(W, u, y)


def generate_cluster_graph(rng: np.random.Generator, params: SBMParams = CLUSTER_PARAMS,
                           return_raw: bool = False):
    """One CLUSTER graph: ``x`` is 0 except one seed node per community with ``r + 1``."""
    sizes = _community_sizes(rng, params)
    c = np.repeat(np.arange(params.nb_clusters), sizes)
    W = _block_model(rng, c, params.p, params.q)
    idx = rng.permutation(W.shape[0])
    W = W[idx][:, idx]
    c = c[idx]
    u = np.zeros(c.shape[0], dtype=np.int64)
    for r in range(params.nb_clusters):
        members = np.flatnonzero(c == r)
        u[members[rng.integers(members.shape[0])]] = r + 1
    if return_raw:
        return {"W": W, "x": u, "y": c.copy(), "communities": c}
    return _to_data(W, u, c)


def generate_split(name: str, split: str, num_graphs: int, seed: int = 0,
                   params: Optional[SBMParams] = None) -> list:
    """``num_graphs`` graphs of ``split`` ('train', 'val' or 'test') as a list of ``Data``.

    For PATTERN the graphs of a split are spread over the pattern instances in
    contiguous blocks (instance ``k * P // num_graphs`` for graph ``k``), as the
    original generated 100 train / 20 val / 20 test graphs per instance.
    """
    name = name.upper()
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    s = SPLITS.index(split)
    if name == "PATTERN":
        params = params or PATTERN_PARAMS
        P = params.num_patterns
        cache: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        out = []
        for k in range(num_graphs):
            inst = (k * P) // max(num_graphs, 1)
            if inst not in cache:
                cache[inst] = _pattern_instance(seed, inst, params)
            W0, u0 = cache[inst]
            out.append(generate_pattern_graph(np.random.default_rng([seed, 1 + s, k]),
                                              W0, u0, params))
        return out
    if name == "CLUSTER":
        params = params or CLUSTER_PARAMS
        return [generate_cluster_graph(np.random.default_rng([seed, 1 + s, k]), params)
                for k in range(num_graphs)]
    raise ValueError(f"unknown SBM data set {name!r}; choose PATTERN or CLUSTER")


def pattern_like_batch(num_graphs: int = 128, seed: int = 0):
    """A single :class:`torch_geometric.data.Batch` of ``num_graphs`` PATTERN graphs.

    Uses the PATTERN procedure above (training-split graphs of ``seed``), so 128
    graphs have roughly 128 x 118 ~ 15k nodes and ~0.75-0.8M directed edges
    (no self-loops).  Handy as a realistic mini-batch for benchmarks.
    """
    from torch_geometric.data import Batch
    if num_graphs < 1:
        raise ValueError("num_graphs must be >= 1")
    return Batch.from_data_list(generate_split("PATTERN", "train", num_graphs, seed=seed))


# ----------------------------------------------------------------------------
# InMemoryDataset wrapper
# ----------------------------------------------------------------------------
class SBMDataset(InMemoryDataset):
    r"""Generated PATTERN / CLUSTER split as a PyG ``InMemoryDataset``.

    Args:
        root: directory; files go to ``root/generated/<NAME>/processed``.
        name: ``"PATTERN"`` or ``"CLUSTER"``.
        split: ``"train"``, ``"val"`` or ``"test"``.
        seed: generator seed (the data set, not the training run).
        sizes: ``(num_train, num_val, num_test)``; defaults to the original
            sizes (PATTERN 10000/2000/2000, CLUSTER 10000/1000/1000).
        force_reload: regenerate even when the cache files exist.
        log_fn: called with a one-line message when the splits are generated
            and when an unreadable cache file is regenerated (default: the
            latter as a :class:`RuntimeWarning`, the former silently).

    The three splits are generated together on first use and cached; the
    file names encode seed and sizes, so different settings never collide.
    ``pre_transform`` / ``pre_filter`` are applied when the cache is written
    (pass ``force_reload=True`` after changing them).

    The cache survives interrupted runs: every file is written to a temporary
    file and renamed into place (:func:`pyg_dfgnn.data.cache.atomic_write`),
    so a killed generation leaves no truncated cache file, and a cache file
    that cannot be read anyway (truncated by an older version, corrupted on
    disk) is treated as absent: it is regenerated and ``log_fn`` says so.
    """

    def __init__(self, root: str, name: str = "PATTERN", split: str = "train",
                 seed: int = 0, sizes: Optional[Sequence[int]] = None,
                 transform=None, pre_transform=None, pre_filter=None,
                 force_reload: bool = False, log: bool = False,
                 log_fn: Optional[Callable[[str], None]] = None):
        self.name = name.upper()
        if self.name not in DEFAULT_SIZES:
            raise ValueError(f"unknown SBM data set {name!r}; choose PATTERN or CLUSTER")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.split = split
        self.seed = int(seed)
        sizes = tuple(DEFAULT_SIZES[self.name] if sizes is None else sizes)
        if len(sizes) != 3 or any(int(v) < 0 for v in sizes):
            raise ValueError(f"sizes must be three non-negative ints, got {sizes!r}")
        self.sizes = tuple(int(v) for v in sizes)
        self.log_fn = log_fn
        #: True when this instance (re)generated the cache files
        self.generated = False
        from .cache import short_error
        # no ``process`` method: PyG's own processing writes its files in place
        # (a kill leaves them truncated), so the cache is handled below
        super().__init__(root, transform, pre_transform, pre_filter,
                         force_reload=force_reload, log=log)
        path = self.processed_paths[SPLITS.index(split)]
        if force_reload or not all(osp.isfile(p) for p in self.processed_paths):
            self._generate()
        try:
            self.load(path)
        except Exception as e:  # truncated / corrupt file: treat the cache as absent
            if self.generated:
                raise
            self._notify(f"the cached {self.name} split file {path} is unreadable "
                         f"({short_error(e)}); regenerating it", warn=True)
            self._generate((split,))
            self.load(path)

    def _notify(self, msg: str, warn: bool = False) -> None:
        if self.log_fn is not None:
            self.log_fn(msg)
        elif warn:
            warnings.warn(msg, RuntimeWarning, stacklevel=3)

    @property
    def raw_file_names(self) -> List[str]:
        return []

    @property
    def processed_dir(self) -> str:
        return osp.join(self.root, "generated", self.name, "processed")

    @property
    def processed_file_names(self) -> List[str]:
        tag = f"seed{self.seed}_n{self.sizes[0]}-{self.sizes[1]}-{self.sizes[2]}_v1"
        return [f"{s}_{tag}.pt" for s in SPLITS]

    def _generate(self, splits: Sequence[str] = SPLITS) -> None:
        """Generate ``splits`` (each independent of the others) and write each cache
        file atomically."""
        from .cache import atomic_torch_save
        what = "" if tuple(splits) == SPLITS else f"the {'/'.join(splits)} split of "
        self._notify(f"generating {what}{self.name} with the built-in SBM generator "
                     f"(seed={self.seed}, {self.sizes[0]}/{self.sizes[1]}/{self.sizes[2]} "
                     f"graphs) into {self.processed_dir} ...")
        os.makedirs(self.processed_dir, exist_ok=True)
        for s, n in zip(SPLITS, self.sizes):
            if s not in splits:
                continue
            data_list = generate_split(self.name, s, n, seed=self.seed)
            if self.pre_filter is not None:
                data_list = [d for d in data_list if self.pre_filter(d)]
            if self.pre_transform is not None:
                data_list = [self.pre_transform(d) for d in data_list]
            atomic_torch_save(data_list, self.processed_paths[SPLITS.index(s)],
                              save=self.save)
        self.generated = True

    def __repr__(self) -> str:
        return f"SBMDataset({self.name}, split={self.split}, n={len(self)}, seed={self.seed})"
