"""scripts/call_timeline.py's split of profiled calls (CPU only: synthetic
profiler events)."""
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from call_timeline import split_calls  # noqa: E402

CUDA = torch.autograd.DeviceType.CUDA


def _kernel(name, start, end, device=CUDA):
    return SimpleNamespace(name=name, device_type=device,
                           time_range=SimpleNamespace(start=start, end=end))


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
