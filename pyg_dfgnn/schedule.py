"""Dynamic bi-level schedule: how the fused kernels map threads to a graph.

Level 1 (graph): the rows of the destination-major CSR (and the columns of its
transpose, for backward) are split once per graph into work items.  Ordinary
rows are one item each; a *super row* whose degree exceeds ``split`` edges is
cut into segments of ``split`` edges computed in parallel by many warps, each
writing a partial (max, sum, accumulator) that a light second pass merges
(DF-GNN's parallelism-maximisation fusion, split-K style).

Level 2 (row): inside each item the kernel maps a *group* of ``group`` lanes
to one (row, head): small feature sizes pack several rows into a warp (DF-GNN's
shared-memory/packed fusion for batches of small graphs), large ones give a
whole warp to a row and loop over feature tiles.

The plan is cached on the :class:`~pyg_dfgnn.graph.CSRGraph`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .graph import CSRGraph


@dataclass
class Plan:
    group: int = 0                  # lanes per (row, head); 0 = kernel decides
    work: Optional[Tensor] = None   # [W, 4] (row, begin, end, slot) or None = all rows
    merge: Optional[Tensor] = None  # [R, 3] (row, slot_begin, slot_end)
    t_work: Optional[Tensor] = None
    t_merge: Optional[Tensor] = None
    split: int = 0                  # segment length used for super rows (0 = none)
    reason: str = ""


def plan_for(graph: CSRGraph, kind: int, feat: int, heads: int, dtype: torch.dtype) -> Plan:
    """The (cached) plan for this graph and problem shape."""
    key = ("plan", kind, feat, heads, dtype)
    plan = graph.plans.get(key)
    if plan is None:
        plan = Plan(reason="one item per row")
        graph.plans[key] = plan
    return plan
