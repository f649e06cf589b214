"""Benchmark graphs from config entries.

Kinds (``kind:`` key of a ``graphs:`` entry):

* ``uniform``  -- :func:`pyg_dfgnn.data.synthetic.uniform_graph`
  (``num_nodes``, ``num_edges``, ``seed``);
* ``powerlaw`` -- :func:`pyg_dfgnn.data.synthetic.powerlaw_graph`
  (``num_nodes``, ``num_edges``, ``max_degree``, ``seed``);
* ``pattern``  -- ``pyg_dfgnn.data.sbm.pattern_like_batch(num_graphs, seed)``,
  a batch of PATTERN-like SBM graphs (imported lazily);
* ``pyg``      -- any ``torch_geometric.datasets`` class already present under
  a data root (``dataset: Planetoid``, ``dataset_name: Cora``,
  ``root: data/Planetoid`` or a list of candidate roots, the first non-empty
  one wins; ``writable_copy: true`` processes a scratch copy of the root;
  optional ``kwargs:``; multi-graph data sets are batched: ``num_graphs``).
  Nothing is downloaded: no usable root makes the graph unavailable
  (``skipped``).

Only the structure is used: every layer gets random features of its own
width, identical for every contender.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict

from torch import Tensor

from ..data import synthetic


class Unavailable(Exception):
    """A graph / contender / run that cannot be benchmarked here (reported as
    ``n/a: <reason>`` or ``skipped: <reason>``, never a crash)."""


@dataclass
class BenchGraph:
    name: str
    kind: str
    edge_index: Tensor          # CPU, int64, [2, E]
    num_nodes: int
    spec: Dict[str, Any] = field(default_factory=dict)
    build_s: float = 0.0

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.size(1))

    def stats(self) -> Dict[str, Any]:
        return synthetic.graph_stats(self.edge_index, self.num_nodes)


def _req(spec: Dict[str, Any], key: str):
    if key not in spec:
        raise ValueError(f"graph {spec.get('name', '?')!r} ({spec.get('kind')}) needs "
                         f"'{key}'")
    return spec[key]


def _pattern(spec: Dict[str, Any]):
    try:
        from ..data.sbm import pattern_like_batch
    except ImportError as e:
        raise Unavailable(f"pyg_dfgnn.data.sbm.pattern_like_batch not importable ({e})")
    b = pattern_like_batch(int(spec.get("num_graphs", 128)), seed=int(spec.get("seed", 0)))
    return b.edge_index.long(), int(b.num_nodes)


def _pyg_root(spec: Dict[str, Any]) -> str:
    roots = _req(spec, "root")
    roots = [roots] if isinstance(roots, str) else list(roots)
    for r in roots:
        if os.path.isdir(r) and os.listdir(r):
            if spec.get("writable_copy", False):
                # process into a scratch copy: the data root may be shared / read-only
                import atexit
                import shutil
                import tempfile
                tmp = tempfile.mkdtemp(prefix="dfgnn_bench_pyg_")
                atexit.register(shutil.rmtree, tmp, True)
                dst = os.path.join(tmp, "root")
                shutil.copytree(r, dst)
                return dst
            return r
    raise Unavailable(f"no data under {roots} (nothing is downloaded)")


def _pyg_dataset(spec: Dict[str, Any]):
    import torch_geometric.datasets as D
    cls_name = _req(spec, "dataset")
    cls = getattr(D, cls_name, None)
    if cls is None:
        raise Unavailable(f"torch_geometric.datasets has no {cls_name!r}")
    root = _pyg_root(spec)
    kwargs = dict(spec.get("kwargs") or {})
    if "dataset_name" in spec:
        kwargs["name"] = spec["dataset_name"]
    try:
        ds = cls(root=root, **kwargs)
    except Exception as e:  # missing raw files -> a download attempt fails offline
        raise Unavailable(f"{cls_name}({kwargs}) under {root!r}: {type(e).__name__}: {e}")
    if len(ds) == 1:
        data = ds[0]
        return data.edge_index.long(), int(data.num_nodes)
    from torch_geometric.data import Batch
    k = min(int(spec.get("num_graphs", 128)), len(ds))
    b = Batch.from_data_list([ds[i] for i in range(k)])
    return b.edge_index.long(), int(b.num_nodes)


def load_graph(spec: Dict[str, Any]) -> BenchGraph:
    """Build one benchmark graph (on the CPU) from its config entry."""
    import time
    kind = _req(spec, "kind")
    name = spec.get("name") or kind
    t = time.perf_counter()
    if kind == "uniform":
        ei = synthetic.uniform_graph(int(_req(spec, "num_nodes")),
                                     int(_req(spec, "num_edges")), int(spec.get("seed", 0)))
        n = int(spec["num_nodes"])
    elif kind == "powerlaw":
        ei = synthetic.powerlaw_graph(int(_req(spec, "num_nodes")),
                                      int(_req(spec, "num_edges")),
                                      int(_req(spec, "max_degree")), int(spec.get("seed", 0)))
        n = int(spec["num_nodes"])
    elif kind == "pattern":
        ei, n = _pattern(spec)
    elif kind == "pyg":
        ei, n = _pyg_dataset(spec)
    else:
        raise ValueError(f"graph {name!r}: unknown kind {kind!r}; choose uniform, powerlaw, "
                         "pattern or pyg")
    return BenchGraph(name=name, kind=kind, edge_index=ei.contiguous(), num_nodes=n,
                      spec=dict(spec), build_s=time.perf_counter() - t)


def graph_name(spec: Dict[str, Any]) -> str:
    return str(spec.get("name") or spec.get("kind"))
