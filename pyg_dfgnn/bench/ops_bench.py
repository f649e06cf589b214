"""Kernel-level benchmark: the raw fused ops vs naive gather+softmax+scatter.

Ops (``ops.names``), at every shape ``H`` x ``F`` of ``ops.shapes`` (heads x
channels per head; :mod:`pyg_dfgnn.bench.config`), on the graph as generated
(no self-loops added):

* ``gat``   -- ``pyg_dfgnn.ops.gat_attention(graph, x [N,H,F], a_src [N,H], a_dst [N,H])``
* ``gatv2`` -- ``gatv2_attention(graph, x_src [N,H,F], x_dst [N,H,F], att [H,F])``
* ``dot``   -- ``dot_attention(graph, q, k, v [N,H,F])``, scale ``1/sqrt(F)``

Contenders: ``fused`` (the op on ``pyg_dfgnn.graph.get_graph(edge_index, (N, N))``,
converted once in ``setup_ms``) and ``naive``
(``pyg_dfgnn.ops.reference.naive_attention`` on the same ``edge_index``:
PyG's ``softmax`` with gathers and an ``index_add_`` scatter, autograd for
the backward; the baseline).  Every input requires grad in forward+backward.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .graphs import BenchGraph, Unavailable
from .runner import Case, Factory, Prepared, Settings, run_cases

OPS = ("gat", "gatv2", "dot")


def _kind(name: str) -> int:
    from ..ops.reference import DOT, GAT, GATV2
    try:
        return {"gat": GAT, "gatv2": GATV2, "dot": DOT}[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; choose from {list(OPS)}")


def build_op_case(graph: BenchGraph, name: str, heads: int, channels: int,
                  dtype: torch.dtype, device: torch.device, seed: int = 0) -> Case:
    from ..ops.reference import naive_attention
    kind = _kind(name)
    n, H, Fd = graph.num_nodes, heads, channels
    gen = torch.Generator(device=device).manual_seed(seed + 7)  # see layers.build_case

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    if name == "gat":
        inputs = [rnd(n, H, Fd), rnd(n, H), rnd(n, H)]          # x, a_src, a_dst
    elif name == "gatv2":
        inputs = [rnd(n, H, Fd), rnd(n, H, Fd), rnd(H, Fd)]     # x_src, x_dst, att
    else:
        inputs = [rnd(n, H, Fd), rnd(n, H, Fd), rnd(n, H, Fd)]  # q, k, v
    grad_out = rnd(n, H, Fd)
    scale = 1.0 / math.sqrt(Fd)
    ei = graph.edge_index.to(device)

    def naive_fn(e):
        if name == "gat":
            return lambda x, a_s, a_d: naive_attention(kind, e, n, a_d, a_s, x, None, None)[0]
        if name == "gatv2":
            return lambda xs, xd, att: naive_attention(kind, e, n, xd, xs, None, None,
                                                       att)[0]
        return lambda q, k, v: naive_attention(kind, e, n, q, k, v, None, None, scale)[0]

    def reference(dev: torch.device, dt: torch.dtype) -> Prepared:
        return Prepared(fn=naive_fn(ei if torch.device(dev) == torch.device(device)
                                    else ei.to(dev)))

    return Case(section="op", graph=graph, name=name, heads=H, channels=Fd, dtype=dtype,
                device=torch.device(device), inputs=inputs, grad_out=grad_out,
                reference=reference, elements=graph.num_edges * H * Fd, baseline="naive",
                num_edges_eff=graph.num_edges, shape=f"{H}x{Fd}",
                extra={"edge_index": ei, "scale": scale, "naive_fn": naive_fn,
                       "max_in_degree": graph.stats()["max_in_degree"]})


def fused_op_factory(case: Case) -> Prepared:
    try:
        from .. import ops
        from ..graph import clear_cache, get_graph
        from ..ops.fused import cpu_path
    except Exception as e:  # pragma: no cover
        raise Unavailable(f"pyg_dfgnn.ops not importable ({type(e).__name__}: {e})")
    clear_cache()
    n = case.graph.num_nodes
    g = get_graph(case.extra["edge_index"], (n, n))
    if case.name == "gat":
        fn = lambda x, a_s, a_d: ops.gat_attention(g, x, a_s, a_d)[0]  # noqa: E731
    elif case.name == "gatv2":
        fn = lambda xs, xd, att: ops.gatv2_attention(g, xs, xd, att)[0]  # noqa: E731
    else:
        scale = case.extra["scale"]
        fn = lambda q, k, v: ops.dot_attention(g, q, k, v, None, scale)[0]  # noqa: E731
    note = "" if case.device.type == "cuda" else f"CPU: {cpu_path(case.dtype)}"
    return Prepared(fn=fn, keep=g, note=note)


def naive_op_factory(case: Case) -> Prepared:
    return Prepared(fn=case.extra["naive_fn"](case.extra["edge_index"]))


def op_factories(names: List[str]) -> Dict[str, Factory]:
    table: Dict[str, Factory] = {"fused": fused_op_factory, "naive": naive_op_factory}
    bad = [n for n in names if n not in table]
    if bad:
        raise ValueError(f"ops.contenders: unknown op contender(s) {bad}; choose from "
                         f"{list(table)}")
    return {n: table[n] for n in names}


def run_ops(graph: BenchGraph, cfg: Dict[str, Any], settings: Settings, dtype: torch.dtype,
            device: torch.device, on_row: Optional[Callable[[Dict[str, Any]], None]] = None,
            contenders: Optional[Dict[str, Factory]] = None,
            shape: Optional[Tuple[int, int]] = None,
            contender_names: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """Every op of ``ops.names`` on ``graph`` at one ``shape`` (default: the
    first of ``ops.shapes``) and ``dtype``; ``contender_names`` picks the contenders."""
    from .config import section_shapes
    oc = cfg["ops"]
    facts = contenders or op_factories(
        list(oc.get("contenders", ["fused", "naive"]) if contender_names is None
             else contender_names))
    for name in oc["names"]:
        try:
            _kind(name)  # unknown op names are a config error
        except ValueError as e:
            raise ValueError(f"ops.names: {e}") from None
    heads, channels = shape if shape is not None else section_shapes(cfg, "ops")[0]

    def build(name: str):
        return build_op_case(graph, name, int(heads), int(channels), dtype,
                             device, int(cfg.get("seed", 0)))

    return run_cases("op", graph, oc["names"], build, "naive", facts, dtype, device, settings,
                     on_row=on_row, shape=f"{heads}x{channels}")
