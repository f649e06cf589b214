"""The correctness gate, OOM / error handling and timing helpers of the suite."""
import torch

from pyg_dfgnn.bench import report, timing
from pyg_dfgnn.bench.graphs import BenchGraph, Unavailable
from pyg_dfgnn.bench.layers import build_case, pyg_factory
from pyg_dfgnn.bench.ops_bench import build_op_case, naive_op_factory
from pyg_dfgnn.bench.runner import (Prepared, Settings, Skipped, compare, compute_reference,
                                    rel_err, run_case, Reference)
from pyg_dfgnn.data.synthetic import uniform_graph

CPU = torch.device("cpu")


def _graph(n=300, m=2400):
    return BenchGraph(name="u300", kind="uniform", edge_index=uniform_graph(n, m, seed=1),
                      num_nodes=n)


def _settings(**kw):
    s = Settings(warmup=1, repeats=2, max_measure_s=None, min_repeats=1)
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def _gat_case():
    return build_case(_graph(), "gat", heads=2, channels=8, in_channels=8,
                      dtype=torch.float32, device=CPU, seed=0)


def _scaled_output(case):  # a deliberately wrong contender: 1.5x the output
    m, ei = case.extra["native"], case.extra["edge_index"]
    return Prepared(fn=lambda x: 1.5 * m(x, ei), params=dict(m.named_parameters()))


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return 2.0 * g


def _wrong_backward(case):  # right forward, wrong gradients
    m, ei = case.extra["native"], case.extra["edge_index"]
    return Prepared(fn=lambda x: m(_ScaleGrad.apply(x), ei),
                    params=dict(m.named_parameters()))


def _oom_on_call(case):
    def fn(x):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB "
                                          "(simulated)")
    return Prepared(fn=fn)


def _oom_in_setup(case):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")


def _oom_in_backward(case):
    m, ei = case.extra["native"], case.extra["edge_index"]

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated, backward)")

    return Prepared(fn=lambda x: m(Boom.apply(x), ei), params=dict(m.named_parameters()))


def _raises(case):
    raise KeyError("boom")


def _unavailable(case):
    raise Unavailable("torch_sparse missing")


def _skipped(case):
    raise Skipped("not today")


def test_mismatch_is_reported_and_not_timed():
    case = _gat_case()
    s = _settings()
    rows = run_case(case, {"pyg": pyg_factory, "wrong": _scaled_output,
                           "wrong_bwd": _wrong_backward}, s)
    by = {r["contender"]: r for r in rows}
    assert by["pyg"]["status"] == "ok" and by["pyg"]["check"] == "fp64"
    assert by["pyg"]["max_err"] < 1e-5 and by["pyg"]["fwd_ms"] > 0
    for name, where in (("wrong", "worst: "), ("wrong_bwd", "worst: input0")):
        r = by[name]
        assert r["status"] == "mismatch", r
        assert r["max_err"] > 0.1 and where in r["note"]
        assert r.get("fwd_ms") is None and r.get("fwdbwd_ms") is None  # not timed


def _logged(tag, log):
    """PyG's layer, each call logged under ``tag``."""
    def factory(case):
        p = pyg_factory(case)

        def fn(*a):
            log.append(tag)
            return p.fn(*a)
        return Prepared(fn=fn, params=p.params, note=p.note, keep=p.keep)
    return factory


def test_timing_blocks_are_interleaved():
    """With ``interleave = 3`` the contenders' timed calls alternate in blocks:
    after every contender's first calls and check, three forward blocks each,
    then three forward+backward blocks each, then each one's memory calls."""
    case = _gat_case()
    log = []
    rows = run_case(case, {"pyg": _logged("pyg", log), "other": _logged("other", log)},
                    _settings(interleave=3, repeats=3))
    assert [r["status"] for r in rows] == ["ok", "ok"]
    runs = [t for i, t in enumerate(log) if i == 0 or log[i - 1] != t]
    assert runs == ["pyg", "other"] * 8, runs
    assert all(r["fwd_ms_n"] == 3 and r["fwdbwd_ms_n"] == 3 for r in rows)


def test_oom_and_errors_are_reported_not_raised():
    case = _gat_case()
    s = _settings()
    rows = run_case(case, {"oom_call": _oom_on_call, "oom_setup": _oom_in_setup,
                           "oom_bwd": _oom_in_backward, "broken": _raises,
                           "na": _unavailable, "skip": _skipped, "pyg": pyg_factory}, s)
    by = {r["contender"]: r for r in rows}
    assert by["oom_call"]["status"] == "OOM" and "first call" in by["oom_call"]["note"]
    assert by["oom_setup"]["status"] == "OOM" and "setup" in by["oom_setup"]["note"]
    assert by["oom_bwd"]["status"] == "OOM" and "check" in by["oom_bwd"]["note"]
    assert by["broken"]["status"].startswith("error: KeyError")
    assert by["na"]["status"] == "n/a: torch_sparse missing"
    assert by["skip"]["status"] == "skipped: not today"
    assert by["pyg"]["status"] == "ok"  # the suite goes on after failures
    assert len(s.errors) == 1 and "KeyError" in s.errors[0]


def test_reference_falls_back_when_fp64_reference_ooms():
    case = _gat_case()
    orig = case.reference

    def reference(dev, dt):
        if dt == torch.float64:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return orig(dev, dt)
    case.reference = reference
    ref = compute_reference(case, _settings())
    assert ref.kind == "pyg" and "fp64 reference: OOM" in ref.note
    rows = run_case(case, {"pyg": pyg_factory, "wrong": _scaled_output}, _settings())
    assert [r["status"] for r in rows] == ["ok", "mismatch"]
    assert all("fp64 reference: OOM" in r["note"] for r in rows)


def test_unchecked_when_no_reference_fits():
    case = _gat_case()

    def reference(dev, dt):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
    case.reference = reference
    rows = run_case(case, {"pyg": pyg_factory, "other": pyg_factory}, _settings())
    # the baseline's forward+backward already ran out of memory: not tried again
    assert rows[0]["status"] == "OOM" and "reference" in rows[0]["note"]
    # other contenders are timed, flagged as unchecked
    assert rows[1]["status"] == "ok" and rows[1]["check"] == "none"
    assert "unchecked" in rows[1]["note"]


def test_case_that_cannot_be_built(monkeypatch):
    import pyg_dfgnn.bench.layers as L
    from pyg_dfgnn.bench.config import BASE, deep_merge

    def boom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
    monkeypatch.setattr(L, "build_case", boom)
    cfg = deep_merge(BASE, {"layers": {"names": ["gat"], "contenders": ["fused", "pyg"]}})
    rows = L.run_layers(_graph(), cfg, _settings(), torch.float32, CPU,
                        L.CompileGate({"enabled": False}))
    assert [(r["contender"], r["status"]) for r in rows] == [("fused", "OOM"), ("pyg", "OOM")]
    assert all(r["shape"] == "4x64" for r in rows)  # the default shape


def test_oom_in_cause_chain():
    try:
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        except Exception as inner:
            raise ValueError("compile failed") from inner
    except ValueError as e:
        assert timing.is_oom(e)


def test_fp64_reference_threshold():
    case = _gat_case()
    assert compute_reference(case, _settings()).kind == "fp64"
    assert compute_reference(case, _settings(fp64_max_elements=10)).kind == "pyg"


def test_op_case_naive_vs_itself():
    case = build_op_case(_graph(), "gatv2", heads=2, channels=8, dtype=torch.float32,
                         device=CPU)
    rows = run_case(case, {"naive": naive_op_factory}, _settings())
    assert rows[0]["status"] == "ok" and rows[0]["max_err"] < 1e-5


def test_compare_floor_for_vanishing_gradients():
    ref = Reference(kind="fp64", out=torch.ones(3),
                    grads={"param:w": torch.full((3,), 10.0),
                           "param:b": torch.tensor([1e-17, 0.0, -1e-17])})
    # a round-off-sized error on a mathematically zero gradient is fine ...
    err, _ = compare(torch.ones(3), {"param:w": torch.full((3,), 10.0),
                                     "param:b": torch.tensor([1e-7, 0.0, 0.0])}, ref)
    assert err < 1e-5
    # ... a real error on it is not
    err, where = compare(torch.ones(3), {"param:w": torch.full((3,), 10.0),
                                         "param:b": torch.tensor([1.0, 0.0, 0.0])}, ref)
    assert where == "param:b" and err > 1e-3
    assert rel_err(torch.tensor([float("nan")]), torch.tensor([1.0])) == float("inf")


def test_timing_helpers():
    st = timing.summarize([3.0, 1.0, 2.0, 4.0])
    assert st.median == 2.5 and st.min == 1.0 and st.max == 4.0 and st.n == 4
    assert st.q25 == 1.75 and st.q75 == 3.25
    calls = []
    st = timing.measure(lambda: calls.append(1), CPU, warmup=2, repeats=5)
    assert len(calls) == 7 and st.n == 5
    # a fast call timed for at least min_time_s: here up to the cap (a list
    # append takes microseconds; 30 + 30 of them far less than the 10 s asked)
    calls.clear()
    st = timing.measure(lambda: calls.append(1), CPU, warmup=2, repeats=5, min_time_s=10.0,
                        max_repeats=30)
    assert len(calls) == 60 and st.n == 30
    assert timing.peak_memory_mb(lambda: None, CPU) == 0.0
    # CPU: peak of the tensor memory allocated during the call (two 4 MiB
    # buffers alive at once, then freed), not what is left at the end

    def two():
        a = torch.empty(1 << 20)
        b = torch.empty(1 << 20)
        del a, b
    assert timing.peak_memory_mb(two, CPU) == 8.0
    assert timing.is_oom(torch.cuda.OutOfMemoryError("x"))
    assert timing.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert not timing.is_oom(RuntimeError("something else"))


def test_speedups():
    rows = [{"section": "layer", "graph": "g", "case": "gat", "dtype": "float32",
             "contender": "pyg", "baseline": "pyg", "status": "ok", "fwd_ms": 4.0,
             "fwdbwd_ms": 9.0, "fwdbwd_peak_mb": 100.0},
            {"section": "layer", "graph": "g", "case": "gat", "dtype": "float32",
             "contender": "fused", "baseline": "pyg", "status": "ok", "fwd_ms": 1.0,
             "fwdbwd_ms": 3.0, "fwdbwd_peak_mb": 10.0},
            {"section": "layer", "graph": "g", "case": "gat", "dtype": "float32",
             "contender": "pyg_sparse", "baseline": "pyg", "status": "OOM"}]
    report.add_speedups(rows)
    assert rows[1]["speedup_fwd"] == 4.0 and rows[1]["speedup_fwdbwd"] == 3.0
    assert rows[1]["mem_ratio"] == 0.1
    assert rows[2]["speedup_fwd"] is None
    text = report.format_summary(rows)
    assert "pyg_sparse: OOM" in text


def _bf16_gat_case(**kw):
    return build_case(_graph(), "gat", heads=2, channels=8, in_channels=8,
                      dtype=torch.bfloat16, device=CPU, seed=0, **kw)


def test_low_precision_reference_is_fp64_else_fp32():
    case = _bf16_gat_case()
    ref = compute_reference(case, _settings())
    assert ref.kind == "fp64" and ref.out.dtype == torch.float64
    # too large for fp64: the baseline in float32 (not PyG in bf16) is the yardstick
    ref32 = compute_reference(case, _settings(fp64_max_elements=10))
    assert ref32.kind == "pyg-fp32" and ref32.out.dtype == torch.float32
    # both evaluate the same function: the bf16 inputs and weights, upcast exactly
    assert rel_err(ref32.out, ref.out) < 1e-5
    for k, g in ref.grads.items():
        assert rel_err(ref32.grads[k], g) < 1e-4, k
    # fp32 cases keep their old fallback: the baseline in the working dtype
    assert compute_reference(_gat_case(), _settings(fp64_max_elements=10)).kind == "pyg"


def test_bf16_case_gate():
    case = _bf16_gat_case()

    def tripled(case):  # output 3x: relative error 2
        m, ei = case.extra["native"], case.extra["edge_index"]
        return Prepared(fn=lambda x: 3.0 * m(x, ei), params=dict(m.named_parameters()))
    rows = run_case(case, {"pyg": pyg_factory, "wrong": tripled,
                           "wrong_bwd": _wrong_backward}, _settings())
    by = {r["contender"]: r for r in rows}
    assert by["pyg"]["status"] == "ok" and by["pyg"]["check"] == "fp64"
    # bf16 round-off (unit 2**-8), largest in the parameter gradients of the bf16
    # nn.Linear backward (~0.08 here); it widens the others' tolerance to 2x that
    assert 0 < by["pyg"]["max_err"] < 0.2
    assert by["pyg"]["dtype"] == "bfloat16" and by["pyg"]["shape"] == "2x8"
    assert by["pyg"]["max_err_at"]
    for name in ("wrong", "wrong_bwd"):  # 3x output / 2x input gradient: errors 2 and 1
        assert by[name]["status"] == "mismatch", by[name]


def test_agnn_case_is_one_head_of_heads_times_channels():
    case = build_case(_graph(), "agnn", heads=8, channels=10, in_channels=64,
                      dtype=torch.float32, device=CPU)
    assert (case.heads, case.channels, case.shape) == (1, 80, "8x10")
    assert tuple(case.inputs[0].shape) == (300, 80)
    assert tuple(case.grad_out.shape) == (300, 80)
    gat = build_case(_graph(), "gat", heads=8, channels=10, in_channels=64,
                     dtype=torch.float32, device=CPU)
    assert (gat.heads, gat.channels, gat.shape) == (8, 10, "8x10")
    assert tuple(gat.grad_out.shape) == (300, 80)
    rows = run_case(case, {"pyg": pyg_factory}, _settings())
    assert rows[0]["shape"] == "8x10" and rows[0]["channels"] == 80


def test_run_layers_and_ops_at_a_shape():
    import pyg_dfgnn.bench.layers as L
    from pyg_dfgnn.bench.config import BASE, deep_merge
    from pyg_dfgnn.bench.ops_bench import run_ops
    cfg = deep_merge(BASE, {"layers": {"names": ["transformer"], "shapes": [[4, 64], [8, 19]],
                                       "in_channels": 8},
                            "ops": {"names": ["dot"], "shapes": ["2x4"]}})
    rows = L.run_layers(_graph(), cfg, _settings(), torch.float32, CPU,
                        L.CompileGate({"enabled": False}), shape=(8, 19),
                        contender_names=["pyg"])
    assert [(r["contender"], r["shape"], r["heads"], r["channels"], r["status"])
            for r in rows] == [("pyg", "8x19", 8, 19, "ok")]
    rows = run_ops(_graph(), cfg, _settings(), torch.float32, CPU, contender_names=["naive"])
    assert [(r["shape"], r["status"]) for r in rows] == [("2x4", "ok")]  # first of ops.shapes
    # a skipped case (time budget) keeps its shape
    s = _settings(deadline=0.0, budget_s=1.0)
    rows = L.run_layers(_graph(), cfg, s, torch.float32, CPU,
                        L.CompileGate({"enabled": False}), shape=(8, 19),
                        contender_names=["fused", "pyg"])
    assert [(r["shape"], r["status"][:20]) for r in rows] == [
        ("8x19", "skipped: time budget")] * 2
