"""The case matrix a benchmark config expands to, and its config errors."""
import collections
import os

import pytest

from pyg_dfgnn.bench import cli
from pyg_dfgnn.bench.config import (BASE, QUICK, deep_merge, expand, load_config,
                                    load_yaml, parse_shape, repo_root, section_plan,
                                    section_shapes)
from pyg_dfgnn.cli import main as dfgnn_main

DEFAULT = os.path.join(repo_root(), "configs", "bench_default.yaml")
QUICK_YAML = os.path.join(repo_root(), "configs", "bench_quick.yaml")
MATRIX_GRAPHS = ("uniform_100k", "powerlaw_100k", "pattern_128")
LAYERS = ("gat", "gatv2", "transformer", "agnn")


def _by_case(entries):
    """(section, graph, shape, dtype, case) -> set of contenders."""
    out = collections.defaultdict(set)
    for e in entries:
        out[(e["section"], e["graph"], e["shape"], e["dtype"], e["case"])].add(e["contender"])
    return out


def test_default_config_expands_to_the_shape_dtype_graph_matrix():
    cfg = load_config(DEFAULT)
    cases = _by_case(expand(cfg))
    # layers: every paper shape and 4x64, fp32 and bf16, on the three graphs
    for g in MATRIX_GRAPHS:
        for shape in ("4x64", "8x10", "8x19"):
            for dt in ("float32", "bfloat16"):
                for layer in LAYERS:
                    conts = cases[("layer", g, shape, dt, layer)]
                    assert {"fused", "pyg"} <= conts, (g, shape, dt, layer)
                    # the expensive contenders only at 4x64 fp32
                    extra = {"pyg_sparse", "pyg_compile"} & conts
                    assert extra == ({"pyg_sparse", "pyg_compile"}
                                     if (shape, dt) == ("4x64", "float32") else set())
    # ops: at least 4x64 and 8x10, fp32 and bf16
    for g in MATRIX_GRAPHS:
        for shape in ("4x64", "8x10"):
            for dt in ("float32", "bfloat16"):
                for op in ("gat", "gatv2", "dot"):
                    assert cases[("op", g, shape, dt, op)] == {"fused", "naive"}
    # the 500k graph stays at 4x64 fp32 (time budget)
    big = {(k[2], k[3]) for k in cases if k[1] == "uniform_500k"}
    assert big == {("4x64", "float32")}
    assert not any(k[0] == "op" and k[1] == "uniform_500k" for k in cases)
    # pyg_compile is still limited to compile.graphs by the compile gate, not the plan
    assert cfg["compile"]["graphs"] == ["uniform_100k"]


def test_quick_config_covers_two_shapes_and_bf16():
    for cfg in (load_config(QUICK_YAML), deep_merge(BASE, QUICK)):
        cases = _by_case(expand(cfg))
        shapes = {k[2] for k in cases if k[0] == "layer"}
        assert {"4x64", "8x10"} <= shapes
        assert {"4x64", "8x10"} <= {k[2] for k in cases if k[0] == "op"}
        assert ("layer", "uniform_1k", "8x10", "bfloat16", "gat") in cases
        assert cfg["device"] == "cpu"
    # the built-in copy matches the file
    a = _by_case(expand(load_config(QUICK_YAML)))
    b = _by_case(expand(deep_merge(BASE, QUICK)))
    assert a == b


def test_plan_order_and_limits():
    cfg = deep_merge(BASE, {
        "dtypes": ["float32", "bfloat16"],
        "layers": {"shapes": [[4, 64], "8x10"], "contenders": ["fused", "pyg", "pyg_sparse"],
                   "only": {"pyg_sparse": {"dtypes": ["float32"], "graphs": ["a"]}}},
    })
    plan = section_plan(cfg, "layers", {"name": "a", "kind": "uniform"})
    assert [(s, dt) for s, dt, _ in plan] == [
        ((4, 64), "float32"), ((4, 64), "bfloat16"), ((8, 10), "float32"), ((8, 10), "bfloat16")]
    assert [c for _, _, c in plan] == [["fused", "pyg", "pyg_sparse"], ["fused", "pyg"],
                                       ["fused", "pyg", "pyg_sparse"], ["fused", "pyg"]]
    plan_b = section_plan(cfg, "layers", {"name": "b", "kind": "uniform"})
    assert all(c == ["fused", "pyg"] for _, _, c in plan_b)
    # a graph's own shapes / dtypes select from the section's
    plan_c = section_plan(cfg, "layers", {"name": "c", "shapes": ["8x10"],
                                          "dtypes": ["bfloat16"]})
    assert [(s, dt) for s, dt, _ in plan_c] == [((8, 10), "bfloat16")]
    # a section's own dtypes replace the top-level ones
    cfg["layers"]["dtypes"] = ["float16"]
    assert {dt for _, dt, _ in section_plan(cfg, "layers", {"name": "a"})} == {"float16"}
    # ops off: no op plan
    assert section_plan(cfg, "ops", {"name": "a"}) == []


def test_one_shape_shorthand_and_defaults():
    assert section_shapes(deep_merge(BASE, {}), "layers") == [(4, 64)]
    assert section_shapes(deep_merge(BASE, {"layers": {"heads": 2}}), "layers") == [(2, 64)]
    assert section_shapes(deep_merge(BASE, {"ops": {"heads": 8, "channels": 19}}),
                          "ops") == [(8, 19)]
    assert parse_shape("8x19", "k") == (8, 19) and parse_shape([4, 64], "k") == (4, 64)
    assert parse_shape(" 8 X 10 ", "k") == (8, 10)


@pytest.mark.parametrize("over, key", [
    ({"layers": {"shapes": [4, 64]}}, "layers.shapes:"),
    ({"layers": {"shapes": [[4, 64], [8, 0]]}}, "layers.shapes[1]:"),
    ({"layers": {"shapes": [["a", 2]]}}, "layers.shapes[0]:"),
    ({"layers": {"shapes": [[4, 64, 1]]}}, "layers.shapes[0]:"),
    ({"layers": {"shapes": [[True, 4]]}}, "layers.shapes[0]:"),
    ({"layers": {"shapes": []}}, "layers.shapes:"),
    ({"layers": {"shapes": "4x64"}}, "layers.shapes:"),
    ({"layers": {"shapes": [[4, 64], "4x64"]}}, "layers.shapes[1]: shape 4x64 is listed twice"),
    ({"layers": {"shapes": [[4, 64]], "heads": 8}}, "layers: give either layers.shapes"),
    ({"ops": {"channels": 0}}, "ops.channels:"),
    ({"ops": {"heads": "4"}}, "ops.heads:"),
    ({"dtypes": ["float32", "bfloat17"]}, "dtypes[1]: unknown floating dtype 'bfloat17'"),
    ({"dtypes": ["int32"]}, "dtypes[0]:"),
    ({"dtypes": "float32"}, "dtypes:"),
    ({"layers": {"dtypes": ["float32", "float32"]}}, "layers.dtypes[1]:"),
    ({"layers": {"only": {"pyg": {"shapes": [[4, 64]]}}}}, "layers.only.pyg: the baseline"),
    ({"ops": {"only": {"naive": {}}}}, "ops.only.naive: the baseline"),
    ({"layers": {"only": {"warp_drive": {}}}}, "layers.only.warp_drive: unknown contender"),
    ({"layers": {"only": {"pyg_sparse": {"shape": [[4, 64]]}}}},
     "layers.only.pyg_sparse.shape: unknown key"),
    ({"layers": {"only": {"pyg_sparse": {"shapes": [[4, -1]]}}}},
     "layers.only.pyg_sparse.shapes[0]:"),
    ({"layers": {"only": {"pyg_compile": {"dtypes": ["fp32"]}}}},
     "layers.only.pyg_compile.dtypes[0]:"),
    ({"layers": {"only": {"pyg_compile": {"graphs": "uniform_1k"}}}},
     "layers.only.pyg_compile.graphs:"),
    ({"layers": {"only": ["pyg_sparse"]}}, "layers.only:"),
    ({"graphs": [{"name": "g", "kind": "uniform", "shapes": [[0, 1]]}]}, "graphs[g].shapes[0]:"),
    ({"graphs": [{"name": "g", "kind": "uniform", "dtypes": ["half-ish"]}]},
     "graphs[g].dtypes[0]:"),
    ({"layers": {"names": ["gat", "gcn"]}}, "layers.names: unknown"),
    ({"ops": {"names": ["softmax"]}}, "ops.names: unknown"),
])
def test_config_errors_name_the_key(over, key):
    with pytest.raises(ValueError) as e:
        expand(deep_merge(BASE, over))
    assert str(e.value).startswith(key), str(e.value)
    assert "\n" not in str(e.value)


def test_cli_config_error_exits_2_naming_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("device: cpu\nlayers: {shapes: [[4, 64], [8, 0]]}\n"
                   "graphs:\n  - {name: u, kind: uniform, num_nodes: 50, num_edges: 200}\n")
    assert dfgnn_main(["bench", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dfgnn bench: layers.shapes[1]:"), err
    assert not (tmp_path / "o").exists()  # nothing ran
    assert dfgnn_main(["bench", "--quick", "--shapes", "4x64,8by10", "--plan"]) == 2
    assert "--shapes" in capsys.readouterr().err


def test_cli_overrides_and_plan(capsys):
    a = cli.parse_args([DEFAULT, "--shapes", "8x19", "--dtypes", "bfloat16"])
    cfg = cli.build_config(a)
    cases = _by_case(expand(cfg))
    assert {(k[2], k[3]) for k in cases} == {("8x19", "bfloat16")}
    assert {k[1] for k in cases} == set(MATRIX_GRAPHS) | {"cora"}  # 500k: fp32 4x64 only
    assert dfgnn_main(["bench", DEFAULT, "--plan"]) == 0
    out = capsys.readouterr().out
    n = len({k for k in _by_case(expand(load_config(DEFAULT)))})
    assert f"total: {n} cases" in out
    assert "8x19   bfloat16  fused, pyg" in out


def test_yaml_files_parse_and_keep_the_shorthand_out():
    for path in (DEFAULT, QUICK_YAML):
        raw = load_yaml(path)
        for key in ("layers", "ops"):
            assert "shapes" in raw[key] and "heads" not in raw[key], (path, key)
