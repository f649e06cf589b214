"""The C++ CPU kernels (cpu/attention_cpu.cpp) against float64.

Inputs are fresh random problems (seeded per test) with bipartite graphs,
duplicate edges, an isolated destination (an empty row) and an unsorted
``edge_index`` (so ``perm`` is not the identity).  Accuracy rule (as in
FlashAttention's tests): the kernel's error against the float64 oracle must be
within a small multiple of the error that the pure-PyTorch reference itself
makes in the same dtype (fp32 / bf16 in, fp32 compute), plus a few units of
the dtype's rounding of the compared values.  The kernel is built once per
session (cached under ``$PYG_DFGNN_CACHE``).
"""
import os
import shutil
import subprocess
import sys
import zlib

import pytest
import torch

from pyg_dfgnn import _build
from pyg_dfgnn.graph import get_graph
from pyg_dfgnn.ops import DOT, GAT, GATV2, fused
from pyg_dfgnn.ops import reference as R
from _cases import KINDS, make_inputs, op_args, random_graph

#: ours <= MULT * err(reference in this dtype) + ULPS * eps(dtype) * max|value|.
#: Both sides sum the same fp32 terms in different orders (rows of up to ~30
#: edges here, all E edges for GATv2's d_att), and cancellation (sum_j dS_ij = 0)
#: makes gradients small against their terms: the floor of 8 ulps of the
#: largest value is well inside the a-priori bound (n - 1) * eps * sum|terms|.
MULT, ULPS = 2.0, 8.0


@pytest.fixture(scope="module")
def cpu_ops():
    try:
        return _build.load_cpu()
    except _build.BuildError as e:
        if shutil.which(os.environ.get("CXX", "c++")) is None:
            pytest.skip(f"no C++ compiler: {e}")
        raise  # a compiler is there: a failed build is a bug


def _problem(kind, dtype, edge, seed, ns=230, nd=170, ne=2500, H=3, F=16, index=None):
    gen = torch.Generator().manual_seed(seed)
    ei = random_graph(ns, nd, ne, generator=gen)
    g = get_graph(ei, (ns, nd))
    if index is not None:
        for name in ("rowptr", "col", "perm", "t_rowptr", "t_col", "t_perm"):
            t = getattr(g, name)
            if t is not None:
                setattr(g, name, t.to(index))
    inp = make_inputs(kind, ns, nd, ei.size(1), H, F, dtype, "cpu", edge, generator=gen)
    return g, inp


def _ext(args):
    """``attention_fwd`` arguments for the extension op (an int seed)."""
    seed = args[15]
    return args[:15] + (int(seed) if seed is not None else 0,) + args[16:]


def _bwd(args, out, lse, gout):
    a = _ext(args)
    return a[:16] + (out, lse, gout) + a[17:]


def _to64(inp):
    return {n: (v.double() if v is not None else None) for n, v in inp.items()}


def _scores64(kind, g, inp, scale, slope=0.2):
    """Float64 scores ``[E, H]`` in CSR order (independent of the reference code)."""
    col = g.col.long()
    rows = g.row_index().long()
    x = _to64(inp)
    e = x["edge"]
    if e is not None and g.perm is not None:
        e = e[g.perm.long()]
    if kind == GAT:
        z = x["src"][col] + x["dst"][rows] + (e if e is not None else 0)
        return torch.nn.functional.leaky_relu(z, slope)
    if kind == GATV2:
        z = x["src"][col] + x["dst"][rows] + (e if e is not None else 0)
        return (torch.nn.functional.leaky_relu(z, slope) * x["att"]).sum(-1)
    k = x["src"][col] + (e if e is not None else 0)
    if getattr(kind, "key_scale", False):   # keys c_j k_j
        k = k * x["att"][col].unsqueeze(-1)
    return (x["dst"][rows] * k).sum(-1) * scale


def _err(a, b):
    return float((a.double() - b.double()).abs().max()) if b.numel() else 0.0


def _check(name, ours, ref_lp, ref64, dtype):
    if ref64.numel() == 0:
        assert ours.numel() == 0, name
        return
    assert ours.shape == ref64.shape and ours.dtype == ref_lp.dtype, name
    bound = MULT * _err(ref_lp, ref64) + ULPS * torch.finfo(dtype).eps * float(
        ref64.abs().max())
    err = _err(ours, ref64)
    assert err <= bound, f"{name}: error {err:.3g} > bound {bound:.3g}"


CASES = [(k, dt, edge, p) for k in KINDS for dt in (torch.float32, torch.bfloat16)
         for edge in (False, True) for p in (0.0, 0.3)]


def _compare(cpu_ops, k, g, inp, dtype, p, seed):
    """Kernel forward/backward against float64 and against the reference in
    ``dtype`` (the accuracy rule above); returns the kernel's (out, lse)."""
    sd = torch.tensor([seed * 7919 + 3]) if p else None
    args = op_args(k, g, inp, p, sd, True)
    out, lse, alpha = cpu_ops.attention_fwd(*_ext(args))
    gout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1),
                       dtype=torch.float64)
    grads = cpu_ops.attention_bwd(*_bwd(args, out, lse, gout.to(dtype)))
    s = int(sd) if sd is not None else 0

    def ref(x, go):
        o, l, a = R.attention_forward(k, g.rowptr, g.col, g.perm, x["dst"], x["src"], x["val"],
                                      x["edge"], x["att"], 0.5, 0.2, p, s, True)
        gr = R.attention_backward(k, g.rowptr, g.col, g.perm, x["dst"], x["src"], x["val"],
                                  x["edge"], x["att"], 0.5, 0.2, p, s, o, l, go)
        return o, a, gr
    o64, a64, g64 = ref(_to64(inp), gout)
    olp, alp, glp = ref(inp, gout.to(dtype))
    _check("out", out, olp, o64, dtype)
    _check("alpha", alpha, alp, a64, dtype)
    for name, a, b, c in zip(("d_dst", "d_src", "d_value", "d_edge", "d_att"), grads, glp,
                             g64):
        _check(name, a, b, c, dtype)
    return out, lse


@pytest.mark.parametrize("kind,dtype,edge,p", CASES,
                         ids=[f"{k}-{str(d)[6:]}-{'edge' if e else 'noedge'}-p{p}"
                              for k, d, e, p in CASES])
def test_kernel_matches_float64(cpu_ops, kind, dtype, edge, p):
    k = KINDS[kind]
    seed = zlib.crc32(f"{kind}{dtype}{edge}{p}".encode())
    g, inp = _problem(k, dtype, edge, seed)
    out, lse = _compare(cpu_ops, k, g, inp, dtype, p, seed)

    # lse [2, N_dst, H]: row max and log of the sum, -inf / 0 on empty rows
    assert lse.shape == (2, g.num_dst, inp["src"].size(1)) and lse.dtype == torch.float32
    s64 = _scores64(k, g, inp, 0.5)
    rows = g.row_index().long()
    H = s64.size(1)
    m = torch.full((g.num_dst, H), float("-inf"), dtype=torch.float64).scatter_reduce(
        0, rows.view(-1, 1).expand(-1, H), s64, "amax")
    empty = g.in_degree() == 0
    assert empty.any()
    mm = torch.where(empty.view(-1, 1), 0.0, m)
    ll = torch.zeros_like(m).index_add_(0, rows, torch.exp(s64 - mm[rows])).log()
    assert torch.isneginf(lse[0][empty]).all() and (lse[1][empty] == 0).all()
    # a row without edges: 0, or GAT's output bias
    assert (out[empty] == (inp["att"] if getattr(k, "bias", False) else 0)).all()
    # fp32 math on the exact (bf16 or fp32) inputs: a few fp32 roundings of the terms
    tol = 1e-5 * (1 + float(s64.abs().max()))
    torch.testing.assert_close(lse[0][~empty].double(), m[~empty], rtol=0, atol=tol)
    torch.testing.assert_close(lse[1][~empty].double(), ll[~empty], rtol=0, atol=tol)


@pytest.mark.parametrize("kind", list(KINDS))
def test_int64_index_and_wide_features(cpu_ops, kind):
    """int64 graph indices, F = 37 (no vector-width multiple), value features
    narrower than the score features (dot)."""
    k = KINDS[kind]
    g, inp = _problem(k, torch.float32, True, 11, F=37, index=torch.int64)
    if k == DOT:
        inp["val"] = torch.randn(inp["src"].size(0), 3, 21,
                                 generator=torch.Generator().manual_seed(5))
        inp["edge"] = None  # the edge is added to keys and values: needs one size
    assert g.col.dtype == torch.int64
    _compare(cpu_ops, k, g, inp, torch.float32, 0.2, 11)


def test_parallel_parts_and_big_rows(cpu_ops):
    """Enough work for several threads' parts, a super row and a super column."""
    gen = torch.Generator().manual_seed(3)
    n = 300
    ei = random_graph(n, n, 4000, super_node=(700, 5), generator=gen)
    ei = torch.cat([ei, torch.stack([torch.full((500,), 7), torch.randint(0, n, (500,),
                                                                          generator=gen)])], 1)
    g = get_graph(ei, (n, n))
    inp = make_inputs(DOT, n, n, ei.size(1), 2, 16, torch.float32, "cpu", True, generator=gen)
    args = op_args(DOT, g, inp, 0.1, torch.tensor([42]), True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ref = cpu_ops.attention_fwd(*_ext(args))
        rg = cpu_ops.attention_bwd(*_bwd(args, ref[0], ref[1], ref[0]))
        torch.set_num_threads(max(2, threads))
        got = cpu_ops.attention_fwd(*_ext(args))
        gg = cpu_ops.attention_bwd(*_bwd(args, got[0], got[1], got[0]))
    finally:
        torch.set_num_threads(threads)
    # rows are independent: the result does not depend on the split
    for a, b in zip(list(got) + list(gg), list(ref) + list(rg)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", list(KINDS))
def test_custom_op_dispatches_to_kernel(cpu_ops, kind):
    k = KINDS[kind]
    g, inp = _problem(k, torch.bfloat16, True, 1)
    args = op_args(k, g, inp)
    out, lse, _ = fused.attention_fwd(*args)
    assert lse.dim() == 3  # the kernel's saved statistics
    torch.testing.assert_close(out, cpu_ops.attention_fwd(*_ext(args))[0], rtol=0, atol=0)
    # float64 keeps the reference path
    a64 = op_args(k, g, _to64(inp))
    torch.testing.assert_close(fused.attention_fwd(*a64)[0],
                               R.attention_forward(k, g.rowptr, g.col, g.perm, *[
                                   a64[i] for i in (7, 8, 9, 10, 11)], 0.5, 0.2, 0.0, 0,
                                   False)[0], rtol=0, atol=0)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(cpu_ops, kind, dtype):
    k = KINDS[kind]
    g, inp = _problem(k, dtype, True, 2, ns=9, nd=7, ne=30, H=2, F=4)
    for v in inp.values():
        if v is not None:
            v.requires_grad_(True)
    args = op_args(k, g, inp, 0.2, torch.tensor([9]), True)
    torch.library.opcheck(fused.attention_fwd, args)
    out, lse, _ = fused.attention_fwd(*args)
    bargs = args[:16] + (out.detach(), lse, torch.randn_like(out)) + args[17:]
    bargs = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in bargs)
    torch.library.opcheck(fused.attention_bwd, bargs,
                          test_utils=("test_schema", "test_faketensor"))


def test_bad_inputs_raise(cpu_ops):
    g, inp = _problem(GAT, torch.float32, False, 4)
    args = op_args(GAT, g, inp)
    bad = list(args)
    bad[9] = None  # GAT without a value
    with pytest.raises(RuntimeError, match="value"):
        cpu_ops.attention_fwd(*_ext(tuple(bad)))
    bad = list(args)
    bad[7] = inp["dst"][:-1]
    with pytest.raises(RuntimeError, match="destination features"):
        cpu_ops.attention_fwd(*_ext(tuple(bad)))
    bad = list(args)
    bad[7] = inp["dst"].double()
    with pytest.raises(RuntimeError, match="dtype"):
        cpu_ops.attention_fwd(*_ext(tuple(bad)))
    out, lse, _ = cpu_ops.attention_fwd(*_ext(args))
    with pytest.raises(RuntimeError, match="lse"):
        cpu_ops.attention_bwd(*_bwd(args, out, lse[0], out))


def _run(code, **env):
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))))


_PROBE = """
import sys, warnings, torch
sys.path.insert(0, 'tests/ops')
from _cases import make_inputs, op_args, random_graph
from pyg_dfgnn import _build
from pyg_dfgnn.graph import get_graph
from pyg_dfgnn.ops import fused, reference as R
ei = random_graph(12, 10, 40)
g = get_graph(ei, (12, 10))
inp = make_inputs(0, 12, 10, ei.size(1), 2, 4, torch.float32, 'cpu', True)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter('always')
    a = fused.attention_fwd(*op_args(0, g, inp))[0]
    b = fused.attention_fwd(*op_args(0, g, inp))[0]
r = R.attention_forward(0, g.rowptr, g.col, g.perm, inp['dst'], inp['src'], inp['val'],
                        inp['edge'], None, 0.5, 0.2, 0.0, 0, False)[0]
assert torch.equal(a, r) and torch.equal(b, r), 'not the reference path'
msgs = [str(x.message) for x in w if 'pyg_dfgnn' in str(x.message)]
print(len(msgs), _build.is_cpu_built(), msgs[0] if msgs else '')
"""


def test_env_forces_reference():
    r = _run(_PROBE, PYG_DFGNN_CPU_KERNELS="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["0", "False"]


def test_no_compiler_falls_back_with_one_warning(tmp_path):
    r = _run(_PROBE, CXX=str(tmp_path / "no-such-c++"), PYG_DFGNN_CACHE=str(tmp_path))
    assert r.returncode == 0, r.stderr
    n, built, msg = r.stdout.split(" ", 2)
    assert (n, built) == ("1", "False")
    assert "no C++ compiler" in msg and "no-such-c++" in msg and "reference" in msg
