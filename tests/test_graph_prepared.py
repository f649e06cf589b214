"""Prepared graphs (pyg_dfgnn.data.PrepareGraphs + pyg_dfgnn.graph.attach): equal to
the layers' own conversion, hit by every layer, same outputs and gradients, bad
input still a clear ValueError."""
import copy

import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_dfgnn import graph as G
from pyg_dfgnn.data import PREPARED_KEY, PrepareGraphs, attach_prepared, prepare_graph
from pyg_dfgnn.nn import AGNNConv, GATConv, GATv2Conv, TransformerConv

HAS_CUDA = torch.cuda.is_available()
DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
               not HAS_CUDA, reason="needs a CUDA GPU")])]

CSR_FIELDS = ("rowptr", "col", "perm", "t_rowptr", "t_col", "t_perm")


def _batch(num_graphs=3, seed=0, loops=True):
    """A PyG batch of small random graphs (unsorted edges, some self-loops and
    duplicate edges, one isolated node per graph)."""
    g = torch.Generator().manual_seed(seed)
    data = []
    for i in range(num_graphs):
        n = 5 + 3 * i
        e = 4 * n
        ei = torch.randint(0, n - 1, (2, e), generator=g)  # node n-1 is isolated
        if loops:
            ei[:, :2] = torch.tensor([[0, 1], [0, 1]])
        data.append(Data(x=torch.randn(n, 6, generator=g, dtype=torch.float64), edge_index=ei))
    return Batch.from_data_list(data)


def _fresh(edge_index, n, loops):
    """The layers' own conversion, on a different object (no cache involved)."""
    ei = edge_index.clone()
    return G.get_graph(ei, (n, n), n if loops else None)


def _same_graph(a, b):
    for f in CSR_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y), f
    for f in ("num_src", "num_dst", "max_in_degree", "max_out_degree"):
        assert getattr(a, f) == getattr(b, f), f


@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("sorted_", [False, True])
def test_prepared_equals_fresh_conversion(loops, sorted_):
    b = _batch()
    if sorted_:  # destination-sorted input: perm is None on both sides
        b.edge_index = b.edge_index[:, torch.argsort(b.edge_index[1], stable=True)]
    n = b.num_nodes
    p = prepare_graph(b.edge_index, n, loops)
    fresh = _fresh(b.edge_index, n, loops)
    _same_graph(p.to_graph(), fresh)
    assert (p.perm is None) == sorted_ or loops
    assert p.self_loops == (n if loops else None)
    assert torch.equal(p.fingerprint, G.content_hash(b.edge_index))


def test_prepare_graphs_transform_and_attach_hits_cache():
    G.clear_cache()
    b = PrepareGraphs((False, True))(_batch())
    assert [p.self_loops for p in b[PREPARED_KEY]] == [None, b.num_nodes]
    attach_prepared(b)
    n = b.num_nodes
    for loops in (False, True):
        g = G.get_graph(b.edge_index, (n, n), n if loops else None)
        _same_graph(g, _fresh(b.edge_index, n, loops))
    info = G.cache_info()
    # the two lookups on b.edge_index hit; the fingerprints carried from the
    # preparation match the CPU hits' re-computed ones (no stale refusal)
    assert info["hits"] == 2 and info["stale"] == 0
    assert info["misses"] == 2  # the two _fresh() conversions of the clones


def _models():
    torch.manual_seed(0)
    return {
        "gat": (torch.nn.ModuleList([GATConv(6, 4, heads=2), GATConv(8, 3, heads=1)]), True),
        "gatv2": (torch.nn.ModuleList([GATv2Conv(6, 4, heads=2), GATv2Conv(8, 3)]), True),
        "agnn": (torch.nn.ModuleList([AGNNConv(), AGNNConv(requires_grad=False)]), True),
        "gt": (torch.nn.ModuleList([TransformerConv(6, 4, heads=2),
                                    TransformerConv(8, 3, heads=1)]), False),
        "gat_no_loops": (torch.nn.ModuleList([GATConv(6, 4, heads=2, add_self_loops=False),
                                              GATConv(8, 3, add_self_loops=False)]), False),
        # the paper configs' widths (8 x 10: padded in half precision)
        "gt_8x10": (torch.nn.ModuleList([TransformerConv(6, 10, heads=8),
                                         TransformerConv(80, 10, heads=8)]), False),
        "gatv2_8x10": (torch.nn.ModuleList([GATv2Conv(6, 10, heads=8),
                                            GATv2Conv(80, 10, heads=8)]), True),
        "gat_8x19": (torch.nn.ModuleList([GATConv(6, 19, heads=8),
                                          GATConv(152, 19, heads=8)]), True),
    }


def _run(convs, x, edge_index):
    h = x
    for conv in convs:
        h = torch.nn.functional.elu(conv(h, edge_index))
    h.square().sum().backward()
    return h.detach(), [p.grad.clone() for p in convs.parameters() if p.grad is not None]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gat", "gatv2", "agnn", "gt", "gat_no_loops"])
def test_layers_on_prepared_batch_match(name, device):
    convs, loops = _models()[name]
    convs = convs.double().to(device)
    ref_convs = copy.deepcopy(convs)
    b = _batch(seed=1)
    x = b.x.to(device).requires_grad_()
    # without preparation: the layers convert the graph themselves
    G.clear_cache()
    expect, expect_grads = _run(ref_convs, x, b.edge_index.clone().to(device))
    expect_xgrad = x.grad.clone()
    x.grad = None
    # prepared on the CPU (as in a DataLoader worker), moved, attached
    G.clear_cache()
    pb = PrepareGraphs(loops)(b).to(device)
    attach_prepared(pb)
    out, grads = _run(convs, x, pb.edge_index)
    info = G.cache_info()
    assert info["misses"] == 0, info          # no layer converted the graph
    assert info["hits"] == len(convs) and info["stale"] == 0, info
    # identical CSR -> identical computation: bitwise equal on the CPU; on CUDA the
    # float64 path's scatter-adds (atomics) sum in a varying order, so a few
    # float64 roundoffs
    tol = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(out, expect, **tol)
    torch.testing.assert_close(x.grad, expect_xgrad, **tol)
    assert len(grads) == len(expect_grads)
    for a, e in zip(grads, expect_grads):
        torch.testing.assert_close(a, e, **tol)


def test_changed_edge_index_after_attach_is_not_served_stale():
    """An edge_index written in place behind the version counter after attach: the
    CPU hit's fingerprint differs from the carried one -> rebuilt, not stale."""
    G.clear_cache()
    b = attach_prepared(PrepareGraphs(True)(_batch()))
    n = b.num_nodes
    b.edge_index.data[0, 5] = n - 1  # bypasses the version counter
    g = G.get_graph(b.edge_index, (n, n), n)
    assert G.cache_info()["stale"] == 1
    _same_graph(g, _fresh(b.edge_index, n, True))


def test_bad_batch_raises_the_clear_value_error():
    b = _batch()
    b.edge_index[1, 3] = b.num_nodes + 7
    with pytest.raises(ValueError, match=r"'edge_index' contains target index \d+, out of "
                                         r"range for \d+ target nodes"):
        PrepareGraphs(True)(b)
    with pytest.raises(ValueError, match="'edge_index' contains target index"):
        PrepareGraphs(False)(b)
    b.edge_index = b.edge_index.float()
    with pytest.raises(ValueError, match="'edge_index' must be an integer tensor"):
        PrepareGraphs(False)(b)


def test_attach_checks_its_arguments():
    b = _batch()
    n = b.num_nodes
    p = prepare_graph(b.edge_index, n, False)
    other = _batch(num_graphs=2)
    with pytest.raises(ValueError, match="was not prepared from this edge_index"):
        G.attach(other.edge_index, p.to_graph(), (n, n))
    with pytest.raises(ValueError, match="'size'"):
        G.attach(b.edge_index, p.to_graph(), (n + 1, n))
    with pytest.raises(ValueError, match="'graph' must be a pyg_dfgnn.graph.CSRGraph"):
        G.attach(b.edge_index, p)
    with pytest.raises(ValueError, match="edge_index tensor"):
        G.attach(b.edge_index.to_sparse(), p.to_graph())
    # prepared graphs left on another device than the batch's edge_index
    pb = PrepareGraphs(False)(b)
    pb[PREPARED_KEY] = [q._replace(**{f: getattr(q, f).to("meta") for f in CSR_FIELDS
                                      if getattr(q, f) is not None})
                        for q in pb[PREPARED_KEY]]
    with pytest.raises(ValueError, match=r"'batch': its prepared graphs are on meta"):
        attach_prepared(pb)
    with pytest.raises(ValueError, match="'self_loops'"):
        PrepareGraphs([])


def test_batch_without_prepared_graphs_is_unchanged():
    b = _batch()
    assert attach_prepared(b) is b


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["gat", "gt", "agnn", "gt_8x10", "gatv2_8x10", "gat_8x19"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attach_and_layers_on_cuda_do_not_sync(name, dtype):
    """Issue 12: once the graph is prepared, neither attaching it nor a layer's
    forward + backward synchronises the host with the GPU, in fp32 and in bf16
    (whose 8 x 10 calls take the padded projections)."""
    convs, loops = _models()[name]
    convs = convs.to("cuda", dtype)
    pb = PrepareGraphs(loops)(_batch(seed=2)).pin_memory()
    x = pb.x.to("cuda", dtype).requires_grad_()
    _run(convs, x, attach_prepared(pb.to("cuda")).edge_index)   # warm-up (plans, lazy init)
    G.clear_cache()
    pb = PrepareGraphs(loops)(_batch(seed=3)).pin_memory()
    x = pb.x.to("cuda", dtype).requires_grad_()
    torch.cuda.synchronize()
    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batch = attach_prepared(pb.to("cuda", non_blocking=True))
        h = x
        for conv in convs:
            h = torch.nn.functional.elu(conv(h, batch.edge_index))
        h.square().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(old)
    assert G.cache_info()["misses"] == 0
