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
* ``file`` -- a user's node-level graph: ``torch.save`` of a
  :class:`torch_geometric.data.Data` (or a dict) with ``x``, ``edge_index``, ``y``
  and optional ``train_mask`` / ``val_mask`` / ``test_mask`` (``data.path``).
* ``pyg`` -- one graph of a :mod:`torch_geometric.datasets` class,
  ``cls(root=data.root, **data.pyg_kwargs)[0]`` (``data.pyg_class``).

One-graph data sets without the three masks get a seeded random node split
(:func:`random_split`, fractions ``data.split``, default 60 / 20 / 20 %).
Problems with a user's graph (no ``x`` / ``y``, ``edge_index`` out of range,
...) raise :class:`pyg_dfgnn.train.config.ConfigError` naming the key.

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
           "random_split", "node_data_bundle", "SBM_NAMES", "PLANETOID_NAMES",
           "SYNTHETIC_NAMES", "USER_NAMES", "DATASET_NAMES", "DEFAULT_SPLIT"]

SBM_NAMES = ("PATTERN", "CLUSTER")
PLANETOID_NAMES = ("Cora", "CiteSeer", "PubMed")
SYNTHETIC_NAMES = ("synthetic_uniform", "synthetic_powerlaw")
USER_NAMES = ("file", "pyg")
DATASET_NAMES = SBM_NAMES + PLANETOID_NAMES + SYNTHETIC_NAMES + USER_NAMES

#: train / val / test fractions of :func:`random_split` (``data.split``)
DEFAULT_SPLIT = (0.6, 0.2, 0.2)

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


def random_split(num_nodes: int, fractions: Sequence[float] = DEFAULT_SPLIT,
                 generator: torch.Generator = None, candidates=None):
    """Three disjoint boolean masks ``[num_nodes]``: ``int(f * n)`` nodes each of a
    random permutation of the ``n`` candidate nodes (all nodes, or the ``candidates``
    index) for train and val; test takes the rest when the fractions sum to 1,
    else ``int(f_test * n)``."""
    f = [float(v) for v in fractions]
    if len(f) != 3 or any(v <= 0 for v in f) or sum(f) > 1 + 1e-9:
        raise ValueError(f"'fractions' must be 3 values > 0 summing to <= 1, got {fractions}")
    cand = torch.arange(num_nodes) if candidates is None else candidates
    n = cand.numel()
    perm = cand[torch.randperm(n, generator=generator)]
    ntr, nva = int(f[0] * n), int(f[1] * n)
    nte = n - ntr - nva if abs(sum(f) - 1) <= 1e-9 else int(f[2] * n)
    masks = [torch.zeros(num_nodes, dtype=torch.bool) for _ in range(3)]
    masks[0][perm[:ntr]] = True
    masks[1][perm[ntr:ntr + nva]] = True
    masks[2][perm[ntr + nva:ntr + nva + nte]] = True
    return masks


def _split(cfg) -> tuple:
    return tuple(getattr(cfg, "split", None) or DEFAULT_SPLIT)


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
    masks = random_split(n, _split(cfg), g)
    data = Data(x=x, edge_index=ei, y=y, train_mask=masks[0], val_mask=masks[1],
                test_mask=masks[2], num_nodes=n)
    src = (f"pyg_dfgnn.data.synthetic.{how} with random features/labels "
           "(throughput runs; accuracy is meaningless)")
    return DataBundle(name=name, kind="full", num_classes=C, in_dim=F, categorical=False,
                      metric="acc", weighted_loss=False, source=src, data=data,
                      stats={"num_nodes": n, "num_edges": int(ei.size(1))})


# ----------------------------------------------------------------------------
# a user's node-level graph: data.name=file / pyg
# ----------------------------------------------------------------------------
def _config_error(msg: str) -> Exception:
    from ..train.config import ConfigError  # lazily: pyg_dfgnn.train imports this package
    return ConfigError(msg)


def _pyg_safe_globals() -> list:
    """The classes a pickled ``Data`` refers to, for ``torch.load(weights_only=True)``."""
    from torch_geometric.data import data as pyg_data, storage
    names = [(pyg_data, "Data"), (pyg_data, "DataEdgeAttr"), (pyg_data, "DataTensorAttr"),
             (storage, "GlobalStorage"), (storage, "NodeStorage"), (storage, "EdgeStorage")]
    return [getattr(m, n) for m, n in names if hasattr(m, n)]


def _read_graph_file(path: str, log: Callable[[str], None]):
    """``torch.load`` of a Data / dict file: first ``weights_only=True`` with PyG's
    storage classes allowed (no code runs), then -- like PyG's own ``torch_load`` --
    a full unpickle for files holding other objects (logged)."""
    import pickle
    try:
        with torch.serialization.safe_globals(_pyg_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" not in str(e) and "Unsupported global" not in str(e):
            raise _config_error(f"data.path: cannot read {path} ({short_error(e)}); expected "
                                "a file written by torch.save") from None
        log(f"data.path: {path} holds objects outside tensors and PyG's Data; loading it "
            "with torch.load(weights_only=False) (only do this for files you trust)")
    except Exception as e:
        raise _config_error(f"data.path: cannot read {path} ({short_error(e)}); expected a "
                            "file written by torch.save") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise _config_error(f"data.path: cannot read {path} ({short_error(e)})") from None


def node_data_bundle(obj, name: str, source: str, key: str, split=DEFAULT_SPLIT,
                     split_seed: int = 0, log: Callable[[str], None] = print) -> DataBundle:
    """Check a user's node-classification graph and wrap it in a :class:`DataBundle`.

    ``obj`` is a :class:`~torch_geometric.data.Data` or a dict with ``x``
    (``[N, F]`` float, or integer ids ``[N]`` -> embedding), ``edge_index``
    (``[2, E]``, ids in ``[0, N)``), ``y`` (``[N]`` class ids; ``< 0`` =
    unlabelled) and optional boolean ``train_mask`` / ``val_mask`` /
    ``test_mask`` (``[N]``, or ``[N, K]`` split columns: the first is used).
    Without all three masks, :func:`random_split` of the labelled nodes with
    ``split`` and a generator seeded with ``split_seed``.  Every problem is a
    ConfigError naming ``key`` (``data.path`` / ``data.pyg_class``).
    """
    from torch_geometric.data import Data
    if isinstance(obj, dict):
        obj = Data(**obj)
    if not isinstance(obj, Data):
        raise _config_error(f"{key}: {source} holds a {type(obj).__name__}, not a "
                            "torch_geometric.data.Data (or a dict) with x, edge_index and y")
    missing = [k for k in ("x", "edge_index", "y") if getattr(obj, k, None) is None]
    if missing:
        raise _config_error(f"{key}: {source} has no {', '.join(repr(m) for m in missing)}; "
                            "node classification needs x (node features), edge_index and y "
                            "(node labels)")
    x, ei, y = obj.x, obj.edge_index, obj.y
    if not all(isinstance(t, torch.Tensor) for t in (x, ei, y)):
        raise _config_error(f"{key}: x, edge_index and y of {source} must be tensors")
    if x.dim() == 1:
        x = x.view(-1, 1) if x.is_floating_point() else x
    if x.dim() != 2 and not (x.dim() == 1 and not x.is_floating_point()):
        raise _config_error(f"{key}: x of {source} must be [num_nodes, num_features], got "
                            f"shape {list(x.shape)}")
    n = int(x.size(0))
    if n == 0:
        raise _config_error(f"{key}: {source} has no nodes")
    if obj.num_nodes is not None and int(obj.num_nodes) != n:
        raise _config_error(f"{key}: {source} has num_nodes={int(obj.num_nodes)} but x has "
                            f"{n} rows")
    if ei.dim() != 2 or ei.size(0) != 2 or ei.is_floating_point() or ei.dtype == torch.bool:
        raise _config_error(f"{key}: edge_index of {source} must be an integer [2, num_edges] "
                            f"tensor, got {ei.dtype} of shape {list(ei.shape)}")
    ei = ei.long()
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
        raise _config_error(f"{key}: edge_index of {source} holds node ids outside [0, {n}) "
                            f"(min {int(ei.min())}, max {int(ei.max())}) for {n} nodes (x)")
    if y.dim() == 2 and y.size(1) == 1:
        y = y.view(-1)
    if y.dim() != 1 or y.size(0) != n or y.is_floating_point() or y.dtype == torch.bool:
        raise _config_error(f"{key}: y of {source} must hold one integer class id per node "
                            f"([{n}]), got {y.dtype} of shape {list(y.shape)} (multi-label "
                            "targets are not supported)")
    y = y.long()
    labelled = y >= 0
    if not bool(labelled.any()):
        raise _config_error(f"{key}: {source} has no labelled node (every y < 0)")
    num_classes = int(y.max()) + 1
    if num_classes < 2:
        raise _config_error(f"{key}: y of {source} has a single class; node classification "
                            "needs >= 2")
    masks, how = [], None
    names = ("train_mask", "val_mask", "test_mask")
    given = [getattr(obj, m, None) for m in names]
    if all(m is not None for m in given):
        for m, t in zip(names, given):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.bool or t.size(0) != n \
                    or t.dim() not in (1, 2):
                raise _config_error(f"{key}: {m} of {source} must be a boolean [{n}] tensor")
            if t.dim() == 2:
                t = t[:, 0]
                how = "the first column of the [N, K] split masks"
            if bool((t & ~labelled).any()):
                raise _config_error(f"{key}: {m} of {source} selects unlabelled nodes (y < 0)")
            if not bool(t.any()):
                raise _config_error(f"{key}: {m} of {source} is empty")
            masks.append(t)
        how = how or "its train/val/test masks"
    else:
        g = torch.Generator().manual_seed(int(split_seed))
        cand = None if bool(labelled.all()) else torch.nonzero(labelled).flatten()
        masks = random_split(n, split, g, cand)
        if not all(bool(m.any()) for m in masks):
            raise _config_error(f"data.split: {list(split)} leaves an empty split on the "
                                f"{int(labelled.sum())} labelled nodes of {source}")
        have = [m for m, t in zip(names, given) if t is not None]
        how = (f"a random {'/'.join(f'{100 * f:g}' for f in split)} % split of the labelled "
               f"nodes (data.split, seed {split_seed})"
               + (f"; its {', '.join(have)} ignored: all three masks are needed" if have
                  else ""))
        if have:
            log(f"{key}: {source} has {', '.join(have)} but not all of train_mask, val_mask, "
                f"test_mask; using {how}")
    categorical = not x.is_floating_point()
    if categorical and x.dim() == 2 and x.size(1) > 1:
        x, categorical = x.float(), False  # integer feature vectors: dense
    if categorical:
        if int(x.min()) < 0:
            raise _config_error(f"{key}: integer x of {source} holds negative ids")
        in_dim = int(x.max()) + 1
    else:
        in_dim = int(x.size(1))
    data = Data(x=x, edge_index=ei, y=y, train_mask=masks[0], val_mask=masks[1],
                test_mask=masks[2], num_nodes=n)
    stats = {"num_nodes": n, "num_edges": int(ei.size(1)),
             "train/val/test": [int(m.sum()) for m in masks]}
    return DataBundle(name=name, kind="full", num_classes=num_classes, in_dim=in_dim,
                      categorical=categorical, metric="acc", weighted_loss=False,
                      source=f"{source}, split: {how}", data=data, stats=stats)


def _load_file(cfg, seed, log) -> DataBundle:
    path = os.path.expanduser(os.fspath(cfg.path))
    if not osp.isfile(path):
        raise _config_error(f"data.path: file not found: {cfg.path}")
    obj = _read_graph_file(path, log)
    return node_data_bundle(obj, f"file:{osp.basename(path)}", f"file {path}", "data.path",
                            _split(cfg), seed, log)


def _load_pyg_class(cfg, root, download, seed, log) -> DataBundle:
    from ..train.config import pyg_dataset_class
    cls = pyg_dataset_class(cfg.pyg_class)
    kwargs = dict(getattr(cfg, "pyg_kwargs", None) or {})
    what = f"{cls.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    from torch_geometric.data import Dataset
    if not download and getattr(cls, "download", None) is not getattr(Dataset, "download", None):
        def no_download(self):
            raise _config_error(
                f"data.root: the raw files of torch_geometric.datasets.{what} are not in "
                f"{self.raw_dir}; put them there or set data.download=true (needs network)")
        # a subclass of the same name whose download() refuses (PyG calls it only
        # when raw files are missing)
        cls = type(cls.__name__, (cls,), {"download": no_download,
                                           "__module__": cls.__module__})
    try:
        ds = cls(root=root, **kwargs)
    except TypeError as e:
        raise _config_error(f"data.pyg_kwargs: torch_geometric.datasets.{cls.__name__} does "
                            f"not take {kwargs} ({short_error(e)})") from None
    except Exception as e:
        from ..train.config import ConfigError
        if isinstance(e, ConfigError):
            raise
        raise DataError(f"loading torch_geometric.datasets.{what} from {root} failed "
                        f"({short_error(e)})") from e
    if len(ds) != 1:
        raise _config_error(f"data.pyg_class: {what} holds {len(ds)} graphs; node-level "
                            "training needs a data set of one graph")
    return node_data_bundle(ds[0], what, f"PyG {what} from {root}", "data.pyg_class",
                            _split(cfg), seed, log)


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
    if name == "file":
        return _load_file(cfg, gen_seed, log)
    if name == "pyg":
        return _load_pyg_class(cfg, root, bool(cfg.download), gen_seed, log)
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
