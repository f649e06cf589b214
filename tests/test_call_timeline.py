"""scripts/call_timeline.py's split of profiled calls (CPU only: synthetic
profiler events)."""
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from call_timeline import call_traces, split_calls  # noqa: E402

CUDA = torch.autograd.DeviceType.CUDA


def _kernel(name, start, end, device=CUDA, parent=None, thread=1, annotation=False):
    return SimpleNamespace(name=name, device_type=device, cpu_parent=parent, thread=thread,
                           is_user_annotation=annotation,
                           time_range=SimpleNamespace(start=start, end=end))


CPU = torch.autograd.DeviceType.CPU


def test_calls_between_markers_split_into_pre_busy_gaps():
    evs = [
        _kernel("spin_kernel", 0, 2),        # call 1 opens
        _kernel("gemm", 20, 40),
        _kernel("attention", 50, 90),        # 10 us idle before it
        _kernel("spin_kernel", 95, 96),      # call 1 closes
        _kernel("spin_kernel", 200, 201),    # call 2 opens
        _kernel("a", 230, 280),
        _kernel("b", 260, 300),              # overlaps a: counted once
        _kernel("spin_kernel", 301, 302),
        _kernel("host_op", 210, 220, torch.autograd.DeviceType.CPU),   # not a kernel
    ]
    assert split_calls(evs) == [(18, 60.0, 10.0), (29, 70.0, 0.0)]


def test_a_call_without_kernels_gives_no_row():
    evs = [_kernel("spin_kernel", 0, 1), _kernel("spin_kernel", 5, 6)]
    assert split_calls(evs) == []


@pytest.mark.parametrize("unordered", [True, False])
def test_events_in_any_order(unordered):
    evs = [_kernel("spin_kernel", 0, 1), _kernel("k", 11, 21), _kernel("spin_kernel", 30, 31)]
    if unordered:
        evs = evs[::-1]
    assert split_calls(evs) == [(10, 10.0, 0.0)]


def test_cpu_top_passes_are_checked_before_anything_runs(capsys):
    """``--cpu-top-passes`` takes fwd and / or fb; anything else is a usage
    error naming the option (raised before torch or a GPU is touched)."""
    from call_timeline import main
    with pytest.raises(SystemExit) as e:
        main(["--cpu-top", "5", "--cpu-top-passes", "fwd,bwd"])
    assert e.value.code == 2
    assert "--cpu-top-passes" in capsys.readouterr().err


def test_call_traces_put_host_ops_and_kernels_of_each_call_on_one_clock():
    """Each ``call<k>`` host range gives one row, offsets from its start: the
    kernels that start before the next call (not the GPU copies of host
    ranges), their busy time with overlaps counted once, and the host ops up
    to three levels deep under the range or from another thread's top."""
    c0 = _kernel("call0", 100, 400, CPU)
    op = _kernel("dfgnn_C::gat_layer", 140, 380, CPU, parent=c0)
    mm = _kernel("aten::mm", 150, 230, CPU, parent=op)
    launch = _kernel("cudaLaunchKernel", 200, 210, CPU, parent=mm)
    inner = _kernel("cuLaunchKernel", 202, 208, CPU, parent=launch)    # 4 levels: left out
    bwd = _kernel("autograd::engine::evaluate_function", 300, 390, CPU, thread=2)
    c1 = _kernel("call1", 1000, 1100, CPU)
    evs = [c1, bwd, inner, launch, mm, op, c0,
           _kernel("call0", 235, 400, annotation=True),                # GPU copy of the range
           _kernel("dfgnn::gat_layer::projection", 235, 340),          # GPU copy of a phase
           _kernel("gemm", 235, 348), _kernel("logits", 340, 420),     # overlap 8
           _kernel("attention", 430, 860),                              # idle 10 before it
           _kernel("k1", 1050, 1060)]
    r0, r1 = call_traces(evs)
    assert r0["host"] == 300 and r0["first"] == 135 and r0["end"] == 760
    assert r0["busy"] == 113 + 72 + 430
    assert [k[2] for k in r0["kernels"]] == ["gemm", "logits", "attention"]
    assert [(o[0], o[2], o[3], o[4]) for o in r0["ops"]] == [
        (40, 0, 1, "dfgnn_C::gat_layer"), (50, 1, 1, "aten::mm"),
        (100, 2, 1, "cudaLaunchKernel"), (200, 0, 2, "autograd::engine::evaluate_function")]
    assert r1["kernels"] == [(50, 10, "k1")] and r1["ops"] == []


def test_call_traces_without_kernels_or_markers():
    assert call_traces([_kernel("k", 0, 5)]) == []
    (r,) = call_traces([_kernel("call0", 0, 10, CPU)])
    assert r["kernels"] == [] and r["busy"] == 0.0 and r["first"] != r["first"]   # nan
