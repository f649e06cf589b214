// Host-side launchers of the attention kernel family: dtype / index / vector
// width dispatch, the lane-group choice and the feature tiling.  Each
// attention_<kind>.cu instantiates them for one score function.
#pragma once

#include "attention_kernels.cuh"
#include "attention_api.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <atomic>
#include <algorithm>
#include <numeric>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace dfgnn {

template <typename T> struct TorchType;
template <> struct TorchType<float> { static constexpr auto value = at::kFloat; };
template <> struct TorchType<c10::Half> { static constexpr auto value = at::kHalf; };
template <> struct TorchType<c10::BFloat16> { static constexpr auto value = at::kBFloat16; };

template <typename T> inline const T* cptr(const at::Tensor& t) {
  return t.defined() && t.numel() ? t.data_ptr<T>() : nullptr;
}
template <typename T> inline T* mptr(const at::Tensor& t) {
  return t.defined() && t.numel() ? t.data_ptr<T>() : nullptr;
}
template <typename I> inline const I* iptr(const at::Tensor& t) {
  return t.defined() && t.numel() ? t.data_ptr<I>() : nullptr;
}

// The first row, and every row of a row-strided (not contiguous) input: a
// contiguous one's heads start at multiples of F, which the vector divides.
inline bool aligned16(const at::Tensor& t) {
  return !t.defined() || t.numel() == 0 ||
         (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 &&
          (t.dim() != 3 || t.is_contiguous() ||
           (t.stride(0) * (int64_t)t.element_size()) % 16 == 0));
}

// Lanes per (item, head): enough lanes to cover the features with kMaxChunks
// vectors each (at most a warp), unless the schedule forces a value.  Measured
// on an H200 (docs/BENCHMARKS.md): for F = 64 fp32, 8 lanes x 2 float4 beat
// 16 x 1 by 10-30% and 32 x 1/2 by 2x.  Narrow heads (F <= 16 fp32) take 1 or 2
// lanes, so that the groups of one warp cover several heads of a row (or
// several rows) instead of leaving lanes idle.  GAT keeps at least 4 lanes:
// its forward walks lane-per-edge chunks of G edges with one softmax rescale
// per chunk, and 1-2 lane chunks measured slower on PATTERN (H100, 8 x 10).
inline int choose_group(int forced, int64_t F, int vec, int kind) {
  if (forced > 0) return forced;
  const int64_t per_lane = (int64_t)width_of(vec) * chunks_for(vec);
  int64_t need = (F + per_lane - 1) / per_lane;
  int g = kind == GAT ? 4 : 1;
  while (g < 32 && g < need) g *= 2;
  return g;
}

// The lanes a head of F features needs on VEC, without a kind's minimum:
// GAT's column pass, which does not share its edges out among the group's
// lanes as its forward does (gat_col_pass, dispatch)
inline int feature_group(int forced, int64_t F, int vec) {
  return choose_group(forced, F, vec, -1);
}


// Backward column-pass mode (bwd_col_kernel): recompute alpha and dS from the
// row statistics (nothing per edge stored; slower) or store them per edge as
// fp32 [E, H] x 2 in the row pass (faster; bf16: one array of bf16 pairs;
// dot attention's narrow fp32 / fp16 heads: alpha alone, kColAlpha, and with
// PYG_DFGNN_ALPHA_MODE=1 GATv2's and bf16's too).  PYG_DFGNN_BACKWARD = "store" |
// "recompute" | "auto" (default): auto recomputes when the two arrays would
// take more than a quarter of the device memory the caching allocator has not
// handed out (total - allocated; the total is asked of the driver once per
// device, at the first backward, which a CUDA graph's warm-up runs eagerly),
// and at narrow heads on graphs of short columns (recompute_lean).  Both modes give the same gradients
// to a few fp32 roundings (tests/ops/test_cuda_kernels.py).
// A mode forced through set_backward_mode (forced_backward_mode) takes precedence
// over the environment variable.  GAT without edge features stores nothing per
// edge in auto and recompute modes unless deterministic algorithms are asked
// for (bwd_gat_atomic); store mode keeps its single-gather array.
// The mode asked for: 0 store, 1 recompute, -1 auto.
inline int backward_request() {
  const int forced = forced_backward_mode().load(std::memory_order_relaxed);
  if (forced == 0 || forced == 1) return forced;
  const char* env = std::getenv("PYG_DFGNN_BACKWARD");
  if (env && std::strcmp(env, "recompute") == 0) return 1;
  if (env && std::strcmp(env, "store") == 0) return 0;
  TORCH_CHECK(!env || !*env || std::strcmp(env, "auto") == 0,
              "PYG_DFGNN_BACKWARD: must be 'auto', 'store' or 'recompute', got '", env, "'");
  return -1;
}

// (lean: recompute_lean's verdict, which auto follows whatever the free memory)
inline bool recompute_backward(int64_t per_edge_bytes, bool lean) {
  const int req = backward_request();
  if (req >= 0) return req == 1;
  if (lean) return true;
  static std::atomic<int64_t> totals[64];   // device memory
  const int64_t total = device_constant(totals, [](int) {
    size_t free_b = 0, total_b = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return (int64_t)total_b;
  });
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
  const int64_t allocated = stats.allocated_bytes[0].current;
  return per_edge_bytes * 4 > total - allocated;
}

// Whether a graph's columns are short: mean length E / N_src up to kShortCols
// (the column pass's kShortColBatch instantiations, launch_col; recompute_lean)
inline bool short_columns(int64_t E, int64_t Ns) {
  return E <= kShortCols * std::max<int64_t>(Ns, 1);
}

// Auto mode also recomputes where the stored per-edge arrays would outweigh
// twice the source rows (E x edge_bytes > 2 N_src F sizeof(T) per head: narrow
// heads on graphs of average degree above F / 2, e.g. 8 x 10 on the 100k-node
// graphs) and the recomputing column pass runs its short-column instantiation
// (kShortColBatch: wide tiles, mean column length up to kShortCols).  There it
// took about the stored mode's time (H100, docs/KERNELS.md, session 38, GPU
// forward+backward against the stored mode: GATv2 8x10 fp32 0.96, bf16
// 1.00-1.01; the Transformer 8x10 bf16 1.05-1.06) for the arrays' memory
// (GATv2 8x10 bf16 peak 150.8 -> 101.9 MiB, the Transformer 8x10 bf16 165.4 ->
// 120.3 MiB, uniform 100k).  Not on longer columns (a PATTERN batch, 51 per
// column: 1.05-1.19x) nor at wider heads, where the arrays weigh less.
// Dot attention in fp16 / bf16 recomputes once the arrays outweigh the source
// rows once (kLeanRows): its 8 x 19 (heads of 20, packed pairs) on the 100k
// graphs, whose stored pairs held its forward+backward's peak at 10.9x below
// PyG's (235.6 MiB on the power-law graph; 192.8 recomputing, 13.3x) for
// 1.13-1.15x the layer's GPU forward+backward (H200, docs/KERNELS.md, session
// 40); GATv2 meets 12x there with its pairs stored and keeps 2.
template <int KIND, typename T> constexpr int64_t kLeanRows = KIND == DOT && sizeof(T) == 2 ? 1 : 2;
template <int KIND, typename T, int VEC>
bool recompute_lean(bool short_cols, int64_t E, int64_t Ns, int64_t F, int64_t edge_bytes) {
  return kShortColBatch<T, VEC, kColRecompute> > 0 && short_cols &&
         E * edge_bytes > kLeanRows<KIND, T> * Ns * F * (int64_t)sizeof(T);
}

// Whether a graph's gathered source rows (the value rows, and dot attention's
// keys besides) fit the L2-resident launch variants (kL2Bytes in
// attention_kernels.cuh: kFwdBlocksSmall, kRowBlocksSmall).
template <int KIND, typename T>
bool l2_resident(const FeatArgs& fa) {
  const at::Tensor& v = KIND == GATV2 ? fa.src : fa.val;
  return v.size(0) * v.size(1) * v.size(2) * (int64_t)sizeof(T) * (KIND == DOT ? 2 : 1) <=
         kL2Bytes;
}

// Calls launch(std::integral_constant<int, B>) with the resident-block count B
// the graph calls for: SMALL on L2-resident graphs, DFLT otherwise (one
// instantiation where they are equal).
template <int DFLT, int SMALL, typename Fn>
void with_blocks(bool small, Fn&& launch) {
  if constexpr (DFLT != SMALL) {
    if (small) {
      launch(std::integral_constant<int, SMALL>());
      return;
    }
  }
  launch(std::integral_constant<int, DFLT>());
}

struct Launch {
  dim3 grid;
  int64_t tile;
};

// GATv2's row-pass grid (bwd_row_kernel: its groups loop over (item, head)
// pairs with a stride of the grid's groups, each with one head, and every
// block writes one att-gradient partial row per head of its groups): at most
// kAttWaves blocks per SM, and a whole number of heads of groups.  Returns the
// number of partial rows, a multiple of H (row r holds head r mod H): H per
// block, or one per group where a block has fewer groups than heads.
constexpr int64_t kAttWaves = 8;
inline int64_t bwd_row_grid(Launch& l, int64_t H, int G) {
  const int64_t gpb = kThreads / G;
  static std::atomic<int64_t> sm_counts[64];
  const int64_t sms = device_constant(sm_counts, [](int dev) {
    int n = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return (int64_t)n;
  });
  int64_t blocks = std::min<int64_t>(l.grid.x, sms * kAttWaves);
  const int64_t q = H / std::gcd(gpb, H);   // blocks per whole number of heads
  blocks = (blocks + q - 1) / q * q;
  l.grid.x = (unsigned)blocks;
  return blocks * std::min(gpb, H);
}

inline Launch launch_shape(int64_t items, int64_t H, int64_t F, int G, int vec) {
  Launch l;
  l.tile = (int64_t)G * width_of(vec) * chunks_for(vec);
  const int64_t tiles = std::max<int64_t>(1, (F + l.tile - 1) / l.tile);
  const int64_t groups_per_block = kThreads / G;
  const int64_t blocks = (items * H + groups_per_block - 1) / groups_per_block;
  TORCH_CHECK(blocks < (int64_t)INT32_MAX && tiles < 65536, "pyg_dfgnn: problem too large");
  l.grid = dim3((unsigned)std::max<int64_t>(blocks, 1), (unsigned)tiles);
  return l;
}

template <typename T, typename I>
Params<T, I> make_params(const GraphArgs& gr, const FeatArgs& fa, int kind) {
  Params<T, I> p;
  memset(&p, 0, sizeof(p));
  p.rowptr = iptr<I>(gr.rowptr); p.col = iptr<I>(gr.col); p.perm = iptr<I>(gr.perm);
  p.t_rowptr = iptr<I>(gr.t_rowptr); p.t_col = iptr<I>(gr.t_col); p.t_perm = iptr<I>(gr.t_perm);
  p.dst = cptr<T>(fa.dst); p.src = cptr<T>(fa.src);
  p.val = kind == GATV2 ? cptr<T>(fa.src) : cptr<T>(fa.val);
  p.edge = cptr<T>(fa.edge); p.att = cptr<T>(fa.att);
  // GAT's att: the output bias; dot attention: the residual rows, if any
  p.bias = kind == GAT ? p.att : (kind == DOT ? cptr<T>(fa.res) : nullptr);
  p.ld_bias = (kind == DOT && fa.res.defined()) ? fa.res.stride(0) : 0;
  const at::Tensor& v = kind == GATV2 ? fa.src : fa.val;
  p.H = v.size(1);
  p.F = v.size(2);
  // GAT's bias rows [H, C]: C = F, or the caller's width C < F (not padded:
  // the epilogue adds it per element where it stores the narrow output)
  p.bias_F = (kind == GAT && fa.att.defined()) ? fa.att.size(1) : p.F;
  // row strides of the [N, H, F] inputs (dfgnn_ops.cpp checks their layout)
  auto ld = [&](const at::Tensor& t) { return t.defined() && t.dim() == 3 ? t.stride(0) : p.H * p.F; };
  p.ld_dst = ld(fa.dst);
  p.ld_src = ld(fa.src);
  p.ld_val = kind == GATV2 ? p.ld_src : ld(fa.val);
  // head strides of k / v: F, or 0 for dot attention's keys / values broadcast
  // over the heads (dfgnn_ops.cpp: row_strided)
  auto hs = [&](const at::Tensor& t) {
    return t.defined() && t.dim() == 3 && t.size(1) > 1 ? t.stride(1) : p.F;
  };
  p.hs_src = dot_like(kind) ? hs(fa.src) : p.F;
  p.hs_val = dot_like(kind) ? hs(fa.val) : p.F;
  p.scale = (float)fa.scale; p.slope = (float)fa.slope; p.drop_p = (float)fa.drop_p;
  p.seed = (uint64_t)fa.seed;
  return p;
}

// The lean kernels (fwd_lean_kernel: every kind's forward; bwd_row_lean_kernel:
// dot-like row pass; bwd_col_lean_kernel: every column pass but AGNN's)
// where they apply, unless PYG_DFGNN_LEAN=0 (fwd_kernel, bwd_row_kernel and
// bwd_col_kernel everywhere: for A/B runs and the tests that compare them).
inline bool lean_request() {
  const char* env = std::getenv("PYG_DFGNN_LEAN");
  return !env || std::strcmp(env, "0") != 0;
}

// Whether a launch may take a lean kernel (its kind aside): no edge features,
// no dropout, the head in one launch column (no wide tile).
template <typename T, typename I>
bool lean_applies(const Params<T, I>& p, const Launch& l) {
  return l.grid.y == 1 && !p.edge && !(p.drop_p > 0.f) && lean_request();
}

// GAT's forward by rows (fwd_gat_rows_kernel): the lanes per work item, or 0
// where it does not apply.  It applies to the calls whose heads fit one launch
// column (with edge logits and attention dropout too, on the kernel's EXTRA
// instantiation; not under PYG_DFGNN_LEAN=0) without a forced group, whose
// heads H are a power of two of at least kRowsK features (a 16-byte chunk
// spans two heads at most) and whose rows are whole 16-byte chunks (H F a
// multiple of kRowsK), aligned, of at most kRowsMaxBytes: G = the power of two
// covering the row's chunks and H, at most 16 (two rows per warp or more) and
// fewer than the H groups of p.G lanes fwd_lean_kernel takes.  Measured on an
// H100 (docs/KERNELS.md, session 51; the forward kernel, uniform / power-law /
// PATTERN): bf16 8 x 10 (32 -> 16 lanes) 0.68 / 0.72 / 0.65x, 8 x 8 fp32 (32
// -> 16) 0.59 / 0.74 / 0.54x, bf16 (32 -> 8) 0.43 / 0.96 / 0.53x, bf16 4 x 16
// and 2 x 16 0.68-0.77x; with as many lanes as fwd_lean_kernel's or more it
// lost on some graph (fp32 4 x 16 1.08x power-law, 1 x 32 1.45x uniform), and
// so did a warp per row (fp32 8 x 10, bf16 8 x 20: up to 1.38x, H200), 4 x 64
// (1.19-1.38x) and two chunks per lane (up to 1.61x). PYG_DFGNN_GAT_ROWS=0
// turns it off.
constexpr int64_t kRowsMaxBytes = 256;
inline bool gat_rows_request() {
  const char* env = std::getenv("PYG_DFGNN_GAT_ROWS");
  if (!env || !*env || std::strcmp(env, "1") == 0) return true;
  TORCH_CHECK(std::strcmp(env, "0") == 0,
              "PYG_DFGNN_GAT_ROWS: must be '0' or '1', got '", env, "'");
  return false;
}
template <typename T, typename I>
int gat_rows_group(const Params<T, I>& p, const Launch& l, const Sched& sc, const FeatArgs& fa,
                   const at::Tensor& out) {
  constexpr int64_t K = kRowsK<T>;
  if (!gat_rows_request() || sc.group > 0 || l.grid.y != 1 || !lean_request()) return 0;
  const int64_t H = p.H, F = p.F;
  if ((H & (H - 1)) != 0 || F < K || (H * F) % K != 0 ||
      H * F * (int64_t)sizeof(T) > kRowsMaxBytes || !aligned16(fa.val) || !aligned16(out) ||
      (p.out_F == F && !out.is_contiguous()))
    return 0;
  int g = 1;
  while (g < std::max(H, H * F / K)) g *= 2;
  return g <= 16 && g < H * p.G ? g : 0;
}

template <int KIND, typename T, typename I, int VEC>
void fwd_impl(const GraphArgs& gr, const FeatArgs& fa, const Sched& sc, FwdOut& o) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  Params<T, I> p = make_params<T, I>(gr, fa, KIND);
  const int64_t Nd = gr.rowptr.numel() - 1;
  p.work = iptr<I>(sc.work);
  p.num_items = sc.work.defined() ? sc.work.size(0) : Nd;
  p.G = choose_group(sc.group, p.F, VEC, KIND);
  const Launch l = launch_shape(p.num_items, p.H, p.F, p.G, VEC);
  p.tile = l.tile;
  p.out = mptr<T>(o.out); p.alpha = mptr<T>(o.alpha);
  p.out_F = o.out.size(2);   // the caller's width (<= F: the op's padding is not written)
  p.lse = mptr<float>(o.lse); p.lse_l = p.lse ? p.lse + Nd * p.H : nullptr;
  at::Tensor part_acc, part_ml;
  if (sc.slots > 0) {
    auto fo = o.out.options().dtype(at::kFloat);
    part_acc = at::empty({sc.slots, p.H, p.F}, fo);
    part_ml = at::empty({2, sc.slots, p.H}, fo);
    p.part_acc = part_acc.data_ptr<float>();
    p.part_m = part_ml.data_ptr<float>();
    p.part_l = p.part_m + sc.slots * p.H;
  }
  bool by_rows = false;   // (GAT's forward by rows: fwd_gat_rows_kernel)
  if constexpr (KIND == GAT) {
    const int g = p.num_items > 0 ? gat_rows_group(p, l, sc, fa, o.out) : 0;
    if (g > 0) {
      Params<T, I> pr = p;   // (its own lanes per item)
      pr.G = g;
      const int64_t blocks = (p.num_items * g + kThreads - 1) / kThreads;
      TORCH_CHECK(blocks < (int64_t)INT32_MAX, "pyg_dfgnn: problem too large");
      if (p.edge || p.drop_p > 0.f)
        fwd_gat_rows_kernel<T, I, true><<<(unsigned)blocks, kThreads, 0, stream>>>(pr);
      else
        fwd_gat_rows_kernel<T, I, false><<<(unsigned)blocks, kThreads, 0, stream>>>(pr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      by_rows = true;
    }
  }
  if (p.num_items > 0 && !by_rows) {
    // (calls without edge features or dropout, heads in one launch column:
    // the lean forward, the same results bit for bit)
    const bool lean = lean_applies(p, l);
    with_blocks<kFwdBlocks<KIND, T, VEC>, kFwdBlocksSmall<KIND, T, VEC>>(
        l2_resident<KIND, T>(fa), [&](auto b) {
          if (lean) {
            fwd_lean_kernel<KIND, T, I, VEC, decltype(b)::value>
                <<<l.grid, kThreads, 0, stream>>>(p);
            return;
          }
          fwd_kernel<KIND, T, I, VEC, decltype(b)::value><<<l.grid, kThreads, 0, stream>>>(p);
        });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (sc.slots > 0 && sc.merge.defined() && sc.merge.size(0) > 0) {
    const int64_t R = sc.merge.size(0);
    fwd_merge_kernel<T, I><<<(unsigned)(R * p.H), kMergeThreads, 0, stream>>>(
        sc.merge.data_ptr<I>(), R, p.H, p.F, p.out_F, p.part_acc, p.part_m, p.part_l, p.bias,
        p.ld_bias, p.bias_F, p.out, p.lse, p.lse_l);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (fa.need_alpha && p.num_items > 0 && gr.col.numel() > 0) {
    Launch la = launch_shape(p.num_items, p.H, 1, p.G, VEC);
    alpha_kernel<KIND, T, I, VEC><<<la.grid, kThreads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// GAT's source-side scalar pass (bwd_gat_src_kernel: the stored mode's sum of
// g, or the atomic mode's correction) over the transposed CSR's items in p, and
// the merge of split columns' slots into d_src.
template <typename T, typename I, bool FIX>
void gat_src_pass(const Params<T, I>& p, const Sched& sc, bool t_split, cudaStream_t stream) {
  constexpr int kWarps = kThreads / 32;
  if (p.num_items > 0) {
    bwd_gat_src_kernel<T, I, FIX><<<(unsigned)((p.num_items + kWarps - 1) / kWarps), kThreads,
                                    0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (t_split) {
    merge_sum_kernel<T, I><<<(unsigned)(sc.t_merge.size(0) * p.H), kMergeThreads, 0, stream>>>(
        sc.t_merge.data_ptr<I>(), sc.t_merge.size(0), p.H, 1, p.part2, p.d_src, p.ldg_src);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// GAT's column pass (MODE kColEmitDP or kColAtomic) over the transposed CSR's
// items, and the merge of split columns' d_val.  p is left on the column
// items, with part1 / part2 on the columns' slots (part2: d_src's, which the
// source pass merges); the returned slots must live until then.
struct ColSlots {
  at::Tensor part1, part2;
  bool split = false;   // columns split into slots that need merging
};

// GAT's column pass over the transposed CSR's items: their count, the lanes
// per (column, head) and the launch (gat_col_pass; bwd_gat_atomic's hub rule
// asks whether that launch is lean before the pass)
struct GatColShape {
  int64_t items;
  int G;
  Launch l;
};
template <int VEC>
GatColShape gat_col_shape(const Sched& sc, int64_t Ns, int64_t H, int64_t F) {
  GatColShape s;
  s.items = sc.t_work.defined() ? sc.t_work.size(0) : Ns;
  s.G = DFGNN_GAT_WIDE_BWD ? feature_group(sc.group, F, VEC) : choose_group(sc.group, F, VEC, GAT);
  s.l = launch_shape(s.items, H, F, s.G, VEC);
  return s;
}

// GAT's atomic column pass: the in-degree from which a destination row is a
// hub whose sums each block collects in its HubCache (Params::hub_min), or 0.
// A block covers C = kThreads / (G H) columns, each of which reaches row i
// with a probability of about deg_i / N_src, so a row takes a block's cache
// from where the block's columns reach it about twice: deg_i >= 2 N_src G H /
// kThreads (at least 64).  Only where the cache can pay: the lean kernel (its
// HUBS instantiation; the other column passes read the rows' statistics
// unmarked), a schedule that split rows (super nodes; elsewhere no row is
// long), heads of at most kHubMaxF features (an edge and head adds one
// 16-byte atomic against F features of work, so the atomics' share of the
// pass falls with F: at 4 x 64 the cache did not pay, at 8 x 10 and 8 x 19 it
// did, H200, docs/KERNELS.md, session 50), and keys i H + h that fit an int.
// PYG_DFGNN_GAT_HUB_MIN (an in-degree; 0 = never) overrides the rule for the
// lean kernel on any graph: tests, A/B runs.
constexpr int64_t kHubMaxF = 32;
inline int64_t gat_hub_min(const Sched& sc, bool lean, int64_t Nd, int64_t Ns, int64_t H,
                           int64_t F, int G) {
  if (!lean || Nd * H > (int64_t)INT32_MAX) return 0;
  const char* env = std::getenv("PYG_DFGNN_GAT_HUB_MIN");
  if (env && *env) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    TORCH_CHECK(end && *end == '\0' && v >= 0,
                "PYG_DFGNN_GAT_HUB_MIN: must be an in-degree >= 0 (0 = no hubs), got '", env, "'");
    return (int64_t)v;
  }
  if (sc.slots <= 0 || F > kHubMaxF) return 0;
  return std::max<int64_t>(64, (2 * Ns * G * H + kThreads - 1) / kThreads);
}

template <int MODE, typename T, typename I, int VEC>
ColSlots gat_col_pass(Params<T, I>& p, const Sched& sc, int64_t Ns, const at::TensorOptions& fo,
                      cudaStream_t stream) {
  const int64_t H = p.H;
  const GatColShape shape = gat_col_shape<VEC>(sc, Ns, H, p.F);
  const Launch& l = shape.l;
  p.work = iptr<I>(sc.t_work);
  p.num_items = shape.items;
  p.G = shape.G;
  p.tile = l.tile;
  ColSlots cs;
  if (sc.t_slots > 0) {
    cs.part1 = at::empty({sc.t_slots, H, p.F}, fo);
    cs.part2 = at::empty({sc.t_slots, H}, fo);
    p.part1 = cs.part1.data_ptr<float>();
    p.part2 = cs.part2.data_ptr<float>();
  }
  cs.split = sc.t_slots > 0 && sc.t_merge.defined() && sc.t_merge.size(0) > 0;
  if (p.num_items > 0) {
    // (the lean column pass on the calls the lean forward takes: in emit-dP
    // mode the same per-edge dP and d_val bit for bit; in atomic mode the same
    // terms, added to the row sums in the atomics' order; there on a graph
    // with hubs (p.hub_min > 0, gat_hub_min) with the blocks' HubCache)
    const bool lean = lean_applies(p, l);
    TORCH_CHECK(p.hub_min == 0 || (lean && MODE == kColAtomic),
                "pyg_dfgnn: internal error: hub rows without the lean atomic pass");
    if (p.hub_min > 0) {
      if constexpr (MODE == kColAtomic)
        bwd_col_lean_kernel<GAT, T, I, VEC, MODE, 0, true>
            <<<l.grid, kThreads, sizeof(HubCache), stream>>>(p);
    } else if (lean)
      bwd_col_lean_kernel<GAT, T, I, VEC, MODE><<<l.grid, kThreads, 0, stream>>>(p);
    else bwd_col_kernel<GAT, T, I, VEC, MODE><<<l.grid, kThreads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (cs.split && p.d_val) {
    merge_sum_kernel<T, I><<<(unsigned)(sc.t_merge.size(0) * H), kMergeThreads, 0, stream>>>(
        sc.t_merge.data_ptr<I>(), sc.t_merge.size(0), H, p.F, p.part1, p.d_val, p.ldg_val);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return cs;
}

// GAT's backward in stored mode (bwd_gat_row_kernel): the column pass in
// emit-dP mode gathers dO_i once per edge for d_val and dP, then two scalar
// passes over the per-edge alpha~ dP (fp32 [E, H], overwritten by g) give d_dst,
// d_edge and d_src.  Split rows / columns use the schedule's slots.  Measured
// on an H100 against the two-gather backward (row pass + stored column pass;
// docs/KERNELS.md, session 12): backward kernels 0.57-0.91x in fp32,
// 0.68-0.95x in bf16.
template <typename T, typename I, int VEC>
void bwd_gat_single_gather(Params<T, I> p, const Sched& sc, int64_t Nd, int64_t Ns,
                           const at::TensorOptions& fo, cudaStream_t stream) {
  const int64_t H = p.H;
  // ---- column pass: d_val, and alpha~ dP per edge into p.ds
  const ColSlots cs = gat_col_pass<kColEmitDP, T, I, VEC>(p, sc, Ns, fo, stream);
  const int64_t t_items = p.num_items;
  const I* t_work = p.work;
  // ---- scalar row pass: Delta, g (over alpha~ dP), d_dst, d_edge; one warp per item
  constexpr int kWarps = kThreads / 32;
  p.work = iptr<I>(sc.work);
  p.num_items = sc.work.defined() ? sc.work.size(0) : Nd;
  at::Tensor part1, part2, delta;
  const bool split = sc.slots > 0 && sc.merge.defined() && sc.merge.size(0) > 0;
  if (sc.slots > 0) {
    part1 = at::empty({sc.slots, H}, fo);
    part2 = at::empty({sc.slots, H}, fo);
    p.part1 = part1.data_ptr<float>();
    p.part2 = part2.data_ptr<float>();
  }
  const unsigned rows_grid = (unsigned)std::max<int64_t>((p.num_items + kWarps - 1) / kWarps, 1);
  if (p.num_items > 0) {
    bwd_gat_row_kernel<T, I, 0><<<rows_grid, kThreads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (split && p.num_items > 0) {
    const int64_t R = sc.merge.size(0);
    delta = at::empty({std::max<int64_t>(Nd, 1), H}, fo);
    p.delta = delta.data_ptr<float>();
    merge_sum_kernel<float, I><<<(unsigned)(R * H), kMergeThreads, 0, stream>>>(
        sc.merge.data_ptr<I>(), R, H, 1, p.part2, p.delta, H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    bwd_gat_row_kernel<T, I, 1><<<rows_grid, kThreads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    merge_sum_kernel<T, I><<<(unsigned)(R * H), kMergeThreads, 0, stream>>>(
        sc.merge.data_ptr<I>(), R, H, 1, p.part1, p.d_dst, p.ldg_dst);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  // ---- scalar column pass: d_src[j] = sum_i g_ij
  p.work = t_work;
  p.num_items = t_items;
  p.part2 = cs.part2.defined() ? cs.part2.data_ptr<float>() : nullptr;
  gat_src_pass<T, I, false>(p, sc, cs.split, stream);
}

// GAT's backward with nothing stored per edge (see bwd_col_kernel's kColAtomic,
// row_delta_kernel, bwd_gat_eps_kernel, bwd_gat_src_kernel): D = <dO, O>, the column pass
// (d_val, d_src before its correction, the destination rows' sums by atomics),
// eps and d_dst per row, d_src's correction per column.  Used without edge
// features (whose per-edge gradient would need dS again) where the caller
// allows results that are not bit-reproducible (bwd_impl).
template <typename T, typename I, int VEC>
void bwd_gat_atomic(Params<T, I> p, const Sched& sc, int64_t Nd, int64_t Ns,
                    const at::TensorOptions& fo, const BwdIn& bi, const FeatArgs& fa,
                    cudaStream_t stream) {
  const int64_t H = p.H, NH = Nd * H;
  // ---- the rows' sums (16-byte aligned), set to {0, 0, 0, D_i} with D_i =
  // <dO_i, O_i>, O = out - bias (the stored output in the caller's width), and
  // the rows' statistics {m_i, log l_i, a_dst_i, D_i} for the column pass (kGatAcc)
  at::Tensor acc = at::empty({std::max<int64_t>(Nd, 1), H, kGatAcc}, fo);
  p.gat_acc = acc.data_ptr<float>();
  // (hubs: row_delta marks them, the lean column pass collects their sums per
  // block; on the column pass's launch, gat_col_shape)
  {
    const GatColShape col = gat_col_shape<VEC>(sc, Ns, H, p.F);
    p.hub_min = gat_hub_min(sc, lean_applies(p, col.l), Nd, Ns, H, p.F, col.G);
  }
  const at::Tensor out = bi.out.stride(2) == 1 ? bi.out : bi.out.contiguous();
  const at::Tensor dout = bi.grad_out.stride(2) == 1 ? bi.grad_out : bi.grad_out.contiguous();
  const at::Tensor bias = fa.att.defined() ? fa.att.reshape({H, -1}).contiguous() : at::Tensor();
  launch_row_delta<T>(NH, H, out.size(2), cptr<T>(dout), dout.stride(0), dout.stride(1),
                      cptr<T>(out), out.stride(0), out.stride(1), cptr<T>(bias), 0,
                      bias.defined() ? bias.size(1) : 0, p.lse_in, p.dst,
                      reinterpret_cast<float4*>(p.gat_acc), nullptr, stream, p.rowptr,
                      p.hub_min);
  // d_src before its correction, fp32 (fp32 inputs: d_src itself)
  at::Tensor dsf;
  if constexpr (std::is_same<T, float>::value) {
    p.d_src_f = p.d_src;
  } else {
    dsf = at::empty({std::max<int64_t>(Ns, 1), H}, fo);
    p.d_src_f = dsf.data_ptr<float>();
  }
  // ---- column pass (the transposed CSR's items, as emit-dP)
  const ColSlots cs = gat_col_pass<kColAtomic, T, I, VEC>(p, sc, Ns, fo, stream);
  // ---- per destination row: eps = D - X (over D), d_dst
  if (NH > 0) {
    bwd_gat_eps_kernel<T, I><<<(unsigned)((NH + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        p, NH);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  // ---- per source column: d_src's correction (split columns: into their slots, merged)
  gat_src_pass<T, I, true>(p, sc, cs.split, stream);
}

// The alpha mode (kColAlpha, bwd_impl), PYG_DFGNN_ALPHA_MODE: unset = where
// it is the faster stored form (dot attention's fp32 / fp16 heads under
// kWideHeadBytes); "1" = wherever it applies, GATv2's and bf16 heads too (a
// leaner stored mode: bf16 keeps 2 bytes per (edge, head) instead of its
// packed pair's 4, GATv2 fp32 4 instead of 8, at 0.98-1.06x the GPU time of a
// layer forward+backward, H200, docs/KERNELS.md, session 37); "0" = never
// (the stored mode's pairs: for A/B runs and the tests that compare the two).
// -1 unset, 0, 1.
inline int alpha_mode_request() {
  const char* env = std::getenv("PYG_DFGNN_ALPHA_MODE");
  if (!env || !*env) return -1;
  return std::strcmp(env, "0") == 0 ? 0 : 1;
}

// A column pass in mode MODE: on graphs of short columns (short_columns), the
// instantiation of kShortColBatch edges per batch where there is one (the fp32
// wide tiles' passes, the fp16 / bf16 recomputing one; attention_kernels.cuh)
// (lean: bwd_col_lean_kernel, where bwd_impl found lean_applies)
template <int KIND, typename T, typename I, int VEC, int MODE>
void launch_col(const Launch& l, const Params<T, I>& p, bool short_cols, bool lean,
                cudaStream_t stream) {
  constexpr int kShort = kShortColBatch<T, VEC, MODE>;
  auto go = [&](auto batch) {
    constexpr int BT = decltype(batch)::value;
    if constexpr (KIND == DOT || KIND == GATV2) {
      if (lean) {
        bwd_col_lean_kernel<KIND, T, I, VEC, MODE, BT><<<l.grid, kThreads, 0, stream>>>(p);
        return;
      }
    }
    bwd_col_kernel<KIND, T, I, VEC, MODE, BT><<<l.grid, kThreads, 0, stream>>>(p);
  };
  if constexpr (kShort > 0) {
    if (short_cols) {
      go(std::integral_constant<int, kShort>());
      return;
    }
  }
  go(std::integral_constant<int, 0>());
}

// the alpha mode's column pass (instantiated for dot attention and GATv2 only)
template <int KIND, typename T, typename I, int VEC>
void col_alpha(const Launch& l, const Params<T, I>& p, bool short_cols, bool lean,
               cudaStream_t stream) {
  if constexpr (KIND == DOT || KIND == GATV2)
    launch_col<KIND, T, I, VEC, kColAlpha>(l, p, short_cols, lean, stream);
}

template <int KIND, typename T, typename I, int VEC>
void bwd_impl(const GraphArgs& gr, const FeatArgs& fa, const Sched& sc, const BwdIn& bi,
              BwdOut& o) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  Params<T, I> p = make_params<T, I>(gr, fa, KIND);
  const int64_t Nd = gr.rowptr.numel() - 1, Ns = gr.t_rowptr.numel() - 1;
  p.dout = cptr<T>(bi.grad_out); p.o = cptr<T>(bi.out); p.lse_in = cptr<float>(bi.lse);
  p.lse_l_in = p.lse_in ? p.lse_in + Nd * p.H : nullptr;
  p.delta_in = cptr<float>(bi.delta);
  auto fo = bi.grad_out.options().dtype(at::kFloat);
  // for the column pass: the Delta_i of each (row, head) the row pass used
  // (recompute mode) or g and alpha~ per edge (stored mode)
  const int64_t E = gr.col.numel();
  // GAT with up to 32 heads stores one fp32 array per edge (dP, then g): see
  // bwd_gat_single_gather; the other kinds two (g and pd)
  constexpr bool kSingle = KIND == GAT;
  const bool gat_single = kSingle && p.H <= 32;
  at::Tensor delta, ds, pd;
  p.d_dst = mptr<T>(o.d_dst); p.d_src = mptr<T>(o.d_src); p.d_val = mptr<T>(o.d_val);
  p.d_edge = mptr<T>(o.d_edge);
  // (d_dst / d_src of GAT are [N, H] scalars; the others' rows H F apart unless
  // they are column blocks of one buffer)
  auto gld = [&](const at::Tensor& t, int64_t w) {
    return t.defined() && t.dim() == 3 ? t.stride(0) : p.H * w;
  };
  p.ldg_dst = gld(o.d_dst, KIND == GAT ? 1 : p.F);
  p.ldg_src = gld(o.d_src, KIND == GAT ? 1 : p.F);
  p.ldg_val = gld(o.d_val, p.F);
  if constexpr (kSingle) {
    // GAT without edge features, unless the store mode or bit-reproducible
    // results are asked for: nothing per edge (bwd_gat_atomic); with
    // torch.use_deterministic_algorithms, the modes below
    if (gat_single && E > 0 && !fa.edge.defined() && backward_request() != 0 &&
        !at::globalContext().deterministicAlgorithms()) {
      bwd_gat_atomic<T, I, VEC>(p, sc, Nd, Ns, fo, bi, fa, stream);
      return;
    }
  }
  // (after GAT's atomic mode, which needs no device statistics)
  // the alpha mode (kColAlpha) where it stores: heads under kWideHeadBytes
  // (128) without edge features, where the stored mode's arrays (E x H x 8
  // bytes, bf16's packed pairs 4) outweigh the heads; by default dot
  // attention's fp32 / fp16 heads, with PYG_DFGNN_ALPHA_MODE=1 also GATv2's
  // and bf16 (alpha_mode_request).  Alpha in fp32 (4 bytes), bf16's in bf16
  // (2: as the packed pair rounds g and alpha~ to bf16)
  const int alpha_req = alpha_mode_request();
  const bool alpha_ok = (KIND == DOT || KIND == GATV2) && !fa.edge.defined() &&
                        p.F * (int64_t)sizeof(T) < kWideHeadBytes &&
                        (alpha_req == 1 || (alpha_req < 0 && KIND == DOT && !kPackedEdges<T>));
  const int64_t edge_bytes = alpha_ok ? (kPackedEdges<T> ? 2 : 4)
                             : gat_single || kPackedEdges<T> ? 4 : 8;
  const bool short_cols = short_columns(E, Ns);
  const bool recompute =
      E > 0 && recompute_backward(E * p.H * edge_bytes,
                                  recompute_lean<KIND, T, VEC>(short_cols, E, Ns, p.F, edge_bytes));
  const bool alpha_mode = alpha_ok && !recompute;
  if constexpr (kSingle) {
    if (gat_single && !recompute) {
      ds = at::empty({E, p.H}, fo);
      p.ds = mptr<float>(ds);
      bwd_gat_single_gather<T, I, VEC>(p, sc, Nd, Ns, fo, stream);
      return;
    }
  }
  // the other passes take Delta = <dO, O> from the stored output, which GAT
  // hands over in its own width (the single-gather path above never reads it):
  // padded to F here, and GAT's bias folded into it comes off (one rounding of
  // the output's magnitude)
  at::Tensor o_full;
  if (KIND == GAT) {
    o_full = bi.out;
    if (fa.att.defined()) o_full = o_full - fa.att.narrow(1, 0, o_full.size(2));
    if (o_full.size(2) != p.F) o_full = at::constant_pad_nd(o_full, {0, p.F - o_full.size(2)});
    o_full = o_full.contiguous();
    p.o = cptr<T>(o_full);
  }
  if (recompute || alpha_mode) {
    // the row pass's Delta (the one the column pass must use): written over
    // the caller's where it gave one (BwdIn::delta; a [N_dst, H] fp32 array
    // less at the backward's peak), else a buffer of its own
    if (bi.delta.defined()) {
      p.delta = const_cast<float*>(p.delta_in);
    } else {
      delta = at::empty({std::max<int64_t>(Nd, 1), p.H}, fo);
      p.delta = delta.data_ptr<float>();
    }
  }
  if (alpha_mode) {
    if constexpr (kPackedEdges<T>) {   // bf16 alpha
      ds = at::empty({E, p.H}, fo.dtype(at::kShort));
      p.ds = reinterpret_cast<float*>(ds.data_ptr<int16_t>());
    } else {
      ds = at::empty({E, p.H}, fo);
      p.ds = mptr<float>(ds);
    }
  } else if (!recompute) {
    if constexpr (kPackedEdges<T>) {   // one array of (g, pd) bf16 pairs
      ds = at::empty({E, p.H}, fo.dtype(at::kInt));
      p.ds = reinterpret_cast<float*>(ds.data_ptr<int32_t>());
    } else {
      ds = at::empty({E, p.H}, fo);
      pd = at::empty({E, p.H}, fo);
      p.ds = mptr<float>(ds);
      p.pd = mptr<float>(pd);
    }
  }
  const int64_t featF = KIND == GAT ? 1 : p.F;   // width of d_dst / d_src rows

  // ---- row pass (destination side)
  p.work = iptr<I>(sc.work);
  p.num_items = sc.work.defined() ? sc.work.size(0) : Nd;
  p.G = choose_group(sc.group, p.F, VEC, KIND);
  Launch l = launch_shape(p.num_items, p.H, p.F, p.G, VEC);
  p.tile = l.tile;
  at::Tensor part1, att_part;
  if (sc.slots > 0) {
    part1 = at::empty({sc.slots, p.H, featF}, fo);
    p.part1 = part1.data_ptr<float>();
  }
  if (KIND == GATV2) {
    att_part = at::empty({bwd_row_grid(l, p.H, p.G) / p.H, p.H, p.F}, fo);
    p.d_att_part = att_part.data_ptr<float>();
  }
  if (KIND == AGNN && o.want_score_sum) {   // (every launch column and item writes its own)
    o.score_sum = at::empty({(int64_t)l.grid.y, p.num_items, p.H}, fo);
    p.score_sum = o.score_sum.data_ptr<float>();
  }
  if (p.num_items > 0) {
    // (dot-like calls the lean forward takes: the lean row pass, bit for bit)
    const bool lean = dot_like(KIND) && lean_applies(p, l);
    with_blocks<kRowBlocks<KIND, T, VEC>, kRowBlocksSmall<KIND, T, VEC>>(
        l2_resident<KIND, T>(fa), [&](auto b) {
          if constexpr (dot_like(KIND)) {
            if (lean) {
              bwd_row_lean_kernel<KIND, T, I, VEC, decltype(b)::value>
                  <<<l.grid, kThreads, 0, stream>>>(p);
              return;
            }
          }
          bwd_row_kernel<KIND, T, I, VEC, decltype(b)::value><<<l.grid, kThreads, 0, stream>>>(p);
        });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (sc.slots > 0 && sc.merge.defined() && sc.merge.size(0) > 0) {
    const int64_t R = sc.merge.size(0);
    merge_sum_kernel<T, I><<<(unsigned)(R * p.H), kMergeThreads, 0, stream>>>(
        sc.merge.data_ptr<I>(), R, p.H, featF, p.part1, p.d_dst, p.ldg_dst);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (KIND == GATV2) {
    // (summed straight into d_att where it is fp32: no copy)
    if (p.num_items == 0) o.d_att.zero_();
    else if (o.d_att.scalar_type() == at::kFloat && o.d_att.is_contiguous())
      at::sum_out(o.d_att, att_part, {0});
    else o.d_att.copy_(att_part.sum(0));
  }
  // (the row pass's partials are merged: given back before the column pass's
  // own are allocated, off the backward's peak; the caching allocator keeps
  // the blocks on this stream, whose queued kernels still read them)
  part1 = at::Tensor();
  att_part = at::Tensor();
  p.part1 = nullptr;
  p.d_att_part = nullptr;

  // ---- column pass (source side, transposed CSR)
  p.work = iptr<I>(sc.t_work);
  p.num_items = sc.t_work.defined() ? sc.t_work.size(0) : Ns;
  // fp16 / bf16 wide tiles: the stored-mode column pass reads g and alpha~
  // per edge, so it need not share the row pass's lane layout, and it runs on
  // the default tile (with the wide one: 1.02-1.10x the time at 2 resident
  // blocks, 480-580 B of spills at 3; H100, docs/KERNELS.md, session 22).  The
  // recomputing pass keeps the row pass's layout (its Delta must match).
  // (the five-chunk tile of 4-byte vectors keeps its tile: its plain vector
  // would take four lanes per head of 10)
  constexpr int VCOL = kWide<VEC> && sizeof(T) == 2 && kW<VEC> * sizeof(T) > 4 ? kW<VEC> : VEC;
  // (the recomputing and alpha passes keep the row pass's lane layout: their
  // dP must match the row pass's Delta)
  const bool own_layout = recompute || alpha_mode;
  if (VCOL != VEC && !own_layout) p.G = choose_group(sc.group, p.F, VCOL, KIND);
  l = launch_shape(p.num_items, p.H, p.F, p.G, own_layout ? VEC : VCOL);
  p.tile = l.tile;
  // d_src / d_val written over src / val (dfgnn_ops.cpp: src_in_place): a
  // recomputing launch column over one feature tile of several reads its own
  // column's other tiles while the other launch columns write theirs, so there
  // the gradients go to a buffer of their own, copied over afterwards
  at::Tensor own_src, own_val;
  if (o.src_aliased && l.grid.y > 1 && own_layout) {
    own_src = at::empty(o.d_src.sizes(), o.d_src.options());
    p.d_src = mptr<T>(own_src);
    p.ldg_src = p.H * p.F;
    if (o.d_val.defined() && o.d_val.numel()) {
      own_val = at::empty(o.d_val.sizes(), o.d_val.options());
      p.d_val = mptr<T>(own_val);
      p.ldg_val = p.H * p.F;
    }
  }
  at::Tensor cpart1, cpart2;
  if (sc.t_slots > 0) {
    cpart1 = at::empty({sc.t_slots, p.H, p.F}, fo);
    cpart2 = at::empty({sc.t_slots, p.H, featF}, fo);
    p.part1 = cpart1.data_ptr<float>();
    p.part2 = cpart2.data_ptr<float>();
  }
  if (p.num_items > 0) {
    // (the lean column pass: dot attention's and GATv2's, on the calls the
    // lean forward takes; the same gradients bit for bit)
    const bool lean = (KIND == DOT || KIND == GATV2) && lean_applies(p, l);
    if (recompute) launch_col<KIND, T, I, VEC, kColRecompute>(l, p, short_cols, lean, stream);
    else if (alpha_mode) col_alpha<KIND, T, I, VEC>(l, p, short_cols, lean, stream);
    else launch_col<KIND, T, I, VCOL, kColStored>(l, p, short_cols, lean, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (sc.t_slots > 0 && sc.t_merge.defined() && sc.t_merge.size(0) > 0) {
    const int64_t R = sc.t_merge.size(0);
    T* first = KIND == GATV2 ? p.d_src : p.d_val;
    if (first) {
      merge_sum_kernel<T, I><<<(unsigned)(R * p.H), kMergeThreads, 0, stream>>>(
          sc.t_merge.data_ptr<I>(), R, p.H, p.F, p.part1, first,
          KIND == GATV2 ? p.ldg_src : p.ldg_val);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (KIND != GATV2) {
      merge_sum_kernel<T, I><<<(unsigned)(R * p.H), kMergeThreads, 0, stream>>>(
          sc.t_merge.data_ptr<I>(), R, p.H, featF, p.part2, p.d_src, p.ldg_src);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
  if (own_src.defined()) o.d_src.copy_(own_src);
  if (own_val.defined()) o.d_val.copy_(own_val);
}

// dtype x index x vector-width dispatch.  The op registration pads feature
// rows to a multiple of a 16- or 8-byte vector (4-byte for GAT in fp16 / bf16,
// and for dot attention's and AGNN's heads of 2, 6 or 10: a width of 2 mod 4
// such as 8 x 10 runs unpadded, no copies) and aligns them
// (dfgnn_ops.cpp: fit_features), so there is no scalar instantiation.
template <int KIND, template <int, typename, typename, int> class Fn, typename... Args>
void dispatch(const GraphArgs& gr, const FeatArgs& fa, Args&&... args) {
  const at::Tensor& v = KIND == GATV2 ? fa.src : fa.val;
  const int64_t F = v.size(2);
  const bool i64 = gr.col.scalar_type() == at::kLong;
  auto go = [&](auto tag) {
    using T = decltype(tag);
    constexpr int VMAX = 16 / sizeof(T);
    constexpr int VMIN = (sizeof(T) == 2 && KIND == GAT) ? VMAX / 4 : VMAX / 2;
    const bool vec_tensors_ok =
        aligned16(fa.val) && (KIND == GAT || (aligned16(fa.dst) && aligned16(fa.src) &&
                                              aligned16(fa.edge) && aligned16(fa.res) &&
                                              (dot_like(KIND) || aligned16(fa.att))));
    // (dot-like fp16 / bf16 heads of 2 mod 4 up to 10: the five-chunk tile of
    // 4-byte vectors, below)
    constexpr bool kHalfX5 = sizeof(T) == 2 && dot_like(KIND);
    const bool half_x5 = kHalfX5 && half_x5_width(sizeof(T), F);
    TORCH_CHECK((F % VMIN == 0 || half_x5) && vec_tensors_ok,
                "pyg_dfgnn: internal error: feature rows not padded/aligned to a vector");
    auto by_index = [&](auto vec) {
      constexpr int V = decltype(vec)::value;
      if (i64) Fn<KIND, T, int64_t, V>::run(gr, fa, args...);
      else Fn<KIND, T, int32_t, V>::run(gr, fa, args...);
    };
    // A wide tile where it covers a head with fewer lanes than the default
    // tile: kWideChunks on 16-byte vectors (AGNN's single head of 80 or 152,
    // the Transformer's heads of 20 = 19 padded), kWide8Chunks on 8-byte ones
    // (fp16 / bf16 heads of 20 or 12, fp32 heads of 10).  Dot-like kinds in
    // every pass; GATv2 too, except the backward of fp16 / bf16 heads on
    // 16-byte vectors (4 x 64: its row pass spilled 550-670 B at 2 blocks and
    // measured 0.98-1.09x the default tile's time on an H200, where its
    // forward took 0.83-0.93x; docs/KERNELS.md, session 23).
    // AGNN's widest heads go further (kAgnnWideChunks) where the wide tile
    // still takes 16 lanes or more: four float4 in fp32 (one head of 128 or
    // 256: 16 -> 8 / 32 -> 16 lanes), in every pass, so that the backward
    // recomputes the forward's scores bit for bit (with the forward alone on
    // them, the float64 tests' fp32 gradients at 256 came out at 5x PyTorch's
    // error: the row pass's scores summed in another order than the lse);
    // three 16-byte ones in fp16 / bf16, in the forward only (152: 16 -> 8
    // lanes; their backward passes spilled 400-1000 B, and the different
    // order is far below half-precision rounding).  Measured on an H200: bf16
    // forward kernel 0.59-0.65x at 152, but at 80 (8 -> 4 lanes) 0.60x /
    // 1.10x / 0.92x on the uniform / power-law / PATTERN graphs, so not below
    // 16 lanes.  Dot attention's and GATv2's forwards (which hold a key or
    // x_dst_i tile besides) spilled 150-380 B with three half-precision
    // chunks: they keep the wide tile.
    constexpr bool kFwd = Fn<KIND, T, int32_t, VMAX>::kForward;
    constexpr int WIDE = VMAX + 16 * kWideChunks<T>;
    constexpr int WIDE8 = VMAX / 2 + 16 * kWide8Chunks;
    constexpr int WIDE8X5 = VMAX / 2 + 16 * kWide8Chunks5;
    constexpr int WIDEST = VMAX + 16 * kAgnnWideChunks<T>;
    auto lanes = [&](int vec) { return choose_group(0, F, vec, KIND); };
    // fp16 / bf16 dot-like heads of 2, 6 or 10 (attention_api.h: half_x5_width)
    // on one lane of five 4-byte vectors, in every pass (the stored column pass
    // too: see VCOL in bwd_impl).  Session 28 ran the forward and row pass on
    // it but the stored column pass on plain 4-byte vectors over four lanes,
    // which took 1.44-1.53x the padded 12's time (docs/KERNELS.md).
    if constexpr (kHalfX5) {
      if (half_x5) {
        by_index(std::integral_constant<int, VMAX / 4 + 16 * kWide8Chunks5>());
        return;
      }
    }
    // GAT's backward gathers features in its column pass alone (the atomic
    // and single-gather modes; the rest is scalar per edge), on a lane group
    // without the forward's minimum of 4 (gat_col_pass).  Heads a multiple of
    // 8 bytes but not of 16 (8 x 10 in fp32, 8 x 19 padded to 20 in fp16 /
    // bf16) take five 8-byte chunks per lane, and half-precision heads a
    // multiple of 4 bytes but not of 8 (8 x 10; every half-precision GAT head
    // is a multiple of 4 bytes, VMIN) five 4-byte ones, where that needs fewer
    // lanes: one lane per head at the paper shapes instead of 4.  Measured on
    // an H200 (docs/KERNELS.md, session 49): the column pass 0.50-0.73x on the
    // uniform and PATTERN graphs, 0.88-1.00x on the power-law one; the wide
    // tile on 16-byte vectors (bf16 4 x 64 on 4 lanes instead of 8, 2 resident
    // blocks) took 1.12x and is not used.  DFGNN_GAT_WIDE_BWD = 0 turns this off.
    if constexpr (KIND == GAT && !kFwd && DFGNN_GAT_WIDE_BWD) {
      auto col_lanes = [&](int vec) { return feature_group(0, F, vec); };
      constexpr int X5 = VMAX / 2 + 16 * kWide8Chunks5;
      if (F % VMAX != 0 && F % (VMAX / 2) == 0) {
        if (col_lanes(X5) < col_lanes(VMAX / 2)) {
          by_index(std::integral_constant<int, X5>());
          return;
        }
      } else if constexpr (sizeof(T) == 2) {
        constexpr int X5N = VMIN + 16 * kWide8Chunks5;
        if (F % (VMAX / 2) != 0 && col_lanes(X5N) < col_lanes(VMIN)) {
          by_index(std::integral_constant<int, X5N>());
          return;
        }
      }
    }
    if constexpr (DFGNN_WIDE_TILES && (dot_like(KIND) || KIND == GATV2)) {
      if (F % VMAX == 0) {
        const int g = std::min(lanes(WIDE), lanes(VMAX));
        if constexpr (KIND == AGNN && (kFwd || sizeof(T) == 4)) {
          if (g >= 16 && lanes(WIDEST) < g) {
            by_index(std::integral_constant<int, WIDEST>());
            return;
          }
        }
        if constexpr (KIND != GATV2 || kFwd || sizeof(T) == 4) {
          if (lanes(WIDE) < lanes(VMAX)) {
            by_index(std::integral_constant<int, WIDE>());
            return;
          }
        }
      } else if constexpr (DFGNN_WIDE8_TILES) {
        if (F % (VMAX / 2) == 0 && lanes(WIDE8) < lanes(VMAX / 2)) {
          if constexpr (sizeof(T) == 4 && DFGNN_WIDE8X5_TILES) {
            if (lanes(WIDE8X5) < lanes(WIDE8)) {
              by_index(std::integral_constant<int, WIDE8X5>());
              return;
            }
          }
          by_index(std::integral_constant<int, WIDE8>());
          return;
        }
      }
    }
    if (F % VMAX == 0) by_index(std::integral_constant<int, VMAX>());
    else if (F % (VMAX / 2) == 0) by_index(std::integral_constant<int, VMAX / 2>());
    else if constexpr (VMIN < VMAX / 2) by_index(std::integral_constant<int, VMIN>());
  };
  switch (v.scalar_type()) {
    case at::kFloat: go(float()); break;
    case at::kHalf: go(c10::Half()); break;
    case at::kBFloat16: go(c10::BFloat16()); break;
    default: TORCH_CHECK(false, "pyg_dfgnn: unsupported dtype ", v.scalar_type());
  }
}

template <int KIND, typename T, typename I, int VEC> struct FwdFn {
  static constexpr bool kForward = true;   // (dispatch: some tiles are forward-only)
  static void run(const GraphArgs& gr, const FeatArgs& fa, const Sched& sc, FwdOut& o) {
    fwd_impl<KIND, T, I, VEC>(gr, fa, sc, o);
  }
};
template <int KIND, typename T, typename I, int VEC> struct BwdFn {
  static constexpr bool kForward = false;
  static void run(const GraphArgs& gr, const FeatArgs& fa, const Sched& sc, const BwdIn& bi,
                  BwdOut& o) {
    bwd_impl<KIND, T, I, VEC>(gr, fa, sc, bi, o);
  }
};

// (a kind's forward and backward in translation units of their own,
// attention_<kind>.cu and attention_<kind>_bwd.cu: the build compiles them in
// parallel, and the backward's instantiations are most of the build's time)
#define DFGNN_INSTANTIATE_FWD(KIND, NAME)                                               \
  void fwd_##NAME(const GraphArgs& gr, const FeatArgs& fa, const Sched& sc, FwdOut& o) { \
    dispatch<KIND, FwdFn>(gr, fa, sc, o);                                               \
  }
#define DFGNN_INSTANTIATE_BWD(KIND, NAME)                                               \
  void bwd_##NAME(const GraphArgs& gr, const FeatArgs& fa, const Sched& sc,             \
                  const BwdIn& bi, BwdOut& o) {                                         \
    dispatch<KIND, BwdFn>(gr, fa, sc, bi, o);                                           \
  }

}  // namespace dfgnn
