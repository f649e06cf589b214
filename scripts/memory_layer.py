"""Where the peak memory of one fused layer forward+backward is (GPU only).

Builds the layer, its input and upstream gradient as ``dfgnn bench`` does
(:func:`pyg_dfgnn.bench.layers.build_case`, same seeds and graphs), runs one
warm-up forward+backward, then records the CUDA caching allocator's history
(``torch.cuda.memory._record_memory_history``) over one more and replays it:
the extra memory at the peak (what the bench's ``fwdbwd_peak_mb`` reports)
and the blocks live at that moment, grouped by where they were allocated
(the innermost frame in this package or an ATen / dfgnn C++ op).  Also the
allocated memory when each autograd node of the backward starts and ends,
which tells in which node the peak is.

    PYTHONPATH=. python scripts/memory_layer.py --graph powerlaw_100k \
        --cases transformer:8x10,gatv2:8x10 --dtypes float32,bfloat16
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from pyg_dfgnn.bench import config as bench_config
from pyg_dfgnn.bench.graphs import load_graph
from pyg_dfgnn.bench.layers import build_case, fused_factory

_OURS = ("pyg_dfgnn", "dfgnn")


def _where(frames) -> str:
    """A short label of an allocation's stack: the innermost frame of this
    package (Python) and the innermost named ATen / dfgnn op (C++)."""
    py = op = None
    for f in frames:
        name, fn = f.get("name", ""), f.get("filename", "")
        if op is None and ("at::_ops::" in name or "dfgnn::" in name):
            op = name.split("(")[0].replace("at::_ops::", "").split("::call")[0]
        if py is None and fn.endswith(".py") and "pyg_dfgnn" in fn:
            py = f"{fn.split('pyg_dfgnn/')[-1]}:{f.get('line')} {name}"
        if py is not None and op is not None:
            break
    return f"{py or '?'} | {op or '?'}"


def _replay(trace):
    """(peak bytes over the traced allocations, {label: bytes} live then)."""
    live, cur, peak, at_peak = {}, 0, 0, {}
    for ev in trace:
        a = ev["action"]
        if a == "alloc":
            live[ev["addr"]] = (ev["size"], ev.get("frames", []))
            cur += ev["size"]
            if cur > peak:
                peak, at_peak = cur, dict(live)
        elif a == "free_completed" and ev["addr"] in live:
            cur -= live.pop(ev["addr"])[0]
    groups = defaultdict(int)
    for size, frames in at_peak.values():
        groups[_where(frames)] += size
    return peak, groups


def _node_timeline(out, grad):
    """Allocated MiB when each backward node starts and ends (pre / post hooks
    on the nodes reachable from ``out``)."""
    rows, seen, stack = [], set(), [out.grad_fn]
    handles = []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        name = type(fn).__name__

        def pre(g, name=name):
            rows.append((name, "start", torch.cuda.memory_allocated() / 2**20,
                         torch.cuda.max_memory_allocated() / 2**20))

        def post(gi, go, name=name):
            rows.append((name, "end", torch.cuda.memory_allocated() / 2**20,
                         torch.cuda.max_memory_allocated() / 2**20))

        handles += [fn.register_prehook(pre), fn.register_hook(post)]
        stack += [n for n, _ in fn.next_functions]
    out.backward(grad)
    for h in handles:
        h.remove()
    return rows


def probe(graph, layer: str, shape: str, dtype: torch.dtype, dev, show: int):
    heads, chans = (int(s) for s in shape.split("x"))
    case = build_case(graph, layer, heads, chans, heads * chans, dtype, dev)
    prep = fused_factory(case)
    x = case.inputs[0].detach().requires_grad_(True)

    def zero():
        x.grad = None
        for p in prep.params.values():
            p.grad = None

    for _ in range(2):   # warm-up: CSR cache, schedule, cuBLAS workspaces
        zero()
        prep.fn(x).backward(case.grad_out)
    zero()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    prep.fn(x).backward(case.grad_out)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak_stat = (torch.cuda.max_memory_allocated() - base) / 2**20
    trace = snap["device_traces"][torch.cuda.current_device()]
    peak, groups = _replay(trace)
    print(f"\n== {graph.name} {layer} {shape} {str(dtype).replace('torch.', '')}: "
          f"f+b peak {peak_stat:.1f} MiB over the resident "
          f"(traced {peak / 2**20:.1f} MiB); live at the peak:")
    for label, b in sorted(groups.items(), key=lambda kv: -kv[1])[:show]:
        print(f"  {b / 2**20:8.1f} MiB  {label}")
    zero()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() / 2**20
    out = prep.fn(x)
    print(f"  after forward: {torch.cuda.memory_allocated() / 2**20 - base:.1f} MiB; "
          "backward nodes (allocated at start -> end, running peak, MiB over the resident):")
    for name, what, alloc, mx in _node_timeline(out, case.grad_out):
        if what == "end":
            print(f"    {name:28s} -> {alloc - base:8.1f}  (peak {mx - base:8.1f})")
        else:
            print(f"    {name:28s}    {alloc - base:8.1f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/bench_default.yaml")
    ap.add_argument("--graph", default="powerlaw_100k")
    ap.add_argument("--cases", default="transformer:8x10,gatv2:8x10")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--show", type=int, default=12)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("memory_layer.py needs a CUDA device")
    cfg = bench_config.load_config(a.config)
    specs = [g for g in cfg["graphs"] if g["name"] == a.graph]
    if not specs:
        raise SystemExit(f"no graph {a.graph!r} in {a.config}")
    graph = load_graph(specs[0])
    dev = torch.device("cuda")
    for dt in a.dtypes.split(","):
        for c in a.cases.split(","):
            layer, shape = c.split(":")
            probe(graph, layer, shape, getattr(torch, dt), dev, a.show)


if __name__ == "__main__":
    main()
