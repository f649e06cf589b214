"""Per-kernel GPU time of fused layers for A/B comparisons of kernel builds.

Runs every (graph, layer, shape, dtype) case in one process and writes one
JSON line per case: the GPU time per call of each attention kernel (forward,
backward row pass, column pass, merges) from torch.profiler, the layer's
forward and forward+backward wall medians (CUDA events), and the build it ran
(``PYG_DFGNN_NVCC_EXTRA``).  Compare two or more such files with
``--compare A.jsonl B.jsonl ...`` (ratios of each file to the first).  GPU only:

    PYG_DFGNN_CACHE=/tmp/c1 PYTHONPATH=. python scripts/kernel_ab.py --out a.jsonl
    PYG_DFGNN_NVCC_EXTRA="-DDFGNN_HALF_BATCH=2" PYG_DFGNN_CACHE=/tmp/c2 \\
        PYTHONPATH=. python scripts/kernel_ab.py --out b.jsonl
    python scripts/kernel_ab.py --compare a.jsonl b.jsonl

``--order row|degree`` and ``--split N`` force the schedule's work-item order
and split length instead (one build, a process per variant).

The same layer inputs (seeded) are used by every build; run each build in its
own process (the extension is built once per cache directory).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def kernel_class(name: str) -> str:
    for key in ("fwd_merge", "merge_sum", "fwd_kernel", "bwd_row", "bwd_col", "bwd_gat",
                "alpha_kernel"):
        if key in name:
            return key
    if "fwd_lean_kernel" in name or "fwd_gat_rows_kernel" in name:   # (the forward's variants)
        return "fwd_kernel"
    return ""


def gpu_times(fn, reps: int):
    """GPU time per call of ``fn`` (ms, torch.profiler over ``reps`` calls):
    the total of every CUDA kernel, and the attention kernels per class."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total, kern = 0.0, {}
    for ev in prof.key_averages():
        if ev.device_type.name != "CUDA" or ev.device_time_total <= 0:
            continue
        t = ev.device_time_total / reps / 1e3
        total += t
        k = kernel_class(ev.key)
        if k:
            kern[k] = kern.get(k, 0.0) + t
    return total, kern


def run(a) -> None:
    import torch
    import bench_shapes as bs

    from pyg_dfgnn import schedule

    dev = torch.device("cuda")
    out = open(a.out, "w")
    extra = os.environ.get("PYG_DFGNN_NVCC_EXTRA", "")
    for k in ("order", "split"):
        if getattr(a, k) is not None:
            extra = (extra + " " if extra else "") + f"{k}={getattr(a, k)}"
    for var, tag in (("PYG_DFGNN_GAT_HUB_MIN", "hub_min"),
                     ("PYG_DFGNN_GAT_ROWS", "rows")):   # (GAT's run-time rules)
        if os.environ.get(var):
            extra = (extra + " " if extra else "") + f"{tag}={os.environ[var]}"
    print(f"device: {torch.cuda.get_device_name()}  build: '{extra}'", flush=True)
    for spec in bs.GRAPHS:
        if spec["name"] not in a.graphs.split(","):
            continue
        g = bs.load_graph(spec)
        ei = g.edge_index.to(dev)
        ctx = (schedule.override(order=a.order, split=a.split)
               if a.order or a.split is not None else contextlib.nullcontext())
        with ctx:
            _cases(a, spec, g, ei, dev, out, extra)
        del g, ei
        torch.cuda.empty_cache()


def _cases(a, spec, g, ei, dev, out, extra) -> None:
    """Every (layer, shape, dtype) case of ``a`` on one graph: one JSON line each."""
    import bench_shapes as bs
    from tune_schedule import timed
    for case in a.cases.split(","):
        lname, shp = case.split(":")
        heads, feat = (int(v) for v in shp.split("x"))
        for dname in a.dtypes.split(","):
            _, ours, x = bs.build(lname, heads, feat, bs.DTYPES[dname], dev, g.num_nodes)
            fwd, fb = bs.layer_calls(ours, x, ei)
            times = {pname + "_ms": timed(fn, warmup=a.warmup, reps=a.reps)
                     for pname, fn in (("fwd", fwd), ("fb", fb))}
            fwd_total, _ = gpu_times(fwd, a.prof_reps)
            total, kern = gpu_times(fb, a.prof_reps)
            row = {"graph": spec["name"], "layer": lname, "shape": shp, "dtype": dname,
                   "build": extra, **times, "gpu_fwd_ms": fwd_total, "gpu_fb_ms": total,
                   "kernels": kern}
            out.write(json.dumps(row) + "\n")
            out.flush()
            ks = " ".join(f"{k}={v:.3f}" for k, v in sorted(kern.items()))
            print(f"{spec['name']:14s} {lname:11s} {shp:5s} {dname:5s} fwd {times['fwd_ms']:.3f} "
                  f"fb {times['fb_ms']:.3f} gpu fwd {fwd_total:.3f} fb {total:.3f} | {ks}",
                  flush=True)
            del ours, x, fwd, fb


def _value(r: dict, k: str):
    """A kernel class's time of a case, ``bwd_all`` (every backward kernel,
    merges included: the row / column passes or GAT's single-gather passes),
    ``attn`` (all attention kernels), or a layer timing."""
    kern = r["kernels"]
    if k == "bwd_all":
        return sum(v for c, v in kern.items() if c.startswith("bwd") or c == "merge_sum") or None
    if k == "attn":
        return sum(kern.values()) or None
    return kern.get(k) if k.startswith(("fwd_k", "bwd")) else r.get(k)


def compare(files) -> None:
    runs = [{(r["graph"], r["layer"], r["shape"], r["dtype"]): r
             for r in map(json.loads, Path(f).read_text().splitlines())} for f in files]
    base = runs[0]
    print("ratios to " + files[0] + ": " + ", ".join(files[1:]))
    print(f"{'case':44s} {'kernel':10s} " + " ".join(f"{'base ms':>8s}" for _ in [0]) +
          "".join(f" {'x' + str(i + 1):>6s}" for i in range(len(runs) - 1)))
    ratios = {}
    for key, r0 in base.items():
        name = " ".join(key)
        for k in ("fwd_kernel", "bwd_row", "bwd_col", "bwd_all", "attn", "gpu_fwd_ms",
                  "gpu_fb_ms", "fb_ms", "fwd_ms"):
            v0 = _value(r0, k)
            if not v0:
                continue
            cells = []
            for i, run_ in enumerate(runs[1:]):
                r = run_.get(key)
                v = None if r is None else _value(r, k)
                cells.append(f" {v / v0:6.3f}" if v else f" {'-':>6s}")
                if v:
                    ratios.setdefault((i, key[3], k), []).append(v / v0)
            print(f"{name:44s} {k:10s} {v0:8.3f}" + "".join(cells))
    print("\nmedian ratio per (build, dtype, kernel):")
    for (i, dt, k), rs in sorted(ratios.items()):
        print(f"  x{i + 1} {dt:5s} {k:10s} {statistics.median(rs):.3f} (n={len(rs)}, "
              f"min {min(rs):.3f}, max {max(rs):.3f})")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="kernel_ab.jsonl")
    ap.add_argument("--graphs", default="uniform_100k,pattern_128")
    ap.add_argument("--cases", default="transformer:8x10,gat:8x19,gatv2:8x10,transformer:4x64,"
                                       "gat:4x64,gatv2:4x64,agnn:1x64")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--prof-reps", type=int, default=5)
    ap.add_argument("--order", choices=("row", "degree"), default=None,
                    help="force the work-item order (pyg_dfgnn.schedule.override)")
    ap.add_argument("--split", type=int, default=None,
                    help="force the split length of super rows (0 = none)")
    ap.add_argument("--compare", nargs="+")
    a = ap.parse_args(argv)
    if a.compare:
        compare(a.compare)
    else:
        run(a)


if __name__ == "__main__":
    main()
