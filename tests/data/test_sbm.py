"""The built-in PATTERN / CLUSTER generator: determinism, statistics, dataset wrapper."""
import numpy as np
import pytest
import torch

from pyg_dfgnn.data import (CLUSTER_PARAMS, PATTERN_PARAMS, SBMDataset, generate_cluster_graph,
                            generate_pattern_graph, generate_split, pattern_like_batch)
from pyg_dfgnn.data.sbm import _pattern_instance


def _same(a, b):
    return (torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
            and torch.equal(a.edge_index, b.edge_index))


def _densities(raw, nb):
    """Observed edge densities: intra-community, inter-community (SBM part),
    pattern <-> SBM, inside the pattern."""
    W, c = raw["W"], raw["communities"]
    n = len(c)
    off = ~np.eye(n, dtype=bool)
    same = (c[:, None] == c[None, :]) & off
    sbm = c < nb
    masks = [same & sbm[:, None] & sbm[None, :],
             ~same & off & sbm[:, None] & sbm[None, :],
             sbm[:, None] & ~sbm[None, :],
             same & ~sbm[:, None]]
    return [(W[m].sum(), m.sum()) for m in masks]


def test_generate_split_is_deterministic():
    for name in ("PATTERN", "CLUSTER"):
        a = generate_split(name, "train", 12, seed=3)
        b = generate_split(name, "train", 12, seed=3)
        c = generate_split(name, "train", 12, seed=4)
        assert all(_same(x, y) for x, y in zip(a, b))
        assert not all(_same(x, y) for x, y in zip(a, c))


def test_graph_does_not_depend_on_other_split_sizes():
    # graph k of a split is drawn from its own stream (and the same pattern instance
    # when the number of graphs per instance is the same)
    a = generate_split("CLUSTER", "val", 5, seed=0)
    b = generate_split("CLUSTER", "val", 9, seed=0)
    assert all(_same(x, y) for x, y in zip(a, b[:5]))
    t = generate_split("CLUSTER", "test", 5, seed=0)
    assert not any(_same(x, y) for x, y in zip(a, t))


def test_pattern_graph_structure_and_statistics():
    p = PATTERN_PARAMS
    counts = np.zeros((4, 2))
    for k in range(120):
        W0, u0 = _pattern_instance(0, k % 10, p)
        assert p.size_subgraph_min <= len(u0) < p.size_subgraph_max
        raw = generate_pattern_graph(np.random.default_rng([0, 1, k]), W0, u0, p,
                                     return_raw=True)
        W, x, y, c = raw["W"], raw["x"], raw["y"], raw["communities"]
        sizes = np.bincount(c, minlength=p.nb_clusters + 1)
        assert ((sizes[:p.nb_clusters] >= p.size_min) & (sizes[:p.nb_clusters] < p.size_max)).all()
        assert sizes[p.nb_clusters] == len(u0)
        assert (W == W.T).all() and not W.diagonal().any()
        assert set(np.unique(x)) <= {0, 1, 2}
        # target marks exactly the pattern nodes, which carry the instance's signal u0
        assert (y == (c == p.nb_clusters)).all() and y.sum() == len(u0)
        assert sorted(x[y == 1].tolist()) == sorted(u0.tolist())
        # the planted pattern is the same graph W0 (up to the node shuffle)
        pat = np.flatnonzero(y == 1)
        assert W[np.ix_(pat, pat)].sum() == W0.sum()
        for i, (e, n) in enumerate(_densities(raw, p.nb_clusters)):
            counts[i] += (e, n)
    intra, inter, cross, inside = counts[:, 0] / counts[:, 1]
    assert abs(intra - p.p) < 0.02
    assert abs(inter - p.q) < 0.02
    assert abs(cross - p.q_pattern) < 0.02
    assert abs(inside - p.p_pattern) < 0.03


def test_cluster_graph_structure_and_statistics():
    p = CLUSTER_PARAMS
    counts = np.zeros((2, 2))
    for k in range(80):
        raw = generate_cluster_graph(np.random.default_rng([1, 1, k]), p, return_raw=True)
        W, x, y, c = raw["W"], raw["x"], raw["y"], raw["communities"]
        sizes = np.bincount(c, minlength=p.nb_clusters)
        assert len(sizes) == p.nb_clusters
        assert ((sizes >= p.size_min) & (sizes < p.size_max)).all()
        assert (y == c).all() and set(np.unique(y)) == set(range(p.nb_clusters))
        # exactly one labelled seed node per community, carrying community + 1
        seeds = np.flatnonzero(x > 0)
        assert len(seeds) == p.nb_clusters
        assert sorted((x[seeds] - 1).tolist()) == list(range(p.nb_clusters))
        assert (x[seeds] - 1 == c[seeds]).all()
        assert (W == W.T).all() and not W.diagonal().any()
        for i, (e, n) in enumerate(_densities(raw, p.nb_clusters + 1)[:2]):
            counts[i] += (e, n)
    intra, inter = counts[:, 0] / counts[:, 1]
    assert abs(intra - p.p) < 0.02
    assert abs(inter - p.q) < 0.02


def test_data_objects_look_like_gnnbenchmark():
    d = generate_split("PATTERN", "train", 1, seed=0)[0]
    assert d.x.dtype == torch.long and d.x.dim() == 1 and d.x.numel() == d.num_nodes
    assert d.y.dtype == torch.long and d.y.shape == d.x.shape
    ei = d.edge_index
    assert ei.dtype == torch.long and ei.size(0) == 2
    assert not (ei[0] == ei[1]).any()
    # undirected: every edge is listed in both directions
    fwd = set(map(tuple, ei.t().tolist()))
    assert fwd == {(j, i) for i, j in fwd}


def test_pattern_like_batch():
    b = pattern_like_batch(128, seed=0)
    assert b.num_graphs == 128
    # ~118 nodes and ~6k directed edges per graph (PyG's PATTERN: 118.9 / 6098.9)
    assert 110 * 128 < b.num_nodes < 128 * 128
    assert 650_000 < b.num_edges < 900_000
    b2 = pattern_like_batch(128, seed=0)
    assert torch.equal(b.edge_index, b2.edge_index) and torch.equal(b.x, b2.x)
    assert int(b.y.sum()) > 0
    with pytest.raises(ValueError):
        pattern_like_batch(0)


def test_sbm_dataset_generates_caches_and_reloads(tmp_path):
    ds = SBMDataset(str(tmp_path), "CLUSTER", split="val", seed=5, sizes=(6, 4, 3))
    assert len(ds) == 4
    files = sorted(p.name for p in (tmp_path / "generated" / "CLUSTER" / "processed").iterdir()
                   if p.name.startswith(("train", "val", "test")))
    assert files == ["test_seed5_n6-4-3_v1.pt", "train_seed5_n6-4-3_v1.pt",
                     "val_seed5_n6-4-3_v1.pt"]
    again = SBMDataset(str(tmp_path), "CLUSTER", split="val", seed=5, sizes=(6, 4, 3))
    ref = generate_split("CLUSTER", "val", 4, seed=5)
    for a, b, r in zip(ds, again, ref):
        assert _same(a, b) and _same(a, r)
    test = SBMDataset(str(tmp_path), "CLUSTER", split="test", seed=5, sizes=(6, 4, 3))
    assert len(test) == 3
    with pytest.raises(ValueError):
        SBMDataset(str(tmp_path), "ZINC")
