"""Where the time of one fused op goes: per-kernel GPU time (torch.profiler)
against the wall time of forward+backward, on one benchmark graph.  GPU only:

    PYTHONPATH=. python scripts/profile_op.py [--graph pattern|uniform|powerlaw] [--kinds gat,dot,gatv2]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tune_schedule as ts  # noqa: E402
from pyg_dfgnn.graph import get_graph  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph", default="pattern")
    ap.add_argument("--kinds", default="gat,dot,gatv2")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--host", action="store_true",
                    help="profile the host (Python) side instead: cProfile of f+b calls "
                         "on a tiny graph, where the GPU work is negligible")
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    if a.host:
        return host_profile(a, dev)
    name = {"pattern": "PATTERN", "uniform": "uniform 100k", "powerlaw": "powerlaw"}[a.graph]
    gname, ei, n = next(x for x in ts.graphs(False) if name in x[0])
    ei = ei.to(dev)
    g = get_graph(ei, (n, n))
    kinds = {"gat": ts.GAT, "dot": ts.DOT, "gatv2": ts.GATV2}
    for kname in a.kinds.split(","):
        kind = kinds[kname]
        d = ts.make(kind, n, ei.size(1), 4, 64, dev)
        leaves = [v.requires_grad_(True) for v in d.values() if v is not None]
        gout = torch.randn(n, 4, 64, device=dev)

        def fb():
            out = ts.fused_call(kind, g, d)
            torch.autograd.grad(out, leaves, gout)
        wall = ts.timed(fb)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(a.reps):
                fb()
            torch.cuda.synchronize()
        print(f"== {gname} {kname}: f+b wall {wall:.3f} ms (median)")
        rows = [(e.key, e.device_time_total / a.reps / 1e3, e.count // a.reps)
                for e in prof.key_averages() if e.device_time_total > 0]
        rows.sort(key=lambda r: -r[1])
        tot = sum(r[1] for r in rows)
        for k, t, c in rows:
            print(f"  {t:8.3f} ms  x{c:<3d} {k[:110]}")
        print(f"  {tot:8.3f} ms  GPU total per iteration ({tot / wall:.0%} of wall)")


def host_profile(a, dev):
    import cProfile
    import pstats
    import time
    ei = torch.randint(0, 100, (2, 1600), device=dev)
    g = get_graph(ei, (100, 100))
    kinds = {"gat": ts.GAT, "dot": ts.DOT, "gatv2": ts.GATV2}
    for kname in a.kinds.split(","):
        kind = kinds[kname]
        d = ts.make(kind, 100, 1600, 4, 64, dev)
        leaves = [v.requires_grad_(True) for v in d.values() if v is not None]
        gout = torch.randn(100, 4, 64, device=dev)

        def fb():
            out = ts.fused_call(kind, g, d)
            torch.autograd.grad(out, leaves, gout)

        def fwd():
            with torch.no_grad():
                ts.fused_call(kind, g, d)
        for name, fn in (("fwd (no_grad)", fwd), ("f+b", fb)):
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(500):
                fn()
            torch.cuda.synchronize()
            print(f"== {kname} {name}: {(time.perf_counter() - t) / 500 * 1e6:.1f} us per call")
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(500):
            fb()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
