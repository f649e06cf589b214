// Plain host structs shared by the op registration (dfgnn_ops.cpp) and the
// per-model kernel launchers (attention_<kind>.cu).
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>

#include <atomic>
#include <vector>

namespace dfgnn {

// A constant of the current device asked of the driver once (query(dev) for
// devices 0-63, cached in `cache`; any later device is asked every time).
template <typename Query>
inline int64_t device_constant(std::atomic<int64_t> (&cache)[64], Query&& query) {
  const int dev = c10::cuda::current_device();
  int64_t v = dev < 64 ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (v == 0) {
    v = query(dev);
    if (dev < 64) cache[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

// The backward's column-pass mode as forced by the caller (dfgnn_C::set_backward_mode,
// pyg_dfgnn.ops.set_backward_mode): -1 = not forced (PYG_DFGNN_BACKWARD or the
// automatic rule decides), 0 = store, 1 = recompute, 2 = the automatic rule.
inline std::atomic<int>& forced_backward_mode() {
  static std::atomic<int> mode{-1};
  return mode;
}

// A head width in bytes from which a head's node rows outweigh its per-edge
// arrays: below it, dot attention's backward stores alpha alone per edge
// (kColAlpha, attention_launch.cuh; GATv2's and bf16's too with
// PYG_DFGNN_ALPHA_MODE=1), and the layer ops take the backward's Delta from
// their output instead of saving the attention output besides it
// (dfgnn_ops.cpp, delta_source).
constexpr int64_t kWideHeadBytes = 128;

// fp16 / bf16 heads of the dot-like kinds (dot attention, AGNN) whose width is
// 2 mod 4 elements, up to 10 (the Transformer's 8 x 10), run unpadded on one
// lane of five 4-byte vectors in every pass (attention_launch.cuh, dispatch)
// instead of being padded to the next 8-byte width (12 for 10): the op copies
// nothing, and a layer's projections, output gradient and input gradients are
// a sixth narrower.  DFGNN_HALF_X5_TILES=0 pads them again.
#ifndef DFGNN_HALF_X5_TILES
#define DFGNN_HALF_X5_TILES 1
#endif
constexpr bool half_x5_width(int64_t elem_size, int64_t F) {
  return DFGNN_HALF_X5_TILES && elem_size == 2 && F % 4 == 2 && F <= 10;
}

struct GraphArgs {
  at::Tensor rowptr, col, perm;          // destination-major CSR (+ CSR pos -> edge id)
  at::Tensor t_rowptr, t_col, t_perm;    // transpose (+ transposed pos -> CSR pos)
};

struct FeatArgs {
  at::Tensor dst, src, val, edge, att;   // undefined when absent
  // dot attention's residual [N_dst, H, F] added in the forward's epilogue
  // (dfgnn_C::attention_fwd_residual; each head's F features contiguous, rows
  // row-strided), or undefined
  at::Tensor res;
  double scale = 1.0, slope = 0.2, drop_p = 0.0;
  int64_t seed = 0;
  bool need_alpha = false;
};

struct Sched {
  int64_t group = 0;                     // lanes per (item, head); 0 = automatic
  at::Tensor work, merge;                // row items [W, 4], split rows [R, 3]
  int64_t slots = 0;                     // partial slots used by split rows
  at::Tensor t_work, t_merge;            // the same for the transposed CSR
  int64_t t_slots = 0;
};

struct FwdOut { at::Tensor out, lse, alpha; };
// (delta: <dO_i, O_i> [N_dst, H] fp32 where the caller computed it -- then
// out may be undefined (GAT excepted); see Params::delta_in.  The recomputing
// and alpha modes' row pass overwrites it with the Delta it used:
// attention_launch.cuh, bwd_impl)
struct BwdIn { at::Tensor out, lse, grad_out, delta; };
struct BwdOut {
  at::Tensor d_dst, d_src, d_val, d_edge, d_att;
  // AGNN's kernels: with want_score_sum, score_sum gets the row pass's fp32
  // sum_j dS_ij s_ij per (launch column, work item, head) (Params::score_sum)
  bool want_score_sum = false;
  // d_src / d_val are src / val themselves (dfgnn_ops.cpp: src_in_place)
  bool src_aliased = false;
  at::Tensor score_sum;
};

void fwd_gat(const GraphArgs&, const FeatArgs&, const Sched&, FwdOut&);
void fwd_gatv2(const GraphArgs&, const FeatArgs&, const Sched&, FwdOut&);
void fwd_dot(const GraphArgs&, const FeatArgs&, const Sched&, FwdOut&);
// dot attention with a key scale c (FeatArgs::att [N_src, H]) and the keys
// given as the values (FeatArgs::src is FeatArgs::val): AGNN's shape
void fwd_agnn(const GraphArgs&, const FeatArgs&, const Sched&, FwdOut&);
void bwd_gat(const GraphArgs&, const FeatArgs&, const Sched&, const BwdIn&, BwdOut&);
void bwd_gatv2(const GraphArgs&, const FeatArgs&, const Sched&, const BwdIn&, BwdOut&);
void bwd_dot(const GraphArgs&, const FeatArgs&, const Sched&, const BwdIn&, BwdOut&);
void bwd_agnn(const GraphArgs&, const FeatArgs&, const Sched&, const BwdIn&, BwdOut&);
// after bwd_agnn: d_src <- c d_src + d_val and d_att <- <d_src, keys> in one
// pass (attention_agnn.cu; dfgnn_C::attention_bwd_folded); false (nothing
// done) for layouts or dtypes it does not take
bool agnn_fold_grads(const FeatArgs&, BwdOut&);
// Delta_i = <dO_i, out_i - sub_i> [N, H] fp32 (BwdIn::delta) from dout [N, H,
// >= C], out [N, H, C] and sub [N or broadcast, H, C] (or undefined), rows of
// any stride, each head's features contiguous (attention_dot.cu)
at::Tensor row_delta(const at::Tensor& dout, const at::Tensor& out, const at::Tensor& sub);
// AGNN's prologue (ops._agnn_prologue): (q [num_dst, 1, F], c [N, 1], n [N, 1])
// from x [N, F] and the one-element beta (attention_agnn.cu; dfgnn_C::agnn_prologue)
std::tuple<at::Tensor, at::Tensor, at::Tensor> agnn_prologue(const at::Tensor& x,
                                                             const at::Tensor& beta,
                                                             int64_t num_dst, double eps);
// AGNN's prologue backward (ops._AGNNPrologue): (dx, c_r s_r) from x [N, F]
// and the gradients of q [num_dst, 1, F], c [N, 1] and the keys [N, 1, F]
// (attention_agnn.cu; dfgnn_C::agnn_prologue_bwd)
std::tuple<at::Tensor, at::Tensor> agnn_prologue_bwd(const at::Tensor& x,
                                                     const c10::optional<at::Tensor>& dq,
                                                     const c10::optional<at::Tensor>& dc,
                                                     const c10::optional<at::Tensor>& dk,
                                                     const at::Tensor& c, const at::Tensor& n,
                                                     const at::Tensor& beta, double eps);

// GAT's node logits and their backward (gat_logits.cu)
std::tuple<at::Tensor, at::Tensor> gat_logits(const at::Tensor& x, const at::Tensor& att_src,
                                              const at::Tensor& att_dst);
std::tuple<at::Tensor, at::Tensor> gat_logits_bwd(const at::Tensor& x, const at::Tensor& att_src,
                                                  const at::Tensor& att_dst,
                                                  const at::Tensor& d_src,
                                                  const at::Tensor& d_dst, at::Tensor& d_x);

// n per-head maps (weights [H*C, in], optional biases [H*C]) stacked with zero
// rows C..W-1 in every head, in one launch (pad_heads.cu; nn/_glue.py)
std::tuple<at::Tensor, at::Tensor> stack_pad_heads(at::TensorList ws, at::TensorList bs,
                                                   int64_t heads, int64_t chans, int64_t width);

// fp32 projections x W^T + b on the bf16 tensor cores to fp32 accuracy
// (fp32_gemm.cu: the split GEMM, its rule and its mode): the maps (ws[i],
// bs[i]) of one x (undefined or empty bs[i]: none), x split once for all of
// them where the rule splits; `may_split` false: cuBLAS' fp32 GEMM whatever the
// mode (GATv2's projections; a GEMM that must repeat another bit for bit)
std::vector<at::Tensor> affines(const at::Tensor& x, const std::vector<at::Tensor>& ws,
                                const std::vector<at::Tensor>& bs, bool may_split = true);
std::vector<at::Tensor> linears(const at::Tensor& x, at::TensorList ws,
                                const c10::List<c10::optional<at::Tensor>>& bs);
// -1 = not forced (PYG_DFGNN_FP32_MATMUL decides), 0 ieee, 1 auto, 2 split;
// returns the previous mode, or -2 (nothing changed) for another value
int64_t set_fp32_gemm_mode(int64_t mode);

// The stride of t's rows (its leading dimensions flattened) where they are
// evenly strided with contiguous columns, what resize_cols takes; else -1
// (pad_heads.cu)
int64_t cols_ld(const at::Tensor& t);
// Up to kResizeColsMax tensors of one element size and device (each with
// cols_ld >= 0) with their last dimension set to widths[i] (the first columns
// kept, zeros beyond), as new contiguous tensors, in one launch (pad_heads.cu):
// the op pads its feature inputs and unpads their gradients with it
// (dfgnn_ops.cpp, resize_all)
constexpr int kResizeColsMax = 8;
std::vector<at::Tensor> resize_cols(const std::vector<at::Tensor>& ins,
                                    const std::vector<int64_t>& widths);

}  // namespace dfgnn
