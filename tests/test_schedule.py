"""Schedule planning: work items cover every edge once; explain/override."""
import pytest
import torch

from pyg_dfgnn import schedule
from pyg_dfgnn.graph import build_graph


def _graph(super_deg=500):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, 300, (2000 + super_deg,), generator=g)
    dst = torch.cat([torch.randint(0, 300, (2000,), generator=g), torch.full((super_deg,), 7)])
    return build_graph(torch.stack([src, dst]), (300, 300))


@pytest.mark.parametrize("split", [1, 16, 100, 499, 500])
def test_work_items_cover_each_edge_once(split):
    gr = _graph()
    work, merge, slots = schedule.work_items(gr.rowptr, split)
    deg = gr.in_degree().long()
    if int(deg.max()) <= split:
        assert work is None
        return
    seen = torch.zeros(gr.num_edges, dtype=torch.long)
    rows_seen = torch.zeros(gr.num_dst, dtype=torch.long)
    for row, b, e, slot in work.long().tolist():
        assert gr.rowptr[row] <= b <= e <= gr.rowptr[row + 1]
        assert (e - b <= split)
        seen[b:e] += 1
        rows_seen[row] += 1
        if slot < 0:
            assert deg[row] <= split
    assert (seen == 1).all()
    assert (rows_seen >= 1).all()          # empty rows are items too (their output is zero)
    # merge ranges: contiguous slots of each split row
    assert int(merge[:, 2].max()) == slots
    for row, s0, s1 in merge.long().tolist():
        assert deg[row] > split and s1 - s0 == -(-int(deg[row]) // split)


def test_plan_is_cached_and_explained():
    gr = _graph()
    p1 = schedule.plan_for(gr, 0, 64, 4, torch.float32)
    assert schedule.plan_for(gr, 0, 64, 4, torch.float32) is p1
    with schedule.override(split=64, group=8):
        p2 = schedule.plan_for(gr, 0, 64, 4, torch.float32)
        assert p2.split == 64 and p2.group == 8 and p2.work is not None
    text = schedule.explain_schedule(gr, 0, 64, 4)
    assert "schedule:" in text and "max in-degree" in text
    # the CUDA backward's passes: GAT's single gather up to 32 heads
    assert "one feature gather per edge" in text and "E x H x 4" in text
    assert "row pass + column pass" in schedule.explain_schedule(gr, 0, 64, 33)
    assert "row pass + column pass" in schedule.explain_schedule(gr, 2, 64, 4)
    with schedule.override(split=0):
        assert schedule.plan_for(gr, 0, 64, 4, torch.float32).work is None


def test_override_validates():
    with pytest.raises(ValueError, match="group"):
        with schedule.override(group=3):
            pass


def test_auto_group_and_split():
    assert schedule.auto_group(64, torch.float32) == 8
    # narrow heads: F = 3 pads to 4 (one float4), one lane; GAT (kind 0) keeps 4
    assert schedule.auto_group(3, torch.float32) == 1
    assert schedule.auto_group(3, torch.float32, kind=0) == 4
    assert schedule.auto_group(10, torch.float32) == 4      # 10 = 5 float2 -> 4 lanes x 2 (no copy)
    assert schedule.auto_group(12, torch.float32) == 2      # 12 = 3 float4 -> 2 lanes x 2
    assert schedule.auto_group(19, torch.float32) == 4      # 20 = 5 float4 -> 3 -> 4 lanes
    assert schedule.auto_group(256, torch.bfloat16) == 32
    assert schedule.auto_group(64, torch.bfloat16) == 8
    s = schedule.auto_split(1_400_000, 4, 8, torch.device("cpu"))
    assert schedule.MIN_SPLIT <= s <= schedule.MAX_SPLIT and s & (s - 1) == 0
