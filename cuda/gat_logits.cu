// GAT's node logits, computed next to the fused attention instead of by the
// layer's two `(x * att).sum(-1)` expressions (each an [N, H, C] product in
// memory, and four ATen ops plus four autograd nodes of host time per layer):
//
//   forward   a_src[n, h] = sum_{c < C} x[n, h, c] att_src[h, c]   (a_dst alike)
//   backward  d_x[n, h, c] += d_src[n, h] att_src[h, c] + d_dst[n, h] att_dst[h, c]
//             d_att_src[h, c] = sum_n d_src[n, h] x[n, h, c]      (d_att_dst alike)
//
// x is [N, H, F] with F >= C (a value row projected into the kernels' padded
// head width has zero columns C..F-1, which the logits skip).  One group of G
// lanes per (node, head) walks the row's F features in VEC-wide loads and
// reduces with the lane-group shuffles of the attention kernels; the products
// and sums are fp32, the attention vectors read in fp32 or x's dtype as they
// come (under autocast the layer's fp32 parameters), and the logits are
// rounded once to x's dtype, the dtype the attention kernels take them in.
// The backward is one more pass over x and d_x, which also sums d_att.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <atomic>

#include "attention_kernels.cuh"

namespace dfgnn {
namespace {

template <int VEC>
__device__ __forceinline__ void load_smem(const float* p, float (&v)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      const float4 f = reinterpret_cast<const float4*>(p)[q];
      v[4 * q] = f.x; v[4 * q + 1] = f.y; v[4 * q + 2] = f.z; v[4 * q + 3] = f.w;
    }
  } else if constexpr (VEC == 2) {
    const float2 f = *reinterpret_cast<const float2*>(p);
    v[0] = f.x; v[1] = f.y;
  } else {
    v[0] = p[0];
  }
}

//: attention vectors of at most this many elements per side are staged in
//: shared memory (fp32, padded to F: 2 x H x F x 4 bytes <= 48 KiB)
constexpr int64_t kStagedAtt = 6144;

// Forward.  One group of G lanes per (node, head), grid-stride over the
// pairs; STAGED: both attention vectors in shared memory as fp32 [2][H][F]
// with zeros past C, read in the lanes' VEC-wide slices.  Each lane takes up
// to kLogitSlots vectors of a row at once (logits_group: G covers a row in
// that many slots where it can), so that a pass which gathers nothing still
// keeps several loads in flight per lane and reduces over fewer shuffles
// (docs/KERNELS.md, session 42: one vector per lane and a group of up to 32
// lanes per row left the pass at 1.4 TB/s at 4 x 64 fp32, and at 32 lanes,
// 13 idle, for heads of 19 in half precision).
constexpr int kLogitSlots = 4;
template <typename T, int VEC, typename TA, bool STAGED>
__global__ void __launch_bounds__(kThreads)
gat_logits_kernel(const T* __restrict__ x, const TA* __restrict__ att_s,
                  const TA* __restrict__ att_d, T* __restrict__ a_s, T* __restrict__ a_d,
                  int64_t pairs, int64_t H, int64_t F, int64_t C, int G) {
  extern __shared__ float w[];
  if constexpr (STAGED) {
    for (int64_t i = threadIdx.x; i < 2 * H * F; i += kThreads) {
      const int64_t hc = i % (H * F), c = hc % F;
      const TA* a = i < H * F ? att_s : att_d;
      w[i] = c < C ? to_f(a[(hc / F) * C + c]) : 0.f;
    }
    __syncthreads();
  }
  const Group g(G);
  const int64_t step = (int64_t)gridDim.x * (kThreads / G);
  const int64_t lim = STAGED ? F : C, stride = (int64_t)G * VEC;
  for (int64_t pair = ((int64_t)blockIdx.x * kThreads + threadIdx.x) / G; pair < pairs;
       pair += step) {   // (all lanes of a group take the same pairs)
    const int64_t h = pair % H;
    const T* row = x + pair * F;
    float s = 0.f, d = 0.f;
    // each lane's slots of this pair: kLogitSlots loads issued before any of
    // them is used (the loads in flight that a gather-free pass has to keep
    // DRAM busy with)
    for (int64_t c0 = (int64_t)g.lg * VEC; c0 < lim; c0 += kLogitSlots * stride) {
      float v[kLogitSlots][VEC];
#pragma unroll
      for (int u = 0; u < kLogitSlots; ++u) {
        const int64_t c = c0 + u * stride;
        if (c < lim) {
          load_vec<T, VEC>(row + c, v[u]);
        } else {
#pragma unroll
          for (int k = 0; k < VEC; ++k) v[u][k] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kLogitSlots; ++u) {
        const int64_t c = c0 + u * stride;
        if (c >= lim) break;
        if constexpr (STAGED) {
          float ws[VEC], wd[VEC];
          load_smem<VEC>(w + h * F + c, ws);
          load_smem<VEC>(w + (H + h) * F + c, wd);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            s = fmaf(v[u][k], ws[k], s);
            d = fmaf(v[u][k], wd[k], d);
          }
        } else {
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            if (c + k < C) {
              s = fmaf(v[u][k], to_f(att_s[h * C + c + k]), s);
              d = fmaf(v[u][k], to_f(att_d[h * C + c + k]), d);
            }
          }
        }
      }
    }
    s = g.sum(s);
    d = g.sum(d);
    if (g.lg == 0) {
      a_s[pair] = from_f<T>(s);
      a_d[pair] = from_f<T>(d);
    }
  }
}

// Backward, one pass over x and d_x.  A block owns a tile of nvb <= kThreads
// vectors of the flat [H * F] node row (each thread the same VEC features of
// every node it visits, so its attention-vector values stay in registers) and
// a chunk of nodes, rpi = kThreads / nvb rows in flight.  d_x gets the
// logits' share in place; the d_att sums of the chunk go to part[chunk, side,
// H * F] (fp32, no atomics: summed over the chunks afterwards).
template <typename T, int VEC, typename TA>
__global__ void __launch_bounds__(kThreads)
gat_logits_bwd_kernel(T* __restrict__ dx, const T* __restrict__ x, const T* __restrict__ ds,
                      const T* __restrict__ dd, const TA* __restrict__ att_s,
                      const TA* __restrict__ att_d, float* __restrict__ part, int64_t N,
                      int64_t H, int64_t F, int64_t C, int nvb, int64_t chunk) {
  __shared__ float red[2 * kThreads * 8];
  const int t = threadIdx.x, rpi = kThreads / nvb, r = t / nvb, lv = t % nvb;
  const int64_t R = H * F, nv = R / VEC;
  const int64_t v = (int64_t)blockIdx.x * nvb + lv;
  const bool on = r < rpi && v < nv;
  float acc_s[VEC], acc_d[VEC], ws[VEC], wd[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc_s[k] = acc_d[k] = ws[k] = wd[k] = 0.f;
  int64_t h = 0, e = 0;
  if (on) {
    e = v * VEC;
    h = e / F;
    const int64_t c0 = e % F;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      if (c0 + k < C) {
        ws[k] = to_f(att_s[h * C + c0 + k]);
        wd[k] = to_f(att_d[h * C + c0 + k]);
      }
    }
    const bool upd = c0 < C;
    const int64_t n1 = min(N, ((int64_t)blockIdx.y + 1) * chunk);
    for (int64_t n = (int64_t)blockIdx.y * chunk + r; n < n1; n += rpi) {
      const float gs = to_f(ds[n * H + h]), gd = to_f(dd[n * H + h]);
      float xv[VEC];
      load_vec<T, VEC>(x + n * R + e, xv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        acc_s[k] = fmaf(gs, xv[k], acc_s[k]);
        acc_d[k] = fmaf(gd, xv[k], acc_d[k]);
      }
      if (upd) {
        T* p = dx + n * R + e;
        float g[VEC];
        load_vec<T, VEC>(p, g);
#pragma unroll
        for (int k = 0; k < VEC; ++k) g[k] += gs * ws[k] + gd * wd[k];
        store_vec<T, VEC>(p, g);
      }
    }
  }
  // the block's rows in flight summed per position (zeros from idle threads)
  const int W = nvb * VEC;
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    if (r < rpi) {
      red[(0 * rpi + r) * W + lv * VEC + k] = acc_s[k];
      red[(1 * rpi + r) * W + lv * VEC + k] = acc_d[k];
    }
  }
  __syncthreads();
  for (int j = t; j < 2 * W; j += kThreads) {
    const int side = j / W, q = j % W;
    const int64_t pos = (int64_t)blockIdx.x * W + q;
    if (pos >= R) continue;
    float sum = 0.f;
    for (int rr = 0; rr < rpi; ++rr) sum += red[(side * rpi + rr) * W + q];
    part[((int64_t)blockIdx.y * 2 + side) * R + pos] = sum;
  }
}

// Widest load (elements) dividing F and the rows' alignment.
struct RowMap {
  int vec;
};

RowMap row_map(const at::Tensor& x, int64_t F, const at::Tensor& y = at::Tensor()) {
  const int64_t esz = (int64_t)x.element_size();
  auto addr = reinterpret_cast<uintptr_t>(x.data_ptr());
  if (y.defined()) addr |= reinterpret_cast<uintptr_t>(y.data_ptr());
  int vec = 1;
  for (int64_t bytes : {16, 8, 4}) {
    const int64_t v = bytes / esz;
    if (v > 1 && F % v == 0 && addr % bytes == 0) { vec = (int)v; break; }
  }
  return {vec};
}

// The forward's lanes per (node, head): the power of two that covers the
// row's F features (its vec-wide vectors) in up to kLogitSlots vectors per
// lane, at most a warp.
int logits_group(int64_t F, int vec) {
  const int64_t vecs = (F + vec - 1) / vec;
  const int64_t per = (vecs + kLogitSlots - 1) / kLogitSlots;
  int G = 1;
  while (G < 32 && G < per) G <<= 1;
  return G;
}

template <typename T, typename TA, template <typename, int, typename> class Fn,
          typename... A>
void by_vec(int vec, A&&... a) {
  switch (vec) {
    case 8: if constexpr (sizeof(T) == 2) { Fn<T, 8, TA>::run(a...); return; } break;
    case 4: Fn<T, 4, TA>::run(a...); return;
    case 2: Fn<T, 2, TA>::run(a...); return;
    default: break;
  }
  Fn<T, 1, TA>::run(a...);
}

int sm_count() {   // of the current device, asked of the driver once per device
  static std::atomic<int> counts[64];
  const int dev = c10::cuda::current_device();
  int n = dev < 64 ? counts[dev].load() : 0;
  if (n == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    if (dev < 64) counts[dev].store(n);
  }
  return n;
}

// the forward's grid: a group per (node, head) up to 8 blocks per SM (grid-stride)
unsigned blocks_for(int64_t pairs, int G) {
  const int64_t b = (pairs * G + kThreads - 1) / kThreads;
  return (unsigned)std::max<int64_t>(std::min<int64_t>(b, 8 * (int64_t)sm_count()), 1);
}

template <typename T, int VEC, typename TA>
struct LogitsFwd {
  static void run(const at::Tensor& x, const at::Tensor& as, const at::Tensor& ad,
                  at::Tensor& os, at::Tensor& od, int64_t C, int G) {
    const int64_t pairs = x.size(0) * x.size(1), H = x.size(1), F = x.size(2);
    auto stream = c10::cuda::getCurrentCUDAStream();
    const unsigned blocks = blocks_for(pairs, G);
    const TA* ps = as.data_ptr<TA>();
    const TA* pd = ad.data_ptr<TA>();
    if (H * F <= kStagedAtt) {
      gat_logits_kernel<T, VEC, TA, true><<<blocks, kThreads, 2 * H * F * sizeof(float),
                                            stream>>>(
          x.data_ptr<T>(), ps, pd, os.data_ptr<T>(), od.data_ptr<T>(), pairs, H, F, C, G);
    } else {
      gat_logits_kernel<T, VEC, TA, false><<<blocks, kThreads, 0, stream>>>(
          x.data_ptr<T>(), ps, pd, os.data_ptr<T>(), od.data_ptr<T>(), pairs, H, F, C, G);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

template <typename T, int VEC, typename TA>
struct LogitsBwd {
  static void run(at::Tensor& dx, const at::Tensor& x, const at::Tensor& ds,
                  const at::Tensor& dd, const at::Tensor& as, const at::Tensor& ad,
                  at::Tensor& part, int64_t C, int nvb, int64_t tiles, int64_t chunks,
                  int64_t chunk) {
    gat_logits_bwd_kernel<T, VEC, TA><<<dim3((unsigned)tiles, (unsigned)chunks), kThreads, 0,
                                        c10::cuda::getCurrentCUDAStream()>>>(
        dx.data_ptr<T>(), x.data_ptr<T>(), ds.data_ptr<T>(), dd.data_ptr<T>(),
        as.data_ptr<TA>(), ad.data_ptr<TA>(), part.data_ptr<float>(), x.size(0),
        x.size(1), x.size(2), C, nvb, chunk);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

// the kernels for x's dtype, with attention vectors in fp32 or in x's dtype
template <template <typename, int, typename> class Fn, typename... A>
void by_dtype(at::ScalarType dt, bool att_f32, int vec, A&&... a) {
  switch (dt) {
    case at::kFloat: by_vec<float, float, Fn>(vec, a...); return;
    case at::kHalf:
      if (att_f32) by_vec<c10::Half, float, Fn>(vec, a...);
      else by_vec<c10::Half, c10::Half, Fn>(vec, a...);
      return;
    case at::kBFloat16:
      if (att_f32) by_vec<c10::BFloat16, float, Fn>(vec, a...);
      else by_vec<c10::BFloat16, c10::BFloat16, Fn>(vec, a...);
      return;
    default: TORCH_CHECK(false, "pyg_dfgnn: gat_logits: unsupported dtype ", dt);
  }
}

// att [H, C] (a leading 1 of PyG's [1, H, C] parameter allowed), contiguous, in
// fp32 or x's dtype (the kernels read both; another dtype is converted to fp32)
at::Tensor att_arg(const at::Tensor& att, const at::Tensor& x, const char* name) {
  TORCH_CHECK(att.device() == x.device(), "pyg_dfgnn: '", name, "' is on ", att.device(),
              ", expected ", x.device());
  const auto a = att.dim() == 3 && att.size(0) == 1 ? att.select(0, 0) : att;
  TORCH_CHECK(a.dim() == 2 && a.size(0) == x.size(1) && a.size(1) <= x.size(2),
              "pyg_dfgnn: '", name, "' must be [heads, C] with C <= x's ", x.size(2),
              " features per head, got ", att.sizes());
  const auto dt = a.scalar_type();
  return (dt == at::kFloat || dt == x.scalar_type() ? a : a.to(at::kFloat)).contiguous();
}

void check_x(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 3 && x.is_contiguous(),
              "pyg_dfgnn: gat_logits: 'x' must be a contiguous CUDA tensor [N, heads, F]");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> gat_logits(const at::Tensor& x, const at::Tensor& att_src,
                                              const at::Tensor& att_dst) {
  check_x(x);
  const c10::cuda::CUDAGuard guard(x.device());
  const auto as = att_arg(att_src, x, "att_src"), ad = att_arg(att_dst, x, "att_dst");
  TORCH_CHECK(as.sizes() == ad.sizes() && as.scalar_type() == ad.scalar_type(),
              "pyg_dfgnn: 'att_src' and 'att_dst' must agree in shape and dtype");
  auto os = at::empty({x.size(0), x.size(1)}, x.options());
  auto od = at::empty({x.size(0), x.size(1)}, x.options());
  if (x.numel() > 0) {
    const RowMap m = row_map(x, x.size(2));
    by_dtype<LogitsFwd>(x.scalar_type(), as.scalar_type() == at::kFloat, m.vec, x, as, ad, os,
                        od, as.size(1), logits_group(x.size(2), m.vec));
  } else if (os.numel() > 0) {   // F == 0: empty sums
    os.zero_();
    od.zero_();
  }
  return {os, od};
}

std::tuple<at::Tensor, at::Tensor> gat_logits_bwd(const at::Tensor& x, const at::Tensor& att_src,
                                                  const at::Tensor& att_dst,
                                                  const at::Tensor& d_src,
                                                  const at::Tensor& d_dst, at::Tensor& d_x) {
  check_x(x);
  const c10::cuda::CUDAGuard guard(x.device());
  const auto as = att_arg(att_src, x, "att_src"), ad = att_arg(att_dst, x, "att_dst");
  TORCH_CHECK(as.sizes() == ad.sizes() && as.scalar_type() == ad.scalar_type(),
              "pyg_dfgnn: 'att_src' and 'att_dst' must agree in shape and dtype");
  const int64_t N = x.size(0), H = x.size(1), C = as.size(1);
  TORCH_CHECK(d_x.sizes() == x.sizes() && d_x.is_contiguous() &&
                  d_x.scalar_type() == x.scalar_type(),
              "pyg_dfgnn: gat_logits_bwd: 'd_x' must be like 'x'");
  for (const auto* t : {&d_src, &d_dst})
    TORCH_CHECK(t->dim() == 2 && t->size(0) == N && t->size(1) == H && t->is_contiguous() &&
                    t->scalar_type() == x.scalar_type(),
                "pyg_dfgnn: gat_logits_bwd: the logits' gradients must be [N, heads] like x");
  // one pass: d_x in place and the d_att sums per chunk of nodes (gat_logits_bwd_kernel)
  const int64_t F = x.size(2), R = H * F;
  at::Tensor d_att;   // [2, H, C] fp32
  if (N == 0 || C == 0) {
    d_att = at::zeros({2, H, C}, x.options().dtype(at::kFloat));
  } else {
    const RowMap m = row_map(x, F, d_x);
    const int64_t nv = R / m.vec;
    const int nvb = (int)std::min<int64_t>(nv, kThreads);
    const int64_t tiles = (nv + nvb - 1) / nvb, rpi = kThreads / nvb;
    // about 4 blocks per SM in all, every chunk at least a few rows per thread
    const int64_t sms = sm_count();
    const int64_t chunks = std::max<int64_t>(
        1, std::min<int64_t>((4 * sms + tiles - 1) / tiles, (N + 4 * rpi - 1) / (4 * rpi)));
    const int64_t chunk = (N + chunks - 1) / chunks;
    TORCH_CHECK(tiles < 65536 && chunks < 65536, "pyg_dfgnn: gat_logits_bwd: too large");
    auto part = at::empty({chunks, 2, R}, x.options().dtype(at::kFloat));
    by_dtype<LogitsBwd>(x.scalar_type(), as.scalar_type() == at::kFloat, m.vec, d_x, x, d_src,
                        d_dst, as, ad, part, C, nvb, tiles, chunks, chunk);
    d_att = (chunks > 1 ? part.sum(0) : part[0]).view({2, H, F}).narrow(2, 0, C);
  }
  // in the vectors' dtype, both sides in one copy (none for fp32 with C == F)
  const auto d_both = d_att.to(att_src.scalar_type()).contiguous();
  const auto d_as = d_both[0], d_ad = d_both[1];
  return {d_as.view(att_src.sizes()), d_ad.view(att_dst.sizes())};
}

}  // namespace dfgnn
