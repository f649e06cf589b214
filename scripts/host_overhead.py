"""Host time of one layer call at steady state (issue 12's "<= 40 us per layer
forward and the same for its backward").

GPU (default when CUDA is available): the wall time of issuing a call while the
GPU is still busy with the queue, so the host never waits for it.  Per layer
(fused and PyG's, same weights) on a PATTERN-like batch whose CSR is cached,
training mode (attention dropout 0.1), fp32 (``--dtype``); plus the hottest Python functions
of the fused forward (cProfile, ``--top``)::

    PYTHONPATH=. python scripts/host_overhead.py [--graphs 26] [--calls 40] [--rounds 5] [--top 12]

``--split`` splits a one-op layer forward (``dfgnn_C::*_layer``) into the
op's host time (with and without its autograd node) and the layer's Python
path.

Every layer first runs the timed loop once untimed (``calls`` forwards kept
alive, then their backwards), so the CUDA caching allocator holds the blocks
the timed loop needs: without it the first layer measured paid the
``cudaMalloc`` of its outputs inside the timed loop (GAT's forward read 3x
GATv2's).

CPU (``--device cpu``): the same layers on a tiny graph (16 nodes, 64 edges),
where the kernels take a few microseconds and the wall time is the host
(Python + dispatcher + autograd) time, next to the *floor*: the same ATen ops
issued directly (projections, attention logits, the fused op through its
autograd Function, epilogue), without any layer logic.  The CPU run follows the
CUDA code path of a host-bound call (``--cpu-path`` keeps the CPU-only choices:
GAT's folded logits, the content fingerprint of every CPU cache hit)::

    PYTHONPATH=. python scripts/host_overhead.py --device cpu [--top 12]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pyg_dfgnn.data import pattern_like_batch  # noqa: E402

DROPOUT = 0.1


def layers(width: int, heads: int):
    import torch_geometric.nn as pyg

    import pyg_dfgnn.nn as ours
    c = width // heads
    p = DROPOUT
    return {
        "gat": (ours.GATConv(width, c, heads=heads, dropout=p),
                pyg.GATConv(width, c, heads=heads, dropout=p)),
        "gatv2": (ours.GATv2Conv(width, c, heads=heads, dropout=p),
                  pyg.GATv2Conv(width, c, heads=heads, dropout=p)),
        "gt": (ours.TransformerConv(width, c, heads=heads, dropout=p),
               pyg.TransformerConv(width, c, heads=heads, dropout=p)),
        "agnn": (ours.AGNNConv(), pyg.AGNNConv()),
    }


# --------------------------------------------------------------------------- #
# GPU
# --------------------------------------------------------------------------- #

def host_times(conv, x, ei, calls: int, rounds: int = 1, fresh: bool = False):
    """``(forward us, backward us, forward CPU us, backward CPU us)`` of host
    time per call, GPU queue kept busy: the least of ``rounds`` timed loops
    each, as wall time and as the CPU time of the process (all threads: the
    backward of CUDA tensors runs on autograd's device thread).  A loop's wall
    mean moved by up to 2x between loops and processes on one H200 start
    (session 27); the CPU time does not count the time the process is not
    running.

    ``fresh``: every backward starts with no gradients (``p.grad = None`` for x
    and every parameter, as ``zero_grad(set_to_none=True)`` leaves them in a
    training step), so that autograd stores the new gradients instead of
    adding them to the last call's (one ``add_`` launch per parameter); the
    time of the resets alone is subtracted."""
    params = list(conv.parameters()) + [x]

    def reset():
        for p in params:
            p.grad = None

    def burn():  # a few ms of GPU work so the queue is never empty while timing
        a = torch.empty(BURN_N, BURN_N, device=x.device)
        for _ in range(8):
            a = a @ a.T
            a = a / a.norm()

    def timed(fn):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        return ((time.perf_counter() - t0) / calls * 1e6,
                (time.process_time() - c0) / calls * 1e6)

    def loop():
        outs = []
        torch.cuda.synchronize()
        burn()
        fwd = timed(lambda: outs.extend(conv(x, ei) for _ in range(calls)))
        grads = [torch.ones_like(o) for o in outs]
        torch.cuda.synchronize()
        burn()

        def backward():
            for o, g in zip(outs, grads):
                if fresh:
                    reset()
                o.backward(g)
        bwd = timed(backward)
        torch.cuda.synchronize()
        if fresh:
            def resets():
                for _ in range(calls):
                    reset()
            z = timed(resets)
            bwd = (bwd[0] - z[0], bwd[1] - z[1])
        return fwd[0], bwd[0], fwd[1], bwd[1]

    for _ in range(3):  # warm-up (caches, plans)
        conv(x, ei).sum().backward()
    loop()              # warm-up of the allocator: the blocks of `calls` live calls
    times = [loop() for _ in range(rounds)]
    return tuple(min(t[i] for t in times) for i in range(4))


#: the side of the square matrices whose products keep the GPU busy while timing
BURN_N = 4096


def profile_top(fn, calls: int, top: int, sync) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    sync()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return "\n".join(s.getvalue().splitlines()[6:])


def profile_ops(conv, x, ei, calls: int, top: int) -> str:
    """Where a layer call's host time goes on the GPU: torch.profiler's CPU-side
    events (ATen ops, autograd nodes, CUDA runtime calls such as
    ``cudaLaunchKernel``) of ``calls`` forwards, then of their backwards,
    per call: self CPU time and count, the ``top`` largest of each phase.
    The profiler adds its own cost to every event: read the counts and the
    shares, not the absolute times."""
    from torch.profiler import ProfilerActivity, profile

    def table(prof, title):
        rows = [(e.self_cpu_time_total / calls, e.count / calls, e.key)
                for e in prof.key_averages() if e.self_cpu_time_total > 0]
        rows.sort(key=lambda r: -r[0])
        tot = sum(r[0] for r in rows)
        launches = sum(r[1] for r in rows if r[2] in ("cudaLaunchKernel", "cuLaunchKernel",
                                                      "cudaLaunchKernelExC", "cuLaunchKernelEx"))
        lines = [f"  -- {title}: {tot:.1f} us self CPU per call (profiled), "
                 f"{launches:.1f} kernel launches per call"]
        lines += [f"  {t:8.1f} us  x{c:<5.1f} {k[:90]}" for t, c, k in rows[:top]]
        return lines

    outs = [conv(x, ei) for _ in range(3)]   # warm
    for o in outs:
        o.backward(torch.ones_like(o))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pf:
        outs = [conv(x, ei) for _ in range(calls)]
    grads = [torch.ones_like(o) for o in outs]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pb:
        for o, g in zip(outs, grads):
            o.backward(g)
    torch.cuda.synchronize()
    return "\n".join(table(pf, "forward") + table(pb, "backward"))


def split_forward(conv, x, ei, calls: int, rounds: int):
    """Where a one-op layer forward's host time goes (``--split``): us per call
    of the whole forward, of the extension op alone (the same arguments,
    recorded from one call and replayed), of that op under
    ``torch.inference_mode`` (its ``CUDA`` kernel alone: no autograd node),
    and of the layer's Python path with the op replaced by a stub returning
    the recorded output.  The least of ``rounds`` loops of ``calls`` calls,
    the GPU queue kept busy.  ``None`` where the call does not take a layer
    op."""
    import pyg_dfgnn.ops.fused as fused
    real = fused._ext
    rec = {}

    class Recorder:
        def __getattr__(self, name):
            fn = getattr(real(), name)

            def call(*args):
                out = fn(*args)
                if name.endswith("_layer"):
                    rec["call"] = (fn, args, out)
                return out
            return call

    class Stub:
        def __getattr__(self, name):
            return lambda *args: rec["call"][2]

    def best(fn):
        res = math.inf
        for _ in range(rounds):
            torch.cuda.synchronize()
            a = torch.empty(BURN_N, BURN_N, device=x.device)
            for _ in range(8):
                a = a @ a.T
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            res = min(res, (time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
        return res

    fused._ext = lambda: Recorder()
    try:
        conv(x, ei)
    finally:
        fused._ext = real
    if "call" not in rec:
        return None
    fn, args, _ = rec["call"]
    whole = best(lambda: conv(x, ei))
    op = best(lambda: fn(*args))
    with torch.inference_mode():
        op_inf = best(lambda: fn(*args))
    fused._ext = lambda: Stub()
    try:
        glue = best(lambda: conv(x, ei))
    finally:
        fused._ext = real
    return whole, op, op_inf, glue


class _Stack(torch.nn.Module):
    """``depth`` copies of a layer applied one after the other (``--stack``):
    one forward and one backward call cover all of them, as in a model, so the
    per-layer backward time does not include the autograd engine's start of a
    ``backward()`` call per layer."""

    def __init__(self, conv, depth: int):
        super().__init__()
        import copy
        self.convs = torch.nn.ModuleList(copy.deepcopy(conv) for _ in range(depth))

    def forward(self, x, edge_index):
        for c in self.convs:
            x = c(x, edge_index)
        return x


class _Floor(torch.nn.Module):
    """The host-time floor of a layer on this machine: PyTorch's own
    ``nn.Linear(width, width)`` (one GEMM with bias; its backward two GEMMs and
    a bias reduction), called as a layer (``(x, edge_index)``)."""

    def __init__(self, width: int):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x, edge_index):
        return self.lin(x)


def main_gpu(a):
    dev = torch.device("cuda")
    b = pattern_like_batch(a.graphs, seed=0).to(dev)
    ei = b.edge_index
    dt = getattr(torch, a.dtype)
    x = torch.randn(b.num_nodes, a.width, device=dev, dtype=dt, requires_grad=True)
    print(f"{torch.cuda.get_device_name()}: batch of {a.graphs} graphs ({b.num_nodes} nodes, "
          f"{ei.size(1)} edges), width {a.width}, {a.heads} heads, training mode "
          f"(dropout {DROPOUT}), {a.dtype}; host us per call"
          + (f" and layer (stacks of {a.stack})" if a.stack > 1 else "")
          + ("; every backward without gradients before it (--fresh-grads)"
             if a.fresh_grads else ""))
    for name, (mine, theirs) in layers(a.width, a.heads).items():
        if a.layers and name not in a.layers.split(","):
            continue
        torch.manual_seed(0)
        mine, theirs = mine.to(dev, dt).train(), theirs.to(dev, dt).train()
        theirs.load_state_dict(mine.state_dict())
        if a.stack > 1:
            mine, theirs = _Stack(mine, a.stack), _Stack(theirs, a.stack)
        d = max(a.stack, 1)
        f1, b1, cf1, cb1 = (t / d for t in host_times(mine, x, ei, a.calls, a.rounds,
                                                       a.fresh_grads))
        f2, b2, cf2, cb2 = (t / d for t in host_times(theirs, x, ei, a.calls, a.rounds,
                                                       a.fresh_grads))
        print(f"{name:6s} fused: forward {f1:6.1f} us, backward {b1:6.1f} us "
              f"(CPU {cf1:6.1f} / {cb1:6.1f}) | pyg: forward {f2:6.1f} us, backward "
              f"{b2:6.1f} us (CPU {cf2:6.1f} / {cb2:6.1f})", flush=True)
        if a.top:
            print(profile_top(lambda: mine(x, ei), a.calls, a.top, torch.cuda.synchronize))
        if a.profile:
            print(profile_ops(mine, x, ei, a.calls, a.profile))
        if a.split:
            sp = split_forward(mine.convs[0] if a.stack > 1 else mine, x, ei, a.calls, a.rounds)
            print(f"{name:6s} forward split: " + (
                "no layer op" if sp is None else
                "whole {:.1f} us = op {:.1f} us (its CUDA kernel alone, inference mode: {:.1f}) "
                "+ Python {:.1f} us (the layer with the op stubbed)".format(*sp)), flush=True)
    floor = _Floor(a.width).to(dev, dt).train()
    d = max(a.stack, 1)
    if a.stack > 1:
        floor = _Stack(floor, a.stack)
    f0, b0, cf0, cb0 = (t / d for t in host_times(floor, x, ei, a.calls, a.rounds,
                                                   a.fresh_grads))
    print(f"{'floor':6s} torch.nn.Linear({a.width}, {a.width}): forward {f0:6.1f} us, "
          f"backward {b0:6.1f} us (CPU {cf0:6.1f} / {cb0:6.1f}; one GEMM: the host cost of "
          f"the smallest layer)", flush=True)


# --------------------------------------------------------------------------- #
# CPU: host time on a tiny graph, against the floor of the ops a layer issues
# --------------------------------------------------------------------------- #

def floors(convs, x, ei):
    """Per layer, a function issuing the ATen ops of the layer's CUDA path on a
    host-bound call (the projections, PyG's attention logits, the fused op
    through its autograd Function, the epilogue) directly, on the cached
    graph; no checks, no layer logic."""
    from pyg_dfgnn.graph import get_graph
    from pyg_dfgnn.ops import DOT, GAT, GATV2, fused

    N = x.size(0)
    g = get_graph(ei, (N, N), N)
    g0 = get_graph(ei, (N, N))
    fn = fused.EagerAttentionCPU if x.device.type == "cpu" else fused.EagerAttention

    def op(graph, kind, dst, src, value, att, scale, p):
        plan = fused.plan_of(graph, kind, src, value)
        seed = torch.randint(0, 2**62, (1,), dtype=torch.long) if p else None
        if not hasattr(fused, "attention_on"):   # (before the 13-argument Functions)
            return fn.apply(kind, graph.rowptr, graph.col, graph.perm, graph.t_rowptr,
                            graph.t_col, graph.t_perm, dst, src, value, None, att, scale, 0.2,
                            p, seed, False, plan.sched, plan.work, plan.merge, plan.t_work,
                            plan.t_merge)[0]
        meta = (kind, graph, plan, scale, 0.2, p, int(seed.item()) if p else 0, False)
        return fn.apply(meta, dst, src, value, None, att)[0]

    gat, gatv2, gt, agnn = (convs[k] for k in ("gat", "gatv2", "gt", "agnn"))

    def f_gat():
        H, C = gat.heads, gat.out_channels
        h = F.linear(x, gat.lin.weight).view(-1, H, C)
        if hasattr(fused, "EagerGATNodeAttention"):   # (session 14: logits in the op)
            plan = fused.plan_of(g, GAT, h, h)
            seed = int(torch.randint(0, 2**62, (1,), dtype=torch.long).item())
            meta = (g, plan, 0.2, DROPOUT, seed, False)
            out = fused.EagerGATNodeAttention.apply(meta, h, gat.att_src, gat.att_dst, None,
                                                    gat.bias.view(H, C))[0]
            return out.view(-1, H * C)
        a_s = (h * gat.att_src).sum(-1)
        a_d = (h * gat.att_dst).sum(-1)
        out = op(g, GAT, a_d, a_s, h, None, 1.0, DROPOUT)
        return out.view(-1, H * C) + gat.bias

    def f_gatv2():
        H, C = gatv2.heads, gatv2.out_channels
        xl = F.linear(x, gatv2.lin_l.weight, gatv2.lin_l.bias).view(-1, H, C)
        xr = F.linear(x, gatv2.lin_r.weight, gatv2.lin_r.bias).view(-1, H, C)
        out = op(g, GATV2, xr, xl, None, gatv2.att[0], 1.0, DROPOUT)
        return out.view(-1, H * C) + gatv2.bias

    def f_gt():
        H, C = gt.heads, gt.out_channels
        q = gt.lin_query(x).view(-1, H, C)
        k = gt.lin_key(x).view(-1, H, C)
        v = gt.lin_value(x).view(-1, H, C)
        out = op(g0, DOT, q, k, v, None, 1.0 / math.sqrt(C), DROPOUT)
        return out.view(-1, H * C) + gt.lin_skip(x)

    def f_agnn():
        from pyg_dfgnn import ops
        if "key_scale" in ops.dot_attention.__code__.co_varnames:   # (session 15)
            # keys = values = x, key scale 1 / |x| (ops.agnn_attention)
            c = x.norm(p=2.0, dim=-1, keepdim=True).clamp_min(1e-12).reciprocal()
            q = (x * (c * agnn.beta)).unsqueeze(1)
            x3 = x.unsqueeze(1)
            return op(g, DOT, q, x3, x3, c, 1.0, 0.0).squeeze(1)
        xn = F.normalize(x, p=2.0, dim=-1)
        q = (xn * agnn.beta).unsqueeze(1)
        return op(g, DOT, q, xn.unsqueeze(1), x.unsqueeze(1), None, 1.0, 0.0).squeeze(1)

    return {"gat": f_gat, "gatv2": f_gatv2, "gt": f_gt, "agnn": f_agnn}


def _best_us(fn, n: int, rep: int) -> float:
    best = math.inf
    for _ in range(rep):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def cpu_times(fn, n: int, rep: int):
    """(forward us, backward us): best-of-``rep`` mean over ``n`` calls."""
    out = fn()
    grad = torch.ones_like(out)
    fn().backward(grad)
    fwd = _best_us(fn, n, rep)
    fb = _best_us(lambda: fn().backward(grad), n, rep)
    return fwd, fb - fwd


def gpu_like_cpu_path():
    """Make a CPU run take the CUDA path of a host-bound call: GAT's node
    logits in the op (session 14; before it, PyG's unfolded logits), and cache
    hits accepted on the version counters as on CUDA (on CPU every hit also
    fingerprints the content)."""
    import pyg_dfgnn.graph as graph_mod
    import pyg_dfgnn.nn.gat_conv as gat_mod
    gat_mod._folded_logits = lambda *a, **k: None
    if hasattr(gat_mod, "_NODE_LOGITS_DEVICES"):
        gat_mod._NODE_LOGITS_DEVICES = ("cuda", "cpu")
    graph_mod._on_accelerator = lambda tensors: True


def main_cpu(a):
    torch.set_num_threads(1)   # tiny ops: intra-op threads only add sync cost
    if not a.cpu_path:
        gpu_like_cpu_path()
    torch.manual_seed(0)
    N, E = 16, 64
    ei = torch.randint(0, N, (2, E))
    x = torch.randn(N, a.width, requires_grad=True)
    from pyg_dfgnn.ops.fused import cpu_path
    print(f"CPU ({cpu_path(torch.float32)}, 1 thread): tiny graph ({N} nodes, {E} edges), "
          f"width {a.width}, {a.heads} heads, training mode (dropout {DROPOUT}), fp32, "
          f"{'CPU' if a.cpu_path else 'CUDA'} code path; host us per call "
          f"(best of {a.rep} x {a.calls} calls)")
    pairs = layers(a.width, a.heads)
    convs = {k: v[0].train() for k, v in pairs.items()}
    fl = floors(convs, x, ei)
    for name, (mine, theirs) in pairs.items():
        if a.layers and name not in a.layers.split(","):
            continue
        theirs.load_state_dict(mine.state_dict())
        theirs.train()
        f1, b1 = cpu_times(lambda: mine(x, ei), a.calls, a.rep)
        f0, b0 = cpu_times(fl[name], a.calls, a.rep)
        f2, b2 = cpu_times(lambda: theirs(x, ei), a.calls, a.rep)
        print(f"{name:6s} fused: forward {f1:6.1f} us, backward {b1:6.1f} us | "
              f"floor: forward {f0:6.1f} us, backward {b0:6.1f} us | "
              f"pyg: forward {f2:6.1f} us, backward {b2:6.1f} us", flush=True)
        if a.top:
            print(profile_top(lambda: mine(x, ei), a.calls, a.top, lambda: None))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cuda", "cpu"),
                    default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--graphs", type=int, default=26)
    ap.add_argument("--calls", type=int, default=None,
                    help="calls per timing (default: 40 on CUDA, 300 on CPU)")
    ap.add_argument("--rep", type=int, default=5, help="CPU: best of this many timings")
    ap.add_argument("--rounds", type=int, default=5,
                    help="GPU: the least of this many timed loops per layer and phase")
    ap.add_argument("--width", type=int, default=80)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="GPU: the layers' and inputs' dtype (modules converted, no autocast)")
    ap.add_argument("--layers", default="", help="comma-separated subset of gat,gatv2,gt,agnn")
    ap.add_argument("--stack", type=int, default=1,
                    help="GPU: time a stack of this many copies of each layer (one forward, "
                         "one backward per call), per layer")
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--profile", type=int, default=0,
                    help="GPU: torch.profiler breakdown of the fused layer's host time "
                         "(this many rows per phase)")
    ap.add_argument("--fresh-grads", action="store_true",
                    help="GPU: each backward starts without gradients, as in a training "
                         "step after zero_grad(set_to_none=True)")
    ap.add_argument("--split", action="store_true",
                    help="GPU: a one-op forward's host time split into the op, its "
                         "CUDA kernel alone and the layer's Python path")
    ap.add_argument("--cpu-path", action="store_true",
                    help="CPU: keep the CPU-only code path (folded GAT logits, content "
                         "fingerprint on every cache hit)")
    a = ap.parse_args(argv)
    if a.calls is None:
        a.calls = 40 if a.device == "cuda" else 300
    (main_gpu if a.device == "cuda" else main_cpu)(a)


if __name__ == "__main__":
    main()
