"""PreparedDataLoader: graphs prepared in DataLoader worker processes."""
import pytest
import torch
from torch_geometric.loader import DataLoader

from pyg_dfgnn import graph as G
from pyg_dfgnn.data import (PREPARED_KEY, PreparedDataLoader, PrepareGraphs, attach_prepared,
                            generate_split)


@pytest.fixture(scope="module")
def graphs():
    return generate_split("PATTERN", "train", 8, seed=0)


def test_loader_with_two_workers_carries_prepared_graphs(graphs):
    plain = list(DataLoader(graphs, batch_size=3))
    loader = PreparedDataLoader(graphs, batch_size=3, num_workers=2,
                                prepare=PrepareGraphs((False, True)))
    batches = list(loader)
    assert len(batches) == len(plain) == 3
    G.clear_cache()
    for b, ref in zip(batches, plain):
        assert torch.equal(b.edge_index, ref.edge_index)
        n = b.num_nodes
        views = b[PREPARED_KEY]
        assert [p.self_loops for p in views] == [None, n]
        attach_prepared(b)
        for p in views:
            g = G.get_graph(b.edge_index, (n, n), p.self_loops)
            fresh = G.build_graph(ref.edge_index, (n, n)) if p.self_loops is None else \
                G._with_self_loops(ref.edge_index, n, n, n)
            for f in ("rowptr", "col", "perm", "t_rowptr", "t_col", "t_perm"):
                a, e = getattr(g, f), getattr(fresh, f)
                assert (a is None) == (e is None) and (a is None or torch.equal(a, e)), f
            assert (g.max_in_degree, g.max_out_degree) == (fresh.max_in_degree,
                                                           fresh.max_out_degree)
    info = G.cache_info()
    assert info["hits"] == 2 * len(batches) and info["misses"] == 0 and info["stale"] == 0


def test_bad_graph_in_a_worker_raises_the_clear_value_error(graphs):
    bad = [d.clone() for d in graphs[:4]]
    bad[2].edge_index[0, 0] = 10_000   # out of range after batching too
    loader = PreparedDataLoader(bad, batch_size=4, num_workers=2, prepare=PrepareGraphs(True))
    with pytest.raises(ValueError, match=r"'edge_index' contains source index \d+, out of "
                                         r"range for \d+ source nodes"):
        list(loader)


def test_loader_checks_prepare(graphs):
    with pytest.raises(ValueError, match="'prepare' must be a pyg_dfgnn.data.PrepareGraphs"):
        PreparedDataLoader(graphs, prepare=True)
