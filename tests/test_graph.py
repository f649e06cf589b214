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


# --------------------------------------------------------------------------- #
# writes the version counter does not see (issue 14, item 1)
# --------------------------------------------------------------------------- #

def _mutators():
    def data(ei):
        ei.data[1, 3] = (ei[1, 3] + 1) % 5

    def numpy_view(ei):
        ei.numpy()[1, 3] = (int(ei[1, 3]) + 1) % 5

    def inference(ei):
        with torch.inference_mode():
            ei[1, 3] = (ei[1, 3] + 1) % 5
    return {"data": data, "numpy": numpy_view, "inference_mode": inference}


@pytest.mark.parametrize("how", list(_mutators()))
@pytest.mark.parametrize("loops", [None, 5])
def test_cache_sees_writes_behind_the_version_counter(how, loops):
    G.clear_cache()
    ei = _edges()
    g1 = G.get_graph(ei, (7, 5), loops)
    assert G.get_graph(ei, (7, 5), loops) is g1
    _mutators()[how](ei)
    g2 = G.get_graph(ei, (7, 5), loops)
    fresh = G.build_graph(ei, (7, 5)) if loops is None else \
        G._with_self_loops(ei, loops, 7, 5)
    assert g2 is not g1 and _as_set(g2) == _as_set(fresh)
    if how != "inference_mode":  # (an inference_mode write bumps the counter)
        assert G.cache_info()["stale"] == 1
    assert G.get_graph(ei, (7, 5), loops) is g2          # and is cached again


def test_cache_of_inference_tensors_and_from_numpy():
    import numpy as np
    G.clear_cache()
    with torch.inference_mode():
        ei = _edges()
        g1 = G.get_graph(ei, (7, 5))
        assert G.get_graph(ei, (7, 5)) is g1
        ei[1, 0] = (ei[1, 0] + 2) % 5                     # no version counter at all
        g2 = G.get_graph(ei, (7, 5))
    assert g2 is not g1 and _as_set(g2) == _as_set(G.build_graph(ei, (7, 5)))
    arr = np.ascontiguousarray(_edges().numpy())
    t = torch.from_numpy(arr)
    g1 = G.get_graph(t, (7, 5))
    arr[0, 2] = (arr[0, 2] + 3) % 7
    g2 = G.get_graph(t, (7, 5))
    assert g2 is not g1 and _as_set(g2) == _as_set(G.build_graph(t, (7, 5)))


def test_cache_of_sparse_adjacency_sees_index_writes():
    ei = _edges(6, 6, 12)
    adj = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]), torch.ones(12), (6, 6))
    csr = adj.coalesce().to_sparse_csr()
    for a in (adj, csr):
        G.clear_cache()
        g1 = G.get_graph(a)
        idx = a._indices() if a.layout == torch.sparse_coo else a.col_indices()
        idx.data[-1] = (idx[-1] + 1) % 6
        g2 = G.get_graph(a)
        assert g2 is not g1 and _as_set(g2) == _as_set(G.build_graph(a))


def test_trusted_skips_the_content_check_but_not_the_version():
    G.clear_cache()
    ei = _edges()
    g1 = G.get_graph(ei, (7, 5), trusted=True)
    ei.data[1, 3] = (ei[1, 3] + 1) % 5
    assert G.get_graph(ei, (7, 5), trusted=True) is g1    # owned objects are not written
    ei[1, 3] = (ei[1, 3] + 1) % 5
    assert G.get_graph(ei, (7, 5), trusted=True) is not g1
    with torch.inference_mode():
        t = _edges()
    g1 = G.get_graph(t, (7, 5), trusted=True)
    assert G.get_graph(t, (7, 5), trusted=True) is g1
    with torch.inference_mode():
        t[1, 3] = (t[1, 3] + 1) % 5
    assert G.get_graph(t, (7, 5), trusted=True) is not g1  # unreadable version: checked


def test_fingerprint_detects_every_single_element_change():
    torch.manual_seed(0)
    for n in (0, 1, 7, G._FP_BLOCK, G._FP_BLOCK * 2 + 5):
        x = torch.randint(-2**40, 2**40, (n,))
        h = int(G._fingerprint(x))
        assert h == int(G._fingerprint(x.clone().int() if n == 0 else x.clone()))
        for i in {0, n // 2, n - 1} if n else ():
            y = x.clone()
            y[i] += 1
            assert int(G._fingerprint(y)) != h
            y[i] = x[i] - 2**62
            assert int(G._fingerprint(y)) != h
        if n > 1:                                         # a transposition
            y = x.clone()
            y[0], y[-1] = x[-1], x[0]
            assert x[0] == x[-1] or int(G._fingerprint(y)) != h
    e = _edges()
    assert int(G._fingerprint(e)) == int(G._fingerprint(e.int()))  # widened exactly


@pytest.mark.parametrize("num_edges", [0, 3])
@pytest.mark.parametrize("sort", [False, True])
def test_edge_index_subclass_gives_plain_tensors_of_one_dtype(num_edges, sort):
    """PyG's EdgeIndex/Index keep their subclass through as_subclass and their
    own dtype through .to(): an empty int32 EdgeIndex gave an int64 column
    (the CUDA op then refused the graph; found by tests/nn/test_fuzz.py)."""
    from torch_geometric import EdgeIndex
    from pyg_dfgnn.graph import clear_cache, get_graph
    ei = EdgeIndex(torch.tensor([[0, 1, 0], [1, 0, 0]], dtype=torch.int32)[:, :num_edges],
                   sparse_size=(2, 2))
    if sort:
        ei = ei.sort_by("col")[0]
    clear_cache()
    g = get_graph(ei, (2, 2))
    ts = [t for t in (g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm) if t is not None]
    assert all(type(t) is torch.Tensor for t in ts)
    assert {t.dtype for t in ts} == {torch.int32}
