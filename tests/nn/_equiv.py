"""Shared harness of the layer tests: random graphs in every adjacency format
PyG accepts, and a forward + backward equivalence check of a PyG layer and
its drop-in replacement with identical weights."""
from __future__ import annotations

import copy
import gc
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import pytest
import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csc_tensor, to_torch_csr_tensor

try:
    from torch_sparse import SparseTensor
except Exception:  # pragma: no cover - optional dependency
    SparseTensor = None

#: exceptions raised alike by PyG and ours (for inspection)
ERRORS: list = []

HAS_CUDA = torch.cuda.is_available()
needs_cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]

#: cpu always; cuda runs the same parametrisation on a GPU machine
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=needs_cuda)]

#: adjacency formats of :func:`make_adj`
FORMATS = ["edge_index", "dst_sorted", "EdgeIndex", "EdgeIndex_csc", "torch_csr",
           "torch_coo", "SparseTensor"]
# (torch_csc: PyG's templated propagate rejects it, ours accepts it -- tested apart)

SPARSE_FORMATS = ("torch_csr", "torch_csc", "torch_coo", "SparseTensor")

# float64 on CPU (the reference ops compute in float64), float32 on CUDA
TOL = {torch.float64: dict(rtol=1e-5, atol=1e-8), torch.float32: dict(rtol=1e-5, atol=1e-5),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def dtype_for(device: str) -> torch.dtype:
    return torch.float64 if device == "cpu" else torch.float32


def random_edge_index(num_src: int, num_dst: int, num_edges: int, seed: int = 0,
                      device: str = "cpu") -> Tensor:
    """Random edges with duplicates, (for square graphs) self-loops and a
    destination node without incoming edges."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_src, (num_edges,), generator=g)
    dst = torch.randint(0, max(num_dst - 1, 1), (num_edges,), generator=g)  # last: in-deg 0
    ei = torch.stack([src, dst])
    if num_edges >= 4:
        ei[:, 1] = ei[:, 0]                     # a duplicate edge
        if num_src == num_dst:
            ei[1, 2] = ei[0, 2]                 # self-loops
            ei[1, 3] = ei[0, 3]
    return ei.to(device)


def make_adj(ei: Tensor, fmt: str, num_src: int, num_dst: int) -> Tuple[Any, int]:
    """``ei`` in format ``fmt``; returns ``(adjacency, number of stored edges)``."""
    if fmt == "edge_index":
        return ei, ei.size(1)
    if fmt == "dst_sorted":
        return ei[:, torch.argsort(ei[1], stable=True)], ei.size(1)
    if fmt == "EdgeIndex":
        return EdgeIndex(ei, sparse_size=(num_src, num_dst)), ei.size(1)
    if fmt == "EdgeIndex_csc":
        return EdgeIndex(ei, sparse_size=(num_src, num_dst)).sort_by("col")[0], ei.size(1)
    if fmt == "torch_csr":
        adj = to_torch_csr_tensor(ei.flip(0), size=(num_dst, num_src))
        return adj, adj._nnz()
    if fmt == "torch_csc":
        adj = to_torch_csc_tensor(ei.flip(0), size=(num_dst, num_src))
        return adj, adj._nnz()
    if fmt == "torch_coo":
        adj = to_torch_coo_tensor(ei.flip(0), size=(num_dst, num_src))
        return adj, adj._nnz()
    if fmt == "SparseTensor":
        if SparseTensor is None:
            pytest.skip("torch_sparse is not installed")
        adj = SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(num_dst, num_src))
        return adj, adj.nnz()
    raise ValueError(fmt)


# --------------------------------------------------------------------------- #
# comparison
# --------------------------------------------------------------------------- #

def _clone(obj: Any) -> Any:
    if isinstance(obj, Tensor) and not obj.is_sparse and obj.layout == torch.strided \
            and obj.is_floating_point():
        return obj.detach().clone().requires_grad_(obj.requires_grad)
    if isinstance(obj, tuple):
        return tuple(_clone(o) for o in obj)
    if isinstance(obj, list):
        return [_clone(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def assert_same(a: Any, b: Any, rtol: float, atol: float, what: str = "output") -> None:
    """Recursive comparison of PyG's (``a``) and our (``b``) return values."""
    if isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b), what
        for i, (u, v) in enumerate(zip(a, b)):
            assert_same(u, v, rtol, atol, f"{what}[{i}]")
        return
    if SparseTensor is not None and isinstance(a, SparseTensor):
        assert isinstance(b, SparseTensor), what
        ra, ca, va = a.coo()
        rb, cb, vb = b.coo()
        assert torch.equal(ra, rb) and torch.equal(ca, cb), what
        assert_same(va, vb, rtol, atol, what + ".value")
        assert a.sparse_sizes() == b.sparse_sizes(), what
        return
    if a is None:
        assert b is None, what
        return
    assert isinstance(b, Tensor), f"{what}: {type(b)}"
    if a.layout != torch.strided:
        assert b.layout == a.layout, what
        torch.testing.assert_close(b.to_dense().float(), a.to_dense().float(),
                                   rtol=rtol, atol=atol, msg=what)
        return
    assert type(a) is type(b), f"{what}: {type(a).__name__} vs {type(b).__name__}"
    if not a.is_floating_point():
        assert torch.equal(a.as_subclass(Tensor), b.as_subclass(Tensor)), what
        return
    assert a.shape == b.shape, f"{what}: {a.shape} vs {b.shape}"
    assert not torch.isnan(b).any(), f"{what}: NaN"
    torch.testing.assert_close(b.detach().to(a.dtype), a.detach(), rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")


def _first(out: Any) -> Tensor:
    return out[0] if isinstance(out, tuple) else out


def _inputs_requiring_grad(obj: Any, acc: list) -> list:
    if isinstance(obj, Tensor) and obj.requires_grad:
        acc.append(obj)
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            _inputs_requiring_grad(o, acc)
    elif isinstance(obj, dict):
        for o in obj.values():
            _inputs_requiring_grad(o, acc)
    return acc


def build_pair(pyg_cls: type, our_cls: type, kwargs: Dict[str, Any], dtype, device,
               warmup: Optional[Callable[[torch.nn.Module], Any]] = None
               ) -> Tuple[torch.nn.Module, torch.nn.Module]:
    """PyG's layer and ours with identical weights (ours loads PyG's state)."""
    torch.manual_seed(12345)
    ref = pyg_cls(**kwargs)
    torch.manual_seed(54321)  # different init: the weights must come from PyG's
    ours = our_cls(**kwargs)
    ref, ours = ref.to(device, dtype), ours.to(device, dtype)
    if warmup is not None:  # materialise lazy (-1) parameters
        with torch.no_grad():
            warmup(ref)
            warmup(ours)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def check_equivalence(pyg_cls: type, our_cls: type, kwargs: Dict[str, Any], args: Sequence,
                      call_kwargs: Optional[Dict[str, Any]] = None, *,
                      device: str = "cpu", dtype=None, train: bool = False,
                      backward: bool = True, lazy: bool = False,
                      fallback: Optional[str] = None,
                      prepare: Optional[Callable[[torch.nn.Module], Any]] = None
                      ) -> Tuple[Any, Any]:
    """Forward (all return values) and backward (all parameter and input
    gradients) of PyG's layer and ours must agree; an exception raised by
    PyG must be raised by ours too.  ``args`` must already be on ``device``.

    Ours must take the fused path, unless ``fallback`` names (a part of) the
    expected fallback reason.  ``prepare(module)`` runs on both layers after
    the weights are copied."""
    dtype = dtype or dtype_for(device)
    call_kwargs = call_kwargs or {}
    tol = TOL[dtype]
    warm = (lambda m: m(*_clone(args), **_clone(call_kwargs))) if lazy else None
    ref, ours = build_pair(pyg_cls, our_cls, kwargs, dtype, device, warm)
    ref.train(train)
    ours.train(train)
    if prepare is not None:
        prepare(ref)
        prepare(ours)
    reasons: list = []
    ours._fused_fallback = lambda reason, like: reasons.append(reason)
    args_r, kw_r = _clone(args), _clone(call_kwargs)
    args_o, kw_o = _clone(args), _clone(call_kwargs)
    try:
        out_r = ref(*args_r, **kw_r)
    except Exception as e:  # PyG refuses: so must we
        with pytest.raises(type(e)):
            ours(*args_o, **kw_o)
        ERRORS.append(repr(e)[:80])
        return None, None
    out_o = ours(*args_o, **kw_o)
    if fallback is None:
        assert not reasons, f"unexpected fallback: {reasons}"
    else:
        assert reasons and fallback in reasons[0], reasons
    assert_same(out_r, out_o, **tol)
    if backward:
        y_r, y_o = _first(out_r), _first(out_o)
        w = torch.randn(y_r.shape, generator=torch.Generator().manual_seed(7),
                        dtype=torch.float64).to(device, y_r.dtype)
        (y_r * w).sum().backward()
        (y_o * w.to(y_o.dtype)).sum().backward()
        for (n, p_r), (n2, p_o) in zip(ref.named_parameters(), ours.named_parameters()):
            assert n == n2
            if p_r.grad is None:
                assert p_o.grad is None or not p_o.grad.any(), f"grad {n}"
            else:
                assert p_o.grad is not None, f"grad {n} missing"
                assert_same(p_r.grad, p_o.grad, what=f"grad {n}", **tol)
        for i, (g_r, g_o) in enumerate(zip(_inputs_requiring_grad((args_r, kw_r), []),
                                           _inputs_requiring_grad((args_o, kw_o), []))):
            assert_same(g_r.grad, g_o.grad, what=f"input grad {i}", **tol)
    return out_r, out_o


def record_results(monkeypatch, module, name: str) -> list:
    """Wrap ``module.name`` (for the test's duration) so that every call's
    result is appended, in call order, to the returned list."""
    results: list = []
    fn = getattr(module, name)

    def recorded(*args, **kwargs):
        results.append(fn(*args, **kwargs))
        return results[-1]
    monkeypatch.setattr(module, name, recorded)
    return results


def feats(n: int, f: int, device: str, dtype=None, seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, f, generator=g, dtype=torch.float64).to(
        device, dtype or dtype_for(device)).requires_grad_()


#: the small graph of the layer tests' core and format cases
N, F_IN, E = 12, 8, 40


def check_core(pyg_cls: type, our_cls: type, device: str, heads: int, edge_dim, **layer_kw):
    """A layer's core case: ``N`` nodes, ``E`` random edges (seeded by
    ``heads``), ``F_IN`` input features, 5 channels per head, optional 4-wide
    edge features, attention dropout 0.4 (inactive: eval); ``layer_kw`` are the
    layer's own options."""
    ei = random_edge_index(N, N, E, seed=heads, device=device)
    x = feats(N, F_IN, device)
    ea = feats(E, 4, device, seed=1) if edge_dim else None
    kw = dict(in_channels=F_IN, out_channels=5, heads=heads, edge_dim=edge_dim, dropout=0.4,
              **layer_kw)
    check_equivalence(pyg_cls, our_cls, kw, (x, ei), dict(edge_attr=ea), device=device)


def check_formats(pyg_cls: type, our_cls: type, device: str, fmt: str, edge_dim,
                  bipartite: bool, ret: bool, **layer_kw):
    """A layer on every adjacency format PyG accepts (``fmt``, see
    :func:`make_adj`), square or bipartite (10 sources with ``F_IN`` features,
    7 targets with 6), 2 heads of 4 channels, optional 3-wide edge features,
    with or without ``return_attention_weights``."""
    ns, nd = (10, 7) if bipartite else (N, N)
    adj, ne = make_adj(random_edge_index(ns, nd, E, seed=3, device=device), fmt, ns, nd)
    x = (feats(ns, F_IN, device), feats(nd, 6, device, seed=2)) if bipartite else \
        feats(N, F_IN, device)
    ea = feats(ne, 3, device, seed=1) if edge_dim else None
    kw = dict(in_channels=(F_IN, 6) if bipartite else F_IN, out_channels=4, heads=2,
              edge_dim=edge_dim, **layer_kw)
    check_equivalence(pyg_cls, our_cls, kw, (x, adj),
                      dict(edge_attr=ea, return_attention_weights=True if ret else None),
                      device=device)


def dropout_runs(conv: torch.nn.Module, max_err: float):
    """A layer built with attention dropout 0.5 on a small float64 graph: in
    training its outputs are random (two calls differ) and unbiased (the mean
    of 150 calls is within ``max_err`` of the eval output, relative).  Returns
    ``(x, edge_index, eval output, eval weights, weights of one training call)``
    for the layer's own checks of the returned weights."""
    torch.manual_seed(0)
    ei = random_edge_index(N, N, 60, seed=9)
    x = torch.randn(N, F_IN, dtype=torch.float64)
    conv = conv.double().eval()
    expect, (_, alpha_eval) = conv(x, ei, return_attention_weights=True)
    conv.train()
    with torch.no_grad():
        outs = torch.stack([conv(x, ei) for _ in range(150)])
        _, (_, alpha1) = conv(x, ei, return_attention_weights=True)
    assert not torch.allclose(outs[0], outs[1])
    assert not torch.allclose(outs[0], expect)
    err = (outs.mean(0) - expect).abs().mean() / expect.abs().mean()
    assert err < max_err, err
    return x, ei, expect, alpha_eval, alpha1


def check_state_dict_round_trip(pyg_cls: type, our_cls: type, **kw):
    """Our layer has PyG's ``state_dict`` keys and ``repr``, loads PyG's
    weights, and PyG's layer loads ours back unchanged."""
    ref, ours = pyg_cls(**kw), our_cls(**kw)
    assert list(ref.state_dict()) == list(ours.state_dict())
    assert repr(ref) == repr(ours)
    ours.load_state_dict(ref.state_dict())
    ref2 = pyg_cls(**kw)
    ref2.load_state_dict(ours.state_dict())
    for (k, a), b in zip(ref.state_dict().items(), ref2.state_dict().values()):
        assert torch.equal(a, b), k
    return ours


def deepcopy_module(m: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(m)


def assert_same_grads(ref: torch.nn.Module, ours: torch.nn.Module, x: Tensor, a: Tensor,
                      b: Tensor, go: Tensor, **tol: float) -> None:
    """The gradients of ``a = ref(x, ...)`` and ``b = ours(x, ...)`` for the
    output gradient ``go``, with respect to ``x`` and every parameter (by
    name; a parameter without a gradient must have none on both sides)."""
    ga = torch.autograd.grad(a, [x] + list(ref.parameters()), go, allow_unused=True)
    gb = torch.autograd.grad(b, [x] + list(ours.parameters()), go, allow_unused=True)
    for (name, _), u, v in zip([("x", None)] + list(ref.named_parameters()), ga, gb):
        assert (u is None) == (v is None), name
        if u is not None:
            torch.testing.assert_close(v, u, msg=name, **tol)


def gat_logit_margin(ref: torch.nn.Module, x: Tensor, edge_index: Tensor) -> float:
    """The smallest ``|a_src[j] + a_dst[i]|`` over the edges (self-loops
    included, as GAT adds them) of a PyG ``GATConv`` ``ref`` on ``x``, in
    float64: LeakyReLU's slope changes there, so a low-precision logit within
    a rounding of 0 takes the other slope and its gradient differs from the
    float64 one by ``(1 - negative_slope) * dS`` -- a property of the
    function, not of an implementation (two correct bf16 implementations that
    round the logit differently disagree there)."""
    from torch_geometric.utils import add_self_loops, remove_self_loops
    with torch.no_grad():
        xd = x.double()
        h = ref.lin.weight.double() @ xd.t()
        h = h.t().view(x.size(0), ref.heads, ref.out_channels)
        a_src = (h * ref.att_src.double()).sum(-1)
        a_dst = (h * ref.att_dst.double()).sum(-1)
        ei, _ = remove_self_loops(edge_index)
        ei, _ = add_self_loops(ei, num_nodes=x.size(0))
        z = a_src[ei[0]] + a_dst[ei[1]]
    return float(z.abs().min())


def check_bf16_against_float64(pyg_cls: type, our_cls: type, kwargs: Dict[str, Any],
                               device: str = "cpu", draws: Sequence[int] = range(400),
                               away_from_kink: bool = False) -> torch.nn.Module:
    """The FlashAttention rule in bf16 on a small random graph (16 nodes, 40
    edges): against PyG's layer in float64 (same weights), each output and
    gradient of ``our_cls`` in bf16 is within 4x PyG's own bf16 error, or 4 bf16
    roundings of the tensor's largest value (a gradient that is zero in exact
    arithmetic is compared on that scale).  With ``away_from_kink`` (GAT), the
    first of ``draws`` whose logits all lie 0.05 from LeakyReLU's kink is used
    (:func:`gat_logit_margin` says why).  Returns the bf16 layer."""
    for draw in draws:
        torch.manual_seed(draw)
        ei = torch.randint(0, 16, (2, 40), device=device)
        ref = pyg_cls(**kwargs).to(device, torch.float64)
        x64 = torch.randn(16, kwargs["in_channels"], dtype=torch.float64, device=device)
        if not away_from_kink or gat_logit_margin(ref, x64, ei) > 0.05:
            break
    else:
        pytest.fail("no draw away from LeakyReLU's kink")
    go64 = torch.randn_like(ref(x64, ei))

    def run(layer: torch.nn.Module, dtype: torch.dtype) -> list:
        x = x64.to(dtype).requires_grad_()
        out = layer(x, ei)
        grads = torch.autograd.grad(out, [x] + list(layer.parameters()), go64.to(dtype),
                                    allow_unused=True)
        return [out.detach()] + [None if g is None else g.detach() for g in grads]

    exact = run(ref, torch.float64)
    theirs16 = pyg_cls(**kwargs).to(device, torch.bfloat16)
    theirs16.load_state_dict(ref.state_dict())
    ours16 = our_cls(**kwargs).to(device, torch.bfloat16)
    ours16.load_state_dict(ref.state_dict())
    theirs, ours = run(theirs16, torch.bfloat16), run(ours16, torch.bfloat16)
    names = ["out", "x"] + [n for n, _ in ref.named_parameters()]
    for name, e, t, o in zip(names, exact, theirs, ours):
        assert (e is None) == (o is None), name
        if e is None:
            continue
        err_o = float((o.double() - e).abs().max())
        err_t = float((t.double() - e).abs().max())
        floor = 4 * 2.0 ** -8 * float(e.abs().max())
        assert err_o <= max(4 * err_t, floor), (name, err_o, err_t, floor)
    return ours16



# ---------------------------------------------------------------------------- layer ops
def layer_op_node(out: Tensor) -> str:
    """The names of a layer output's autograd node and of the nodes it feeds
    on: the one-op layer paths' C++ Functions (``...GatLayerFn``,
    ``...TransformerLayerFn``), whose flat output is the node's own (no view
    node above it), or nodes of the path of several ops."""
    fn = out.grad_fn
    if fn is None:
        return ""
    return " ".join([fn.name()] + [f.name() for f, _ in fn.next_functions if f is not None])


def run_layer(module, conv, x: Tensor, ei: Tensor, grad: Tensor, layer_op: bool, monkeypatch):
    """``conv(x, ei)`` and its backward with ``grad``, with the one-op layer path
    of the layer's ``module`` (``LAYER_OP``) on or off and the dropout seed
    drawn from ``torch.manual_seed(1)``: ``(out, {name: gradient}, node name)``
    (the gradients of ``x`` and of every parameter)."""
    monkeypatch.setattr(module, "LAYER_OP", [layer_op])
    conv.zero_grad(set_to_none=True)
    x.grad = None
    torch.manual_seed(1)   # (the dropout seed: both paths draw it alike)
    out = conv(x, ei)
    out.backward(grad)
    grads = {"x": x.grad, **{n: p.grad for n, p in conv.named_parameters()}}
    return out, grads, layer_op_node(out)


def assert_layer_op_equals_several_ops(module, conv, x: Tensor, ei: Tensor, grad: Tensor,
                                       node: str, monkeypatch,
                                       delta_from_output: bool = False) -> None:
    """The one-op layer path (``node`` in its output's autograd node) and the
    path of several ops give the same output and gradients, bit for bit (the
    same kernels and GEMMs on the same inputs and dropout seed; run under the
    :func:`deterministic` fixture).  With ``delta_from_output`` (the
    Transformer's and GATv2's layer ops, which keep their output instead of
    the attention's and take the backward's Delta = <dO, O> from the output
    less the skip or bias: cuda/dfgnn_ops.cpp, row_delta), the gradients agree
    to within 16 roundings of the dtype on the scale of each gradient: O is
    the output less the skip to one rounding of the output, and the two
    Deltas are summed in different orders (their accuracy against float64:
    ``test_layer_op_against_float64``).  The scale of a gradient is that of
    the largest of its shape: the key bias's is 0 in exact arithmetic (the
    softmax does not see a shift of a row's scores) and its computed value
    rounding only, so it is compared on the scale of the other biases'."""
    out1, g1, node1 = run_layer(module, conv, x, ei, grad, True, monkeypatch)
    out0, g0, node0 = run_layer(module, conv, x, ei, grad, False, monkeypatch)
    assert node in node1 and node not in node0, (node1, node0)
    torch.testing.assert_close(out1, out0, rtol=0, atol=0, equal_nan=True)
    assert g0.keys() == g1.keys()
    for k in g0:
        assert (g0[k] is None) == (g1[k] is None), k
        if g0[k] is not None:
            atol = 0.0
            if delta_from_output:
                scale = max(float(g.abs().max()) for g in g0.values()
                            if g is not None and g.shape == g0[k].shape)
                atol = 16 * torch.finfo(g0[k].dtype).eps * scale
            torch.testing.assert_close(g1[k], g0[k], rtol=0, atol=atol, equal_nan=True, msg=k)


def check_backward_over_saved_projections(cls: type, kw: Dict[str, Any], dtype: torch.dtype,
                                          mode: str, node: str, kind: int, blocks: int,
                                          kept: int, monkeypatch) -> None:
    """A layer op's backward that frees its graph writes the attention's
    source-side gradients over the projections it saved (``dfgnn_ops.cpp``:
    ``src_in_place``: the Transformer's d k / d v over k / v, GATv2's d x_l
    over x_l).  On a GPU-bound call (the layer projects into the kernels'
    width) in backward mode ``mode``: the gradients of ``x`` and of every
    parameter equal, bit for bit, those of a backward of the same graph that
    keeps it (``retain_graph``: nothing overwritten), run first; and the
    backward's peak memory is lower by at least ``blocks`` - 1/2 of the
    ``[N, H, W]`` projection blocks (model ``kind``'s kernel width W) it no
    longer allocates (not checked for a recomputing column pass at heads of
    512, which may split a head over two feature tiles and then write the
    gradients to a buffer of its own).  Between forward
    and backward the layer holds its ``kept`` projection blocks, its output
    and the softmax statistics, and the attention output besides only where
    its heads take 128 bytes or more (elsewhere the backward's Delta comes from
    the output: ``dfgnn_ops.cpp``, ``row_delta``)."""
    from pyg_dfgnn.nn import _padded
    from pyg_dfgnn.ops import backward_mode
    monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    if mode == "recompute" and kw["out_channels"] >= 512:
        blocks = 0
    conv, x, ei, grad = layer_op_case(cls, kw, dtype, train=False)
    w = _padded.kernel_width(kw["out_channels"], x, kw["heads"], kind)
    block = x.size(0) * kw["heads"] * w * x.element_size()
    with backward_mode(mode):
        with torch.no_grad():
            conv(x, ei)   # (the graph's cached CSR and plan)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        out = conv(x, ei)
        held = torch.cuda.memory_allocated() - before
        lse = 2 * x.size(0) * kw["heads"] * 4
        weights = kept * kw["heads"] * w * x.size(1) * x.element_size()   # (padded, stacked)
        # (heads of 128 bytes or more keep the attention output: no Delta pass)
        attn = block if w * x.element_size() >= 128 else 0
        assert held <= (kept * block + attn + out.numel() * out.element_size() + lse + weights
                        + 2**16), (held, block)
        assert node in layer_op_node(out)

        def backward(retain: bool):
            conv.zero_grad(set_to_none=True)
            x.grad = None
            gc.collect()   # (cyclic garbage freed inside the measure would lower the peak)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out.backward(grad, retain_graph=retain)
            torch.cuda.synchronize()
            grads = {"x": x.grad, **{n: p.grad for n, p in conv.named_parameters()}}
            return grads, torch.cuda.max_memory_allocated() - base

        kept_grads, peak_kept = backward(True)
        freed, peak_freed = backward(False)
    for k in kept_grads:
        torch.testing.assert_close(freed[k], kept_grads[k], rtol=0, atol=0, msg=k)
    assert blocks == 0 or peak_freed <= peak_kept - (blocks - 0.5) * block, \
        (peak_freed, peak_kept, block)


def saved_projection_cases(fn):
    """The cases of a layer's ``test_backward_over_saved_projections`` (CUDA
    only): both column-pass modes, fp32 and bf16, narrow, padded, wide and
    two-tile heads."""
    marks = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU"),
             pytest.mark.parametrize("mode", ["store", "recompute"]),
             pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16],
                                     ids=["fp32", "bf16"]),
             pytest.mark.parametrize("kw", [dict(heads=8, out_channels=10),
                                            dict(heads=8, out_channels=19),
                                            dict(heads=4, out_channels=64),
                                            dict(heads=1, out_channels=512)],
                                     ids=["8x10", "8x19", "4x64", "1x512"])]
    for m in reversed(marks):
        fn = m(fn)
    return fn


def check_layer_op_against_float64(pyg_cls: type, our_cls: type, kwargs: Dict[str, Any],
                                   node: str, graphs: int = 4, params: bool = True,
                                   scale: Optional[Dict[str, float]] = None,
                                   dtype: torch.dtype = torch.float32,
                                   recomputed: bool = False, factor: float = 2.0) -> None:
    """A layer's one-op path (``node``) in ``dtype`` (fp32 by default) on a
    PATTERN-like batch against PyG's layer in float64 with the same weights,
    by the FlashAttention rule: output and every gradient (the parameters'
    unless ``params`` is false) within ``factor`` (2) x the error of PyG's own layer in
    ``dtype`` (+ 4 roundings of ``dtype`` on the scale of the largest
    reference tensor of the result's shape: a gradient that is 0 in exact
    arithmetic is compared on the scale of the others).  ``scale``:
    factors for some of the weights (by ``state_dict`` key), e.g. a query
    weight large enough to saturate rows.

    ``recomputed``: the backward forms the scores again in its own summation
    order (the recomputing column pass), so the attention weights its
    gradients are built on carry the scores' ``dtype`` rounding a second time,
    independently of the forward's.  E.g. the Transformer's value-bias
    gradient, sum_i (sum_j alpha_ij) dO_i -- exactly sum_i dO_i -- then
    differs by that relative error, which PyG's own layer shows in its output
    (its error over its largest value: the same scores' rounding, seen
    through the same softmax).  The bound gains that relative error on each
    tensor's scale: at saturated rows (scores of tens) it is ~15 fp32
    roundings, where a row summed without the re-sweep's exact Delta or a
    wrong alpha is off by 1e-3 or more."""
    from pyg_dfgnn.data import pattern_like_batch
    torch.manual_seed(0)
    ei = pattern_like_batch(graphs, seed=1).edge_index.cuda()
    n = int(ei.max()) + 1
    ref = pyg_cls(**kwargs).cuda().double()
    low = pyg_cls(**kwargs).cuda().to(dtype)
    ours = our_cls(**kwargs).cuda().to(dtype)
    with torch.no_grad():
        for k, f in (scale or {}).items():
            ref.state_dict()[k].mul_(f)
    state = {k: v.to(dtype) for k, v in ref.state_dict().items()}
    low.load_state_dict(state)
    ours.load_state_dict(state)
    ref.load_state_dict({k: v.double() for k, v in state.items()})   # (the rounded weights)
    x = torch.randn(n, kwargs.get("in_channels", 32), device="cuda", dtype=torch.float64)
    x = x.to(dtype).double().requires_grad_()
    xl, xo = (x.detach().to(dtype).requires_grad_() for _ in range(2))
    outs = [m(v, ei) for m, v in ((ref, x), (low, xl), (ours, xo))]
    assert node in layer_op_node(outs[2])
    g = torch.randn_like(outs[0])
    for o in outs:
        o.backward(g.to(o.dtype))
    named = [dict(m.named_parameters()) for m in (ref, low, ours)]
    # (a parameter PyG's layer does not use gets no gradient in either, e.g.
    # the skip map's of a Transformer without root weight)
    for k, p in named[0].items():
        if params and p.grad is None:
            assert named[2][k].grad is None, k
    tensors = [("out", *outs), ("x", x.grad, xl.grad, xo.grad)] + [
        (k, p.grad, named[1][k].grad, named[2][k].grad) for k, p in named[0].items()
        if params and p.grad is not None]
    u = torch.finfo(dtype).eps
    # (the scores' relative rounding, as PyG's output shows it; see recomputed)
    rel = float((outs[1].double() - outs[0]).abs().max() / outs[0].abs().max()) \
        if recomputed else 0.0
    for k, want, base, got in tensors:
        err = float((got.double() - want).abs().max())
        err_pyg = float((base.double() - want).abs().max())
        # (on the scale of the largest tensor of its shape: a gradient that is
        # 0 in exact arithmetic, e.g. the Transformer's key bias, whose softmax
        # does not see a shift of a row's scores, is rounding noise on both
        # sides, compared on the scale of the other biases')
        s = max(float(w.abs().max()) for _, w, _, _ in tensors if w.shape == want.shape)
        assert err <= factor * err_pyg + (4 * u + rel) * s, (k, err, err_pyg, s, rel)


def check_split_fp32_against_float64(pyg_cls: type, our_cls: type, kwargs: Dict[str, Any],
                                     node: str, monkeypatch) -> None:
    """A layer op whose fp32 projections run split on the bf16 tensor cores
    (``ops.fp32_matmul("split")``, cuda/fp32_gemm.cu) on GPU-bound calls
    (``GPU_BOUND_ELEMENTS`` 0: padded heads, and at narrow heads the
    Transformer's backward recomputes its skip, cuBLAS fp32 in both passes, for
    its Delta) against PyG's
    layer in float64 by :func:`check_layer_op_against_float64`, within 6x
    PyG's fp32 error: the split GEMM accumulates 6 K + 3 terms per output
    instead of K + 1 (tests/ops/test_fp32_matmul.py).  The split ran: the
    output differs from the "ieee" mode's."""
    from pyg_dfgnn.nn import _padded
    from pyg_dfgnn.ops import fp32_matmul
    monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    with fp32_matmul("split"):
        check_layer_op_against_float64(pyg_cls, our_cls, kwargs, node, graphs=8, factor=6.0)
    from pyg_dfgnn.data import pattern_like_batch
    ei = pattern_like_batch(2, seed=1).edge_index.cuda()
    m = our_cls(**kwargs).cuda()
    x = torch.randn(int(ei.max()) + 1, kwargs.get("in_channels", 32), device="cuda")
    outs = []
    for mode in ("split", "ieee"):
        with fp32_matmul(mode), torch.no_grad():
            outs.append(m(x, ei))
    assert not torch.equal(*outs)


def check_backward_modes_against_float64(pyg_cls: type, our_cls: type, kwargs: Dict[str, Any],
                                         node: str, weight: str, mode: str,
                                         dtype: torch.dtype, monkeypatch) -> None:
    """A layer op's recomputing (``mode`` ``"recompute"``) or alpha backward
    (``"alpha"``: the stored mode with ``PYG_DFGNN_ALPHA_MODE=1``) on GPU-bound
    calls (heads in the width those project to: ``_padded.kernel_width``)
    against float64 by
    :func:`check_layer_op_against_float64` in ``dtype``, with and without
    nearly saturated rows (the ``weight`` parameter x 30), which the row pass
    re-sweeps with the exact Delta."""
    from pyg_dfgnn.nn import _padded
    from pyg_dfgnn.ops import backward_mode
    monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    if mode == "alpha":
        monkeypatch.setenv("PYG_DFGNN_ALPHA_MODE", "1")
    with backward_mode("store" if mode == "alpha" else "recompute"):
        for q in (1.0, 30.0):
            check_layer_op_against_float64(pyg_cls, our_cls, kwargs, node, graphs=8,
                                           scale={weight: q}, dtype=dtype,
                                           recomputed=mode == "recompute")


def check_bias_grad_over_kept_ones(conv: torch.nn.Module, bias: Tensor, node: str,
                                   dtype: torch.dtype) -> None:
    """A layer op's bias gradient that is a GEMV column sum of the output
    gradient over the ones vector the op keeps per (device, dtype, stream) and
    grows (``dfgnn_ops.cpp: ones_like_rows``; ``bias``: that parameter of
    ``conv``, whose op's autograd node is ``node``): within the fp32
    summation bound of the float64 sum on calls that grow the kept vector, on
    a side stream, and in CUDA graphs replayed after capture, one on a stream
    whose kept vector is long enough (read in the graph) and one on a stream
    without one (the graph's own, not kept); and the first graph replayed
    again after its stream's vector was outgrown (an outgrown vector stays
    allocated: the graph reads it)."""
    u = torch.finfo(torch.float32).eps
    width = bias.numel()

    def case(n, seed):
        ei = random_edge_index(n, n, 4 * n, seed=seed, device="cuda")
        x = torch.randn(n, F_IN, device="cuda", dtype=dtype, requires_grad=True)
        return x, ei, torch.randn(n, width, device="cuda", dtype=dtype)

    def step(x, ei, g):
        conv.zero_grad(set_to_none=True)
        out = conv(x, ei)
        assert node in layer_op_node(out)
        out.backward(g)

    def check(g):
        want = g.double().sum(0)
        bound = g.size(0) * u * g.double().abs().sum(0) + torch.finfo(dtype).eps * want.abs()
        got = bias.grad.double()
        assert bool(((got - want).abs() <= bound).all()), float((got - want).abs().max())

    for n, seed in ((300, 1), (5000, 2), (9000, 3), (2000, 4)):   # (kept: 4096, then grown)
        x, ei, g = case(n, seed)
        bias.grad = torch.full_like(bias, float("nan"))
        step(x, ei, g)
        check(g)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x, ei, g = case(3000, 5)
        step(x, ei, g)
        check(g)
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for n, stream in ((2500, side), (6000, None)):
        x, ei, g = case(n, 10 + n)
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                step(x, ei, g)   # (warm-up: the graph cache, this stream's vector)
            torch.cuda.current_stream().wait_stream(stream)
        else:
            step(x, ei, g)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        conv.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph, stream=stream):
            out = conv(x, ei)
            out.backward(g)
        grad = bias.grad
        g.copy_(torch.randn_like(g))
        grad.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(g)
        graphs.append((graph, out, grad, g))
    # the side stream's vector (4096 long) outgrown by an eager call on that
    # stream, then blocks of its size allocated and filled there (what a
    # freed vector's memory would become): the first graph still reads ones
    with torch.cuda.stream(side):
        step(*case(20000, 7))
        junk = [torch.full((4096,), 7.0, device="cuda", dtype=dtype) for _ in range(256)]
    torch.cuda.synchronize()
    graph, out, grad, g = graphs[0]
    g.copy_(torch.randn_like(g))
    grad.fill_(float("nan"))
    bias.grad = grad
    graph.replay()
    torch.cuda.synchronize()
    check(g)
    del graphs, junk
    conv.zero_grad(set_to_none=True)


def check_layer_op_basics(conv: torch.nn.Module, x: Tensor, ei: Tensor, node: str) -> None:
    """What every layer's one-op path (``node``) shows on CUDA: a plain call
    takes it, its output is the op's node's own (:func:`check_layer_op_output`);
    in inference mode the op's forward alone gives no-grad's output; under
    autocast the path of several ops runs; a graph met first in inference mode
    (its cached CSR and schedule are inference tensors, which autograd cannot
    save) then trains."""
    assert node in layer_op_node(conv(x, ei))
    check_layer_op_output(conv, x, ei, node)
    with torch.inference_mode():
        inf = conv(x.detach(), ei)
    with torch.no_grad():
        torch.testing.assert_close(inf, conv(x, ei), rtol=0, atol=0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert node not in layer_op_node(conv(x, ei))
    n = x.size(0)
    ei2 = random_edge_index(n, n, ei.size(1), seed=5, device=str(ei.device))
    with torch.inference_mode():
        conv(x.detach(), ei2)
    out = conv(x, ei2)
    assert node in layer_op_node(out)
    out.sum().backward()


def check_layer_op_guards(conv: torch.nn.Module, x: Tensor, ei: Tensor, node: str,
                          hooked: torch.nn.Module) -> None:
    """What the projecting layers' one-op paths (``node``) share, on CUDA:
    :func:`check_layer_op_basics`; the path of several ops runs for attention
    weights and with a forward hook on the projection ``hooked`` (which is
    called); a wrong feature width raises PyG's error (from ``F.linear``, in
    Python)."""
    check_layer_op_basics(conv, x, ei, node)
    out, _ = conv(x, ei, return_attention_weights=True)
    assert node not in layer_op_node(out)
    seen: list = []
    h = hooked.register_forward_hook(lambda *a: seen.append(1))
    assert node not in layer_op_node(conv(x, ei)) and seen
    h.remove()
    assert node in layer_op_node(conv(x, ei))
    with pytest.raises(RuntimeError):
        conv(torch.randn(x.size(0), x.size(1) + 1, device=x.device), ei)


def check_layer_op_output(conv: torch.nn.Module, x: Tensor, ei: Tensor, node: str) -> None:
    """A one-op call's output is its C++ node's own output (``node``, no view
    node above or below it), and an in-place change of it is either caught by
    autograd's version check at backward or harmless: the gradient of x is
    then that of the changed output."""
    torch.manual_seed(3)
    out = conv(x, ei)
    assert node in out.grad_fn.name(), out.grad_fn.name()
    # (nor view nodes below it: the parameters reach the op as they are)
    assert "ViewBackward" not in layer_op_node(out), layer_op_node(out)
    torch.manual_seed(3)
    want = torch.autograd.grad((conv(x, ei) * 2).sum(), x)[0]
    out.mul_(2)
    try:
        got = torch.autograd.grad(out.sum(), x)[0]
    except RuntimeError as e:
        assert "inplace operation" in str(e), e
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def check_small_calls_keep_attention(cls: type, kw: Dict[str, Any], node: str,
                                     monkeypatch) -> None:
    """A layer op whose output is not its attention output (a skip or bias
    added, or padded heads) takes the backward's Delta = <dO, O> from the
    output less those (``dfgnn_ops.cpp``: ``row_delta``, a pass of its own)
    at narrow heads on GPU-bound calls, where memory counts; below the
    GPU-bound size (``nn/_padded.py: gpu_bound``) it keeps the attention
    output instead (``keep_attn``), and its backward runs no Delta pass:
    checked from the backward's CUDA kernels, in fp32 and bf16.  (The
    gradients of such calls: ``test_layer_op_against_float64`` and
    ``test_layer_op_equals_the_path_of_several_ops`` below the GPU-bound size.)"""
    from torch.profiler import ProfilerActivity, profile

    from pyg_dfgnn.nn import _padded
    default = _padded.GPU_BOUND_ELEMENTS
    for dtype in (torch.float32, torch.bfloat16):
        for forced in (False, True):
            monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0 if forced else default)
            conv, x, ei, grad = layer_op_case(cls, kw, dtype, train=False)
            assert _padded.gpu_bound(x.size(0), kw["heads"], kw["out_channels"]) == forced
            out = conv(x, ei)
            assert node in layer_op_node(out)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                out.backward(grad)
                torch.cuda.synchronize()
            cuda = torch.autograd.DeviceType.CUDA
            names = [e.name for e in prof.events() if e.device_type == cuda]
            assert any("bwd_row" in n or "bwd_col" in n for n in names), names
            assert any("row_delta" in n for n in names) == forced, (dtype, forced, names)


def layer_op_case(cls: type, kw: Dict[str, Any], dtype: torch.dtype, train: bool):
    """``(conv, x, edge_index, output gradient)`` for the one-op path tests on
    CUDA: ``cls(F_IN, dropout=0.3, **kw)`` in ``dtype`` (training mode where
    ``train``) on a PATTERN-like batch of 4 graphs, ``x`` requiring grad."""
    from pyg_dfgnn.data import pattern_like_batch
    torch.manual_seed(0)
    ei = pattern_like_batch(4, seed=0).edge_index.cuda()
    n = int(ei.max()) + 1
    conv = cls(F_IN, dropout=0.3, **kw).to("cuda", dtype).train(train)
    x = torch.randn(n, F_IN, device="cuda", dtype=dtype, requires_grad=True)
    grad = torch.randn(n, kw["heads"] * kw["out_channels"], device="cuda", dtype=dtype)
    return conv, x, ei, grad


#: the one-op path tests' common cases: modes, dtypes and shapes (each layer's
#: test adds its own options to LAYER_OP_KW)
layer_op_modes = pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
layer_op_dtypes = pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
LAYER_OP_KW = [pytest.param(dict(heads=8, out_channels=10), id="8x10"),
               pytest.param(dict(heads=8, out_channels=19), id="8x19"),
               pytest.param(dict(heads=4, out_channels=64), id="4x64"),
               pytest.param(dict(heads=1, out_channels=16), id="1x16"),
               pytest.param(dict(heads=2, out_channels=8, bias=False), id="nobias")]


def layer_op_equality_cases(*extra_kw, gpu_bound: bool = False):
    """The cases of a layer's ``test_layer_op_equals_the_path_of_several_ops``
    (CUDA only): modes, dtypes, :data:`LAYER_OP_KW` plus the layer's own
    ``extra_kw`` as ``kw``, and, with ``gpu_bound``, small and GPU-bound calls."""
    marks = [layer_op_modes, layer_op_dtypes,
             pytest.mark.parametrize("kw", LAYER_OP_KW + list(extra_kw))]
    if gpu_bound:
        marks.append(pytest.mark.parametrize("gpu_bound", [False, True],
                                             ids=["small", "gpubound"]))
    marks += [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]

    def apply(fn):
        for m in reversed(marks):   # (the order of the decorators they replace)
            fn = m(fn)
        return fn
    return apply
