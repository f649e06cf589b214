"""The layer ops' fp32 projections on the bf16 tensor cores (``cuda/fp32_gemm.cu``,
``ops.fused.linears``, ``ops.fp32_matmul``): each fp32 operand the exact sum
of three bf16 parts, the six products above 2^-24 of the result accumulated
in fp32 by one bf16 GEMM.

Every comparison draws fresh random inputs and measures errors against
float64.  By the FlashAttention rule the split GEMM's error must be within a
small multiple of cuBLAS' fp32 GEMM's own error on the same inputs: its
products are exact and it drops terms below 2^-24 of each product, so what
remains is the fp32 accumulation, over 6 K + 3 terms instead of K + 1, hence a
factor of up to 6 (a TF32 GEMM, one pass, is ~1000x off and fails it).
"""
import pytest
import torch

from pyg_dfgnn import ops
from pyg_dfgnn.ops.fused import linears

CUDA = torch.cuda.is_available()


def _maps(K, Ms, bias, gen, device, scale=1.0, strided=False):
    maps = []
    for M, b in zip(Ms, bias):
        w = torch.randn(M, K, generator=gen, dtype=torch.float64) / K ** 0.5
        if strided:   # a transposed view: columns not contiguous
            w = w.t().contiguous().t()
        bb = torch.randn(M, generator=gen, dtype=torch.float64) * scale if b else None
        maps.append((w.float().to(device), None if bb is None else bb.float().to(device)))
    return maps


def _x(N, K, gen, device, scale=1.0, row_stride=None):
    x = torch.randn(N, row_stride or K, generator=gen, dtype=torch.float64) * scale
    # (a spread of magnitudes within each row: 2^-20 .. 2^20)
    x = x * torch.pow(2.0, torch.randint(-20, 21, (N, row_stride or K), generator=gen).double())
    return x.float().to(device)[:, :K]


def _ref(x, w, b):
    y = x.double() @ w.double().t()
    return y + b.double() if b is not None else y


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("N,K,Ms,bias,strided", [
    (3000, 64, [256, 256], [True, False], False),    # the factorized Transformer's q~ and skip
    (2000, 64, [1024, 256], [True, True], False),    # q / k / v padded and the skip
    (1500, 19, [152], [True], True),
    (1000, 128, [40, 7], [False, False], False),
    (700, 1, [33], [True], False),
    (0, 64, [16], [True], False),
])
def test_split_against_float64(N, K, Ms, bias, strided):
    """In "split" mode, each map's output within 6x cuBLAS' fp32 GEMM's error
    against float64 plus 8 fp32 roundings of the largest |y|, on inputs whose
    magnitudes span 2^+-20, with row-strided x and column-strided weights."""
    gen = torch.Generator().manual_seed(N + K)
    x = _x(N, K, gen, "cuda", row_stride=K + 5 if strided else None)
    maps = _maps(K, Ms, bias, gen, "cuda", strided=strided)
    with ops.fp32_matmul("split"):
        got = linears(x, maps)
    with ops.fp32_matmul("ieee"):
        ieee = linears(x, maps)
    u = torch.finfo(torch.float32).eps
    for (w, b), y, y32 in zip(maps, got, ieee):
        want = _ref(x, w, b)
        assert y.dtype == torch.float32 and y.shape == want.shape and y.is_contiguous()
        if N == 0:
            continue
        for r in (y32, y):   # (y32: cuBLAS' fp32 GEMM, what "ieee" runs)
            assert torch.isfinite(r).all()
        err = float((y.double() - want).abs().max())
        err32 = float((y32.double() - want).abs().max())
        s = float(want.abs().max())
        assert err <= 6 * err32 + 8 * u * s, (err, err32, s)
        # (not TF32: one TF32 pass is off by ~2^-11 of the products)
        assert err < 2.0 ** -18 * s, (err, s)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_split_keeps_non_finite_values_as_fp32_does():
    """inf / NaN in x, the weights or the bias give fp32's inf / NaN pattern:
    an infinite element meets only the other side's first part (inf x w, not
    inf w1 + inf w2 with parts of opposite signs: NaN), and a value next to
    the largest float does not round its first part to infinity."""
    gen = torch.Generator().manual_seed(3)
    x = _x(64, 16, gen, "cuda")
    (w, b), = _maps(16, [24], [True], gen, "cuda")
    w[0, 0] = 0.99609375 + 2 ** -12    # (bf16 rounds it up: its second part is negative)
    x[0, 0] = float("inf")
    x[1, 0] = float("-inf")
    x[2, 3] = float("nan")
    x[3, 5] = 3.4e38                   # (rounds to bf16's infinity)
    w[5, 7] = float("inf")
    b[9] = float("-inf")
    with ops.fp32_matmul("split"):
        (y,) = linears(x, [(w, b)])
    with ops.fp32_matmul("ieee"):
        (y32,) = linears(x, [(w, b)])
    assert torch.equal(torch.isnan(y), torch.isnan(y32))
    assert torch.equal(torch.isinf(y), torch.isinf(y32))
    fin = torch.isfinite(y32)
    assert torch.equal(torch.sign(y[~fin & ~torch.isnan(y32)]),
                       torch.sign(y32[~fin & ~torch.isnan(y32)]))
    want = _ref(x, w, b)[3]
    keep = torch.isfinite(want)   # (the columns of w[5] and b[9] are infinite)
    assert int(keep.sum()) == 22
    assert float((y[3][keep].double() - want[keep]).abs().max()) < \
        2.0 ** -18 * float(want[keep].abs().max())


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_auto_and_ieee_run_cublas_fp32():
    """"ieee" always, and "auto" on products N K M under 2^30, give cuBLAS'
    fp32 GEMM bit for bit (torch.addmm / torch.mm); "auto" splits larger ones."""
    gen = torch.Generator().manual_seed(5)
    x = _x(4000, 64, gen, "cuda")
    maps = _maps(64, [64, 48], [True, False], gen, "cuda")
    want = [torch.addmm(maps[0][1], x, maps[0][0].t()), torch.mm(x, maps[1][0].t())]
    for mode in ("ieee", "auto"):
        with ops.fp32_matmul(mode):
            got = linears(x, maps)
        for a, b in zip(got, want):
            assert torch.equal(a, b), mode
    big = _x(70000, 64, gen, "cuda")          # 70000 x 64 x 256 > 2^30
    (w, b), = _maps(64, [256], [True], gen, "cuda")
    with ops.fp32_matmul("auto"):
        (ya,) = linears(big, [(w, b)])
    with ops.fp32_matmul("split"):
        (ys,) = linears(big, [(w, b)])
    assert torch.equal(ya, ys)
    assert not torch.equal(ya, torch.addmm(b, big, w.t()))


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_calls_autograd_records_run_addmm():
    """Where autograd would record the call (grad mode, an input requiring
    grad), linears is addmm even in "split" mode: the op has no backward."""
    gen = torch.Generator().manual_seed(9)
    x = _x(100, 16, gen, "cuda")
    (w, b), = _maps(16, [32], [True], gen, "cuda")
    w.requires_grad_()
    with ops.fp32_matmul("split"):
        (y,) = linears(x, [(w, b)])
        assert y.grad_fn is not None
        assert torch.equal(y, torch.addmm(b, x, w.t()))
        with torch.no_grad():
            (y2,) = linears(x, [(w, b)])
    assert y2.grad_fn is None and not torch.equal(y2, y)


def test_cpu_and_other_dtypes_run_addmm():
    """Off CUDA fp32, linears is addmm / mm (the CPU, float64)."""
    gen = torch.Generator().manual_seed(7)
    for dtype in (torch.float32, torch.float64):
        x = _x(50, 8, gen, "cpu").to(dtype)
        maps = [(w.to(dtype), None if b is None else b.to(dtype))
                for w, b in _maps(8, [6, 5], [True, False], gen, "cpu")]
        with ops.fp32_matmul("split"):
            got = linears(x, maps)
        assert torch.equal(got[0], torch.addmm(maps[0][1], x, maps[0][0].t()))
        assert torch.equal(got[1], torch.mm(x, maps[1][0].t()))


def test_mode_setting():
    """set_fp32_matmul takes the modes of FP32_MATMUL_MODES or None, returns
    the previous one, and fp32_matmul restores it on exit (on an error too);
    anything else is a ValueError naming the argument."""
    assert ops.FP32_MATMUL_MODES == ("ieee", "auto", "split")
    prev = ops.set_fp32_matmul(None)
    try:
        assert ops.set_fp32_matmul("ieee") is None
        with pytest.raises(RuntimeError):
            with ops.fp32_matmul("split"):
                assert ops.set_fp32_matmul("split") == "split"
                raise RuntimeError("inside")
        assert ops.set_fp32_matmul("auto") == "ieee"
        with pytest.raises(ValueError, match="'mode'"):
            ops.set_fp32_matmul("tf32")
        assert ops.set_fp32_matmul(None) == "auto"
    finally:
        ops.set_fp32_matmul(prev)
