"""Host time of one layer call at steady state (issue 12's "<= 40 us per layer
forward and the same for its backward"): the wall time of issuing a call while
the GPU is still busy with the queue, so the host never waits for it.  Per
layer (fused and PyG's, same weights) on a PATTERN-like batch whose CSR is
cached, training mode, fp32; plus the hottest Python functions of the fused
forward (cProfile).  GPU only:

    PYTHONPATH=. python scripts/host_overhead.py [--graphs 26] [--calls 40] [--top 12]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pyg_dfgnn.data import pattern_like_batch  # noqa: E402


def layers(width: int, heads: int):
    import torch_geometric.nn as pyg

    import pyg_dfgnn.nn as ours
    c = width // heads
    return {
        "gat": (ours.GATConv(width, c, heads=heads), pyg.GATConv(width, c, heads=heads)),
        "gatv2": (ours.GATv2Conv(width, c, heads=heads), pyg.GATv2Conv(width, c, heads=heads)),
        "gt": (ours.TransformerConv(width, c, heads=heads),
               pyg.TransformerConv(width, c, heads=heads)),
        "agnn": (ours.AGNNConv(), pyg.AGNNConv()),
    }


def host_times(conv, x, ei, calls: int):
    """(forward us, backward us) of host time per call, GPU queue kept busy."""
    def burn():  # a few ms of GPU work so the queue is never empty while timing
        a = torch.empty(4096, 4096, device=x.device)
        for _ in range(8):
            a = a @ a.T
            a = a / a.norm()

    outs = []
    for _ in range(3):  # warm-up (caches, plans)
        conv(x, ei).sum().backward()
    torch.cuda.synchronize()
    burn()
    t0 = time.perf_counter()
    for _ in range(calls):
        outs.append(conv(x, ei))
    fwd = (time.perf_counter() - t0) / calls * 1e6
    grads = [torch.ones_like(o) for o in outs]
    torch.cuda.synchronize()
    burn()
    t0 = time.perf_counter()
    for o, g in zip(outs, grads):
        o.backward(g)
    bwd = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return fwd, bwd


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphs", type=int, default=26)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--width", type=int, default=80)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--top", type=int, default=0)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    b = pattern_like_batch(a.graphs, seed=0).to(dev)
    ei = b.edge_index
    x = torch.randn(b.num_nodes, a.width, device=dev, requires_grad=True)
    print(f"batch of {a.graphs} graphs ({b.num_nodes} nodes, {ei.size(1)} edges), "
          f"width {a.width}, {a.heads} heads, training mode, fp32; host us per call")
    for name, (mine, theirs) in layers(a.width, a.heads).items():
        torch.manual_seed(0)
        mine, theirs = mine.to(dev).train(), theirs.to(dev).train()
        theirs.load_state_dict(mine.state_dict())
        f1, b1 = host_times(mine, x, ei, a.calls)
        f2, b2 = host_times(theirs, x, ei, a.calls)
        print(f"{name:6s} fused: forward {f1:6.1f} us, backward {b1:6.1f} us | "
              f"pyg: forward {f2:6.1f} us, backward {b2:6.1f} us", flush=True)
        if a.top:
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(a.calls):
                mine(x, ei)
            pr.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(a.top)
            print("\n".join(s.getvalue().splitlines()[6:]))


if __name__ == "__main__":
    main()
