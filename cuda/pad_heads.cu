// The padded projection weights of a layer call in one launch; the op's
// feature tensors padded (or their gradients unpadded) several at once.
//
// A GPU-bound layer call projects into the kernels' padded head width (nn/_padded.py):
// the weight [H*C, in] and bias [H*C] of each of its n linear maps get zero rows
// C..W-1 in every head, and the maps are stacked, so that one GEMM writes
// [N, n*H*W] (nn/_glue.py, _Projections).  The parameters change with every
// optimiser step, so this runs on every call; in ATen it is a concatenation and a
// pad per tensor kind (6 kernels and ~10 ATen ops of host time before the GEMM
// can start, the largest host cost of a Transformer call, docs/KERNELS.md session
// 17).  Here it is one op and one kernel for the weights and biases together:
//
//   w_out[(i*H + h)*W + c, k] = c < C ? w_i[h*C + c, k] : 0      (K = in columns)
//   b_out[(i*H + h)*W + c]    = c < C ? b_i[h*C + c]    : 0
//
// The values are copied bit for bit (any element type of 2, 4 or 8 bytes).  The
// caller (nn/_glue.py, padded_params) passes only what the checks below accept:
// a C++ exception thrown from an op of this extension crashed the process on the
// device's torch build (session 17), so they are a last resort, not the API.
#include <ATen/ATen.h>
#include <type_traits>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

#include "attention_api.h"

namespace dfgnn {
namespace {

constexpr int kMaxMaps = 8;
constexpr int kMaxCols = kResizeColsMax;   // (attention_api.h)

struct StackArgs {
  const void* w[kMaxMaps];
  const void* b[kMaxMaps];
  void* w_out;
  void* b_out;     // nullptr: no biases
  int64_t K, H, C, W;
};

template <typename E>
__global__ void stack_pad_kernel(StackArgs a, int64_t w_total, int64_t total) {
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    const bool is_w = t < w_total;
    const int64_t e = is_w ? t : t - w_total;
    const int64_t row = is_w ? e / a.K : e;          // output row (i*H + h)*W + c
    const int64_t k = is_w ? e - row * a.K : 0;
    const int64_t c = row % a.W, ih = row / a.W;
    const int64_t i = ih / a.H, h = ih - i * a.H;
    E v{};
    if (c < a.C) {
      const E* src = static_cast<const E*>(is_w ? a.w[i] : a.b[i]);
      v = src[(h * a.C + c) * (is_w ? a.K : 1) + k];
    }
    static_cast<E*>(is_w ? a.w_out : a.b_out)[e] = v;
  }
}


// resize_cols: out_i[r, c] = c < cin_i ? in_i[r * ld_i + c] : 0 for c < cout_i,
// every tensor's rows (leading dimensions flattened) in one grid, one element
// per thread.  Grids under 2^31 elements divide by cout_i with a multiply and a
// shift (FastDiv, as ATen's IntDivider) instead of a 64-bit division (which
// made the flat kernel slower than ATen's fill and copy, session 27).
struct FastDiv {
  uint32_t m = 0, s = 0;   // n / d = (umulhi(n, m) + n) >> s
};

inline FastDiv fast_div(uint32_t d) {   // 1 <= d < 2^31
  FastDiv f;
  while ((uint64_t(1) << f.s) < d) ++f.s;
  f.m = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << f.s) - d)) / d + 1);
  return f;
}

__device__ __forceinline__ uint32_t div_of(uint32_t n, const FastDiv& f) {   // n < 2^31
  return (__umulhi(n, f.m) + n) >> f.s;
}

struct ColsArgs {
  const void* in[kMaxCols];
  void* out[kMaxCols];
  int64_t cin[kMaxCols], ld[kMaxCols], cout[kMaxCols], start[kMaxCols + 1];
  FastDiv div[kMaxCols];
  int n;
};

template <typename E, bool WIDE>
__global__ void resize_cols_kernel(ColsArgs a) {
  using Ix = std::conditional_t<WIDE, int64_t, uint32_t>;
  const Ix total = static_cast<Ix>(a.start[a.n]);
  for (Ix t = blockIdx.x * (Ix)blockDim.x + threadIdx.x; t < total;
       t += (Ix)gridDim.x * blockDim.x) {
    int i = 0;
    while (i + 1 < a.n && t >= static_cast<Ix>(a.start[i + 1])) ++i;
    const Ix e = t - static_cast<Ix>(a.start[i]);
    Ix r;
    if constexpr (WIDE) r = e / a.cout[i];
    else r = div_of(e, a.div[i]);
    const Ix c = e - r * static_cast<Ix>(a.cout[i]);
    static_cast<E*>(a.out[i])[e] =
        c < static_cast<Ix>(a.cin[i]) ? static_cast<const E*>(a.in[i])[(int64_t)r * a.ld[i] + c]
                                      : E{};
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> stack_pad_heads(at::TensorList ws, at::TensorList bs,
                                                   int64_t heads, int64_t chans, int64_t width) {
  const int64_t n = static_cast<int64_t>(ws.size());
  TORCH_CHECK(n >= 1 && n <= kMaxMaps, "stack_pad_heads: 'ws' must hold 1 to ", kMaxMaps,
              " weights, got ", n);
  TORCH_CHECK(bs.empty() || static_cast<int64_t>(bs.size()) == n,
              "stack_pad_heads: 'bs' must be empty or hold one bias per weight, got ", bs.size(),
              " for ", n, " weights");
  TORCH_CHECK(heads >= 1 && chans >= 1 && width >= chans,
              "stack_pad_heads: need heads >= 1 and 1 <= chans <= width, got heads=", heads,
              ", chans=", chans, ", width=", width);
  const at::Tensor& w0 = ws[0];
  TORCH_CHECK(w0.is_cuda() && w0.dim() == 2 && w0.size(0) == heads * chans,
              "stack_pad_heads: every weight must be a CUDA [heads * chans, in] tensor, got ",
              w0.sizes());
  const int64_t K = w0.size(1);
  StackArgs a{};
  std::vector<at::Tensor> keep;   // contiguous copies where an input was not
  keep.reserve(2 * n);
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor& w = ws[i];
    TORCH_CHECK(w.device() == w0.device() && w.scalar_type() == w0.scalar_type() &&
                    w.dim() == 2 && w.size(0) == heads * chans && w.size(1) == K,
                "stack_pad_heads: weight ", i, " has shape ", w.sizes(), ", dtype ",
                w.scalar_type(), " on ", w.device(), "; weight 0 has ", w0.sizes(), ", ",
                w0.scalar_type(), " on ", w0.device());
    keep.push_back(w.contiguous());
    a.w[i] = keep.back().data_ptr();
  }
  const at::cuda::CUDAGuard guard(w0.device());
  at::Tensor w_out = at::empty({n * heads * width, K}, w0.options());
  at::Tensor b_out;
  if (!bs.empty()) {
    const at::Tensor& b0 = bs[0];
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor& b = bs[i];
      TORCH_CHECK(b.device() == w0.device() && b.scalar_type() == b0.scalar_type() &&
                      b.numel() == heads * chans,
                  "stack_pad_heads: bias ", i, " has shape ", b.sizes(), " and dtype ",
                  b.scalar_type(), "; need heads * chans = ", heads * chans, " elements of ",
                  b0.scalar_type(), " on the weights' device");
      keep.push_back(b.contiguous());
      a.b[i] = keep.back().data_ptr();
    }
    TORCH_CHECK(b0.element_size() == w0.element_size(),
                "stack_pad_heads: biases and weights must have one element size");
    b_out = at::empty({n * heads * width}, b0.options());
    a.b_out = b_out.data_ptr();
  } else {
    b_out = at::empty({0}, w0.options());
  }
  a.w_out = w_out.data_ptr();
  a.K = K; a.H = heads; a.C = chans; a.W = width;
  const int64_t w_total = w_out.numel();
  const int64_t total = w_total + (bs.empty() ? 0 : b_out.numel());
  if (total == 0) return {w_out, b_out};
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + threads - 1) / threads,
                                                                  4096));
  auto stream = at::cuda::getCurrentCUDAStream();
  switch (w0.element_size()) {
    case 2: stack_pad_kernel<uint16_t><<<blocks, threads, 0, stream>>>(a, w_total, total); break;
    case 4: stack_pad_kernel<uint32_t><<<blocks, threads, 0, stream>>>(a, w_total, total); break;
    case 8: stack_pad_kernel<uint64_t><<<blocks, threads, 0, stream>>>(a, w_total, total); break;
    default: TORCH_CHECK(false, "stack_pad_heads: unsupported element size ", w0.element_size());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {w_out, b_out};
}

int64_t cols_ld(const at::Tensor& t) {
  if (!t.defined() || t.dim() < 1 || (t.size(-1) > 1 && t.stride(-1) != 1)) return -1;
  int64_t ld = -1, expect = 0;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {   // the leading dimensions, innermost first
    if (t.size(d) <= 1) continue;
    if (ld < 0) {
      ld = t.stride(d);
      if (ld < t.size(-1)) return -1;
    } else if (t.stride(d) != expect) {
      return -1;
    }
    expect = t.stride(d) * t.size(d);
  }
  return ld < 0 ? std::max<int64_t>(t.size(-1), 1) : ld;
}

std::vector<at::Tensor> resize_cols(const std::vector<at::Tensor>& ins,
                                    const std::vector<int64_t>& widths) {
  const int64_t n = static_cast<int64_t>(ins.size());
  TORCH_CHECK(n >= 1 && n <= kMaxCols && static_cast<int64_t>(widths.size()) == n,
              "resize_cols: 1 to ", kMaxCols, " tensors, one width each");
  std::vector<at::Tensor> outs;
  outs.reserve(n);
  ColsArgs a{};
  a.n = static_cast<int>(n);
  const int64_t es = ins[0].element_size();
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor& t = ins[i];
    const int64_t ld = cols_ld(t);
    TORCH_CHECK(ld >= 0 && t.element_size() == es && t.device() == ins[0].device() &&
                    widths[i] >= 0,
                "resize_cols: tensor ", i, " must have evenly strided rows of contiguous "
                "columns and the first tensor's element size and device");
    auto sizes = t.sizes().vec();
    sizes.back() = widths[i];
    outs.push_back(at::empty(sizes, t.options().memory_format(at::MemoryFormat::Contiguous)));
    a.in[i] = t.data_ptr();
    a.out[i] = outs.back().data_ptr();
    a.cin[i] = t.size(-1);
    a.ld[i] = ld;
    a.cout[i] = std::max<int64_t>(widths[i], 1);
    a.start[i + 1] = a.start[i] + outs.back().numel();
  }
  const int64_t total = a.start[n];
  if (total == 0) return outs;
  const at::cuda::CUDAGuard guard(ins[0].device());
  const int threads = 256;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((total + threads - 1) / threads, 8192));
  auto stream = at::cuda::getCurrentCUDAStream();
  const bool wide = total >= (int64_t(1) << 31);
  for (int64_t i = 0; i < n && !wide; ++i) a.div[i] = fast_div(static_cast<uint32_t>(a.cout[i]));
#define DFGNN_RESIZE(E)                                                              \
  (wide ? resize_cols_kernel<E, true><<<blocks, threads, 0, stream>>>(a)             \
        : resize_cols_kernel<E, false><<<blocks, threads, 0, stream>>>(a))
  switch (es) {
    case 2: DFGNN_RESIZE(uint16_t); break;
    case 4: DFGNN_RESIZE(uint32_t); break;
    case 8: DFGNN_RESIZE(uint64_t); break;
    default: TORCH_CHECK(false, "resize_cols: unsupported element size ", es);
  }
#undef DFGNN_RESIZE
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return outs;
}

}  // namespace dfgnn
