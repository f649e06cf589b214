// Fused graph-attention kernels: one templated family for GAT, GATv2 and
// dot-product (Graph Transformer / AGNN) attention on a destination-major CSR.
//
// Thread mapping (level 2 of the schedule): a *group* of G lanes (G in
// {4, 8, 16, 32}, a runtime value) owns one (work item, head).  A work item is
// a destination row or a segment of a super row.  Lanes split the features
// (VEC elements each, 16-byte loads when aligned, kChunks<VEC> vectors per
// tile held in registers).  Edges are walked in one of two ways:
//  * group-per-edge batches (vector scores: dot, GATv2; every backward row
//    pass): all lanes take the same kBatch edges, gather their slices of the
//    batch's key/value rows at once, and butterfly-reduce each score, so every
//    lane holds every score of the batch;
//  * lane-per-edge chunks (GAT's scalar score, forward): lane t loads edge t
//    of a chunk of G and computes its score and exp once; the value rows are
//    then broadcast-gathered.
// Either way an online softmax (running max m and sum l in registers) folds
// the edges in; nothing per edge is written in the forward pass except the
// optional attention weights.
//
// The forward saves the softmax statistics of every (row, head) as two planes,
// lse[0] = the row max m and lse[1] = log(l) with l = sum_j exp(s_ij - m), so
// that alpha = exp((s - m) - log l): the error of the exponent does not grow
// with |m| (a single fp32 m + log l loses log l's digits for large logits).
//
// Backward (FlashAttention-2 style) recomputes alpha from these statistics:
// a row pass accumulates destination-side gradients, a column pass over the
// transposed CSR source-side ones, without atomics; between them each edge's
// g and alpha~ are stored (fp32 [E, H] x 2) or, in recompute mode, recomputed
// from (m_i, log l_i, Delta_i).  GAT, whose score is a scalar, gathers feature
// rows in its column pass only (emit-dP mode and two scalar passes: see
// bwd_gat_row_kernel).  GATv2's row-pass groups take several (item, head)
// pairs of one head on a capped grid and sum its attention vector's gradient
// over them (bwd_row_kernel).
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Half.h>
#include <c10/util/BFloat16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace dfgnn {

// AGNN is dot attention whose keys are the values, scaled per source:
// s_ij = scale c_j <q_i, v_j> with c = the op's att [N_src, H] (AGNN's
// cosine: q = beta x_norm, v = x, c = 1 / |x|), so each edge gathers one row
// (v_j) instead of two; the op runs it for dot attention with a key scale and
// k given as v (cuda/dfgnn_ops.cpp).  Everywhere else it is DOT.
enum Kind : int { GAT = 0, GATV2 = 1, DOT = 2, AGNN = 3 };
__host__ __device__ constexpr bool dot_like(int kind) { return kind == DOT || kind == AGNN; }

constexpr int kThreads = 256;
constexpr int kMaxChunks = 2;  // feature chunks per lane per tile (registers)
// A tile shape, the kernels' VEC template argument: the vector width w (1, 2,
// 4 or 8 elements, one load each), plus 16 x c for a *wide tile* of c chunks
// per lane instead of the default (kChunks).  Everything that sizes or walks
// a lane's vectors uses kW<VEC>; everything that counts them, kChunks<VEC>.
__host__ __device__ constexpr int width_of(int vec) { return vec & 15; }
// Chunks per lane: at most 8 fp32 registers per tile by default, so 16-byte
// fp16/bf16 vectors (8 elements) take one chunk, float4 two.
__host__ __device__ constexpr int chunks_for(int vec) {
  return vec >> 4 ? vec >> 4 : (vec >= 8 ? 1 : kMaxChunks);
}
template <int VEC> constexpr int kW = width_of(VEC);
template <int VEC> constexpr int kChunks = chunks_for(VEC);
// Wide tiles (dot-like kinds and GATv2, wherever they cover a head with fewer
// lanes than the default tile: attention_launch.cuh, dispatch): three float4 chunks
// (fp32) or two 8-element vectors (fp16 / bf16) per lane.  With the default
// chunks a head of F = 152 fp32 (AGNN at 8 x 19) takes a whole warp with 38 of
// 64 float4 slots busy and 5-step butterflies per edge; the wide tile covers
// it with 16 lanes (two rows per warp, 4-step butterflies).  Likewise 20 fp32
// (a Transformer head of 19, padded) 4 -> 2 lanes, 80 fp32 (AGNN at 8 x 10)
// 16 -> 8, 64 bf16 8 -> 4 (docs/KERNELS.md, session 22).  GATv2 (session 23)
// holds x_dst_i and att besides: its wide row pass spills 260-280 B in fp32
// and still measured 0.68-0.76x the default tile's time at heads of 20.
template <typename T> constexpr int kWideChunks = sizeof(T) == 4 ? 3 : 2;
#ifndef DFGNN_WIDE_TILES
#define DFGNN_WIDE_TILES 1
#endif
template <int VEC> constexpr bool kWide = VEC >= 16;
// Wide tiles on 8-byte vectors: a dot-like or GATv2 head whose width is a multiple of
// 8 bytes but not of 16 (fp16 / bf16 heads of 20 or 12, the Transformer's 19
// and 10 padded; fp32 heads of 10 given unpadded to the op) takes three 8-byte
// chunks per lane where that needs fewer lanes than the default two: 20 halves
// 4 -> 2 lanes, 12 halves 2 -> 1, 10 fp32 4 -> 2.  Its tiles hold the fp32
// registers of a float4 wide tile (12 floats) and half its packed rows, so it
// takes the wide tiles' resident blocks too.  DFGNN_WIDE8_TILES = 0 turns it off.
#ifndef DFGNN_WIDE8_TILES
#define DFGNN_WIDE8_TILES 1
#endif
constexpr int kWide8Chunks = 3;
// fp32 heads of 10 (8 x 10 given unpadded to the op) on five 8-byte chunks: one
// lane per head, the registers of a float4 wide tile less two (10 floats
// against the padded 12's), instead of two lanes of three chunks
// (attention_launch.cuh, dispatch; docs/KERNELS.md, session 28).
// DFGNN_WIDE8X5_TILES = 0 turns it off.
#ifndef DFGNN_WIDE8X5_TILES
#define DFGNN_WIDE8X5_TILES 1
#endif
constexpr int kWide8Chunks5 = 5;
// GAT's backward on wide tiles (attention_launch.cuh, dispatch)
#ifndef DFGNN_GAT_WIDE_BWD
#define DFGNN_GAT_WIDE_BWD 1
#endif
// AGNN's widest heads: where the wide tile still takes 16 lanes or more, four
// float4 (fp32, every pass) or three 16-byte vectors (fp16 / bf16, forward
// only) per lane if that takes fewer (attention_launch.cuh, dispatch;
// docs/KERNELS.md, session 23).
template <typename T> constexpr int kAgnnWideChunks = sizeof(T) == 4 ? 4 : 3;
// A wide tile holds 1.5x (fp32) or 2x (fp16 / bf16) the registers of a default
// one: at the default resident blocks ptxas spilled 190-330 B (fp32, forward
// and row pass) and 260-580 B (fp16 / bf16), so every pass of a wide tile
// takes DFGNN_WIDE_BLOCKS resident blocks (2: 128 registers), and the column
// pass DFGNN_WIDE_COL_BATCH edges per batch.  Two rows per warp keep 32 rows
// in flight per SM at 2 blocks, against the default tiles' 24 at 3.
#ifndef DFGNN_WIDE_BLOCKS
#define DFGNN_WIDE_BLOCKS 2
#endif
#ifndef DFGNN_WIDE_COL_BATCH
#define DFGNN_WIDE_COL_BATCH 2
#endif
// ... except on graphs of short columns (mean column length E / N_src up to
// kShortCols, chosen at launch: attention_launch.cuh, launch_col), where the
// fp32 wide tiles' column passes and the fp16 / bf16 recomputing one take one
// edge per batch.  They then compile without spills or with fewer (fp32 alpha
// 88-152 B -> 0, recompute 248-300 -> 0, stored 16-48 -> 0; bf16 recompute
// 192-384 -> 0-132; ptxas, nvcc 13.0, sm_90), and on the 100k-node graphs
// (columns of 14-16 edges) the fp32 column pass took 0.85-0.95x the time
// (recompute 0.67-0.85x); on a PATTERN batch (51 per column) 1.03-1.17x,
// where two gathers in flight per lane group hide more.  Not dot attention's
// fp32 alpha pass on heads of 10 (WIDE8X5): 1.03-1.17x everywhere; nor the
// half-precision alpha pass: 1.07x (H100, docs/KERNELS.md, session 38).  0
// turns it off.
#ifndef DFGNN_SHORT_COL_BATCH
#define DFGNN_SHORT_COL_BATCH 1
#endif
constexpr int64_t kShortCols = 32;
// Resident blocks per SM the compiler must allow (register cap 65536 /
// (kThreads * blocks)): 2 -> 128 registers, 3 -> 80, 4 -> 64.  The kernels
// are latency-bound gathers (docs/KERNELS.md, session 7), so occupancy is
// traded against spills per kernel; DFGNN_*_BLOCKS override them for tuning.
#ifndef DFGNN_FWD_BLOCKS
#define DFGNN_FWD_BLOCKS 0
#endif
#ifndef DFGNN_ROW_BLOCKS
#define DFGNN_ROW_BLOCKS 0
#endif
#ifndef DFGNN_COL_BLOCKS
#define DFGNN_COL_BLOCKS 0
#endif
// fp16 / bf16 kernels hold their gathered rows packed (Packed: half the
// registers of fp32 tiles), which buys them more resident blocks without
// spills: measured on an H100 (docs/KERNELS.md, session 11) against the fp32
// counts, 4 forward blocks (64 registers) for GAT and dot, 3 row-pass blocks
// (80) for GAT and dot, 3 column-pass blocks for all (stored mode; the
// recomputing one spilled 104-160 B at 80 registers and keeps 2): bf16 row
// pass up to -34 %, column pass -10 to -25 %.  GATv2 keeps 3 / 2 (its z tiles
// spilled 276-292 B at 80 registers and measured slower).  DFGNN_HALF_*_BLOCKS
// override them for tuning (0 = these defaults).
#ifndef DFGNN_HALF_FWD_BLOCKS
#define DFGNN_HALF_FWD_BLOCKS 0
#endif
#ifndef DFGNN_HALF_ROW_BLOCKS
#define DFGNN_HALF_ROW_BLOCKS 0
#endif
#ifndef DFGNN_HALF_COL_BLOCKS
#define DFGNN_HALF_COL_BLOCKS 0
#endif
constexpr int blocks_for(bool is_half, int half_forced, int half_dflt, int forced, int dflt) {
  return is_half ? (half_forced ? half_forced : half_dflt) : (forced ? forced : dflt);
}
// GAT holds no key/value batch in its forward (lane-per-edge chunks) and one
// scalar score per edge in its row pass: in fp32 too it fits 4 forward blocks
// (64 registers, 0-16 B of spills) and 3 row-pass blocks (70-76 registers, no
// spills); measured on an H100 (session 11): fp32 forward -1 to -12 %, row pass
// -17 to -23 %.  Dot and GATv2 in fp32 were 10-40 % slower with 4 / 3 blocks
// on a 100k-node graph (spills) and keep 3 / 2.
// AGNN's (tuning: 0 = dot attention's)
#ifndef DFGNN_AGNN_FWD_BLOCKS
#define DFGNN_AGNN_FWD_BLOCKS 0
#endif
#ifndef DFGNN_AGNN_ROW_BLOCKS
#define DFGNN_AGNN_ROW_BLOCKS 0
#endif
// (wide tiles: DFGNN_WIDE_BLOCKS for every pass)
template <int KIND, typename T, int VEC> constexpr int kFwdBlocks =
    kWide<VEC> ? DFGNN_WIDE_BLOCKS :
    KIND == AGNN && DFGNN_AGNN_FWD_BLOCKS ? DFGNN_AGNN_FWD_BLOCKS :
    blocks_for(sizeof(T) == 2, DFGNN_HALF_FWD_BLOCKS, KIND == GATV2 ? 3 : 4, DFGNN_FWD_BLOCKS,
               KIND == GAT ? 4 : 3);
// AGNN's fp32 row pass takes 3 blocks too (80 registers; 0-172 B of spills):
// measured on an H100 (docs/KERNELS.md, session 18) at 1 x 80 fp32, row pass
// 0.91-0.94x on the uniform and power-law 100k graphs and a PATTERN batch.
template <int KIND, typename T, int VEC> constexpr int kRowBlocks =
    kWide<VEC> ? DFGNN_WIDE_BLOCKS :
    KIND == AGNN && DFGNN_AGNN_ROW_BLOCKS ? DFGNN_AGNN_ROW_BLOCKS :
    blocks_for(sizeof(T) == 2, DFGNN_HALF_ROW_BLOCKS, KIND == GATV2 ? 2 : 3, DFGNN_ROW_BLOCKS,
               KIND == GAT || KIND == AGNN ? 3 : 2);
// The dot / GATv2 fp32 instantiations on 8-byte vectors (VEC = 2: 8 x 10,
// 4 x 6, ...) hold half the tile registers of float4's, so their forward fits
// 4 blocks (64 registers) and their row pass 3 (80; dot 24 B of spills, GATv2
// 76 B).  Measured (H100, session 18) at 8 x 10: row pass 0.77-0.79x and
// forward 0.90-0.92x on a PATTERN batch of 128 graphs, but 1.27-1.63x and
// 1.17-2.07x on the 100k-node graphs, whose gathered rows do not fit in L2.
// So those take these counts only on graphs whose gathered rows are
// L2-resident (kL2Bytes, chosen at launch: attention_launch.cuh).
// (not the wide tiles on 8-byte vectors: DFGNN_WIDE_BLOCKS, as every wide tile)
template <int KIND, typename T, int VEC> constexpr bool kNarrowFp32 =
    sizeof(T) == 4 && kW<VEC> == 2 && !kWide<VEC> && (KIND == DOT || KIND == GATV2);
// ... and with L2-resident rows (the `small` launch variant)
template <int KIND, typename T, int VEC> constexpr int kFwdBlocksSmall =
    kNarrowFp32<KIND, T, VEC> && !DFGNN_FWD_BLOCKS ? 4 : kFwdBlocks<KIND, T, VEC>;
template <int KIND, typename T, int VEC> constexpr int kRowBlocksSmall =
    kNarrowFp32<KIND, T, VEC> && !DFGNN_ROW_BLOCKS ? 3 : kRowBlocks<KIND, T, VEC>;
// Gathered feature bytes (source rows the kernels read per edge) up to which a
// graph counts as L2-resident for the variants above: a third of the 50 MB L2
// of an H100 / H200.  Measured at 9.7 MB (PATTERN x128, 8 x 10 fp32 keys and
// values: faster) and 64 MB (100k nodes: slower) only.
constexpr int64_t kL2Bytes = int64_t(16) << 20;
// Column-pass modes (bwd_col_kernel's MODE): read g and pd per edge (stored),
// recompute them from the row statistics and Delta (recompute), or GAT's
// single-gather backward (emit dP): recompute alpha, accumulate d_val and write
// alpha~_ij dP_ij, dP_ij = <dO_i, x_j>, per edge for the scalar passes (bwd_gat_row_kernel,
// bwd_gat_src_kernel) that finish d_dst, d_src and d_edge without gathering a
// feature row again.
// GAT's atomic mode (kColAtomic, see bwd_gat_atomic): as emit-dP, but dS from a
// Delta taken before the pass, d_src summed here and the destination rows'
// sums added atomically, so that nothing per edge is stored.
// The alpha mode (kColAlpha; dot attention's fp32 / fp16 heads under 128 bytes,
// with PYG_DFGNN_ALPHA_MODE=1 also GATv2's and bf16: attention_launch.cuh):
// the row pass stores alpha per edge (fp32, E x H x 4 bytes: half the stored
// mode's; bf16 inputs: bf16, E x H x 2 bytes, half the packed pair's) and its
// Delta per row; this pass forms dP_ij = <dO_i, v_j> from the rows it loads
// anyway (dO_i for d_val, v_j its own: GATv2's value is x_src_j) and g, pd
// from them -- no score and no exponential, unlike the recompute mode.
enum ColMode : int { kColStored = 0, kColRecompute = 1, kColEmitDP = 2, kColAtomic = 3,
                     kColAlpha = 4 };
// (the column pass's edges per batch on short columns, or 0: see
// DFGNN_SHORT_COL_BATCH)
template <typename T, int VEC, int MODE> constexpr int kShortColBatch =
    DFGNN_SHORT_COL_BATCH && kWide<VEC> &&
            (sizeof(T) == 4 ? !(MODE == kColAlpha && VEC == 2 + 16 * kWide8Chunks5)
                            : MODE == kColRecompute)
        ? DFGNN_SHORT_COL_BATCH : 0;
// In the atomic mode, the rows that take the exact Delta (bwd_gat_atomic):
// those one edge dominates, alpha_max =
// 1 / l_i > 1/2 (log l_i < log 2; the forward's lse_l), degree-1 rows among
// them.  In the others no dS can cancel to far below <dO, O>'s rounding (it
// is of the order of that rounding in PyTorch's softmax backward too), and D
// is used as it is, as FlashAttention does.
constexpr float kDominated = 0.69314718f;
// GAT's atomic mode keeps per (destination row, head) kGatAcc floats (32
// bytes, one L2 sector): {X_i, d_dst's term, alpha's factor, D_i (then eps_i)}
// -- the first three summed by the column pass's atomics -- and {m_i, log l_i,
// a_dst_i, D_i}, which row_delta_kernel copies there from the forward's lse
// and the node logits, so that the column pass reads a destination row's
// statistics with one 16-byte load per edge and head instead of four
// scattered scalar loads from four arrays.
constexpr int kGatAcc = 8;
#ifndef DFGNN_GAT_NO_ATOMICS
#define DFGNN_GAT_NO_ATOMICS 0
#endif

// GAT's atomic mode on graphs with hubs: a destination row of in-degree d
// takes up to d atomics per head into the same 32 bytes, which the L2
// serialises (a power-law graph's super node of in-degree 60k: 30k per head,
// where LeakyReLU' != 1).  Rows of in-degree >= Params::hub_min are marked by
// row_delta_kernel in the sign bit of their log l_i (>= 0: l_i >= 1 for a row
// with edges; hub_mark / hub_marked / fabsf), and the lean column pass adds a
// hub's terms to a block-wide HubCache in shared memory: kHubSlots (row, head)
// sums, direct-mapped by a hash of i H + h (one int key per slot, claimed by
// atomicCAS; a slot held by another key sends the term to the global atomic),
// flushed with one 16-byte atomic per slot at the block's end.  A hub of
// in-degree d then takes about one atomic per block whose columns reach it
// instead of one per edge.  Every sum stays fp32, in the atomics' open order.
constexpr int kHubBits = 8, kHubSlots = 1 << kHubBits;
struct HubCache {
  int key[kHubSlots];           // i H + h, or -1 (free)
  float sum[3][kHubSlots];      // the row sums' first three terms
};
__device__ __forceinline__ int hub_slot(uint32_t key) {
  return (int)((key * 0x9E3779B1u) >> (32 - kHubBits));
}
__device__ __forceinline__ float hub_mark(float logl) {
  return __int_as_float(__float_as_int(logl) | (int)0x80000000u);
}
__device__ __forceinline__ bool hub_marked(float v) { return __float_as_int(v) < 0; }
// the block's cache: dynamic shared memory, sizeof(HubCache) bytes, in the
// HUBS instantiation of bwd_col_lean_kernel only (with a static array and the
// hub code in the one lean kernel, the pass took 1.03-1.19x longer on graphs
// without hubs: H200, docs/KERNELS.md, session 50)
__device__ __forceinline__ HubCache& hub_cache() {
  extern __shared__ __align__(16) unsigned char hub_smem[];
  return *reinterpret_cast<HubCache*>(hub_smem);
}

// v.x (where x), v.y and v.z (where yz) added to the row sums at a (16-byte
// aligned): one vector atomic on sm_90+ (with three scalar ones GAT's atomic
// column pass took 1.5x the emit-dP pass in fp32, H200)
__device__ __forceinline__ void gat_acc_add(float* a, float4 v, bool x, bool yz) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(a), v);
#else
  if (x) atomicAdd(a, v.x);
  if (yz) {
    atomicAdd(a + 1, v.y);
    atomicAdd(a + 2, v.z);
  }
#endif
}

// A hub's terms into the block's cache; false where its slot holds another
// (row, head) (the caller adds them with gat_acc_add)
__device__ __forceinline__ bool hub_add(HubCache& hc, uint32_t key, float4 v, bool x, bool yz) {
  const int s = hub_slot(key);
  int held = *reinterpret_cast<volatile int*>(&hc.key[s]);
  if (held < 0) {
    held = atomicCAS(&hc.key[s], -1, (int)key);
    if (held < 0) held = (int)key;
  }
  if (held != (int)key) return false;
  if (x) atomicAdd(&hc.sum[0][s], v.x);
  if (yz) {
    atomicAdd(&hc.sum[1][s], v.y);
    atomicAdd(&hc.sum[2][s], v.z);
  }
  return true;
}

// GAT's emit-dP column pass: 2 resident blocks in fp32, 4 in fp16/bf16
// (packed rows, 2-edge batches: 64 registers); measured on an H100 (session
// 12): fp32 at 3 blocks and bf16 at 2 or 3 were slower
#ifndef DFGNN_EMIT_BLOCKS
#define DFGNN_EMIT_BLOCKS 0
#endif
template <int KIND, typename T, int MODE, int VEC> constexpr int kColBlocks =
    kWide<VEC> ? DFGNN_WIDE_BLOCKS :
    MODE == kColEmitDP ? blocks_for(sizeof(T) == 2, DFGNN_EMIT_BLOCKS, 4, DFGNN_EMIT_BLOCKS, 2) :
    // (the atomic mode waits on its scattered scalar loads and atomics: 4 blocks,
    // 64 registers and 12-180 B of spills, were faster than 3 blocks without
    // spills, and fp32 at 2 blocks took 1.3x the time of 3; H200, session 26;
    // with the rows' statistics in one load (kGatAcc) 3 blocks, 73-80 registers
    // and 0-44 B, took 1.01x (fp32) / 1.07x (bf16) of 4's time: H200, session 43)
    MODE == kColAtomic ? blocks_for(sizeof(T) == 2, DFGNN_EMIT_BLOCKS, 4, DFGNN_EMIT_BLOCKS, 4)
                       // (half precision: the recomputing and alpha passes, which
                       // hold the row pass's operands, at 2 (at 3 the alpha pass
                       // spilled 108-344 B on the default tiles, ptxas, session 37)
                       : blocks_for(sizeof(T) == 2, DFGNN_HALF_COL_BLOCKS,
                                    MODE == kColRecompute || MODE == kColAlpha ? 2 : 3,
                                    DFGNN_COL_BLOCKS, 2);
// resident blocks of GAT's scalar backward passes
#ifndef DFGNN_SCALAR_BLOCKS
#define DFGNN_SCALAR_BLOCKS 4
#endif

// ------------------------------------------------------------------ numerics
template <typename T> __device__ __forceinline__ float to_f(T x) { return static_cast<float>(x); }
template <typename T> __device__ __forceinline__ T from_f(float x) { return static_cast<T>(x); }

template <int BYTES> struct RawVec;
template <> struct RawVec<2> { using type = uint16_t; };
template <> struct RawVec<4> { using type = uint32_t; };
template <> struct RawVec<8> { using type = uint2; };
template <> struct RawVec<16> { using type = uint4; };

template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, float (&v)[kW<VEC>]) {
  if constexpr (kW<VEC> == 1) {
    v[0] = to_f(p[0]);
  } else {
    using R = typename RawVec<sizeof(T) * kW<VEC>>::type;
    R raw = __ldg(reinterpret_cast<const R*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < kW<VEC>; ++k) v[k] = to_f(e[k]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* __restrict__ p, const float (&v)[kW<VEC>]) {
  if constexpr (kW<VEC> == 1) {
    p[0] = from_f<T>(v[0]);
  } else {
    using R = typename RawVec<sizeof(T) * kW<VEC>>::type;
    R raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < kW<VEC>; ++k) e[k] = from_f<T>(v[k]);
    *reinterpret_cast<R*>(p) = raw;
  }
}

__device__ __forceinline__ int imin(int a, int64_t b) { return b < a ? (int)b : a; }
__device__ __forceinline__ float leaky(float z, float slope) { return z > 0.f ? z : z * slope; }
__device__ __forceinline__ float dleaky(float z, float slope) { return z > 0.f ? 1.f : slope; }

// Philox4x32-10 of (counter_lo, counter_hi, 0, 0) keyed by seed; identical to
// pyg_dfgnn.ops.reference.philox_uniform (top 24 bits of the first word).
__device__ __forceinline__ float philox_uniform(uint64_t seed, uint64_t counter) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  return (float)(c0 >> 8) * (1.0f / 16777216.0f);
}

// Stored-mode backward of bf16 inputs: the row pass hands the column pass g
// and pd = alpha~ per (edge, head) as two bf16 halves of one 32-bit word
// (p.ds), not two fp32 arrays: half the per-edge memory of the backward (E x H
// x 4 bytes instead of 8) and of its traffic.  The rounding is of the bf16
// inputs' order (each term of the column pass's sums carries a relative 2^-9,
// where PyTorch's bf16 composition rounds alpha and its products to bf16 too);
// fp16 keeps fp32 pairs (its 2^-11 is finer, and fp16's range would flush small
// g).  GAT's single-gather backward keeps its fp32 array (its Delta sums the
// stored terms).
template <typename T> constexpr bool kPackedEdges = std::is_same<T, c10::BFloat16>::value;
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return (uint32_t)c10::BFloat16(lo).x | ((uint32_t)c10::BFloat16(hi).x << 16);
}
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// ------------------------------------------------------------- lane groups
struct Group {
  int G;          // lanes per (item, head)
  int lg;         // lane index inside the group
  unsigned mask;  // the group's lanes
  __device__ __forceinline__ Group(int g) : G(g) {
    const int lane = threadIdx.x & 31;
    lg = lane & (g - 1);
    mask = g == 32 ? 0xffffffffu : (((1u << g) - 1u) << (lane & ~(g - 1)));
  }
  __device__ __forceinline__ float sum(float v) const {
    for (int o = G >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o, G);
    return v;
  }
  __device__ __forceinline__ float max(float v) const {
    for (int o = G >> 1; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(mask, v, o, G));
    return v;
  }
  template <typename V> __device__ __forceinline__ V bcast(V v, int t) const {
    return __shfl_sync(mask, v, t, G);
  }
};

// --------------------------------------------------------------- parameters
template <typename T, typename I>
struct Params {
  // graph (destination-major CSR) and its transpose
  const I* rowptr; const I* col; const I* perm;
  const I* t_rowptr; const I* t_col; const I* t_perm;
  // work items [W, 4] = (row, begin, end, slot); nullptr = one item per row
  const I* work; int64_t num_items;
  // model inputs ([N, H, F] or [N, H] for GAT's scalars)
  const T* dst; const T* src; const T* val; const T* edge; const T* att;
  const T* bias;       // added to the output in the epilogue, or null: GAT's output bias
                       // [H, F] (the op's att, ld_bias = 0) or dot attention's residual
                       // rows [N_dst, H, F] (FeatArgs::res, ld_bias = its row stride)
  int64_t ld_bias;
  int64_t bias_F;      // features per head of the bias rows: F, or out_F (GAT's bias in the
                       // caller's narrower width, added per element with the narrow store)
  int64_t H, F;        // heads, features of the value (and of q/k for vector scores)
  int G;               // lanes per (item, head)
  int64_t tile;        // features per tile handled by one launch column
  float scale, slope, drop_p;
  uint64_t seed;
  // forward outputs
  T* out; float* lse; float* lse_l; T* alpha;  // lse: row max m, lse_l: log(sum)
  int64_t out_F;       // features per head of out: F, or the caller's width where F is padded
  float *part_acc, *part_m, *part_l;  // split-row partials [S, H, F] / [S, H]
  // backward
  const T* dout; const T* o; const float* lse_in; const float* lse_l_in;
  // Delta_i = <dO_i, O_i> per (row, head) [N, H] fp32 where the caller computed
  // it (a layer op that saved its output, not the attention's: row_delta in
  // attention_dot.cu), else null and the row pass takes it from o
  const float* delta_in;
  float* ds; float* pd;                // per edge [E, H] (CSR order), stored mode
                                       // (bf16 inputs: one array of bf16 pairs: kPackedEdges)
  float* delta;                        // Delta_i the row pass used [N, H] (recompute, alpha modes)
  // GAT's atomic mode (kColAtomic): per (destination row, head) [N_dst, H,
  // kGatAcc] fp32: the sums over the row's edges (the exact Delta, d_dst's
  // terms, the alpha factor of its correction: one 16-byte atomic per edge)
  // and D_i = <dO_i, O_i>, later eps_i; then the row's statistics for the
  // column pass's edges, one 16-byte load (kGatAcc); and d_src before its
  // correction [N_src, H]
  float *gat_acc, *d_src_f;
  // GAT's atomic mode: the in-degree from which a destination row is a hub
  // whose sums the lean column pass collects per block before its atomics
  // (HubCache), or 0 (none; row_delta_kernel marks the hubs' log l_i)
  int64_t hub_min;
  T* d_dst; T* d_src; T* d_val; T* d_edge; float* d_att_part;
  // AGNN (or null): per (launch column, work item, head) [tiles, num_items, H]
  // the row pass's sum_j dS_ij s_ij in fp32 over the column's features (their
  // total: beta times beta's gradient where the scores are
  // linear in beta (ops._AGNNPrologue; from dq rounded to fp16 / bf16 that sum
  // lost the terms' cancellation: 0.28 relative error against float64 on a
  // PATTERN batch at one head of 256, H200, session 29)
  float* score_sum;
  // row strides (elements) of d_dst / d_src / d_val: H times their feature
  // width, or 3 H F where dot attention's gradients of q / k / v are the column
  // blocks of one [N, 3 H F] buffer (dfgnn_ops.cpp: qkv_blocks; the kernels of
  // the other kinds index their contiguous rows, the merges read these)
  int64_t ldg_dst, ldg_src, ldg_val;
  float *part1, *part2;                // partial sums of split items
  // row strides (elements) of dot attention's q / k / v (dst / src / val): H * F,
  // or more for column blocks of one projection GEMM's output (each head's F
  // features contiguous, rows 16-byte aligned: nn/_glue.py, fused_projections).
  // The other kinds' rows are contiguous; their code does not read these.
  int64_t ld_dst, ld_src, ld_val;
  // head strides (elements) of dot attention's k / v (src / val) in the
  // forward passes: F, or 0 where every head reads the same row (k and v
  // broadcast over the heads: a Transformer layer that aggregates x itself and
  // projects after the attention, nn/transformer_conv.py, _factorized; one
  // gathered row of x per edge serves all heads).  q's heads are always F
  // apart; the backward passes read k / v F apart (load_batch: SHARED).
  int64_t hs_src, hs_val;
};

template <typename I>
__device__ __forceinline__ void load_item(const I* work, const I* rowptr, int64_t item,
                                          int64_t& row, int64_t& b, int64_t& e, int64_t& slot) {
  if (work) {
    const I* w = work + item * 4;
    row = w[0]; b = w[1]; e = w[2]; slot = w[3];
  } else {
    row = item; b = rowptr[item]; e = rowptr[item + 1]; slot = -1;
  }
}

// The (work item, head) a lane group owns: row (or source for the column
// pass), its edge range and the partial-result slot (-1: write directly).
struct Item {
  int64_t item, h, row, begin, end, slot;
};

template <typename T, typename I>
__device__ __forceinline__ bool get_item(const Params<T, I>& p, const I* rowptr, Item& it) {
  const int64_t gid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / p.G;
  it.item = gid / p.H;
  it.h = gid % p.H;
  if (it.item >= p.num_items) return false;
  load_item(p.work, rowptr, it.item, it.row, it.begin, it.end, it.slot);
  return true;
}

// The work item a lane group of G = p.G lanes owns with all its heads
// (fwd_gat_rows_kernel; it.h unused)
template <typename T, typename I>
__device__ __forceinline__ bool get_row_item(const Params<T, I>& p, Item& it) {
  it.item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / p.G;
  it.h = 0;
  if (it.item >= p.num_items) return false;
  load_item(p.work, p.rowptr, it.item, it.row, it.begin, it.end, it.slot);
  return true;
}

__device__ __forceinline__ float keep_factor(float drop_p, uint64_t seed, int64_t e, int64_t H,
                                             int64_t h) {
  if (drop_p <= 0.f) return 1.f;
  return philox_uniform(seed, (uint64_t)(e * H + h)) >= drop_p ? 1.f / (1.f - drop_p) : 0.f;
}

// ---------------------------------------------------------- register tiles
// The features of one head a lane holds: chunk c is f0 + c*G*VEC + lg*VEC
// (f < 0: outside the tile or past F).  A launch column (blockIdx.y) owns the
// tile [f0, f0 + tile); `wide` means F does not fit one tile, so full-length
// reductions (scores, dP, Delta) add the features outside it from memory.
template <int VEC>
struct Feat {
  int64_t f[kChunks<VEC>];
  int64_t f0, hi;
  bool wide;
  __device__ __forceinline__ Feat(const Group& g, int64_t f0_, int64_t tile, int64_t F)
      : f0(f0_), hi(f0_ + tile), wide(tile < F) {
#pragma unroll
    for (int c = 0; c < kChunks<VEC>; ++c) {
      const int64_t x = f0 + (int64_t)c * g.G * kW<VEC> + (int64_t)g.lg * kW<VEC>;
      f[c] = (x < F && x < hi) ? x : -1;
    }
  }
};

template <typename T, int VEC>
__device__ __forceinline__ void load_tile(const Feat<VEC>& ft, const T* __restrict__ row,
                                          float (&x)[kChunks<VEC>][kW<VEC>]) {
#pragma unroll
  for (int c = 0; c < kChunks<VEC>; ++c) {
    if (ft.f[c] >= 0) load_vec<T, VEC>(row + ft.f[c], x[c]);
    else {
#pragma unroll
      for (int k = 0; k < kW<VEC>; ++k) x[c][k] = 0.f;
    }
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void add_tile(const Feat<VEC>& ft, const T* __restrict__ row,
                                         float (&x)[kChunks<VEC>][kW<VEC>]) {
  float y[kChunks<VEC>][kW<VEC>];
  load_tile<T, VEC>(ft, row, y);
#pragma unroll
  for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
    for (int k = 0; k < kW<VEC>; ++k) x[c][k] += y[c][k];
}

template <typename T, int VEC>
__device__ __forceinline__ void store_tile(const Feat<VEC>& ft, T* __restrict__ row,
                                           const float (&x)[kChunks<VEC>][kW<VEC>]) {
#pragma unroll
  for (int c = 0; c < kChunks<VEC>; ++c)
    if (ft.f[c] >= 0) store_vec<T, VEC>(row + ft.f[c], x[c]);
}

template <int VEC>
__device__ __forceinline__ void zero_tile(float (&x)[kChunks<VEC>][kW<VEC>]) {
#pragma unroll
  for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
    for (int k = 0; k < kW<VEC>; ++k) x[c][k] = 0.f;
}

// Lane partial of a pair term over one (row, source, head):
//   LEAKY = false: <x, y (+ e)>               (dot scores, dP, Delta)
//   LEAKY = true:  <w, LeakyReLU(x + y (+ e))> (GATv2 scores)
// over the features f = lg*VEC + m*G*VEC with f outside [lo, hi).
template <bool LEAKY, typename T, int VEC>
__device__ __forceinline__ float pair_part(const Group& g, const T* x, const T* y, const T* e,
                                           const T* w, int64_t F, int64_t lo, int64_t hi,
                                           float slope) {
  float part = 0.f;
  for (int64_t f = (int64_t)g.lg * kW<VEC>; f < F; f += (int64_t)g.G * kW<VEC>) {
    if (f >= lo && f < hi) continue;
    float a[kW<VEC>], b[kW<VEC>];
    load_vec<T, VEC>(x + f, a);
    load_vec<T, VEC>(y + f, b);
    if (e) {
      float c[kW<VEC>];
      load_vec<T, VEC>(e + f, c);
#pragma unroll
      for (int k = 0; k < kW<VEC>; ++k) b[k] += c[k];
    }
    if constexpr (LEAKY) {
      float ww[kW<VEC>];
      load_vec<T, VEC>(w + f, ww);
#pragma unroll
      for (int k = 0; k < kW<VEC>; ++k) part += ww[k] * leaky(a[k] + b[k], slope);
    } else {
#pragma unroll
      for (int k = 0; k < kW<VEC>; ++k) part += a[k] * b[k];
    }
  }
  return part;
}

// Lane partial of <x, y> over the register tiles.
template <int VEC>
__device__ __forceinline__ float tile_dot(const float (&x)[kChunks<VEC>][kW<VEC>],
                                          const float (&y)[kChunks<VEC>][kW<VEC>]) {
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
    for (int k = 0; k < kW<VEC>; ++k) s += x[c][k] * y[c][k];
  return s;
}

// Packed tiles: a gathered row tile kept as loaded, VEC elements of T per
// chunk in raw vector registers, converted to fp32 where it is used.  For
// fp32 this is the same registers as a float tile; for fp16 / bf16 it is half,
// which those kernels spend on resident blocks (kFwdBlocks & co.): the kernels
// are latency-bound gathers (docs/KERNELS.md, session 7), and a float tile of
// converted half-precision elements made bf16 batches as costly in registers
// as fp32 ones while moving half the bytes.
template <typename T, int VEC>
struct Packed {
  using R = typename RawVec<sizeof(T) * kW<VEC>>::type;
  R r[kChunks<VEC>];
  __device__ __forceinline__ float at(int c, int k) const {
    return to_f(reinterpret_cast<const T*>(&r[c])[k]);
  }
};

template <typename T, int VEC>
__device__ __forceinline__ void load_packed(const Feat<VEC>& ft, const T* __restrict__ row,
                                            Packed<T, VEC>& x) {
  using R = typename Packed<T, VEC>::R;
#pragma unroll
  for (int c = 0; c < kChunks<VEC>; ++c) {
    if (ft.f[c] >= 0) x.r[c] = __ldg(reinterpret_cast<const R*>(row + ft.f[c]));
    else x.r[c] = R{};   // zero bits: 0.0 in every element type
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void zero_packed(Packed<T, VEC>& x) {
#pragma unroll
  for (int c = 0; c < kChunks<VEC>; ++c) x.r[c] = typename Packed<T, VEC>::R{};
}

// The fp32 tile of a packed one.
template <typename T, int VEC>
__device__ __forceinline__ void unpack(const Packed<T, VEC>& x, float (&y)[kChunks<VEC>][kW<VEC>]) {
#pragma unroll
  for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
    for (int k = 0; k < kW<VEC>; ++k) y[c][k] = x.at(c, k);
}

// Lane partial of <x, y> with y packed.
template <typename T, int VEC>
__device__ __forceinline__ float tile_dot(const float (&x)[kChunks<VEC>][kW<VEC>],
                                          const Packed<T, VEC>& y) {
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
    for (int k = 0; k < kW<VEC>; ++k) s += x[c][k] * y.at(c, k);
  return s;
}

// ------------------------------------------------------------ edge batches
// A group walks its edge range in batches of kBatch edges.  Every lane of the
// group loads the same indices (one broadcast transaction) and its slice of
// the batch's feature rows, so kBatch independent gathers per lane are in
// flight; the per-edge reductions are butterflies, after which every lane
// holds every score of the batch (bit-identical across lanes), so the online
// softmax needs no further communication.
// Edges per batch.  2: with 3 resident forward blocks (80 registers) the
// kernels hide the gathers' latency by occupancy rather than by edges in
// flight per group; measured on an H200 against 4 edges at 2 blocks
// (docs/KERNELS.md, session 7): dot forward bf16 -22%, GATv2 forward -14%
// (fp32) / -27% (bf16), backward row pass -4 to -13%.  (8 spilled.)
// fp16 / bf16 batches hold their rows packed (Packed: half the registers of
// fp32 tiles).  Spending that on 4 edges per batch spilled (ptxas: 136-196 B
// in the forward) and was slower than 2 on an H100 (session 11: bf16 forward
// -11 %, row pass -5 % with 2), so the packing buys fewer registers and no
// spills at the same batch; DFGNN_HALF_BATCH stays a tunable.
#ifndef DFGNN_BATCH
#define DFGNN_BATCH 2
#endif
#ifndef DFGNN_HALF_BATCH
#define DFGNN_HALF_BATCH 2
#endif
// AGNN gathers one row per edge where dot attention gathers two (key and
// value); ncu on an H200 (session 15) put its forward at 31 % of DRAM
// bandwidth against the Transformer's 64 %, but more edges per batch did not
// help: 3 edges +1-3 % kernel time, 4 edges at 2 resident blocks +25-50 %
// (forward).  DFGNN_AGNN_BATCH / DFGNN_AGNN_*_BLOCKS stay tunables (defaults:
// dot attention's).
#ifndef DFGNN_AGNN_BATCH
#define DFGNN_AGNN_BATCH 2
#endif
template <int KIND, typename T> constexpr int kBatch =
    KIND == AGNN ? DFGNN_AGNN_BATCH : (sizeof(T) == 2 ? DFGNN_HALF_BATCH : DFGNN_BATCH);
// Edges per batch of the column pass, which gathers two rows per edge (dO_i
// and q_i / x_dst_i) except for GAT (dO_i only).  Recomputing alpha and dS
// holds more per edge: 4 edges spilled 232-340 B for dot (ptxas); GATv2's z
// tiles spilled 224-276 B at 4 edges in either mode.
#ifndef DFGNN_COL_BATCH
#define DFGNN_COL_BATCH 0
#endif
// fp16 / bf16 hold the gathered rows packed (half the registers); a tunable
// DFGNN_HALF_COL_SCALE multiplies their column batch (2 was 4-11 % slower on
// PATTERN batches on an H100, session 11, and spilled in recompute mode).
#ifndef DFGNN_HALF_COL_SCALE
#define DFGNN_HALF_COL_SCALE 1
#endif
// GAT's emit-dP column pass: 2 edges (measured on an H100, session 12:
// the backward 10 % faster than with 4 in fp32, 8 % in bf16).
#ifndef DFGNN_EMIT_BATCH
#define DFGNN_EMIT_BATCH 2
#endif

// (RECOMPUTE: the recomputing passes' count, which the fp32 alpha pass on the
// default float4 tiles takes too: at dot attention's 4 edges it spilled 180-192 B
// (float4, 128 registers) and at 2 none; its column pass took 0.65-0.69x the
// time, the layer's GPU forward+backward 0.90-0.93x, the Transformer at 8x8 and
// 4x16 fp32 on the three bench graphs (H100, docs/KERNELS.md, session 38).
// fp16 at 2 (8x8, no spills at 4) took 1.11-1.15x: half precision keeps 4, as
// do fp32's 8-byte tiles, which do not spill at 4 and were not timed at 2)
template <int KIND, bool RECOMPUTE, typename T> constexpr int kColBatch =
    (DFGNN_COL_BATCH ? DFGNN_COL_BATCH
                     : (KIND == GAT ? (RECOMPUTE ? 4 : 8) : (dot_like(KIND) && !RECOMPUTE ? 4 : 2))) *
    (sizeof(T) == 2 ? DFGNN_HALF_COL_SCALE : 1);

// The edge term's tile of original edge eo (zeros without edge features or
// past the batch's end).
template <typename T, typename I, int VEC>
__device__ __forceinline__ void edge_tile(const Params<T, I>& p, const Feat<VEC>& ft, int64_t h,
                                          int64_t eo, bool ok, float (&x)[kChunks<VEC>][kW<VEC>]) {
  if (p.edge && ok) load_tile<T, VEC>(ft, p.edge + (eo * p.H + h) * p.F, x);
  else zero_tile<VEC>(x);
}

// Per (row, head) operands held in registers for the whole row.
template <int KIND, int VEC>
struct RowOps {
  float xi[kChunks<VEC>][kW<VEC>];  // q_i (dot) or x_dst_i (GATv2)
  float at[kChunks<VEC>][kW<VEC>];  // att (GATv2)
  float a_dst;                // a_dst_i (GAT)
};

template <int KIND, typename T, typename I, int VEC>
__device__ __forceinline__ void load_row_ops(const Params<T, I>& p, const Feat<VEC>& ft, int64_t row,
                                             int64_t h, RowOps<KIND, VEC>& r) {
  r.a_dst = 0.f;
  if constexpr (KIND == GAT) {
    r.a_dst = to_f(p.dst[row * p.H + h]);
  } else {
    if constexpr (dot_like(KIND)) load_tile<T, VEC>(ft, p.dst + row * p.ld_dst + h * p.F, r.xi);
    else load_tile<T, VEC>(ft, p.dst + (row * p.H + h) * p.F, r.xi);
    if constexpr (KIND == GATV2) load_tile<T, VEC>(ft, p.att + h * p.F, r.at);
  }
}

// One batch of edges at CSR positions base .. base + n - 1 of a row.  The
// gathered rows stay packed (the edge term e_ij of dot attention, which is
// added to keys and values, is loaded where it is used: dot_row / value_row).
template <int KIND, typename T, typename I, int VEC>
struct Batch {
  static constexpr int B = kBatch<KIND, T>;
  int n;
  int64_t base;                  // CSR position of edge 0 (edge t: base + t)
  I j[B], eo[B];                 // sources and original edge ids
  Packed<T, VEC> v[B];                   // value rows
  Packed<T, VEC> k[KIND == DOT ? B : 1];  // key rows, dot only (AGNN's are its value rows)
  float c[KIND == AGNN ? B : 1];          // AGNN: the key scales c_j
  float s[B], z[B];              // scores (GAT: and z)
  float dP[B];                   // backward: <dO_i, v_j>
  __device__ __forceinline__ const Packed<T, VEC>& key(int t) const {
    if constexpr (KIND == AGNN) return v[t];
    else return k[t];
  }
};

// AGNN's key scale c_j (the op's att [N_src, H]); 1 for the other kinds.
template <int KIND, typename T, typename I>
__device__ __forceinline__ float key_scale(const Params<T, I>& p, int64_t j, int64_t h) {
  if constexpr (KIND == AGNN) return to_f(p.att[j * p.H + h]);
  else return 1.f;
}

// Lane partial of <x, row (+ e_ij)> for a packed gathered row; the edge term
// only for dot attention with edge features (e_ij added to keys and values).
template <int KIND, typename T, typename I, int VEC>
__device__ __forceinline__ float dot_row(const Params<T, I>& p, const Feat<VEC>& ft, int64_t h,
                                         int64_t eo, bool ok, const float (&x)[kChunks<VEC>][kW<VEC>],
                                         const Packed<T, VEC>& row) {
  if (dot_like(KIND) && p.edge && ok) {
    float e[kChunks<VEC>][kW<VEC>];
    load_tile<T, VEC>(ft, p.edge + (eo * p.H + h) * p.F, e);
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
      for (int q = 0; q < kW<VEC>; ++q) s += x[c][q] * (row.at(c, q) + e[c][q]);
    return s;
  }
  return tile_dot<T, VEC>(x, row);
}

// The fp32 value row (+ e_ij for dot attention with edge features).
template <int KIND, typename T, typename I, int VEC>
__device__ __forceinline__ void value_row(const Params<T, I>& p, const Feat<VEC>& ft, int64_t h,
                                          int64_t eo, bool ok, const Packed<T, VEC>& row,
                                          float (&v)[kChunks<VEC>][kW<VEC>]) {
  unpack<T, VEC>(row, v);
  if (dot_like(KIND) && p.edge && ok) add_tile<T, VEC>(ft, p.edge + (eo * p.H + h) * p.F, v);
}

// VALUES = false skips the value rows where the score does not need them
// (the attention-weight pass).  SHARED: the forward passes, which read dot
// attention's k / v heads Params::hs_* apart (0: one row for all heads); the
// backward's passes index them F apart (the op gives them copies of shared
// rows, dfgnn_ops.cpp: attention_bwd_impl), which kept the recomputing
// passes' registers as they were.
template <int KIND, typename T, typename I, int VEC, bool VALUES = true, bool SHARED = true>
__device__ __forceinline__ void load_batch(const Params<T, I>& p, const Feat<VEC>& ft, int64_t h,
                                           int64_t base, int64_t end, bool need_eo,
                                           Batch<KIND, T, I, VEC>& b) {
  constexpr int B = Batch<KIND, T, I, VEC>::B;
  b.n = (int)imin(B, end - base);
  b.base = base;
#pragma unroll
  for (int t = 0; t < B; ++t) {
    const bool ok = t < b.n;
    b.j[t] = ok ? p.col[base + t] : I(0);
    b.eo[t] = (ok && need_eo) ? (p.perm ? p.perm[base + t] : I(base + t)) : I(0);
  }
#pragma unroll
  for (int t = 0; t < B; ++t) {
    const bool ok = t < b.n;
    if constexpr (dot_like(KIND)) {   // (row-strided q / k / v)
      const int64_t j = (int64_t)b.j[t];
      // (AGNN: the value rows are the keys, so they are loaded either way)
      if (ok && (VALUES || KIND == AGNN))
        load_packed<T, VEC>(ft, p.val + j * p.ld_val + h * (SHARED ? p.hs_val : p.F), b.v[t]);
      else zero_packed<T, VEC>(b.v[t]);
      if constexpr (KIND == DOT) {
        if (ok) load_packed<T, VEC>(ft, p.src + j * p.ld_src + h * (SHARED ? p.hs_src : p.F), b.k[t]);
        else zero_packed<T, VEC>(b.k[t]);
      }
      // (issued with the rows: loaded after the score's butterfly, the scale's
      // latency came on top of the gather's)
      if constexpr (KIND == AGNN) b.c[t] = ok ? key_scale<KIND>(p, j, h) : 1.f;
    } else {
      const int64_t off = ((int64_t)b.j[t] * p.H + h) * p.F;
      if (ok && (VALUES || KIND == GATV2)) load_packed<T, VEC>(ft, p.val + off, b.v[t]);
      else zero_packed<T, VEC>(b.v[t]);
    }
  }
}

// Scores of the batch (-inf past its end); GAT also keeps the pre-activation z.
// (SHARED: as in load_batch)
template <int KIND, typename T, typename I, int VEC, bool SHARED = true>
__device__ __forceinline__ void batch_scores(const Params<T, I>& p, const Group& g,
                                             const Feat<VEC>& ft, int64_t row, int64_t h,
                                             const RowOps<KIND, VEC>& r, Batch<KIND, T, I, VEC>& b) {
  constexpr int B = Batch<KIND, T, I, VEC>::B;
  float part[B];
#pragma unroll
  for (int t = 0; t < B; ++t) {
    part[t] = 0.f;
    b.z[t] = 0.f;
    if constexpr (KIND == GAT) {
      if (t < b.n) {
        float z = to_f(p.src[b.j[t] * p.H + h]) + r.a_dst;
        if (p.edge) z += to_f(p.edge[b.eo[t] * p.H + h]);
        b.z[t] = z;
      }
    } else if constexpr (dot_like(KIND)) {
      part[t] = dot_row<KIND, T, I, VEC>(p, ft, h, b.eo[t], t < b.n, r.xi, b.key(t));
    } else {  // GATV2: the score operand is x_src_j (+ x_edge), the value x_src_j
      float ev[kChunks<VEC>][kW<VEC>];
      edge_tile<T, I, VEC>(p, ft, h, b.eo[t], t < b.n, ev);
#pragma unroll
      for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
        for (int q = 0; q < kW<VEC>; ++q)
          part[t] += r.at[c][q] * leaky(r.xi[c][q] + b.v[t].at(c, q) + ev[c][q], p.slope);
    }
    if (KIND != GAT && ft.wide && t < b.n) {
      const int64_t F = p.F;
      const T* e = p.edge ? p.edge + ((int64_t)b.eo[t] * p.H + h) * F : nullptr;
      if constexpr (dot_like(KIND))
        part[t] += pair_part<false, T, VEC>(g, p.dst + row * p.ld_dst + h * F,
                                            p.src + (int64_t)b.j[t] * p.ld_src +
                                                h * (SHARED ? p.hs_src : F), e,
                                            nullptr, F, ft.f0, ft.hi, p.slope);
      else
        part[t] += pair_part<KIND == GATV2, T, VEC>(g, p.dst + (row * p.H + h) * F,
                                                    p.src + ((int64_t)b.j[t] * p.H + h) * F, e,
                                                    KIND == GATV2 ? p.att + h * F : nullptr, F,
                                                    ft.f0, ft.hi, p.slope);
    }
  }
#pragma unroll
  for (int t = 0; t < B; ++t) {
    float s;
    if constexpr (KIND == GAT) s = leaky(b.z[t], p.slope);
    else if constexpr (KIND == AGNN) s = g.sum(part[t]) * (p.scale * b.c[t]);
    else s = g.sum(part[t]) * (dot_like(KIND) ? p.scale : 1.f);
    b.s[t] = t < b.n ? s : -INFINITY;
  }
}

// dP of the batch (b.dP): <dO_i, v_j (+ e_ij for dot)> over all features.
template <int KIND, typename T, typename I, int VEC>
__device__ __forceinline__ void batch_dP(const Params<T, I>& p, const Group& g, const Feat<VEC>& ft,
                                         int64_t h, const float (&dO)[kChunks<VEC>][kW<VEC>],
                                         const T* dO_row, Batch<KIND, T, I, VEC>& b) {
  constexpr int B = Batch<KIND, T, I, VEC>::B;
#pragma unroll
  for (int t = 0; t < B; ++t) {
    float part = dot_row<KIND, T, I, VEC>(p, ft, h, b.eo[t], t < b.n, dO, b.v[t]);
    if (ft.wide && t < b.n) {
      const T* e = (dot_like(KIND) && p.edge) ? p.edge + ((int64_t)b.eo[t] * p.H + h) * p.F : nullptr;
      if constexpr (dot_like(KIND))
        part += pair_part<false, T, VEC>(g, dO_row, p.val + (int64_t)b.j[t] * p.ld_val + h * p.F,
                                         e, nullptr, p.F, ft.f0, ft.hi, 0.f);
      else
        part += pair_part<false, T, VEC>(g, dO_row, p.val + ((int64_t)b.j[t] * p.H + h) * p.F, e, nullptr,
                                         p.F, ft.f0, ft.hi, 0.f);
    }
    b.dP[t] = part;
  }
#pragma unroll
  for (int t = 0; t < B; ++t) b.dP[t] = g.sum(b.dP[t]);
}

// One batch of the backward row pass: indices, rows, scores and dP.
template <int KIND, typename T, typename I, int VEC>
__device__ __forceinline__ void bwd_batch(const Params<T, I>& p, const Group& g,
                                          const Feat<VEC>& ft, const Item& it,
                                          const RowOps<KIND, VEC>& r,
                                          const float (&dO)[kChunks<VEC>][kW<VEC>], const T* dO_row,
                                          int64_t base, Batch<KIND, T, I, VEC>& b) {
  load_batch<KIND, T, I, VEC, true, false>(p, ft, it.h, base, it.end, p.edge != nullptr, b);
  batch_scores<KIND, T, I, VEC, false>(p, g, ft, it.row, it.h, r, b);
  batch_dP<KIND, T, I, VEC>(p, g, ft, it.h, dO, dO_row, b);
}

// Result of one (item, head): the normalised row (and its lse) or, for a
// segment of a split row, the partial (m, l, acc).
template <typename T, typename I, int VEC>
__device__ __forceinline__ void write_row(const Params<T, I>& p, const Group& g, const Feat<VEC>& ft,
                                          const Item& it, float m, float l,
                                          float (&acc)[kChunks<VEC>][kW<VEC>]) {
  const int64_t h = it.h, row = it.row, slot = it.slot;
  if (slot < 0) {
    const float inv = 1.f / (l + 1e-16f);
#pragma unroll
    for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
      for (int k = 0; k < kW<VEC>; ++k) acc[c][k] *= inv;
    // (a row without edges: b)
    if (p.bias && p.bias_F == p.F) add_tile<T, VEC>(ft, p.bias + row * p.ld_bias + h * p.F, acc);
    if (p.out_F == p.F) {
      store_tile<T, VEC>(ft, p.out + (row * p.H + h) * p.F, acc);
    } else {   // the caller's narrower rows: the padding columns are not written
      T* o = p.out + (row * p.H + h) * p.out_F;
      // (two copies of the loop: a per-element test for the bias made GAT
      // 8 x 19's forward kernel 1-2.6 % slower where it has none, H200, session 25)
      if (p.bias && p.bias_F != p.F) {
        const T* b = p.bias + h * p.bias_F;
#pragma unroll
        for (int c = 0; c < kChunks<VEC>; ++c) {
          if (ft.f[c] < 0) continue;
#pragma unroll
          for (int k = 0; k < kW<VEC>; ++k)
            if (ft.f[c] + k < p.out_F) o[ft.f[c] + k] = from_f<T>(acc[c][k] + to_f(b[ft.f[c] + k]));
        }
      } else {
#pragma unroll
        for (int c = 0; c < kChunks<VEC>; ++c) {
          if (ft.f[c] < 0) continue;
#pragma unroll
          for (int k = 0; k < kW<VEC>; ++k)
            if (ft.f[c] + k < p.out_F) o[ft.f[c] + k] = from_f<T>(acc[c][k]);
        }
      }
    }
    if (blockIdx.y == 0 && g.lg == 0) {
      const bool any = it.end > it.begin;
      p.lse[row * p.H + h] = any ? m : -INFINITY;
      p.lse_l[row * p.H + h] = any ? logf(l) : 0.f;
    }
  } else {
#pragma unroll
    for (int c = 0; c < kChunks<VEC>; ++c) {
      if (ft.f[c] < 0) continue;
#pragma unroll
      for (int k = 0; k < kW<VEC>; ++k) p.part_acc[(slot * p.H + h) * p.F + ft.f[c] + k] = acc[c][k];
    }
    if (blockIdx.y == 0 && g.lg == 0) {
      p.part_m[slot * p.H + h] = m;
      p.part_l[slot * p.H + h] = l;
    }
  }
}

// =============================================================== forward
// Online-softmax state of one (item, head): running max m, sum l, and the
// lane's slice of the un-normalised output.
template <int VEC>
struct Softmax {
  float m = -INFINITY, l = 0.f;
  float acc[kChunks<VEC>][kW<VEC>];
  __device__ __forceinline__ Softmax() { zero_tile<VEC>(acc); }
  // New running max nm: rescale what was accumulated so far.
  __device__ __forceinline__ void rescale(float nm) {
    const float corr = expf(m - nm);
    l *= corr;
#pragma unroll
    for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
      for (int k = 0; k < kW<VEC>; ++k) acc[c][k] *= corr;
    m = nm;
  }
  __device__ __forceinline__ void add(float w, const float (&v)[kChunks<VEC>][kW<VEC>]) {
#pragma unroll
    for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
      for (int k = 0; k < kW<VEC>; ++k) acc[c][k] += w * v[c][k];
  }
};

// Scalar scores (GAT): lanes own edges.  Edges are consumed in chunks of G;
// lane t loads the index of edge base + t and computes its score and exp once,
// a group max/sum updates the softmax, then the value rows of the chunk are
// broadcast-gathered.  Measured on the H200 (docs/KERNELS.md): 25% faster for
// GAT than the group-per-edge batches, whose per-edge index/score work every
// lane would repeat.
template <typename T, typename I, int VEC>
__device__ __forceinline__ void fwd_lane_edges(const Params<T, I>& p, const Group& g,
                                               const Feat<VEC>& ft, const Item& it, float a_dst,
                                               Softmax<VEC>& sm) {
  const int64_t h = it.h;
  for (int64_t base = it.begin; base < it.end; base += g.G) {
    const int64_t e = base + g.lg;
    const bool valid = e < it.end;
    const int64_t j = valid ? (int64_t)p.col[e] : 0;
    float s = -INFINITY;
    if (valid) {
      float z = to_f(p.src[j * p.H + h]) + a_dst;
      if (p.edge) z += to_f(p.edge[(p.perm ? (int64_t)p.perm[e] : e) * p.H + h]);
      s = leaky(z, p.slope);
    }
    sm.rescale(fmaxf(sm.m, g.max(s)));
    const float pe = valid ? expf(s - sm.m) : 0.f;
    sm.l += g.sum(pe);
    const float w = valid ? pe * keep_factor(p.drop_p, p.seed, e, p.H, h) : 0.f;
    const int cnt = (int)imin(g.G, it.end - base);
#pragma unroll 4
    for (int t = 0; t < cnt; ++t) {
      const int64_t jt = g.bcast(j, t);
      float v[kChunks<VEC>][kW<VEC>];
      load_tile<T, VEC>(ft, p.val + (jt * p.H + h) * p.F, v);
      sm.add(g.bcast(w, t), v);
    }
  }
}

// Vector scores (dot, GATv2): the group owns edges.  Batches of kBatch edges;
// every lane holds every (butterfly-reduced) score of the batch.
template <int KIND, typename T, typename I, int VEC>
__device__ __forceinline__ void fwd_group_edges(const Params<T, I>& p, const Group& g,
                                                const Feat<VEC>& ft, const Item& it,
                                                const RowOps<KIND, VEC>& r, Softmax<VEC>& sm) {
  const int64_t h = it.h;
  using Bt = Batch<KIND, T, I, VEC>;
  for (int64_t base = it.begin; base < it.end; base += Bt::B) {
    Bt b;
    load_batch<KIND, T, I, VEC>(p, ft, h, base, it.end, p.edge != nullptr, b);
    batch_scores<KIND, T, I, VEC>(p, g, ft, it.row, h, r, b);
    float mx = sm.m;
#pragma unroll
    for (int t = 0; t < Bt::B; ++t) mx = fmaxf(mx, b.s[t]);
    sm.rescale(mx);
#pragma unroll
    for (int t = 0; t < Bt::B; ++t) {
      const bool ok = t < b.n;
      const float pe = ok ? expf(b.s[t] - sm.m) : 0.f;
      sm.l += pe;
      float v[kChunks<VEC>][kW<VEC>];
      value_row<KIND, T, I, VEC>(p, ft, h, b.eo[t], ok, b.v[t], v);
      sm.add(pe * keep_factor(p.drop_p, p.seed, b.base + t, p.H, h), v);
    }
  }
}

// BLOCKS: the resident blocks the register budget allows (kFwdBlocks, or
// kFwdBlocksSmall for L2-resident graphs)
template <int KIND, typename T, typename I, int VEC, int BLOCKS>
__global__ void __launch_bounds__(kThreads, BLOCKS) fwd_kernel(const Params<T, I> p) {
  const Group g(p.G);
  Item it;
  if (!get_item(p, p.rowptr, it)) return;
  const Feat<VEC> ft(g, (int64_t)blockIdx.y * p.tile, p.tile, p.F);
  RowOps<KIND, VEC> r;
  load_row_ops<KIND, T, I, VEC>(p, ft, it.row, it.h, r);
  Softmax<VEC> sm;
  if constexpr (KIND == GAT) fwd_lane_edges<T, I, VEC>(p, g, ft, it, r.a_dst, sm);
  else fwd_group_edges<KIND, T, I, VEC>(p, g, ft, it, r, sm);
  write_row<T, I, VEC>(p, g, ft, it, sm.m, sm.l, sm.acc);
}

// ---------------------------------------------------- lean vector forward
// The forward of a call without edge features or dropout whose heads fit
// one tile (a launch column), vector scores (dot attention, AGNN, GATv2) and
// GAT's (fwd_lean_lane_edges, below; session 48): fwd_kernel's
// arithmetic in the same order -- the same lane slices, butterflies, online
// softmax and epilogue, so its output and lse are fwd_kernel's bit for bit
// (tests/ops/test_lean_kernels.py) -- without the code of what such a call
// does not have.  ncu on an H200 (docs/KERNELS.md, session 47) had
// fwd_kernel's fp32 4 x 64 dot forward issue-bound (66 % of issue slots,
// ~250 warp instructions per edge for 8 features per lane): a group size
// known only at run time made every butterfly a loop with a convergence check
// per step (the shuffles' lane mask is the group's), and the edge-feature,
// wide-tile, dropout and permutation paths sat in every batch.  Here every
// lane of a warp walks the warp's largest batch count, so the butterflies
// run on the full warp mask, unrolled; batches past a group's end load
// nothing and leave its softmax state alone; the rescale is skipped where the
// batch does not raise the row's max (multiplying by expf(0) = 1 is exact).
// Measured on an H200 (session 47, the layers' no-grad forward): the
// attention kernel 0.54-0.96x fwd_kernel's time, 0.61x at the Transformer's
// 4 x 64 fp32 on the uniform 100k graph.
//
// A lane's chunk offsets in one head's row as 32-bit numbers (a head's row is
// short; -1: outside the tile), held in registers: from Feat's 64-bit ones the
// compiler re-derived them from the lane id and the tile bounds in every
// batch (~12 instructions per chunk and edge), which the empty asm (an opaque
// definition) rules out.
template <int VEC>
struct LaneOffsets {
  int f[kChunks<VEC>];
  LaneOffsets() = default;   // (unset: a kernel's plain instantiation, which does not use them)
  __device__ __forceinline__ explicit LaneOffsets(const Feat<VEC>& ft) {
#pragma unroll
    for (int c = 0; c < kChunks<VEC>; ++c) {
      f[c] = ft.f[c] >= 0 ? (int)ft.f[c] : -1;
      asm volatile("" : "+r"(f[c]));
    }
  }
  // load_packed's on these offsets
  template <typename T>
  __device__ __forceinline__ void load(const T* __restrict__ row, Packed<T, VEC>& x) const {
    using R = typename Packed<T, VEC>::R;
#pragma unroll
    for (int c = 0; c < kChunks<VEC>; ++c)
      x.r[c] = f[c] >= 0 ? __ldg(reinterpret_cast<const R*>(row + f[c])) : R{};
  }
};

// (every step's shuffle runs on every lane, steps at or above G add nothing:
// a shuffle under a branch on G compiled to a convergence check per step.
// One lane per group (G = 1: fp32 heads of 10 on one lane) skips the steps
// on one test of G, on which the compiler versions the enclosing loop
// (SASS of a probe kernel, nvcc 13.0 sm_90: no shuffle left in the G = 1
// copy); a loop over G's steps on the full mask compiled to a warp sync per
// step instead)
__device__ __forceinline__ float warp_group_sum(float v, int G) {
  if (G > 1) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float u = __shfl_xor_sync(0xffffffffu, v, o);
      if (o < G) v += u;
    }
  }
  return v;
}

// The group maximum on the full warp mask, as warp_group_sum (fmaxf in any
// order: the same value as Group::max)
__device__ __forceinline__ float warp_group_max(float v, int G) {
  if (G > 1) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float u = __shfl_xor_sync(0xffffffffu, v, o);
      if (o < G) v = fmaxf(v, u);
    }
  }
  return v;
}

// The warp's largest of a non-negative count (the lean kernels' batch counts)
__device__ __forceinline__ int warp_max_count(int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return (int)__reduce_max_sync(0xffffffffu, (unsigned)n);
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) n = max(n, __shfl_xor_sync(0xffffffffu, n, o));
  return n;
#endif
}

// SAME: the keys are the values (AGNN, or dot attention's k and v one tensor;
// GATv2's score operand is its value x_src_j): one row loaded per edge.
template <int KIND, bool SAME, typename T, typename I, int VEC>
__device__ __forceinline__ void fwd_lean_edges(const Params<T, I>& p, const Feat<VEC>& ft,
                                               const Item& it, int64_t trips,
                                               const RowOps<KIND, VEC>& r, Softmax<VEC>& sm) {
  constexpr int B = kBatch<KIND, T>;
  const int64_t h = it.h;
  const T* kb = p.src + h * p.hs_src;
  const T* vb = p.val + h * p.hs_val;
  const int64_t ld_val = KIND == GATV2 ? p.H * p.F : p.ld_val;   // (GATv2's rows: contiguous)
  const LaneOffsets<VEC> lo(ft);
  for (int64_t k = 0; k < trips; ++k) {
    const int64_t base = it.begin + k * B;
    const int n = (int)imin(B, it.end - base);   // <= 0 past the group's end
    int64_t j[B];
#pragma unroll
    for (int t = 0; t < B; ++t) j[t] = t < n ? (int64_t)p.col[base + t] : 0;
    Packed<T, VEC> v[B], kr[SAME ? 1 : B];
    float c[KIND == AGNN ? B : 1];
#pragma unroll
    for (int t = 0; t < B; ++t) {
      if (t < n) lo.load(vb + j[t] * ld_val, v[t]);
      else zero_packed<T, VEC>(v[t]);
      if constexpr (!SAME) {
        if (t < n) lo.load(kb + j[t] * p.ld_src, kr[t]);
        else zero_packed<T, VEC>(kr[t]);
      }
      if constexpr (KIND == AGNN) c[t] = t < n ? key_scale<KIND>(p, j[t], h) : 1.f;
    }
    float s[B];
#pragma unroll
    for (int t = 0; t < B; ++t) {
      float part;
      if constexpr (KIND == GATV2) {   // (batch_scores' sum; + 0.f: its edge term's zeros)
        part = 0.f;
#pragma unroll
        for (int cc = 0; cc < kChunks<VEC>; ++cc)
#pragma unroll
          for (int qq = 0; qq < kW<VEC>; ++qq)
            part += r.at[cc][qq] * leaky(r.xi[cc][qq] + v[t].at(cc, qq) + 0.f, p.slope);
      } else {
        part = tile_dot<T, VEC>(r.xi, SAME ? v[t] : kr[SAME ? 0 : t]);
      }
      if constexpr (KIND == AGNN) s[t] = warp_group_sum(part, p.G) * (p.scale * c[t]);
      else s[t] = warp_group_sum(part, p.G) * (dot_like(KIND) ? p.scale : 1.f);
    }
    if (n <= 0) continue;   // (no shuffle below)
    float mx = sm.m;
#pragma unroll
    for (int t = 0; t < B; ++t) mx = fmaxf(mx, t < n ? s[t] : -INFINITY);
    if (mx > sm.m) sm.rescale(mx);
#pragma unroll
    for (int t = 0; t < B; ++t) {
      if (t >= n) break;
      const float pe = expf(s[t] - sm.m);
      sm.l += pe;
      float x[kChunks<VEC>][kW<VEC>];
      unpack<T, VEC>(v[t], x);
      sm.add(pe, x);
    }
  }
}

// GAT's scores on the lean walk (fwd_lane_edges' arithmetic in the same
// order: lane t of a group scores edge base + t, the group's max and sum of
// the batch update the softmax, the batch's value rows are broadcast and
// added in edge order).  Every lane walks the warp's largest count of G-edge
// batches, the max and sum run on the full mask, a batch that does not raise
// the row's max skips the rescale (x expf(0) = 1 is exact), and a batch past
// a group's end changes nothing (its scores are -inf, its weights 0); the
// broadcasts run to the warp's largest edge count of the batch, each group
// loading and adding only its own edges.
// (rows in flight per lane: 4, as fwd_lane_edges' unrolled loop, where a
// lane's row slice is up to 16 bytes; 2 above, where 4 spilled 72-84 B in fp32
// at 8 floats per lane, ptxas, nvcc 13.0 sm_90)
template <typename T, int VEC> constexpr int kLaneGather = sizeof(Packed<T, VEC>) <= 16 ? 4 : 2;
template <typename T, typename I, int VEC>
__device__ __forceinline__ void fwd_lean_lane_edges(const Params<T, I>& p, const Feat<VEC>& ft,
                                                    const Item& it, int trips, float a_dst,
                                                    Softmax<VEC>& sm) {
  const int G = p.G;
  const int lane = threadIdx.x & 31;
  const int lg = lane & (G - 1), first = lane & ~(G - 1);
  const int64_t h = it.h;
  const T* vb = p.val + h * p.F;   // (value rows: [N, H, F])
  const int64_t ldv = p.H * p.F;
  const LaneOffsets<VEC> lo(ft);
  for (int k = 0; k < trips; ++k) {
    const int64_t base = it.begin + (int64_t)k * G;
    const int64_t e = base + lg;
    const bool valid = e < it.end;
    const I j = valid ? p.col[e] : I(0);
    float s = -INFINITY;
    if (valid) s = leaky(to_f(p.src[(int64_t)j * p.H + h]) + a_dst, p.slope);
    const float mx = fmaxf(sm.m, warp_group_max(s, G));
    if (mx > sm.m) sm.rescale(mx);
    const float pe = valid ? expf(s - sm.m) : 0.f;
    sm.l += warp_group_sum(pe, G);
    const int cnt = (int)imin(G, it.end - base);   // (<= 0 past the group's end)
    const int wc = warp_max_count(max(cnt, 0));
    // NG rows in flight per lane, added in edge order
    constexpr int NG = kLaneGather<T, VEC>;
    for (int t0 = 0; t0 < wc; t0 += NG) {
      Packed<T, VEC> x[NG];
      float w[NG];
#pragma unroll
      for (int u = 0; u < NG; ++u) {
        const int src = (first + t0 + u) & 31;   // (past wc: a lane whose value is not used)
        const I jt = __shfl_sync(0xffffffffu, j, src);
        w[u] = __shfl_sync(0xffffffffu, pe, src);
        if (t0 + u < cnt) lo.load(vb + (int64_t)jt * ldv, x[u]);
      }
#pragma unroll
      for (int u = 0; u < NG; ++u) {
        if (t0 + u < cnt) {
          float v[kChunks<VEC>][kW<VEC>];
          unpack<T, VEC>(x[u], v);
          sm.add(w[u], v);
        }
      }
    }
  }
}

template <int KIND, typename T, typename I, int VEC, int BLOCKS>
__global__ void __launch_bounds__(kThreads, BLOCKS) fwd_lean_kernel(const Params<T, I> p) {
  // (GAT: lanes own edges, batches of G)
  constexpr int B = KIND == GAT ? 1 : kBatch<KIND, T>;
  const Group g(p.G);
  Item it;
  const bool live = get_item(p, p.rowptr, it);
  if (__all_sync(0xffffffffu, !live)) return;
  if (!live) it.h = it.row = it.begin = it.end = 0;
  const Feat<VEC> ft(g, 0, p.tile, p.F);
  RowOps<KIND, VEC> r;
  if (live) {
    load_row_ops<KIND, T, I, VEC>(p, ft, it.row, it.h, r);
  } else {
    zero_tile<VEC>(r.xi);
    zero_tile<VEC>(r.at);
  }
  // the warp's largest batch count (every lane runs every butterfly)
  const int64_t per = KIND == GAT ? (int64_t)p.G : (int64_t)B;
  const int trips = warp_max_count((int)((it.end - it.begin + per - 1) / per));
  Softmax<VEC> sm;
  if constexpr (KIND == GAT) {
    fwd_lean_lane_edges<T, I, VEC>(p, ft, it, trips, live ? r.a_dst : 0.f, sm);
  } else {
    const bool same = KIND != DOT ||
                      (p.src == p.val && p.ld_src == p.ld_val && p.hs_src == p.hs_val);
    if (same) fwd_lean_edges<KIND, true, T, I, VEC>(p, ft, it, trips, r, sm);
    else if constexpr (KIND == DOT) fwd_lean_edges<KIND, false, T, I, VEC>(p, ft, it, trips, r, sm);
  }
  if (live) write_row<T, I, VEC>(p, g, ft, it, sm.m, sm.l, sm.acc);
}

// ------------------------------------------------- GAT's forward by rows
// GAT's forward with one lane group per work item covering all its heads
// (issue 11's "one lane group covers several heads of a row"), for the calls
// whose rows are short (with edge logits or attention dropout: EXTRA, below):
// a row of x [N, H, F] is H F contiguous elements, and at 8 x 10 in bf16 (160
// bytes) fwd_lean_kernel's groups of 4 lanes per head take a warp per row,
// each lane loading two 4-byte pieces of its head per edge -- as many loads,
// and as many rows in flight per warp, as fp32's 8-byte pieces (the forward is
// latency-bound, so bf16 took 0.95x fp32's time there: docs/KERNELS.md,
// session 51).  Here lane lg holds the row's 16-byte chunk lg (kRowsK
// elements), so that G = the power of two covering the row's L chunks (and at
// least H) holds a row: 16 lanes at bf16 8 x 10, two rows per warp
// (attention_launch.cuh: gat_rows_group, rows of at most 256 bytes).  A chunk
// spans at most two heads (F >= kRowsK): ha, its elements k < sp, and hb.
// Scores: lane lg scores head hs = lg mod H of the edges es + r EB (es = lg /
// H, EB = G / H edges per round, kRowsR rounds per batch); the lanes of one
// head reduce the batch's max and sum (xor offsets H .. G / 2), so every lane
// of head h holds its online-softmax state (m, l).  The feature lanes take
// their chunk's weights from the scoring lanes by shuffles and gather kRowsR
// rows at a time.  The results are within a few roundings of fwd_lean_kernel's
// (another order of the row's sums).
template <typename T> constexpr int kRowsK = 16 / sizeof(T);
constexpr int kRowsR = 4;   // rounds of scores per batch: rows in flight per lane
// resident blocks (76-80 registers, no spills: nvcc 13.0, sm_90; at 4 blocks
// 16-36 B of spills); tuning: DFGNN_ROWS_BLOCKS
#ifndef DFGNN_ROWS_BLOCKS
#define DFGNN_ROWS_BLOCKS 3
#endif

// v reduced (max or sum) over the lanes of a group of G that hold the same
// head of H (xor offsets H .. G / 2; every lane runs every shuffle on the full
// mask)
template <bool MAX>
__device__ __forceinline__ float rows_head_reduce(float v, int H, int G) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    if (o >= H && o < G) v = MAX ? fmaxf(v, u) : v + u;
  }
  return v;
}

// EXTRA: the calls with edge logits (a_edge [E, H], by the CSR permutation)
// or attention dropout (each scoring lane's weight times its (edge, head)'s
// keep factor; the sum l over the weights before dropout, as fwd_lane_edges);
// the instantiation without them has no code for either.
template <typename T, typename I, bool EXTRA>
__global__ void __launch_bounds__(kThreads, DFGNN_ROWS_BLOCKS)
    fwd_gat_rows_kernel(const Params<T, I> p) {
  constexpr int K = kRowsK<T>, R = kRowsR;
  const int G = p.G, H = (int)p.H, F = (int)p.F;
  const int lane = threadIdx.x & 31;
  const int lg = lane & (G - 1), first = lane & ~(G - 1);
  const int EB = G / H;            // edges per round
  const int hs = lg & (H - 1), es = lg / H;
  const int64_t ldv = p.H * p.F;
  Item it;
  const bool live = get_row_item(p, it);
  if (__all_sync(0xffffffffu, !live)) return;
  if (!live) it.row = it.begin = it.end = 0;
  // the chunk's heads
  const bool act = lg < H * F / K;
  const int g0 = act ? lg * K : 0;
  const int ha = g0 / F, hb = act ? (g0 + K - 1) / F : ha;
  const int sp = (ha + 1) * F - g0;   // (>= K: one head)
  const float a_dst = live ? to_f(p.dst[it.row * p.H + hs]) : 0.f;
  float m = -INFINITY, l = 0.f;
  float acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0.f;
  const int per = EB * R;
  const int trips = warp_max_count((int)((it.end - it.begin + per - 1) / per));
  for (int t = 0; t < trips; ++t) {
    const int64_t base = it.begin + (int64_t)t * per;
    I j[R];
    float s[R], pe[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t e = base + r * EB + es;
      j[r] = e < it.end ? p.col[e] : I(0);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t e = base + r * EB + es;
      s[r] = -INFINITY;
      if (e < it.end) {
        float z = to_f(p.src[(int64_t)j[r] * p.H + hs]) + a_dst;
        if constexpr (EXTRA) {
          if (p.edge) z += to_f(p.edge[(p.perm ? (int64_t)p.perm[e] : e) * p.H + hs]);
        }
        s[r] = leaky(z, p.slope);
      }
    }
    float mx = s[0];
#pragma unroll
    for (int r = 1; r < R; ++r) mx = fmaxf(mx, s[r]);
    mx = fmaxf(m, rows_head_reduce<true>(mx, H, G));
    const bool raised = mx > m;
    const float corr = raised ? expf(m - mx) : 1.f;
    m = mx;
    float ps = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      pe[r] = s[r] > -INFINITY ? expf(s[r] - m) : 0.f;
      ps += pe[r];
    }
    l = l * corr + rows_head_reduce<false>(ps, H, G);
    if constexpr (EXTRA) {   // (the weights after dropout; l keeps the ones before)
#pragma unroll
      for (int r = 0; r < R; ++r)
        pe[r] *= keep_factor(p.drop_p, p.seed, base + r * EB + es, p.H, hs);
    }
    if (__any_sync(0xffffffffu, raised)) {
      const float ca = __shfl_sync(0xffffffffu, corr, first + ha);
      const float cb = __shfl_sync(0xffffffffu, corr, first + hb);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] *= k < sp ? ca : cb;
    }
    const int cnt = (int)imin(per, it.end - base);   // (<= 0 past the group's end)
    // (the weights' shuffles after the loads are issued: fewer live registers)
    for (int u = 0; u < EB; ++u) {
      const int src = first + u * H;
      uint4 x[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const I jt = __shfl_sync(0xffffffffu, j[r], src);
        x[r] = act && r * EB + u < cnt
                   ? __ldg(reinterpret_cast<const uint4*>(p.val + (int64_t)jt * ldv + g0))
                   : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float wa = __shfl_sync(0xffffffffu, pe[r], src + ha);
        const float wb = __shfl_sync(0xffffffffu, pe[r], src + hb);
        const T* v = reinterpret_cast<const T*>(&x[r]);
#pragma unroll
        for (int k = 0; k < K; ++k) acc[k] += (k < sp ? wa : wb) * to_f(v[k]);
      }
    }
  }
  // epilogue: the chunk's heads' sums, then write_row's output or partials
  const float la = __shfl_sync(0xffffffffu, l, first + ha);
  const float lb = __shfl_sync(0xffffffffu, l, first + hb);
  if (!live) return;
  const int64_t row = it.row, slot = it.slot;
  const bool scorer = es == 0;   // (lane hs of the group: head hs's statistics)
  if (slot >= 0) {
    if (act) {
      float* o = p.part_acc + slot * ldv + g0;
#pragma unroll
      for (int k = 0; k < K; ++k) o[k] = acc[k];
    }
    if (scorer) {
      p.part_m[slot * p.H + hs] = m;
      p.part_l[slot * p.H + hs] = l;
    }
    return;
  }
  if (act) {
    const float ia = 1.f / (la + 1e-16f), ib = 1.f / (lb + 1e-16f);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      acc[k] *= k < sp ? ia : ib;
      if (p.bias && p.bias_F == p.F) acc[k] += to_f(p.bias[g0 + k]);
    }
    if (p.out_F == p.F) {
      uint4 raw;
      T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int k = 0; k < K; ++k) e[k] = from_f<T>(acc[k]);
      *reinterpret_cast<uint4*>(p.out + row * ldv + g0) = raw;
    } else {   // the caller's narrower heads: their padding is not written
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int h = k < sp ? ha : hb;
        const int f = g0 + k - h * F;
        if (f >= p.out_F) continue;
        float v = acc[k];
        if (p.bias && p.bias_F != p.F) v += to_f(p.bias[h * p.bias_F + f]);
        p.out[(row * p.H + h) * p.out_F + f] = from_f<T>(v);
      }
    }
  }
  if (scorer) {
    const bool any = it.end > it.begin;
    p.lse[row * p.H + hs] = any ? m : -INFINITY;
    p.lse_l[row * p.H + hs] = any ? logf(l) : 0.f;
  }
}

// ------------------------------------------------------------ merges
// A super row's partials are merged by one block per (merged row, head) of
// kMergeThreads threads.  Two mappings (session 24, power-law 100k graph,
// 466 merged rows of up to 235 slots at the 256-edge segment length, H200):
// - the backward's sums (merge_sum_kernel): a thread per feature adds the
//   row's slots in order; successive slots' loads are independent and
//   pipeline (0.008-0.03 ms per backward);
// - the forward's (m, l, acc) merge (fwd_merge_kernel): its weights
//   exp(m_s - M) put an exp and a dependent load before every product, so
//   the row's slots are spread over the warps (and over the lanes left over
//   when the head is narrower than 32 features), kMergeUnroll slots in
//   flight per lane, with shared-memory reductions: 0.02-0.06 ms instead of
//   0.03-0.11 ms.  Each mapping measured worse at the other's job (the
//   slot-parallel sums 1.2-4x slower, weights from shared memory on the
//   per-feature loop 1.3-1.6x slower than the slot-parallel merge).
// 40 registers: 12 resident blocks (8 features and 4 slots in flight took
// 56-72 registers and halved them).
constexpr int kMergeThreads = 128;
constexpr int kMergeWarps = kMergeThreads / 32;
constexpr int kMergeC = 4;
constexpr int kMergeUnroll = 2;
constexpr int kMergeBlocks = 12;

// emit(f, sum_{s in [s0, s1)} part[(s * H + h) * F + f]) for f < F, fp32,
// one thread per feature.
template <typename EmitFn>
__device__ __forceinline__ void merge_features(int64_t s0, int64_t s1, int64_t H, int64_t h,
                                               int64_t F, const float* part, EmitFn emit) {
  for (int64_t f = threadIdx.x; f < F; f += kMergeThreads) {
    float a = 0.f;
    for (int64_t s = s0; s < s1; ++s) a += part[(s * H + h) * F + f];
    emit(f, a);
  }
}

// Block-wide max (MAX) or sum of v; every thread gets the result.
template <bool MAX>
__device__ __forceinline__ float merge_block_reduce(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, u) : v + u;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();   // (red may still be read by an earlier reduction)
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < kMergeWarps; ++w) v = MAX ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

// emit(f, sum_{s in [s0, s1)} w(s) * part[(s * H + h) * F + f]) for every
// f < n_f (n_f <= F), fp32, the slots spread over the block: P = min(32,
// pow2 >= n_f) lanes cover kMergeC features each per pass, the warps (and
// the 32 / P lane groups of a warp) take every stride-th slot.
template <typename WFn, typename EmitFn>
__device__ __forceinline__ void merge_slots(int64_t s0, int64_t s1, int64_t H, int64_t h,
                                            int64_t F, int64_t n_f, const float* part, WFn wfn,
                                            EmitFn emit) {
  __shared__ float red[kMergeWarps][32 * kMergeC];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int P = 1;
  while (P < 32 && P < n_f) P <<= 1;
  const int fl = lane & (P - 1), spw = 32 / P;
  const int64_t stride = (int64_t)kMergeWarps * spw;
  for (int64_t fb = 0; fb < n_f; fb += (int64_t)P * kMergeC) {
    float acc[kMergeC];
#pragma unroll
    for (int c = 0; c < kMergeC; ++c) acc[c] = 0.f;
#pragma unroll kMergeUnroll
    for (int64_t s = s0 + warp * spw + lane / P; s < s1; s += stride) {
      const float w = wfn(s);
      const float* src = part + (s * H + h) * F + fb + fl;
#pragma unroll
      for (int c = 0; c < kMergeC; ++c)
        if (fb + fl + P * c < n_f) acc[c] += w * src[P * c];
    }
    // the lanes of one feature (lane bits >= log2 P), then the warps
#pragma unroll
    for (int c = 0; c < kMergeC; ++c)
      for (int o = P; o < 32; o <<= 1) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], o);
    __syncthreads();   // (red read by the previous pass)
    if (lane < P) {
#pragma unroll
      for (int c = 0; c < kMergeC; ++c) red[warp][fl + P * c] = acc[c];
    }
    __syncthreads();
    for (int t = threadIdx.x; t < P * kMergeC; t += kMergeThreads) {
      if (fb + t < n_f) {
        float a = 0.f;
#pragma unroll
        for (int w = 0; w < kMergeWarps; ++w) a += red[w][t];
        emit(fb + t, a);
      }
    }
  }
}

// Merge the partial (m, l, acc) of split rows: merge [R, 3] = (row, s0, s1);
// out rows hold out_F <= F features per head.  kMergeThreads per block.
template <typename T, typename I>
__global__ void __launch_bounds__(kMergeThreads, kMergeBlocks) fwd_merge_kernel(
    const I* merge, int64_t R, int64_t H, int64_t F, int64_t out_F, const float* part_acc,
    const float* part_m, const float* part_l, const T* bias, int64_t ld_bias, int64_t bias_F,
    T* out, float* lse, float* lse_l) {
  __shared__ float red[kMergeWarps];
  const int64_t rh = blockIdx.x;  // one block per (merged row, head)
  if (rh >= R * H) return;
  const int64_t r = rh / H, h = rh % H;
  const int64_t row = merge[r * 3], s0 = merge[r * 3 + 1], s1 = merge[r * 3 + 2];
  float m = -INFINITY;
  for (int64_t s = s0 + threadIdx.x; s < s1; s += kMergeThreads) m = fmaxf(m, part_m[s * H + h]);
  const float M = merge_block_reduce<true>(m, red);
  float l = 0.f;
  for (int64_t s = s0 + threadIdx.x; s < s1; s += kMergeThreads)
    l += part_l[s * H + h] * expf(part_m[s * H + h] - M);
  const float L = merge_block_reduce<false>(l, red);
  const float inv = 1.f / (L + 1e-16f);
  merge_slots(
      s0, s1, H, h, F, out_F, part_acc, [=](int64_t s) { return expf(part_m[s * H + h] - M); },
      [=](int64_t f, float a) {
        out[(row * H + h) * out_F + f] =
            from_f<T>(a * inv + (bias ? to_f(bias[row * ld_bias + h * bias_F + f]) : 0.f));
      });
  if (threadIdx.x == 0) {
    lse[row * H + h] = M;
    lse_l[row * H + h] = logf(L);
  }
}


// Attention weights (post-dropout) in original edge order, from the final lse.
template <int KIND, typename T, typename I, int VEC>
__global__ void __launch_bounds__(kThreads, 2) alpha_kernel(const Params<T, I> p) {
  const Group g(p.G);
  Item it;
  if (!get_item(p, p.rowptr, it)) return;
  const int64_t h = it.h, row = it.row;
  const Feat<VEC> ft(g, 0, p.tile, p.F);
  RowOps<KIND, VEC> r;
  load_row_ops<KIND, T, I, VEC>(p, ft, row, h, r);
  const float m = p.lse[row * p.H + h], logl = p.lse_l[row * p.H + h];
  using Bt = Batch<KIND, T, I, VEC>;
  for (int64_t base = it.begin; base < it.end; base += Bt::B) {
    Bt b;
    load_batch<KIND, T, I, VEC, false>(p, ft, h, base, it.end, true, b);
    batch_scores<KIND, T, I, VEC>(p, g, ft, row, h, r, b);
#pragma unroll
    for (int t = 0; t < Bt::B; ++t)
      if (t < b.n && g.lg == (t & (g.G - 1)))
        p.alpha[b.eo[t] * p.H + h] =
            from_f<T>(expf((b.s[t] - m) - logl) * keep_factor(p.drop_p, p.seed, (b.base + t), p.H, h));
  }
}

// ============================================================== backward
// Row pass: per (item, head) recompute alpha and dS, accumulate
// destination-side gradients; for the column pass save either the Delta_i
// used (p.delta, recompute mode) or g and alpha~ per edge (p.ds / p.pd).
//   GAT:   g = dS * LeakyReLU'(z)   d_dst[i]  = sum_j g
//   GATV2: g = dS                    d_dst[i]  = sum_j g * att * LeakyReLU'(z_ij)
//                                    d_att    += sum_j g * LeakyReLU(z_ij)
//   DOT:   g = dS * scale            d_dst[i]  = sum_j g * (k_j + e_ij)
// Per-edge input gradients (edge terms) are written here too.
//
// Centred row sums (GAT, GATv2).  A softmax row's dS sum to zero exactly
// (sum_j alpha_ij (dP_ij - Delta_i) = Delta_i - Delta_i), so any row constant
// c may be subtracted from the factor dS is summed against:
//   GAT:   d_dst[i] = sum_j dS_ij (LeakyReLU'(z_ij) - 1)
//   GATV2: d_dst[i] = sum_j dS_ij att (LeakyReLU'(z_ij) - 1)
//          d_att   += sum_j dS_ij LeakyReLU(z_ij) - LeakyReLU(x_i) sum_j dS_ij
// The computed dS carry rounding (and Delta's error, from the stored O), so
// their computed sum is not zero; summed against a large common factor (a row
// whose logits share a large offset from x_i: LeakyReLU(z_ij) ~ LeakyReLU(x_i),
// all slopes 1) that residue was amplified by it (GATv2's att gradient at
// logits ~1e4 was 11x PyTorch's fp32 error, tests/nn/test_large_logits.py).
// Centred, d_dst's factors are the slope changes only (a row with all
// z_ij > 0 gives d_dst = 0 exactly), and d_att loses the common part of the
// residue (LeakyReLU(x_i) times it); d_att subtracts it after the sweep, not
// per edge, which would hold LeakyReLU(x_i) in registers (+60 B of spills).
// Exact in exact arithmetic; split rows keep the identity (their segments'
// sums add up to the row's).
//
// (how bwd_row_item takes the kernel's parameters and lane group: the choice
// ptxas compiled best (nvcc 13.0, sm_90): by value the other kinds' row passes
// keep their registers and spills from before the function was split out
// (AGNN's spilled 4-12 B more by reference), by reference GATv2's spill 8-32 B
// less)
template <int KIND, typename X>
using RowArg = std::conditional_t<KIND == GATV2, const X&, const X>;

// The stored mode's per-edge terms of edge-head eh (see the column pass): g
// and pd (fp32 arrays, or one array of bf16 pairs), or alpha alone in the
// alpha mode (kColAlpha; p.delta is set with it).
template <typename T, typename I>
__device__ __forceinline__ void store_edge_terms(const Params<T, I>& p, int64_t eh, float alpha,
                                                 float gv, float pdv) {
  if (p.delta) {
    if constexpr (kPackedEdges<T>) reinterpret_cast<uint16_t*>(p.ds)[eh] = c10::BFloat16(alpha).x;
    else p.ds[eh] = alpha;
  } else if constexpr (kPackedEdges<T>) {
    reinterpret_cast<uint32_t*>(p.ds)[eh] = pack_bf16x2(gv, pdv);
  } else {
    p.ds[eh] = gv;
    p.pd[eh] = pdv;
  }
}

// One (item, head) of the row pass.  GATv2's d_att terms are added to `datt`,
// the lane's running sums over the items it takes in shared memory (see
// bwd_row_kernel; element c * VEC + k of the lane's tile at stride kThreads).
template <int KIND, typename T, typename I, int VEC>
__device__ __forceinline__ void bwd_row_item(RowArg<KIND, Params<T, I>> p, RowArg<KIND, Group> g,
                                             const Item& it, float* __restrict__ datt) {
  const int64_t h = it.h, row = it.row, slot = it.slot, F = p.F;
  const Feat<VEC> ft(g, (int64_t)blockIdx.y * p.tile, p.tile, F);
  RowOps<KIND, VEC> r;
  load_row_ops<KIND, T, I, VEC>(p, ft, row, h, r);
  const T* dO_row = p.dout + (row * p.H + h) * F;
  float dO[kChunks<VEC>][kW<VEC>];
  load_tile<T, VEC>(ft, dO_row, dO);
  const float m = p.lse_in[row * p.H + h], logl = p.lse_l_in[row * p.H + h];

  // Delta_i = <dO_i, O_i> from the stored output, as FlashAttention-2 does in
  // every precision (fp16/bf16 O is rounded when stored; the resulting error
  // of dS is of the order of the half-precision rounding of dO and O
  // themselves).  An exact fp32 recomputation (sum_j alpha_ij dP_ij) cost a
  // second sweep over the row's edges and made bf16 backward slower than fp32.
  float delta;
  if (p.delta_in) {
    delta = p.delta_in[row * p.H + h];
  } else {
    float o[kChunks<VEC>][kW<VEC>];
    const T* o_row = p.o + (row * p.H + h) * F;
    load_tile<T, VEC>(ft, o_row, o);
    float part = tile_dot<VEC>(dO, o);
    if (ft.wide) part += pair_part<false, T, VEC>(g, dO_row, o_row, nullptr, nullptr, F, ft.f0,
                                                  ft.hi, 0.f);
    delta = g.sum(part);
  }

  // The sweep also sums the exact Delta = sum_j alpha~_ij dP_ij from the same
  // dP values it subtracts it from.  In a nearly saturated row dS_ij =
  // alpha_ij (dP_ij - Delta) cancels, and <dO, O>'s rounding (|dO||O| u, not
  // scaled by the small weights) then dominates dS (145x PyTorch's error on
  // H200, tests/nn/test_fuzz.py); such a row is swept a second time with the
  // exact Delta.  The test is uniform in the group (every lane holds the same
  // scores and dP), and ordinary rows take one sweep.  Split rows keep <dO, O>.
  constexpr float kRoundoff = sizeof(T) >= 4 ? 5.96e-8f : (sizeof(T) == 2 && std::is_same<T, c10::Half>::value ? 4.88e-4f : 3.91e-3f);
  float gacc = 0.f;
  float acc[kChunks<VEC>][kW<VEC>], acc2[kChunks<VEC>][kW<VEC>];
  for (int pass = 0; pass < 2; ++pass) {
  gacc = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
    for (int k = 0; k < kW<VEC>; ++k) acc[c][k] = acc2[c][k] = 0.f;
  float delta_exact = 0.f, amax = 0.f, dmax = 0.f;

  using Bt = Batch<KIND, T, I, VEC>;
  for (int64_t base = it.begin; base < it.end; base += Bt::B) {
    Bt b;
    bwd_batch<KIND, T, I, VEC>(p, g, ft, it, r, dO, dO_row, base, b);
#pragma unroll
    for (int t = 0; t < Bt::B; ++t) {
      const bool ok = t < b.n;
      const float alpha = ok ? expf((b.s[t] - m) - logl) : 0.f;
      const float kf = ok ? keep_factor(p.drop_p, p.seed, (b.base + t), p.H, h) : 0.f;
      const float dS = alpha * (b.dP[t] * kf - delta);
      delta_exact += alpha * kf * b.dP[t];
      amax = fmaxf(amax, alpha);
      dmax = fmaxf(dmax, fabsf(dS));
      float gv;
      if constexpr (KIND == GAT) gv = dS * dleaky(b.z[t], p.slope);
      else if constexpr (dot_like(KIND)) gv = dS * p.scale;
      else gv = dS;
      const float pdv = alpha * kf;
      if (ok && blockIdx.y == 0 && g.lg == (t & (g.G - 1))) {
        if (p.ds) store_edge_terms(p, (b.base + t) * p.H + h, alpha, gv, pdv);
        if (KIND == GAT && p.d_edge) p.d_edge[b.eo[t] * p.H + h] = from_f<T>(gv);
      }
      if constexpr (KIND == GATV2) gacc += gv;
      if constexpr (KIND == GAT) {
        gacc += gv - dS;  // sum_j dS_ij (LeakyReLU'(z_ij) - 1): see "Centred row sums"
      } else if constexpr (dot_like(KIND)) {
        float kk[kChunks<VEC>][kW<VEC>];
        value_row<KIND, T, I, VEC>(p, ft, h, b.eo[t], ok, b.key(t), kk);   // k_j (+ e_ij)
        // (AGNN: the key is c_j v_j)
        float gk = gv;
        if constexpr (KIND == AGNN) gk = gv * b.c[t];
#pragma unroll
        for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
          for (int k = 0; k < kW<VEC>; ++k) acc[c][k] += gk * kk[c][k];
        if (p.d_edge && ok) {
          float dv[kChunks<VEC>][kW<VEC>];
#pragma unroll
          for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
            for (int k = 0; k < kW<VEC>; ++k) dv[c][k] = gv * r.xi[c][k] + pdv * dO[c][k];
          store_tile<T, VEC>(ft, p.d_edge + ((int64_t)b.eo[t] * p.H + h) * F, dv);
        }
      } else {  // GATV2
        float ev[kChunks<VEC>][kW<VEC>], dv[kChunks<VEC>][kW<VEC>];
        edge_tile<T, I, VEC>(p, ft, h, b.eo[t], ok, ev);
#pragma unroll
        for (int c = 0; c < kChunks<VEC>; ++c)
#pragma unroll
          for (int k = 0; k < kW<VEC>; ++k) {
            const float zz = r.xi[c][k] + b.v[t].at(c, k) + ev[c][k];
            dv[c][k] = gv * r.at[c][k] * dleaky(zz, p.slope);
            acc[c][k] += dv[c][k] - gv * r.at[c][k];  // centred: * (LeakyReLU' - 1)
            acc2[c][k] += gv * leaky(zz, p.slope);
          }
        if (p.d_edge && ok) store_tile<T, VEC>(ft, p.d_edge + ((int64_t)b.eo[t] * p.H + h) * F, dv);
      }
    }
  }

  // second sweep when Delta's error amax |delta - exact| exceeds 64 roundoffs
  // of the largest dS of the row
  // (wide rows, whose launch columns each sum the scalars in their own order,
  // could disagree on the test: they keep one sweep)
  if (pass == 1 || slot >= 0 || ft.wide ||
      !(amax * fabsf(delta_exact - delta) > 64.f * kRoundoff * dmax))
    break;
  delta = delta_exact;
  }
  // the column pass recomputes dS with the Delta used here.  Where p.delta is
  // the caller's delta_in (attention_launch.cuh, bwd_impl), every lane of the
  // group read it above; __syncwarp orders those reads before lane 0's store
  // (shuffles synchronise the lanes but do not order memory).  Other launch
  // columns and a split row's other segments read the same (row, head) too,
  // but they store what they read: only a whole-row, one-column item re-sweeps.
  if (p.delta && p.delta == p.delta_in) __syncwarp(g.mask);
  if (p.delta && blockIdx.y == 0 && g.lg == 0) p.delta[row * p.H + h] = delta;
  if constexpr (KIND == GAT) {
    if (g.lg == 0 && blockIdx.y == 0) {
      if (slot < 0) p.d_dst[row * p.H + h] = from_f<T>(gacc);
      else p.part1[slot * p.H + h] = gacc;
    }
  } else {
    if (slot < 0) {
      const int64_t d0 = KIND == DOT ? row * p.ldg_dst + h * F : (row * p.H + h) * F;
      store_tile<T, VEC>(ft, p.d_dst + d0, acc);
    }
#pragma unroll
    for (int c = 0; c < kChunks<VEC>; ++c) {
      const int64_t f = ft.f[c];
      if (f < 0) continue;
#pragma unroll
      for (int k = 0; k < kW<VEC>; ++k) {
        if (slot >= 0) p.part1[(slot * p.H + h) * F + f + k] = acc[c][k];
        if (KIND == GATV2)  // centred: - LeakyReLU(x_i) * sum_j dS_ij
          datt[(c * kW<VEC> + k) * kThreads] += acc2[c][k] - leaky(r.xi[c][k], p.slope) * gacc;
      }
    }
  }
  // AGNN: sum_j dS_ij s_ij over this launch column's features, <dq_i, q_i> in
  // fp32 (acc = sum_j dS_ij scale c_j v_j, r.xi = q_i, so that the scores are
  // s_ij = scale c_j <q_i, v_j>), indexed by get_item's gid = item H + h.
  // ptxas (sm_90): 0-32 B more spills than without it; an accumulator in the
  // edge loop and the item index kept live took 16-44 B.
  if constexpr (KIND == AGNN) {
    if (p.score_sum) {
      const float sd = g.sum(tile_dot<VEC>(acc, r.xi));
      const int64_t gid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / p.G;
      if (g.lg == 0) p.score_sum[(int64_t)blockIdx.y * p.num_items * p.H + gid] = sd;
    }
  }
}

// BLOCKS: kRowBlocks, or kRowBlocksSmall for L2-resident graphs.
// GATv2's att gradient is a sum over every (edge, head): each lane adds its
// items' terms to running sums in shared memory (lane-private, so no barrier
// in the loop; registers spilled 16-128 B in the inner loop).  Its groups
// therefore take the (item, head) pairs gid0, gid0 + S, ... for S = the grid's
// groups, a multiple of H (one head per group), on a grid the launcher caps
// (bwd_row_grid).  At the end the block sums its groups of each head (groups
// q, q + H, ...: a fixed order) and writes one row per head to p.d_att_part
// (where the block has fewer groups than heads, one row per group); the
// launcher sums the [rows / H, H, F] partials.  One row per group instead
// took 13-26 MiB at 8 heads on the 100k graphs, and its sum's staging 6-21
// MiB more, both at the backward's peak (docs/KERNELS.md, session 37).  The
// other kinds take one pair per group.
template <int KIND, typename T, typename I, int VEC, int BLOCKS>
__global__ void __launch_bounds__(kThreads, BLOCKS) bwd_row_kernel(const Params<T, I> p) {
  const Group g(p.G);
  if constexpr (KIND == GATV2) {
    __shared__ float sums[kChunks<VEC> * kW<VEC> * kThreads];
    float* datt = sums + threadIdx.x;
#pragma unroll
    for (int j = 0; j < kChunks<VEC> * kW<VEC>; ++j) datt[j * kThreads] = 0.f;
    const Feat<VEC> ft(g, (int64_t)blockIdx.y * p.tile, p.tile, p.F);
    const int64_t gid0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / p.G;
    for (int64_t gid = gid0; gid < p.num_items * p.H; gid += (int64_t)gridDim.x * (kThreads / p.G)) {
      Item it;
      it.item = gid / p.H;
      it.h = gid % p.H;
      load_item(p.work, p.rowptr, it.item, it.row, it.begin, it.end, it.slot);
      bwd_row_item<KIND, T, I, VEC>(p, g, it, datt);
    }
    // the block's groups of head (first + q) mod H are q, q + H, ... < gpb; one
    // row per head (rows = H), or per group where the block has fewer groups
    // than heads.  Every thread takes (row, lane, slot) targets, the lanes and
    // rows of one slot adjacent (8 threads with 8 rows summing 32 groups each
    // made the pass 9-16 % slower at 8 x 10, H200, session 37)
    const int G = p.G, gpb = kThreads / G, H = (int)p.H, rows = gpb < H ? gpb : H;
    constexpr int J = kChunks<VEC> * kW<VEC>;
    const int64_t first = (int64_t)blockIdx.x * gpb;   // the block's first group
    __syncthreads();
    for (int t = threadIdx.x; t < rows * G * J; t += kThreads) {
      const int lg = t % G, q = (t / G) % rows, j = t / (G * rows);
      const int c = j / kW<VEC>, k = j % kW<VEC>;
      const int64_t x = ft.f0 + (int64_t)c * G * kW<VEC> + (int64_t)lg * kW<VEC>;   // (Feat's)
      if (x >= p.F || x >= ft.hi) continue;
      float s = 0.f;
      for (int q2 = q; q2 < gpb; q2 += H) s += sums[j * kThreads + q2 * G + lg];
      const int64_t r = gpb < H ? first + q : (int64_t)blockIdx.x * H + (first + q) % H;
      p.d_att_part[r * p.F + x + k] = s;
    }
  } else {
    Item it;
    if (!get_item(p, p.rowptr, it)) return;
    bwd_row_item<KIND, T, I, VEC>(p, g, it, nullptr);
  }
}

// ------------------------------------------- lean dot-like backward row pass
// bwd_row_item for dot attention and AGNN on the calls the lean forward takes
// (no edge features, no dropout, heads in one launch column): the same
// arithmetic in the same order, so every value it writes (d_q or its split
// rows' partials, the stored or alpha mode's per-edge arrays, Delta, AGNN's
// score sums) is bwd_row_kernel's bit for bit (tests/ops/test_lean_kernels.py),
// on the lean forward's warp-uniform batch walk with full-mask butterflies.
// A nearly saturated row's second sweep (bwd_row_item) runs for the groups
// that need it while the warp's other groups walk it without loading or
// changing anything.
template <int KIND, typename T, typename I, int VEC, int BLOCKS>
__global__ void __launch_bounds__(kThreads, BLOCKS) bwd_row_lean_kernel(const Params<T, I> p) {
  static_assert(dot_like(KIND), "the lean row pass is dot attention's and AGNN's");
  constexpr int B = kBatch<KIND, T>;
  const Group g(p.G);
  Item it;
  const bool live = get_item(p, p.rowptr, it);
  if (__all_sync(0xffffffffu, !live)) return;
  if (!live) {
    it.h = it.row = it.begin = it.end = 0;
    it.slot = -1;
  }
  const int64_t h = it.h, row = it.row, slot = it.slot, F = p.F;
  const Feat<VEC> ft(g, 0, p.tile, F);
  RowOps<KIND, VEC> r;
  float dO[kChunks<VEC>][kW<VEC>];
  float m = 0.f, logl = 0.f, delta = 0.f;
  if (live) {
    load_row_ops<KIND, T, I, VEC>(p, ft, row, h, r);
    load_tile<T, VEC>(ft, p.dout + (row * p.H + h) * F, dO);
    m = p.lse_in[row * p.H + h];
    logl = p.lse_l_in[row * p.H + h];
  } else {
    zero_tile<VEC>(r.xi);
    zero_tile<VEC>(dO);
  }
  if (p.delta_in) {
    if (live) delta = p.delta_in[row * p.H + h];
  } else {   // (bwd_row_item: Delta_i = <dO_i, O_i>)
    float o[kChunks<VEC>][kW<VEC>];
    if (live) load_tile<T, VEC>(ft, p.o + (row * p.H + h) * F, o);
    else zero_tile<VEC>(o);
    delta = warp_group_sum(tile_dot<VEC>(dO, o), p.G);
  }
  const LaneOffsets<VEC> lo(ft);
  const T* kb = p.src + h * F;   // (the backward's k / v: heads F apart)
  const T* vb = p.val + h * F;
  constexpr float kRoundoff = sizeof(T) >= 4 ? 5.96e-8f : (sizeof(T) == 2 && std::is_same<T, c10::Half>::value ? 4.88e-4f : 3.91e-3f);
  const int my_trips = (int)((it.end - it.begin + B - 1) / B);
  float acc[kChunks<VEC>][kW<VEC>];
  zero_tile<VEC>(acc);   // (lanes without an item too: AGNN's score sum below)
  float delta_exact = 0.f, amax = 0.f, dmax = 0.f;
  bool active = live;
  for (int pass = 0; pass < 2; ++pass) {
    if (active) {
      zero_tile<VEC>(acc);
      delta_exact = amax = dmax = 0.f;
    }
    const int trips = warp_max_count(active ? my_trips : 0);
    for (int64_t k = 0; k < trips; ++k) {
      const int64_t base = it.begin + k * B;
      const int n = active ? (int)imin(B, it.end - base) : 0;
      int64_t j[B];
#pragma unroll
      for (int t = 0; t < B; ++t) j[t] = t < n ? (int64_t)p.col[base + t] : 0;
      Packed<T, VEC> v[B], kr[KIND == DOT ? B : 1];
      float c[KIND == AGNN ? B : 1];
#pragma unroll
      for (int t = 0; t < B; ++t) {
        if (t < n) lo.load(vb + j[t] * p.ld_val, v[t]);
        else zero_packed<T, VEC>(v[t]);
        if constexpr (KIND == DOT) {
          if (t < n) lo.load(kb + j[t] * p.ld_src, kr[t]);
          else zero_packed<T, VEC>(kr[t]);
        }
        if constexpr (KIND == AGNN) c[t] = t < n ? key_scale<KIND>(p, j[t], h) : 1.f;
      }
      float s[B], dP[B];
#pragma unroll
      for (int t = 0; t < B; ++t) {   // (batch_scores, batch_dP)
        const Packed<T, VEC>& key = KIND == DOT ? kr[KIND == DOT ? t : 0] : v[t];
        const float part = tile_dot<T, VEC>(r.xi, key);
        float st;
        if constexpr (KIND == AGNN) st = warp_group_sum(part, p.G) * (p.scale * c[t]);
        else st = warp_group_sum(part, p.G) * p.scale;
        s[t] = t < n ? st : -INFINITY;
        dP[t] = warp_group_sum(tile_dot<T, VEC>(dO, v[t]), p.G);
      }
      if (n <= 0) continue;   // (no shuffle below)
#pragma unroll
      for (int t = 0; t < B; ++t) {   // (bwd_row_item's, for dot-like kinds)
        const bool ok = t < n;
        const float alpha = ok ? expf((s[t] - m) - logl) : 0.f;
        const float kf = ok ? 1.f : 0.f;
        const float dS = alpha * (dP[t] * kf - delta);
        delta_exact += alpha * kf * dP[t];
        amax = fmaxf(amax, alpha);
        dmax = fmaxf(dmax, fabsf(dS));
        const float gv = dS * p.scale;
        const float pdv = alpha * kf;
        if (ok && blockIdx.y == 0 && g.lg == (t & (g.G - 1)) && p.ds)
          store_edge_terms(p, (base + t) * p.H + h, alpha, gv, pdv);
        float kk[kChunks<VEC>][kW<VEC>];
        unpack<T, VEC>(KIND == DOT ? kr[KIND == DOT ? t : 0] : v[t], kk);
        float gk = gv;
        if constexpr (KIND == AGNN) gk = gv * c[t];
#pragma unroll
        for (int cc = 0; cc < kChunks<VEC>; ++cc)
#pragma unroll
          for (int q = 0; q < kW<VEC>; ++q) acc[cc][q] += gk * kk[cc][q];
      }
    }
    // (bwd_row_item's second-sweep test; a launch column is the whole head here)
    const bool again = active && pass == 0 && slot < 0 &&
                       amax * fabsf(delta_exact - delta) > 64.f * kRoundoff * dmax;
    if (!__any_sync(0xffffffffu, again)) break;
    if (again) delta = delta_exact;
    active = again;
  }
  if (p.delta && p.delta == p.delta_in) __syncwarp();   // (bwd_row_item)
  if (live) {
    if (p.delta && g.lg == 0) p.delta[row * p.H + h] = delta;
    if (slot < 0) {
      const int64_t d0 = KIND == DOT ? row * p.ldg_dst + h * F : (row * p.H + h) * F;
      store_tile<T, VEC>(ft, p.d_dst + d0, acc);
    } else {
#pragma unroll
      for (int cc = 0; cc < kChunks<VEC>; ++cc) {
        const int64_t f = ft.f[cc];
        if (f < 0) continue;
#pragma unroll
        for (int q = 0; q < kW<VEC>; ++q) p.part1[(slot * p.H + h) * F + f + q] = acc[cc][q];
      }
    }
  }
  if constexpr (KIND == AGNN) {
    if (p.score_sum) {
      const float sd = warp_group_sum(tile_dot<VEC>(acc, r.xi), p.G);
      const int64_t gid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / p.G;
      if (live && g.lg == 0) p.score_sum[gid] = sd;
    }
  }
}

// Column pass over the transposed CSR: per (source item, head)
//   d_val[j] = sum_i pd_ij dO_i                     (pd = alpha * keep)
//   GAT:   d_src[j] = sum_i g_ij                      ([N, H])
//   DOT:   d_src[j] = sum_i g_ij q_i
//   GATV2: d_src[j] = sum_i g_ij att LeakyReLU'(z_ij) + d_val[j]   (value = src)
// with g_ij the row pass's (dS times the score's derivative).  Modes (MODE):
//  * stored (kColStored): the row pass wrote g and pd per edge as fp32
//    [E, H] (CSR order), read back here through t_perm: E x H x 8 bytes
//    written and read;
//  * recompute (kColRecompute): g and pd are recomputed here from the row
//    statistics (m_i, log l_i) and the row pass's Delta_i, FlashAttention-
//    style; nothing per edge is stored.  Measured on an H100 (docs/KERNELS.md,
//    session 8) this pass then costs about as much as the row pass (two
//    butterflies and an exp per edge): layer forward+backward +8-13 %, peak
//    memory -20-60 % at 8 heads.  The launcher picks the mode;
//  * emit-dP (kColEmitDP, GAT's stored mode, run *before* any row pass): alpha
//    is recomputed as in recompute mode, d_val accumulated, and alpha~_ij dP_ij
//    written per edge (E x H x 4 bytes) for the scalar passes below, which
//    produce d_dst, d_edge and d_src (GAT's single-gather backward).
// In recompute mode the expressions are the row pass's, in the same order, on
// the same lane layout (both passes launch with the same G and tile), so they
// agree with the row pass's values to a few roundings (the compiler contracts
// products into FMAs per kernel; measured: gradients within 6 ulps of the
// stored mode's); that matters in nearly saturated rows, where dS = alpha (dP -
// Delta) cancels and the row pass's Delta is the exact sum of its dP (see the
// row pass; tests/nn/test_fuzz.py covers such rows).  The score needs its operand
// rows over all features: a launch column adds the features outside its tile
// from memory (`wide`), as the row pass does.
//
// LEAN (bwd_col_lean_kernel): calls of dot attention and GATv2 (stored, alpha
// and recompute modes) and of GAT (emit-dP and atomic modes: gat_col_pass)
// without edge features or dropout whose heads fit one launch column (no
// `wide` tile): the same arithmetic in the same order as bwd_col_kernel (so
// the same gradients bit for bit, GAT's atomics' order aside:
// tests/ops/test_lean_kernels.py), on the lean row pass's warp-uniform walk:
// every lane walks the warp's largest batch count, so the butterflies run on
// the full warp mask (warp_group_sum) instead of a loop on the group's mask
// with a convergence check per step; a group past its column's end re-reads
// a valid edge and adds nothing; the lanes' chunk offsets are 32-bit numbers in
// registers (LaneOffsets); the edge-feature, dropout and wide-tile paths are
// compiled out.  Measured on an H200 (docs/KERNELS.md, session 48): the
// column pass 0.70-0.92x for the Transformer's 8 x 10 and 8 x 19 (fp32 and
// bf16 on the 100k graphs, fp32 on a PATTERN batch), 0.90-0.99x for GATv2,
// GAT's 0.67-0.95x (session 49); AGNN's took 1.05-1.23x, so AGNN keeps
// bwd_col_kernel.
template <int KIND, typename T, typename I, int VEC, int MODE, int BATCH, bool LEAN,
          bool HUBS = false>
__device__ __forceinline__ void col_pass(const Params<T, I>& p) {
  static_assert(!LEAN || KIND != AGNN, "AGNN's column pass is the plain one (bwd_col_kernel)");
  constexpr bool ALPHA = MODE == kColAlpha;        // alpha stored, dP formed here
  constexpr bool RECOMPUTE = MODE != kColStored && !ALPHA;   // alpha recomputed here
  static_assert(!ALPHA || KIND == DOT || KIND == GATV2,
                "the alpha mode is dot attention's and GATv2's");
  constexpr bool EMIT = MODE == kColEmitDP;        // GAT: write alpha~ dP, leave g to the scalar passes
  constexpr bool ATOMIC = MODE == kColAtomic;      // GAT: d_src here, row sums atomically
  static_assert(!(EMIT || ATOMIC) || KIND == GAT, "emit-dP and atomic modes are GAT's");
  // (BATCH: the launcher's choice of edges per batch, kShortColBatch; 0 = the rule here)
  constexpr bool kAlphaFloat4 = ALPHA && sizeof(T) == 4 && kW<VEC> == 4;
  constexpr int B = BATCH > 0 ? BATCH
                    : (EMIT || ATOMIC) ? DFGNN_EMIT_BATCH
                    : kWide<VEC> ? DFGNN_WIDE_COL_BATCH
                                 : kColBatch<KIND, RECOMPUTE || kAlphaFloat4, T>;
  constexpr int NC = kChunks<VEC>;
  const Group g(p.G);
  Item it;
  const bool live = get_item(p, p.t_rowptr, it);
  if constexpr (LEAN) {
    if (__all_sync(0xffffffffu, !live)) return;
    if (!live) {   // (a lane past the last item: walks the warp's batches, loads nothing)
      it.h = it.row = it.begin = it.end = 0;
      it.slot = -1;
    }
  } else if (!live) {
    return;
  }
  const int64_t h = it.h, src = it.row, slot = it.slot, F = p.F, H = p.H;
  const Feat<VEC> ft(g, (int64_t)blockIdx.y * p.tile, p.tile, F);
  const bool wide = !LEAN && ft.wide;
  const T* const edge = LEAN ? nullptr : p.edge;
  [[maybe_unused]] const LaneOffsets<VEC> lo = LEAN ? LaneOffsets<VEC>(ft) : LaneOffsets<VEC>();
  // a destination row's tile (lean: on the 32-bit offsets)
  auto load_row = [&](const T* row, Packed<T, VEC>& x) {
    if constexpr (LEAN) lo.load(row, x);
    else load_packed<T, VEC>(ft, row, x);
  };
  // a group's sum (lean: on the full warp mask)
  auto gsum = [&](float v) {
    if constexpr (LEAN) return warp_group_sum(v, p.G);
    else return g.sum(v);
  };
  // v_j (DOT), x_j (GAT), x_src_j (GATV2); k_j (DOT), x_src_j (GATV2)
  const T* v_row = dot_like(KIND) ? p.val + src * p.ld_val + h * F : p.val + (src * H + h) * F;
  const T* k_row = dot_like(KIND) ? p.src + src * p.ld_src + h * F : p.src + (src * H + h) * F;

  float vj[NC][kW<VEC>], kj[dot_like(KIND) ? NC : 1][kW<VEC>], at[KIND == GATV2 ? NC : 1][kW<VEC>];
  // the own row's operands: what the recomputed scores / dP need, and GATv2's
  // z_ij in either mode
  if constexpr (RECOMPUTE || ALPHA || KIND == GATV2) {
    if (live) load_tile<T, VEC>(ft, v_row, vj);
    else zero_tile<VEC>(vj);
  }
  if constexpr (RECOMPUTE && dot_like(KIND)) {
    if (live) load_tile<T, VEC>(ft, k_row, kj);
    else zero_tile<VEC>(kj);
  }
  if constexpr (KIND == GATV2) load_tile<T, VEC>(ft, p.att + h * F, at);
  const float a_src = RECOMPUTE && KIND == GAT ? to_f(p.src[src * H + h]) : 0.f;
  // the recomputed scores' factor (AGNN: times the own key scale; d_src is
  // then the gradient of the scaled key c_j v_j)
  const float sc = !dot_like(KIND) ? 1.f
                   : KIND == AGNN ? p.scale * key_scale<KIND>(p, src, h) : p.scale;
  const bool need_cp = !RECOMPUTE || EMIT || (!LEAN && (p.edge != nullptr || p.drop_p > 0.f));

  float gacc = 0.f;
  float dv[NC][kW<VEC>], dk[KIND == GAT ? 1 : NC][kW<VEC>];
  zero_tile<VEC>(dv);
  if constexpr (KIND != GAT) zero_tile<VEC>(dk);
  // (lean: the warp's largest batch count; n <= 0 past a group's end)
  int trips = 0;
  if constexpr (LEAN) trips = warp_max_count((int)((it.end - it.begin + B - 1) / B));
  int k = 0;
  for (int64_t base = it.begin; LEAN ? k < trips : base < it.end; base += B, ++k) {
    const int n = (int)imin(B, it.end - base);
    // (lean: a group past its column's end (n <= 0) loads the graph's edge
    // it.end - 1 (or 0) again instead, so that its loads take no predicate --
    // none at all where a batch is one edge; what it computes is dropped
    // before anything is added up, below)
    const int nl = LEAN && n <= 0 ? 1 : n;
    const int64_t eb = LEAN && n <= 0 ? (it.end > 0 ? it.end - 1 : 0) : base;
    I i[B], cp[B], eo[B];
#pragma unroll
    for (int t = 0; t < B; ++t) {
      const bool ok = t < nl;
      i[t] = ok ? p.t_col[eb + t] : I(0);                // destination
      cp[t] = (ok && need_cp) ? p.t_perm[eb + t] : I(0);  // CSR position
    }
#pragma unroll
    for (int t = 0; t < B; ++t)
      eo[t] = (t < nl && edge) ? (p.perm ? p.perm[cp[t]] : cp[t]) : I(0);
    // recompute: the destination rows' statistics, and GAT's z_ij = a_src_j +
    // a_dst_i (+ e_ij); stored: g and pd
    float m[B], ll[B], dl[B], z[B], gs[B], ps[B];
    [[maybe_unused]] bool hub[HUBS ? B : 1];
#pragma unroll
    for (int t = 0; t < B; ++t) {
      const bool ok = t < nl;
      if constexpr (ALPHA) {   // alpha (in gs; bf16: one bf16 each) and the destination row's Delta
        const int64_t eh = (int64_t)cp[t] * H + h;
        if constexpr (kPackedEdges<T>)
          gs[t] = ok ? bf16_lo(reinterpret_cast<const uint16_t*>(p.ds)[eh]) : 0.f;
        else gs[t] = ok ? p.ds[eh] : 0.f;
        dl[t] = ok ? p.delta[(int64_t)i[t] * H + h] : 0.f;
        continue;
      }
      if constexpr (!RECOMPUTE) {
        const int64_t eh = (int64_t)cp[t] * H + h;
        if constexpr (kPackedEdges<T>) {
          const uint32_t w = ok ? reinterpret_cast<const uint32_t*>(p.ds)[eh] : 0u;
          gs[t] = bf16_lo(w);
          ps[t] = bf16_hi(w);
        } else {
          gs[t] = ok ? p.ds[eh] : 0.f;
          ps[t] = ok ? p.pd[eh] : 0.f;
        }
        continue;
      }
      const int64_t ih = (int64_t)i[t] * H + h;
      if constexpr (ATOMIC) {   // (no edge features in this mode: bwd_impl)
        const float4 st = ok ? reinterpret_cast<const float4*>(p.gat_acc)[ih * 2 + 1]
                             : make_float4(0.f, 0.f, 0.f, 0.f);
        m[t] = st.x;
        if constexpr (HUBS) {   // (the sign: a hub row, HubCache)
          ll[t] = fabsf(st.y);
          hub[t] = hub_marked(st.y);
        } else {
          ll[t] = st.y;
        }
        z[t] = ok ? a_src + st.z : 0.f;
        dl[t] = st.w;
        continue;
      }
      m[t] = ok ? p.lse_in[ih] : 0.f;
      ll[t] = ok ? p.lse_l_in[ih] : 0.f;
      dl[t] = (ok && !EMIT) ? p.delta[ih] : 0.f;
      z[t] = 0.f;
      if constexpr (KIND == GAT) {
        if (ok) {
          z[t] = a_src + to_f(p.dst[ih]);
          if (edge) z[t] += to_f(edge[(int64_t)eo[t] * H + h]);
        }
      }
    }
    // the destination rows dO_i and q_i / x_dst_i, packed (Packed)
    Packed<T, VEC> o[B], x[KIND == GAT ? 1 : B];
#pragma unroll
    for (int t = 0; t < B; ++t) {
      const bool ok = t < nl;
      const int64_t off = ((int64_t)i[t] * H + h) * F;
      if (ok) load_row(p.dout + off, o[t]);
      else zero_packed<T, VEC>(o[t]);
      if constexpr (KIND != GAT) {
        if constexpr (dot_like(KIND)) {
          if (ok) load_row(p.dst + (int64_t)i[t] * p.ld_dst + h * F, x[t]);
          else zero_packed<T, VEC>(x[t]);
        } else {
          if (ok) load_row(p.dst + off, x[t]);
          else zero_packed<T, VEC>(x[t]);
        }
      }
    }
    // lane partials of the score (vector kinds) and of dP = <dO_i, v_j (+ e_ij, dot)>,
    // as batch_scores / batch_dP form them
    float sp[B], dp[B];
#pragma unroll
    for (int t = 0; t < B; ++t) {
      const bool ok = t < nl;
      sp[t] = dp[t] = 0.f;
      if constexpr (KIND == GAT) {
        if constexpr (RECOMPUTE) dp[t] = tile_dot<T, VEC>(vj, o[t]);
      } else if constexpr (ALPHA) {   // (no edge features in this mode)
        dp[t] = tile_dot<T, VEC>(vj, o[t]);
        if (wide && ok)
          dp[t] += pair_part<false, T, VEC>(g, p.dout + ((int64_t)i[t] * H + h) * F, v_row,
                                            nullptr, nullptr, F, ft.f0, ft.hi, 0.f);
      } else if constexpr (RECOMPUTE) {
        float ev[NC][kW<VEC>];
        if (edge) edge_tile<T, I, VEC>(p, ft, h, eo[t], ok, ev);
        else zero_tile<VEC>(ev);
        if constexpr (dot_like(KIND)) {
          float kk[NC][kW<VEC>], vv[NC][kW<VEC>];
#pragma unroll
          for (int c = 0; c < NC; ++c)
#pragma unroll
            for (int q = 0; q < kW<VEC>; ++q) {
              kk[c][q] = edge ? kj[c][q] + ev[c][q] : kj[c][q];
              vv[c][q] = edge ? vj[c][q] + ev[c][q] : vj[c][q];
            }
          sp[t] = tile_dot<T, VEC>(kk, x[t]);
          dp[t] = tile_dot<T, VEC>(vv, o[t]);
        } else {  // GATV2: z_ij = x_dst_i + x_src_j + e_ij
#pragma unroll
          for (int c = 0; c < NC; ++c)
#pragma unroll
            for (int q = 0; q < kW<VEC>; ++q)
              sp[t] += at[c][q] * leaky(x[t].at(c, q) + vj[c][q] + ev[c][q], p.slope);
          dp[t] = tile_dot<T, VEC>(vj, o[t]);
        }
      }
      if (RECOMPUTE && wide && ok) {
        const int64_t ioff = ((int64_t)i[t] * H + h) * F;
        const T* e = edge && KIND != GAT ? edge + ((int64_t)eo[t] * H + h) * F : nullptr;
        if constexpr (KIND != GAT)
          sp[t] += pair_part<KIND == GATV2, T, VEC>(
              g, p.dst + (dot_like(KIND) ? (int64_t)i[t] * p.ld_dst + h * F : ioff), k_row, e,
                                                    KIND == GATV2 ? p.att + h * F : nullptr, F,
                                                    ft.f0, ft.hi, p.slope);
        dp[t] += pair_part<false, T, VEC>(g, p.dout + ioff, v_row, dot_like(KIND) ? e : nullptr,
                                          nullptr, F, ft.f0, ft.hi, 0.f);
      }
    }
    if constexpr (RECOMPUTE) {
#pragma unroll
      for (int t = 0; t < B; ++t) {
        if constexpr (KIND != GAT) sp[t] = gsum(sp[t]) * sc;
        dp[t] = gsum(dp[t]);
      }
    }
    if constexpr (ALPHA) {
#pragma unroll
      for (int t = 0; t < B; ++t) dp[t] = gsum(dp[t]);
    }
    if (LEAN && n <= 0) continue;   // (a lean group past its end: no shuffle below)
    // recompute: alpha, dS, g and pd as the row pass computes them
#pragma unroll
    for (int t = 0; t < B; ++t) {
      float gv, pdv;
      if constexpr (ALPHA) {   // as the row pass forms them
        const float kf = t >= n ? 0.f : LEAN ? 1.f : keep_factor(p.drop_p, p.seed, (int64_t)cp[t], H, h);
        gv = gs[t] * (dp[t] * kf - dl[t]);
        if constexpr (dot_like(KIND)) gv *= p.scale;
        pdv = gs[t] * kf;
      } else if constexpr (!RECOMPUTE) {
        gv = gs[t];
        pdv = ps[t];
      } else {
        const bool ok = t < n;
        const float s = KIND == GAT ? leaky(z[t], p.slope) : sp[t];
        const float alpha = ok ? expf((s - m[t]) - ll[t]) : 0.f;
        const float kf = !ok ? 0.f : LEAN ? 1.f : keep_factor(p.drop_p, p.seed, (int64_t)cp[t], H, h);
        const float dS = alpha * (dp[t] * kf - dl[t]);
        if constexpr (EMIT) {   // one lane of the group writes alpha~ dP (all hold it)
          if (ok && blockIdx.y == 0 && g.lg == (t & (g.G - 1)))
            p.ds[(int64_t)cp[t] * H + h] = alpha * kf * dp[t];
          gv = 0.f;
        } else if constexpr (KIND == GAT) gv = dS * dleaky(z[t], p.slope);
        else if constexpr (dot_like(KIND)) gv = dS * p.scale;
        else gv = dS;
        pdv = alpha * kf;
        if constexpr (ATOMIC) {   // one lane of the group adds the row sums of edge t
          if (ok && blockIdx.y == 0 && g.lg == (t & (g.G - 1))) {
            // where LeakyReLU' != 1, d_dst's centred term and alpha's factor of
            // its correction; in a dominated row (kDominated) the exact Delta's
            // term alpha~ dP
            const float d1 = dleaky(z[t], p.slope) - 1.f;
            const bool dom = ll[t] < kDominated;
            const float4 v = make_float4(dom ? pdv * dp[t] : 0.f, gv - dS, alpha * d1, 0.f);
            const int64_t ih = (int64_t)i[t] * H + h;
#if !DFGNN_GAT_NO_ATOMICS   // (a timing diagnostic only: wrong gradients)
            if (dom || d1 != 0.f) {
              // (a hub row: into the block's cache where its slot is free or its own)
              bool cached = false;
              if constexpr (HUBS)
                cached = hub[t] && hub_add(hub_cache(), (uint32_t)ih, v, dom, d1 != 0.f);
              if (!cached) gat_acc_add(p.gat_acc + ih * kGatAcc, v, dom, d1 != 0.f);
            }
#endif
          }
        }
      }
      gacc += gv;
      // (GATv2: att, the same for every edge of the column, multiplies the
      // sum after the sweep: one product per element and edge less; the column
      // pass 0.96-0.98x in bf16, H200, docs/KERNELS.md, session 37)
      float ev[KIND == GATV2 ? NC : 1][kW<VEC>];
      if constexpr (KIND == GATV2) {
        if (edge) edge_tile<T, I, VEC>(p, ft, h, eo[t], t < n, ev);
        else zero_tile<VEC>(ev);
      }
#pragma unroll
      for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int k = 0; k < kW<VEC>; ++k) {
          dv[c][k] += pdv * o[t].at(c, k);
          if constexpr (dot_like(KIND)) dk[c][k] += gv * x[t].at(c, k);
          if constexpr (KIND == GATV2)
            dk[c][k] += gv * dleaky(x[t].at(c, k) + vj[c][k] + ev[c][k], p.slope);
        }
    }
  }
  if (!live) return;   // (lean: a lane past the last item)
  // outputs: part1 <- the value-side gradient, part2 <- the source-side one
  if constexpr (KIND == GAT && !EMIT) {
    if (g.lg == 0 && blockIdx.y == 0) {
      if (slot >= 0) p.part2[slot * H + h] = gacc;
      else if (ATOMIC) p.d_src_f[src * H + h] = gacc;   // (corrected by bwd_gat_src_kernel)
      else p.d_src[src * H + h] = from_f<T>(gacc);
    }
  }
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int64_t f = ft.f[c];
    if (f < 0) continue;
    if constexpr (KIND == GATV2) {   // d_src = att * sum_i g LeakyReLU' + d_val
#pragma unroll
      for (int k = 0; k < kW<VEC>; ++k) dk[c][k] = at[c][k] * dk[c][k] + dv[c][k];
    }
    T* vout = KIND == GATV2 ? p.d_src : p.d_val;
    const float* first = KIND == GATV2 ? dk[c] : dv[c];
    if (slot < 0) {
      // (only dot attention's gradients may be column blocks (not AGNN's): the others
      // keep their contiguous rows' index, which their register budget needs:
      // GAT's emit-dP column pass ran 1.4-1.5x longer with the row stride)
      const int64_t vo = KIND == DOT ? src * p.ldg_val + h * F + f : (src * H + h) * F + f;
      if (vout) store_vec<T, VEC>(vout + vo, KIND == GATV2 ? dk[c] : dv[c]);
      if constexpr (dot_like(KIND))
        store_vec<T, VEC>(p.d_src + (KIND == DOT ? src * p.ldg_src + h * F + f : (src * H + h) * F + f),
                          dk[c]);
    } else {
#pragma unroll
      for (int k = 0; k < kW<VEC>; ++k) {
        p.part1[(slot * H + h) * F + f + k] = first[k];
        if constexpr (dot_like(KIND)) p.part2[(slot * H + h) * F + f + k] = dk[c][k];
      }
    }
  }
}

template <int KIND, typename T, typename I, int VEC, int MODE, int BATCH = 0>
__global__ void __launch_bounds__(kThreads, kColBlocks<KIND, T, MODE, VEC>) bwd_col_kernel(const Params<T, I> p) {
  col_pass<KIND, T, I, VEC, MODE, BATCH, false>(p);
}

template <int KIND, typename T, typename I, int VEC, int MODE, int BATCH = 0, bool HUBS = false>
__global__ void __launch_bounds__(kThreads, kColBlocks<KIND, T, MODE, VEC>) bwd_col_lean_kernel(const Params<T, I> p) {
  static_assert(!HUBS || MODE == kColAtomic, "the hub cache is GAT's atomic mode's");
  if constexpr (HUBS) {
    // GAT's atomic mode on a graph with hubs (launched with p.hub_min > 0 and
    // sizeof(HubCache) bytes of shared memory): the block's HubCache, cleared
    // before the pass and added to the rows' sums after it (every thread
    // reaches both barriers: col_pass returns, it does not exit)
    HubCache& hc = hub_cache();
    for (int s = threadIdx.x; s < kHubSlots; s += blockDim.x) {
      hc.key[s] = -1;
      hc.sum[0][s] = hc.sum[1][s] = hc.sum[2][s] = 0.f;
    }
    __syncthreads();
    col_pass<KIND, T, I, VEC, MODE, BATCH, true, true>(p);
    __syncthreads();
#if !DFGNN_GAT_NO_ATOMICS
    for (int s = threadIdx.x; s < kHubSlots; s += blockDim.x) {
      const int key = hc.key[s];
      if (key >= 0)
        gat_acc_add(p.gat_acc + (int64_t)key * kGatAcc,
                    make_float4(hc.sum[0][s], hc.sum[1][s], hc.sum[2][s], 0.f), true, true);
    }
#endif
  } else {
    col_pass<KIND, T, I, VEC, MODE, BATCH, true>(p);
  }
}

// ------------------------------------------- GAT's single-gather backward
// GAT's score is a scalar per edge (z_ij = a_src_j + a_dst_i (+ e_ij)), so of
// its backward only dP_ij = <dO_i, x_j> and d_val[j] = sum_i alpha~_ij dO_i
// need feature rows, and both can come from the column pass's one gather of
// dO_i (emit-dP mode above: x_j is the column's own row).  What remains is
// scalar per (edge, head) and runs as two light passes over the per-edge dP
// array, instead of a row pass gathering x_j a second time:
//   bwd_gat_row_kernel (CSR): the column pass wrote alpha~_ij dP_ij (alpha~ =
//     alpha times the dropout keep factor), so Delta_i = sum_j alpha~_ij dP_ij
//     exactly (no <dO_i, O_i> from the rounded stored output) is a contiguous
//     sum; g_ij = dS_ij LeakyReLU'(z_ij) with dS_ij = alpha~_ij dP_ij - alpha_ij
//     Delta_i is written over it, d_dst[i] = sum_j dS_ij (LeakyReLU'(z_ij) - 1)
//     (centred, see the row pass), d_edge = g;
//   bwd_gat_src_kernel (transposed CSR): d_src[j] = sum_i g_ij.
// One warp per work item; lane l takes head l % H of edge l / H, so a warp
// reads H*P consecutive entries of the [E, H] array at once (P = 32 / H
// edges per step) and the per-head sums are trees over the lanes of a head.
// Split rows: phase 0 writes each segment's Delta partial (merged by the
// launcher into p.delta), phase 1 finishes their segments.
struct HeadLanes {
  int H, P, lane, h, e;   // heads, edges per step, lane, its head and edge offset
  __device__ __forceinline__ explicit HeadLanes(int64_t heads) {
    H = (int)heads;
    P = 32 / H;
    lane = threadIdx.x & 31;
    h = lane % H;
    e = lane < H * P ? lane / H : P;   // lanes past H * P take no edges
  }
  // this lane's first position of the range [b, end) (end: none)
  __device__ __forceinline__ int64_t first(int64_t b, int64_t end) const {
    return e < P ? b + e : end;
  }
  // the sum over the lanes of this lane's head, in every lane
  __device__ __forceinline__ float sum(float v) const {
    int o = 1;
    while (o < P) o <<= 1;
    for (o >>= 1; o > 0; o >>= 1) {
      const float w = __shfl_down_sync(0xffffffffu, v, o * H);
      if (e + o < P) v += w;
    }
    return __shfl_sync(0xffffffffu, v, h);
  }
};

template <typename T, typename I, int PHASE>
__global__ void __launch_bounds__(kThreads, DFGNN_SCALAR_BLOCKS) bwd_gat_row_kernel(const Params<T, I> p) {
  const int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (item >= p.num_items) return;   // warp-uniform
  int64_t row, begin, end, slot;
  load_item(p.work, p.rowptr, item, row, begin, end, slot);
  if (PHASE == 1 && slot < 0) return;
  const HeadLanes hl(p.H);
  const int64_t H = p.H, h = hl.h, step = hl.P;
  const int64_t rh = row * H + h;
  const float a_dst = to_f(p.dst[rh]);
  const float m = p.lse_in[rh], logl = p.lse_l_in[rh];
  // the column pass wrote pd_ij = alpha~_ij dP_ij (alpha~ = alpha * keep)
  float delta;
  if (PHASE == 1) {
    delta = p.delta[rh];
  } else {   // Delta_i = sum_j alpha~_ij dP_ij: a contiguous run of the [E, H] array
    float d = 0.f;
    for (int64_t pos = hl.first(begin, end); pos < end; pos += step) d += p.ds[pos * H + h];
    delta = hl.sum(d);
    if (slot >= 0) {   // a segment of a split row: its part of Delta only
      if (hl.e == 0) p.part2[slot * H + h] = delta;
      return;
    }
  }
  // dS_ij = alpha~_ij dP_ij - alpha_ij Delta_i, with z and alpha recomputed as
  // the row pass does; g = dS LeakyReLU'(z) overwrites pd_ij
  float gacc = 0.f;
  for (int64_t pos = hl.first(begin, end); pos < end; pos += step) {
    const I j = p.col[pos];
    const int64_t eo = p.edge ? (p.perm ? (int64_t)p.perm[pos] : pos) : 0;
    float z = to_f(p.src[(int64_t)j * H + h]) + a_dst;
    if (p.edge) z += to_f(p.edge[eo * H + h]);
    const float alpha = expf((leaky(z, p.slope) - m) - logl);
    const float dS = p.ds[pos * H + h] - alpha * delta;
    const float gv = dS * dleaky(z, p.slope);
    p.ds[pos * H + h] = gv;
    if (p.d_edge) p.d_edge[eo * H + h] = from_f<T>(gv);
    gacc += gv - dS;   // sum_j dS_ij (LeakyReLU'(z_ij) - 1): see "Centred row sums"
  }
  gacc = hl.sum(gacc);
  if (hl.e == 0) {
    if (slot < 0) p.d_dst[rh] = from_f<T>(gacc);
    else p.part1[slot * H + h] = gacc;
  }
}

// The source side's scalar pass (transposed CSR):
//   FIX = false (stored mode): d_src[j] = sum_i g_ij from the per-edge array;
//   FIX = true (the atomic mode's correction): d_src[j] = (the column pass's
//     fp32 sum) + sum_i alpha_ij LeakyReLU'(z_ij) eps_i, alpha and z recomputed
//     from the scalars (eps_i, the 4th of the rows' sums: 0 where the row is
//     not dominated).
// A segment of a split column writes (FIX: adds to) its slot, merged after.
template <typename T, typename I, bool FIX>
__global__ void __launch_bounds__(kThreads, DFGNN_SCALAR_BLOCKS) bwd_gat_src_kernel(const Params<T, I> p) {
  const int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (item >= p.num_items) return;   // warp-uniform
  int64_t src, begin, end, slot;
  load_item(p.work, p.t_rowptr, item, src, begin, end, slot);
  const HeadLanes hl(p.H);
  const int64_t H = p.H, h = hl.h;
  const float a_src = FIX ? to_f(p.src[src * H + h]) : 0.f;
  float acc = 0.f;
  for (int64_t q = hl.first(begin, end); q < end; q += hl.P) {
    if constexpr (FIX) {
      const int64_t ih = (int64_t)p.t_col[q] * H + h;
      // (a row that is not dominated has eps_i = 0: tested on the forward's
      // log l_i, whose heads of a row share a 32-byte sector, before eps_i,
      // whose heads' sums lie 32 bytes apart)
      if (!(p.lse_l_in[ih] < kDominated)) continue;
      const float eps = p.gat_acc[ih * kGatAcc + 3];
      if (eps == 0.f) continue;
      const float4 st = reinterpret_cast<const float4*>(p.gat_acc)[ih * 2 + 1];
      const float z = a_src + st.z;
      const float alpha = expf((leaky(z, p.slope) - st.x) - fabsf(st.y));   // (HubCache's mark)
      acc += alpha * dleaky(z, p.slope) * eps;
    } else {
      acc += p.ds[(int64_t)p.t_perm[q] * H + h];
    }
  }
  acc = hl.sum(acc);
  if (hl.e == 0) {
    if (slot >= 0) p.part2[slot * H + h] = FIX ? p.part2[slot * H + h] + acc : acc;
    else p.d_src[src * H + h] = from_f<T>(FIX ? p.d_src_f[src * H + h] + acc : acc);
  }
}

// ------------------------------------------- GAT's atomic backward
// Nothing per edge is stored (bwd_gat_atomic in attention_launch.cuh).  The
// column pass (kColAtomic) gathers dO_i once per edge, as emit-dP does, and
// forms dS_ij = alpha_ij (keep_ij dP_ij - D_i) with D_i = <dO_i, O_i> taken
// before it (row_delta_kernel).  It sums d_val and d_src[j] = sum_i dS_ij
// LeakyReLU'(z_ij) over its own column and adds per edge, with one 16-byte
// atomic into the destination row's fp32 sums, where LeakyReLU'(z_ij) != 1
// d_dst's centred term dS_ij (LeakyReLU' - 1) and alpha_ij (LeakyReLU' - 1),
// and in a dominated row (kDominated) the exact Delta's term alpha~_ij dP_ij.
//
// D_i is only <dO, O>'s rounding away from the exact Delta X_i = sum_j
// alpha~_ij dP_ij, but in a nearly saturated row that rounding dominates dS
// (see the row pass), so in the dominated rows the exact-Delta gradients are
// restored after the pass with eps_i = D_i - X_i (0 elsewhere):
// dS_ij(X) = dS_ij(D) + alpha_ij eps_i, hence
//   d_dst[i] += eps_i sum_j alpha_ij (LeakyReLU'(z_ij) - 1)  (bwd_gat_eps_kernel)
//   d_src[j] += sum_i alpha_ij LeakyReLU'(z_ij) eps_i        (bwd_gat_src_kernel<.., true>)
// The two parts are each rounded on the scale of their own terms (|dS(D)| and
// alpha |eps|, both small where the row is saturated), so the result has the
// accuracy of the exact-Delta backward, in fp32 sums whose order the atomics
// leave open (not bit-reproducible; torch.use_deterministic_algorithms takes
// the stored mode).

// D_i = <dO_i, O_i> per (row, head), O = out - sub in fp32 from a stored
// output in the caller's width C (the padding columns of O are zero): sub is
// GAT's or GATv2's output bias (row stride 0), the Transformer's skip
// projection x W_s^T + b_s, or none; 8 lanes per (row, head).  GAT's atomic
// mode takes it as the 4th of the row's sums {0, 0, 0, D_i} (acc, kGatAcc
// floats per (row, head)), whose other three the column pass then accumulates
// (so they need no memset), with the row's statistics {m_i, log l_i, a_dst_i,
// D_i} after them (lse: the forward's [2, NH] m and log l; a_dst: the
// destination logits [NH]; log l_i marked (hub_mark) where row i's in-degree,
// from rowptr, is at least hub_min > 0); a layer op as the row pass's Delta
// (delta: Params::delta_in, row_delta).
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads) row_delta_kernel(
    int64_t NH, int64_t H, int64_t C, const T* dout, int64_t sd0, int64_t sd1, const T* out,
    int64_t so0, int64_t so1, const T* sub, int64_t ss0, int64_t ss1, const float* lse,
    const T* a_dst, float4* acc, float* delta, const I* rowptr, int64_t hub_min) {
  constexpr int L = 8;
  const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / L;
  const int lane = threadIdx.x & (L - 1);
  float s = 0.f;
  if (r < NH) {
    const int64_t i = r / H, h = r % H;
    const T* d = dout + i * sd0 + h * sd1;
    const T* o = out + i * so0 + h * so1;
    const T* b = sub ? sub + i * ss0 + h * ss1 : nullptr;
    for (int64_t f = lane; f < C; f += L) {
      float ov = to_f(o[f]);
      if (b) ov -= to_f(b[f]);
      s += to_f(d[f]) * ov;
    }
  }
#pragma unroll
  for (int k = L / 2; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k, L);
  if (r < NH && lane == 0) {
    if (acc) {
      acc[2 * r] = make_float4(0.f, 0.f, 0.f, s);
      const int64_t i = r / H;
      const float logl = lse[NH + r];
      const bool hub = hub_min > 0 && (int64_t)rowptr[i + 1] - (int64_t)rowptr[i] >= hub_min;
      acc[2 * r + 1] = make_float4(lse[r], hub ? hub_mark(logl) : logl, to_f(a_dst[r]), s);
    } else {
      delta[r] = s;
    }
  }
}

// row_delta_kernel's launch (8 lanes per (row, head)) on `stream`, checked: the
// one place both callers (GAT's atomic backward, the layer ops' row_delta) go
// through
template <typename T, typename I = int32_t>
void launch_row_delta(int64_t NH, int64_t H, int64_t C, const T* dout, int64_t sd0, int64_t sd1,
                      const T* out, int64_t so0, int64_t so1, const T* sub, int64_t ss0,
                      int64_t ss1, const float* lse, const T* a_dst, float4* acc, float* delta,
                      cudaStream_t stream, const I* rowptr = nullptr, int64_t hub_min = 0) {
  if (NH == 0) return;
  const int64_t threads = NH * 8;
  row_delta_kernel<T, I><<<(unsigned)((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      NH, H, C, dout, sd0, sd1, out, so0, so1, sub, ss0, ss1, lse, a_dst, acc, delta, rowptr,
      rowptr ? hub_min : 0);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// After the column pass, per (destination row, head): eps_i = D_i - X_i
// (written over D, the 4th of the row's sums) and d_dst.
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads) bwd_gat_eps_kernel(const Params<T, I> p, int64_t NH) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= NH) return;
  const float4 a = reinterpret_cast<const float4*>(p.gat_acc)[2 * r];
  const float eps = p.lse_l_in[r] < kDominated ? a.w - a.x : 0.f;
  p.gat_acc[r * kGatAcc + 3] = eps;
  p.d_dst[r] = from_f<T>(a.y + eps * a.z);
}

// Sum partials of split items: out[row, h, :] = sum_{s in [s0, s1)} part[s, h, :]
// (out's rows ld elements apart; kMergeThreads per block, one block per
// (merged row, head)).
template <typename T, typename I>
__global__ void __launch_bounds__(kMergeThreads) merge_sum_kernel(const I* merge, int64_t R,
                                                                  int64_t H, int64_t F,
                                                                  const float* part, T* out,
                                                                  int64_t ld) {
  const int64_t rh = blockIdx.x;
  if (rh >= R * H) return;
  const int64_t r = rh / H, h = rh % H;
  const int64_t row = merge[r * 3], s0 = merge[r * 3 + 1], s1 = merge[r * 3 + 2];
  merge_features(s0, s1, H, h, F, part,
                 [=](int64_t f, float a) { out[row * ld + h * F + f] = from_f<T>(a); });
}

}  // namespace dfgnn
