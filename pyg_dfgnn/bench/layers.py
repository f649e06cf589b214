"""Layer-level benchmark: our fused conv layers vs PyG's own.

Layers (``layers.names``), at every shape ``heads`` x ``channels`` of
``layers.shapes`` (see :mod:`pyg_dfgnn.bench.config`): ``gat`` (GATConv),
``gatv2`` (GATv2Conv), ``transformer`` (TransformerConv) -- ``heads`` x
``channels`` with concatenated heads on ``in_channels`` input features -- and
``agnn`` (AGNNConv: single head on ``F = heads * channels`` features, the
same width as the others' output; its rows say ``heads=1, channels=F`` and
carry the configured ``shape``).

Contenders (``layers.contenders``), all with the same weights (one seeded
PyG module; the fused layer gets its ``state_dict``) and the same inputs:

* ``fused``       -- ``pyg_dfgnn.nn.<Layer>`` on ``edge_index`` (the CSR
  conversion is cached on the ``edge_index`` object; its cost shows in
  ``first_ms``);
* ``pyg``         -- PyG's layer on ``edge_index``: gather + scatter (the
  baseline of the speedups);
* ``pyg_sparse``  -- PyG's layer on a ``torch_sparse.SparseTensor`` ``adj_t``
  (built once, in ``setup_ms``); ``n/a: torch_sparse missing`` without it;
* ``pyg_compile`` -- ``torch.compile(PyG layer)`` on ``edge_index``; compile
  time shows in ``first_ms`` / ``first_fwdbwd_ms``.  Controlled by the
  ``compile:`` config section (per-graph switch, total time budget).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .graphs import BenchGraph, Unavailable
from .runner import (Case, Factory, Prepared, Settings, Skipped, deepcopy_to,
                     run_cases)

#: name -> (class name, multi-head?)
LAYERS: Dict[str, tuple] = {
    "gat": ("GATConv", True),
    "gatv2": ("GATv2Conv", True),
    "transformer": ("TransformerConv", True),
    "agnn": ("AGNNConv", False),
}

CONTENDERS = ("fused", "pyg", "pyg_sparse", "pyg_compile")


def layer_kwargs(name: str, heads: int, channels: int, in_channels: int,
                 extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    if name not in LAYERS:
        raise ValueError(f"unknown layer {name!r}; choose from {sorted(LAYERS)}")
    if LAYERS[name][1]:
        kw = {"in_channels": in_channels, "out_channels": channels, "heads": heads}
    else:
        kw = {"requires_grad": True}
    kw.update(extra or {})
    return kw


def _adds_self_loops(name: str, kw: Dict[str, Any]) -> bool:
    return name in ("gat", "gatv2", "agnn") and kw.get("add_self_loops", True)


def build_case(graph: BenchGraph, name: str, heads: int, channels: int, in_channels: int,
               dtype: torch.dtype, device: torch.device, seed: int = 0,
               kwargs: Optional[Dict[str, Any]] = None) -> Case:
    """Seeded PyG layer + inputs + upstream gradient for one (graph, layer) at
    shape ``heads`` x ``channels`` (AGNN: one head of ``heads * channels``)."""
    import torch_geometric.nn as pygnn
    cls_name, multi = LAYERS[name]
    kw = layer_kwargs(name, heads, channels, in_channels, kwargs)
    torch.manual_seed(seed)
    native = getattr(pygnn, cls_name)(**kw).to(device=device, dtype=dtype)
    n = graph.num_nodes
    shape = f"{heads}x{channels}"
    H = heads if multi else 1
    if not multi:
        channels = heads * channels
    fin = in_channels if multi else channels
    # drawn on the case's device (fp32, then rounded: every dtype sees the same
    # values); CPU-drawn inputs cost ~0.2-1.5 s per case at 100k-500k nodes
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    x = torch.randn(n, fin, generator=gen, device=device).to(dtype)
    concat = kw.get("concat", True)
    out_dim = (H * channels if concat else channels) if multi else channels
    grad_out = torch.randn(n, out_dim, generator=gen, device=device).to(dtype)
    ei = graph.edge_index.to(device)
    loops = int((graph.edge_index[0] == graph.edge_index[1]).sum())
    e_eff = graph.num_edges - loops + n if _adds_self_loops(name, kw) else graph.num_edges
    stats = graph.stats()

    def reference(dev: torch.device, dt: torch.dtype) -> Prepared:
        if torch.device(dev) == torch.device(device) and dt == dtype:
            m, e = native, ei
        else:
            m, e = deepcopy_to(native, dev, dt), ei.to(dev)
        return Prepared(fn=lambda x_: m(x_, e), params=dict(m.named_parameters()), keep=m)

    return Case(section="layer", graph=graph, name=name, heads=H, channels=channels,
                dtype=dtype, device=torch.device(device), inputs=[x], grad_out=grad_out,
                reference=reference, elements=e_eff * H * channels, baseline="pyg",
                num_edges_eff=e_eff, shape=shape,
                extra={"native": native, "edge_index": ei, "kwargs": kw,
                       "cls_name": cls_name,
                       "max_in_degree": stats["max_in_degree"]
                       + (1 if _adds_self_loops(name, kw) else 0)})


# --------------------------------------------------------------------------- #
# contenders
# --------------------------------------------------------------------------- #

def fused_factory(case: Case) -> Prepared:
    from ..ops.fused import cpu_path
    try:
        import pyg_dfgnn.nn as dnn
    except Exception as e:  # pragma: no cover - depends on the other module's state
        raise Unavailable(f"pyg_dfgnn.nn not importable ({type(e).__name__}: {e})")
    cls_name = case.extra["cls_name"]
    cls = getattr(dnn, cls_name, None)
    if cls is None:
        raise Unavailable(f"pyg_dfgnn.nn.{cls_name} not available")
    from ..graph import clear_cache
    clear_cache()  # so first_ms includes this layer's CSR conversion
    m = cls(**case.extra["kwargs"]).to(device=case.device, dtype=case.dtype)
    m.load_state_dict(case.extra["native"].state_dict())
    ei = case.extra["edge_index"]
    why = getattr(m, "_fused_fallback_reason", None)
    reason = why(case.inputs[0]) if callable(why) else None
    if reason is not None:  # it would silently time PyG's own path
        raise Unavailable(f"fused path not taken ({reason})")
    note = "" if case.device.type == "cuda" else f"CPU: {cpu_path(case.dtype)}"
    return Prepared(fn=lambda x: m(x, ei), params=dict(m.named_parameters()), keep=m,
                    note=note)


def pyg_factory(case: Case) -> Prepared:
    m, ei = case.extra["native"], case.extra["edge_index"]
    return Prepared(fn=lambda x: m(x, ei), params=dict(m.named_parameters()), keep=m)


def pyg_sparse_factory(case: Case) -> Prepared:
    try:
        from torch_sparse import SparseTensor
    except Exception:
        raise Unavailable("torch_sparse missing")
    import torch_geometric.typing as pyg_typing
    if not getattr(pyg_typing, "WITH_TORCH_SPARSE", False):
        raise Unavailable("torch_sparse not usable by torch_geometric")
    m, ei = case.extra["native"], case.extra["edge_index"]
    n = case.graph.num_nodes
    adj_t = SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(n, n))
    adj_t.storage.rowptr()  # materialise the CSR once, outside the timed calls
    return Prepared(fn=lambda x: m(x, adj_t), params=dict(m.named_parameters()),
                    keep=(m, adj_t))


def make_compile_factory(dynamic: bool = False, mode: Optional[str] = None) -> Factory:
    def factory(case: Case) -> Prepared:
        if not hasattr(torch, "compile"):  # pragma: no cover
            raise Unavailable("torch.compile missing")
        from torch import _dynamo
        _dynamo.reset()  # fresh caches: no recompile limit hit across graphs
        m, ei = case.extra["native"], case.extra["edge_index"]
        cm = torch.compile(m, dynamic=dynamic, mode=mode)
        return Prepared(fn=lambda x: cm(x, ei), params=dict(m.named_parameters()),
                        keep=cm, note=f"torch.compile(dynamic={dynamic}, mode={mode})")
    return factory


def contender_factories(names: List[str], compile_cfg: Dict[str, Any]) -> Dict[str, Factory]:
    table: Dict[str, Factory] = {
        "fused": fused_factory, "pyg": pyg_factory, "pyg_sparse": pyg_sparse_factory,
        "pyg_compile": make_compile_factory(bool(compile_cfg.get("dynamic", False)),
                                            compile_cfg.get("mode")),
    }
    bad = [n for n in names if n not in table]
    if bad:
        raise ValueError(f"layers.contenders: unknown layer contender(s) {bad}; choose from "
                         f"{list(table)}")
    return {n: table[n] for n in names}


class CompileGate:
    """Decides per graph whether ``pyg_compile`` runs, and enforces the total
    compile-time budget (first calls of compiled contenders)."""

    def __init__(self, cfg: Dict[str, Any]):
        self.enabled = bool(cfg.get("enabled", True))
        self.graphs = cfg.get("graphs")
        self.budget_s = cfg.get("budget_s")
        self.spent_s = 0.0

    def reason(self, graph: BenchGraph) -> Optional[str]:
        if "compile" in graph.spec:
            if not graph.spec["compile"]:
                return "torch.compile off for this graph (config)"
        elif not self.enabled:
            return "torch.compile disabled (config compile.enabled)"
        elif self.graphs is not None and graph.name not in self.graphs:
            return "torch.compile not configured for this graph (compile.graphs)"
        if self.budget_s is not None and self.spent_s >= float(self.budget_s):
            return f"compile budget of {float(self.budget_s):g}s used up"
        return None

    def charge(self, row: Dict[str, Any]) -> None:
        self.spent_s += sum(float(row.get(k) or 0.0) for k in
                            ("setup_ms", "first_ms", "first_fwdbwd_ms")) / 1e3


def run_layers(graph: BenchGraph, cfg: Dict[str, Any], settings: Settings,
               dtype: torch.dtype, device: torch.device, gate: CompileGate,
               on_row: Optional[Callable[[Dict[str, Any]], None]] = None,
               contenders: Optional[Dict[str, Factory]] = None,
               shape: Optional[Tuple[int, int]] = None,
               contender_names: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """Every layer of ``layers.names`` on ``graph`` at one ``shape`` (default:
    the first of ``layers.shapes``) and ``dtype``; ``contender_names`` picks
    the contenders (default: ``layers.contenders``)."""
    from .config import section_shapes, shape_label
    lc = cfg["layers"]
    facts = contenders or contender_factories(
        list(lc["contenders"] if contender_names is None else contender_names),
        cfg.get("compile", {}))
    for name in lc["names"]:
        if name not in LAYERS:
            raise ValueError(f"layers.names: unknown layer {name!r}; choose from "
                             f"{sorted(LAYERS)}")
    heads, channels = shape if shape is not None else section_shapes(cfg, "layers")[0]

    def build(name: str):
        return build_case(graph, name, int(heads), int(channels),
                          int(lc["in_channels"]), dtype, device, int(cfg.get("seed", 0)),
                          (lc.get("kwargs") or {}).get(name))

    def before(cname: str) -> Optional[str]:
        return gate.reason(graph) if cname == "pyg_compile" else None

    def after(cname: str, row: Dict[str, Any]) -> None:
        if cname == "pyg_compile":
            if row["status"] and not row["status"].startswith("skipped"):
                gate.charge(row)
            from torch import _dynamo
            _dynamo.reset()

    return run_cases("layer", graph, lc["names"], build, "pyg", facts, dtype, device, settings,
                     on_row=on_row, before=before, after=after,
                     shape=shape_label((heads, channels)))


__all__ = ["LAYERS", "CONTENDERS", "build_case", "run_layers", "contender_factories",
           "fused_factory", "pyg_factory", "pyg_sparse_factory", "make_compile_factory",
           "CompileGate", "Skipped"]
