"""One fused layer forward+backward after warm-up calls, for Nsight Compute:

    ncu -k regex:'fwd_kernel|bwd_row|bwd_col' --launch-skip 6 --launch-count 3 \
        --section SpeedOfLight --section WarpStateStats --section Occupancy \
        python scripts/ncu_layer.py --layer transformer --shape 8x10 --dtype bf16

(2 warm-up calls launch each of the three kernels twice: skip 6.)  GPU only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_layer import layer_args, layer_case  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    layer_args(ap, "transformer", "8x10")
    ap.add_argument("--calls", type=int, default=3)
    a = ap.parse_args(argv)
    ours, _, xs, ei = layer_case(a)
    for _ in range(a.calls):
        out = ours(xs, ei)
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
