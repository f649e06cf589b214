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

``--trace`` also prints one call's host ops and kernels on one clock
(:func:`call_traces`).  ``--cpu-top N`` also prints the N host ops of the forward (``--cpu-top-passes
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


def call_traces(events, marker: str = "call"):
    """Per call of a profile whose calls ran inside host ranges ``marker<k>``
    (``record_function``), on the profiler's one clock, in us from the call's
    start: ``{"host", "first", "end", "busy", "kernels", "ops"}`` -- the range's
    host time, the first kernel's start, the last kernel's end, the kernels' own
    time (overlaps counted once), the kernels ``[(start, duration, name)]`` that
    start before the next call, and the host ops ``[(start, duration, depth,
    thread, name)]`` up to three levels below the range (on its thread) or from
    the top of another thread (the autograd engine's; depth 0 = the first
    level), in start order.  GPU-side
    copies of host ranges (user annotations: the marker's, the op's
    ``dfgnn::`` phases) are not kernels."""
    import torch
    cuda = torch.autograd.DeviceType.CUDA

    def is_marker(ev):
        return ev.name.startswith(marker) and ev.name[len(marker):].isdigit()

    def is_kernel(ev):
        return (ev.device_type == cuda and not getattr(ev, "is_user_annotation", False)
                and not is_marker(ev) and not ev.name.startswith("dfgnn::"))

    def depth(ev):
        d, p = 0, ev.cpu_parent
        while p is not None and not is_marker(p):
            d, p = d + 1, p.cpu_parent
        return d

    steps = sorted((e.time_range.start, e.time_range.end) for e in events
                   if is_marker(e) and e.device_type != cuda)
    rows = []
    for k, (s, e) in enumerate(steps):
        nxt = steps[k + 1][0] if k + 1 < len(steps) else float("inf")
        kern = sorted((ev.time_range.start - s, ev.time_range.end - ev.time_range.start, ev.name)
                      for ev in events if is_kernel(ev) and s <= ev.time_range.start < nxt)
        ops = sorted((ev.time_range.start - s, ev.time_range.end - ev.time_range.start,
                      depth(ev), ev.thread, ev.name) for ev in events
                     if ev.device_type != cuda and not is_marker(ev)
                     and s <= ev.time_range.start < nxt and depth(ev) <= 2)
        busy, end = 0.0, kern[0][0] if kern else 0.0
        for a, d, _ in kern:
            busy += max(0.0, a + d - max(a, end))
            end = max(end, a + d)
        rows.append({"host": e - s, "first": kern[0][0] if kern else float("nan"),
                     "end": end, "busy": busy, "kernels": kern, "ops": ops})
    return rows


def trace(fn, reps: int = 7, warmup: int = 3):
    """:func:`call_traces` of ``reps`` synchronised calls of ``fn`` profiled
    with CPU and CUDA activity; the call whose last kernel ends at the median."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            torch.cuda.synchronize()
            with record_function(f"call{i}"):
                fn()
            torch.cuda.synchronize()
    rows = sorted(call_traces(prof.events()), key=lambda r: r["end"])
    return rows[len(rows) // 2]


def print_trace(r) -> None:
    """One traced call (:func:`trace`), host ops and kernels in start order."""
    print(f"    traced (profiled): host {r['host']:7.1f} first kernel @{r['first']:6.1f} "
          f"last end @{r['end']:7.1f} busy {r['busy']:7.1f} kernels {len(r['kernels'])}")
    for a, d, dep, th, n in r["ops"]:
        print(f"      cpu t{th % 1000:03d} @{a:7.1f} +{d:6.1f} {'  ' * dep}{n[:70]}")
    for a, d, n in r["kernels"]:
        print(f"      gpu      @{a:7.1f} +{d:6.1f} {n[:70]}")


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
    ap.add_argument("--trace", action="store_true",
                    help="also print one call's host ops and kernels on the profiler's "
                         "clock (call_traces: where the host leaves the GPU idle; host "
                         "times are the profiler's, several times the unprofiled ones)")
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
            if a.trace:
                print_trace(trace(fn))
        if a.cpu_top:
            for pname, fn in zip(("fwd", "fb"), bs.layer_calls(ours, x, ei)):
                if pname in passes:
                    print(f"    host ops of {pname}, self time per call:")
                    cpu_top(fn, a.reps, a.cpu_top)
        del ours, x

if __name__ == "__main__":
    main()
