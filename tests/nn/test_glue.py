"""Projections and bias adds whose bias gradient is a GEMV (pyg_dfgnn/nn/_glue.py).

The autograd functions are checked on their own (gradcheck in float64, the
autocast dtype path against explicit casts) and inside the layers: with the
GEMV path forced (on the CPU, or on CUDA below the GPU-bound size), every
layer's output and every gradient must equal PyG's layer with the same weights
in float64, and the GEMV must have computed the bias gradients."""
import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pygnn

import pyg_dfgnn.nn as dnn
from pyg_dfgnn.nn import _glue, _padded, gat_conv, gatv2_conv, transformer_conv

from ._equiv import assert_same_grads, check_bf16_against_float64

U_BF16 = 2.0 ** -8


@pytest.mark.parametrize("shape", [(7, 5), (3, 4, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradcheck(shape, bias):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, shape[-1], dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True) if bias else None
    assert torch.autograd.gradcheck(lambda x, w, b: _glue._Linear.apply(x, w, b, None),
                                    (x, w, b))
    torch.testing.assert_close(_glue._Linear.apply(x, w, b, None), F.linear(x, w, b),
                               rtol=0, atol=0)


@pytest.mark.parametrize("bshape", [(5,), (4, 5)])
def test_add_bias_gradcheck(bshape):
    torch.manual_seed(1)
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(*bshape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_glue._AddBias.apply, (x, b))
    x2 = torch.randn(3, 4, 5, dtype=torch.float64)[..., :4].requires_grad_()  # a strided view
    b2 = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_glue._AddBias.apply, (x2, b2))


def test_linear_in_an_autocast_dtype_matches_explicit_casts():
    """The autocast path: inputs cast to bf16, output bf16, each gradient in its
    input's dtype, within bf16 roundings of the explicitly cast F.linear (the
    bias gradient is summed in another order)."""
    torch.manual_seed(2)
    x = torch.randn(300, 16, requires_grad=True)
    w = torch.randn(12, 16, requires_grad=True)
    b = torch.randn(12, requires_grad=True)
    g = torch.randn(300, 12).to(torch.bfloat16)
    y = _glue._Linear.apply(x, w, b, torch.bfloat16)
    assert y.dtype == torch.bfloat16
    ours = torch.autograd.grad(y, (x, w, b), g)
    ref_y = F.linear(x.to(torch.bfloat16), w.to(torch.bfloat16), b.to(torch.bfloat16))
    ref = torch.autograd.grad(ref_y, (x, w, b), g)
    torch.testing.assert_close(y, ref_y, rtol=0, atol=0)
    gf = g.float()
    scales = (gf.abs() @ w.detach().abs(), gf.abs().t() @ x.detach().abs(), gf.abs().sum(0))
    for o, r, t, s in zip(ours, ref, (x, w, b), scales):
        assert o.dtype == t.dtype == torch.float32
        # two bf16 results of the same sum: each within ~1 rounding of the value
        # plus fp32 accumulation; 4 roundings of the absolute sum bound them
        assert ((o - r).abs() <= 4 * U_BF16 * s + 1e-6).all()


CASES = [
    ("TransformerConv", dict(out_channels=10, heads=8)),             # padded, 4 biases
    ("TransformerConv", dict(out_channels=16, heads=2, concat=False, beta=True)),
    ("GATv2Conv", dict(out_channels=10, heads=8)),
    ("GATv2Conv", dict(out_channels=16, heads=2, concat=False, residual=True)),
    ("GATConv", dict(out_channels=10, heads=8)),
    ("GATConv", dict(out_channels=16, heads=4)),
    ("GATConv", dict(out_channels=19, heads=2, concat=False)),
]


@pytest.fixture
def gemv_calls(monkeypatch):
    """The column sums of the layers' bias gradients: ``_glue``'s GEMVs, plus
    (as ``"epilogue"``) GAT's output bias where the layer folds it into the
    fused op, whose backward sums the column itself (a GEMV in the CUDA op)."""
    calls = []
    col_sum = _glue._column_sum
    fold = gat_conv._bias_in_epilogue

    def counted(g2):
        calls.append(tuple(g2.shape))
        return col_sum(g2)

    def folded(*args):
        b = fold(*args)
        if b:
            calls.append("epilogue")
        return b
    monkeypatch.setattr(_glue, "_column_sum", counted)
    monkeypatch.setattr(gat_conv, "_bias_in_epilogue", folded)
    return calls


def _compare(cls, kw, device, dtype, tol):
    torch.manual_seed(0)
    ei = torch.randint(0, 50, (2, 300), device=device)
    kw = dict(in_channels=16, **kw)
    ref = getattr(pygnn, cls)(**kw).to(device, dtype)
    ours = getattr(dnn, cls)(**kw).to(device, dtype)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(50, 16, dtype=dtype, device=device, requires_grad=True)
    a, b = ref(x, ei), ours(x, ei)
    torch.testing.assert_close(b, a, **tol)
    assert_same_grads(ref, ours, x, a, b, torch.randn_like(a), **tol)
    return ours


def _expected_gemvs(ours, device):
    """One column sum per bias, except that a Transformer layer projecting q, k
    and v with one GEMM (``_glue.fused_projections``) sums their three biases'
    gradients as one column sum."""
    n = sum(1 for name, p in ours.named_parameters() if name.endswith("bias") and p.dim() == 1)
    if isinstance(ours, dnn.TransformerConv) and \
            device in transformer_conv._FUSED_PROJECTION_DEVICES:
        n -= 2
    return n


@pytest.mark.parametrize("cls,kw", CASES)
def test_layers_on_the_gemv_path_match_pyg_in_float64(cls, kw, gemv_calls, monkeypatch):
    monkeypatch.setattr(_glue, "_use", lambda x, rows, width: True)
    ours = _compare(cls, kw, "cpu", torch.float64, dict(rtol=1e-10, atol=1e-12))
    # every bias of the layer (projections and the output bias) took the GEMV
    assert len(gemv_calls) == _expected_gemvs(ours, "cpu"), gemv_calls


def test_small_cpu_calls_keep_plain_autograd(gemv_calls):
    _compare("TransformerConv", dict(out_channels=10, heads=8), "cpu", torch.float64,
             dict(rtol=1e-10, atol=1e-12))
    assert gemv_calls == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cls,kw", CASES)
def test_layers_on_the_gemv_path_match_pyg_on_cuda(cls, kw, gemv_calls, monkeypatch):
    """On CUDA in fp32 with the GPU-bound threshold lowered to every call: the
    path a 100k-node graph takes, against PyG's layer in fp32 (tolerances of the
    layer equivalence suite, tests/nn/_equiv.py).  (The path of several ops: the
    Transformer's and GATv2's one-op paths sum their bias gradients in C++,
    compared with this path in their layers' tests.)"""
    monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    monkeypatch.setattr(transformer_conv, "LAYER_OP", [False])
    monkeypatch.setattr(gatv2_conv, "LAYER_OP", [False])
    ours = _compare(cls, kw, "cuda", torch.float32, dict(rtol=1e-5, atol=1e-5))
    assert len(gemv_calls) == _expected_gemvs(ours, "cuda"), gemv_calls


# GAT at 2 heads: with 8 (4) heads the small graph's 448 (224) logits left no
# draw with every logit 0.05 away from the kink (H100, session 11)
BF16_CASES = [(c, dict(kw, heads=min(kw["heads"], 2)) if c == "GATConv" else kw)
              for c, kw in CASES]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cls,kw", BF16_CASES)
def test_layers_on_the_gemv_path_in_bf16_against_float64(cls, kw, gemv_calls, monkeypatch):
    """bf16 on the GEMV path, judged by the FlashAttention rule: against PyG's
    layer in float64 (same weights), our error is within a small multiple of
    PyG's own bf16 error, per output and gradient, and never required below a
    few bf16 roundings of the tensor's largest value (a gradient that is zero
    in exact arithmetic is compared on that scale).  The GAT layers take
    inputs away from LeakyReLU's kink (test_gat_conv.py says why).  (The
    Transformer's and GATv2's paths of several ops, as in the test above.)"""
    monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    monkeypatch.setattr(transformer_conv, "LAYER_OP", [False])
    monkeypatch.setattr(gatv2_conv, "LAYER_OP", [False])
    ours16 = check_bf16_against_float64(getattr(pygnn, cls), getattr(dnn, cls),
                                        dict(in_channels=16, **kw), device="cuda",
                                        away_from_kink=cls == "GATConv")
    assert len(gemv_calls) == _expected_gemvs(ours16, "cuda"), gemv_calls


@pytest.mark.parametrize("width", [5, 8])
@pytest.mark.parametrize("n_maps", [1, 3])
def test_fused_projections_gradcheck(width, n_maps):
    """Several linear maps of one input as one GEMM (``fused_projections``),
    padded per head to ``width`` or not: outputs equal the separate maps (zero
    padding columns), gradients pass gradcheck in float64."""
    heads, chans, n, fin = 2, 5, 7, 4
    torch.manual_seed(0)
    lins = [torch.nn.Linear(fin, heads * chans).double() for _ in range(n_maps)]
    x = torch.randn(n, fin, dtype=torch.float64, requires_grad=True)
    outs = _glue.fused_projections(lins, x, heads, chans, width)
    assert len(outs) == n_maps
    for o, lin in zip(outs, lins):
        assert o.shape == (n, heads, width)
        torch.testing.assert_close(o[..., :chans], lin(x).view(n, heads, chans))
        assert (o[..., chans:] == 0).all()
    params = [p for lin in lins for p in (lin.weight, lin.bias)]

    def f(x, *ps):
        return tuple(o[..., :chans] for o in
                     _glue._Projections.apply((heads, chans, width, None, False, n_maps), x, *ps))
    assert torch.autograd.gradcheck(f, (x, *[p.detach().requires_grad_(True) for p in params]))


@pytest.mark.parametrize("width", [5, 8])
@pytest.mark.parametrize("extra_bias", [True, False])
def test_fused_projections_with_an_extra_map_gradcheck(width, extra_bias):
    """An extra map of its own width (the Transformer's skip projection) as a
    last output of the same node: equal to the map itself, and gradcheck in
    float64 through all outputs, ``d_x`` summed over the blocks and the extra."""
    heads, chans, n, fin = 2, 5, 7, 4
    torch.manual_seed(1)
    lins = [torch.nn.Linear(fin, heads * chans).double() for _ in range(3)]
    extra = torch.nn.Linear(fin, 6, bias=extra_bias).double()
    x = torch.randn(n, fin, dtype=torch.float64, requires_grad=True)
    outs = _glue.fused_projections(lins, x, heads, chans, width, extra=extra)
    assert len(outs) == 4 and outs[3].shape == (n, 6)
    torch.testing.assert_close(outs[3], extra(x))
    params = [p for lin in lins for p in (lin.weight, lin.bias)] + [extra.weight, extra.bias]

    def f(x, *ps):
        outs = _glue._Projections.apply((heads, chans, width, None, False, 3), x, *ps)
        return tuple(o[..., :chans] for o in outs[:3]) + (outs[3],)
    leaves = [p.detach().requires_grad_(True) if p is not None else None for p in params]
    assert torch.autograd.gradcheck(f, (x, *leaves))
    with torch.no_grad():   # (no autograd: the caller folds the extra into the blocks)
        assert len(_glue.fused_projections(lins, x, heads, chans, width, extra=extra)) == 3


def test_fused_projections_refuse_maps_they_cannot_fuse():
    lin = torch.nn.Linear(4, 10)
    x = torch.randn(3, 4)
    assert _glue.fused_projections([lin, torch.nn.Linear(4, 10, bias=False)], x, 2, 5, 5) is None
    assert _glue.fused_projections([torch.nn.Linear(4, 10, bias=False)] * 2, x, 2, 5, 5) \
        is not None
    assert _glue.fused_projections([lin, torch.nn.Linear(4, 12)], x, 2, 5, 5) is None
    hooked = torch.nn.Linear(4, 10)
    hooked.register_forward_hook(lambda *a: None)
    assert _glue.fused_projections([lin, hooked], x, 2, 5, 5) is None


@pytest.mark.parametrize("kw", [dict(heads=8, out_channels=10), dict(heads=2, out_channels=16,
                                concat=False, beta=True), dict(heads=3, out_channels=4,
                                edge_dim=3), dict(heads=2, out_channels=4, root_weight=False),
                                dict(heads=2, out_channels=4, bias=False)])
def test_transformer_fused_projections_match_pyg(kw, monkeypatch):
    """The Transformer layer's q / k / v as one GEMM (the default on GPU-bound
    CUDA calls, forced on the CPU here) equals PyG's layer, forward and backward in
    float64; a pair of inputs keeps the separate projections."""
    from pyg_dfgnn.nn import transformer_conv as tc
    from ._equiv import check_equivalence, feats, random_edge_index, record_results
    monkeypatch.setattr(tc, "_FUSED_PROJECTION_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)   # (GPU-bound calls only)
    calls = record_results(monkeypatch, tc, "fused_projections")
    n, e = 12, 40
    ei = random_edge_index(n, n, e)
    call = dict(edge_attr=torch.randn(e, 3, dtype=torch.float64)) if "edge_dim" in kw else None
    check_equivalence(pygnn.TransformerConv, dnn.TransformerConv, dict(in_channels=6, **kw),
                      (feats(n, 6, "cpu"), ei), call)
    assert calls and all(r is not None for r in calls)
    calls.clear()
    check_equivalence(pygnn.TransformerConv, dnn.TransformerConv, dict(in_channels=6, **kw),
                      ((feats(n, 6, "cpu"), feats(n, 6, "cpu", seed=1)), ei), call)
    assert not calls


@pytest.mark.parametrize("kw", [dict(heads=8, out_channels=10), dict(heads=2, out_channels=4,
                                bias=False), dict(heads=2, out_channels=4, concat=False),
                                dict(heads=2, out_channels=4, beta=True)])
@pytest.mark.parametrize("width", [None, 12])
def test_transformer_skip_projection_joins_the_projections(kw, width, monkeypatch):
    """A GPU-bound Transformer call (forced on the CPU here) where PyG's layer
    adds ``lin_skip(x)`` unchanged (``concat``, no ``beta``) computes the skip
    with the q / k / v projections: without autograd as the GEMM's 4th column
    block, with autograd as an extra GEMM in the same node
    (``fused_projections(..., extra=lin_skip)``); otherwise q / k / v only.
    Output and every gradient equal PyG's layer in float64, padded or not."""
    from pyg_dfgnn.nn import transformer_conv as tc
    monkeypatch.setattr(tc, "_FUSED_PROJECTION_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(_padded, "GPU_BOUND_ELEMENTS", 0)
    if width is not None:
        monkeypatch.setattr(tc, "kernel_width",
                            lambda c, x, h=1, kind=-1, pad_small=False: max(c, width))
    calls = record_lins(monkeypatch)
    torch.manual_seed(0)
    ei = torch.randint(0, 12, (2, 40))
    ref = pygnn.TransformerConv(in_channels=6, **kw).double()
    ours = dnn.TransformerConv(in_channels=6, **kw).double()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(12, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, ei), ref(x, ei), rtol=1e-12, atol=1e-12)
    folds = kw.get("concat", True) and not kw.get("beta", False)
    assert calls == [(4, False) if folds else (3, False)]
    calls.clear()
    xs = x.clone().requires_grad_(True)
    a, b = ref(xs, ei), ours(xs, ei)
    torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    assert calls == [(3, folds)]
    assert_same_grads(ref, ours, xs, a, b, torch.randn_like(a), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(heads=2, out_channels=4), dict(heads=2, out_channels=4,
                                beta=True, edge_dim=2)])
def test_transformer_fused_projections_on_empty_graph(kw, monkeypatch):
    """A graph of 0 nodes through the projections' autograd node (with the skip
    as its extra map where it folds): output and gradients equal PyG's layer, and
    the backward takes the 0-row gradients (no ambiguous reshape)."""
    from pyg_dfgnn.nn import transformer_conv as tc
    from ._equiv import check_equivalence, feats
    monkeypatch.setattr(tc, "_FUSED_PROJECTION_DEVICES", ("cuda", "cpu"))
    calls = record_lins(monkeypatch)
    no_edges = torch.empty(2, 0, dtype=torch.long)
    call = dict(edge_attr=feats(0, 2, "cpu")) if "edge_dim" in kw else None
    check_equivalence(pygnn.TransformerConv, dnn.TransformerConv, dict(in_channels=6, **kw),
                      (feats(0, 6, "cpu"), no_edges), call)
    assert (3, not kw.get("beta", False)) in calls


def record_lins(monkeypatch) -> list:
    """``(number of maps, with an extra map)`` of every ``fused_projections``
    call of the Transformer layer."""
    calls: list = []
    fn = _glue.fused_projections

    def recorded(lins, *args, extra=None):
        calls.append((len(lins), extra is not None))
        return fn(lins, *args, extra=extra)
    monkeypatch.setattr(transformer_conv, "fused_projections", recorded)
    return calls


@pytest.mark.parametrize("n_maps", [1, 3, 4])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("width", [5, 8])
def test_padded_params_equal_the_padded_maps(n_maps, bias, width):
    """``padded_params``: the stacked weights and biases, zero rows
    ``chans..width-1`` in every head (on the CPU the ATen path, whose layout
    the CUDA op is checked against in test_stack_pad_heads_op_on_cuda)."""
    heads, chans, fin = 3, 5, 4
    torch.manual_seed(0)
    ws = [torch.randn(heads * chans, fin) for _ in range(n_maps)]
    bs = [torch.randn(heads * chans) for _ in range(n_maps)] if bias else None
    w, b = _glue.padded_params(ws, bs, heads, chans, width)
    assert w.shape == (n_maps * heads * width, fin)
    wv = w.view(n_maps, heads, width, fin)
    for i in range(n_maps):
        assert torch.equal(wv[i, :, :chans], ws[i].view(heads, chans, fin))
    assert (wv[:, :, chans:] == 0).all()
    if bias:
        bv = b.view(n_maps, heads, width)
        for i in range(n_maps):
            assert torch.equal(bv[i, :, :chans], bs[i].view(heads, chans))
        assert (bv[:, :, chans:] == 0).all()
    else:
        assert b is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("n_maps,heads,chans,width,fin", [
    (1, 8, 10, 12, 64), (3, 8, 10, 12, 64), (4, 8, 19, 20, 80), (4, 4, 64, 64, 64),
    (2, 1, 7, 8, 3), (8, 2, 3, 8, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_stack_pad_heads_op_on_cuda(dtype, n_maps, heads, chans, width, fin, bias, monkeypatch):
    """The CUDA op (one kernel) equals the ATen concatenation + pad bit for
    bit; outputs are poisoned first through the caching allocator, so an
    unwritten element shows.  (Its argument checks are not tested here: they
    throw C++ exceptions, which crashed the process on the device's build;
    ``padded_params`` never passes what they refuse, see the next test.)"""
    from pyg_dfgnn.ops.fused import _ext
    torch.manual_seed(0)
    dev = "cuda"
    ws = [torch.randn(heads * chans, fin, device=dev).to(dtype) for _ in range(n_maps)]
    bs = [torch.randn(heads * chans, device=dev).to(dtype) for _ in range(n_maps)]
    if not bias:
        bs = None
    rows = n_maps * heads * width
    torch.full((rows * fin + rows + 4096,), float("nan"), device=dev, dtype=dtype)  # poison
    with monkeypatch.context() as m:     # (the op, not the ATen path, computes them)
        m.setattr(_glue, "_stack_padded", None)
        w, b = _glue.padded_params(ws, bs, heads, chans, width)
    assert torch.equal(w, _glue._stack_padded(ws, heads, chans, width))
    if bias:
        assert torch.equal(b, _glue._stack_padded(bs, heads, chans, width))
    else:
        assert b is None
    # a strided weight is read as it is meant (the op makes it contiguous)
    wt = [torch.randn(fin, heads * chans, device=dev).to(dtype).t() for _ in range(n_maps)]
    w2, _ = _ext().stack_pad_heads(wt, [], heads, chans, width)
    assert torch.equal(w2, _glue._stack_padded([t.contiguous() for t in wt], heads, chans, width))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_padded_params_take_the_aten_path_for_what_the_op_does_not_take():
    """Mixed dtypes, shapes or devices never reach the CUDA op (whose checks
    throw C++ exceptions): ``padded_params`` takes the ATen path, which either
    computes the same stack or raises PyTorch's own error."""
    w = torch.randn(10, 4, device="cuda")
    mixed = [w, w.double()]              # (torch.cat promotes the dtypes)
    w2, _ = _glue.padded_params(mixed, None, 2, 5, 8)
    assert torch.equal(w2, _glue._stack_padded(mixed, 2, 5, 8))
    with pytest.raises(RuntimeError):
        _glue.padded_params([w, torch.randn(10, 5, device="cuda")], None, 2, 5, 8)
    with pytest.raises(RuntimeError):
        _glue.padded_params([w, torch.randn(10, 4)], None, 2, 5, 8)
    w3, b3 = _glue.padded_params([w], [torch.randn(10, device="cuda", dtype=torch.float16)],
                                 2, 5, 8)
    assert b3.dtype == torch.float16 and torch.equal(w3, _glue._stack_padded([w], 2, 5, 8))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_padded_weight_gradcheck(bias, device):
    """``padded_weight`` (one op, one autograd node): the padded weight and
    bias, gradients through the padding rows dropped (gradcheck in float64;
    on CUDA the one-kernel op)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    w = torch.randn(6, 3, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, device=device, requires_grad=True) if bias else None
    wp, bp = _glue.padded_weight(w, b, 2, 3, 5)
    assert torch.equal(wp, _glue.pad_heads(w, 2, 3, 5))
    assert (bp is None) == (not bias)
    if bias:
        assert torch.equal(bp, _glue.pad_heads(b, 2, 3, 5))
    assert torch.autograd.gradcheck(
        lambda *t: tuple(o for o in _glue.padded_weight(*t, 2, 3, 5) if o is not None), (w, b))


def test_block_buffer_recognises_column_blocks_of_one_buffer():
    """``_block_buffer`` returns the ``[n, nb * w]`` buffer only when the
    gradients are its consecutive column blocks, in order; else ``None``."""
    n, h, c = 5, 2, 3
    w = h * c
    buf = torch.randn(n, 3 * w)
    blocks = [buf[:, i * w:(i + 1) * w].view(n, h, c) for i in range(3)]
    g = _glue._block_buffer(blocks, n, w, buf.dtype)
    assert g is not None and torch.equal(g, buf) and g.data_ptr() == buf.data_ptr()
    assert _glue._block_buffer(blocks[::-1], n, w, buf.dtype) is None        # out of order
    assert _glue._block_buffer([b.clone() for b in blocks], n, w, buf.dtype) is None
    assert _glue._block_buffer(blocks[:2] + [None], n, w, buf.dtype) is None
    assert _glue._block_buffer(blocks, n, w, torch.float64) is None
    wide = torch.randn(n, 3 * w + 1)   # rows longer than the three blocks
    assert _glue._block_buffer([wide[:, i * w:(i + 1) * w].view(n, h, c) for i in range(3)],
                               n, w, wide.dtype) is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,chans,nodes", [(4, 64, 500), (8, 10, 500), (8, 19, 30000)])
def test_transformer_backward_gemm_reads_the_attention_gradient_blocks(dtype, heads, chans,
                                                                      nodes, monkeypatch):
    """On CUDA the attention's backward writes the gradients of q / k / v as
    the column blocks of one buffer (``dfgnn_C::attention_bwd_blocks``) and the
    projections' backward runs its GEMMs on it without concatenating: the
    gradients are those of the concatenating path, to the bit.  (The path of
    several ops; the one-op path's C++ reads the blocks the same way.)"""
    monkeypatch.setattr(transformer_conv, "LAYER_OP", [False])
    monkeypatch.setattr(gatv2_conv, "LAYER_OP", [False])
    torch.manual_seed(heads + chans)
    ei = torch.randint(0, nodes, (2, 6 * nodes), device="cuda")
    conv = dnn.TransformerConv(24, chans, heads=heads).cuda().to(dtype)
    x = torch.randn(nodes, 24, device="cuda", dtype=dtype, requires_grad=True)
    gout = torch.randn(nodes, heads * chans, device="cuda", dtype=dtype)
    found = []
    real = _glue._block_buffer

    def spy(*a):
        g = real(*a)
        found.append(g is not None)
        return g

    def run():
        conv.zero_grad()
        x.grad = None
        conv(x, ei).backward(gout)
        return [x.grad.clone()] + [p.grad.clone() for p in conv.parameters()]

    monkeypatch.setattr(_glue, "_block_buffer", spy)
    got = run()
    assert found == [True]
    monkeypatch.setattr(_glue, "_block_buffer", lambda *a: None)
    want = run()
    for a, b in zip(got, want):
        assert torch.equal(a, b)
