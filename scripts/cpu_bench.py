"""CPU benchmark: the fused layers (C++ CPU kernels) against PyG's own layers.

Default problem (issue 15): uniform random graph, 10k nodes / 160k edges,
4 heads x 64 channels on 64 input features, all four layers, 2 threads::

    python scripts/cpu_bench.py                      # table on stdout
    python scripts/cpu_bench.py --json out.json      # + machine-readable rows

Timings: forward (under ``torch.no_grad``) and forward+backward (gradients of
the input and all parameters), medians of ``--repeats`` runs; fused and PyG
calls are interleaved (alternating order) so that load from other processes
on a shared machine hits both alike.  Both layers hold the same weights and
see the same inputs; their outputs and gradients are checked to agree first.

Peak memory of one forward+backward, two ways (``tracemalloc`` only sees
Python's own allocator, not torch tensors):

* ``alloc``: the peak of the tensor memory allocated during the call above
  what was allocated before it (``torch.profiler`` allocation events, as
  ``dfgnn bench`` reports it; see ``pyg_dfgnn.bench.timing``);
* ``rss``: the resident-set high-water mark above the RSS before the call
  (Linux ``/proc/self/clear_refs``), each contender in a fresh subprocess
  with glibc's mmap threshold fixed at 64 KiB, so every tensor is mapped on
  allocation and unmapped on free.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYERS = {"gat": "GATConv", "gatv2": "GATv2Conv", "transformer": "TransformerConv",
          "agnn": "AGNNConv"}


def make(layer, args):
    import torch
    import torch_geometric.nn as pygnn
    import pyg_dfgnn.nn as dnn
    from pyg_dfgnn.data.synthetic import uniform_graph
    ei = uniform_graph(args.nodes, args.edges, seed=0)
    if layer == "agnn":
        kw = {"requires_grad": True}
        fin = args.channels
        out_dim = args.channels
    else:
        kw = {"in_channels": args.in_channels, "out_channels": args.channels,
              "heads": args.heads}
        fin = args.in_channels
        out_dim = args.heads * args.channels
    torch.manual_seed(0)
    native = getattr(pygnn, LAYERS[layer])(**kw)
    fused = getattr(dnn, LAYERS[layer])(**kw)
    fused.load_state_dict(native.state_dict())
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.nodes, fin, generator=gen)
    gout = torch.randn(args.nodes, out_dim, generator=gen)
    return ei, native, fused, x, gout


def fns(mod, ei, x, gout):
    import torch
    xr = x.detach().clone().requires_grad_(True)

    def fwd():
        with torch.no_grad():
            return mod(x, ei)

    def step():
        xr.grad = None
        for p in mod.parameters():
            p.grad = None
        mod(xr, ei).backward(gout)
    return fwd, step, xr


def check(native, fused, ei, x, gout):
    """Max error of fused vs PyG over the output and every gradient, relative to
    the tensor's largest magnitude when that is above 1 (absolute below: some
    gradients are 0 analytically, e.g. of the key bias, and both sides hold
    rounding noise there)."""
    import torch
    res = []
    for m in (native, fused):
        xr = x.detach().clone().requires_grad_(True)
        for p in m.parameters():
            p.grad = None
        out = m(xr, ei)
        out.backward(gout)
        res.append([out.detach(), xr.grad] + [p.grad for p in m.parameters()])
    err = 0.0
    for a, b in zip(*res):
        if a is None or b is None:
            continue
        err = max(err, float((a - b).abs().max() / b.abs().max().clamp_min(1.0)))
    return err


def time_layer(layer, args):
    import torch
    ei, native, fused, x, gout = make(layer, args)
    err = check(native, fused, ei, x, gout)
    cont = {"pyg": fns(native, ei, x, gout), "fused": fns(fused, ei, x, gout)}
    times = {(c, k): [] for c in cont for k in ("fwd", "fwdbwd")}
    for _ in range(args.warmup):
        for c in cont:
            cont[c][0]()
            cont[c][1]()
    for r in range(args.repeats):
        order = list(cont) if r % 2 == 0 else list(cont)[::-1]
        for k, idx in (("fwd", 0), ("fwdbwd", 1)):
            for c in order:
                t = time.perf_counter()
                cont[c][idx]()
                times[(c, k)].append((time.perf_counter() - t) * 1e3)
    med = {f"{c}_{k}_ms": statistics.median(v) for (c, k), v in times.items()}
    from pyg_dfgnn.bench.timing import cpu_peak_memory_mb
    for c, (fwd, step, _) in cont.items():
        step()
        med[f"{c}_fwdbwd_alloc_mb"] = cpu_peak_memory_mb(step)
    return dict(layer=layer, max_rel_err=err, **med)


def _rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(field)


def memory_child(layer, contender, args):
    """Runs in a fresh process: extra peak RSS (MiB) of one forward+backward."""
    import gc
    import torch
    torch.set_num_threads(args.threads)
    ei, native, fused, x, gout = make(layer, args)
    mod = native if contender == "pyg" else fused
    fwd, step, xr = fns(mod, ei, x, gout)
    step()  # warm-up: one-time conversions / caches / kernel build
    step()
    xr.grad = None
    for p in mod.parameters():
        p.grad = None
    res = {}
    for name, fn in (("fwd", fwd), ("fwdbwd", step)):
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the RSS high-water mark to the current RSS
        base = _rss_kb("VmRSS:")
        fn()
        res[f"{contender}_{name}_rss_mb"] = (_rss_kb("VmHWM:") - base) / 1024
        xr.grad = None
        for p in mod.parameters():
            p.grad = None
    return res


def memory_layer(layer, args):
    out = {}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    for c in ("pyg", "fused"):
        cmd = [sys.executable, __file__, "--child", layer, c] + _forward_args(args)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"memory child failed:\n{r.stderr}")
        out.update(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


def _forward_args(args):
    return ["--nodes", str(args.nodes), "--edges", str(args.edges), "--heads",
            str(args.heads), "--channels", str(args.channels), "--in-channels",
            str(args.in_channels), "--threads", str(args.threads)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=10000)
    p.add_argument("--edges", type=int, default=160000)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--in-channels", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--layers", default="gat,gatv2,transformer,agnn")
    p.add_argument("--no-rss", action="store_true", help="skip the RSS subprocesses")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--child", nargs=2, metavar=("LAYER", "CONTENDER"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(memory_child(args.child[0], args.child[1], args)))
        return 0
    from pyg_dfgnn import _build
    if _build.cpu_ops() is None:
        print("warning: CPU kernels unavailable; the fused layers run the reference path",
              file=sys.stderr)
    print(f"# CPU, {args.threads} threads, uniform graph {args.nodes} nodes / {args.edges} "
          f"edges, {args.heads}x{args.channels} (in {args.in_channels}); medians of "
          f"{args.repeats} interleaved runs; torch {torch.__version__}")
    hdr = (f"{'layer':12s} {'fwd pyg':>8s} {'fwd ours':>8s} {'x':>6s} {'f+b pyg':>8s} "
           f"{'f+b ours':>8s} {'x':>6s} | {'alloc MB pyg':>12s} {'ours':>6s} {'ratio':>6s} | "
           f"{'rss MB pyg':>10s} {'ours':>6s} {'ratio':>6s} | {'rel err':>7s}")
    print(hdr)
    rows = []
    for layer in args.layers.split(","):
        row = time_layer(layer, args)
        if not args.no_rss:
            row.update(memory_layer(layer, args))
        row["fwd_speedup"] = row["pyg_fwd_ms"] / row["fused_fwd_ms"]
        row["fwdbwd_speedup"] = row["pyg_fwdbwd_ms"] / row["fused_fwdbwd_ms"]
        cols = []
        for kind in ("alloc", "rss"):
            mp, mf = row.get(f"pyg_fwdbwd_{kind}_mb"), row.get(f"fused_fwdbwd_{kind}_mb")
            row[f"{kind}_ratio"] = mf / mp if mp else None
            w = 12 if kind == "alloc" else 10
            cols.append(f"{mp:{w}.1f} {mf:6.1f} {row[f'{kind}_ratio']:6.3f}" if mp else
                        f"{'-':>{w}s} {'-':>6s} {'-':>6s}")
        rows.append(row)
        print(f"{layer:12s} {row['pyg_fwd_ms']:8.2f} {row['fused_fwd_ms']:8.2f} "
              f"{row['fwd_speedup']:5.2f}x {row['pyg_fwdbwd_ms']:8.2f} "
              f"{row['fused_fwdbwd_ms']:8.2f} {row['fwdbwd_speedup']:5.2f}x | {cols[0]} | "
              f"{cols[1]} | {row['max_rel_err']:7.1e}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
