// Fused graph-attention kernels: one templated family for GAT, GATv2 and
// dot-product (Graph Transformer / AGNN) attention on a destination-major CSR.
//
// Thread mapping (level 2 of the schedule): a *group* of G lanes (G in
// {4, 8, 16, 32}, a runtime value) owns one (work item, head).  A work item is
// a destination row or a segment of a super row.  Lanes split the features
// (VEC elements each, 16-byte loads when aligned, MAXC chunks per tile) and
// share the edges: edges are consumed in chunks of G, lane t computing the
// score of the chunk's t-th edge once (exp computed once per edge), followed
// by an online-softmax update (running max m and sum l in registers) and a
// broadcast-gather of the value rows.  Nothing per edge is written in the
// forward pass except the optional attention weights.
//
// Backward (FlashAttention-2 style) recomputes alpha from the saved
// logsumexp: a row pass writes dS (and the post-dropout alpha) per edge as
// fp32 [E, H] and accumulates destination-side gradients; a column pass over
// the transposed CSR accumulates source-side gradients without atomics.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Half.h>
#include <c10/util/BFloat16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace dfgnn {

enum Kind : int { GAT = 0, GATV2 = 1, DOT = 2 };

constexpr int kThreads = 256;
constexpr int kMaxChunks = 2;  // feature chunks per lane per tile (registers)

// ------------------------------------------------------------------ numerics
template <typename T> __device__ __forceinline__ float to_f(T x) { return static_cast<float>(x); }
template <typename T> __device__ __forceinline__ T from_f(float x) { return static_cast<T>(x); }

template <int BYTES> struct RawVec;
template <> struct RawVec<2> { using type = uint16_t; };
template <> struct RawVec<4> { using type = uint32_t; };
template <> struct RawVec<8> { using type = uint2; };
template <> struct RawVec<16> { using type = uint4; };

template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, float (&v)[VEC]) {
  if constexpr (VEC == 1) {
    v[0] = to_f(p[0]);
  } else {
    using R = typename RawVec<sizeof(T) * VEC>::type;
    R raw = __ldg(reinterpret_cast<const R*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = to_f(e[k]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* __restrict__ p, const float (&v)[VEC]) {
  if constexpr (VEC == 1) {
    p[0] = from_f<T>(v[0]);
  } else {
    using R = typename RawVec<sizeof(T) * VEC>::type;
    R raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) e[k] = from_f<T>(v[k]);
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
  int64_t H, F;        // heads, features of the value (and of q/k for vector scores)
  int G;               // lanes per (item, head)
  int64_t tile;        // features per tile handled by one launch column
  float scale, slope, drop_p;
  uint64_t seed;
  // forward outputs
  T* out; float* lse; T* alpha;
  float *part_acc, *part_m, *part_l;  // split-row partials [S, H, F] / [S, H]
  // backward
  const T* dout; const T* o; const float* lse_in;
  float* ds; float* pd;                // per edge [E, H] (CSR order)
  T* d_dst; T* d_src; T* d_val; T* d_edge; float* d_att_part;
  float *part1, *part2;                // partial sums of split items
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

// The edge this lane handles in the chunk starting at base: CSR position e,
// source j and original edge id eo (zeros past the end).
struct EdgeLane {
  int64_t e, j, eo;
  bool valid;
};

template <typename T, typename I>
__device__ __forceinline__ EdgeLane edge_lane(const Params<T, I>& p, const Group& g,
                                              int64_t base, int64_t end) {
  EdgeLane l;
  l.e = base + g.lg;
  l.valid = l.e < end;
  l.j = l.valid ? (int64_t)p.col[l.e] : 0;
  l.eo = l.valid ? (p.perm ? (int64_t)p.perm[l.e] : l.e) : 0;
  return l;
}

// Group-reduced pair term over all features of one (row, source, head):
//   LEAKY = false: <x, y (+ e)>          (dot scores, dP, Delta)
//   LEAKY = true:  <w, LeakyReLU(x + y (+ e))>   (GATv2 scores)
// All lanes return it.
template <bool LEAKY, typename T, int VEC>
__device__ __forceinline__ float vec_reduce(const Group& g, const T* x, const T* y, const T* e,
                                            const T* w, int64_t F, float slope) {
  float part = 0.f;
  for (int64_t f = (int64_t)g.lg * VEC; f < F; f += (int64_t)g.G * VEC) {
    float a[VEC], b[VEC];
    load_vec<T, VEC>(x + f, a);
    load_vec<T, VEC>(y + f, b);
    if (e) {
      float c[VEC];
      load_vec<T, VEC>(e + f, c);
#pragma unroll
      for (int k = 0; k < VEC; ++k) b[k] += c[k];
    }
    if constexpr (LEAKY) {
      float ww[VEC];
      load_vec<T, VEC>(w + f, ww);
#pragma unroll
      for (int k = 0; k < VEC; ++k) part += ww[k] * leaky(a[k] + b[k], slope);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) part += a[k] * b[k];
    }
  }
  return g.sum(part);
}

template <typename T, int VEC>
__device__ __forceinline__ float vec_dot(const Group& g, const T* x, const T* y, const T* e,
                                         int64_t F) {
  return vec_reduce<false, T, VEC>(g, x, y, e, nullptr, F, 0.f);
}

// Score of edge (i <- j) with original id eo (vector kinds; GAT's score is a
// scalar per lane).
template <int KIND, typename T, typename I, int VEC>
__device__ __forceinline__ float vec_score(const Params<T, I>& p, const Group& g, int64_t i,
                                           int64_t j, int64_t eo, int64_t h) {
  const int64_t F = p.F;
  const float r = vec_reduce<KIND == GATV2, T, VEC>(
      g, p.dst + (i * p.H + h) * F, p.src + (j * p.H + h) * F,
      p.edge ? p.edge + (eo * p.H + h) * F : nullptr, KIND == GATV2 ? p.att + h * F : nullptr,
      F, p.slope);
  return KIND == DOT ? r * p.scale : r;
}

// Scores of one chunk of <= G edges: lane t gets the score (and, for GAT, the
// pre-activation z) of edge base + t; -inf for lanes past the end.
template <int KIND, typename T, typename I, int VEC>
__device__ __forceinline__ float chunk_scores(const Params<T, I>& p, const Group& g, int64_t row,
                                              int64_t h, int64_t base, int64_t end, bool valid,
                                              int64_t j, int64_t eo, float a_dst, float& z) {
  float s = -INFINITY;
  z = 0.f;
  if constexpr (KIND == GAT) {
    if (valid) {
      z = to_f(p.src[j * p.H + h]) + a_dst;
      if (p.edge) z += to_f(p.edge[eo * p.H + h]);
      s = leaky(z, p.slope);
    }
  } else {
    const int cnt = (int)imin(g.G, end - base);
#pragma unroll 4
    for (int t = 0; t < cnt; ++t) {
      const int64_t jt = g.bcast(j, t), et = g.bcast(eo, t);
      const float st = vec_score<KIND, T, I, VEC>(p, g, row, jt, et, h);
      if (g.lg == t) s = st;
    }
  }
  return s;
}

__device__ __forceinline__ float keep_factor(float drop_p, uint64_t seed, int64_t e, int64_t H,
                                             int64_t h) {
  if (drop_p <= 0.f) return 1.f;
  return philox_uniform(seed, (uint64_t)(e * H + h)) >= drop_p ? 1.f / (1.f - drop_p) : 0.f;
}

// Feature offset of chunk c of the tile for this lane, or -1 when outside.
__device__ __forceinline__ int64_t feat_at(const Group& g, int64_t f0, int64_t tile, int64_t F,
                                           int c, int VEC) {
  const int64_t f = f0 + (int64_t)c * g.G * VEC + (int64_t)g.lg * VEC;
  return (f < F && f < f0 + tile) ? f : -1;
}

// =============================================================== forward
template <int KIND, typename T, typename I, int VEC>
__global__ void __launch_bounds__(kThreads, 3) fwd_kernel(const Params<T, I> p) {
  const Group g(p.G);
  Item it;
  if (!get_item(p, p.rowptr, it)) return;
  const int64_t h = it.h, row = it.row, begin = it.begin, end = it.end,
                slot = it.slot;
  const int64_t F = p.F, f0 = (int64_t)blockIdx.y * p.tile;
  const float a_dst = KIND == GAT ? to_f(p.dst[row * p.H + h]) : 0.f;

  float m = -INFINITY, l = 0.f;
  float acc[kMaxChunks][VEC];
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c)
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[c][k] = 0.f;

  for (int64_t base = begin; base < end; base += g.G) {
    const EdgeLane el = edge_lane(p, g, base, end);
    const int64_t e = el.e, j = el.j, eo = el.eo;
    const bool valid = el.valid;
    float z;
    const float s = chunk_scores<KIND, T, I, VEC>(p, g, row, h, base, end, valid, j, eo, a_dst, z);
    const float nm = fmaxf(m, g.max(s));
    const float corr = __expf(m - nm);
    const float pe = valid ? __expf(s - nm) : 0.f;
    l = l * corr + g.sum(pe);
    const float w = valid ? pe * keep_factor(p.drop_p, p.seed, e, p.H, h) : 0.f;
#pragma unroll
    for (int c = 0; c < kMaxChunks; ++c)
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[c][k] *= corr;
    const int cnt = (int)imin(g.G, end - base);
#pragma unroll 4
    for (int t = 0; t < cnt; ++t) {
      const int64_t jt = g.bcast(j, t);
      const float wt = g.bcast(w, t);
      const int64_t et = (KIND == DOT && p.edge) ? g.bcast(eo, t) : 0;
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) {
        const int64_t f = feat_at(g, f0, p.tile, F, c, VEC);
        if (f < 0) continue;
        float v[VEC];
        load_vec<T, VEC>(p.val + (jt * p.H + h) * F + f, v);
        if (KIND == DOT && p.edge) {
          float ev[VEC];
          load_vec<T, VEC>(p.edge + (et * p.H + h) * F + f, ev);
#pragma unroll
          for (int k = 0; k < VEC; ++k) v[k] += ev[k];
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[c][k] += wt * v[k];
      }
    }
    m = nm;
  }

  if (slot < 0) {
    const float inv = 1.f / (l + 1e-16f);
#pragma unroll
    for (int c = 0; c < kMaxChunks; ++c) {
      const int64_t f = feat_at(g, f0, p.tile, F, c, VEC);
      if (f < 0) continue;
      float v[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = acc[c][k] * inv;
      store_vec<T, VEC>(p.out + (row * p.H + h) * F + f, v);
    }
    if (blockIdx.y == 0 && g.lg == 0)
      p.lse[row * p.H + h] = end > begin ? m + __logf(l + 1e-16f) : -INFINITY;
  } else {
#pragma unroll
    for (int c = 0; c < kMaxChunks; ++c) {
      const int64_t f = feat_at(g, f0, p.tile, F, c, VEC);
      if (f < 0) continue;
#pragma unroll
      for (int k = 0; k < VEC; ++k) p.part_acc[(slot * p.H + h) * F + f + k] = acc[c][k];
    }
    if (blockIdx.y == 0 && g.lg == 0) {
      p.part_m[slot * p.H + h] = m;
      p.part_l[slot * p.H + h] = l;
    }
  }
}

// Merge the partial (m, l, acc) of split rows: merge [R, 3] = (row, s0, s1).
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads) fwd_merge_kernel(const I* merge, int64_t R, int64_t H,
                                                             int64_t F, const float* part_acc,
                                                             const float* part_m,
                                                             const float* part_l, T* out,
                                                             float* lse) {
  const int64_t rh = blockIdx.x;  // one block per (merged row, head)
  if (rh >= R * H) return;
  const int64_t r = rh / H, h = rh % H;
  const int64_t row = merge[r * 3], s0 = merge[r * 3 + 1], s1 = merge[r * 3 + 2];
  float M = -INFINITY;
  for (int64_t s = s0; s < s1; ++s) M = fmaxf(M, part_m[s * H + h]);
  float L = 0.f;
  for (int64_t s = s0; s < s1; ++s) L += part_l[s * H + h] * __expf(part_m[s * H + h] - M);
  const float inv = 1.f / (L + 1e-16f);
  for (int64_t f = threadIdx.x; f < F; f += blockDim.x) {
    float a = 0.f;
    for (int64_t s = s0; s < s1; ++s)
      a += part_acc[(s * H + h) * F + f] * __expf(part_m[s * H + h] - M);
    out[(row * H + h) * F + f] = from_f<T>(a * inv);
  }
  if (threadIdx.x == 0) lse[row * H + h] = M + __logf(L + 1e-16f);
}

// Attention weights (post-dropout) in original edge order, from the final lse.
template <int KIND, typename T, typename I, int VEC>
__global__ void __launch_bounds__(kThreads) alpha_kernel(const Params<T, I> p) {
  const Group g(p.G);
  Item it;
  if (!get_item(p, p.rowptr, it)) return;
  const int64_t h = it.h, row = it.row, begin = it.begin, end = it.end,
                slot = it.slot;
  const float a_dst = KIND == GAT ? to_f(p.dst[row * p.H + h]) : 0.f;
  const float lse = p.lse[row * p.H + h];
  for (int64_t base = begin; base < end; base += g.G) {
    const EdgeLane el = edge_lane(p, g, base, end);
    const int64_t e = el.e, j = el.j, eo = el.eo;
    const bool valid = el.valid;
    float z;
    const float s = chunk_scores<KIND, T, I, VEC>(p, g, row, h, base, end, valid, j, eo, a_dst, z);
    if (valid)
      p.alpha[eo * p.H + h] =
          from_f<T>(__expf(s - lse) * keep_factor(p.drop_p, p.seed, e, p.H, h));
  }
}

// dP of one chunk: lane t gets <dO_i, v_j (+ e_ij)> of edge base + t.
template <int KIND, typename T, typename I, int VEC>
__device__ __forceinline__ float chunk_dP(const Params<T, I>& p, const Group& g, const T* dO,
                                          int64_t h, int64_t base, int64_t end, int64_t j,
                                          int64_t eo) {
  float dP = 0.f;
  const int cnt = (int)imin(g.G, end - base);
#pragma unroll 4
  for (int t = 0; t < cnt; ++t) {
    const int64_t jt = g.bcast(j, t), et = g.bcast(eo, t);
    const T* ev = (KIND == DOT && p.edge) ? p.edge + (et * p.H + h) * p.F : nullptr;
    const float d = vec_dot<T, VEC>(g, dO, p.val + (jt * p.H + h) * p.F, ev, p.F);
    if (g.lg == t) dP = d;
  }
  return dP;
}

// ============================================================== backward
// Row pass: per (item, head) recompute alpha, write dS-derived g and the
// post-dropout alpha per edge, accumulate destination-side gradients.
//   GAT:   g = dS * LeakyReLU'(z)   d_dst[i]  = sum_j g
//   GATV2: g = dS                    d_dst[i]  = sum_j g * att * LeakyReLU'(z_ij)
//                                    d_att    += sum_j g * LeakyReLU(z_ij)
//   DOT:   g = dS * scale            d_dst[i]  = sum_j g * (k_j + e_ij)
// Per-edge input gradients (edge terms) are written here too.
template <int KIND, typename T, typename I, int VEC>
__global__ void __launch_bounds__(kThreads, 2) bwd_row_kernel(const Params<T, I> p) {
  const Group g(p.G);
  Item it;
  if (!get_item(p, p.rowptr, it)) return;
  const int64_t item = it.item, h = it.h, row = it.row, begin = it.begin, end = it.end,
                slot = it.slot;
  const int64_t F = p.F, f0 = (int64_t)blockIdx.y * p.tile;
  const float a_dst = KIND == GAT ? to_f(p.dst[row * p.H + h]) : 0.f;
  const T* dO = p.dout + (row * p.H + h) * F;
  float delta = vec_dot<T, VEC>(g, dO, p.o + (row * p.H + h) * F, nullptr, F);
  const float lse = p.lse_in[row * p.H + h];
  if constexpr (sizeof(T) < 4) {
    // fp16/bf16: O was rounded when stored, and <dO, O> then biases every dS of
    // the row.  Recompute Delta = sum_j alpha~_ij dP_ij in fp32 instead (one
    // extra pass; split rows keep the stored-O form).
    if (slot < 0) {
      float dsum = 0.f;
      for (int64_t base = begin; base < end; base += g.G) {
        const EdgeLane el = edge_lane(p, g, base, end);
        const int64_t e = el.e, j = el.j, eo = el.eo;
        const bool valid = el.valid;
        float z;
        const float s =
            chunk_scores<KIND, T, I, VEC>(p, g, row, h, base, end, valid, j, eo, a_dst, z);
        const float dP = chunk_dP<KIND, T, I, VEC>(p, g, dO, h, base, end, j, eo);
        if (valid) dsum += __expf(s - lse) * keep_factor(p.drop_p, p.seed, e, p.H, h) * dP;
      }
      delta = g.sum(dsum);
    }
  }

  float gacc = 0.f;
  float acc[kMaxChunks][VEC], acc2[kMaxChunks][VEC];
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c)
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[c][k] = acc2[c][k] = 0.f;

  for (int64_t base = begin; base < end; base += g.G) {
    const EdgeLane el = edge_lane(p, g, base, end);
    const int64_t e = el.e, j = el.j, eo = el.eo;
    const bool valid = el.valid;
    float z;
    const float s = chunk_scores<KIND, T, I, VEC>(p, g, row, h, base, end, valid, j, eo, a_dst, z);
    const float dP = chunk_dP<KIND, T, I, VEC>(p, g, dO, h, base, end, j, eo);
    const int cnt = (int)imin(g.G, end - base);
    const float alpha = valid ? __expf(s - lse) : 0.f;
    const float kf = valid ? keep_factor(p.drop_p, p.seed, e, p.H, h) : 0.f;
    const float dS = alpha * (dP * kf - delta);
    float gv;
    if constexpr (KIND == GAT) gv = dS * dleaky(z, p.slope);
    else if constexpr (KIND == DOT) gv = dS * p.scale;
    else gv = dS;
    const float pdv = alpha * kf;
    if (valid && blockIdx.y == 0) {
      p.ds[e * p.H + h] = gv;
      p.pd[e * p.H + h] = pdv;
      if (KIND == GAT && p.d_edge) p.d_edge[eo * p.H + h] = from_f<T>(gv);
    }
    if constexpr (KIND == GAT) {
      gacc += gv;
    } else {
#pragma unroll 2
      for (int t = 0; t < cnt; ++t) {
        const int64_t jt = g.bcast(j, t), et = g.bcast(eo, t);
        const float gt = g.bcast(gv, t), pt = g.bcast(pdv, t);
#pragma unroll
        for (int c = 0; c < kMaxChunks; ++c) {
          const int64_t f = feat_at(g, f0, p.tile, F, c, VEC);
          if (f < 0) continue;
          float kv[VEC], ev[VEC], dv[VEC];
          load_vec<T, VEC>(p.src + (jt * p.H + h) * F + f, kv);
          if (p.edge) load_vec<T, VEC>(p.edge + (et * p.H + h) * F + f, ev);
          else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) ev[k] = 0.f;
          }
          if constexpr (KIND == DOT) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) acc[c][k] += gt * (kv[k] + ev[k]);
            if (p.d_edge) {
              float q[VEC], o[VEC];
              load_vec<T, VEC>(p.dst + (row * p.H + h) * F + f, q);
              load_vec<T, VEC>(dO + f, o);
#pragma unroll
              for (int k = 0; k < VEC; ++k) dv[k] = gt * q[k] + pt * o[k];
              store_vec<T, VEC>(p.d_edge + (et * p.H + h) * F + f, dv);
            }
          } else {  // GATV2
            float xr[VEC], a[VEC];
            load_vec<T, VEC>(p.dst + (row * p.H + h) * F + f, xr);
            load_vec<T, VEC>(p.att + h * F + f, a);
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
              const float zz = kv[k] + xr[k] + ev[k];
              dv[k] = gt * a[k] * dleaky(zz, p.slope);
              acc[c][k] += dv[k];
              acc2[c][k] += gt * leaky(zz, p.slope);
            }
            if (p.d_edge) store_vec<T, VEC>(p.d_edge + (et * p.H + h) * F + f, dv);
          }
        }
      }
    }
  }

  if constexpr (KIND == GAT) {
    const float tot = g.sum(gacc);
    if (g.lg == 0 && blockIdx.y == 0) {
      if (slot < 0) p.d_dst[row * p.H + h] = from_f<T>(tot);
      else p.part1[slot * p.H + h] = tot;
    }
  } else {
#pragma unroll
    for (int c = 0; c < kMaxChunks; ++c) {
      const int64_t f = feat_at(g, f0, p.tile, F, c, VEC);
      if (f < 0) continue;
      if (slot < 0) store_vec<T, VEC>(p.d_dst + (row * p.H + h) * F + f, acc[c]);
      else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) p.part1[(slot * p.H + h) * F + f + k] = acc[c][k];
      }
      if (KIND == GATV2) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) p.d_att_part[(item * p.H + h) * F + f + k] = acc2[c][k];
      }
    }
  }
}

// Column pass over the transposed CSR: per (source item, head)
//   d_val[j] = sum_i pd_ij dO_i
//   GAT:   d_src[j] = sum_i g_ij                      ([N, H])
//   DOT:   d_src[j] = sum_i g_ij q_i
//   GATV2: d_src[j] = sum_i g_ij att LeakyReLU'(z_ij) + d_val[j]   (value = src)
template <int KIND, typename T, typename I, int VEC>
__global__ void __launch_bounds__(kThreads, 2) bwd_col_kernel(const Params<T, I> p) {
  const Group g(p.G);
  Item it;
  if (!get_item(p, p.t_rowptr, it)) return;
  const int64_t h = it.h, src = it.row, begin = it.begin, end = it.end, slot = it.slot;
  const int64_t F = p.F, f0 = (int64_t)blockIdx.y * p.tile;

  float gacc = 0.f;
  float dv[kMaxChunks][VEC], dk[kMaxChunks][VEC], xl[kMaxChunks][VEC], at[kMaxChunks][VEC];
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t f = feat_at(g, f0, p.tile, F, c, VEC);
#pragma unroll
    for (int k = 0; k < VEC; ++k) dv[c][k] = dk[c][k] = xl[c][k] = at[c][k] = 0.f;
    if (KIND == GATV2 && f >= 0) {
      load_vec<T, VEC>(p.src + (src * p.H + h) * F + f, xl[c]);
      load_vec<T, VEC>(p.att + h * F + f, at[c]);
    }
  }
  for (int64_t base = begin; base < end; base += g.G) {
    const int64_t t = base + g.lg;
    const bool valid = t < end;
    const int64_t cp = valid ? (int64_t)p.t_perm[t] : 0;   // CSR position
    const int64_t i = valid ? (int64_t)p.t_col[t] : 0;     // destination
    const float gv = valid ? p.ds[cp * p.H + h] : 0.f;
    const float pv = valid ? p.pd[cp * p.H + h] : 0.f;
    const int64_t eo = (KIND == GATV2 && p.edge && valid) ? (p.perm ? (int64_t)p.perm[cp] : cp) : 0;
    gacc += gv;
    const int cnt = (int)imin(g.G, end - base);
#pragma unroll 2
    for (int tt = 0; tt < cnt; ++tt) {
      const int64_t it = g.bcast(i, tt);
      const float gt = g.bcast(gv, tt), pt = g.bcast(pv, tt);
      const int64_t et = (KIND == GATV2 && p.edge) ? g.bcast(eo, tt) : 0;
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) {
        const int64_t f = feat_at(g, f0, p.tile, F, c, VEC);
        if (f < 0) continue;
        float o[VEC];
        load_vec<T, VEC>(p.dout + (it * p.H + h) * F + f, o);
#pragma unroll
        for (int k = 0; k < VEC; ++k) dv[c][k] += pt * o[k];
        if constexpr (KIND == DOT) {
          float q[VEC];
          load_vec<T, VEC>(p.dst + (it * p.H + h) * F + f, q);
#pragma unroll
          for (int k = 0; k < VEC; ++k) dk[c][k] += gt * q[k];
        } else if constexpr (KIND == GATV2) {
          float xr[VEC], ev[VEC];
          load_vec<T, VEC>(p.dst + (it * p.H + h) * F + f, xr);
          if (p.edge) load_vec<T, VEC>(p.edge + (et * p.H + h) * F + f, ev);
          else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) ev[k] = 0.f;
          }
#pragma unroll
          for (int k = 0; k < VEC; ++k)
            dk[c][k] += gt * at[c][k] * dleaky(xl[c][k] + xr[k] + ev[k], p.slope);
        }
      }
    }
  }
  // outputs: part1 <- the value-side gradient, part2 <- the source-side one
  if constexpr (KIND == GAT) {
    const float tot = g.sum(gacc);
    if (g.lg == 0 && blockIdx.y == 0) {
      if (slot < 0) p.d_src[src * p.H + h] = from_f<T>(tot);
      else p.part2[slot * p.H + h] = tot;
    }
  }
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t f = feat_at(g, f0, p.tile, F, c, VEC);
    if (f < 0) continue;
    if constexpr (KIND == GATV2) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) dk[c][k] += dv[c][k];
    }
    T* vout = KIND == GATV2 ? p.d_src : p.d_val;
    if (slot < 0) {
      if (vout) store_vec<T, VEC>(vout + (src * p.H + h) * F + f, KIND == GATV2 ? dk[c] : dv[c]);
      if (KIND == DOT) store_vec<T, VEC>(p.d_src + (src * p.H + h) * F + f, dk[c]);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        p.part1[(slot * p.H + h) * F + f + k] = KIND == GATV2 ? dk[c][k] : dv[c][k];
        if (KIND == DOT) p.part2[(slot * p.H + h) * F + f + k] = dk[c][k];
      }
    }
  }
}

// Sum partials of split items: out[row, h, :] = sum_{s in [s0, s1)} part[s, h, :].
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads) merge_sum_kernel(const I* merge, int64_t R, int64_t H,
                                                             int64_t F, const float* part, T* out) {
  const int64_t rh = blockIdx.x;
  if (rh >= R * H) return;
  const int64_t r = rh / H, h = rh % H;
  const int64_t row = merge[r * 3], s0 = merge[r * 3 + 1], s1 = merge[r * 3 + 2];
  for (int64_t f = threadIdx.x; f < F; f += blockDim.x) {
    float a = 0.f;
    for (int64_t s = s0; s < s1; ++s) a += part[(s * H + h) * F + f];
    out[(row * H + h) * F + f] = from_f<T>(a);
  }
}

}  // namespace dfgnn
