"""Synthetic benchmark graphs, vectorised torch, deterministic from a seed.

Every generator draws from its own ``torch.Generator`` on the CPU (so the
same seed gives the same graph on every machine and device) and returns an
``edge_index [2, E]`` (``int64``, row 0 = source, row 1 = target) that is

* simple: no self-loops (the attention layers add their own) and no
  duplicate edges,
* of exactly the requested number of edges,
* sorted by (source, target), the order of PyG's ``coalesce``.

Move it to a device with ``.to(device)``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["uniform_graph", "powerlaw_graph", "powerlaw_in_degrees", "in_degree",
           "graph_stats"]


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    return g


def _check(num_nodes: int, num_edges: int) -> None:
    if num_nodes < 2:
        raise ValueError(f"'num_nodes' must be >= 2, got {num_nodes}")
    if num_edges < 0:
        raise ValueError(f"'num_edges' must be >= 0, got {num_edges}")
    if num_edges > num_nodes * (num_nodes - 1):
        raise ValueError(f"'num_edges'={num_edges} exceeds the {num_nodes * (num_nodes - 1)} "
                         f"possible edges of a simple directed graph on {num_nodes} nodes")


def _keys_to_edge_index(keys: Tensor, num_nodes: int) -> Tensor:
    keys = torch.sort(keys).values
    return torch.stack([keys // num_nodes, keys % num_nodes])


def uniform_graph(num_nodes: int, num_edges: int, seed: int = 0) -> Tensor:
    """Erdos-Renyi style G(n, m): ``num_edges`` distinct directed edges chosen
    uniformly at random (no self-loops), sorted by (source, target)."""
    _check(num_nodes, num_edges)
    g = _gen(seed)
    n = int(num_nodes)
    keys = torch.empty(0, dtype=torch.long)
    # rejection sampling of distinct (src, dst) pairs, encoded as src * n + dst
    while keys.numel() < num_edges:
        need = num_edges - keys.numel()
        m = int(need * 1.1) + 1024
        src = torch.randint(0, n, (m,), generator=g)
        dst = torch.randint(0, n, (m,), generator=g)
        ok = src != dst
        keys = torch.unique(torch.cat([keys, src[ok] * n + dst[ok]]))  # sorted, distinct
    if keys.numel() > num_edges:  # keep a uniformly random subset of exactly num_edges
        keys = keys[torch.randperm(keys.numel(), generator=g)[:num_edges]]
    return _keys_to_edge_index(keys, n)


def powerlaw_in_degrees(num_nodes: int, num_edges: int, max_degree: int) -> Tensor:
    """Zipf in-degree sequence by rank: ``d_r = floor(max_degree * r^-s)``, with
    the exponent ``s`` found by bisection so the degrees sum to ``num_edges``
    (the small remainder goes +1 to ranks 2, 3, ...).  ``d_1 == max_degree``
    exactly: the top *super nodes* reach ``max_degree``."""
    _check(num_nodes, num_edges)
    n = int(num_nodes)
    if not 1 <= max_degree <= n - 1:
        raise ValueError(f"'max_degree' must be in [1, num_nodes - 1], got {max_degree}")
    if num_edges < max_degree:
        raise ValueError(f"'num_edges'={num_edges} is smaller than 'max_degree'={max_degree}")
    if num_edges > max_degree * n:
        raise ValueError(f"'num_edges'={num_edges} cannot be reached with every in-degree "
                         f"<= max_degree={max_degree} on {n} nodes")
    ranks = torch.arange(1, n + 1, dtype=torch.float64)
    logr = torch.log(ranks)

    def degrees(s: float) -> Tensor:
        return torch.floor(max_degree * torch.exp(-s * logr))

    lo, hi = 0.0, 64.0  # sum at lo = max_degree * n >= E, sum at hi ~ max_degree <= E
    for _ in range(48):
        mid = 0.5 * (lo + hi)
        if float(degrees(mid).sum()) > num_edges:
            lo = mid
        else:
            hi = mid
    deg = degrees(hi).long()  # sum <= E
    rem = num_edges - int(deg.sum())
    cap = max_degree
    # distribute the remainder +1 to ranks 2.., never exceeding max_degree
    r = 1
    while rem > 0:
        room = (cap - deg[r:]).clamp_min(0)
        add = torch.clamp(room, max=1)
        c = torch.cumsum(add, 0)
        add = torch.where(c <= rem, add, torch.zeros_like(add))
        deg[r:] += add
        rem -= int(add.sum())
        if int(add.sum()) == 0:  # pragma: no cover - excluded by the checks above
            raise RuntimeError("could not distribute the remaining edges")
    return deg


def powerlaw_graph(num_nodes: int, num_edges: int, max_degree: int, seed: int = 0) -> Tensor:
    """Power-law in-degree graph with a few *super nodes*.

    In-degrees follow :func:`powerlaw_in_degrees` (a Zipf sequence whose top
    node has in-degree exactly ``max_degree``), assigned to a random
    permutation of the node ids; each node's sources are distinct, uniformly
    random and never the node itself (so out-degrees are roughly Poisson).
    Example: ``powerlaw_graph(100_000, 1_400_000, 60_000)`` has a handful of
    nodes with in-degree > 10k and one with 60k.
    """
    deg = powerlaw_in_degrees(num_nodes, num_edges, max_degree)
    g = _gen(seed)
    n = int(num_nodes)
    node_of_rank = torch.randperm(n, generator=g)
    # heavy rows (a few): exact sampling without replacement via randperm
    heavy = deg > max(n // 16, 1)
    keys_parts = []
    for r in torch.nonzero(heavy).flatten().tolist():
        v = int(node_of_rank[r])
        d = int(deg[r])
        cand = torch.randperm(n - 1, generator=g)[:d]
        cand = cand + (cand >= v).long()  # skip the node itself
        keys_parts.append(cand * n + v)
    # light rows: rejection sampling of distinct sources, vectorised
    light_deg = torch.where(heavy, torch.zeros_like(deg), deg)
    dst = torch.repeat_interleave(node_of_rank, light_deg)
    keys = torch.empty(0, dtype=torch.long)
    want = torch.bincount(dst, minlength=n)
    pending = dst
    while pending.numel():
        src = torch.randint(0, n, (pending.numel(),), generator=g)
        ok = src != pending
        keys = torch.unique(torch.cat([keys, src[ok] * n + pending[ok]]))
        # self-loops and duplicates are redrawn for the rows that lost them
        missing = want - torch.bincount(keys % n, minlength=n)
        pending = torch.repeat_interleave(torch.arange(n), missing)
    keys = torch.cat(keys_parts + [keys]) if keys_parts else keys
    return _keys_to_edge_index(keys, n)


def in_degree(edge_index: Tensor, num_nodes: Optional[int] = None) -> Tensor:
    n = int(edge_index.max()) + 1 if num_nodes is None else int(num_nodes)
    return torch.bincount(edge_index[1].long(), minlength=n)


def graph_stats(edge_index: Tensor, num_nodes: int) -> dict:
    """Cheap degree statistics for reports."""
    din = in_degree(edge_index, num_nodes)
    return {"num_nodes": int(num_nodes), "num_edges": int(edge_index.size(1)),
            "max_in_degree": int(din.max()) if din.numel() else 0,
            "mean_in_degree": float(edge_index.size(1) / max(num_nodes, 1)),
            "isolated_dst": int((din == 0).sum())}


if __name__ == "__main__":  # pragma: no cover - manual smoke test
    import time
    t = time.perf_counter()
    ei = powerlaw_graph(100_000, 1_400_000, 60_000, seed=0)
    print(graph_stats(ei, 100_000), f"{time.perf_counter() - t:.2f}s")
