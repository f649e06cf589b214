// AGNN score function instantiation of the fused attention kernel family: dot
// attention whose keys are the values, scaled per source (one gather per edge).
#include "attention_launch.cuh"

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>

namespace dfgnn {
DFGNN_INSTANTIATE_FWD(AGNN, agnn)   // (the backward: attention_agnn_bwd.cu)

// One warp per (source row, head): with dK = d_src (the gradient of the scaled
// key c_j x_j) and dV = d_val,
//   d_src <- c_j dK + dV   (the gradient of x_j through both the key and the value)
//   d_c   <- <dK, x_j>     (fp32 sum; the key scale's gradient)
// in fp32, rounded once.
template <typename T>
__global__ void __launch_bounds__(256) agnn_fold_kernel(T* __restrict__ d_src,
                                                        const T* __restrict__ d_val,
                                                        const T* __restrict__ x,
                                                        const T* __restrict__ c,
                                                        T* __restrict__ d_c, int64_t rows,
                                                        int64_t H, int64_t F, int64_t ld_x,
                                                        int64_t hs_x) {
  const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int64_t n = r / H, h = r % H;
  const float cr = static_cast<float>(c[r]);
  T* dk = d_src + r * F;
  const T* dv = d_val + r * F;
  const T* xr = x + n * ld_x + h * hs_x;
  float dot = 0.f;
  for (int64_t f = lane; f < F; f += 32) {
    const float k = static_cast<float>(dk[f]);
    dot += k * static_cast<float>(xr[f]);
    dk[f] = static_cast<T>(cr * k + static_cast<float>(dv[f]));
  }
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  if (lane == 0) d_c[r] = static_cast<T>(dot);
}

bool agnn_fold_grads(const FeatArgs& f, BwdOut& o) {
  const at::Tensor& x = f.src;   // the keys, which are the values ([N, H, F], rows maybe strided)
  const int64_t N = o.d_src.size(0), H = o.d_src.size(1), F = o.d_src.size(2);
  const auto dt = x.scalar_type();
  if (!(o.d_src.is_contiguous() && o.d_val.is_contiguous() && o.d_val.sizes() == o.d_src.sizes() &&
        x.sizes() == o.d_src.sizes() && x.stride(2) == 1 && f.att.is_contiguous() &&
        o.d_att.is_contiguous() && f.att.numel() == N * H && f.att.scalar_type() == dt &&
        o.d_att.scalar_type() == dt && o.d_src.scalar_type() == dt && o.d_val.scalar_type() == dt))
    return false;
  const int64_t rows = N * H;
  if (rows == 0) return true;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "agnn_fold", [&] {
    agnn_fold_kernel<scalar_t><<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(
        o.d_src.data_ptr<scalar_t>(), o.d_val.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
        f.att.data_ptr<scalar_t>(), o.d_att.data_ptr<scalar_t>(), rows, H, F, x.stride(0),
        x.stride(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return true;
}

// The x [N, F] both prologue ops take: contiguous CUDA fp32 / fp16 / bf16.
static void check_prologue_x(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous(), "pyg_dfgnn: ", op,
              ": 'x' must be a contiguous [N, F] CUDA tensor");
  const auto dt = x.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16, "pyg_dfgnn: ", op,
              ": 'x' must be float32, float16 or bfloat16, got ", dt);
}

// AGNN's prologue (ops._agnn_prologue), one warp per row of x [N, F]:
//   n_r = |x_r|,  c_r = 1 / max(n_r, eps),  q_r = beta c_r x_r  (rows r < num_dst)
// in fp32, each output rounded once: one read of x and one write of q, where
// ATen's norm, clamp, reciprocal and two products took 0.12 ms of an AGNN
// forward at 1 x 256 fp32 on the uniform 100k graph (H200; its two
// products 0.08 ms).
template <typename T>
__global__ void __launch_bounds__(256) agnn_prologue_kernel(
    T* __restrict__ q, T* __restrict__ c, T* __restrict__ n, const T* __restrict__ x,
    const T* __restrict__ beta, float eps, int64_t N, int64_t num_dst, int64_t F) {
  const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const T* xr = x + r * F;
  float ss = 0.f;
  for (int64_t f = lane; f < F; f += 32) {
    const float v = static_cast<float>(xr[f]);
    ss += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float nr = sqrtf(ss), cr = 1.f / fmaxf(nr, eps);
  if (lane == 0) {
    n[r] = static_cast<T>(nr);
    c[r] = static_cast<T>(cr);
  }
  if (r < num_dst) {
    const float a = static_cast<float>(*beta) * cr;
    T* qr = q + r * F;
    for (int64_t f = lane; f < F; f += 32) qr[f] = static_cast<T>(a * static_cast<float>(xr[f]));
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> agnn_prologue(const at::Tensor& x,
                                                             const at::Tensor& beta,
                                                             int64_t num_dst, double eps) {
  check_prologue_x(x, "agnn_prologue");
  const int64_t N = x.size(0), F = x.size(1);
  const auto dt = x.scalar_type();
  TORCH_CHECK(beta.device() == x.device() && beta.scalar_type() == dt && beta.numel() == 1,
              "pyg_dfgnn: agnn_prologue: 'beta' must be a one-element ", dt, " tensor on ",
              x.device());
  TORCH_CHECK(num_dst >= 0 && num_dst <= N,
              "pyg_dfgnn: agnn_prologue: 'num_dst' must be in [0, ", N, "], got ", num_dst);
  const c10::cuda::CUDAGuard guard(x.device());
  auto q = at::empty({num_dst, 1, F}, x.options());
  auto c = at::empty({N, 1}, x.options());
  auto n = at::empty({N, 1}, x.options());
  if (N == 0) return {q, c, n};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor b = beta.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dt, "agnn_prologue", [&] {
    agnn_prologue_kernel<scalar_t><<<(unsigned)((N + 7) / 8), 256, 0, stream>>>(
        q.data_ptr<scalar_t>(), c.data_ptr<scalar_t>(), n.data_ptr<scalar_t>(),
        x.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), static_cast<float>(eps), N, num_dst, F);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {q, c, n};
}

// AGNN's prologue backward (ops._AGNNPrologue), one warp per row of x [N, F]:
// with n = |x_r|, c = 1 / max(n, eps), s = <dq_r, x_r> (rows r < num_dst),
//   cbar  = dc_r + beta s
//   dx_r  = dk_r - [n >= eps] cbar c^2 / n * x_r + [r < num_dst] beta c dq_r
//   cs_r  = c s          (fp32; beta's gradient is their sum)
// in fp32, rounded once; absent gradients (null pointers) count as zero.
template <typename T>
__global__ void __launch_bounds__(256) agnn_prologue_bwd_kernel(
    T* __restrict__ dx, float* __restrict__ cs, const T* __restrict__ x,
    const T* __restrict__ dq, const T* __restrict__ dc, const T* __restrict__ dk,
    const T* __restrict__ c, const T* __restrict__ n, const T* __restrict__ beta, float eps,
    int64_t N, int64_t num_dst, int64_t F) {
  const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const T* xr = x + r * F;
  const T* qr = dq != nullptr && r < num_dst ? dq + r * F : nullptr;
  const T* kr = dk != nullptr ? dk + r * F : nullptr;
  float s = 0.f;
  if (qr != nullptr) {
    for (int64_t f = lane; f < F; f += 32) s += static_cast<float>(qr[f]) * static_cast<float>(xr[f]);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  }
  const float b = static_cast<float>(*beta), cr = static_cast<float>(c[r]),
              nr = static_cast<float>(n[r]);
  const float cbar = (dc != nullptr ? static_cast<float>(dc[r]) : 0.f) + b * s;
  const float w = nr >= eps ? -cbar * cr * cr / nr : 0.f;
  const float a = b * cr;
  T* dr = dx + r * F;
  for (int64_t f = lane; f < F; f += 32) {
    float v = w * static_cast<float>(xr[f]);
    if (kr != nullptr) v += static_cast<float>(kr[f]);
    if (qr != nullptr) v += a * static_cast<float>(qr[f]);
    dr[f] = static_cast<T>(v);
  }
  if (lane == 0 && qr != nullptr) cs[r] = cr * s;
}

std::tuple<at::Tensor, at::Tensor> agnn_prologue_bwd(const at::Tensor& x,
                                                     const c10::optional<at::Tensor>& dq,
                                                     const c10::optional<at::Tensor>& dc,
                                                     const c10::optional<at::Tensor>& dk,
                                                     const at::Tensor& c, const at::Tensor& n,
                                                     const at::Tensor& beta, double eps) {
  check_prologue_x(x, "agnn_prologue_bwd");
  const int64_t N = x.size(0), F = x.size(1);
  const auto dt = x.scalar_type();
  auto same = [&](const at::Tensor& t, const char* name, int64_t rows, int64_t cols) {
    TORCH_CHECK(t.device() == x.device() && t.scalar_type() == dt && t.is_contiguous() &&
                    t.numel() == rows * cols && (t.dim() == 0 ? rows * cols == 1 : t.size(0) == rows),
                "pyg_dfgnn: agnn_prologue_bwd: '", name, "' must be a contiguous ", dt,
                " tensor of ", rows, " x ", cols, " elements on ", x.device(), ", got ",
                t.sizes(), " ", t.scalar_type());
  };
  same(c, "c", N, 1);
  same(n, "n", N, 1);
  same(beta, "beta", 1, 1);
  const int64_t nd = dq.has_value() ? dq->size(0) : 0;
  TORCH_CHECK(nd <= N, "pyg_dfgnn: agnn_prologue_bwd: 'dq' has more rows than 'x'");
  if (dq.has_value()) same(*dq, "dq", nd, F);
  if (dc.has_value()) same(*dc, "dc", N, 1);
  if (dk.has_value()) same(*dk, "dk", N, F);
  const c10::cuda::CUDAGuard guard(x.device());
  auto dx = at::empty_like(x);
  auto cs = at::empty({nd}, x.options().dtype(at::kFloat));
  if (N == 0) return {dx, cs};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dt, "agnn_prologue_bwd", [&] {
    auto ptr = [](const c10::optional<at::Tensor>& t) {
      return t.has_value() ? t->data_ptr<scalar_t>() : nullptr;
    };
    agnn_prologue_bwd_kernel<scalar_t><<<(unsigned)((N + 7) / 8), 256, 0, stream>>>(
        dx.data_ptr<scalar_t>(), cs.data_ptr<float>(), x.data_ptr<scalar_t>(), ptr(dq), ptr(dc),
        ptr(dk), c.data_ptr<scalar_t>(), n.data_ptr<scalar_t>(), beta.data_ptr<scalar_t>(),
        static_cast<float>(eps), N, nd, F);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {dx, cs};
}
}  // namespace dfgnn
