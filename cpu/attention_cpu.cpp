// Fused graph attention on CPU: GAT, GATv2 and dot-product (Graph Transformer /
// AGNN) attention on a destination-major CSR, the CPU twin of cuda/.
//
// The op contract is that of pyg_dfgnn.ops.reference (the test oracle) and of
// the CUDA kernels; the schedule arguments (sched, work, merge, t_work,
// t_merge) are accepted and ignored.
//
// Forward: one pass over the incoming edges of each destination row with an
// online (max-stabilised) softmax; nothing per edge is materialised except the
// optional attention weights.  It saves lse [2, N_dst, H] (float32):
// lse[0] = row max m (-inf for an empty row), lse[1] = log(l) with
// l = sum_j exp(s_ij - m) (0 for an empty row).
//
// Backward (FlashAttention-2 style): alpha_ij = exp((s_ij - m_i) - log l_i) is
// recomputed from lse.  A row pass over the CSR writes the per-edge score
// gradient g and the post-dropout alpha (fp32 [E, H] scratch) and accumulates
// destination-side gradients; a column pass over the transposed CSR
// accumulates source-side gradients without atomics.
//
// Parallel over rows (columns) with at::parallel_for, the rows split into one
// contiguous part per thread with equal edge counts; vectorised over features
// (contiguous float loops, `omp simd` reductions).  fp32 and bf16 inputs, fp32
// accumulation (fp16 and fp64 take the reference path in Python).
// Only the headers needed (not ATen/ATen.h): the JIT build stays short.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "../cuda/attention_schema.h"  // the op schemas, shared with the CUDA build

namespace dfgnn_cpu {
namespace {

enum Kind : int { GAT = 0, GATV2 = 1, DOT = 2 };
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using c10::optional;

// ------------------------------------------------------------------ numerics
inline float leaky(float z, float slope) { return z > 0.f ? z : z * slope; }
inline float dleaky(float z, float slope) { return z > 0.f ? 1.f : slope; }

// Philox4x32-10 of (counter_lo, counter_hi, 0, 0) keyed by seed: identical to
// pyg_dfgnn.ops.reference.philox_uniform and the CUDA kernels (top 24 bits of
// the first output word), indexed by csr_position * H + head.
inline float philox_uniform(uint64_t seed, uint64_t counter) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  return (float)(c0 >> 8) * (1.0f / 16777216.0f);
}

struct Dropout {
  float p = 0.f, inv = 1.f;
  uint64_t seed = 0;
  int64_t H = 1;
  Dropout(double p_, int64_t seed_, int64_t H_)
      : p((float)p_), inv(p_ > 0 ? (float)(1.0 / (1.0 - p_)) : 1.f), seed((uint64_t)seed_),
        H(H_) {}
  // keep / (1 - p) of CSR position e, head h
  inline float operator()(int64_t e, int64_t h) const {
    if (p <= 0.f) return 1.f;
    return philox_uniform(seed, (uint64_t)(e * H + h)) >= p ? inv : 0.f;
  }
};

// A row of n elements as float: the pointer itself for fp32 without an addend,
// else converted (plus `add`) into buf.
template <typename T>
inline const float* as_float(const T* p, const T* add, int64_t n, float* buf) {
  if constexpr (std::is_same<T, float>::value) {
    if (add == nullptr) return p;
  }
  if (add == nullptr) {
    for (int64_t f = 0; f < n; ++f) buf[f] = static_cast<float>(p[f]);
  } else {
    for (int64_t f = 0; f < n; ++f) buf[f] = static_cast<float>(p[f]) + static_cast<float>(add[f]);
  }
  return buf;
}

template <typename T>
inline void store(T* out, const float* x, int64_t n) {
  for (int64_t f = 0; f < n; ++f) out[f] = static_cast<T>(x[f]);
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t f = 0; f < n; ++f) s += a[f] * b[f];
  return s;
}

// <att, LeakyReLU(x + y)>
inline float leaky_dot(const float* att, const float* x, const float* y, int64_t n, float slope) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t f = 0; f < n; ++f) {
    const float z = x[f] + y[f];
    s += att[f] * (z > 0.f ? z : z * slope);
  }
  return s;
}

inline void axpy(float* y, float a, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t f = 0; f < n; ++f) y[f] += a * x[f];
}

inline void scal(float* y, float a, int64_t n) {
#pragma omp simd
  for (int64_t f = 0; f < n; ++f) y[f] *= a;
}

// ---------------------------------------------------------------- parallel
// Contiguous row ranges with about equal work (edges + rows) per part.
template <typename I>
std::vector<int64_t> split_rows(const I* rowptr, int64_t n, int64_t parts) {
  std::vector<int64_t> s(parts + 1, n);
  s[0] = 0;
  const int64_t total = (int64_t)rowptr[n] + n;
  for (int64_t k = 1; k < parts; ++k) {
    const int64_t target = total / parts * k + (total % parts) * k / parts;
    int64_t lo = s[k - 1], hi = n;  // first row r with rowptr[r] + r >= target
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if ((int64_t)rowptr[mid] + mid < target) lo = mid + 1; else hi = mid;
    }
    s[k] = lo;
  }
  return s;
}

template <typename I, typename Fn>
void parallel_rows(const I* rowptr, int64_t n, int64_t& parts_out, const Fn& fn) {
  const int64_t work = n > 0 ? (int64_t)rowptr[n] + n : 0;
  int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  if (work < 4096) parts = 1;  // too small to pay for a parallel region
  parts_out = parts;
  const std::vector<int64_t> s = split_rows(rowptr, n, parts);
  if (parts == 1) {
    fn(0, (int64_t)0, n);
    return;
  }
  at::parallel_for(0, parts, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) fn(k, s[k], s[k + 1]);
  });
}

// ---------------------------------------------------------------- arguments
template <typename T, typename I>
struct Args {
  const I *rowptr, *col, *perm, *t_rowptr, *t_col, *t_perm;
  const T *dst, *src, *val, *edge, *att;
  int64_t Nd, Ns, H, F, Fk;  // F: features of the value, Fk: of the score operands (GAT: 1)
  float scale, slope;
  Dropout drop;
};

template <typename T> const T* ptr(const at::Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; }
template <typename T> T* mptr(at::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr<T>() : nullptr; }

// Operands of one edge as float rows [H, Fk] / [H, F]: k = the source-side
// score operand (dot: k_j + e_ij; GATv2: x_j + e_ij; unused for GAT), v = the
// value (GAT, dot: value_j (+ e_ij for dot); GATv2: x_j).
struct EdgeRows { const float* k; const float* v; };

// Scores of edge e (source j) for all heads into s[H].  xi: the destination
// row's score operand [H, Fk] (GAT: [H]).
template <int KIND, typename T, typename I>
inline EdgeRows edge_scores(const Args<T, I>& a, int64_t e, int64_t j, const float* xi,
                            float* s, float* kbuf, float* vbuf, const float* att) {
  const int64_t H = a.H, F = a.F, Fk = a.Fk, eo = a.perm ? (int64_t)a.perm[e] : e;
  if constexpr (KIND == GAT) {
    for (int64_t h = 0; h < H; ++h) {
      float z = static_cast<float>(a.src[j * H + h]) + xi[h];
      if (a.edge) z += static_cast<float>(a.edge[eo * H + h]);
      s[h] = leaky(z, a.slope);
    }
    return {nullptr, as_float<T>(a.val + j * H * F, nullptr, H * F, vbuf)};
  } else if constexpr (KIND == GATV2) {
    const float* x = as_float<T>(a.src + j * H * F, a.edge ? a.edge + eo * H * F : nullptr,
                                 H * F, kbuf);
    for (int64_t h = 0; h < H; ++h)
      s[h] = leaky_dot(att + h * F, x + h * F, xi + h * F, F, a.slope);
    return {x, a.edge ? as_float<T>(a.src + j * H * F, nullptr, H * F, vbuf) : x};
  } else {
    const T* ep = a.edge ? a.edge + eo * H * Fk : nullptr;
    const float* k = as_float<T>(a.src + j * H * Fk, ep, H * Fk, kbuf);
    for (int64_t h = 0; h < H; ++h) s[h] = a.scale * dot(xi + h * Fk, k + h * Fk, Fk);
    return {k, as_float<T>(a.val + j * H * F, ep, H * F, vbuf)};  // edge => F == Fk
  }
}

// ---------------------------------------------------------------- prefetch
// Source rows are gathered at random: without software prefetch the kernels
// wait on the cache misses of every edge.  Rows of edge e + kAhead are
// requested while edge e is computed.
#ifndef DFGNN_PREFETCH_AHEAD
#define DFGNN_PREFETCH_AHEAD 4
#endif
constexpr int64_t kAhead = DFGNN_PREFETCH_AHEAD;

template <typename T>
inline void prefetch_row(const T* p, int64_t n) {
  if (kAhead == 0) return;
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < n * (int64_t)sizeof(T); b += 64) __builtin_prefetch(c + b);
}

template <int KIND, typename T, typename I>
inline void prefetch_edge(const Args<T, I>& a, int64_t e) {
  const int64_t j = a.col[e], H = a.H, F = a.F, Fk = a.Fk;
  if (KIND != GATV2) prefetch_row(a.val + j * H * F, H * F);
  prefetch_row(a.src + j * H * Fk, H * Fk);
  if (a.edge) {
    const int64_t eo = a.perm ? (int64_t)a.perm[e] : e;
    prefetch_row(a.edge + eo * H * Fk, H * Fk);
  }
}

// ================================================================= forward
template <int KIND, typename T, typename I>
void forward(const Args<T, I>& a, T* out, float* lse, T* alpha, const float* att) {
  const int64_t H = a.H, F = a.F, Fk = a.Fk;
  int64_t parts;
  parallel_rows(a.rowptr, a.Nd, parts, [&](int64_t, int64_t r0, int64_t r1) {
    std::vector<float> acc(H * F), m(H), l(H), s(H), xbuf(H * Fk), kbuf(H * Fk), vbuf(H * F);
    std::vector<float> sbuf;  // the row's scores when alpha is returned
    const int64_t e_end = a.rowptr[r1];
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t e0 = a.rowptr[i], e1 = a.rowptr[i + 1];
      const float* xi = as_float<T>(a.dst + i * H * Fk, nullptr, H * Fk, xbuf.data());
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.f);
      if (alpha) sbuf.resize((e1 - e0) * H);
      for (int64_t e = e0; e < e1; ++e) {
        if (e + kAhead < e_end) prefetch_edge<KIND>(a, e + kAhead);
        const EdgeRows r = edge_scores<KIND>(a, e, (int64_t)a.col[e], xi, s.data(), kbuf.data(),
                                             vbuf.data(), att);
        for (int64_t h = 0; h < H; ++h) {
          const float sv = s[h];
          if (alpha) sbuf[(e - e0) * H + h] = sv;
          if (sv > m[h]) {  // new row max: rescale what was summed so far
            if (l[h] > 0.f) {
              const float c = std::exp(m[h] - sv);
              l[h] *= c;
              scal(acc.data() + h * F, c, F);
            }
            m[h] = sv;
          }
          const float pe = std::exp(sv - m[h]);
          l[h] += pe;
          const float w = pe * a.drop(e, h);
          if (w != 0.f) axpy(acc.data() + h * F, w, r.v + h * F, F);
        }
      }
      const bool any = e1 > e0;
      for (int64_t h = 0; h < H; ++h) {
        const float inv = any ? 1.f / l[h] : 0.f;
        scal(acc.data() + h * F, inv, F);
        // GAT: att is the optional output bias [H, F], added before the one rounding
        if (KIND == GAT && att) axpy(acc.data() + h * F, 1.f, att + h * F, F);
        lse[i * H + h] = any ? m[h] : kNegInf;
        lse[(a.Nd + i) * H + h] = any ? std::log(l[h]) : 0.f;
        if (alpha) {
          for (int64_t e = e0; e < e1; ++e) {
            const int64_t eo = a.perm ? (int64_t)a.perm[e] : e;
            alpha[eo * H + h] = static_cast<T>(
                std::exp(sbuf[(e - e0) * H + h] - m[h]) * inv * a.drop(e, h));
          }
        }
      }
      store<T>(out + i * H * F, acc.data(), H * F);
    }
  });
}

// ================================================================ backward
struct BwdPtrsBase {
  const float* lse;
  float *ds, *pd;  // scratch [E, H] in CSR order: score gradient g, alpha * keep
};

template <typename T>
struct BwdPtrs : BwdPtrsBase {
  const T *o, *dout;
  T *d_dst, *d_src, *d_val, *d_edge;
};

// Row pass: per destination row recompute alpha, write g and alpha*keep per
// edge, accumulate d_dst (and the per-edge input gradients; GATv2's d_att into
// one [H, F] partial sum per part).
//   GAT:   g = dS * LeakyReLU'(z)   d_dst[i] = sum_j g
//   GATV2: g = dS                    d_dst[i] = sum_j g * att * LeakyReLU'(z_ij)
//   DOT:   g = dS * scale            d_dst[i] = sum_j g * (k_j + e_ij)
template <int KIND, typename T, typename I>
void backward_rows(const Args<T, I>& a, const BwdPtrs<T>& b, const float* att,
                   std::vector<std::vector<float>>& att_parts) {
  const int64_t H = a.H, F = a.F, Fk = a.Fk;
  // bf16: the stored O was rounded, and <dO, O> would bias every dS of
  // the row; Delta = sum_j alpha~_ij dP_ij is recomputed in fp32 instead.
  constexpr bool kRecomputeDelta = true;
  att_parts.assign(std::max<int64_t>(1, at::get_num_threads()), std::vector<float>());
  int64_t parts;
  parallel_rows(a.rowptr, a.Nd, parts, [&](int64_t part, int64_t r0, int64_t r1) {
    std::vector<float> s(H), delta(H), acc(H * Fk), xbuf(H * Fk), kbuf(H * Fk), vbuf(H * F),
        dobuf(H * F), obuf(H * F), ebuf(Fk);
    std::vector<float>& datt = att_parts[part];
    std::vector<float> datt_row(KIND == GATV2 ? H * F : 0);  // per row, then into datt
    if (KIND == GATV2) datt.assign(H * F, 0.f);
    const int64_t e_end = a.rowptr[r1];
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t e0 = a.rowptr[i], e1 = a.rowptr[i + 1];
      const float* xi = as_float<T>(a.dst + i * H * Fk, nullptr, H * Fk, xbuf.data());
      const float* dO = as_float<T>(b.dout + i * H * F, nullptr, H * F, dobuf.data());
      const float* mi = b.lse + i * H;
      const float* li = b.lse + (a.Nd + i) * H;
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(delta.begin(), delta.end(), 0.f);
      std::fill(datt_row.begin(), datt_row.end(), 0.f);
      if (kRecomputeDelta) {
        for (int64_t e = e0; e < e1; ++e) {
          if (e + kAhead < e1) prefetch_edge<KIND>(a, e + kAhead);
          const EdgeRows r = edge_scores<KIND>(a, e, (int64_t)a.col[e], xi, s.data(),
                                               kbuf.data(), vbuf.data(), att);
          for (int64_t h = 0; h < H; ++h)
            delta[h] += std::exp((s[h] - mi[h]) - li[h]) * a.drop(e, h) *
                        dot(dO + h * F, r.v + h * F, F);
        }
      } else if (e1 > e0) {
        const float* o = as_float<T>(b.o + i * H * F, nullptr, H * F, obuf.data());
        for (int64_t h = 0; h < H; ++h) delta[h] = dot(dO + h * F, o + h * F, F);
      }
      for (int64_t e = e0; e < e1; ++e) {
        if (e + kAhead < e_end) prefetch_edge<KIND>(a, e + kAhead);
        const int64_t j = a.col[e], eo = a.perm ? (int64_t)a.perm[e] : e;
        const EdgeRows r = edge_scores<KIND>(a, e, j, xi, s.data(), kbuf.data(), vbuf.data(),
                                             att);
        for (int64_t h = 0; h < H; ++h) {
          const float al = std::exp((s[h] - mi[h]) - li[h]);
          const float kf = a.drop(e, h);
          const float dS = al * (dot(dO + h * F, r.v + h * F, F) * kf - delta[h]);
          const float pdv = al * kf;
          b.pd[e * H + h] = pdv;
          if constexpr (KIND == GAT) {
            float z = static_cast<float>(a.src[j * H + h]) + xi[h];
            if (a.edge) z += static_cast<float>(a.edge[eo * H + h]);
            const float g = dS * dleaky(z, a.slope);
            b.ds[e * H + h] = g;
            acc[h] += g - dS;  // centred (cuda/attention_kernels.cuh, "Centred row sums")
            if (b.d_edge) b.d_edge[eo * H + h] = static_cast<T>(g);
          } else if constexpr (KIND == DOT) {
            const float g = dS * a.scale;
            b.ds[e * H + h] = g;
            axpy(acc.data() + h * Fk, g, r.k + h * Fk, Fk);
            if (b.d_edge) {  // d(k + e) and d(v + e) (F == Fk)
              float* dv = ebuf.data();
              const float* q = xi + h * Fk;
              const float* d = dO + h * F;
#pragma omp simd
              for (int64_t f = 0; f < Fk; ++f) dv[f] = g * q[f] + pdv * d[f];
              store<T>(b.d_edge + (eo * H + h) * Fk, dv, Fk);
            }
          } else {  // GATV2: z = x_j (+ e_ij) + x_i
            const float g = dS;
            b.ds[e * H + h] = g;
            const float* x = r.k + h * F;
            const float* xih = xi + h * F;
            const float* at = att + h * F;
            float* ac = acc.data() + h * F;
            float* da = datt_row.data() + h * F;
            float* dv = ebuf.data();
            const float slope = a.slope;
#pragma omp simd
            for (int64_t f = 0; f < F; ++f) {
              const float z = x[f] + xih[f];
              const float gz = g * at[f] * (z > 0.f ? 1.f : slope);
              dv[f] = gz;
              ac[f] += gz - g * at[f];  // centred (per edge here; see the GPU kernels)
              da[f] += g * ((z > 0.f ? z : z * slope) - (xih[f] > 0.f ? xih[f] : xih[f] * slope));
            }
            if (b.d_edge) store<T>(b.d_edge + (eo * H + h) * F, dv, F);
          }
        }
      }
      store<T>(b.d_dst + i * H * Fk, acc.data(), H * Fk);
      if (KIND == GATV2 && e1 > e0)
        for (int64_t f = 0; f < H * F; ++f) datt[f] += datt_row[f];
    }
  });
}

// Column pass over the transposed CSR: per source node j
//   d_val[j] = sum_i pd_ij dO_i
//   GAT:   d_src[j] = sum_i g_ij                                   ([N, H])
//   DOT:   d_src[j] = sum_i g_ij q_i
//   GATV2: d_src[j] = sum_i g_ij att LeakyReLU'(z_ij) + pd_ij dO_i   (value = src)
template <int KIND, typename T, typename I>
void backward_cols(const Args<T, I>& a, const BwdPtrs<T>& b, const float* att) {
  const int64_t H = a.H, F = a.F, Fk = a.Fk;
  int64_t parts;
  parallel_rows(a.t_rowptr, a.Ns, parts, [&](int64_t, int64_t c0, int64_t c1) {
    std::vector<float> dv(H * F), dk(H * Fk), xbuf(H * F), dobuf(H * F), qbuf(H * Fk);
    const int64_t t_end = a.t_rowptr[c1];
    for (int64_t j = c0; j < c1; ++j) {
      std::fill(dv.begin(), dv.end(), 0.f);
      std::fill(dk.begin(), dk.end(), 0.f);
      const float* xj = KIND == GATV2
                            ? as_float<T>(a.src + j * H * F, nullptr, H * F, xbuf.data())
                            : nullptr;
      for (int64_t t = a.t_rowptr[j]; t < a.t_rowptr[j + 1]; ++t) {
        if (t + kAhead < t_end) {  // the destination-side rows of a later edge
          const int64_t i2 = a.t_col[t + kAhead];
          prefetch_row(b.dout + i2 * H * F, H * F);
          if (KIND != GAT) prefetch_row(a.dst + i2 * H * Fk, H * Fk);
          __builtin_prefetch(b.ds + (int64_t)a.t_perm[t + kAhead] * H);
          __builtin_prefetch(b.pd + (int64_t)a.t_perm[t + kAhead] * H);
        }
        const int64_t cp = a.t_perm[t], i = a.t_col[t];
        const float* dO = as_float<T>(b.dout + i * H * F, nullptr, H * F, dobuf.data());
        const float* xi = nullptr;
        if constexpr (KIND == DOT) {
          xi = as_float<T>(a.dst + i * H * Fk, nullptr, H * Fk, qbuf.data());
        } else if constexpr (KIND == GATV2) {
          const int64_t eo = a.perm ? (int64_t)a.perm[cp] : cp;
          xi = as_float<T>(a.dst + i * H * F, a.edge ? a.edge + eo * H * F : nullptr, H * F,
                           qbuf.data());
        }
        for (int64_t h = 0; h < H; ++h) {
          const float g = b.ds[cp * H + h], pdv = b.pd[cp * H + h];
          if constexpr (KIND == GAT) {
            dk[h] += g;
          } else if constexpr (KIND == DOT) {
            axpy(dk.data() + h * Fk, g, xi + h * Fk, Fk);
          } else {
            const float* x = xj + h * F;
            const float* y = xi + h * F;
            const float* at = att + h * F;
            float* d = dk.data() + h * F;
            const float slope = a.slope;
#pragma omp simd
            for (int64_t f = 0; f < F; ++f) {
              const float z = x[f] + y[f];
              d[f] += g * at[f] * (z > 0.f ? 1.f : slope);
            }
          }
          if (pdv != 0.f) axpy(dv.data() + h * F, pdv, dO + h * F, F);
        }
      }
      if constexpr (KIND == GATV2) {
        for (int64_t f = 0; f < H * F; ++f) dk[f] += dv[f];
        store<T>(b.d_src + j * H * F, dk.data(), H * F);
      } else {
        store<T>(b.d_src + j * H * Fk, dk.data(), H * Fk);
        if (b.d_val) store<T>(b.d_val + j * H * F, dv.data(), H * F);
      }
    }
  });
}

// ================================================================ dispatch
at::Tensor opt(const optional<at::Tensor>& t) { return t.has_value() ? t->contiguous() : at::Tensor(); }

void check_cpu(const at::Tensor& t, const char* name) {
  if (!t.defined()) return;
  TORCH_CHECK(t.device().is_cpu(), "pyg_dfgnn: '", name, "' is on ", t.device(), ", expected cpu");
}

struct Inputs {
  at::Tensor rowptr, col, perm, t_rowptr, t_col, t_perm, dst, src, val, edge, att;
  int64_t kind, Nd, Ns, H, F, Fk;
};

Inputs inputs(int64_t kind, const at::Tensor& rowptr, const at::Tensor& col,
              const optional<at::Tensor>& perm, const at::Tensor& t_rowptr,
              const at::Tensor& t_col, const at::Tensor& t_perm, const at::Tensor& dst,
              const at::Tensor& src, const optional<at::Tensor>& val,
              const optional<at::Tensor>& edge, const optional<at::Tensor>& att) {
  Inputs in;
  in.kind = kind;
  TORCH_CHECK(kind >= 0 && kind <= 2, "pyg_dfgnn: unknown attention kind ", kind);
  in.rowptr = rowptr.contiguous(); in.col = col.contiguous(); in.perm = opt(perm);
  in.t_rowptr = t_rowptr.contiguous(); in.t_col = t_col.contiguous();
  in.t_perm = t_perm.contiguous();
  in.dst = dst.contiguous(); in.src = src.contiguous(); in.val = opt(val);
  in.edge = opt(edge); in.att = opt(att);
  const auto it = in.col.scalar_type();
  TORCH_CHECK(it == at::kInt || it == at::kLong, "pyg_dfgnn: index dtype must be int32/int64");
  for (auto* p : {&in.rowptr, &in.col, &in.perm, &in.t_rowptr, &in.t_col, &in.t_perm}) {
    if (!p->defined()) continue;
    TORCH_CHECK(p->scalar_type() == it, "pyg_dfgnn: graph index tensors must share one dtype");
    check_cpu(*p, "graph");
  }
  TORCH_CHECK(kind == GATV2 || in.val.defined(), "pyg_dfgnn: 'value' is required for this kind");
  TORCH_CHECK(kind != GATV2 || in.att.defined(), "pyg_dfgnn: 'att' is required for GATv2");
  const auto dt = in.src.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16,
              "pyg_dfgnn: the CPU kernels take float32/bfloat16 features, got ", dt);
  for (auto* t : {&in.dst, &in.src, &in.val, &in.edge, &in.att}) {
    if (!t->defined()) continue;
    TORCH_CHECK(t->scalar_type() == dt, "pyg_dfgnn: all features must share one dtype");
    check_cpu(*t, "features");
  }
  const at::Tensor& v = kind == GATV2 ? in.src : in.val;
  TORCH_CHECK(v.dim() == 3, "pyg_dfgnn: the value must be [N, H, F]");
  in.Nd = in.rowptr.numel() - 1;
  in.Ns = in.t_rowptr.numel() - 1;
  in.H = v.size(1);
  in.F = v.size(2);
  in.Fk = kind == GAT ? 1 : (in.dst.dim() == 3 ? in.dst.size(2) : -1);
  const int64_t E = in.col.numel();
  TORCH_CHECK(in.t_col.numel() == E && in.t_perm.numel() == E &&
                  (!in.perm.defined() || in.perm.numel() == E),
              "pyg_dfgnn: graph tensors disagree on the number of edges");
  TORCH_CHECK(in.src.size(0) == in.Ns && v.size(0) == in.Ns, "pyg_dfgnn: source features must "
              "have t_rowptr.numel() - 1 rows");
  TORCH_CHECK(in.dst.size(0) == in.Nd, "pyg_dfgnn: destination features must have "
              "rowptr.numel() - 1 rows");
  const int64_t Fk = in.Fk;
  TORCH_CHECK(Fk >= 0 && in.dst.numel() == in.Nd * in.H * Fk &&
                  in.src.numel() == in.Ns * in.H * Fk,
              "pyg_dfgnn: score operands must be [N, H", kind == GAT ? "]" : ", F]");
  TORCH_CHECK(kind != GATV2 || Fk == in.F, "pyg_dfgnn: GATv2 features must share one size");
  if (in.edge.defined()) {
    TORCH_CHECK(in.edge.numel() == E * in.H * Fk, "pyg_dfgnn: 'edge' must be [E, H",
                kind == GAT ? "]" : ", F]");
    TORCH_CHECK(kind != DOT || Fk == in.F, "pyg_dfgnn: 'edge' is added to keys and values, "
                "so they must share one feature size");
  }
  if (in.att.defined() && kind == GAT) {
    // the output bias [H, C], C <= F (the output keeps C features per head): as
    // [H, F] with zero columns, the output narrowed after the kernels
    TORCH_CHECK(in.att.dim() == 2 && in.att.size(0) == in.H && in.att.size(1) <= in.F,
                "pyg_dfgnn: GAT's 'att' (the output bias) must be [H, C] with C <= F");
    if (in.att.size(1) < in.F) in.att = at::constant_pad_nd(in.att, {0, in.F - in.att.size(1)});
  }
  if (in.att.defined()) TORCH_CHECK(in.att.numel() == in.H * in.F, "pyg_dfgnn: 'att' must be [H, F]");
  return in;
}

template <typename T, typename I>
Args<T, I> make_args(const Inputs& in, double scale, double slope, double p, int64_t seed) {
  Args<T, I> a{ptr<I>(in.rowptr), ptr<I>(in.col), ptr<I>(in.perm), ptr<I>(in.t_rowptr),
               ptr<I>(in.t_col), ptr<I>(in.t_perm), ptr<T>(in.dst), ptr<T>(in.src),
               ptr<T>(in.val), ptr<T>(in.edge), ptr<T>(in.att), in.Nd, in.Ns, in.H, in.F, in.Fk,
               (float)scale, (float)slope, Dropout(p, seed, in.H)};
  return a;
}

template <typename T>
std::vector<float> att_float(const Inputs& in) {
  std::vector<float> a(in.att.defined() ? in.att.numel() : 0);
  const T* p = ptr<T>(in.att);
  for (size_t f = 0; f < a.size(); ++f) a[f] = static_cast<float>(p[f]);
  return a;
}

// Dot attention's att is a key scale c [N_src, H]: the keys are c_j k_j.  The
// CPU kernels run on the scaled keys (the CUDA ones scale in registers), in
// fp32 for bf16 inputs (c_j k_j unrounded, as the CUDA kernels form it; the
// results rounded once).
at::Tensor f32(const at::Tensor& t) { return t.to(at::kFloat); }
optional<at::Tensor> f32(const optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? optional<at::Tensor>(t->to(at::kFloat)) : t;
}

bool key_scaled(int64_t kind, const at::Tensor& src, const optional<at::Tensor>& att,
                const optional<at::Tensor>& edge) {
  if (kind != DOT || !att.has_value() || !att->defined()) return false;
  TORCH_CHECK(att->dim() == 2 && src.dim() == 3 && att->size(0) == src.size(0) &&
                  att->size(1) == src.size(1) && !(edge.has_value() && edge->defined()),
              "pyg_dfgnn: dot attention's 'att' (the key scale) must be [N_src, H], "
              "without edge features");
  TORCH_CHECK(att->scalar_type() == src.scalar_type(),
              "pyg_dfgnn: all features must share one dtype");
  return true;
}

template <typename Fn>
void dispatch(const Inputs& in, const Fn& fn) {
  const auto dt = in.src.scalar_type();
  const bool i32 = in.col.scalar_type() == at::kInt;
  auto by_index = [&](auto tag) {
    using T = decltype(tag);
    if (i32) fn(T(), int32_t()); else fn(T(), int64_t());
  };
  if (dt == at::kFloat) by_index(float());
  else by_index(c10::BFloat16());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_fwd(
    int64_t kind, const at::Tensor& rowptr, const at::Tensor& col,
    const optional<at::Tensor>& perm, const at::Tensor& t_rowptr, const at::Tensor& t_col,
    const at::Tensor& t_perm, const at::Tensor& dst, const at::Tensor& src,
    const optional<at::Tensor>& val, const optional<at::Tensor>& edge,
    const optional<at::Tensor>& att, double scale, double slope, double p, int64_t seed,
    bool need_alpha, at::IntArrayRef sched, const optional<at::Tensor>& work,
    const optional<at::Tensor>& merge, const optional<at::Tensor>& t_work,
    const optional<at::Tensor>& t_merge) {
  if (key_scaled(kind, src, att, edge)) {
    const auto dt = src.scalar_type();
    auto r = attention_fwd(kind, rowptr, col, perm, t_rowptr, t_col, t_perm, f32(dst),
                           at::mul(f32(src), f32(*att).unsqueeze(-1)), f32(val), edge,
                           c10::nullopt, scale, slope, p, seed, need_alpha, sched, work, merge,
                           t_work, t_merge);
    return {std::get<0>(r).to(dt), std::get<1>(r), std::get<2>(r).to(dt)};
  }
  const Inputs in = inputs(kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst, src, val,
                           edge, att);
  const at::Tensor& v = kind == GATV2 ? in.src : in.val;
  at::Tensor out = at::empty({in.Nd, in.H, in.F}, v.options());
  at::Tensor lse = at::empty({2, in.Nd, in.H}, v.options().dtype(at::kFloat));
  at::Tensor alpha = need_alpha ? at::empty({in.col.numel(), in.H}, v.options())
                                : at::empty({0}, v.options());
  dispatch(in, [&](auto t, auto i) {
    using T = decltype(t);
    using I = decltype(i);
    const Args<T, I> a = make_args<T, I>(in, scale, slope, p, seed);
    T* al = need_alpha ? mptr<T>(alpha) : nullptr;
    T* o = mptr<T>(out);
    float* ls = mptr<float>(lse);
    if (kind == GAT) forward<GAT>(a, o, ls, al, in.att.defined() ? att_float<T>(in).data() : nullptr);
    else if (kind == GATV2) forward<GATV2>(a, o, ls, al, att_float<T>(in).data());
    else forward<DOT>(a, o, ls, al, nullptr);
  });
  if (kind == GAT && att.has_value() && att->size(-1) < in.F)   // the bias' width
    out = out.narrow(2, 0, att->size(-1)).contiguous();
  return {out, lse, alpha};
}

std::vector<at::Tensor> attention_bwd(
    int64_t kind, const at::Tensor& rowptr, const at::Tensor& col,
    const optional<at::Tensor>& perm, const at::Tensor& t_rowptr, const at::Tensor& t_col,
    const at::Tensor& t_perm, const at::Tensor& dst, const at::Tensor& src,
    const optional<at::Tensor>& val, const optional<at::Tensor>& edge,
    const optional<at::Tensor>& att, double scale, double slope, double p, int64_t seed,
    const at::Tensor& out_, const at::Tensor& lse_, const at::Tensor& grad_out_,
    at::IntArrayRef sched, const optional<at::Tensor>& work,
    const optional<at::Tensor>& merge, const optional<at::Tensor>& t_work,
    const optional<at::Tensor>& t_merge) {
  if (key_scaled(kind, src, att, edge)) {
    // dK_j = sum_i g_ij q_i is the gradient of the scaled key c_j k_j
    const auto dt = src.scalar_type();
    auto g = attention_bwd(kind, rowptr, col, perm, t_rowptr, t_col, t_perm, f32(dst),
                           at::mul(f32(src), f32(*att).unsqueeze(-1)), f32(val), edge,
                           c10::nullopt, scale, slope, p, seed, f32(out_), lse_, f32(grad_out_),
                           sched, work, merge, t_work, t_merge);
    g[4] = at::sum(at::mul(g[1], f32(src)), -1).to(dt);
    g[1] = at::mul(g[1], f32(*att).unsqueeze(-1)).to(dt);
    for (int i : {0, 2, 3}) g[i] = g[i].to(dt);   // (absent ones: empty, in dt)
    return g;
  }
  const Inputs in = inputs(kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst, src, val,
                           edge, att);
  const at::Tensor& v = kind == GATV2 ? in.src : in.val;
  // GAT with a narrower output bias: out and its gradient padded to F (zeros)
  auto widen = [&](const at::Tensor& t) {
    return t.size(-1) < in.F ? at::constant_pad_nd(t, {0, in.F - t.size(-1)}) : t.contiguous();
  };
  const bool narrow = kind == GAT && att.has_value() && att->size(-1) < in.F;
  const at::Tensor out = narrow ? widen(out_) : out_.contiguous();
  const at::Tensor grad_out = narrow ? widen(grad_out_) : grad_out_.contiguous();
  at::Tensor lse_c = lse_.contiguous();
  const at::Tensor& lse = lse_c;
  TORCH_CHECK(out.sizes() == at::IntArrayRef({in.Nd, in.H, in.F}) &&
                  out.scalar_type() == v.scalar_type(),
              "pyg_dfgnn: 'out' must be [N_dst, H, F] in the features' dtype");
  TORCH_CHECK(grad_out.sizes() == out.sizes() && grad_out.scalar_type() == out.scalar_type(),
              "pyg_dfgnn: grad_out must match out");
  TORCH_CHECK(lse.sizes() == at::IntArrayRef({2, in.Nd, in.H}) &&
                  lse.scalar_type() == at::kFloat,
              "pyg_dfgnn: 'lse' must be float32 [2, N_dst, H], got ", lse.sizes());
  check_cpu(out, "out");
  check_cpu(lse, "lse");
  check_cpu(grad_out, "grad_out");
  const int64_t E = in.col.numel();
  // absent gradients are distinct empty tensors (custom-op outputs must not alias)
  auto empty = [&] { return at::empty({0}, in.src.options()); };
  at::Tensor d_dst = at::empty_like(in.dst), d_src = at::empty_like(in.src);
  at::Tensor d_val = (kind != GATV2 && in.val.defined()) ? at::empty_like(in.val) : empty();
  at::Tensor d_edge = in.edge.defined() ? at::empty_like(in.edge) : empty();
  at::Tensor d_att = in.att.defined() ? at::zeros_like(in.att) : empty();
  at::Tensor ds = at::empty({E, in.H}, in.src.options().dtype(at::kFloat));
  at::Tensor pd = at::empty({E, in.H}, in.src.options().dtype(at::kFloat));
  dispatch(in, [&](auto t, auto i) {
    using T = decltype(t);
    using I = decltype(i);
    const Args<T, I> a = make_args<T, I>(in, scale, slope, p, seed);
    BwdPtrs<T> b;
    b.lse = mptr<float>(lse_c);
    b.ds = mptr<float>(ds);
    b.pd = mptr<float>(pd);
    b.o = ptr<T>(out);
    b.dout = ptr<T>(grad_out);
    b.d_dst = mptr<T>(d_dst);
    b.d_src = mptr<T>(d_src);
    b.d_val = mptr<T>(d_val);
    b.d_edge = mptr<T>(d_edge);
    std::vector<std::vector<float>> att_parts;
    if (kind == GAT) {
      backward_rows<GAT>(a, b, nullptr, att_parts);
      backward_cols<GAT>(a, b, nullptr);
      // the output bias: a column sum of grad_out (Delta is recomputed, so the
      // stored out, which includes the bias, is not read)
      if (in.att.defined()) d_att.copy_(grad_out.sum(0, false, at::kFloat).view_as(d_att));
      if (narrow) d_att = d_att.narrow(1, 0, att->size(-1)).contiguous();
    } else if (kind == GATV2) {
      const std::vector<float> att_f = att_float<T>(in);
      backward_rows<GATV2>(a, b, att_f.data(), att_parts);
      backward_cols<GATV2>(a, b, att_f.data());
      std::vector<float> sum(in.H * in.F, 0.f);
      for (const auto& part : att_parts)
        for (size_t f = 0; f < part.size(); ++f) sum[f] += part[f];
      store<T>(d_att.data_ptr<T>(), sum.data(), in.H * in.F);
    } else {
      backward_rows<DOT>(a, b, nullptr, att_parts);
      backward_cols<DOT>(a, b, nullptr);
    }
  });
  return {d_dst, d_src, d_val, d_edge, d_att};
}

}  // namespace
}  // namespace dfgnn_cpu

TORCH_LIBRARY(dfgnn_cpu, m) {
  m.def(DFGNN_ATTENTION_FWD_SCHEMA);
  m.def(DFGNN_ATTENTION_BWD_SCHEMA);
}

TORCH_LIBRARY_IMPL(dfgnn_cpu, CPU, m) {
  m.impl("attention_fwd", &dfgnn_cpu::attention_fwd);
  m.impl("attention_bwd", &dfgnn_cpu::attention_bwd);
}
