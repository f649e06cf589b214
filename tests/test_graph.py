"""Graph adapter: every PyG adjacency -> the same destination-major CSR."""
import pytest
import torch

from pyg_dfgnn import graph as G


def _edges(ns=7, nd=5, E=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, ns, (E,), generator=g),
                        torch.randint(0, nd, (E,), generator=g)])


def _as_set(g: G.CSRGraph):
    """{(src, dst, original edge id)} of a CSRGraph, checking its invariants."""
    E = g.num_edges
    rows = g.row_index().long()
    perm = g.perm.long() if g.perm is not None else torch.arange(E)
    assert g.rowptr[0] == 0 and int(g.rowptr[-1]) == E
    assert (g.rowptr[1:] >= g.rowptr[:-1]).all()
    # transpose: t_perm maps to CSR positions of the same edges, grouped by source
    tp = g.t_perm.long()
    assert sorted(tp.tolist()) == list(range(E))
    assert torch.equal(g.t_col.long(), rows[tp])
    t_src = torch.repeat_interleave(torch.arange(g.num_src), (g.t_rowptr[1:] - g.t_rowptr[:-1]).long())
    assert torch.equal(t_src, g.col.long()[tp])
    return sorted(zip(g.col.long().tolist(), rows.tolist(), perm.tolist()))


def test_edge_index_to_csr_keeps_original_ids():
    ei = _edges()
    g = G.build_graph(ei, (7, 5))
    got = _as_set(g)
    want = sorted((int(s), int(d), i) for i, (s, d) in enumerate(ei.t().tolist()))
    assert got == want
    assert g.index_dtype == torch.int32
    assert g.max_in_degree == int(torch.bincount(ei[1], minlength=5).max())


def test_all_formats_agree():
    ei = _edges(6, 6, 25)
    key = torch.unique(ei[1] * 10 + ei[0])          # distinct, sorted by (dst, src)
    ei = torch.stack([key % 10, key // 10])
    ref = [(s, d) for s, d, _ in _as_set(G.build_graph(ei, (6, 6)))]
    adj = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]), torch.ones(ei.size(1)), (6, 6))
    for a in (adj, adj.to_sparse_csr(), adj.to_sparse_csc()):
        g = G.build_graph(a)
        assert [(s, d) for s, d, _ in _as_set(g)] == ref
    from torch_geometric import EdgeIndex
    e = EdgeIndex(ei, sparse_size=(6, 6), sort_order="col")
    assert [(s, d) for s, d, _ in _as_set(G.build_graph(e))] == ref
    try:
        from torch_sparse import SparseTensor
    except ImportError:
        return
    st = SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(6, 6))
    g = G.build_graph(st)
    assert g.perm is None and [(s, d) for s, d, _ in _as_set(g)] == ref


def test_bipartite_and_empty():
    g = G.build_graph(_edges(9, 3, 15), (9, 3))
    assert (g.num_src, g.num_dst) == (9, 3) and g.t_rowptr.numel() == 10
    g = G.build_graph(torch.zeros(2, 0, dtype=torch.long), (4, 2))
    assert g.num_edges == 0 and g.max_in_degree == 0 and g.rowptr.tolist() == [0, 0, 0]


@pytest.mark.parametrize("bad,msg", [
    (torch.tensor([[0, 9], [1, 2]]), "source"),
    (torch.tensor([[0, 1], [1, 7]]), "target"),
    (torch.tensor([[0, -1], [1, 2]]), "negative"),
    (torch.tensor([[0.0, 1.0], [1.0, 2.0]]), "integer"),
    (torch.tensor([0, 1, 2]), "shape"),
])
def test_bad_edge_index_raises(bad, msg):
    with pytest.raises(ValueError, match=msg):
        G.build_graph(bad, (5, 5))


def test_bad_types_raise():
    with pytest.raises(ValueError, match="edge_index"):
        G.build_graph([[0, 1], [1, 0]], (2, 2))


def test_cache_hits_and_invalidation():
    G.clear_cache()
    ei = _edges()
    g1 = G.get_graph(ei, (7, 5))
    assert G.get_graph(ei, (7, 5)) is g1
    assert G.cache_info()["hits"] == 1
    assert G.get_graph(ei, (7, 6)) is not g1          # other sizes, other entry
    ei[0, 0] = (ei[0, 0] + 1) % 7                     # in-place change bumps the version
    g2 = G.get_graph(ei, (7, 5))
    assert g2 is not g1
    assert _as_set(g2)[0] is not None
    del ei
    import gc
    gc.collect()
    assert G.cache_info()["entries"] == 0             # entries die with the adjacency


def test_self_loops_follow_pyg_order():
    from torch_geometric.utils import add_self_loops, remove_self_loops
    ei = torch.tensor([[0, 1, 1, 2], [1, 1, 0, 2]])
    g = G.get_graph(ei, (3, 3), self_loops=3)
    ref, _ = add_self_loops(remove_self_loops(ei)[0], num_nodes=3)
    want = sorted((int(s), int(d), i) for i, (s, d) in enumerate(ref.t().tolist()))
    assert _as_set(g) == want
