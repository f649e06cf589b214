"""`dfgnn bench --quick` end to end on the CPU, plus the CLI's other modes."""
import csv
import json
import os

import pytest

from pyg_dfgnn.cli import main as dfgnn_main

LAYERS = ("gat", "gatv2", "transformer", "agnn")
GRAPHS = ("uniform_1k", "powerlaw_1k", "pattern_4")
#: (graph, shape, dtype) the quick suite runs its layers at (configs/bench_quick.yaml)
LAYER_MATRIX = [("uniform_1k", s, d) for s in ("4x64", "8x10") for d in ("float32", "bfloat16")] \
    + [("powerlaw_1k", s, "float32") for s in ("4x64", "8x10")] + [("pattern_4", "8x10", "float32")]
TOL = {"float32": 1e-4, "bfloat16": 5e-2}


def _torch_sparse_usable():
    try:
        import torch_sparse  # noqa: F401
        import torch_geometric.typing as t
        return bool(t.WITH_TORCH_SPARSE)
    except Exception:
        return False


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_quick")
    import contextlib
    import io

    import torch
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            rc = dfgnn_main(["bench", "--quick", "--out", str(out)])
    finally:
        torch.set_num_threads(old)
    with open(out / "results.json") as f:
        data = json.load(f)
    return rc, out, data, stdout.getvalue()


def _rows(data, **kw):
    return [r for r in data["results"] if all(r.get(k) == v for k, v in kw.items())]


def test_quick_run_writes_every_report(quick_run, capsys):
    rc, out, data, stdout = quick_run
    assert rc == 0
    cuda = data["environment"]["device"].startswith("cuda")
    pngs = ["speedup_layer.png", "speedup_op.png", "speedup_train.png"]
    memory = ["memory_layer.png", "memory_op.png", "memory_train.png"]
    rows = data["results"]
    measured = {r["section"] for r in rows if r.get("fwdbwd_peak_mb") is not None}
    for name in ["results.csv", "results.json", "table.txt", "summary.txt", "summary.md"] + pngs + (
            memory if cuda else []):
        p = out / name
        assert p.is_file() and p.stat().st_size > 0, name
    with open(out / "speedup_layer.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # the closing line names exactly the files written
    wrote = [ln for ln in stdout.splitlines() if ln.startswith("wrote ")][-1]
    for name in pngs:
        assert name in wrote
    # a memory plot exactly for the sections whose peak memory was measured (CUDA:
    # all; CPU: layers and ops, from the profiler's allocation events), never empty
    assert rows, "results.json has no rows"
    for section in ("layer", "op", "train"):
        name = f"memory_{section}.png"
        assert (out / name).exists() == (section in measured), name
        assert (name in wrote) == (section in measured), name
    if not cuda and len(measured) < 3:
        assert "no peak memory was measured" in stdout
    env = data["environment"]
    for k in ("gpu", "driver", "torch", "torch_geometric", "cuda_runtime", "python"):
        assert k in env
    assert env["device"] == "cpu"
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(data["results"])
    assert {"fwd_ms", "fwd_ms_q25", "fwd_ms_q75", "fwdbwd_ms", "speedup_fwd",
            "fwdbwd_peak_mb", "status", "max_err", "shape", "dtype"} <= set(rows[0])
    assert {(r["shape"], r["dtype"]) for r in rows if r["section"] == "layer"} == {
        ("4x64", "float32"), ("4x64", "bfloat16"), ("8x10", "float32"), ("8x10", "bfloat16")}
    table = (out / "table.txt").read_text()
    assert "conv layers" in table and "raw attention ops" in table
    head = table.splitlines()[1].split()
    assert head[:5] == ["graph", "case", "shape", "dtype", "contender"]
    assert any(ln.split()[:4] == ["uniform_1k", "gat", "8x10", "bfloat16"]
               for ln in table.splitlines())


def test_quick_run_layers(quick_run):
    _, _, data, _ = quick_run
    matrix = {(r["graph"], r["shape"], r["dtype"]) for r in _rows(data, section="layer")}
    assert matrix == set(LAYER_MATRIX)
    for g, shape, dt in LAYER_MATRIX:
        for layer in LAYERS:
            by = {r["contender"]: r for r in _rows(data, section="layer", graph=g, case=layer,
                                                   shape=shape, dtype=dt)}
            expensive = (shape, dt) == ("4x64", "float32")  # layers.only
            assert set(by) == ({"fused", "pyg", "pyg_sparse", "pyg_compile"} if expensive
                               else {"fused", "pyg"}), (g, shape, dt, layer)
            for c in ("fused", "pyg"):
                r = by[c]
                assert r["status"] == "ok", (g, layer, c, r["status"], r["note"])
                # bf16: against the fp64 evaluation of the same bf16 inputs and weights
                assert r["check"] == "fp64", r
                assert 0 < r["fwd_ms_min"] <= r["fwd_ms"] <= r["fwd_ms_max"]
                assert 0 < r["fwdbwd_ms"]
            base_err = by["pyg"]["max_err"]
            if dt == "float32":
                assert by["fused"]["max_err"] < TOL[dt] and base_err < TOL[dt]
            else:
                # the parameter gradients go through bf16 nn.Linear backward, the same
                # for both: PyG's own error there (e.g. GATv2's lin_r) is the yardstick
                assert base_err < 0.5, by["pyg"]
                assert by["fused"]["max_err"] <= max(TOL[dt], 2 * base_err), by["fused"]
            h, f = (int(v) for v in shape.split("x"))
            if layer == "agnn":  # single head of heads * channels features
                assert (by["fused"]["heads"], by["fused"]["channels"]) == (1, h * f)
            else:
                assert (by["fused"]["heads"], by["fused"]["channels"]) == (h, f)
            assert by["pyg"]["speedup_fwd"] == 1.0
            assert by["fused"]["speedup_fwdbwd"] > 0
            if not expensive:
                continue
            if _torch_sparse_usable():
                assert by["pyg_sparse"]["status"] == "ok"
            else:
                assert by["pyg_sparse"]["status"] == "n/a: torch_sparse missing"
            assert by["pyg_compile"]["status"].startswith("skipped:")


def test_quick_run_ops_and_train(quick_run):
    _, _, data, _ = quick_run
    ops = {(r["graph"], r["shape"], r["dtype"]) for r in _rows(data, section="op")}
    assert ops == {("uniform_1k", s, d) for s in ("4x64", "8x10")
                   for d in ("float32", "bfloat16")} | {("powerlaw_1k", s, "float32")
                                                        for s in ("4x64", "8x10")}
    for g, shape, dt in ops:
        for op in ("gat", "gatv2", "dot"):
            by = {r["contender"]: r for r in _rows(data, section="op", graph=g, case=op,
                                                   shape=shape, dtype=dt)}
            assert set(by) == {"fused", "naive"}
            assert by["fused"]["status"] == "ok" and by["naive"]["status"] == "ok"
            assert by["fused"]["max_err"] < TOL[dt]
    assert not _rows(data, section="op", graph="pattern_4")  # ops.graphs restricts
    train = _rows(data, section="train")
    assert {r["contender"] for r in train} == {"fused", "pyg"}
    for r in train:  # the training stack belongs to another module: never a crash
        assert r["status"], r


def test_summary_is_printed_last(quick_run, capsys):
    _, out, _, _ = quick_run
    assert dfgnn_main(["bench", "--summary", str(out)]) == 0
    text = capsys.readouterr().out
    assert "base f+b ms" in text and "uniform_1k" in text
    # one line per (section, shape, dtype) with the median fused speedups ...
    assert "median x fwd" in text and "median x f+b" in text
    lines = text.splitlines()
    for section, shape, dt in (("layer", "4x64", "float32"), ("layer", "8x10", "bfloat16"),
                               ("op", "8x10", "float32")):
        n = sum(ln.split()[:3] == [section, shape, dt] for ln in lines)
        assert n == 1, (section, shape, dt)
    # ... and the bf16 / fp32 ratio of the fused forward+backward per layer and shape
    assert "low precision / fp32" in text and "<= 0.7" in text
    for layer in LAYERS:
        for shape in ("4x64", "8x10"):
            assert any(ln.split()[:4] == ["layer", layer, shape, "bf16/fp32"]
                       for ln in lines), (layer, shape)
    md = (out / "summary.md").read_text()
    assert "| section | shape | dtype |" in md and "| layer | gat | 8x10 | bf16/fp32 |" in md
    data = json.loads((out / "results.json").read_text())
    agg = {(a["section"], a["shape"], a["dtype"]): a for a in data["summary"]["by_shape_dtype"]}
    a = agg[("layer", "8x10", "bfloat16")]
    assert a["cases"] == 4 and a["ok"] == 4 and a["median_speedup_fwdbwd"] > 0
    ratios = [x for x in data["summary"]["dtype_ratios"] if x["section"] == "layer"]
    want = {(ly, s) for ly in LAYERS for s in ("4x64", "8x10")}
    assert {(x["case"], x["shape"]) for x in ratios} == want
    assert all(set(x["per_graph"]) == {"uniform_1k"} and x["met"] in (True, False)
               for x in ratios)


def test_ops_mode(tmp_path):
    out = tmp_path / "ops"
    rc = dfgnn_main(["bench", "--quick", "--ops", "--graphs", "uniform_1k", "--no-plots",
                     "--shapes", "8x10", "--dtypes", "float32,bfloat16", "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "results.json").read_text())
    assert {r["section"] for r in data["results"]} == {"op"}
    assert len(data["results"]) == 3 * 2 * 2  # ops x dtypes x contenders
    want = {("8x10", "float32"), ("8x10", "bfloat16")}
    assert {(r["shape"], r["dtype"]) for r in data["results"]} == want
    assert not any(p.endswith(".png") for p in os.listdir(out))


def test_bad_arguments(tmp_path):
    assert dfgnn_main(["bench", "no_such_config.yaml", "--out", str(tmp_path)]) == 2
    with pytest.raises(SystemExit):
        dfgnn_main(["bench", "--quick", "--graphs", "nope", "--out", str(tmp_path)])
    bad = tmp_path / "bad.yaml"
    bad.write_text("layers: {contenders: [fused, warp_drive]}\ngraphs:\n"
                   "  - {name: u, kind: uniform, num_nodes: 50, num_edges: 200}\n"
                   "device: cpu\nplots: false\n")
    assert dfgnn_main(["bench", str(bad), "--out", str(tmp_path / "o")]) == 2


def test_unavailable_graph_is_skipped(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "device: cpu\nplots: false\ntiming: {warmup: 0, repeats: 1}\n"
        "layers: {names: [agnn], channels: 8, contenders: [pyg]}\n"
        "graphs:\n"
        f"  - {{name: nothing, kind: pyg, dataset: Planetoid, dataset_name: Cora, "
        f"root: {tmp_path / 'empty'}}}\n"
        "  - {name: tiny, kind: uniform, num_nodes: 50, num_edges: 200}\n")
    assert dfgnn_main(["bench", str(cfg), "--out", str(tmp_path / "o")]) == 0
    data = json.loads((tmp_path / "o" / "results.json").read_text())
    st = {r["graph"]: r["status"] for r in data["results"]}
    assert st["nothing"].startswith("skipped: no data under")
    assert st["tiny"] == "ok"


def test_pyg_dataset_graph(planetoid_root):
    from pyg_dfgnn.bench.graphs import load_graph
    g = load_graph({"name": "cora", "kind": "pyg", "dataset": "Planetoid",
                    "dataset_name": "Cora", "root": ["/nonexistent", planetoid_root]})
    assert g.num_nodes == 2708 and g.num_edges == 10556


def test_time_budget_skips_the_rest(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "device: cpu\nplots: false\ntime_budget_s: 1.0e-9\n"
        "layers: {names: [gat, agnn], heads: 1, channels: 4, in_channels: 4,"
        " contenders: [fused, pyg]}\n"
        "ops: {enabled: true, names: [dot], heads: 1, channels: 4}\n"
        "train: {enabled: true, runs: [{label: r, data: {name: PATTERN}}]}\n"
        "graphs:\n  - {name: tiny, kind: uniform, num_nodes: 30, num_edges: 90}\n")
    assert dfgnn_main(["bench", str(cfg), "--out", str(tmp_path / "o")]) == 0
    data = json.loads((tmp_path / "o" / "results.json").read_text())
    assert len(data["results"]) == 2 * 2 + 2 + 2
    assert all(r["status"].startswith("skipped: time budget") for r in data["results"])


def test_without_matplotlib_no_plot_is_claimed(tmp_path, monkeypatch, capsys):
    from pyg_dfgnn.bench import report
    monkeypatch.setattr(report, "matplotlib_available", lambda: False)
    out = tmp_path / "noplt"
    rc = dfgnn_main(["bench", "--quick", "--ops", "--graphs", "uniform_1k", "--layers", "gat",
                     "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert not any(p.endswith(".png") for p in os.listdir(out))
    wrote = [ln for ln in text.splitlines() if ln.startswith("wrote ")][-1]
    assert ".png" not in wrote and "results.json" in wrote
    assert 'pip install "pyg_dfgnn[bench]"' in text


def test_plain_bench_without_gpu_runs_the_quick_suite(monkeypatch):
    import torch

    from pyg_dfgnn.bench import cli
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    a = cli.parse_args([])
    note = cli._default_config_note(a)
    assert a.quick and "quick CPU suite" in note and "bench_default.yaml" in note
    assert cli.build_config(a)["name"] == "quick"
    for argv in (["--quick"], ["configs/bench_default.yaml"], ["--device", "cuda"]):
        a = cli.parse_args(argv)
        assert cli._default_config_note(a) is None, argv
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    a = cli.parse_args([])
    assert cli._default_config_note(a) is None and not a.quick


def test_ctrl_c_is_a_clean_exit(tmp_path, monkeypatch, capsys):
    from pyg_dfgnn.bench import cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "run", interrupted)
    assert dfgnn_main(["bench", "--quick", "--out", str(tmp_path / "x")]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err
