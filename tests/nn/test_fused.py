"""The shared plumbing (pyg_dfgnn/nn/_fused.py): fallbacks to PyG, warnings,
graph caching, dtypes, TorchScript, autocast."""
import warnings

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.explain.algorithm.utils import clear_masks, set_masks

from pyg_dfgnn import graph as dfgraph
from pyg_dfgnn.nn import AGNNConv, GATConv, GATv2Conv, TransformerConv
from pyg_dfgnn.nn import _fused

from ._equiv import (DEVICES, SPARSE_FORMATS, check_equivalence, feats, make_adj, needs_cuda,
                     random_edge_index)

N, F_IN, E = 12, 8, 40
PAIRS = [(pyg_nn.GATConv, GATConv, dict(in_channels=F_IN, out_channels=4, heads=2)),
         (pyg_nn.GATv2Conv, GATv2Conv, dict(in_channels=F_IN, out_channels=4, heads=2)),
         (pyg_nn.TransformerConv, TransformerConv,
          dict(in_channels=F_IN, out_channels=4, heads=2)),
         (pyg_nn.AGNNConv, AGNNConv, {})]
IDS = ["gat", "gatv2", "transformer", "agnn"]


def _graph():
    return feats(N, F_IN, "cpu"), random_edge_index(N, N, E, seed=11)


@pytest.mark.parametrize("pyg_cls,our_cls,kw", PAIRS, ids=IDS)
def test_fallback_message_hook(pyg_cls, our_cls, kw):
    calls = []

    def prepare(m):
        m.register_message_forward_hook(lambda mod, inp, out: calls.append(1))
    x, ei = _graph()
    check_equivalence(pyg_cls, our_cls, kw, (x, ei), prepare=prepare, fallback="hooks")
    assert len(calls) >= 2  # PyG's and ours (via PyG) both ran the hook


@pytest.mark.parametrize("pyg_cls,our_cls,kw", PAIRS, ids=IDS)
def test_fallback_propagate_hook(pyg_cls, our_cls, kw):
    def prepare(m):
        m.register_propagate_forward_hook(lambda mod, inp, out: out * 2)
    x, ei = _graph()
    check_equivalence(pyg_cls, our_cls, kw, (x, ei), prepare=prepare, fallback="hooks")


@pytest.mark.parametrize("pyg_cls,our_cls,kw", PAIRS[:3], ids=IDS[:3])
def test_fallback_decomposed_layers(pyg_cls, our_cls, kw):
    x, ei = _graph()
    # (TransformerConv: PyG itself swaps in its generic propagate)
    check_equivalence(pyg_cls, our_cls, dict(kw, decomposed_layers=2), (x, ei),
                      fallback=None if our_cls is TransformerConv else "decomposed")


@pytest.mark.parametrize("pyg_cls,our_cls,kw", PAIRS, ids=IDS)
def test_fallback_flow(pyg_cls, our_cls, kw):
    x, ei = _graph()
    check_equivalence(pyg_cls, our_cls, dict(kw, flow="target_to_source"), (x, ei),
                      fallback="flow")


@pytest.mark.parametrize("pyg_cls,our_cls,kw", PAIRS, ids=IDS)
def test_fallback_explain(pyg_cls, our_cls, kw):
    x, ei = _graph()
    mask = torch.rand(E, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def prepare(m):
        set_masks(m, mask, ei, apply_sigmoid=True)
    check_equivalence(pyg_cls, our_cls, kw, (x, ei), prepare=prepare,
                      fallback=None if our_cls is TransformerConv else "explain")


def test_explain_off_again_is_fused():
    x, ei = _graph()

    def prepare(m):
        set_masks(m, torch.rand(E, dtype=torch.float64), ei)
        clear_masks(m)
    check_equivalence(pyg_nn.GATConv, GATConv, PAIRS[0][2], (x, ei), prepare=prepare)


def test_fallback_overridden_message():
    class MyGAT(GATConv):
        def message(self, x_j, alpha):
            return 2 * super().message(x_j, alpha)

    class PyGMyGAT(pyg_nn.GATConv):
        def message(self, x_j, alpha):
            return 2 * super().message(x_j, alpha)
    x, ei = _graph()
    check_equivalence(PyGMyGAT, MyGAT, PAIRS[0][2], (x, ei), fallback="message")


def test_fallback_aggr():
    x, ei = _graph()
    check_equivalence(pyg_nn.GATConv, GATConv, dict(PAIRS[0][2], aggr="max"), (x, ei),
                      fallback="aggr")


def test_fallback_silent_on_cpu_and_warns_once():
    x, ei = _graph()
    conv = GATConv(F_IN, 4, flow="target_to_source").double()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        conv(x, ei)  # CPU: silent
    _fused._WARNED.discard((GATConv, "some reason"))
    with pytest.warns(UserWarning, match="falling back to PyG"):
        _fused._warn_once(GATConv, "some reason")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _fused._warn_once(GATConv, "some reason")  # once only


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fallback_warns_once_on_cuda():
    x, ei = feats(N, F_IN, "cuda"), random_edge_index(N, N, E, device="cuda")
    conv = GATConv(F_IN, 4, flow="target_to_source").cuda().double()
    x = x.double()
    _fused._WARNED.clear()
    with pytest.warns(UserWarning, match="flow"):
        conv(x, ei)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        conv(x, ei)


def test_fallback_reason_dtype():
    conv = GATConv(F_IN, 4)
    assert conv._fused_fallback_reason(torch.zeros(2, 2)) is None
    assert "dtype" in conv._fused_fallback_reason((torch.zeros(2, 2, dtype=torch.int32),
                                                   None))
    conv.train()
    conv.dropout = 1.0
    assert "dropout" in conv._fused_fallback_reason(torch.zeros(2, 2))


@pytest.mark.parametrize("our_cls,kw", [(p[1], p[2]) for p in PAIRS], ids=IDS)
def test_torchscript_raises_clear_error(our_cls, kw):
    model = torch.nn.Sequential(our_cls(**kw))
    with pytest.raises(RuntimeError, match="torch.compile"):
        torch.jit.script(model)


@pytest.mark.parametrize("fmt", ["edge_index", "EdgeIndex_csc", "torch_csr", "SparseTensor"])
@pytest.mark.parametrize("edge_attr", [False, True])
def test_graph_converted_once(fmt, edge_attr):
    """A static graph is converted once, not per call, self-loops included."""
    x = feats(N, F_IN, "cpu").detach()
    adj, ne = make_adj(random_edge_index(N, N, E, seed=12), fmt, N, N)
    ea = torch.randn(ne, 2, dtype=x.dtype) if edge_attr else None
    # PyG refuses self-loops + edge features on sparse adjacencies
    conv = GATConv(F_IN, 4, heads=2, edge_dim=2 if edge_attr else None,
                   add_self_loops=not (edge_attr and fmt in SPARSE_FORMATS)).double()
    conv(x, adj, ea)
    before = dfgraph.cache_info()["misses"]
    for _ in range(3):
        conv(x, adj, ea, return_attention_weights=True)
    assert dfgraph.cache_info()["misses"] == before


def test_common_dtype():
    a = torch.zeros(2, dtype=torch.float32)
    b = torch.zeros(2, dtype=torch.float64)
    h = torch.zeros(2, dtype=torch.bfloat16)
    assert [t.dtype for t in _fused.common_dtype(a, b, None) if t is not None] == \
        [torch.float64] * 2
    assert _fused.common_dtype(a, None)[1] is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert {t.dtype for t in _fused.common_dtype(a, h)} == {torch.bfloat16}
        assert {t.dtype for t in _fused.common_dtype(a, a)} == {torch.float32}
        assert {t.dtype for t in _fused.common_dtype(b, h)} == {torch.float64}


AUTOCAST_DEVICES = [pytest.param("cpu", id="cpu"),
                    pytest.param("cuda", id="cuda", marks=needs_cuda)]


@pytest.mark.parametrize("device", AUTOCAST_DEVICES)
@pytest.mark.parametrize("pyg_cls,our_cls,kw", PAIRS, ids=IDS)
def test_autocast_bf16(device, pyg_cls, our_cls, kw):
    """Under bf16 autocast ours matches PyG's float32 result to bf16 accuracy."""
    kw = dict(kw)
    if "heads" in kw:
        kw["edge_dim"] = 3
    torch.manual_seed(0)
    ref = pyg_cls(**kw).to(device)
    ours = our_cls(**kw).to(device)
    ours.load_state_dict(ref.state_dict())
    ref.eval(), ours.eval()
    x = torch.randn(N, F_IN, device=device)
    ei = random_edge_index(N, N, E, seed=13, device=device)
    args = (x, ei) if "heads" not in kw else (x, ei, torch.randn(E, 3, device=device))
    expect = ref(*args)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = ours(*args)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), expect, rtol=3e-2, atol=3e-2)
    out.float().sum().backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in ours.parameters())


@pytest.mark.parametrize("device", DEVICES)
def test_float32(device):
    """float32 end to end (the dtype models use) against PyG, 1e-5."""
    x = feats(N, F_IN, device, dtype=torch.float32)
    ei = random_edge_index(N, N, E, seed=14, device=device)
    for pyg_cls, our_cls, kw in PAIRS:
        check_equivalence(pyg_cls, our_cls, kw, (x, ei), device=device, dtype=torch.float32)


@pytest.mark.parametrize("pyg_cls,our_cls,kw", PAIRS, ids=IDS)
def test_torch_csc_accepted(pyg_cls, our_cls, kw):
    """PyG's templated propagate rejects CSC tensors; ours accepts them and
    gives PyG's result on the same adjacency in CSR form.  (Self-loops on CSC
    fail in PyG's ``remove_self_loops``, for ours as well.)"""
    if our_cls is not TransformerConv:
        kw = dict(kw, add_self_loops=False)
    x = feats(N, F_IN, "cpu")
    ei = random_edge_index(N, N, E, seed=15)
    csc, _ = make_adj(ei, "torch_csc", N, N)
    csr, _ = make_adj(ei, "torch_csr", N, N)
    torch.manual_seed(0)
    ref = pyg_cls(**kw).double()
    ours = our_cls(**kw).double()
    ours.load_state_dict(ref.state_dict())
    x2 = x.detach().clone().requires_grad_()
    a, b = ref(x, csr), ours(x2, csc)
    torch.testing.assert_close(b, a)
    a.sum().backward()
    b.sum().backward()
    torch.testing.assert_close(x2.grad, x.grad)


@pytest.mark.parametrize("pyg_cls,our_cls,kw", PAIRS, ids=IDS)
def test_deepcopy_and_pickle(pyg_cls, our_cls, kw):
    import copy
    import io
    import pickle
    x, ei = _graph()
    conv = our_cls(**kw).double()
    buf = io.BytesIO()
    torch.save(conv, buf)
    buf.seek(0)
    for other in (copy.deepcopy(conv), pickle.loads(pickle.dumps(conv)),
                  torch.load(buf, weights_only=False)):
        assert type(other) is our_cls
        torch.testing.assert_close(other(x, ei), conv(x, ei))
