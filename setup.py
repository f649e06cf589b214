"""Build script.  The metadata lives in pyproject.toml; this file only adds the
optional ahead-of-time build of the CUDA extension.

A plain ``pip install .`` / ``pip install -e .`` stays pure Python: the CUDA
kernels are compiled just in time on first use (``pyg_dfgnn/_build.py``).

``PYG_DFGNN_FORCE_BUILD=1`` compiles ``cuda/*.cu`` + ``cuda/*.cpp`` into the
package as ``pyg_dfgnn/_C<ext suffix>`` (plus ``_C_build.json``: torch/CUDA
version, C++ ABI, the GPU architectures, the sources' hash), so nothing
compiles at run time::

    PYG_DFGNN_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST="8.0;9.0" \\
        pip install --no-build-isolation .

``--no-build-isolation`` builds against the installed torch (the library only
loads with the torch it was built with).  nvcc: a system toolkit, or NVIDIA's
PyPI wheels (``pip install "pyg_dfgnn[cuda]"`` first), found as at run time.
Without ``TORCH_CUDA_ARCH_LIST`` torch picks the architectures of the visible
GPUs.
"""
import json
import os
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def force_build() -> bool:
    v = os.environ.get("PYG_DFGNN_FORCE_BUILD", "0").strip().lower()
    return v not in ("", "0", "false", "no", "off")


def _fail(msg: str):
    sys.exit(f"pyg_dfgnn setup: PYG_DFGNN_FORCE_BUILD=1: {msg}")


def cuda_build():
    """``(ext_modules, cmdclass)`` of the ahead-of-time build; exits with a
    one-line message naming the cause when it cannot run."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        _fail("torch is not importable; install torch first and build with "
              "pip install --no-build-isolation .")
    if torch.version.cuda is None:
        _fail(f"torch {torch.__version__} has no CUDA support; install a CUDA build of torch")
    sys.path.insert(0, ROOT)
    from pyg_dfgnn import _build
    if cpp_extension.CUDA_HOME is None:
        pip = _build.pip_cuda_home()
        if pip is None:
            _fail("nvcc not found (no CUDA_HOME, no nvcc on PATH, no /usr/local/cuda, no "
                  "PyPI nvcc wheel); install the CUDA toolkit or pip install "
                  "\"pyg_dfgnn[cuda]\" first")
        _build._use_pip_cuda(pip)
    srcs = [os.path.relpath(str(s), ROOT) for s in _build.sources()]
    if not srcs:
        _fail(f"no CUDA sources in {_build.CUDA_DIR}")
    arch = cpp_extension._get_cuda_arch_flags()  # TORCH_CUDA_ARCH_LIST or the visible GPUs
    gencode = _build.parse_gencode(arch)
    if not gencode["sm"] and not gencode["ptx"]:
        _fail(f"no GPU architecture to build for (flags {arch}); set TORCH_CUDA_ARCH_LIST, "
              "e.g. \"8.0;9.0\"")
    inc, ldflags = _build._pip_cuda_flags()
    info = dict(_build.build_key(), **gencode, source_hash=_build._source_hash())
    ext = cpp_extension.CUDAExtension(
        name=f"pyg_dfgnn.{_build.PREBUILT_NAME}", sources=srcs,
        extra_compile_args={"cxx": ["-O3", "-std=c++17"] + inc,
                            "nvcc": ["-O3", "-std=c++17", "-lineinfo",
                                     "--expt-relaxed-constexpr"] + arch + inc},
        extra_link_args=ldflags)

    class BuildExt(cpp_extension.BuildExtension):
        """Also writes ``_C_build.json`` beside the library (checked at load)."""

        def run(self):
            super().run()
            for e in self.extensions:
                out = os.path.join(os.path.dirname(self.get_ext_fullpath(e.name)),
                                   _build.PREBUILT_INFO)
                with open(out, "w") as f:
                    json.dump(info, f, indent=1, sort_keys=True)
                print(f"pyg_dfgnn setup: built {e.name} for sm {gencode['sm']} / PTX "
                      f"{gencode['ptx']} (torch {info['torch']}, CUDA {info['cuda']})")

    return [ext], {"build_ext": BuildExt}


if __name__ == "__main__":
    ext_modules, cmdclass = cuda_build() if force_build() else ([], {})
    setup(ext_modules=ext_modules, cmdclass=cmdclass)
