// AGNN score function instantiation of the fused attention kernel family: dot
// attention whose keys are the values, scaled per source (one gather per edge).
#include "attention_launch.cuh"

#include <ATen/Dispatch.h>

namespace dfgnn {
DFGNN_INSTANTIATE(AGNN, agnn)

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
}  // namespace dfgnn
