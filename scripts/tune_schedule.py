"""Kernel timings per graph shape and schedule: fused (automatic schedule),
fused with forced schedules (lane group, split length, 0 = fixed node-parallel
mapping, work items in CSR or degree order), and native gather + PyG softmax +
scatter on the same inputs.  The fused variants are timed round-robin (one
call of each per round, median of 15 rounds) so drift during the run favours
none of them.

This is the script that measured the schedule thresholds in
pyg_dfgnn/schedule.py (docs/BENCHMARKS.md).  GPU only:

    PYTHONPATH=. python scripts/tune_schedule.py [--quick] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from pyg_dfgnn import schedule
from pyg_dfgnn.graph import get_graph
from pyg_dfgnn.ops import DOT, GAT, GATV2, reference as R
from pyg_dfgnn import ops


def timed(fn, warmup=3, reps=15):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def timed_interleaved(fns, warmup=3, reps=15):
    """Median ms of each callable in ``fns`` (name -> fn), timed round-robin
    (one call of each per round) so clock or allocator drift during the run
    cannot favour whichever variant happens to run first."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    ts = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts[k].append(a.elapsed_time(b))
    return {k: statistics.median(v) for k, v in ts.items()}


def peak(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def graphs(quick):
    from pyg_dfgnn.data.synthetic import powerlaw_graph, uniform_graph
    out = []
    s = 10 if quick else 1
    out.append(("uniform 100k/1.6M", uniform_graph(100_000 // s, 1_600_000 // s, 0), 100_000 // s))
    out.append(("powerlaw 100k/1.4M max60k",
                powerlaw_graph(100_000 // s, 1_400_000 // s, 60_000 // s, 0), 100_000 // s))
    try:
        from pyg_dfgnn.data.sbm import pattern_like_batch
        b = pattern_like_batch(128 // (4 if quick else 1), 0)
        out.append((f"PATTERN-like x{128 // (4 if quick else 1)}", b.edge_index, b.num_nodes))
    except Exception as e:  # pragma: no cover
        print("pattern_like_batch unavailable:", e, file=sys.stderr)
    if not quick:
        out.append(("uniform 500k/8M", uniform_graph(500_000, 8_000_000, 0), 500_000))
    return out


def make(kind, n, E, H, F, dev):
    r = lambda *s: torch.randn(*s, device=dev)  # noqa: E731
    if kind == GAT:
        return dict(dst=r(n, H), src=r(n, H), val=r(n, H, F), edge=None, att=None)
    if kind == GATV2:
        return dict(dst=r(n, H, F), src=r(n, H, F), val=None, edge=None, att=r(H, F))
    return dict(dst=r(n, H, F), src=r(n, H, F), val=r(n, H, F), edge=None, att=None)


def fused_call(kind, g, d):
    if kind == GAT:
        return ops.gat_attention(g, d["val"], d["src"], d["dst"])[0]
    if kind == GATV2:
        return ops.gatv2_attention(g, d["src"], d["dst"], d["att"])[0]
    return ops.dot_attention(g, d["dst"], d["src"], d["val"])[0]


def naive_call(kind, ei, n, d):
    F = (d["val"] if d["val"] is not None else d["src"]).size(-1)
    return R.naive_attention(kind, ei, n, d["dst"], d["src"], d["val"], d["edge"], d["att"],
                             F ** -0.5 if kind == DOT else 1.0)[0]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--feat", type=int, default=64)
    ap.add_argument("--kinds", default="gat,dot,gatv2")
    ap.add_argument("--variants", default="auto,nosplit,split512,split2048,g4,g16,rows",
                    help="schedules to time (comma list; 'auto' is always timed; "
                         "'rows' / 'degree' force the work-item order)")
    ap.add_argument("--graphs", default="", help="substrings of graph names to keep")
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    H, F = a.heads, a.feat
    kinds = {"gat": GAT, "dot": DOT, "gatv2": GATV2}
    variants = [("auto", None, None, None), ("nosplit", None, 0, None),
                ("split512", None, 512, None), ("split2048", None, 2048, None),
                ("g4", 4, None, None), ("g16", 16, None, None),
                ("rows", None, None, "row"), ("degree", None, None, "degree")]
    keep = set(a.variants.split(",")) | {"auto"}
    variants = [v for v in variants if v[0] in keep]
    rows = []
    for gname, ei, n in graphs(a.quick):
        if a.graphs and not any(k in gname for k in a.graphs.split(",")):
            continue
        ei = ei.to(dev)
        g = get_graph(ei, (n, n))
        for kname in a.kinds.split(","):
            kind = kinds[kname]
            d = make(kind, n, ei.size(1), H, F, dev)
            for v in d.values():
                if v is not None:
                    v.requires_grad_(True)
            leaves = [v for v in d.values() if v is not None]
            gout = torch.randn(n, H, F, device=dev)

            def fb(f):
                out = f()
                torch.autograd.grad(out, leaves, gout)
            res = {"graph": gname, "kind": kname, "E": ei.size(1), "max_in": g.max_in_degree}
            def under(grp, split, order, fn):
                def call():
                    with schedule.override(group=grp, split=split, order=order):
                        return fn()
                return call
            fwd_fns, fb_fns = {}, {}
            for vname, grp, split, order in variants:
                f = under(grp, split, order, lambda: fused_call(kind, g, d))
                fwd_fns[vname] = f
                fb_fns[vname] = (lambda f=f: fb(f))
            for vname, t in timed_interleaved(fwd_fns).items():
                res[f"fwd_{vname}"] = t
            for vname, t in timed_interleaved(fb_fns).items():
                res[f"fb_{vname}"] = t
            res["mem_fused"] = peak(fb_fns["auto"])
            res["plan"] = schedule.explain_schedule(g, kind, F, H).split("\n")[1]
            try:
                nf = lambda: naive_call(kind, ei, n, d)  # noqa: E731
                res["fwd_pyg"] = timed(nf, 2, 5)
                res["fb_pyg"] = timed(lambda: fb(nf), 2, 5)
                res["mem_pyg"] = peak(lambda: fb(nf))
            except torch.cuda.OutOfMemoryError:
                res["fwd_pyg"] = res["fb_pyg"] = res["mem_pyg"] = float("nan")
            torch.cuda.empty_cache()
            rows.append(res)
            best_f = min(res[f"fwd_{v[0]}"] for v in variants)
            best_b = min(res[f"fb_{v[0]}"] for v in variants)
            print(f"{gname:28s} {kname:5s} fwd auto {res['fwd_auto']:.3f} ms "
                  f"(best {best_f:.3f}, nosplit {res.get('fwd_nosplit', float('nan')):.3f}, pyg "
                  f"{res['fwd_pyg']:.3f}, x{res['fwd_pyg'] / res['fwd_auto']:.1f}) | f+b auto "
                  f"{res['fb_auto']:.3f} (best {best_b:.3f}, nosplit {res.get('fb_nosplit', float('nan')):.3f}, "
                  f"pyg {res['fb_pyg']:.3f}, x{res['fb_pyg'] / res['fb_auto']:.1f}) | mem "
                  f"{res['mem_fused']:.0f} vs {res['mem_pyg']:.0f} MB", flush=True)
    if a.json:
        env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "cuda": torch.version.cuda}
        with open(a.json, "w") as fh:
            json.dump({"env": env, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
