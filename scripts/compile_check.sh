#!/usr/bin/env bash
# Compile every cuda/*.cu (and the op registration .cpp) to an object file
# against the installed torch headers, for sm_90; nothing is run.  A CPU-only
# torch wheel lacks one generated CUDA header, which a stand-in provides.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1; then
  echo "compile check: nvcc not found - SKIPPED (install the CUDA toolkit to run it)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/inc/c10/cuda/impl"
inc=$(python -c "import torch.utils.cpp_extension as c; print(' '.join('-I'+p for p in c.include_paths()))")
hdr=$(python -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'include/c10/cuda/impl/cuda_cmake_macros.h'))")
if [ ! -f "$hdr" ]; then
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$tmp/inc/c10/cuda/impl/cuda_cmake_macros.h"
fi
cuda_inc=""
for d in "${CUDA_HOME:-}" /usr/local/cuda /usr/local/cuda-*; do
  if [ -n "$d" ] && [ -f "$d/include/cuda_runtime.h" ]; then cuda_inc="$d/include"; break; fi
done
std=$(python -c "import torch; v=tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]); print('c++20' if v >= (2, 12) else 'c++17')")
pids=()
for f in cuda/*.cu; do
  nvcc -c -arch=sm_90 -std=$std -O3 --expt-relaxed-constexpr -diag-suppress 3306 -w \
    -I"$tmp/inc" $inc "$f" -o "$tmp/$(basename "$f").o" &
  pids+=($!)
done
for f in cuda/*.cpp; do
  g++ -c -std=$std -O1 -fPIC -w -I"$tmp/inc" ${cuda_inc:+-I"$cuda_inc"} $inc "$f" -o "$tmp/$(basename "$f").o" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
if [ $rc -ne 0 ]; then echo "compile check: FAILED"; exit 1; fi
echo "compile check: OK ($(ls cuda/*.cu cuda/*.cpp | wc -l) sources, sm_90, $std)"
