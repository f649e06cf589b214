"""Comparison suite: fused attention layers / ops vs native PyG.

``dfgnn bench [configs/bench_<name>.yaml] [--quick] [--ops] [--out DIR]``
(:func:`pyg_dfgnn.bench.cli.main`).  Modules:

* :mod:`.config`      -- built-in defaults, YAML loading, ``--quick``, the
  shape x dtype case matrix (``--plan``);
* :mod:`.graphs`      -- benchmark graphs from config entries;
* :mod:`.timing`      -- CUDA-event / perf_counter timing, peak memory, OOM;
* :mod:`.runner`      -- reference, correctness gate, timing of one contender;
* :mod:`.layers`      -- conv layers: fused / pyg / pyg_sparse / pyg_compile;
* :mod:`.ops_bench`   -- raw fused ops vs naive gather+softmax+scatter;
* :mod:`.train_bench` -- end-to-end training epochs, backend fused vs pyg;
* :mod:`.report`      -- console table, CSV, JSON, plots, summary.

See ``docs/BENCHMARKS.md`` for the methodology.
"""
