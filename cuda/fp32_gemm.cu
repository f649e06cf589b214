// fp32 projections on the bf16 tensor cores, to fp32 accuracy (split GEMM).
//
// The layers' fp32 projection GEMMs (x [N, K] W^T [K, M] + b, K = the input
// features, 64 in the bench) run on the SIMT fp32 units: at K = 64 cuBLAS
// reaches ~30 TFLOPS on an H200, and the Transformer 8 x 19's one GEMM took a
// third of its forward (docs/KERNELS.md, session 45).  Every fp32 number is the
// exact sum of three bf16 numbers (8 + 8 + 8 significant bits):
//
//   x = x1 + x2 + x3,   x1 = bf16(x),  x2 = bf16(x - x1),  x3 = bf16(x - x1 - x2)
//
// (round to nearest; both differences are exact in fp32).  With w split alike,
// x w = sum_{i,j} xi wj, and the terms with i + j <= 4 (six of nine) leave out
// products below 2^-24 |x w| each:
//
//   x w ~ x1 w1 + x1 w2 + x2 w1 + x1 w3 + x2 w2 + x3 w1,
//
// one bf16 GEMM over K' = 6 K columns,
//
//   X' = [x1 x1 x1 x2 x2 x3 | 1 1 1 | 0 ...],   W' = [w1 w2 w3 w1 w2 w1 | b1 b2 b3 | 0 ...],
//
// accumulated in fp32 on the tensor cores (aten::mm's out_dtype), the bias
// split alike and added by three columns of ones; K' is padded to a multiple
// of 8 (16-byte rows).  Each bf16 x bf16 product is exact in fp32, so the
// result's error is that of the fp32 accumulation: measured on an H200,
// max |y - y64| / max |y64| ~1e-6 against cuBLAS' fp32 GEMM's 2.4-3.5e-7 (the
// tensor cores' accumulation, not the split: the same sums accumulated exactly
// are within 1e-8), and the GEMM took 0.44-0.54x cuBLAS' fp32 time at K = 64,
// M = 256-1024 on 100k rows (_carry/gemm45b.py).
//
// split_operand writes X' or W' in one launch; affines() runs one or more
// maps on one x, whose X' is formed once.  Users (dfgnn_ops.cpp): the
// Transformer's q / k / v (and its skip where the backward does not recompute
// it), GAT's projection, the Transformer's aggregate-then-project GEMMs
// (dfgnn_C::linears), GATv2's where no gradient is recorded (gatv2_forward
// says why not otherwise); no backward GEMM
// (their operands are the [N, H W] gradients: a split would write 3x their
// bytes).  Where the split does not pay
// (a small product: host time, see kSplitMinFma) or cannot run (not fp32,
// not CUDA, a GPU before sm_80), affines() is x W^T + b by cuBLAS' fp32 GEMM
// (addmm), as before.  The mode (dfgnn_C::set_fp32_gemm_mode,
// pyg_dfgnn.ops.set_fp32_matmul; PYG_DFGNN_FP32_MATMUL): "auto" (the rule
// above), "ieee" (never), "split" (every fp32 CUDA call, for the tests).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "attention_api.h"

namespace dfgnn {
namespace {

// A product N K M below this runs cuBLAS' fp32 GEMM in auto mode: the split is
// a launch of its own per operand, and at PATTERN's batches (15k rows, K = 64,
// M = 640: 6.2e8) the call's time is the host's (the GEMM 62 -> 36 us, H200).
constexpr double kSplitMinFma = 1 << 30;

// The three bf16 parts of v = v1 + v2 + v3 (round to nearest; a value that
// rounds to infinity keeps its truncation as its first part, so that nothing
// overflows).  A non-finite v is its first part alone.
struct Parts {
  __nv_bfloat16 p[3];
};

__device__ __forceinline__ Parts bf16_parts(float v) {
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.f);
  Parts r;
  r.p[0] = __float2bfloat16_rn(v);
  if (!isfinite(v)) {
    r.p[1] = r.p[2] = zero;
    return r;
  }
  if (isinf(__bfloat162float(r.p[0]))) r.p[0] = __float2bfloat16_rz(v);
  const float r1 = v - __bfloat162float(r.p[0]);   // (exact)
  r.p[1] = __float2bfloat16_rn(r1);
  r.p[2] = __float2bfloat16_rn(r1 - __bfloat162float(r.p[1]));   // (exact: 8 bits or fewer)
  return r;
}

// out [R, Kp] (contiguous) from src [R, K] (row stride ld), one thread per
// source element (r, k), which writes column s K + k of row r for s < 6: part
// kLhs[s] (lhs, x1 x1 x1 x2 x2 x3) or kRhs[s] (rhs, w1 w2 w3 w1 w2 w1) of
// src[r, k]; where src[r, k] is not finite, its copies that meet the other
// side's second or third parts are 0 (inf x w is +-inf or NaN as in fp32, not
// inf w1 - inf |w2|).  Columns 6 K + j (j < Kp - 6 K, written by the threads
// of k = j mod K): where `bias_cols` and j < 3, 1 (lhs) or part j of bias[r]
// (rhs; 0 without a bias); else 0.  I: the index type (32 bits where R Kp fits).
template <typename I>
__global__ void split_kernel(const float* __restrict__ src, int64_t ld, const float* __restrict__ bias,
                             __nv_bfloat16* __restrict__ out, I R, I K, I Kp, bool rhs,
                             bool bias_cols) {
  constexpr int kLhs[6] = {0, 0, 0, 1, 1, 2};
  constexpr int kRhs[6] = {0, 1, 2, 0, 1, 0};
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.f), one = __float2bfloat16_rn(1.f);
  const I total = R * K, tail = Kp - 6 * K;
  for (I t = blockIdx.x * (I)blockDim.x + threadIdx.x; t < total; t += (I)gridDim.x * blockDim.x) {
    const I r = t / K, k = t - r * K;
    const float e = src[(int64_t)r * ld + k];
    const Parts q = bf16_parts(e);
    const bool fin = isfinite(e);
    __nv_bfloat16* o = out + r * Kp;
#pragma unroll
    for (int s = 0; s < 6; ++s) {
      const int part = rhs ? kRhs[s] : kLhs[s];
      // (the copies meeting the other side's second or third parts)
      const bool meets_rest = rhs ? s >= 3 : (s == 1 || s == 2);
      o[s * K + k] = (fin || !meets_rest) ? q.p[part] : zero;
    }
    for (I j = k; j < tail; j += K) {
      __nv_bfloat16 v = zero;
      if (bias_cols && j < 3) {
        if (!rhs) v = one;
        else if (bias != nullptr) v = bf16_parts(bias[r]).p[j];
      }
      o[6 * K + j] = v;
    }
  }
}

int64_t padded_cols(int64_t K, bool bias_cols) {
  const int64_t k = 6 * K + (bias_cols ? 3 : 0);
  return (k + 7) / 8 * 8;
}

// X' or W' of a [R, K] fp32 matrix with unit column stride (and W's bias [R] or
// an undefined tensor), as above
at::Tensor split_operand(const at::Tensor& a, const at::Tensor& bias, bool rhs, bool bias_cols) {
  const int64_t R = a.size(0), K = a.size(1), Kp = padded_cols(K, bias_cols);
  at::Tensor out = at::empty({R, Kp}, a.options().dtype(at::kBFloat16));
  const int64_t total = R * K;   // (threads: one per source element; K >= 1)
  if (total == 0) return out;
  const int threads = 256;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((total + threads - 1) / threads, 65535LL * 8));
  const float* b = bias.defined() && bias.numel() > 0 ? bias.data_ptr<float>() : nullptr;
  auto* o = reinterpret_cast<__nv_bfloat16*>(out.data_ptr<at::BFloat16>());
  const auto stream = at::cuda::getCurrentCUDAStream();
  const int64_t ld = R > 1 ? a.stride(0) : K;
  if (R * Kp < (int64_t(1) << 31))
    split_kernel<uint32_t><<<blocks, threads, 0, stream>>>(a.data_ptr<float>(), ld, b, o, R, K, Kp,
                                                           rhs, bias_cols);
  else
    split_kernel<int64_t><<<blocks, threads, 0, stream>>>(a.data_ptr<float>(), ld, b, o, R, K, Kp,
                                                          rhs, bias_cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

std::atomic<int>& forced_fp32_gemm_mode() {
  static std::atomic<int> mode{-1};
  return mode;
}

// 0 ieee, 1 auto, 2 split: the forced mode, else PYG_DFGNN_FP32_MATMUL (auto)
int fp32_gemm_request() {
  const int forced = forced_fp32_gemm_mode().load(std::memory_order_relaxed);
  if (forced >= 0) return forced;
  const char* env = std::getenv("PYG_DFGNN_FP32_MATMUL");
  if (env && std::strcmp(env, "ieee") == 0) return 0;
  if (env && std::strcmp(env, "split") == 0) return 2;
  TORCH_CHECK(!env || !*env || std::strcmp(env, "auto") == 0,
              "PYG_DFGNN_FP32_MATMUL: must be 'auto', 'ieee' or 'split', got '", env, "'");
  return 1;
}

bool rows_unit_stride(const at::Tensor& t) {
  return t.dim() == 2 && (t.size(1) <= 1 || t.stride(1) == 1) &&
         (t.size(0) <= 1 || t.stride(0) >= t.size(1));
}

// Whether the maps (ws, bs) of x run split, and whether X' carries the bias
// columns (any map with a bias)
struct Plan {
  bool split = false;
  bool bias_cols = false;
};

Plan plan_for(const at::Tensor& x, const std::vector<at::Tensor>& ws,
              const std::vector<at::Tensor>& bs) {
  Plan plan;
  int64_t m_total = 0;
  bool fp32 = x.is_cuda() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) > 0;
  // (K = 0: nothing to split, and the kernel writes no columns then)
  for (size_t i = 0; i < ws.size(); ++i) {
    m_total += ws[i].size(0);
    const bool b = bs[i].defined() && bs[i].numel() > 0;
    plan.bias_cols = plan.bias_cols || b;
    fp32 = fp32 && ws[i].scalar_type() == at::kFloat && (!b || bs[i].scalar_type() == at::kFloat);
  }
  const int mode = fp32 ? fp32_gemm_request() : 0;
  if (mode == 0 || (mode == 1 && (double)x.size(0) * (double)x.size(1) * (double)m_total <
                                     kSplitMinFma))
    return plan;
  static std::atomic<int64_t> majors[64];   // (compute capability, per device)
  const c10::cuda::CUDAGuard guard(x.device());
  plan.split = device_constant(majors, [](int dev) {
                 cudaDeviceProp prop;
                 C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
                 return (int64_t)prop.major;
               }) >= 8;
  return plan;
}

}  // namespace

int64_t set_fp32_gemm_mode(int64_t mode) {
  if (mode < -1 || mode > 2) return -2;
  return forced_fp32_gemm_mode().exchange(static_cast<int>(mode));
}

std::vector<at::Tensor> affines(const at::Tensor& x, const std::vector<at::Tensor>& ws,
                                const std::vector<at::Tensor>& bs, bool may_split) {
  TORCH_INTERNAL_ASSERT(ws.size() == bs.size());
  const Plan plan = may_split ? plan_for(x, ws, bs) : Plan{};
  std::vector<at::Tensor> out;
  if (!plan.split) {
    for (size_t i = 0; i < ws.size(); ++i) {
      const at::Tensor& b = bs[i];
      out.push_back(b.defined() && b.numel() > 0 ? at::addmm(b, x, ws[i].t())
                                                 : at::mm(x, ws[i].t()));
    }
    return out;
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor lhs = split_operand(rows_unit_stride(x) ? x : x.contiguous(), at::Tensor(),
                                       false, plan.bias_cols);
  for (size_t i = 0; i < ws.size(); ++i) {
    const at::Tensor w = rows_unit_stride(ws[i]) ? ws[i] : ws[i].contiguous();
    const at::Tensor b = bs[i].defined() && bs[i].numel() > 0 ? bs[i].contiguous() : at::Tensor();
    const at::Tensor rhs = split_operand(w, b, true, plan.bias_cols);
    out.push_back(at::mm(lhs, rhs.t(), at::kFloat));
  }
  return out;
}

// dfgnn_C::linears: the maps (ws[i], bs[i]) of one x, [N, ws[i].size(0)] each
// (the Python paths without autograd: nn/transformer_conv.py)
std::vector<at::Tensor> linears(const at::Tensor& x, at::TensorList ws,
                                const c10::List<c10::optional<at::Tensor>>& bs) {
  TORCH_CHECK(ws.size() == bs.size(), "linears: 'ws' and 'bs' must have the same length");
  TORCH_CHECK(x.dim() == 2, "linears: 'x' must be [N, K]");
  std::vector<at::Tensor> w, b;
  for (size_t i = 0; i < ws.size(); ++i) {
    TORCH_CHECK(ws[i].dim() == 2 && ws[i].size(1) == x.size(1) && ws[i].device() == x.device() &&
                    ws[i].scalar_type() == x.scalar_type(),
                "linears: 'ws' must be [M, K] matrices of x's dtype and device");
    const c10::optional<at::Tensor> bi = bs.get(i);
    TORCH_CHECK(!bi.has_value() || (bi->dim() == 1 && bi->size(0) == ws[i].size(0) &&
                                    bi->device() == x.device() &&
                                    bi->scalar_type() == x.scalar_type()),
                "linears: 'bs' must be [M] vectors of x's dtype and device, or None");
    w.push_back(ws[i]);
    b.push_back(bi.has_value() ? *bi : at::Tensor());
  }
  return affines(x, w, b);
}

}  // namespace dfgnn
