"""GraphBatcher / GraphBatchLoader: the batches equal PyG's collated ones (up to
each graph's edge order), the attached CSR views equal the layers' own
conversion, the layers give the same output, and bad input is refused."""
import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader

from pyg_dfgnn import graph as G
from pyg_dfgnn.data import GraphBatcher, GraphBatchLoader, prepare_graph
from pyg_dfgnn.data.sbm import generate_split

#: cuda: marked, so `pytest -m cuda` runs it on a GPU machine (skipped without one)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _graphs(num=12, loops=False, seed=0, edge_attr=False):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(num):
        n = int(torch.randint(1, 9, (1,), generator=g)) if i != 3 else 0
        e = int(torch.randint(0, 20, (1,), generator=g)) if n else 0
        ei = torch.randint(0, max(n, 1), (2, e), generator=g)
        if not loops and e:
            ei = ei[:, ei[0] != ei[1]]
        d = Data(x=torch.randn(n, 5, generator=g), edge_index=ei,
                 y=torch.randint(0, 3, (n,), generator=g), gy=torch.tensor([float(i)]),
                 num_nodes=n)
        if edge_attr:
            d.edge_attr = torch.randn(ei.size(1), 2, generator=g)
        out.append(d)
    return out


def _edge_set(ei, attr=None):
    cols = [ei.cpu()] + ([attr.cpu().t()] if attr is not None else [])
    rows = torch.cat([c.double() for c in cols], 0).t().tolist()
    return sorted(map(tuple, rows))


def _same_graph(a: G.CSRGraph, b: G.CSRGraph):
    for f in ("rowptr", "col", "t_rowptr", "t_col", "t_perm"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype, f
        assert torch.equal(x.cpu(), y.cpu()), f
    pa = a.perm if a.perm is not None else torch.arange(a.num_edges)
    pb = b.perm if b.perm is not None else torch.arange(b.num_edges)
    assert torch.equal(pa.cpu().long(), pb.cpu().long())
    assert (a.num_src, a.num_dst, a.max_in_degree, a.max_out_degree) == \
        (b.num_src, b.num_dst, b.max_in_degree, b.max_out_degree)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loops", [False, True])
def test_batch_matches_pyg_collate(device, loops):
    graphs = _graphs(loops=loops, edge_attr=True)
    store = GraphBatcher(graphs, views=(False, True))
    ids = [5, 0, 3, 7, 7, 2]
    b = store.batch(ids, device)
    ref = Batch.from_data_list([graphs[i] for i in ids])
    assert b.num_graphs == len(ids)
    for k in ("x", "y", "gy", "batch", "ptr"):
        assert torch.equal(b[k].cpu(), ref[k]), k
    assert b.edge_index.dtype == torch.long
    # the same edges (with their features), each graph's in target order
    assert _edge_set(b.edge_index, b.edge_attr) == _edge_set(ref.edge_index, ref.edge_attr)
    dst = b.edge_index[1].cpu()
    assert bool((dst[1:] >= dst[:-1]).all())
    # the attached views equal the layers' own conversion of this edge_index
    N = int(ref.num_nodes)
    for looped in (False, True):
        fresh = prepare_graph(b.edge_index.cpu(), N, looped).to_graph()
        misses = G.cache_info()["misses"]
        hit = G.get_graph(b.edge_index, (N, N), N if looped else None)
        assert G.cache_info()["misses"] == misses  # the attached view, not a conversion
        _same_graph(hit, fresh)


def test_pattern_batches_and_loader_grouping():
    graphs = generate_split("PATTERN", "train", 6, seed=0)
    store = GraphBatcher(graphs, views=(True,))
    sampler = torch.utils.data.RandomSampler(graphs,
                                             generator=torch.Generator().manual_seed(3))
    ours = [b.ptr.numel() - 1 for b in GraphBatchLoader(store, 4, sampler=sampler)]
    sampler = torch.utils.data.RandomSampler(graphs,
                                             generator=torch.Generator().manual_seed(3))
    theirs = list(DataLoader(graphs, 4, sampler=sampler))
    assert ours == [b.num_graphs for b in theirs]
    sampler = torch.utils.data.RandomSampler(graphs,
                                             generator=torch.Generator().manual_seed(3))
    for b, r in zip(GraphBatchLoader(store, 4, sampler=sampler), theirs):
        assert torch.equal(b.y, r.y) and torch.equal(b.x, r.x)
        assert _edge_set(b.edge_index) == _edge_set(r.edge_index)
    assert len(GraphBatchLoader(store, 4, drop_last=True)) == 1
    assert len(list(GraphBatchLoader(store, 4))) == 2


@pytest.mark.parametrize("device", DEVICES)
def test_layers_on_batches_match_pyg_batches(device):
    from pyg_dfgnn.nn import GATConv, TransformerConv
    graphs = _graphs(num=10, loops=True)
    store = GraphBatcher(graphs, views=(False, True))
    ids = list(range(10))
    b = store.batch(ids, device)
    ref = Batch.from_data_list(graphs).to(device)
    torch.manual_seed(0)
    for conv in (GATConv(5, 4, heads=2), TransformerConv(5, 4, heads=2)):
        conv = conv.to(device).double()
        misses = G.cache_info()["misses"]
        out = conv(b.x.double(), b.edge_index)
        assert G.cache_info()["misses"] == misses
        want = conv(ref.x.double(), ref.edge_index)
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_bad_input_is_refused():
    graphs = _graphs(num=4)
    bad = graphs[2].clone()
    bad.edge_index = torch.tensor([[0, 9], [1, 0]])
    with pytest.raises(ValueError, match="graph 2: 'edge_index' has a source index 9"):
        GraphBatcher(graphs[:2] + [bad] + graphs[3:])
    bad.edge_index = torch.tensor([[0, 1], [-1, 0]])
    with pytest.raises(ValueError, match="graph 2: 'edge_index' has a target index -1"):
        GraphBatcher(graphs[:2] + [bad] + graphs[3:])
    bad.edge_index = torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"shape \[2, num_edges\]"):
        GraphBatcher(graphs[:2] + [bad] + graphs[3:])
    with pytest.raises(ValueError, match="empty"):
        GraphBatcher([])
    odd = [Data(x=torch.randn(3, 2), edge_index=torch.zeros(2, 0, dtype=torch.long),
                name="a")]
    with pytest.raises(ValueError, match="'name' is a str"):
        GraphBatcher(odd)
    store = GraphBatcher(graphs)
    with pytest.raises(ValueError, match=r"'ids' must be graph indices in \[0, 4\)"):
        store.batch([0, 4])
    with pytest.raises(ValueError, match="'batch_size'"):
        GraphBatchLoader(store, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_edgeless_batches(device):
    graphs = _graphs(num=5)
    store = GraphBatcher(graphs, views=(False, True))
    b = store.batch([3], device)  # the graph with 0 nodes
    assert b.num_nodes == 0 and b.edge_index.shape == (2, 0)
    for looped in (False, True):
        misses = G.cache_info()["misses"]
        g = G.get_graph(b.edge_index, (0, 0), 0 if looped else None)
        assert G.cache_info()["misses"] == misses
        assert g.num_edges == 0 and g.rowptr.tolist() == [0]
    nodes_only = [Data(x=torch.randn(3, 2), edge_index=torch.zeros(2, 0, dtype=torch.long))]
    b = GraphBatcher(nodes_only, views=(False, True)).batch([0, 0], device)
    fresh = prepare_graph(b.edge_index.cpu(), 6, True).to_graph()
    misses = G.cache_info()["misses"]
    _same_graph(G.get_graph(b.edge_index, (6, 6), 6), fresh)
    assert G.cache_info()["misses"] == misses


# ---- _segments: the slices' copy (NumPy for CPU tensors of its dtypes) --------

def _segments_reference(t, starts, ends, dim):
    return torch.cat([t.narrow(dim, int(a), int(b - a)) for a, b in zip(starts, ends)], dim)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.int64, torch.float32,
                                   torch.float16, torch.bool, torch.bfloat16])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("with_out", [False, True])
def test_segments_equal_torch_cat(dtype, dim, with_out):
    from pyg_dfgnn.data.batching import _segments
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(7, 90, generator=g) * 50).to(dtype)
    if dim == 0:
        t = t.t().contiguous()   # [90, 7]: slices of rows
    starts = np.array([0, 10, 10, 47, 80])
    ends = np.array([4, 10, 30, 61, 90])   # (an empty slice among them)
    want = _segments_reference(t, starts, ends, dim)
    if with_out:
        shape = list(t.shape)
        shape[dim] = int((ends - starts).sum()) + 5
        buf = torch.full(shape, 3, dtype=dtype)
        out = buf.narrow(dim, 0, int((ends - starts).sum()))
        got = _segments(t, starts, ends, dim, out=out)
        assert got.data_ptr() == out.data_ptr()
        assert torch.equal(buf.narrow(dim, want.size(dim), 5),
                           torch.full_like(buf.narrow(dim, want.size(dim), 5), 3))
    else:
        got = _segments(t, starts, ends, dim)
    assert got.dtype == dtype and torch.equal(got, want)


def test_segments_out_of_another_dtype_and_bad_slices():
    from pyg_dfgnn.data.batching import _segments
    t = torch.arange(20, dtype=torch.int16)
    out = torch.empty(7, dtype=torch.int32)   # (torch.cat's promotion into a wider out)
    assert torch.equal(_segments(t, np.array([0, 15]), np.array([2, 20]), 0, out=out),
                       torch.tensor([0, 1, 15, 16, 17, 18, 19], dtype=torch.int32))
    with pytest.raises(RuntimeError):   # past the end: torch.narrow's error, not a short copy
        _segments(t, np.array([18]), np.array([25]), 0)
    with pytest.raises(RuntimeError):
        _segments(t, np.array([-1]), np.array([3]), 0)
    empty = _segments(t, np.array([], dtype=np.int64), np.array([], dtype=np.int64), 0)
    assert empty.shape == (0,) and empty.dtype == torch.int16
