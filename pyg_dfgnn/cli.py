"""Command line: ``dfgnn {build,train,bench,info}`` (also ``python -m pyg_dfgnn``)."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def _build(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="dfgnn build",
                                description="Compile the CUDA kernels now (JIT cache).")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    from . import _build as b
    try:
        b.load(verbose=a.verbose)
    except b.BuildError as e:
        print(str(e), file=sys.stderr)
        return 1
    print(f"pyg_dfgnn: CUDA extension ready in {b.cache_dir()}")
    return 0


def _info(argv: List[str]) -> int:
    import torch
    import torch_geometric
    print(f"torch {torch.__version__}, torch_geometric {torch_geometric.__version__}, "
          f"cuda available: {torch.cuda.is_available()}")
    if torch.cuda.is_available():
        print(f"gpu: {torch.cuda.get_device_name()}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmds = {"build": _build, "info": _info}
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: dfgnn {build,train,bench,info} [...]\n"
              "  build   compile the CUDA extension (cached)\n"
              "  train   train a model from a YAML config: dfgnn train configs/X.yaml [k=v ...]\n"
              "  bench   fused vs native PyG benchmarks: dfgnn bench [config] [--quick]\n"
              "  info    versions and GPU")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        from .train.cli import main as train_main
        return train_main(rest) or 0
    if cmd == "bench":
        from .bench.cli import main as bench_main
        return bench_main(rest) or 0
    if cmd in cmds:
        return cmds[cmd](rest)
    print(f"dfgnn: unknown command {cmd!r}; choose from build, train, bench, info",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
