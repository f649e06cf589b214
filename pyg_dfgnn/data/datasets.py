"""Data sets for ``dfgnn train``: one entry point, :func:`load_data`.

* ``PATTERN`` / ``CLUSTER`` -- :class:`torch_geometric.datasets.GNNBenchmarkDataset`
  when its files are present under ``root`` (``root/PATTERN/raw/PATTERN_v2.pt`` or
  the processed split files), or downloaded when ``download=True``; otherwise the
  built-in generator :class:`pyg_dfgnn.data.sbm.SBMDataset`.  Graph mini-batches,
  weighted cross-entropy, mean per-class accuracy (benchmarking-gnns protocol).
* ``Cora`` / ``CiteSeer`` / ``PubMed`` -- :class:`torch_geometric.datasets.Planetoid`
  from ``root/<Name>/raw`` (public split); full batch with masks, plain accuracy.
* ``synthetic_uniform`` / ``synthetic_powerlaw`` -- one large random graph from
  :mod:`pyg_dfgnn.data.synthetic` with random features/labels, for scale runs.

The returned :class:`DataBundle` says which source was used (``bundle.source``)
so the trainer can log it.
"""
from __future__ import annotations

import os
import os.path as osp
from dataclasses import dataclass, field
from typing import Any, Callable, List, Sequence

import torch

from .cache import short_error
from .sbm import DEFAULT_SIZES, SBMDataset

__all__ = ["DataBundle", "DataError", "load_data", "add_laplacian_pe", "laplacian_pe",
           "SBM_NAMES", "PLANETOID_NAMES", "SYNTHETIC_NAMES", "DATASET_NAMES"]

SBM_NAMES = ("PATTERN", "CLUSTER")
PLANETOID_NAMES = ("Cora", "CiteSeer", "PubMed")
SYNTHETIC_NAMES = ("synthetic_uniform", "synthetic_powerlaw")
DATASET_NAMES = SBM_NAMES + PLANETOID_NAMES + SYNTHETIC_NAMES

# Number of classes / input vocabulary of the SBM data sets.
_SBM_CLASSES = {"PATTERN": 2, "CLUSTER": 6}
_SBM_VOCAB = {"PATTERN": 3, "CLUSTER": 7}


class DataError(RuntimeError):
    """A data set cannot be loaded (missing files, missing module, bad option)."""


@dataclass
class DataBundle:
    name: str
    kind: str                      # "graphs" (mini-batches of graphs) or "full" (one graph)
    num_classes: int
    in_dim: int                    # feature width (dense) or vocabulary size (categorical)
    categorical: bool              # x holds integer ids -> embedding; else dense floats
    metric: str                    # "mean_class_acc" or "acc"
    weighted_loss: bool            # benchmarking-gnns class-weighted cross-entropy
    source: str                    # human-readable: where the data came from
    train: Any = None              # kind == "graphs": sequences of Data
    val: Any = None
    test: Any = None
    data: Any = None               # kind == "full": one Data with train/val/test masks
    stats: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------
def _canonical(name: str) -> str:
    for n in DATASET_NAMES:
        if n.lower() == str(name).lower():
            return n
    raise DataError(f"unknown data set {name!r}; choose from: {', '.join(DATASET_NAMES)}")


def _gnnbenchmark_present(root: str, name: str) -> bool:
    raw = osp.join(root, name, "raw", f"{name}_v2.pt")
    processed = [osp.join(root, name, "processed", f"{s}_data.pt")
                 for s in ("train", "val", "test")]
    return osp.exists(raw) or all(osp.exists(p) for p in processed)


def _x_info(ds_or_data) -> tuple:
    """(categorical, in_dim) from a sample's ``x``."""
    x = ds_or_data.x
    if x.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8):
        return True, int(x.max().item()) + 1
    return False, int(x.size(-1)) if x.dim() > 1 else 1


def _load_sbm(name, root, source, download, sizes, seed, log) -> DataBundle:
    present = _gnnbenchmark_present(root, name)
    use_pyg = source == "pyg" or (source == "auto" and (present or download))
    if source == "pyg" and not present and not download:
        raise DataError(
            f"data.source=pyg but no GNNBenchmarkDataset files for {name} under "
            f"{osp.join(root, name)} (expected raw/{name}_v2.pt); set data.download=true "
            "(needs network) or data.source=generated / auto")
    if use_pyg:
        from torch_geometric.datasets import GNNBenchmarkDataset
        raw_present = osp.exists(osp.join(root, name, "raw", f"{name}_v2.pt"))

        def make(force_reload=False):
            return [GNNBenchmarkDataset(root, name, split=s, force_reload=force_reload)
                    for s in ("train", "val", "test")]
        splits = _load_pyg(make, f"GNNBenchmarkDataset {name}", root,
                           osp.join(root, name, "processed"), raw_present or download, log)
        splits = [_subset(ds, n) for ds, n in zip(splits, sizes or (None,) * 3)]
        src = (f"PyG GNNBenchmarkDataset '{name}' from {osp.join(root, name)}"
               + (" (downloaded)" if not present else ""))
        categorical, in_dim = _x_info(splits[0][0])
        if categorical:
            in_dim = max(in_dim, _SBM_VOCAB[name])
    else:
        full = DEFAULT_SIZES[name]
        sizes = tuple(full[i] if (sizes is None or sizes[i] is None) else int(sizes[i])
                      for i in range(3))
        # SBMDataset logs "generating ..." itself, only when it really generates
        splits = [SBMDataset(root, name, split=s, seed=seed, sizes=sizes, log_fn=log)
                  for s in ("train", "val", "test")]
        if not any(s.generated for s in splits):
            log(f"loaded {name} (built-in SBM generator, seed={seed}, "
                f"{sizes[0]}/{sizes[1]}/{sizes[2]} graphs) from the cache in "
                f"{splits[0].processed_dir}")
        why = ("data.source=generated" if source == "generated" else
               f"the official {name} files were not found under {osp.join(root, name)}")
        src = (f"built-in SBM generator pyg_dfgnn.data.sbm (benchmarking-gnns procedure, "
               f"seed={seed}; NOT the official {name} data set: {why})")
        categorical, in_dim = True, _SBM_VOCAB[name]
    stats = {"num_graphs": [len(s) for s in splits]}
    return DataBundle(name=name, kind="graphs", num_classes=_SBM_CLASSES[name], in_dim=in_dim,
                      categorical=categorical, metric="mean_class_acc", weighted_loss=True,
                      source=src, train=splits[0], val=splits[1], test=splits[2], stats=stats)


def _load_pyg(make: Callable, what: str, root: str, processed_dir: str, can_rebuild: bool,
              log: Callable[[str], None]):
    """``make()``; if that fails and the raw files are there, ``make(force_reload=True)``.

    PyG writes its processed files in place, so a run killed while PyG processes
    leaves a truncated file that every later load trips over.  Such a cache is
    treated as absent: processed again from the raw files, and logged.
    """
    try:
        return make()
    except Exception as e:  # download failure, corrupt files ...
        err = short_error(e)
        cached = osp.isdir(processed_dir) and any(
            f.endswith(".pt") for f in os.listdir(processed_dir))
        if not cached:  # nothing cached to blame: a download / raw-file problem
            raise DataError(f"loading {what} from {root} failed: {e}") from e
        if not can_rebuild:
            raise DataError(f"loading {what} from {root} failed ({err}); the processed files "
                            f"in {processed_dir} may be damaged and there are no raw files "
                            "to rebuild them from") from e
        first = err
    log(f"{what}: the processed files in {processed_dir} are unreadable ({first}); "
        "processing the raw files again")
    try:
        return make(force_reload=True)
    except Exception as e:
        raise DataError(f"loading {what} from {root} failed: {e}") from e


def _subset(ds, n):
    if n is None or n >= len(ds):
        return ds
    return ds[: int(n)]


def _load_planetoid(name, root, download, normalize, log) -> DataBundle:
    from torch_geometric.datasets import Planetoid
    raw_dir = osp.join(root, name, "raw")
    needed = [f"ind.{name.lower()}.{n}" for n in ("x", "tx", "allx", "y", "ty", "ally",
                                                   "graph", "test.index")]
    missing = [f for f in needed if not osp.exists(osp.join(raw_dir, f))]
    if missing and not download:
        raise DataError(
            f"Planetoid {name} raw files not found in {raw_dir} (missing: {', '.join(missing)}); "
            "point data.root at a directory holding <Name>/raw (PyG layout) or set "
            "data.download=true")
    ds = _load_pyg(lambda force_reload=False: Planetoid(root, name, force_reload=force_reload),
                   f"Planetoid {name}", root, osp.join(root, name, "processed"), True, log)
    data = ds[0]
    if normalize:
        from torch_geometric.transforms import NormalizeFeatures
        data = NormalizeFeatures()(data)
    src = (f"PyG Planetoid '{name}' (public split) from {osp.join(root, name)}"
           + (", row-normalised features" if normalize else ""))
    stats = {"num_nodes": int(data.num_nodes), "num_edges": int(data.num_edges),
             "train/val/test": [int(data.train_mask.sum()), int(data.val_mask.sum()),
                                int(data.test_mask.sum())]}
    return DataBundle(name=name, kind="full", num_classes=int(ds.num_classes),
                      in_dim=int(data.x.size(1)), categorical=False, metric="acc",
                      weighted_loss=False, source=src, data=data, stats=stats)


def _load_synthetic(name, cfg, seed, log) -> DataBundle:
    try:
        from . import synthetic  # written by the benchmark side; imported lazily
    except ImportError as e:
        raise DataError(f"{name} needs pyg_dfgnn.data.synthetic, which is not available "
                        f"({e})") from e
    from torch_geometric.data import Data
    g = torch.Generator().manual_seed(int(seed))
    n, m = int(cfg.num_nodes), int(cfg.num_edges)
    if name == "synthetic_uniform":
        ei = synthetic.uniform_graph(n, m, seed=seed)
        how = f"uniform_graph(num_nodes={n}, num_edges={m}, seed={seed})"
    else:
        ei = synthetic.powerlaw_graph(n, m, int(cfg.max_degree), seed=seed)
        how = (f"powerlaw_graph(num_nodes={n}, num_edges={m}, max_degree={cfg.max_degree}, "
               f"seed={seed})")
    if isinstance(ei, tuple):
        ei = ei[0]
    ei = torch.as_tensor(ei, dtype=torch.long)
    F, C = int(cfg.num_features), int(cfg.num_classes)
    x = torch.randn(n, F, generator=g)
    y = torch.randint(0, C, (n,), generator=g)
    perm = torch.randperm(n, generator=g)
    ntr, nva = int(0.6 * n), int(0.2 * n)
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    masks[0][perm[:ntr]] = True
    masks[1][perm[ntr:ntr + nva]] = True
    masks[2][perm[ntr + nva:]] = True
    data = Data(x=x, edge_index=ei, y=y, train_mask=masks[0], val_mask=masks[1],
                test_mask=masks[2], num_nodes=n)
    src = (f"pyg_dfgnn.data.synthetic.{how} with random features/labels "
           "(throughput runs; accuracy is meaningless)")
    return DataBundle(name=name, kind="full", num_classes=C, in_dim=F, categorical=False,
                      metric="acc", weighted_loss=False, source=src, data=data,
                      stats={"num_nodes": n, "num_edges": int(ei.size(1))})


def load_data(cfg, seed: int = 0, log: Callable[[str], None] = print) -> DataBundle:
    """Load the data set described by the ``data`` config section.

    ``cfg`` needs the attributes ``name, root, source, download, num_train,
    num_val, num_test, gen_seed`` (+ ``num_nodes, num_edges, max_degree,
    num_features, num_classes`` for the synthetic graphs).  ``seed`` is used
    for synthetic graphs and as the SBM generator seed when ``gen_seed`` is None.
    """
    name = _canonical(cfg.name)
    root = os.fspath(cfg.root)
    gen_seed = seed if getattr(cfg, "gen_seed", None) is None else int(cfg.gen_seed)
    if name in SBM_NAMES:
        sizes = (cfg.num_train, cfg.num_val, cfg.num_test)
        sizes = None if all(s is None for s in sizes) else sizes
        return _load_sbm(name, root, cfg.source, bool(cfg.download), sizes, gen_seed, log)
    if cfg.source == "generated":
        raise DataError(f"data.source=generated is only available for PATTERN and CLUSTER, "
                        f"not {name}")
    if name in PLANETOID_NAMES:
        return _load_planetoid(name, root, bool(cfg.download),
                               bool(getattr(cfg, "normalize_features", False)), log)
    return _load_synthetic(name, cfg, gen_seed, log)


# ----------------------------------------------------------------------------
# Laplacian positional encodings (Graph Transformer, Dwivedi & Bresson)
# ----------------------------------------------------------------------------
def laplacian_pe(edge_index: torch.Tensor, num_nodes: int, k: int) -> torch.Tensor:
    """Eigenvectors 2..k+1 of ``I - D^-1/2 A D^-1/2`` (sorted by eigenvalue), ``[N, k]``.

    Zero-padded when the graph has fewer than ``k + 1`` nodes.  Signs are
    arbitrary; the model flips them at random during training, as the original.
    """
    import numpy as np
    import scipy.linalg

    A = np.zeros((num_nodes, num_nodes), dtype=np.float64)
    if edge_index.numel():
        ei = edge_index.cpu().numpy()
        A[ei[0], ei[1]] = 1.0
    A = np.maximum(A, A.T)
    deg = A.sum(1)
    dinv = np.zeros_like(deg)
    dinv[deg > 0] = deg[deg > 0] ** -0.5
    L = np.eye(num_nodes) - dinv[:, None] * A * dinv[None, :]
    # (scipy: torch.linalg.eigh is far slower for many small CPU matrices)
    hi = min(k, num_nodes - 1)
    _, vecs = scipy.linalg.eigh(L, subset_by_index=[0, hi])
    pe = torch.from_numpy(np.ascontiguousarray(vecs[:, 1:k + 1])).float()
    if pe.size(1) < k:
        pe = torch.cat([pe, pe.new_zeros(num_nodes, k - pe.size(1))], dim=1)
    return pe.contiguous()


class _single_thread_blas:
    """Best effort: run OpenBLAS single-threaded inside the block.

    Thread start-up dominates LAPACK calls on ~100x100 matrices (50x slower on a
    2-core box); there is no portable API, so look the loaded OpenBLAS copies up
    in ``/proc/self/maps`` and use their ``*set_num_threads*`` symbols if any.
    """

    _SYMS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads",
             "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_")
    _GET = ("openblas_get_num_threads", "scipy_openblas_get_num_threads",
            "scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_")

    def __enter__(self):
        import ctypes
        self._saved = []
        try:
            with open("/proc/self/maps") as f:
                paths = sorted({ln.split()[-1] for ln in f
                                if "openblas" in ln.lower() and ".so" in ln.split()[-1]})
        except OSError:
            return self
        for path in paths:
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for sset, sget in zip(self._SYMS, self._GET):
                fset, fget = getattr(lib, sset, None), getattr(lib, sget, None)
                if fset is not None and fget is not None:
                    try:
                        n = int(fget())
                        fset(1)
                        self._saved.append((fset, n))
                    except Exception:
                        pass
        return self

    def __exit__(self, *exc):
        for fset, n in self._saved:
            try:
                fset(n)
            except Exception:
                pass
        return False


def add_laplacian_pe(dataset: Sequence, k: int) -> List:
    """Materialise ``dataset`` as a list of ``Data`` with a ``lap_pe [N, k]`` attribute."""
    import scipy.linalg  # noqa: F401  (load its BLAS before limiting threads)
    out = []
    with _single_thread_blas():
        for d in dataset:
            d = d.clone()
            d.lap_pe = laplacian_pe(d.edge_index, int(d.num_nodes), k)
            out.append(d)
    return out
