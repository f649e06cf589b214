"""Where the memory of a ``cuda_graphs: true`` training run goes.

Runs ``dfgnn train CONFIG OVERRIDES`` in-process and prints the allocated and
reserved CUDA memory at each phase of the graphed schedule (eager warm-up
steps, dry runs, captures, replays), the streams that own allocated memory,
and at the end the live allocations grouped by where they were made (from
``torch.cuda.memory._snapshot``).

    python scripts/memory_graphed.py configs/pattern_gt.yaml backend=fused \
        cuda_graphs=true epochs=2 data.num_train=2000 ...
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyg_dfgnn.train import graphed as G  # noqa: E402
from pyg_dfgnn.train.config import load_config  # noqa: E402
from pyg_dfgnn.train.trainer import train  # noqa: E402

MiB = 2 ** 20
LOG = []


def mark(what: str) -> None:
    torch.cuda.synchronize()
    a, r = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    p = torch.cuda.max_memory_allocated()
    LOG.append((what, a, r, p))
    print(f"  mem {what:28s} allocated {a / MiB:8.1f}  reserved {r / MiB:8.1f}  "
          f"peak {p / MiB:8.1f} MiB", flush=True)


def wrap(cls, name, label, limit=None):
    f = getattr(cls, name)
    count = [0]

    def g(self, *a, **k):
        out = f(self, *a, **k)
        count[0] += 1
        if limit is None or count[0] <= limit:
            mark(f"{label} {count[0]}" + (f" b{a[0]}" if a and isinstance(a[0], int) else ""))
        return out
    setattr(cls, name, g)


def by_stream_and_frame(snap, top=12):
    streams = collections.Counter()
    frames = collections.Counter()
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] != "active_allocated":
                continue
            streams[(seg["stream"], seg.get("segment_pool_id"))] += b["size"]
            fr = b.get("frames") or []
            key = "?"
            for x in fr:   # the first frame of the package or of torch.nn / optim
                fn = x.get("filename", "")
                if "pyg_dfgnn" in fn or "torch/optim" in fn or "torch/nn" in fn:
                    key = f"{os.path.basename(fn)}:{x.get('line')} {x.get('name')}"
                    break
            else:
                if fr:
                    key = f"{fr[0].get('filename', '?')}:{fr[0].get('name')}"
            frames[key] += b["size"]
    print("live allocated bytes by (stream, pool):")
    for (s, pool), n in streams.most_common():
        print(f"  stream {s:#x} pool {pool}: {n / MiB:8.1f} MiB")
    print("live allocated bytes by first package frame:")
    for k, n in frames.most_common(top):
        print(f"  {n / MiB:8.1f} MiB  {k}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    wrap(G.GraphedSteps, "_dry_train", "dry-train")
    wrap(G.GraphedSteps, "_dry_eval", "dry-eval")
    wrap(G.GraphedSteps, "_capture", "capture")
    wrap(G.GraphedSteps, "train_step", "train step", limit=6)
    wrap(G.GraphedSteps, "eval_step", "eval step", limit=2)
    cfg = load_config(args.config, args.overrides)
    mark("start")
    train(cfg)
    mark("end")
    by_stream_and_frame(torch.cuda.memory._snapshot())
    peak = max(p for *_, p in LOG)
    print(f"== run peak allocated {peak / MiB:.1f} MiB, final allocated "
          f"{LOG[-1][1] / MiB:.1f} MiB, reserved {LOG[-1][2] / MiB:.1f} MiB")


if __name__ == "__main__":
    main()
