"""Layer-level shape x dtype matrix: pyg_dfgnn.nn layers against PyG's own
layers with the same weights, on the shapes people train with (issue 11).

    PYTHONPATH=. python scripts/bench_shapes.py --out shapes.json [--quick]

For every graph (uniform 100k/1.6M, power-law 100k/1.4M with super nodes,
PATTERN-like batch of 128 graphs), layer (GAT, GATv2, Transformer, AGNN),
shape (heads x features: 4x64, 8x10, 8x19; AGNN is single-head with
F = heads*features) and dtype (fp32, bf16): median forward and
forward+backward time (CUDA events, warm-up, contenders interleaved
round-robin on the same inputs, eval mode) and the peak memory of one
forward+backward.  Prints one table row per case; the JSON holds every number.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_geometric.nn as pygnn  # noqa: E402

import pyg_dfgnn.nn as dnn  # noqa: E402
from pyg_dfgnn.bench.graphs import load_graph  # noqa: E402
from tune_schedule import timed_interleaved  # noqa: E402

GRAPHS = [
    {"name": "uniform_100k", "kind": "uniform", "num_nodes": 100000, "num_edges": 1600000,
     "seed": 0},
    {"name": "powerlaw_100k", "kind": "powerlaw", "num_nodes": 100000, "num_edges": 1400000,
     "max_degree": 60000, "seed": 2},
    {"name": "pattern_128", "kind": "pattern", "num_graphs": 128, "seed": 0},
]
LAYERS = {"gat": "GATConv", "gatv2": "GATv2Conv", "transformer": "TransformerConv",
          "agnn": "AGNNConv"}
SHAPES = [(4, 64), (8, 10), (8, 19)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build(name, heads, feat, dtype, dev, n):
    cls = LAYERS[name]
    torch.manual_seed(0)
    if name == "agnn":
        kw, fin = {"requires_grad": True}, heads * feat
    else:
        kw, fin = {"in_channels": 64, "out_channels": feat, "heads": heads}, 64
    ref = getattr(pygnn, cls)(**kw).to(dev, dtype).eval()
    ours = getattr(dnn, cls)(**kw).to(dev, dtype).eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(n, fin, device=dev, dtype=dtype)
    return ref, ours, x


def graph_cases(graphs: str, cases: str, dtypes: str, dev):
    """Every ``(spec, graph, edge_index on dev, layer, "HxF", H, F, dtype name)``
    of the comma-separated ``graphs`` (names in :data:`GRAPHS`), ``cases``
    (``layer:HxF``) and ``dtypes`` (keys of :data:`DTYPES`), graph by graph;
    a graph's memory is given back before the next one is loaded."""
    for spec in GRAPHS:
        if spec["name"] not in graphs.split(","):
            continue
        g = load_graph(spec)
        ei = g.edge_index.to(dev)
        for case in cases.split(","):
            lname, shp = case.split(":")
            heads, feat = (int(v) for v in shp.split("x"))
            for dname in dtypes.split(","):
                yield spec, g, ei, lname, shp, heads, feat, dname
        del g, ei
        torch.cuda.empty_cache()


def layer_calls(m, x, ei):
    """``(forward, forward+backward)`` calls of the layer ``m`` as the timing
    scripts run them: the forward without autograd; the forward on a copy of
    ``x`` that requires grad and a backward of ones (made once).  As the
    bench's forward+backward and a training step after
    ``zero_grad(set_to_none=True)``, each call starts without gradients, so
    the backward hands its gradients over instead of adding them to the last
    call's (one ``add_`` kernel per parameter, and its host time, otherwise)."""
    xs = x.detach().requires_grad_(True)
    params = [p for p in m.parameters() if p.requires_grad]
    gout = []

    def fwd():
        with torch.no_grad():
            m(x, ei)

    def fb():
        xs.grad = None
        for p in params:
            p.grad = None
        out = m(xs, ei)
        if not gout or gout[0].shape != out.shape:
            gout[:] = [torch.ones_like(out)]
        out.backward(gout[0])
    return fwd, fb


def measure(mods, x, ei, reps, warmup):
    """Interleaved medians (ms) of fwd and fwd+bwd, and peak MiB of fwd+bwd."""
    res = {}
    # every (contender, pass) timed round-robin with CUDA events (tune_schedule.py)
    fns = {}
    for k, m in mods.items():
        fns[k, "fwd"], fns[k, "fb"] = layer_calls(m, x, ei)
    med = timed_interleaved(fns, warmup=warmup, reps=reps)
    for k, m in mods.items():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fns[k, "fb"]()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        res[k] = {"fwd_ms": med[k, "fwd"], "fb_ms": med[k, "fb"], "peak_mib": peak}
        for p in m.parameters():
            p.grad = None
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--graphs", default=",".join(g["name"] for g in GRAPHS))
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--shapes", default=",".join(f"{h}x{f}" for h, f in SHAPES))
    ap.add_argument("--dtypes", default="fp32,bf16")
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    rows = []
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    print(f"{'graph':14s} {'layer':12s} {'shape':6s} {'dt':5s} {'fused fwd':>9s} "
          f"{'f+b':>8s} {'pyg fwd':>8s} {'f+b':>8s} {'x fwd':>6s} {'x f+b':>6s} "
          f"{'mem ratio':>9s}", flush=True)
    for spec in GRAPHS:
        if spec["name"] not in a.graphs.split(","):
            continue
        g = load_graph(spec)
        ei = g.edge_index.to(dev)
        for lname in a.layers.split(","):
            for shp in a.shapes.split(","):
                heads, feat = (int(v) for v in shp.split("x"))
                for dname in a.dtypes.split(","):
                    dtype = DTYPES[dname]
                    t0 = time.time()
                    try:
                        ref, ours, x = build(lname, heads, feat, dtype, dev, g.num_nodes)
                        r = measure({"fused": ours, "pyg": ref}, x, ei, a.reps, a.warmup)
                    except torch.cuda.OutOfMemoryError as e:
                        r = {"error": f"OOM: {e}"[:200]}
                    torch.cuda.empty_cache()
                    row = {"graph": spec["name"], "layer": lname, "shape": shp,
                           "dtype": dname, **r, "wall_s": time.time() - t0}
                    rows.append(row)
                    if "error" in r:
                        print(f"{spec['name']:14s} {lname:12s} {shp:6s} {dname:5s} {r['error']}")
                        continue
                    f, p = r["fused"], r["pyg"]
                    print(f"{spec['name']:14s} {lname:12s} {shp:6s} {dname:5s} "
                          f"{f['fwd_ms']:9.3f} {f['fb_ms']:8.3f} {p['fwd_ms']:8.3f} "
                          f"{p['fb_ms']:8.3f} {p['fwd_ms'] / f['fwd_ms']:6.1f} "
                          f"{p['fb_ms'] / f['fb_ms']:6.1f} "
                          f"{p['peak_mib'] / max(f['peak_mib'], 1e-9):9.1f}", flush=True)
        del ei
    if a.out:
        Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                           "torch": torch.__version__, "rows": rows},
                                          indent=1))


if __name__ == "__main__":
    main()
