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


@pytest.mark.parametrize("order", ["row", "degree"])
@pytest.mark.parametrize("split", [0, 1, 16, 100, 499, 500])
def test_work_items_cover_each_edge_once(split, order):
    gr = _graph()
    work, merge, slots = schedule.work_items(gr.rowptr, split, order)
    deg = gr.in_degree().long()
    if order == "row" and (split == 0 or int(deg.max()) <= split):
        assert work is None
        return
    assert (work[:slots, 3] >= 0).all() and (work[slots:, 3] == -1).all()  # segments first
    if order == "degree":   # then the rows by descending degree
        lengths = (work[slots:, 2] - work[slots:, 1]).long()
        assert (lengths[1:] <= lengths[:-1]).all()
    else:                   # then the rows in CSR order
        rows = work[slots:, 0].long()
        assert (rows[1:] > rows[:-1]).all()
    seen = torch.zeros(gr.num_edges, dtype=torch.long)
    rows_seen = torch.zeros(gr.num_dst, dtype=torch.long)
    for row, b, e, slot in work.long().tolist():
        assert gr.rowptr[row] <= b <= e <= gr.rowptr[row + 1]
        assert split == 0 or e - b <= split
        seen[b:e] += 1
        rows_seen[row] += 1
        if slot < 0:
            assert split == 0 or deg[row] <= split
    assert (seen == 1).all()
    assert work.size(0) == slots + int((deg <= split).sum() if split else gr.num_dst)
    assert (rows_seen >= 1).all()          # empty rows are items too (their output is zero)
    # merge ranges: contiguous slots of each split row
    assert (int(merge[:, 2].max()) if merge.numel() else 0) == slots
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
    with pytest.raises(ValueError, match="'order'"):
        with schedule.override(order="random"):
            pass
    with pytest.raises(ValueError, match="'order'"):
        schedule.work_items(torch.tensor([0, 1]), 4, "sorted")


def test_automatic_order():
    """Descending degree for a CSR on the GPU with >= ORDER_MIN_EDGES edges, or
    a skewed one (longest row over MIN_SPLIT and SKEW_FACTOR x the mean
    degree); CSR order for small unskewed ones and on the CPU (whose kernels
    take no work list)."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    big = schedule.ORDER_MIN_EDGES
    assert schedule.auto_order(37, big, big // 16, cuda) == "degree"
    assert schedule.auto_order(37, big - 1, big // 16, cuda) == "row"
    assert schedule.auto_order(60000, 1000, 500, cuda) == "degree"       # skewed
    assert schedule.auto_order(256, 1000, 500, cuda) == "row"            # <= MIN_SPLIT
    assert schedule.auto_order(300, 20000, 500, cuda) == "row"           # 300 < 8 x 40
    assert schedule.auto_order(60000, big, 500, cpu) == "row"
    assert schedule.is_skewed(300, 1000, 500) and not schedule.is_skewed(300, 20000, 500)


def test_order_env(monkeypatch):
    """PYG_DFGNN_ORDER forces the automatic order of new plans; a bad value
    is a ValueError naming the variable."""
    gr = _graph(super_deg=500)
    monkeypatch.setenv("PYG_DFGNN_ORDER", "degree")
    with schedule.override(split=4096):
        assert schedule.plan_for(gr, 2, 64, 4, torch.float32).work.size(0) == gr.num_dst
    monkeypatch.setenv("PYG_DFGNN_ORDER", "sorted")
    with pytest.raises(ValueError, match="PYG_DFGNN_ORDER"):
        schedule.plan_for(gr, 2, 32, 4, torch.float32)


def test_degree_ordered_plan():
    """A forced degree order on a graph without super rows: a work list of
    every row, longest first, and no merge; the CSR order gives none."""
    gr = _graph(super_deg=500)
    with schedule.override(split=4096, order="degree"):
        p = schedule.plan_for(gr, 2, 64, 4, torch.float32)
    assert p.slots == 0 and p.merge.numel() == 0 and p.work.size(0) == gr.num_dst
    lengths = (p.work[:, 2] - p.work[:, 1]).long()
    assert int(lengths[0]) == gr.max_in_degree and (lengths[1:] <= lengths[:-1]).all()
    assert "work items by degree (rows) / degree (columns) (forced)" in p.reason
    with schedule.override(split=4096, order="row"):
        assert schedule.plan_for(gr, 2, 64, 4, torch.float32).work is None
    with schedule.override(split=4096):       # automatic: the CPU keeps CSR order
        assert schedule.plan_for(gr, 2, 64, 4, torch.float32).work is None


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
    assert schedule.auto_group(10, torch.bfloat16) == 2     # padded to 12 = 3 x 4 bf16: 2 lanes x 2
    assert schedule.auto_group(10, torch.bfloat16, kind=0) == 4   # GAT: 5 bf16x2 -> 4 lanes, no copy
    # wide tiles of dot-like kinds where they take fewer lanes: one head in (128, 192] fp32 /
    # (128, 256] bf16 on 16 lanes, and narrower heads
    assert schedule.auto_group(19, torch.float32, kind=2) == 2     # 20 = 5 float4 -> 2 lanes x 3
    assert schedule.auto_group(80, torch.float32, kind=3) == 8     # 20 float4 -> 8 lanes x 3
    assert schedule.auto_group(64, torch.float32, kind=2) == 8     # 16 float4: 8 lanes either way
    assert schedule.auto_group(64, torch.bfloat16, kind=2) == 4    # 8 x 8 bf16 -> 4 lanes x 2
    # ... and on 8-byte vectors (three per lane): 10 fp32 = 5 float2, 19 bf16 padded to 20 =
    # 5 x 4 bf16, 10 bf16 padded to 12
    assert schedule.auto_group(10, torch.float32, kind=2) == 1     # 5 float2 -> 1 lane x 5
    assert schedule.auto_group(10, torch.float32, kind=1) == 1     # GATv2 too
    assert schedule.auto_group(18, torch.float32, kind=2) == 2     # 9 float2 -> 2 lanes x 5
    assert schedule.auto_group(6, torch.float32, kind=2) == 1      # (1 lane x 3 already)
    assert schedule.auto_group(19, torch.bfloat16, kind=2) == 2    # 4 lanes x 2 -> 2 x 3
    assert schedule.auto_group(19, torch.float16, kind=3) == 2
    assert schedule.auto_group(10, torch.bfloat16, kind=2) == 1    # 2 lanes x 2 -> 1 x 3
    assert schedule.auto_group(10, torch.bfloat16, kind=1) == 1    # GATv2 too
    assert schedule.auto_group(19, torch.float32, kind=1) == 2
    assert schedule.auto_group(36, torch.bfloat16, kind=2) == 4    # 9 x 4 bf16: 8 lanes x 2 -> 4 x 3
    assert schedule.auto_group(152, torch.float32, kind=3) == 16   # 38 float4 -> 16 lanes x 3
    assert schedule.auto_group(192, torch.float32, kind=2) == 16
    assert schedule.auto_group(196, torch.float32, kind=2) == 32   # past the wide tile
    assert schedule.auto_group(196, torch.float32, kind=3) == 16   # (AGNN's forward: 4 float4)
    assert schedule.auto_group(152, torch.float32, kind=1) == 16   # GATv2 too
    assert schedule.auto_group(152, torch.float32, kind=0) == 32   # GAT: default tiles
    # AGNN's forward takes three 16-byte chunks (fp16 / bf16) or four float4 where the wide
    # tile takes 16 lanes or more
    assert schedule.auto_group(152, torch.bfloat16, kind=3) == 8   # 19 x 8 bf16 -> 8 lanes x 3
    assert schedule.auto_group(152, torch.bfloat16, kind=2) == 16  # (dot: 16 lanes x 2)
    assert schedule.auto_group(80, torch.float16, kind=3) == 8     # (only from 16 lanes: 8 x 2)
    assert schedule.auto_group(136, torch.float16, kind=3) == 8    # 17 x 8 -> 8 lanes x 3
    assert schedule.auto_group(256, torch.bfloat16, kind=3) == 16
    assert schedule.auto_group(256, torch.float32, kind=3) == 16   # 64 float4 -> 16 lanes x 4
    assert schedule.auto_group(256, torch.float32, kind=2) == 32
    assert schedule.auto_group(192, torch.float32, kind=3) == 16   # 16 lanes x 3 either way
    assert schedule.auto_group(128, torch.float32, kind=2) == 16   # default tile, 16 lanes x 2
    assert schedule.auto_group(128, torch.float32, kind=3) == 8    # AGNN's forward: 8 lanes x 4
    s = schedule.auto_split(1_400_000, 4, 8, torch.device("cpu"))
    assert schedule.MIN_SPLIT <= s <= schedule.MAX_SPLIT and s & (s - 1) == 0


def test_backward_path_names_the_alpha_mode():
    """explain_schedule's backward line: dot attention's stored mode keeps fp32
    alpha alone at fp32 / fp16 heads under 128 bytes (cuda/attention_launch.cuh:
    kColAlpha), g and alpha~ elsewhere (bf16: one array of bf16 pairs); the
    line names PYG_DFGNN_ALPHA_MODE=1's leaner mode where it applies."""
    from pyg_dfgnn.ops.reference import DOT, GAT, GATV2
    from pyg_dfgnn.schedule import backward_path
    assert "fp32 alpha per edge (E x H x 4" in backward_path(DOT, 8, 10, torch.float32)
    assert "fp32 alpha per edge (E x H x 4" in backward_path(DOT, 8, 19, torch.float16)
    for args in ((DOT, 4, 64, torch.float32), (GATV2, 8, 10, torch.float32), (DOT, 8),
                 (GAT, 40, 10, torch.float32)):
        assert "fp32 g and alpha~ per edge (E x H x 8 bytes)" in backward_path(*args), args
    for args in ((DOT, 8, 10, torch.bfloat16), (GATV2, 8, 20, torch.bfloat16)):
        assert "bf16 g and alpha~ per edge (E x H x 4 bytes)" in backward_path(*args), args
    assert "PYG_DFGNN_ALPHA_MODE=1" in backward_path(GATV2, 8, 10, torch.bfloat16)
    assert "PYG_DFGNN_ALPHA_MODE" not in backward_path(GAT, 8, 10, torch.float32)
    assert "outweigh twice the source rows" in backward_path(GATV2, 8, 10, torch.bfloat16)
