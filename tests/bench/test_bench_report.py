"""Report columns and the per (shape, dtype) aggregates, on hand-made rows."""
import csv
import json
import re

import pytest

from pyg_dfgnn.bench import report


def _row(graph, case, shape, dtype, contender, fwd, fwdbwd, status="ok"):
    return {"section": "layer", "graph": graph, "case": case, "shape": shape, "dtype": dtype,
            "contender": contender, "baseline": "pyg", "status": status,
            "fwd_ms": fwd if status == "ok" else None,
            "fwdbwd_ms": fwdbwd if status == "ok" else None}


def _rows():
    rows = []
    # fused f+b 2, 3 / bf16 1, 3 ; pyg f+b 8 (fp32) and 9 (bf16); fwd: pyg 4, fused 1 or 2
    for g, t32, t16 in (("g1", 2.0, 1.0), ("g2", 3.0, 3.0)):
        for dt, t in (("float32", t32), ("bfloat16", t16)):
            rows.append(_row(g, "gat", "8x19", dt, "pyg", 4.0, 8.0 if dt == "float32" else 9.0))
            rows.append(_row(g, "gat", "8x19", dt, "fused", 1.0 if g == "g1" else 2.0, t))
    # another shape: one failed fused case, one ok
    rows.append(_row("g1", "gat", "4x64", "float32", "pyg", 4.0, 8.0))
    rows.append(_row("g1", "gat", "4x64", "float32", "fused", 2.0, 4.0))
    rows.append(_row("g2", "gat", "4x64", "float32", "pyg", 4.0, 8.0))
    rows.append(_row("g2", "gat", "4x64", "float32", "fused", 0, 0, status="mismatch"))
    return rows


def test_speedups_are_per_shape_and_dtype():
    rows = _rows()
    report.add_speedups(rows)
    by = {(r["graph"], r["shape"], r["dtype"], r["contender"]): r for r in rows}
    assert by[("g1", "8x19", "float32", "fused")]["speedup_fwdbwd"] == 4.0   # 8 / 2
    assert by[("g1", "8x19", "bfloat16", "fused")]["speedup_fwdbwd"] == 9.0  # 9 / 1
    assert by[("g1", "4x64", "float32", "fused")]["speedup_fwdbwd"] == 2.0   # 8 / 4


def test_shape_dtype_summary_medians():
    rows = _rows()
    report.add_speedups(rows)
    agg = {(a["shape"], a["dtype"]): a for a in report.shape_dtype_summary(rows)}
    a = agg[("8x19", "float32")]
    assert (a["cases"], a["ok"], a["failed"]) == (2, 2, 0)
    assert a["median_speedup_fwd"] == pytest.approx((4.0 + 2.0) / 2)
    assert a["median_speedup_fwdbwd"] == pytest.approx((8 / 2 + 8 / 3) / 2)
    assert a["min_speedup_fwdbwd"] == pytest.approx(8 / 3) and a["min_at"] == "g2 gat"
    b = agg[("8x19", "bfloat16")]
    assert b["median_speedup_fwdbwd"] == pytest.approx((9.0 + 3.0) / 2)
    c = agg[("4x64", "float32")]
    assert (c["cases"], c["ok"], c["failed"]) == (2, 1, 1)  # the mismatch is counted
    assert c["median_speedup_fwdbwd"] == 2.0


def test_dtype_ratios_and_target():
    rows = _rows()
    ratios = report.dtype_ratios(rows)
    assert len(ratios) == 1  # only 8x19 has both dtypes
    x = ratios[0]
    assert (x["case"], x["shape"], x["dtype"], x["ref_dtype"]) == (
        "gat", "8x19", "bfloat16", "float32")
    assert x["per_graph"] == {"g1": 0.5, "g2": 1.0}
    assert x["median"] == 0.75 and x["max"] == 1.0 and x["met"] is False
    rows[-5]["fwdbwd_ms"] = 1.5  # g2 bf16 fused: 1.5 / 3 = 0.5 <= 0.7
    x = report.dtype_ratios(rows)[0]
    assert x["per_graph"]["g2"] == 0.5 and x["met"] is True


def test_report_files_have_shape_and_dtype_columns(tmp_path):
    rows = _rows()
    paths = report.write_all(rows, {"device": "cpu"}, {}, str(tmp_path), plots=False)
    with open(paths["csv"]) as f:
        header = next(csv.reader(f))
    assert header.index("case") < header.index("shape") < header.index("dtype")
    table = (tmp_path / "table.txt").read_text().splitlines()
    assert table[1].split()[:5] == ["graph", "case", "shape", "dtype", "contender"]
    assert table[3].split()[:5] == ["g1", "gat", "8x19", "float32", "pyg"]
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert summary[1].split()[:5] == ["section", "graph", "case", "shape", "dtype"]
    # one summary line per (section, shape, dtype) ...
    med = [ln.split() for ln in summary if ln.split()[:1] == ["layer"]
           and len(ln.split()) > 3 and re.fullmatch(r"\d+/\d+", ln.split()[3])]
    assert [m[:4] for m in med] == [["layer", "8x19", "float32", "2/2"],
                                    ["layer", "8x19", "bfloat16", "2/2"],
                                    ["layer", "4x64", "float32", "1/2"]]
    assert med[0][4:6] == ["3.00", "3.33"]  # median x fwd, x f+b
    # ... and the bf16 / fp32 ratio per layer and shape, per graph, with the target
    ratio = [ln.split() for ln in summary if "bf16/fp32" in ln]
    assert ratio == [["layer", "gat", "8x19", "bf16/fp32", "0.50", "1.00", "0.75", "1.00",
                      "no"]]
    md = (tmp_path / "summary.md").read_text()
    assert "| layer | gat | 8x19 | bf16/fp32 | 0.50 | 1.00 | 0.75 | 1.00 | no |" in md
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["summary"]["dtype_ratio_target"] == 0.7
    assert data["summary"]["dtype_ratios"][0]["per_graph"] == {"g1": 0.5, "g2": 1.0}
    assert [(a["shape"], a["dtype"]) for a in data["summary"]["by_shape_dtype"]] == [
        ("8x19", "float32"), ("8x19", "bfloat16"), ("4x64", "float32")]


def test_plots_one_row_per_shape_and_dtype(tmp_path):
    pytest.importorskip("matplotlib")
    rows = _rows()
    report.add_speedups(rows)
    cases, variants, graphs = report._grid(rows)
    assert cases == ["gat"]
    assert variants == [("8x19", "float32"), ("8x19", "bfloat16"), ("4x64", "float32")]
    assert graphs[("4x64", "float32")] == ["g1", "g2"]
    paths = report.plot_all(rows, {"device": "cpu"}, str(tmp_path))
    with open(paths["speedup_layer"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_issue_targets_count_cells(tmp_path):
    """Issue 11's per-cell targets: forward 12x / forward+backward 7x at 4x64
    fp32, 10x / 6x at the other targeted shapes, PyG's peak memory >= 12x
    ours; only the targeted shapes and graphs count, and a fused case that did
    not run counts as not met."""
    def row(graph, shape, dtype, contender, fwd, fb, mb, status="ok"):
        r = _row(graph, "gat", shape, dtype, contender, fwd, fb, status)
        r["fwdbwd_peak_mb"] = mb if status == "ok" else None
        return r
    rows = [
        # 4x64 fp32: forward 12.0x (met), f+b 6.9x (below 7), memory 12.5x (met)
        row("uniform_100k", "4x64", "float32", "pyg", 12.0, 69.0, 125.0),
        row("uniform_100k", "4x64", "float32", "fused", 1.0, 10.0, 10.0),
        # 8x10 bf16: forward 9.9x (below 10), f+b 6.0x (met), memory 11.9x (below)
        row("pattern_128", "8x10", "bfloat16", "pyg", 9.9, 60.0, 119.0),
        row("pattern_128", "8x10", "bfloat16", "fused", 1.0, 10.0, 10.0),
        # a fused case that did not run
        row("powerlaw_100k", "8x10", "bfloat16", "pyg", 10.0, 60.0, 120.0),
        row("powerlaw_100k", "8x10", "bfloat16", "fused", 0, 0, 0, status="oom"),
        # not counted: another graph, an untargeted shape and dtype
        row("cora", "8x10", "bfloat16", "pyg", 100.0, 100.0, 100.0),
        row("cora", "8x10", "bfloat16", "fused", 1.0, 1.0, 1.0),
        row("uniform_100k", "2x128", "float32", "pyg", 100.0, 100.0, 100.0),
        row("uniform_100k", "2x128", "float32", "fused", 1.0, 1.0, 1.0),
        row("uniform_100k", "8x10", "float16", "pyg", 100.0, 100.0, 100.0),
        row("uniform_100k", "8x10", "float16", "fused", 1.0, 1.0, 1.0),
    ]
    report.add_speedups(rows)
    t = report.issue_targets(rows)
    assert t["count"] == 3 and t["met"] == {"fwd": 1, "fwdbwd": 1, "memory": 1}
    by = {(c["graph"], c["shape"]): c for c in t["cells"]}
    c = by[("uniform_100k", "4x64")]
    assert c["target"] == {"fwd": 12.0, "fwdbwd": 7.0, "memory": 12.0}
    assert c["met"] == {"fwd": True, "fwdbwd": False, "memory": True}
    assert c["x"]["memory"] == pytest.approx(12.5)
    assert by[("pattern_128", "8x10")]["met"] == {"fwd": False, "fwdbwd": True, "memory": False}
    assert by[("powerlaw_100k", "8x10")]["met"] == {"fwd": False, "fwdbwd": False,
                                                   "memory": False}
    report.write_all(rows, {"device": "cpu"}, {}, str(tmp_path), plots=False)
    summary = (tmp_path / "summary.txt").read_text()
    assert "met: forward 1/3, forward+backward 1/3, memory 1/3" in summary
    lines = [ln.split() for ln in summary.splitlines() if ln.split()[:3] == ["gat", "4x64", "fp32"]]
    assert lines == [["gat", "4x64", "fp32", "12.0", "/", "6.9*", "/", "12.5", "-", "-"]]
    md = (tmp_path / "summary.md").read_text()
    assert "| gat | 4x64 | fp32 | 12.0 / 6.9\\* / 12.5 | - | - |" in md
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["summary"]["issue_targets"]["met"] == {"fwd": 1, "fwdbwd": 1, "memory": 1}


def test_environment_records_the_package_switches(monkeypatch):
    """The run's PYG_DFGNN_* settings (what the fused contender ran, e.g.
    PYG_DFGNN_FACTORIZE=off for an A/B) are part of the recorded environment,
    and nothing else of the process environment is."""
    monkeypatch.setenv("PYG_DFGNN_FACTORIZE", "off")
    monkeypatch.setenv("PYG_DFGNN_BACKWARD", "recompute")
    monkeypatch.setenv("NOT_PYG_DFGNN_X", "1")
    env = report.environment("cpu")
    assert env["pyg_dfgnn_env"]["PYG_DFGNN_FACTORIZE"] == "off"
    assert env["pyg_dfgnn_env"]["PYG_DFGNN_BACKWARD"] == "recompute"
    assert all(k.startswith("PYG_DFGNN_") for k in env["pyg_dfgnn_env"])
    assert "PYG_DFGNN_FACTORIZE=off" in report._env_line(env)   # (the summary's first line)
