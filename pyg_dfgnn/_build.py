"""Just-in-time build of the CUDA extension in ``cuda/``.

Nothing is compiled at import time.  The first CUDA call (or
``dfgnn build``) compiles ``cuda/*.cu`` and ``cuda/*.cpp`` with
``torch.utils.cpp_extension.load`` for the visible GPU's architecture into a
cache directory keyed by the sources' hash, the torch version and the arch::

    $PYG_DFGNN_CACHE  (default ~/.cache/pyg_dfgnn)/<torch>-<cuda>-sm<arch>-<hash>/

so a rebuild happens only when one of them changes.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import torch

log = logging.getLogger("pyg_dfgnn")

CUDA_DIR = Path(__file__).resolve().parent.parent / "cuda"
_lock = threading.Lock()
_module = None
_error: Optional[BaseException] = None


class BuildError(RuntimeError):
    """The CUDA extension could not be built or loaded."""


def sources():
    return sorted([*CUDA_DIR.glob("*.cu"), *CUDA_DIR.glob("*.cpp")])


def _source_hash() -> str:
    h = hashlib.sha256()
    for p in sorted([*sources(), *CUDA_DIR.glob("*.cuh"), *CUDA_DIR.glob("*.h")]):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}"


def cache_dir() -> Path:
    root = os.environ.get("PYG_DFGNN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pyg_dfgnn")
    cuda = (torch.version.cuda or "nocuda").replace(".", "")
    tv = torch.__version__.split("+")[0]
    return Path(root) / f"torch{tv}-cu{cuda}-sm{_arch()}-{_source_hash()}"


def _check_toolchain() -> None:
    if not torch.cuda.is_available():
        raise BuildError("pyg_dfgnn: CUDA is not available (torch.cuda.is_available() is "
                         "False); the fused kernels need an NVIDIA GPU. CPU tensors use the "
                         "reference implementation instead.")
    if torch.version.cuda is None:
        raise BuildError("pyg_dfgnn: this torch build has no CUDA support "
                         f"({torch.__version__}); install a CUDA build of torch.")
    if not CUDA_DIR.is_dir() or not sources():
        raise BuildError(f"pyg_dfgnn: CUDA sources not found in {CUDA_DIR}; install the "
                         "package from its source checkout (pip install -e .).")
    from torch.utils.cpp_extension import CUDA_HOME
    if CUDA_HOME is None:
        raise BuildError("pyg_dfgnn: nvcc was not found (CUDA_HOME is unset and nvcc is "
                         "not on PATH); install the CUDA toolkit matching torch "
                         f"{torch.version.cuda} or set CUDA_HOME.")


def load(verbose: bool = False):
    """Build (if needed) and load the extension; returns the module."""
    global _module, _error
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        if _error is not None:
            raise BuildError(str(_error)) from _error
        try:
            _check_toolchain()
            from torch.utils.cpp_extension import load as _load
            build_dir = cache_dir()
            build_dir.mkdir(parents=True, exist_ok=True)
            arch = _arch()
            fresh = not any(build_dir.glob("*.so"))
            if fresh:
                print(f"pyg_dfgnn: compiling CUDA kernels for sm_{arch} into {build_dir} "
                      "(first use only, about a minute)...", file=sys.stderr, flush=True)
            t0 = time.time()
            flags = ["-O3", "-std=c++17", "-lineinfo",
                     f"-gencode=arch=compute_{arch},code=sm_{arch}",
                     "--expt-relaxed-constexpr"]
            _module = _load(name="pyg_dfgnn_C", sources=[str(s) for s in sources()],
                            extra_cflags=["-O3", "-std=c++17"], extra_cuda_cflags=flags,
                            build_directory=str(build_dir), verbose=verbose,
                            with_cuda=True, is_python_module=False)
            # the library registers torch.ops.dfgnn_C.* (TORCH_LIBRARY); no Python module
            _module = torch.ops.dfgnn_C
            if fresh:
                print(f"pyg_dfgnn: CUDA kernels built in {time.time() - t0:.1f}s",
                      file=sys.stderr, flush=True)
        except BuildError as e:
            _error = e
            raise
        except Exception as e:  # compiler errors etc.
            _error = e
            raise BuildError(f"pyg_dfgnn: building the CUDA extension failed: {e}") from e
    return _module


def is_built() -> bool:
    return _module is not None
