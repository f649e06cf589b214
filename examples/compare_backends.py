"""Train the same config twice -- fused layers and native PyG -- and compare.

    python examples/compare_backends.py configs/pattern_gat_quick.yaml [key=value ...]

Both runs use the same seed, data and initial weights (the backends only differ
in where GATConv/TransformerConv/AGNNConv come from); results go to
``<out_dir>/fused`` and ``<out_dir>/pyg`` and a side-by-side table is printed.
"""
import sys

from pyg_dfgnn.train import load_config, train


def main(argv):
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    path, overrides = argv[0], argv[1:]
    rows = {}
    for backend in ("pyg", "fused"):
        cfg = load_config(path, list(overrides) + [f"backend={backend}"])
        cfg.out_dir = cfg.resolved_out_dir().rstrip("/") + f"/{backend}"
        rows[backend] = train(cfg)

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    print(f"\n{'':24s}{'pyg':>14s}{'fused':>14s}")
    keys = [("final train loss", lambda r: r["metrics"]["final_train_loss"], ".5f"),
            ("best val " + rows["pyg"]["metrics"]["metric"],
             lambda r: r["metrics"]["best_val_metric"], ".2f"),
            ("test at best val", lambda r: r["metrics"]["test_metric"], ".2f"),
            ("epoch time (median, s)", lambda r: r["timings"]["epoch_s_median"], ".3f"),
            ("peak GPU memory (MiB)",
             lambda r: (r["timings"]["peak_gpu_mem_bytes"] or 0) / 2 ** 20 or None, ".1f")]
    for name, get, spec in keys:
        print(f"{name:24s}{fmt(get(rows['pyg']), spec):>14s}{fmt(get(rows['fused']), spec):>14s}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
