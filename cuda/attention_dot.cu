// DOT score function instantiation of the fused attention kernel family; the
// layer ops' Delta from a stored output (row_delta, attention_api.h).
#include "attention_launch.cuh"
#include <c10/cuda/CUDAGuard.h>

namespace dfgnn {
DFGNN_INSTANTIATE_FWD(DOT, dot)   // (the backward: attention_dot_bwd.cu)

at::Tensor row_delta(const at::Tensor& dout, const at::Tensor& out, const at::Tensor& sub) {
  const int64_t N = out.size(0), H = out.size(1), C = out.size(2), NH = N * H;
  at::Tensor delta = at::empty({N, H}, out.options().dtype(at::kFloat));
  if (NH == 0) return delta;
  TORCH_CHECK(dout.dim() == 3 && dout.size(0) == N && dout.size(1) == H && dout.size(2) >= C &&
                  dout.stride(2) == 1 && out.stride(2) == 1 &&
                  dout.scalar_type() == out.scalar_type() &&
                  (!sub.defined() || (sub.dim() == 3 && sub.size(1) == H && sub.size(2) == C &&
                                      sub.stride(2) == 1 &&
                                      sub.scalar_type() == out.scalar_type())),
              "pyg_dfgnn: internal error: row_delta's operands");
  const c10::cuda::CUDAGuard guard(out.device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto go = [&](auto tag) {
    using T = decltype(tag);
    launch_row_delta<T>(NH, H, C, dout.data_ptr<T>(), dout.stride(0), dout.stride(1),
                        out.data_ptr<T>(), out.stride(0), out.stride(1),
                        sub.defined() ? sub.data_ptr<T>() : nullptr,
                        sub.defined() ? sub.stride(0) : 0, sub.defined() ? sub.stride(1) : 0,
                        nullptr, nullptr, nullptr, delta.data_ptr<float>(), stream);
  };
  switch (out.scalar_type()) {
    case at::kFloat: go(float{}); break;
    case at::kHalf: go(c10::Half{}); break;
    case at::kBFloat16: go(c10::BFloat16{}); break;
    default: TORCH_CHECK(false, "pyg_dfgnn: internal error: row_delta's dtype");
  }
  return delta;
}
}  // namespace dfgnn
