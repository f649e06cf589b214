"""Where the wall time of one synchronised layer call goes beyond its GPU
kernels (GPU only): the bench's measure (CUDA events around one call, then a
sync) is the GPU's time from the start event to the end event, which includes
the host's work before the first kernel starts, any idle gaps between the
call's kernels (the host slower than the GPU) and the end event.

Per case and call (``fwd``: no-grad forward, ``fb``: forward+backward), medians
in us of

* ``wall``: the CUDA-event measure, unprofiled;
* ``host``: the host's time inside the call (no sync), unprofiled;
* ``pre``: the GPU's idle time from the call's start to its first kernel,
  ``busy``: the kernels' own time (overlaps counted once), ``gaps``: idle GPU
  time between them -- from calls profiled with CUDA activity only, each
  between two marker kernels.

``--cpu-top N`` also prints the N host ops of the forward (``--cpu-top-passes
fb``: of forward+backward) with the most self CPU time (torch.profiler, CPU
activity)::

    PYTHONPATH=. python scripts/call_timeline.py --graphs uniform_100k \\
        --cases gat:4x64,transformer:4x64 --dtypes fp32,bf16
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def split_calls(events, marker: str = "spin"):
    """``[(pre, busy, gaps)]`` (us) of every call between two marker kernels
    (``marker`` in the kernel's name) in the profiler's CUDA ``events``: the
    first marker's end to the call's first kernel, the kernels' own time
    (overlaps counted once), and the idle time between them."""
    import torch
    cuda = torch.autograd.DeviceType.CUDA
    kern = sorted((e.time_range.start, e.time_range.end, marker in e.name) for e in events
                  if e.device_type == cuda and e.time_range.end > e.time_range.start)
    rows, open_at, ks = [], None, []
    for s, e, is_marker in kern:
        if not is_marker:
            if open_at is not None:
                ks.append((s, e))
            continue
        if open_at is not None and ks:
            busy = gaps = 0.0
            end = ks[0][0]
            for a, b in ks:
                if a > end:
                    gaps += a - end
                busy += max(0.0, b - max(a, end))
                end = max(end, b)
            rows.append((ks[0][0] - open_at, busy, gaps))
        open_at, ks = e, []
    return rows


def timeline(fn, reps: int, warmup: int = 5):
    """Medians ``{wall, host, pre, busy, gaps, n}`` (us) of ``reps`` calls:
    ``wall`` the CUDA-event measure, ``host`` the host's time in the call
    (no sync inside it), both unprofiled; ``pre`` / ``busy`` / ``gaps`` from
    calls profiled with CUDA activity only (no CPU op recording), each call
    between two marker kernels (``torch.cuda._sleep``) so that ``pre`` is
    the GPU's idle time from the call's start to its first kernel."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile
    from tune_schedule import timed
    wall = timed(fn, warmup=warmup, reps=3 * reps) * 1e3
    host = []
    for _ in range(3 * reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            torch.cuda._sleep(1)
            fn()
            torch.cuda._sleep(1)
            torch.cuda.synchronize()
    rows = split_calls(prof.events())
    med = {k: statistics.median(r[i] for r in rows) if rows else float("nan")
           for i, k in enumerate(("pre", "busy", "gaps"))}
    return {**med, "wall": wall, "host": statistics.median(host), "n": len(rows)}


def cpu_top(fn, reps: int, top: int) -> None:
    """The ``top`` host ops of ``fn`` by self CPU time per call."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    evs = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    for e in evs:
        print(f"      {e.self_cpu_time_total / reps:7.1f} us  x{e.count / reps:4.1f}  {e.key}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default="uniform_100k")
    ap.add_argument("--cases", default="gat:4x64")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cpu-top", type=int, default=0)
    ap.add_argument("--cpu-top-passes", default="fwd",
                    help="the calls --cpu-top profiles: fwd, fb or fwd,fb (fb: forward "
                         "and backward, the backward's ops on the autograd engine's thread "
                         "included)")
    a = ap.parse_args(argv)
    passes = a.cpu_top_passes.split(",")
    if not set(passes) <= {"fwd", "fb"}:
        ap.error(f"--cpu-top-passes: fwd and / or fb, got {a.cpu_top_passes!r}")

    import torch
    import bench_shapes as bs

    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}; us per call, medians "
          f"(wall and host unprofiled; pre / busy / gaps from CUDA-only profiled calls)",
          flush=True)
    for spec, g, ei, lname, shp, heads, feat, dname in bs.graph_cases(a.graphs, a.cases,
                                                                      a.dtypes, dev):
        _, ours, x = bs.build(lname, heads, feat, bs.DTYPES[dname], dev, g.num_nodes)
        for pname, fn in zip(("fwd", "fb"), bs.layer_calls(ours, x, ei)):
            r = timeline(fn, a.reps)
            print(f"{spec['name']:14s} {lname:11s} {shp:5s} {dname:5s} {pname:3s} "
                  f"wall {r['wall']:7.1f} host {r['host']:6.1f} | pre {r['pre']:6.1f} "
                  f"busy {r['busy']:7.1f} gaps {r['gaps']:6.1f} (n {r['n']})", flush=True)
        if a.cpu_top:
            for pname, fn in zip(("fwd", "fb"), bs.layer_calls(ours, x, ei)):
                if pname in passes:
                    print(f"    host ops of {pname}, self time per call:")
                    cpu_top(fn, a.reps, a.cpu_top)
        del ours, x

if __name__ == "__main__":
    main()
