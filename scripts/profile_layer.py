"""Where the time of one fused *layer* call goes (torch.profiler): GPU kernels
by total time, their sum against the wall time of the call (host-bound when
the wall time is much larger).  GPU only:

    PYTHONPATH=. python scripts/profile_layer.py --layer gat --shape 4x64 \
        --graph uniform_100k [--dtype bf16] [--reps 10]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_shapes as bs  # noqa: E402


def wall_and_kernels(fn, reps, warmup=3):
    """``(wall ms per call, GPU kernel ms per call, CUDA profiler events)`` of
    ``fn`` over ``reps`` calls after ``warmup``: the wall time unprofiled, the
    kernel time from a second, profiled round of calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / reps * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.key_averages() if e.device_time_total > 0
           and e.device_type.name == "CUDA"]
    return wall, sum(e.device_time_total for e in evs) / reps / 1e3, evs


def layer_args(ap: argparse.ArgumentParser, layer: str = "gat", shape: str = "4x64"):
    """The layer / shape / graph / dtype options shared with ncu_layer.py."""
    ap.add_argument("--layer", default=layer)
    ap.add_argument("--shape", default=shape)
    ap.add_argument("--graph", default="uniform_100k")
    ap.add_argument("--dtype", default="fp32")


def layer_case(a):
    """``(fused layer, x, x requiring grad, edge_index)`` on the GPU for ``a``."""
    dev = torch.device("cuda")
    spec = next(g for g in bs.GRAPHS if g["name"] == a.graph)
    g = bs.load_graph(spec)
    ei = g.edge_index.to(dev)
    heads, feat = (int(v) for v in a.shape.split("x"))
    _, ours, x = bs.build(a.layer, heads, feat, bs.DTYPES[a.dtype], dev, g.num_nodes)
    return ours, x, x.detach().requires_grad_(True), ei


def main(argv=None):
    ap = argparse.ArgumentParser()
    layer_args(ap)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--timeline", action="store_true",
                    help="also print one call's host timeline: every top-level ATen op "
                         "and CUDA runtime call, and every kernel, as offsets from the "
                         "call's start (gaps between host events are Python)")
    a = ap.parse_args(argv)
    ours, x, _, ei = layer_case(a)
    fwd, fb = bs.layer_calls(ours, x, ei)
    for name, fn in (("forward", fwd), ("forward+backward", fb)):
        wall, gpu, evs = wall_and_kernels(fn, a.reps)
        print(f"== {a.layer} {a.shape} {a.dtype} {a.graph} {name}: wall {wall:.3f} ms/call, "
              f"GPU kernels {gpu:.3f} ms/call")
        for e in sorted(evs, key=lambda e: -e.device_time_total)[:a.rows]:
            print(f"   {e.device_time_total / a.reps / 1e3:8.3f} ms  x{e.count // a.reps:<3d} "
                  f"{e.key[:110]}")
        if a.timeline:
            timeline(fn)


def timeline(fn, calls: int = 5):
    """Print the last of ``calls`` profiled calls as a timeline (us from the
    call's start): host events (top-level ATen ops / autograd nodes and CUDA
    runtime calls) and the kernels they launched."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    marks = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            torch.cuda.synchronize()
            with torch.profiler.record_function(f"call{i}"):
                fn()
            torch.cuda.synchronize()
            marks.append(f"call{i}")
    evs = prof.events()
    call = next(e for e in evs if e.name == marks[-1])
    t0, t1 = call.time_range.start, call.time_range.end
    rows = []
    for e in evs:
        st = e.time_range.start
        if e is call or not (t0 <= st <= t1 + 20000):
            continue
        gpu = e.device_type.name == "CUDA"
        top = e.cpu_parent is None or e.cpu_parent is call
        rt = e.name.startswith("cuda") and not gpu
        if gpu or top or rt:
            kind = "GPU " if gpu else ("rt  " if rt else "host")
            rows.append((st - t0, e.time_range.end - st, kind, e.name[:90]))
    rows.sort()
    print(f"   -- timeline of one call (host {t1 - t0:.0f} us), offset / duration us")
    for off, dur, kind, name in rows:
        print(f"   {off:9.1f} {dur:8.1f}  {kind} {name}")


if __name__ == "__main__":
    main()
