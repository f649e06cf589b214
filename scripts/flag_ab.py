"""A/B of one code path switch in one process: a module-level ``[bool]`` flag
(e.g. ``pyg_dfgnn.nn.gat_conv:LAYER_OP``) alternated between rounds on the same
layers and inputs, so host-time differences are not lost in the spread between
processes (docs/KERNELS.md, session 27).  GPU only::

    PYTHONPATH=. python scripts/flag_ab.py --flag pyg_dfgnn.nn.gat_conv:LAYER_OP \\
        --graphs pattern_128,uniform_100k --cases gat:8x10,gat:4x64 --dtypes fp32,bf16

Per (graph, layer, shape, dtype) and flag value, medians over ``--rounds``
rounds (the flag alternates in each round, on first in odd rounds, off first in
even ones) of:

* ``fwd`` / ``fb``: a synchronised no-grad forward and forward+backward, ms
  (CUDA events around one call, medians of ``--reps``: the layer benchmark's
  measure);
* ``host_f`` / ``host_b``: host time per training-mode forward / backward, us,
  the GPU queue kept busy (``scripts/host_overhead.py``), per layer of a stack
  of ``--stack`` layers of width heads x features (one forward, one backward
  per stack);
* ``gpu_fb``: GPU kernel time of a forward+backward, ms (torch.profiler).

Prints one line per case and flag value, then the ratios on / off; ``--out``
writes the rows as JSON lines.
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def measure(conv, stack, x, xh, ei, reps: int, calls: int, prof_reps: int) -> dict:
    """One round's numbers of one flag value (see the module docstring)."""
    import host_overhead as ho
    from bench_shapes import layer_calls
    from kernel_ab import gpu_times
    from tune_schedule import timed
    fwd, fb = layer_calls(conv, x, ei)
    r = {"fwd": timed(fwd, reps=reps), "fb": timed(fb, reps=reps)}
    hf, hb, _, _ = ho.host_times(stack, xh, ei, calls, 1)
    d = len(stack.convs)
    r["host_f"], r["host_b"] = hf / d, hb / d
    r["gpu_fb"] = gpu_times(fb, prof_reps)[0]
    return r


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flag", required=True, help="module:NAME of a [bool] list")
    ap.add_argument("--graphs", default="pattern_128,uniform_100k")
    ap.add_argument("--cases", default="gat:8x10")
    ap.add_argument("--dtypes", default="fp32")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--calls", type=int, default=20, help="host time: calls per timed loop")
    ap.add_argument("--stack", type=int, default=4)
    ap.add_argument("--prof-reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch
    import bench_shapes as bs
    import host_overhead as ho

    import pyg_dfgnn.nn as dnn

    mod, name = a.flag.split(":")
    flag = getattr(importlib.import_module(mod), name)
    dev = torch.device("cuda")
    out = open(a.out, "w") if a.out else None
    print(f"device: {torch.cuda.get_device_name()}  flag: {a.flag}", flush=True)
    summary = []
    for spec, g, ei, lname, shp, heads, feat, dname in bs.graph_cases(a.graphs, a.cases,
                                                                      a.dtypes, dev):
        dt = bs.DTYPES[dname]
        _, conv, x = bs.build(lname, heads, feat, dt, dev, g.num_nodes)
        # host times: training mode, a stack of layers of one width (as in
        # a model), the bench layer's dtype
        w = heads * feat
        one = (getattr(dnn, bs.LAYERS[lname])(requires_grad=True) if lname == "agnn"
               else getattr(dnn, bs.LAYERS[lname])(w, feat, heads=heads, dropout=0.1))
        stack = ho._Stack(one.to(dev, dt).train(), a.stack)
        xh = torch.randn(g.num_nodes, w, device=dev, dtype=dt, requires_grad=True)
        rows = {True: [], False: []}
        for rnd in range(a.rounds):
            order = (True, False) if rnd % 2 == 0 else (False, True)
            for v in order:
                flag[0] = v
                rows[v].append(measure(conv, stack, x, xh, ei, a.reps, a.calls,
                                       a.prof_reps))
        flag[0] = True
        med = {v: {k: statistics.median(r[k] for r in rows[v]) for k in rows[v][0]}
               for v in rows}
        key = f"{spec['name']:14s} {lname:11s} {shp:5s} {dname:5s}"
        for v in (True, False):
            m = med[v]
            print(f"{key} {'on ' if v else 'off'}: fwd {m['fwd']:.3f} fb {m['fb']:.3f} "
                  f"ms | host fwd {m['host_f']:6.1f} bwd {m['host_b']:6.1f} us | "
                  f"gpu fb {m['gpu_fb']:.3f} ms", flush=True)
            if out:
                out.write(json.dumps({"graph": spec["name"], "layer": lname,
                                      "shape": shp, "dtype": dname, "flag": v,
                                      **m, "rounds": rows[v]}) + "\n")
        summary.append((key, {k: med[True][k] / med[False][k] for k in med[True]}))
        del conv, x, stack, xh
    print("\nratios on / off (medians over rounds):")
    for key, r in summary:
        print(f"{key} " + " ".join(f"{k} {v:.3f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
