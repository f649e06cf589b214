"""Synthetic benchmark graphs: determinism, exact sizes, simple graphs, degrees."""
import pytest
import torch

from pyg_dfgnn.data.synthetic import (graph_stats, in_degree, powerlaw_graph,
                                      powerlaw_in_degrees, uniform_graph)


def _assert_simple_sorted(ei, n, m):
    assert ei.dtype == torch.long and tuple(ei.shape) == (2, m)
    assert int(ei.min()) >= 0 and int(ei.max()) < n
    assert not bool((ei[0] == ei[1]).any()), "self-loops"
    key = ei[0] * n + ei[1]
    assert torch.unique(key).numel() == m, "duplicate edges"
    assert bool((key[1:] > key[:-1]).all()), "not sorted by (source, target)"


def test_uniform_deterministic_and_simple():
    a = uniform_graph(2000, 30000, seed=3)
    b = uniform_graph(2000, 30000, seed=3)
    c = uniform_graph(2000, 30000, seed=4)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    _assert_simple_sorted(a, 2000, 30000)
    deg = in_degree(a, 2000).float()
    assert abs(float(deg.mean()) - 15.0) < 1e-6
    assert float(deg.max()) < 45  # binomial(2000, 15/2000): no hubs


def test_uniform_dense_limit():
    ei = uniform_graph(12, 12 * 11, seed=0)  # the complete directed graph
    _assert_simple_sorted(ei, 12, 132)
    with pytest.raises(ValueError, match="num_edges"):
        uniform_graph(12, 12 * 11 + 1, seed=0)


def test_powerlaw_degree_sequence():
    deg = powerlaw_in_degrees(100_000, 1_400_000, 60_000)
    assert int(deg.sum()) == 1_400_000
    assert int(deg.max()) == 60_000 == int(deg[0])
    assert int((deg > 10_000).sum()) >= 3          # a few super nodes
    assert float(deg.float().median()) < 30        # ... and a light tail
    assert bool((deg[1:] <= 60_000).all())


def test_powerlaw_graph_reaches_max_degree_and_is_deterministic():
    n, m, dmax = 20_000, 200_000, 12_000
    a = powerlaw_graph(n, m, dmax, seed=5)
    b = powerlaw_graph(n, m, dmax, seed=5)
    c = powerlaw_graph(n, m, dmax, seed=6)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    _assert_simple_sorted(a, n, m)
    st = graph_stats(a, n)
    assert st["max_in_degree"] == dmax
    deg = in_degree(a, n).sort(descending=True).values
    assert int(deg[1]) < dmax and int(deg[4]) > 10 * st["mean_in_degree"]  # power-law head
    # the in-degree multiset is exactly the Zipf sequence
    assert torch.equal(deg, powerlaw_in_degrees(n, m, dmax).sort(descending=True).values)


@pytest.mark.parametrize("args", [(10, 20, 10), (10, 5, 6), (10, 200, 9)])
def test_powerlaw_bad_arguments(args):
    with pytest.raises(ValueError):
        powerlaw_graph(*args)
