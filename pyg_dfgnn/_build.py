"""Just-in-time builds of the CUDA extension in ``cuda/`` and the CPU extension
in ``cpu/``.

Nothing is compiled at import time.  The first CUDA call (or
``dfgnn build``) compiles ``cuda/*.cu`` and ``cuda/*.cpp`` with
``torch.utils.cpp_extension.load`` for the visible GPU's architecture into a
cache directory keyed by the sources' hash, the torch version and the arch::

    $PYG_DFGNN_CACHE  (default ~/.cache/pyg_dfgnn)/<torch>-<cuda>-sm<arch>-<hash>-<tree>/

so a rebuild happens only when one of them changes (``<tree>``: the source
folder's own tag, so that two checkouts never share a build folder).

Ahead of time: ``PYG_DFGNN_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST="8.0;9.0" pip
install --no-build-isolation .`` compiles the same sources into the installed
package (``pyg_dfgnn/_C*.so`` + ``_C_build.json``, see ``setup.py``).
:func:`load` prefers that prebuilt library when it matches this torch (version,
CUDA version, C++ ABI), covers the GPU's architecture and, where the sources
are present, was built from them; otherwise it says why and builds just in
time (or, without sources, raises :class:`BuildError` naming the cause).
``PYG_DFGNN_PREBUILT=0`` ignores the prebuilt library, as does a non-empty
``PYG_DFGNN_NVCC_EXTRA`` (developer tuning flags, which it was built without).

The first float32/bfloat16 call on CPU tensors compiles
``cpu/attention_cpu.cpp`` with the host C++ compiler only (no nvcc; ``-O3
-march=native``, OpenMP when torch uses it) into
``<cache>/torch<ver>-cpu-<isa>-<hash>/`` (:func:`load_cpu`).  Without a
working compiler the CPU path falls back to the pure-PyTorch reference with
one warning naming the cause; ``PYG_DFGNN_CPU_KERNELS=0`` forces the
reference.
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
CPU_DIR = Path(__file__).resolve().parent.parent / "cpu"
_cpu_warned = False


class BuildError(RuntimeError):
    """The CUDA extension could not be built or loaded."""


class _Once:
    """One build-and-load attempt per process (thread-safe): the loaded module,
    or the error of the one attempt, raised again as a :class:`BuildError` on
    every later call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.module = None
        self.error: Optional[BaseException] = None

    def get(self, build, failed):
        """``build()``'s module (built once); a :class:`BuildError` it raises
        is remembered and re-raised, any other exception ``e`` becomes
        ``failed(e)`` (a :class:`BuildError` naming the cause)."""
        if self.module is not None:
            return self.module
        with self.lock:
            if self.module is not None:
                return self.module
            if self.error is not None:
                raise BuildError(str(self.error)) from self.error
            try:
                self.module = build()
            except BuildError as e:
                self.error = e
                raise
            except Exception as e:  # compiler errors etc.
                self.error = e
                raise failed(e) from e
        return self.module


_cuda = _Once()
_cpu = _Once()


def sources():
    """The CUDA extension's sources in ``CUDA_DIR`` (a source checkout), or ``[]``:
    in an installed (not editable) package ``CUDA_DIR`` is ``site-packages/cuda``,
    which other packages (cuda-python) own."""
    if not (CUDA_DIR / "dfgnn_ops.cpp").is_file():
        return []
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


def cache_root() -> Path:
    return Path(os.environ.get("PYG_DFGNN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pyg_dfgnn"))


def _tree_tag(folder: Path) -> str:
    """A short hash of the folder the sources are built from.  torch's JIT
    loader writes its build file with the sources' paths, so two checkouts of
    the same sources sharing one build folder would each rebuild the
    extension on their first call after the other's (a minute or more every
    time: docs/KERNELS.md, session 42); the folder's own tag keeps them apart."""
    return hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:8]


def cache_dir() -> Path:
    root = cache_root()
    cuda = (torch.version.cuda or "nocuda").replace(".", "")
    tv = torch.__version__.split("+")[0]
    return Path(root) / (f"torch{tv}-cu{cuda}-sm{_arch()}-{_source_hash()}-"
                         f"{_tree_tag(CUDA_DIR)}")


def _check_cuda() -> None:
    if not torch.cuda.is_available():
        raise BuildError("pyg_dfgnn: CUDA is not available (torch.cuda.is_available() is "
                         "False); the fused kernels need an NVIDIA GPU. CPU tensors use the "
                         "reference implementation instead.")
    if torch.version.cuda is None:
        raise BuildError("pyg_dfgnn: this torch build has no CUDA support "
                         f"({torch.__version__}); install a CUDA build of torch.")


def _check_toolchain() -> None:
    _check_cuda()
    if not CUDA_DIR.is_dir() or not sources():
        raise BuildError(f"pyg_dfgnn: CUDA sources not found in {CUDA_DIR} and no prebuilt "
                         "extension in the package; install the package from its source "
                         "checkout (pip install -e .) or build it ahead of time "
                         "(PYG_DFGNN_FORCE_BUILD=1 pip install --no-build-isolation .; "
                         "see README, GPU section).")
    from torch.utils import cpp_extension
    if cpp_extension.CUDA_HOME is None:
        pip = pip_cuda_home()
        if pip is None:
            raise BuildError("pyg_dfgnn: nvcc was not found (CUDA_HOME is unset, nvcc is not "
                             "on PATH, no /usr/local/cuda, no PyPI nvcc wheel); install the "
                             f"CUDA {torch.version.cuda} toolkit, set CUDA_HOME, or "
                             "pip install \"pyg_dfgnn[cuda]\" (see README, GPU section).")
        _use_pip_cuda(pip)


# --------------------------------------------------------------------------- #
# nvcc from PyPI wheels (pip install "pyg_dfgnn[cuda]")
# --------------------------------------------------------------------------- #

def _nvcc_release(nvcc: Path) -> Optional[str]:
    import re
    import subprocess
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _nvidia_roots():
    """Every ``site-packages/nvidia`` folder on the import path: the namespace
    package's portions first, then ``sys.path`` entries that hold one (a regular
    ``nvidia/__init__.py`` in one site folder hides the other portions from the
    import system, e.g. in a venv made with ``--system-site-packages`` or with
    wheels installed by ``pip install --target DIR`` + ``PYTHONPATH``)."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    cands = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    cands += [Path(p or ".") / "nvidia" for p in sys.path]
    roots, seen = [], set()
    for r in cands:
        try:
            key = r.resolve()
        except OSError:
            continue
        if key not in seen and r.is_dir():
            seen.add(key)
            roots.append(r)
    return roots


def pip_cuda_home() -> Optional[dict]:
    """The CUDA toolkit that NVIDIA's PyPI wheels install, if any, for the major
    version of ``torch.version.cuda``; ``None`` if there is none.

    CUDA 13 wheels (``nvidia-cuda-nvcc``, ``nvidia-nvvm``, ``nvidia-cuda-crt``,
    ``nvidia-cuda-cccl``, ``nvidia-cuda-runtime``; ``cuda-toolkit[nvcc,...]``)
    share one toolkit-like tree ``site-packages/nvidia/cu13/{bin,include,lib,nvvm}``.
    CUDA 12 wheels (``nvidia-cuda-nvcc-cu12`` ...) put each package in its own
    ``nvidia/<package>/`` folder; their include folders are added.  When the
    wheels lie in several site folders (the runtime next to torch, nvcc in a
    venv or ``--target`` folder), the include folders of all of them are used
    and ``lib`` is the first one holding ``libcudart.so.<major>``.  Returns
    ``{"home", "include", "lib", "release"}``.
    """
    if torch.version.cuda is None:
        return None
    major = torch.version.cuda.split(".")[0]
    roots = _nvidia_roots()
    for root in roots:
        for home in (root / f"cu{major}", root / "cuda_nvcc"):
            nvcc = home / "bin" / "nvcc"
            if not (nvcc.is_file() and os.access(nvcc, os.X_OK)):
                continue
            release = _nvcc_release(nvcc)
            if release is None or release.split(".")[0] != major:
                continue
            others = [r for r in roots if r != root]
            if home.name == "cuda_nvcc":  # CUDA 12: one folder per package
                include = [home / "include"] + [r / n / "include" for r in [root] + others
                                                for n in ("cuda_runtime", "cuda_cccl")]
                libs = [r / "cuda_runtime" / "lib" for r in [root] + others]
            else:
                include = [home / "include"] + [r / home.name / "include" for r in others]
                libs = [home / "lib"] + [r / home.name / "lib" for r in others]
            lib = next((d for d in libs if (d / f"libcudart.so.{major}").exists()), libs[0])
            return {"home": home, "include": [p for p in include if p.is_dir()], "lib": lib,
                    "release": release}
    return None


_pip_cuda: Optional[dict] = None


def _use_pip_cuda(pip: dict) -> None:
    """Point torch.utils.cpp_extension at the wheels' toolkit.  The wheels hold
    ``libcudart.so.<major>`` but no unversioned ``libcudart.so`` (wheels carry
    no symbolic links) for the ``-lcudart`` that torch adds: a link to it is
    made in a folder of the cache and added to the link flags."""
    global _pip_cuda
    from torch.utils import cpp_extension
    home = str(pip["home"])
    os.environ["CUDA_HOME"] = home
    cpp_extension.CUDA_HOME = home
    major = pip["release"].split(".")[0]
    real = pip["lib"] / f"libcudart.so.{major}"
    shim = cache_root() / f"pip-cuda-{hashlib.sha256(home.encode()).hexdigest()[:12]}"
    if real.exists():
        shim.mkdir(parents=True, exist_ok=True)
        link = shim / "libcudart.so"
        if not link.exists():
            try:
                link.symlink_to(real)
            except FileExistsError:
                pass
    if pip["release"] != ".".join(torch.version.cuda.split(".")[:2]):
        log.warning("pyg_dfgnn: PyPI nvcc %s, torch built with CUDA %s", pip["release"],
                    torch.version.cuda)
    _pip_cuda = dict(pip, shim=shim)


def _pip_cuda_flags():
    """(include flags for nvcc and the C++ compiler, link flags) of the wheels' toolkit."""
    if _pip_cuda is None:
        return [], []
    inc = [f"-I{p}" for p in _pip_cuda["include"]]
    return inc, [f"-L{_pip_cuda['shim']}", f"-L{_pip_cuda['lib']}"]


def load(verbose: bool = False):
    """Build (if needed) and load the extension; returns the module."""
    return _cuda.get(lambda: _build_cuda(verbose), lambda e: BuildError(
        f"pyg_dfgnn: building the CUDA extension failed: {e}"))


def _build_cuda(verbose: bool):
    _check_cuda()
    pre = _load_prebuilt()
    if pre is not None:
        return pre
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
    # developer tuning only (e.g. -DDFGNN_FWD_BLOCKS=3); use a separate
    # PYG_DFGNN_CACHE per flag set
    flags += os.environ.get("PYG_DFGNN_NVCC_EXTRA", "").split()
    pip_inc, pip_ld = _pip_cuda_flags()
    _load(name="pyg_dfgnn_C", sources=[str(s) for s in sources()],
          extra_cflags=["-O3", "-std=c++17"] + pip_inc,
          extra_cuda_cflags=flags + pip_inc, extra_ldflags=pip_ld,
          build_directory=str(build_dir), verbose=verbose,
          with_cuda=True, is_python_module=False)
    # the library registers torch.ops.dfgnn_C.* (TORCH_LIBRARY); no Python module
    _set_origin(f"jit {build_dir}")
    if fresh:
        print(f"pyg_dfgnn: CUDA kernels built in {time.time() - t0:.1f}s",
              file=sys.stderr, flush=True)
    return torch.ops.dfgnn_C


def is_built() -> bool:
    return _cuda.module is not None


_origin: Optional[str] = None


def _set_origin(o: str) -> None:
    global _origin
    _origin = o


def origin() -> Optional[str]:
    """Where the loaded CUDA extension came from: ``"prebuilt <path>"``,
    ``"jit <build dir>"``, or ``None`` before :func:`load`."""
    return _origin


# --------------------------------------------------------------------------- #
# ahead-of-time build: PYG_DFGNN_FORCE_BUILD=1 pip install --no-build-isolation .
# --------------------------------------------------------------------------- #

PACKAGE_DIR = Path(__file__).resolve().parent
PREBUILT_NAME = "_C"  # pyg_dfgnn/_C<EXT_SUFFIX>, no Python module (TORCH_LIBRARY only)
PREBUILT_INFO = "_C_build.json"


def prebuilt_path() -> Optional[Path]:
    """The ahead-of-time built library in the package, or ``None``."""
    import importlib.machinery
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = PACKAGE_DIR / f"{PREBUILT_NAME}{suffix}"
        if p.is_file():
            return p
    return None


def build_key() -> dict:
    """What a prebuilt library must have been built against to load here."""
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cxx11_abi": bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))}


def parse_gencode(flags) -> dict:
    """``{"sm": [...], "ptx": [...]}`` (e.g. ``"90"``, ``"90a"``) from nvcc
    ``-gencode=arch=compute_XY,code=...`` flags."""
    import re
    sm, ptx = [], []
    for f in flags:
        m = re.search(r"arch=compute_(\w+),code=\[?([\w,]+)\]?", f)
        if not m:
            continue
        for code in m.group(2).split(","):
            if code.startswith("sm_"):
                sm.append(code[3:])
            elif code.startswith("compute_"):
                ptx.append(code[8:])
    return {"sm": sorted(set(sm)), "ptx": sorted(set(ptx))}


def arch_covered(sm, ptx, capability) -> bool:
    """Can code built for ``sm`` (machine code) / ``ptx`` (JIT-able PTX) run on
    a GPU of ``capability`` ``(major, minor)``?  Machine code runs on the same
    major version with an equal or higher minor, except architecture-specific
    targets (``90a``, ``100f``) that run on exactly their own; PTX runs on any
    equal or newer GPU."""
    major, minor = capability
    dev = major * 10 + minor

    def num(code):
        digits = "".join(c for c in code if c.isdigit())
        return int(digits) if digits else -1

    for code in sm:
        n = num(code)
        if code[-1:].isalpha():
            if n == dev:
                return True
        elif n // 10 == major and n % 10 <= minor:
            return True
    return any(0 <= num(code) <= dev for code in ptx)


def _prebuilt_problem(info: dict) -> Optional[str]:
    """Why the prebuilt library described by ``info`` cannot be used here, or ``None``."""
    want = build_key()
    for key, what in (("torch", "torch"), ("cuda", "CUDA"), ("cxx11_abi", "C++ ABI")):
        if info.get(key) != want[key]:
            return (f"it was built for {what} {info.get(key)!r}, this process has "
                    f"{want[key]!r}")
    cap = torch.cuda.get_device_capability()
    if not arch_covered(info.get("sm", []), info.get("ptx", []), cap):
        return (f"it holds code for sm {info.get('sm', [])} / PTX {info.get('ptx', [])}, "
                f"not for this GPU (sm_{cap[0]}{cap[1]}); set TORCH_CUDA_ARCH_LIST "
                f"to include {cap[0]}.{cap[1]} when building")
    if sources() and info.get("source_hash") != _source_hash():
        return f"the CUDA sources in {CUDA_DIR} changed since it was built"
    extra = os.environ.get("PYG_DFGNN_NVCC_EXTRA", "").split()
    if extra:   # (a prebuilt library is built without them: setup.py)
        return (f"PYG_DFGNN_NVCC_EXTRA asks for compiler flags {' '.join(extra)!r} "
                "it was not built with")
    return None


def _load_prebuilt():
    """``torch.ops.dfgnn_C`` from the prebuilt library when it fits, else ``None``
    (with a warning naming why, then the JIT build runs); without sources to
    build from, an unusable prebuilt library raises :class:`BuildError`."""
    if os.environ.get("PYG_DFGNN_PREBUILT", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    so = prebuilt_path()
    if so is None:
        return None
    import json
    try:
        info = json.loads((so.parent / PREBUILT_INFO).read_text())
        problem = _prebuilt_problem(info)
    except (OSError, ValueError) as e:
        problem = f"its build record {so.parent / PREBUILT_INFO} is unreadable ({e})"
    if problem is None:
        try:
            torch.ops.load_library(str(so))
            _set_origin(f"prebuilt {so}")
            return torch.ops.dfgnn_C
        except (OSError, RuntimeError) as e:
            problem = f"loading it failed ({' '.join(str(e).split())[:300]})"
    msg = f"pyg_dfgnn: the prebuilt CUDA extension {so} is not used: {problem}"
    if not sources():
        raise BuildError(msg + "; rebuild it (PYG_DFGNN_FORCE_BUILD=1 pip install "
                         "--no-build-isolation ., see README, GPU section) or install "
                         "from a source checkout (pip install -e .).")
    import warnings
    warnings.warn(msg + "; building just in time instead.", RuntimeWarning, stacklevel=4)
    return None


# --------------------------------------------------------------------------- #
# CPU extension
# --------------------------------------------------------------------------- #

def cpu_sources():
    return sorted(CPU_DIR.glob("*.cpp"))


def _cpu_flags():
    """(cflags, ldflags): -O3, -march=native where the compiler takes it, and
    OpenMP when torch's parallel backend is OpenMP (at::parallel_for is
    header code: without -fopenmp it would run on one thread)."""
    import platform
    cflags = ["-O3"]  # the C++ standard: torch's default (c++17 / c++20)
    ldflags = []
    if platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64"):
        cflags.append("-march=native")
    if "OpenMP" in torch.__config__.parallel_info() and sys.platform.startswith("linux"):
        cflags.append("-fopenmp")
        ldflags.append("-fopenmp")
    return cflags, ldflags


def _cpu_isa() -> str:
    """Fingerprint of the host CPU: ``-march=native`` code must not be reused
    on another CPU model sharing the cache directory."""
    import platform
    ident = platform.machine() + platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features", "model name")):
                    ident += line
    except OSError:
        pass
    return hashlib.sha256(ident.encode()).hexdigest()[:8]


def cpu_cache_dir() -> Path:
    root = cache_root()
    h = hashlib.sha256()
    for p in [*cpu_sources(), CUDA_DIR / "attention_schema.h"]:  # + the shared schemas
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(" ".join(sum(_cpu_flags(), [])).encode())
    tv = torch.__version__.replace("+", "_")
    return Path(root) / (f"torch{tv}-cpu-{platform_tag()}-{_cpu_isa()}-{h.hexdigest()[:16]}-"
                         f"{_tree_tag(CPU_DIR)}")


def platform_tag() -> str:
    import platform
    return f"py{sys.version_info[0]}{sys.version_info[1]}-{platform.machine().lower()}"


def cpu_kernels_enabled() -> bool:
    """False when ``PYG_DFGNN_CPU_KERNELS`` is ``0``/``false``/``no``/``off``."""
    v = os.environ.get("PYG_DFGNN_CPU_KERNELS", "1").strip().lower()
    return v not in ("0", "false", "no", "off")


def load_cpu(verbose: bool = False):
    """Build (if needed) and load the CPU extension; returns ``torch.ops.dfgnn_cpu``.

    Raises :class:`BuildError` naming the cause when it cannot be built (the
    error is remembered: one attempt per process).
    """
    return _cpu.get(lambda: _build_cpu(verbose), _cpu_build_failed)


def _cpu_build_failed(e: BaseException) -> BuildError:
    log.debug("pyg_dfgnn: CPU extension build error", exc_info=e)
    msg = " ".join(str(e).split()) or type(e).__name__
    if len(msg) > 400:
        msg = msg[:400] + " ..."
    return BuildError(f"pyg_dfgnn: building the CPU extension failed: {msg}")


def _build_cpu(verbose: bool):
    if not cpu_sources():
        raise BuildError(f"pyg_dfgnn: CPU sources not found in {CPU_DIR}; install "
                         "the package from its source checkout (pip install -e .)")
    import shutil
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise BuildError(f"pyg_dfgnn: no C++ compiler found ({cxx!r} is not on PATH; "
                         "set CXX or install g++/clang++)")
    from torch.utils.cpp_extension import load as _load
    build_dir = cpu_cache_dir()
    build_dir.mkdir(parents=True, exist_ok=True)
    fresh = not any(build_dir.glob("*.so"))
    if fresh:
        print(f"pyg_dfgnn: compiling CPU kernels into {build_dir} (first use only)...",
              file=sys.stderr, flush=True)
    t0 = time.time()
    cflags, ldflags = _cpu_flags()
    _load(name="pyg_dfgnn_cpu", sources=[str(s) for s in cpu_sources()],
          extra_cflags=cflags, extra_ldflags=ldflags,
          build_directory=str(build_dir), verbose=verbose, with_cuda=False,
          is_python_module=False)
    if fresh:
        print(f"pyg_dfgnn: CPU kernels built in {time.time() - t0:.1f}s",
              file=sys.stderr, flush=True)
    # the library registers torch.ops.dfgnn_cpu.* (TORCH_LIBRARY)
    return torch.ops.dfgnn_cpu


def cpu_ops():
    """``torch.ops.dfgnn_cpu`` or ``None`` (kernels disabled or not buildable:
    one warning per process names the cause; the reference path is used)."""
    global _cpu_warned
    if not cpu_kernels_enabled():
        return None
    if _cpu.module is not None:
        return _cpu.module
    try:
        return load_cpu()
    except BuildError as e:
        if not _cpu_warned:
            _cpu_warned = True
            import warnings
            warnings.warn(f"{e}; CPU tensors use the (slower) pure-PyTorch reference path. "
                          "Install a C++ compiler (g++/clang++) or set "
                          "PYG_DFGNN_CPU_KERNELS=0 to silence this.", RuntimeWarning,
                          stacklevel=3)
        return None


def is_cpu_built() -> bool:
    return _cpu.module is not None
