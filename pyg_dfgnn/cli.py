"""Command line: ``dfgnn {build,train,bench,info}`` (also ``python -m pyg_dfgnn``)."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

from . import __version__

USAGE = """\
usage: dfgnn {build,train,bench,info} [...]   |   dfgnn --version
  build   compile the CUDA extension (cached)
  train   train a model from a YAML config: dfgnn train configs/X.yaml [key=value ...]
  bench   fused vs native PyG benchmarks: dfgnn bench [config] [--quick]
  info    versions, GPU, nvcc, extension build status, optional packages, configs"""

#: optional packages shown by ``dfgnn info`` (distribution name, what it enables)
OPTIONAL = (
    ("torch_scatter", "SparseTensor inputs (with torch_sparse)"),
    ("torch_sparse", "SparseTensor inputs; 'pyg_sparse' bench contender"),
    ("pyg_lib", "PyG's neighbour sampling"),
    ("matplotlib", "dfgnn bench plots (pip install \"pyg_dfgnn[bench]\")"),
    ("tqdm", "progress bars"),
    ("ninja", "building the CUDA extension"),
    ("pytest", "the test suite"),
)

REPO = Path(__file__).resolve().parent.parent


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
    print(f"pyg_dfgnn: CUDA extension ready ({b.origin()})")
    return 0


def _dist_version(name: str) -> Optional[str]:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _nvcc() -> str:
    """Where nvcc is and its version, without compiling anything."""
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:  # pragma: no cover
        CUDA_HOME = None
    path = shutil.which("nvcc")
    if path is None and CUDA_HOME:
        cand = os.path.join(CUDA_HOME, "bin", "nvcc")
        path = cand if os.path.isfile(cand) else None
    if path is None:
        return "not found (not on PATH, no CUDA_HOME); the CUDA extension cannot be built"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True,
                             timeout=20).stdout
        release = [ln for ln in out.splitlines() if "release" in ln]
        ver = release[-1].split("release", 1)[1].strip() if release else "version unknown"
    except Exception as e:  # pragma: no cover
        ver = f"version unknown ({type(e).__name__})"
    return f"{path} ({ver})"


def _extension_status(torch) -> List[str]:
    """Build status of the CUDA extension; never compiles."""
    from . import _build as b
    root = os.environ.get("PYG_DFGNN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pyg_dfgnn")
    lines = [f"cache root:       {root}  (set PYG_DFGNN_CACHE to move it)"]
    if not torch.cuda.is_available():
        lines.append("CUDA extension:   not applicable (no CUDA GPU); CPU tensors take the "
                     "CPU path")
        return lines
    try:
        d = b.cache_dir()
    except Exception as e:
        lines.append(f"CUDA extension:   unknown ({type(e).__name__}: {e})")
        return lines
    if b.is_built():
        state = "loaded in this process"
    elif any(Path(d).glob("*.so")):
        state = "built and cached (loads without compiling)"
    else:
        state = "not built yet; the first CUDA call or 'dfgnn build' compiles it (~1 min)"
    lines.append(f"CUDA extension:   {state}")
    lines.append(f"  build dir:      {d}")
    return lines


def _info(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="dfgnn info",
                                description="Versions, GPU, toolchain and build status "
                                            "(compiles nothing).")
    p.parse_args(argv)
    import platform

    import torch
    import torch_geometric

    print(f"pyg_dfgnn {__version__} ({Path(__file__).resolve().parent})")
    print(f"python {platform.python_version()}, torch {torch.__version__} "
          f"(CUDA {torch.version.cuda or 'none: CPU-only build'}), "
          f"torch_geometric {torch_geometric.__version__}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            print(f"gpu {i}:            {torch.cuda.get_device_name(i)} "
                  f"(sm_{cap[0]}{cap[1]})")
    else:
        print("gpu:              none (torch.cuda.is_available() is False)")
    print(f"nvcc:             {_nvcc()}")
    for line in _extension_status(torch):
        print(line)
    print("optional packages:")
    for name, what in OPTIONAL:
        v = _dist_version(name)
        print(f"  {name:<14} {v or 'missing':<12} {what}")
    cfgs = sorted(p.name for p in (REPO / "configs").glob("*.yaml"))
    if cfgs:
        print(f"configs ({REPO / 'configs'}):")
        for i in range(0, len(cfgs), 4):
            print("  " + "".join(f"{c:<24}" for c in cfgs[i:i + 4]).rstrip())
    else:
        print("configs:          none found (they ship with the source checkout)")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("dfgnn: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `dfgnn train --schema | head`: no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: List[str]) -> int:
    cmds = {"build": _build, "info": _info}
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"pyg_dfgnn {__version__}")
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
    print(f"dfgnn: unknown command {cmd!r}; choose from build, train, bench, info "
          f"(dfgnn --help)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
