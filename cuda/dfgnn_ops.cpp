// Registration of the fused attention ops (namespace dfgnn_C) with the
// PyTorch dispatcher.  The Python package wraps them in the public
// dfgnn::attention_fwd / dfgnn::attention_bwd custom ops (fake impls and
// autograd live there).  Inputs were validated in Python once per graph;
// the checks here guard the kernel's assumptions.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include "attention_api.h"
#include "attention_schema.h"

namespace dfgnn {

// Named phases of an op's host work in torch.profiler's traces (user scopes
// "dfgnn::<op>::<phase>"): where a layer call's host time goes (docs/KERNELS.md,
// session 31).  Each call ends the previous phase, end() or the destructor the
// last; without a profiler each costs a thread-local check.
class Phases {
  std::optional<at::RecordFunction> rf_;

 public:
  void operator()(const char* name) {
    rf_.reset();
    rf_.emplace(at::RecordScope::USER_SCOPE);
    if (rf_->isActive())
      ::at::detail::record_function_with_scope(*rf_, name, c10::ArrayRef<const c10::IValue>{});
  }
  void end() { rf_.reset(); }
};
namespace {

using c10::optional;

at::Tensor opt(const optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

// Dot attention's [N, H, F] inputs q / k / v may be row-strided: each row's
// H x F features contiguous, rows further apart (column blocks of one projection
// GEMM's output: a Transformer layer's q | k | v); the kernels take the row
// stride (Params::ld_*).  Keys and values (`shared_heads`) may also be one
// row of F features that every head reads (head stride 0: x broadcast over
// the heads, a Transformer layer that aggregates x and projects after the
// attention; Params::hs_*).
bool row_strided(const at::Tensor& t, bool shared_heads = false) {
  if (t.dim() != 3 || (t.size(2) > 1 && t.stride(2) != 1)) return false;
  if (shared_heads && t.size(1) > 1 && t.stride(1) == 0) return t.stride(0) >= t.size(2);
  return (t.size(1) <= 1 || t.stride(1) == t.size(2)) && t.stride(0) >= t.size(1) * t.size(2);
}

// rows: 0 contiguous, 1 row-strided, 2 row-strided or heads shared (row_strided)
void check_cuda(const at::Tensor& t, const char* name, const at::Device& dev, int rows = 0) {
  if (!t.defined()) return;
  TORCH_CHECK(t.device() == dev, "pyg_dfgnn: '", name, "' is on ", t.device(), ", expected ",
              dev);
  TORCH_CHECK(t.is_contiguous() || (rows > 0 && row_strided(t, rows > 1)), "pyg_dfgnn: '",
              name,
              rows > 0 ? "' must be contiguous or row-strided (each row's features contiguous)"
                       : "' must be contiguous");
}

void check_index(const at::Tensor& t, const char* name, at::ScalarType it) {
  if (!t.defined()) return;
  TORCH_CHECK(t.scalar_type() == it, "pyg_dfgnn: index '", name, "' has dtype ",
              t.scalar_type(), " but the graph uses ", it);
}

GraphArgs graph_args(const at::Tensor& rowptr, const at::Tensor& col,
                     const optional<at::Tensor>& perm, const at::Tensor& t_rowptr,
                     const at::Tensor& t_col, const at::Tensor& t_perm) {
  GraphArgs g{rowptr, col, opt(perm), t_rowptr, t_col, t_perm};
  const auto it = col.scalar_type();
  TORCH_CHECK(it == at::kInt || it == at::kLong, "pyg_dfgnn: index dtype must be int32/int64");
  for (auto* p : {&g.rowptr, &g.col, &g.perm, &g.t_rowptr, &g.t_col, &g.t_perm}) {
    check_index(*p, "graph", it);
    check_cuda(*p, "graph", col.device());
  }
  return g;
}

FeatArgs feat_args(int64_t kind, const at::Tensor& dst, const at::Tensor& src,
                   const optional<at::Tensor>& val, const optional<at::Tensor>& edge,
                   const optional<at::Tensor>& att, double scale, double slope, double p,
                   int64_t seed, bool need_alpha) {
  FeatArgs f;
  f.dst = dst; f.src = src; f.val = opt(val); f.edge = opt(edge); f.att = opt(att);
  f.scale = scale; f.slope = slope; f.drop_p = p; f.seed = seed; f.need_alpha = need_alpha;
  TORCH_CHECK(kind >= 0 && kind <= 2, "pyg_dfgnn: unknown attention kind ", kind);
  TORCH_CHECK(kind == 1 || f.val.defined(), "pyg_dfgnn: 'value' is required for this kind");
  TORCH_CHECK(kind != 1 || f.att.defined(), "pyg_dfgnn: 'att' is required for GATv2");
  // GAT's att: the output bias [H, C], C <= F; the output has its C columns
  // (a value projected into a padded width carries zero columns C..F-1)
  TORCH_CHECK(kind != 0 || !f.att.defined() ||
                  (f.att.dim() == 2 && f.val.dim() == 3 && f.att.size(0) == f.val.size(1) &&
                   f.att.size(1) <= f.val.size(2)),
              "pyg_dfgnn: GAT's 'att' (the output bias) must be [H, C] with C <= the value's F");
  // dot attention's att: the key scale c [N_src, H] (keys c_j k_j), without edge features
  TORCH_CHECK(kind != 2 || !f.att.defined() ||
                  (f.att.dim() == 2 && f.src.dim() == 3 && f.att.size(0) == f.src.size(0) &&
                   f.att.size(1) == f.src.size(1) && !f.edge.defined()),
              "pyg_dfgnn: dot attention's 'att' (the key scale) must be [N_src, H], "
              "without edge features");
  const auto dt = src.scalar_type();
  for (auto* t : {&f.dst, &f.src, &f.val, &f.edge, &f.att}) {
    if (!t->defined()) continue;
    TORCH_CHECK(t->scalar_type() == dt, "pyg_dfgnn: all features must share one dtype");
    // (dot attention's q / k / v may be row-strided: Params::ld_* in the kernels)
    check_cuda(*t, "features", src.device(),
               kind != 2 ? 0 : (t == &f.src || t == &f.val) ? 2 : t == &f.dst ? 1 : 0);
  }
  if (kind == 2 && f.att.defined()) f.att = f.att.contiguous();   // (scalar loads)
  return f;
}

// ------------------------------------------------------------ feature layout
// The kernels load features in 16-byte vectors, or 8-byte ones where F is not a
// multiple of the 16-byte vector, or (GAT in fp16 / bf16; dot attention's and
// AGNN's fp16 / bf16 heads of 2, 6 or 10) 4-byte ones where F is not a multiple
// of the 8-byte vector, so every head of a row must start on a vector boundary.
// A width that is a multiple of the narrowest vector (8 x 10 fp32, GAT's 8 x 10
// bf16 since session 17, the Transformer's 8 x 10 bf16 since session 40, 4 x 12
// bf16, ...) runs as it is: no copy.  Other widths (8 x 19 fp32 or bf16,
// GATv2's 8 x 10 bf16, ...) are zero-padded here instead of running a scalar path:
// zero features add nothing to scores, dP or Delta, and the padded output /
// gradient columns are sliced off.  The padded width is a 16-byte multiple, or
// an 8-byte one where the 16-byte multiple would pad by more than a quarter.
// (Layers on GPU-bound calls project straight into a padded width themselves:
// pyg_dfgnn/nn/_padded.py.)  Tensors that are not 16-byte aligned (views into a
// larger buffer) are copied.
// Calls with at least this many value elements are GPU-bound (the host's
// launches hide behind the kernels): pyg_dfgnn/nn/_padded.py, GPU_BOUND_ELEMENTS.
constexpr int64_t kGpuBoundElements = int64_t(1) << 22;

int64_t padded_width(int64_t F, at::ScalarType dt, int64_t kind) {
  const int64_t es = (int64_t)c10::elementSize(dt), vmax = 16 / es, half = vmax / 2;
  // the narrowest vector instantiated (attention_launch.cuh, dispatch): 8 bytes, 4
  // for GAT's 2-byte types (its vector-score siblings ran 1.4-1.7x longer on
  // 4-byte loads than on a padded 8-byte width: docs/KERNELS.md, session 17)
  const int64_t vmin = (es == 2 && kind == 0) ? half / 2 : half;
  if (F % vmin == 0) return F;
  // (dot attention's and AGNN's fp16 / bf16 heads of 2, 6 or 10: five 4-byte
  // vectors on one lane, attention_api.h: half_x5_width)
  if (kind == 2 && half_x5_width(es, F)) return F;
  int64_t fp = (F + vmax - 1) / vmax * vmax;
  if ((fp - F) * 4 > F) fp = (F + half - 1) / half * half;
  return fp;
}

at::Tensor fit(const at::Tensor& t, int64_t fp) {
  if (!t.defined()) return t;
  if (t.size(-1) != fp) return at::constant_pad_nd(t, {0, fp - t.size(-1)});
  const bool rows_ok = t.dim() != 3 || t.is_contiguous() ||
                       (t.stride(0) * (int64_t)t.element_size()) % 16 == 0;
  if (t.numel() && (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0 || !rows_ok)) {
    auto c = t.contiguous();   // (a new, aligned buffer unless t was contiguous already)
    return c.data_ptr() == t.data_ptr() ? t.clone() : c;
  }
  return t;
}

// Each *ts[i].first resized to ts[i].second columns: the tensors resize_cols
// takes (CUDA, rows it can stride, one element size and device, up to
// kResizeColsMax distinct tensors) in one launch (pad_heads.cu), the others by
// `one` (fit() or unfit()).  One launch instead of a constant_pad_nd or a
// narrow-and-copy each (an allocation, a fill and a copy: the host time of a
// small padded call, docs/KERNELS.md session 27).  A tensor passed twice for
// one width is resized once; null pointers and undefined tensors are skipped.
template <typename One>
void resize_all(const std::vector<std::pair<at::Tensor*, int64_t>>& ts, One one) {
  std::vector<at::Tensor*> dst;
  std::vector<at::Tensor> ins;
  std::vector<int64_t> widths;
  std::vector<size_t> of;   // per entry of dst: its index in ins
  for (const auto& [t, w] : ts) {
    if (t == nullptr || !t->defined()) continue;
    if (t->size(-1) == w || t->numel() == 0 || !t->is_cuda() || cols_ld(*t) < 0) {
      *t = one(*t, w);
      continue;
    }
    size_t k = ins.size();
    for (size_t i = 0; i < ins.size(); ++i)
      if (ins[i].is_same(*t) && widths[i] == w) k = i;
    if (k == ins.size()) {
      const bool full = ins.size() >= static_cast<size_t>(kResizeColsMax);
      if (full || (!ins.empty() && (t->element_size() != ins[0].element_size() ||
                                    t->device() != ins[0].device()))) {
        *t = one(*t, w);
        continue;
      }
      ins.push_back(*t);
      widths.push_back(w);
    }
    dst.push_back(t);
    of.push_back(k);
  }
  if (ins.empty()) return;
  const auto outs = resize_cols(ins, widths);
  for (size_t i = 0; i < dst.size(); ++i) *dst[i] = outs[of[i]];
}

// fit() of several tensors to one width fp (padded in one launch where they can be)
void fit_all(std::initializer_list<at::Tensor*> ts, int64_t fp) {
  std::vector<std::pair<at::Tensor*, int64_t>> e;
  e.reserve(ts.size());
  for (at::Tensor* t : ts) e.emplace_back(t, fp);
  resize_all(e, [](const at::Tensor& t, int64_t w) { return fit(t, w); });
}

at::Tensor unfit(const at::Tensor& t, int64_t F) {
  return (t.defined() && t.dim() > 0 && t.size(-1) != F) ? t.narrow(-1, 0, F).contiguous() : t;
}

// Dot attention's keys passed as the value tensor itself (one view of one buffer).
bool keys_are_values(int64_t kind, const FeatArgs& f) {
  return kind == 2 && f.val.defined() && f.src.numel() && f.src.data_ptr() == f.val.data_ptr() &&
         f.src.sizes() == f.val.sizes() && f.src.strides() == f.val.strides();
}

// Dot attention with a key scale c (the op's att [N_src, H]: keys c_j k_j).  With
// the keys given as the values it runs AGNN's kernels (one gather per edge,
// c_j applied in registers); otherwise the keys are scaled here (a copy, rounded
// to their dtype) and the dot kernels run.  Returns whether AGNN's kernels run;
// `unscaled` gets the keys before scaling (for the key scale's gradient).
bool key_scale_route(int64_t kind, FeatArgs& f, at::Tensor& unscaled) {
  if (kind != 2 || !f.att.defined()) return false;
  unscaled = f.src;
  if (keys_are_values(kind, f)) return true;
  f.src = (f.src.to(at::kFloat) * f.att.unsqueeze(-1)).to(f.src.scalar_type());
  return false;
}

// The gradients of the keys and of the key scale from the kernels' d_src =
// dK_j = sum_i g_ij q_i, the gradient of the scaled key c_j k_j:
// d_c = <dK_j, k_j> per head, d_k = c_j dK_j.
// (The products in the features' dtype, summed in fp32: an fp32 copy of d_src
// made bf16 AGNN's peak memory 29 % higher than before the key scale, H200.)
void key_scale_grads(const FeatArgs& f, const at::Tensor& keys, BwdOut& o) {
  o.d_att.copy_(at::sum(o.d_src * keys, -1, false, at::kFloat));
  o.d_src.mul_(f.att.unsqueeze(-1));
}

// Width of the kernel's feature rows and the original one; pads in place.
struct Layout {
  int64_t F = 0, Fp = 0;
};

// (extra1 / extra2: more tensors to fit to the kernels' width in the same
// launch, the backward's stored output and output gradient; may be null)
Layout fit_features(int64_t kind, FeatArgs& f, at::Tensor* extra1 = nullptr,
                    at::Tensor* extra2 = nullptr) {
  Layout l;
  const auto dt = f.src.scalar_type();
  if (kind == 0) {  // GAT: only the value rows (and the output bias) are vectors
    l.F = f.val.size(2);
    l.Fp = padded_width(l.F, dt, kind);
    // the output bias [H, C]: padded to the kernels' width (vector loads) on
    // GPU-bound calls; on smaller ones a narrower bias (C < Fp, the caller's
    // output width) is read per element as it is, which saves the host time of
    // padding it in forward and backward (its per-element loads made GAT 8 x 19's
    // forward kernel 2-4 % slower on a 1.6M-edge graph, H200, session 25)
    const bool pad_bias = f.att.defined() &&
        (f.att.size(1) == l.Fp || f.val.numel() / std::max<int64_t>(l.F, 1) * l.Fp >=
                                      kGpuBoundElements);
    if (f.att.defined() && !pad_bias) f.att = f.att.contiguous();
    fit_all({&f.val, pad_bias ? &f.att : nullptr, extra1, extra2}, l.Fp);
  } else {
    // one width for q/k, v, edge and att (they may differ for dot: zero
    // columns change no score)
    const at::Tensor& v = kind == 1 ? f.src : f.val;
    l.F = v.size(2);
    int64_t w = std::max<int64_t>(l.F, f.src.size(2));
    l.Fp = padded_width(w, dt, kind);
    // keys that are the values stay one tensor (AGNN's kernels gather it once)
    const bool kv = keys_are_values(kind, f);
    fit_all({&f.dst, kv ? nullptr : &f.src, &f.val, &f.edge,
             kind == 1 ? &f.att : nullptr,   // (dot's att is the key scale [N_src, H])
             extra1, extra2}, l.Fp);
    if (kv) f.src = f.val;
  }
  return l;
}

Sched sched_args(at::IntArrayRef sched, const optional<at::Tensor>& work,
                 const optional<at::Tensor>& merge, const optional<at::Tensor>& t_work,
                 const optional<at::Tensor>& t_merge) {
  TORCH_CHECK(sched.size() == 3, "pyg_dfgnn: sched must be [group, slots, t_slots]");
  Sched s;
  s.group = sched[0]; s.slots = sched[1]; s.t_slots = sched[2];
  TORCH_CHECK(s.group == 0 || s.group == 1 || s.group == 2 || s.group == 4 || s.group == 8 || s.group == 16 || s.group == 32,
              "pyg_dfgnn: group must be 0 (auto), 1, 2, 4, 8, 16 or 32, got ", s.group);
  s.work = opt(work); s.merge = opt(merge); s.t_work = opt(t_work); s.t_merge = opt(t_merge);
  return s;
}

// Dot attention's residual r [N_dst, H, C] (C <= F) as the kernels read it:
// rows of H heads of Fp features (the padded width), each head's features
// contiguous, rows row-strided and 16-byte aligned.  A view with that layout
// (the skip block of a Transformer layer's projection GEMM, sliced to C
// columns) is read as it is, its columns C..Fp-1 too (they only meet output
// columns that are not written) where they lie inside its storage; anything
// else is copied (zero-padded to Fp).
at::Tensor residual_rows(const at::Tensor& r, int64_t Fp) {
  if (r.numel() == 0) return r;
  const int64_t N = r.size(0), H = r.size(1), C = r.size(2), es = (int64_t)r.element_size();
  const bool heads = r.stride(2) == 1 && (H <= 1 || r.stride(1) == Fp) &&
                     (N <= 1 || r.stride(0) >= H * Fp);
  const int64_t last = r.storage_offset() + (N - 1) * r.stride(0) + (H - 1) * Fp + Fp;
  const bool inside = heads && last * es <= (int64_t)r.storage().nbytes();
  const bool aligned = reinterpret_cast<uintptr_t>(r.data_ptr()) % 16 == 0 &&
                       (N <= 1 || (r.stride(0) * es) % 16 == 0);
  if (heads && inside && aligned) return r;
  at::Tensor c = C != Fp ? at::constant_pad_nd(r, {0, Fp - C}) : r.contiguous();
  return c.data_ptr() == r.data_ptr() ? c.clone() : c;
}

#define DFGNN_FWD_PARAMS                                                                  \
  int64_t kind, const at::Tensor &rowptr, const at::Tensor &col,                              \
      const optional<at::Tensor> &perm, const at::Tensor &t_rowptr, const at::Tensor &t_col,  \
      const at::Tensor &t_perm, const at::Tensor &dst, const at::Tensor &src,                 \
      const optional<at::Tensor> &val, const optional<at::Tensor> &edge,                      \
      const optional<at::Tensor> &att, double scale, double slope, double p, int64_t seed,    \
      bool need_alpha, at::IntArrayRef sched, const optional<at::Tensor> &work,               \
      const optional<at::Tensor> &merge, const optional<at::Tensor> &t_work,                  \
      const optional<at::Tensor> &t_merge
#define DFGNN_FWD_ARGS                                                                       \
  kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst, src, val, edge, att, scale, slope, p, \
      seed, need_alpha, sched, work, merge, t_work, t_merge

// (the arguments of DFGNN_ATTENTION_FWD_SCHEMA and the residual, or an undefined tensor)
// (out_width: GAT's output width where the caller gives one, e.g. a layer op
// whose values were projected into the kernels' padded width; else the bias's
// width, or the values')
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_fwd_impl(DFGNN_FWD_PARAMS,
                                                                  const at::Tensor& residual,
                                                                  int64_t out_width = 0) {
  Phases phase;
  phase("dfgnn::attention_fwd::args");
  const c10::cuda::CUDAGuard guard(src.device());
  GraphArgs g = graph_args(rowptr, col, perm, t_rowptr, t_col, t_perm);
  FeatArgs f = feat_args(kind, dst, src, val, edge, att, scale, slope, p, seed, need_alpha);
  Sched s = sched_args(sched, work, merge, t_work, t_merge);
  int64_t out_F = kind != 0 ? 0 : out_width > 0 ? out_width : f.att.defined() ? f.att.size(1) : 0;
  at::Tensor unscaled;
  const bool agnn = key_scale_route(kind, f, unscaled);
  const Layout lay = fit_features(kind, f);
  const at::Tensor& v = kind == 1 ? f.src : f.val;
  const int64_t Nd = rowptr.numel() - 1, H = v.size(1);
  if (residual.defined()) {
    // (pyg_dfgnn.ops.dot_attention validated it; these guard the kernels)
    TORCH_CHECK(kind == 2 && !agnn, "pyg_dfgnn: a residual needs dot attention without a key scale");
    TORCH_CHECK(residual.dim() == 3 && residual.size(0) == Nd && residual.size(1) == H &&
                    residual.size(2) <= lay.F && residual.scalar_type() == v.scalar_type() &&
                    residual.device() == v.device(),
                "pyg_dfgnn: the residual must be [N_dst, H, C] with C <= F, in the features' "
                "dtype and device");
    out_F = residual.size(2);
    f.res = residual_rows(residual, lay.Fp);
  }
  FwdOut o;
  phase("dfgnn::attention_fwd::outputs");
  // written in the caller's width (the kernels skip the padding columns: no copy)
  o.out = at::empty({Nd, H, out_F > 0 ? out_F : lay.F}, v.options());
  o.lse = at::empty({2, Nd, H}, v.options().dtype(at::kFloat));  // (row max, log sum)
  o.alpha = need_alpha ? at::empty({col.numel(), H}, v.options()) : at::empty({0}, v.options());
  phase("dfgnn::attention_fwd::launch");
  if (kind == 0) fwd_gat(g, f, s, o);
  else if (kind == 1) fwd_gatv2(g, f, s, o);
  else if (agnn) fwd_agnn(g, f, s, o);
  else fwd_dot(g, f, s, o);
  return {o.out, o.lse, o.alpha};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_fwd(DFGNN_FWD_PARAMS) {
  return attention_fwd_impl(DFGNN_FWD_ARGS, at::Tensor());
}

// attention_fwd plus dot attention's residual r [N_dst, H, C] (C <= F) added
// in the epilogue: out = attention[..., :C] + r, written [N_dst, H, C] (a
// Transformer layer's root weight x_i W_r without a pass of its own).  Forward
// only (no autograd formula: pyg_dfgnn.ops.dot_attention calls it where no
// gradient is recorded); the lse it returns is the attention's.
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_fwd_residual(DFGNN_FWD_PARAMS,
                                                                      const at::Tensor& residual) {
  return attention_fwd_impl(DFGNN_FWD_ARGS, residual);
}

#define DFGNN_BWD_PARAMS                                                                  \
  int64_t kind, const at::Tensor &rowptr, const at::Tensor &col,                              \
      const optional<at::Tensor> &perm, const at::Tensor &t_rowptr, const at::Tensor &t_col,  \
      const at::Tensor &t_perm, const at::Tensor &dst, const at::Tensor &src,                 \
      const optional<at::Tensor> &val, const optional<at::Tensor> &edge,                      \
      const optional<at::Tensor> &att, double scale, double slope, double p, int64_t seed,    \
      const at::Tensor &out, const at::Tensor &lse, const at::Tensor &grad_out,               \
      at::IntArrayRef sched, const optional<at::Tensor> &work,                                \
      const optional<at::Tensor> &merge, const optional<at::Tensor> &t_work,                  \
      const optional<at::Tensor> &t_merge
#define DFGNN_BWD_ARGS                                                                       \
  kind, rowptr, col, perm, t_rowptr, t_col, t_perm, dst, src, val, edge, att, scale, slope, p, \
      seed, out, lse, grad_out, sched, work, merge, t_work, t_merge

// Dot attention's q / k / v as the three column blocks of one [N, 3 H F]
// buffer (a Transformer layer's projection GEMM output, nn/_glue.py:
// _Projections): the block (0, 1, 2) each of dst / src / val is, or -1s.
std::array<int64_t, 3> qkv_blocks(const FeatArgs& f) {
  const std::array<int64_t, 3> none{-1, -1, -1};
  const at::Tensor* t[3] = {&f.dst, &f.src, &f.val};
  if (!f.val.defined() || f.src.dim() != 3) return none;
  const int64_t N = f.src.size(0), H = f.src.size(1), F = f.src.size(2), w = H * F;
  if (N == 0 || w == 0) return none;
  for (const at::Tensor* x : t)
    if (x->dim() != 3 || x->sizes() != f.src.sizes() || x->stride(2) != 1 ||
        (H > 1 && x->stride(1) != F) || (N > 1 && x->stride(0) != 3 * w) ||
        x->scalar_type() != f.src.scalar_type() ||
        x->storage().data() != f.src.storage().data())
      return none;
  std::array<int64_t, 3> off, blk;
  int64_t lo = INT64_MAX;
  for (int i = 0; i < 3; ++i) lo = std::min(lo, off[i] = t[i]->storage_offset());
  bool seen[3] = {false, false, false};
  for (int i = 0; i < 3; ++i) {
    const int64_t d = off[i] - lo;
    if (d % w != 0 || d / w > 2 || seen[d / w]) return none;
    seen[d / w] = true;
    blk[i] = d / w;
  }
  return blk;
}

// Whether the backward may write d_src (and dot attention's d_val) over src
// (val) themselves: GATv2's x_l with its own x_r, or the Transformer's k and v
// blocks of the projection buffer (blk), read by the kernels as the caller
// gave them.  The row pass reads the neighbours' src / val rows and writes
// d_dst only; the column pass writes d_src[j] / d_val[j] (or, for split
// columns, partial sums that a later merge adds up), and of src / val it
// reads only its own column's rows, at the start (recompute mode; GATv2's
// x_src_j in either mode) -- except a launch column of a head split over
// several feature tiles, which reads the row's other tiles while another
// launch column may have written them: bwd_impl then writes d_src / d_val to
// a buffer of their own and copies them over (attention_launch.cuh).  dst
// must not share src's storage: the column pass reads it for every edge.
// Not for AGNN (keys are values, folded gradients), edge features or a key
// scale (kept simple: no layer op passes them).
bool src_in_place(int64_t kind, bool agnn, const FeatArgs& f, const at::Tensor& src,
                  const optional<at::Tensor>& val, const std::array<int64_t, 3>& blk) {
  if (agnn || f.edge.defined() || f.src.numel() == 0 || f.src.data_ptr() != src.data_ptr())
    return false;
  if (kind == 1) return f.src.storage().data() != f.dst.storage().data();
  return kind == 2 && !f.att.defined() && blk[0] >= 0 && val.has_value() &&
         f.val.data_ptr() == val->data_ptr();
}

// n ones of like's dtype and device, kept per (device, dtype, stream) (below)
at::Tensor ones_like_rows(const at::Tensor& like, int64_t n);

// (the arguments of DFGNN_ATTENTION_BWD_SCHEMA; fold: attention_bwd_folded, below;
// blocks: where q / k / v are the column blocks of one buffer (qkv_blocks),
// their gradients are the same blocks of one new buffer, which the layer's
// backward GEMM reads without concatenating them; inplace: the caller no longer
// needs src and val after this call (a layer op's own projections, in a
// backward that frees its graph), so where the kernels read them as they are
// (no padded or aligned copy), d_src and d_val are written over them -- see
// src_in_place -- and d_dst comes back in a new contiguous buffer)
// delta: <dO_i, O_i> [N_dst, H] fp32 where the caller computed it (row_delta;
// not GAT), and then out may be undefined; the recomputing and alpha modes'
// row pass writes the Delta it used over it (the caller's is spent).
std::vector<at::Tensor> attention_bwd_impl(DFGNN_BWD_PARAMS, bool fold, bool blocks,
                                           bool inplace, const at::Tensor& delta = {}) {
  Phases phase;
  phase("dfgnn::attention_bwd::args");
  const c10::cuda::CUDAGuard guard(src.device());
  GraphArgs g = graph_args(rowptr, col, perm, t_rowptr, t_col, t_perm);
  FeatArgs f = feat_args(kind, dst, src, val, edge, att, scale, slope, p, seed, false);
  Sched s = sched_args(sched, work, merge, t_work, t_merge);
  TORCH_CHECK(out.defined() ? grad_out.sizes() == out.sizes() &&
                                  grad_out.scalar_type() == out.scalar_type()
                              : kind != 0 && delta.defined(),
              "pyg_dfgnn: grad_out must match out");
  TORCH_CHECK(!delta.defined() ||
                  (delta.dim() == 2 && delta.size(0) == rowptr.numel() - 1 &&
                   delta.size(1) == grad_out.size(1) && delta.is_contiguous() &&
                   delta.scalar_type() == at::kFloat),
              "pyg_dfgnn: internal error: delta must be float32 [num_dst, heads]");
  TORCH_CHECK(lse.dim() == 3 && lse.size(0) == 2 && lse.size(1) == rowptr.numel() - 1 &&
                  lse.scalar_type() == at::kFloat,
              "pyg_dfgnn: lse must be float32 [2, num_dst, heads] (row max, log sum)");
  // keys / values that every head reads as one row (head stride 0): the
  // backward's passes index each head's own row (attention_kernels.cuh:
  // load_batch, SHARED), so they get contiguous copies, one for keys that are
  // the values
  {
    auto shared = [](const at::Tensor& t) {
      return t.defined() && t.dim() == 3 && t.size(1) > 1 && t.stride(1) == 0;
    };
    const bool kv = keys_are_values(kind, f);
    if (shared(f.src)) f.src = f.src.contiguous();
    if (kv) f.val = f.src;
    else if (shared(f.val)) f.val = f.val.contiguous();
  }
  const FeatArgs orig = f;
  at::Tensor unscaled;
  const bool agnn = key_scale_route(kind, f, unscaled);
  check_cuda(out, "out", src.device());
  check_cuda(delta, "delta", src.device());
  check_cuda(lse, "lse", src.device());
  check_cuda(grad_out, "grad_out", src.device());
  // (GAT: out as it is; its single-gather backward does not read it, the
  // other path pads it itself: attention_launch.cuh, bwd_impl)
  BwdIn bi{out, lse, grad_out, delta};
  const Layout lay = fit_features(kind, f, kind == 0 ? nullptr : &bi.out, &bi.grad_out);
  BwdOut o;
  phase("dfgnn::attention_bwd::outputs");
  // absent gradients are distinct empty tensors (custom-op outputs must not alias)
  auto empty = [&] { return at::empty({0}, src.options()); };
  // (contiguous, whatever the inputs' row strides)
  const std::array<int64_t, 3> blk =
      (blocks && kind == 2 && !agnn) ? qkv_blocks(f) : std::array<int64_t, 3>{-1, -1, -1};
  if (inplace && src_in_place(kind, agnn, f, src, val, blk)) {
    o.d_dst = at::empty(f.dst.sizes(), f.dst.options());
    o.d_src = f.src;
    o.d_val = kind == 2 ? f.val : empty();
    o.src_aliased = true;
  } else if (blk[0] >= 0) {
    const int64_t N = f.src.size(0), w = f.src.size(1) * f.src.size(2);
    const at::Tensor buf = at::empty({N, 3 * w}, f.src.options());
    auto block = [&](int64_t b) { return buf.narrow(1, b * w, w).view(f.src.sizes()); };
    o.d_dst = block(blk[0]);
    o.d_src = block(blk[1]);
    o.d_val = block(blk[2]);
  } else {
    o.d_dst = at::empty(f.dst.sizes(), f.dst.options());
    o.d_src = at::empty(f.src.sizes(), f.src.options());
    o.d_val =
        (kind != 1 && f.val.defined()) ? at::empty(f.val.sizes(), f.val.options()) : empty();
  }
  o.d_edge = f.edge.defined() ? at::empty_like(f.edge) : empty();
  // (GAT's bias gradient is made below, in the caller's width)
  o.d_att = f.att.defined() && kind != 0 ? at::empty_like(f.att) : empty();
  phase("dfgnn::attention_bwd::launch");
  if (kind == 0) {
    bwd_gat(g, f, s, bi, o);
    if (f.att.defined()) {
      phase("dfgnn::attention_bwd::bias");   // the output bias: a column sum of grad_out, as a GEMV
      // of the caller's grad_out [N, H, C], written in the caller's bias width C
      // (the kernels may have run a bias padded to their width)
      const auto g2 = grad_out.reshape({-1, orig.att.numel()});
      o.d_att = at::empty(orig.att.sizes(), orig.att.options());
      at::Tensor d_att = o.d_att.view({-1});
      // (over the kept ones vector, as the layer ops' column sums: no allocation
      // and fill per call)
      at::mv_out(d_att, g2.t(), ones_like_rows(g2, g2.size(0)));
    }
  }
  else if (kind == 1) bwd_gatv2(g, f, s, bi, o);
  else if (agnn) {
    o.want_score_sum = fold;
    bwd_agnn(g, f, s, bi, o);
    if (fold && agnn_fold_grads(f, o)) o.d_val = empty();   // (folded into d_src)
    else key_scale_grads(f, f.src, o);
  } else {
    bwd_dot(g, f, s, bi, o);
    if (f.att.defined()) key_scale_grads(f, fit(unscaled, lay.Fp), o);
  }
  // gradients in the caller's widths (the padded columns are dropped, in one
  // launch where resize_cols takes them)
  phase("dfgnn::attention_bwd::resize");
  std::vector<at::Tensor> gs{o.d_dst, o.d_src, o.d_val, o.d_edge, o.d_att};
  const at::Tensor* likes[5] = {&orig.dst, &orig.src, &orig.val, &orig.edge, &orig.att};
  std::vector<std::pair<at::Tensor*, int64_t>> cut;
  for (size_t i = 0; i < gs.size(); ++i) {
    const at::Tensor& like = *likes[i];
    if (like.defined() && gs[i].dim() == like.dim() && gs[i].dim() > 0)
      cut.emplace_back(&gs[i], like.size(-1));
  }
  resize_all(cut, [](const at::Tensor& t, int64_t w) { return unfit(t, w); });
  // (folded AGNN: a sixth output, the 0-d fp32 sum_ij dS_ij s_ij of the row pass)
  if (o.score_sum.defined()) gs.push_back(o.score_sum.sum());
  return gs;
}

std::vector<at::Tensor> attention_bwd(DFGNN_BWD_PARAMS) {
  return attention_bwd_impl(DFGNN_BWD_ARGS, false, false, false);
}

// attention_bwd, except that dot attention's q / k / v given as the column
// blocks of one [N, 3 H F] buffer get their gradients as the same blocks of
// one new buffer (views that share it: for the eager path's Function, whose
// caller, the Transformer layer's projection node, then runs its GEMMs on that
// buffer without concatenating; the custom op keeps distinct outputs).
std::vector<at::Tensor> attention_bwd_blocks(DFGNN_BWD_PARAMS) {
  return attention_bwd_impl(DFGNN_BWD_ARGS, false, true, false);
}

// attention_bwd, except that where AGNN's kernels ran (keys given as the values,
// with a key scale) the key and value gradients come back folded: d_src is the
// gradient of the one keys-and-values tensor (c_j dK_j + dV_j) and d_value an
// empty tensor; one pass over [N, H, F] instead of key_scale_grads' three and
// autograd's addition of the two (the eager CUDA path's Function, whose inputs
// k and v are then one tensor; the custom op keeps attention_bwd's outputs).
// Where AGNN's kernels ran, a sixth output: sum_ij dS_ij s_ij over all edges
// and heads (0-d, fp32), from which ops._AGNNPrologue takes beta's gradient.
std::vector<at::Tensor> attention_bwd_folded(DFGNN_BWD_PARAMS) {
  return attention_bwd_impl(DFGNN_BWD_ARGS, true, false, false);
}

// The backward's column-pass mode for the whole process (forced_backward_mode):
// -1 (not forced), 0 (store), 1 (recompute) or 2 (auto).  Returns the previous
// mode, or -2 for any other value, which changes nothing (the Python caller,
// pyg_dfgnn.ops.set_backward_mode, raises the ValueError; an exception thrown
// from this argument-less-dispatch op crashed the process on the H100 build).
int64_t set_backward_mode(int64_t mode) {
  if (mode < -1 || mode > 2) return -2;
  return forced_backward_mode().exchange(static_cast<int>(mode));
}

int64_t get_backward_mode() { return forced_backward_mode().load(); }

// ------------------------------------------------------------------ layer ops
// A whole layer call of GAT, GATv2, the Transformer or AGNN on one node set as
// one op and one autograd node (dfgnn_C::gat_layer / gatv2_layer /
// transformer_layer / agnn_layer; the layers' _layer_op in pyg_dfgnn/nn take
// them on eager CUDA calls): the projections, the fused attention and the
// epilogue forward, and in backward the fused backward and the projections'
// GEMMs -- one call from Python each way instead of about twenty ATen ops,
// Python autograd Functions and the linear layers' nodes (host time:
// docs/KERNELS.md, session 30).  Each backward
// uses the formulas of the layer's path of several ops (autograd's mm / addmm,
// nn/_glue.py), so the two agree bit for bit under
// torch.use_deterministic_algorithms -- except where the Transformer's and
// GATv2's ops take Delta from the output (kFromOutput, heads under 128 bytes:
// their gradients within a few roundings) and GATv2's input gradient, summed
// by the second GEMM in place.  Inputs were validated in Python (the
// checks below guard the kernels only).

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The graph (CSR and transpose), schedule and attention scalars of one call.
struct LayerGraph {
  at::Tensor rowptr, col;
  optional<at::Tensor> perm;
  at::Tensor t_rowptr, t_col, t_perm;
  std::vector<int64_t> sched;
  optional<at::Tensor> work, merge, t_work, t_merge;
  double scale, slope, p;
  int64_t seed;
};

#define DFGNN_LAYER_GRAPH_PARAMS                                                           \
  const at::Tensor &rowptr, const at::Tensor &col, const optional<at::Tensor> &perm,           \
      const at::Tensor &t_rowptr, const at::Tensor &t_col, const at::Tensor &t_perm,           \
      at::IntArrayRef sched, const optional<at::Tensor> &work,                                 \
      const optional<at::Tensor> &merge, const optional<at::Tensor> &t_work,                   \
      const optional<at::Tensor> &t_merge
#define DFGNN_LAYER_GRAPH(scale, slope)                                                     \
  LayerGraph {                                                                              \
    rowptr, col, perm, t_rowptr, t_col, t_perm, sched.vec(), work, merge, t_work, t_merge,   \
        scale, slope, p, layer_seed(seed, p)                                               \
  }

// A layer op's dropout seed: ``seed``, or, where it is negative and dropout
// applies, one draw from torch's default CPU generator: the value
// ``torch.randint(0, 2**62, (1,))`` draws (ops._seed, the path of several
// ops; the same generator state after it), without that tensor and its
// ``.item()`` in Python (host time: docs/KERNELS.md, session 31).
int64_t layer_seed(int64_t seed, double p) {
  if (seed >= 0) return seed;
  if (p <= 0.0) return 0;
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  const uint64_t r = at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
  return (int64_t)(r % (uint64_t{1} << 62));   // (randint's uniform_int_from_to for a 2^62 range)
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_attention_fwd(
    int64_t kind, const LayerGraph& g, const at::Tensor& dst, const at::Tensor& src,
    const optional<at::Tensor>& val, const optional<at::Tensor>& att,
    const at::Tensor& residual = at::Tensor(), int64_t out_width = 0) {
  return attention_fwd_impl(kind, g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm, dst,
                            src, val, c10::nullopt, att, g.scale, g.slope, g.p, g.seed, false,
                            g.sched, g.work, g.merge, g.t_work, g.t_merge, residual, out_width);
}

std::vector<at::Tensor> layer_attention_bwd(int64_t kind, const LayerGraph& g,
                                            const at::Tensor& dst, const at::Tensor& src,
                                            const optional<at::Tensor>& val,
                                            const optional<at::Tensor>& att,
                                            const at::Tensor& out, const at::Tensor& lse,
                                            const at::Tensor& grad_out, bool blocks = false,
                                            bool fold = false, bool inplace = false,
                                            const at::Tensor& delta = {}) {
  return attention_bwd_impl(kind, g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm, dst,
                            src, val, c10::nullopt, att, g.scale, g.slope, g.p, g.seed, out, lse,
                            grad_out, g.sched, g.work, g.merge, g.t_work, g.t_merge, fold,
                            blocks, inplace, delta);
}

// Whether a layer op's backward may overwrite its own saved projections (the
// attention's src / val, attention_bwd_impl's inplace): only where this
// backward frees the graph (no retain_graph / create_graph), so that nothing
// reads them again.  Outside a backward pass (no graph task) it says no.
bool frees_graph() { return !torch::autograd::get_current_graph_task_keep_graph(); }

// The graph as the autograd node keeps it: in its saved data, not as saved
// variables (the graph cache's tensors may have been made under
// torch.inference_mode, and such tensors cannot be saved for backward); an
// absent tensor is an undefined one.
void save_graph(AutogradContext* ctx, const LayerGraph& g) {
  ctx->saved_data["graph"] = std::vector<at::Tensor>{
      g.rowptr, g.col, opt(g.perm), g.t_rowptr, g.t_col, g.t_perm,
      opt(g.work), opt(g.merge), opt(g.t_work), opt(g.t_merge)};
  ctx->saved_data["sched"] = g.sched;
  ctx->saved_data["scalars"] = std::vector<double>{g.scale, g.slope, g.p};
  ctx->saved_data["seed"] = g.seed;
  ctx->set_materialize_grads(false);
}

LayerGraph load_graph(AutogradContext* ctx) {
  const std::vector<at::Tensor> t = ctx->saved_data["graph"].toTensorVector();
  auto o = [&](size_t i) { return t[i].defined() ? optional<at::Tensor>(t[i]) : c10::nullopt; };
  const std::vector<double> sc = ctx->saved_data["scalars"].toDoubleVector();
  return {t[0], t[1], o(2), t[3], t[4], t[5], ctx->saved_data["sched"].toIntVector(),
          o(6), o(7), o(8), o(9), sc[0], sc[1], sc[2], ctx->saved_data["seed"].toInt()};
}

// Which of a Function's forward arguments need a gradient: ``present`` says,
// per argument, whether it was a variable (an absent optional tensor was not),
// and so its index among the node's inputs.
struct InputGrads {
  AutogradContext* ctx;
  std::vector<int64_t> var;
  InputGrads(AutogradContext* c, std::initializer_list<bool> present) : ctx(c) {
    int64_t n = 0;
    for (bool b : present) var.push_back(b ? n++ : -1);
  }
  bool operator()(size_t i) const { return var[i] >= 0 && ctx->needs_input_grad(var[i]); }
};

// n ones of like's dtype and device, for a GEMV column sum: a view of a vector
// kept per (device, dtype, stream) for the process's life (grown to the largest
// n asked, up to kOnesCached), so that a backward's column sums neither
// allocate nor fill one each (two host calls per sum: docs/KERNELS.md, session
// 35).  Per stream, so that no stream reads a vector before the fill queued on
// another; never made while the stream is being captured into a CUDA graph
// (the graph's private pool), where a kept one is read as it is -- so a
// vector is never freed either: one outgrown stays allocated (growth at least
// doubles, so all of them take under twice the largest), since a graph
// captured earlier may read it at every replay.
constexpr int64_t kOnesCached = int64_t(1) << 24;

at::Tensor ones_like_rows(const at::Tensor& like, int64_t n) {
  if (!like.is_cuda() || n > kOnesCached) return at::ones({n}, like.options());
  struct Kept {
    int dev;
    at::ScalarType dt;
    c10::StreamId stream;
    at::Tensor ones;
  };
  // (never destroyed: no CUDA tensor freed after the runtime's teardown at exit)
  static auto* kept = new std::vector<Kept>();
  static auto* outgrown = new std::vector<at::Tensor>();
  static std::mutex mu;
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(like.get_device());
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;   // (of that stream itself)
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream.stream(), &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  std::lock_guard<std::mutex> lock(mu);
  Kept* k = nullptr;
  for (Kept& e : *kept)
    if (e.dev == like.get_device() && e.dt == like.scalar_type() && e.stream == stream.id())
      k = &e;
  if (k != nullptr && k->ones.size(0) >= n) return k->ones.narrow(0, 0, n);
  if (capturing) return at::ones({n}, like.options());
  const int64_t len = std::max<int64_t>(
      {n, int64_t(4096), k == nullptr ? 0 : std::min(2 * k->ones.size(0), kOnesCached)});
  at::Tensor ones = at::ones({len}, like.options());
  if (k == nullptr) {
    kept->push_back({like.get_device(), like.scalar_type(), stream.id(), ones});
  } else {
    outgrown->push_back(k->ones);
    k->ones = ones;
  }
  return ones.narrow(0, 0, n);
}

at::Tensor column_sum(const at::Tensor& g2, bool gemv) {
  return gemv ? at::mv(g2.t(), ones_like_rows(g2, g2.size(0))) : g2.sum(0);
}

// rows chans..width-1 of every head of the [n_heads * width, ...] tensors *ts
// dropped (undefined tensors and null pointers skipped), in one launch
// (resize_all: each seen as [n_heads, width * rest], its first chans * rest
// columns kept) instead of a copy each
void unpad_rows_all(std::initializer_list<at::Tensor*> ts, int64_t n_heads, int64_t chans,
                    int64_t width) {
  if (width == chans) return;
  std::vector<std::pair<at::Tensor*, int64_t>> e;
  std::vector<std::vector<int64_t>> shapes;
  for (at::Tensor* t : ts) {
    if (t == nullptr || !t->defined()) continue;
    const int64_t rest = t->numel() / (n_heads * width);
    std::vector<int64_t> shape = t->sizes().vec();
    shape[0] = n_heads * chans;
    shapes.push_back(shape);
    *t = t->view({n_heads, width * rest});
    e.emplace_back(t, chans * rest);
  }
  resize_all(e, [](const at::Tensor& t, int64_t w) { return unfit(t, w); });
  for (size_t i = 0; i < e.size(); ++i) *e[i].first = e[i].first->view(shapes[i]);
}

// [N, H, C] as the layer's [N, H * C]
at::Tensor flat_heads(const at::Tensor& out) {
  return out.view({out.size(0), out.size(1) * out.size(2)});
}

// A Function's contiguous [N, H, C] output as the layer's [N, H * C]: a tensor
// over the same storage that is not a view.  A Function's output must not be
// a view of a tensor it made, and a view taken after apply() costs a
// ViewBackward0 node per call (its forward and its evaluation in the backward:
// docs/KERNELS.md, session 31).  Where the backward needs the [N, H, C] output
// itself, the Function saves this tensor instead (the same storage, and the
// version counter of the tensor the caller may modify in place) and views it
// back (saved_heads).
at::Tensor flat_alias(const at::Tensor& out) {
  TORCH_INTERNAL_ASSERT(out.dim() == 3 && out.is_contiguous());
  const int64_t n = out.size(0), w = out.size(1) * out.size(2);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(out.storage()),
      c10::DispatchKeySet(c10::computeDispatchKey(out.scalar_type(), out.layout(), out.device())),
      out.dtype());
  const int64_t sizes[2] = {n, w}, strides[2] = {w, 1};
  impl->set_sizes_and_strides(at::IntArrayRef(sizes), at::IntArrayRef(strides),
                              std::optional<int64_t>(out.storage_offset()));
  return at::Tensor(std::move(impl));
}

// a Function's saved flat output [N, H * C] viewed back as [N, H, C]
at::Tensor saved_heads(const at::Tensor& t, int64_t H, int64_t C) {
  return t.view({t.size(0), H, C});
}

// stack_pad_heads over maps whose biases are optional: all of them or none
// (the callers checked; a mix fails stack_pad_heads' count check), the bias an
// empty placeholder where there are none
std::tuple<at::Tensor, at::Tensor> stack_pad_maps(at::TensorList ws,
                                                  std::initializer_list<optional<at::Tensor>> bs,
                                                  int64_t H, int64_t C, int64_t W) {
  std::vector<at::Tensor> b;
  for (const optional<at::Tensor>& t : bs)
    if (t.has_value()) b.push_back(*t);
  return stack_pad_heads(ws, b, H, C, W);
}

// a map's weight (and bias, or an undefined tensor) with each head's rows
// zero-padded from C to W (as they are where W = C)
std::tuple<at::Tensor, at::Tensor> padded_map(const at::Tensor& w, const optional<at::Tensor>& b,
                                              int64_t H, int64_t C, int64_t W) {
  if (W == C) return {w, opt(b)};
  return stack_pad_maps({w}, {b}, H, C, W);
}

// x W^T (+ b) in the padded width, [N, H, W], with its padded weight
std::pair<at::Tensor, at::Tensor> padded_projection(const at::Tensor& x, const at::Tensor& w,
                                                    const optional<at::Tensor>& b, int64_t H,
                                                    int64_t C, int64_t W) {
  at::Tensor wp, bp;
  std::tie(wp, bp) = padded_map(w, b, H, C, W);
  return {affines(x, {wp}, {bp})[0].view({x.size(0), H, W}), wp};
}

// ------------------------------------------------------------------ GAT layer
// GAT (dfgnn_C::gat_layer): h = x W^T [N, H, W] (W = C, or on GPU-bound calls
// whose C the kernels do not take as they are, the kernels' padded width: the
// weight's head rows zero-padded by stack_pad_heads, so the GEMM writes the
// padded layout and the attention pads nothing; nn/_padded.py), the node logits
// (gat_logits, over the first C columns), the fused attention with the bias in
// its epilogue, written [N, H, C]; backward: the fused backward, the logits'
// backward and the projection's two GEMMs (the padded weight's gradient cut
// back to its C rows per head) -- the formulas of nn/gat_conv.py's path of
// several ops (padded_linear's GEMM, autograd's mm formulas).

struct GatLayerOut {
  at::Tensor out, lse, h, wp, a_src, a_dst;
};

GatLayerOut gat_layer_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& att_src,
                              const at::Tensor& att_dst, const optional<at::Tensor>& bias,
                              const LayerGraph& g, int64_t W) {
  const int64_t H = att_src.size(-2), C = att_src.size(-1);
  GatLayerOut r;
  Phases phase;
  phase("dfgnn::gat_layer::projection");
  std::tie(r.h, r.wp) = padded_projection(x, w, c10::nullopt, H, C, W);
  phase("dfgnn::gat_layer::logits");
  std::tie(r.a_src, r.a_dst) = gat_logits(r.h, att_src, att_dst);
  phase.end();
  at::Tensor alpha;
  // (the bias [H * C] or [H, C], viewed [H, C] here, below autograd)
  const optional<at::Tensor> b =
      bias.has_value() ? optional<at::Tensor>(bias->view({H, C})) : c10::nullopt;
  std::tie(r.out, r.lse, alpha) =
      layer_attention_fwd(0, g, r.a_dst, r.a_src, r.h, b, at::Tensor(), C);
  return r;
}

// saved variables: x, the padded weight (w where W = C), att_src, att_dst,
// bias, h [N, H, W], a_src, a_dst, the output [N, H * C] (flat_alias), lse (an
// absent bias: an undefined tensor)
struct GatLayerFn : public torch::autograd::Function<GatLayerFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                               const at::Tensor& att_src, const at::Tensor& att_dst,
                               const optional<at::Tensor>& bias, const LayerGraph* g, int64_t W) {
    GatLayerOut r = gat_layer_forward(x, w, att_src, att_dst, bias, *g, W);
    const at::Tensor out = flat_alias(r.out);
    ctx->save_for_backward({x, r.wp, att_src, att_dst, opt(bias), r.h, r.a_src, r.a_dst, out,
                            r.lse});
    save_graph(ctx, *g);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list r(7);
    if (!grads[0].defined()) return r;
    Phases phase;
    phase("dfgnn::gat_layer_backward::inputs");
    const variable_list s = ctx->get_saved_variables();
    const LayerGraph g = load_graph(ctx);
    const at::Tensor &x = s[0], &wp = s[1], &att_src = s[2], &att_dst = s[3], &h = s[5];
    const int64_t N = h.size(0), H = h.size(1), W = h.size(2), C = att_src.size(-1);
    const InputGrads needs(ctx, {true, true, true, true, s[4].defined()});
    phase.end();
    const optional<at::Tensor> bias =
        s[4].defined() ? optional<at::Tensor>(s[4].view({H, C})) : c10::nullopt;
    std::vector<at::Tensor> gs = layer_attention_bwd(
        0, g, s[7], s[6], h, bias, s[8].view({N, H, C}), s[9],
        grads[0].contiguous().view({N, H, C}));
    // gs: d a_dst, d a_src, d h [N, H, W], (d edge), d bias; the logits' share of
    // d h added in place
    at::Tensor d_h = gs[2];
    at::Tensor d_as, d_ad;
    phase("dfgnn::gat_layer_backward::logits");
    std::tie(d_as, d_ad) = gat_logits_bwd(h, att_src, att_dst, gs[1], gs[0], d_h);
    // the projection's gradients as autograd's mm formulas compute them (for
    // x W^T with a row-major W: d x = d h W, d W = d h^T x), the padded
    // weight's rows cut back to C per head
    phase("dfgnn::gat_layer_backward::projection");
    const at::Tensor d2 = d_h.view({N, H * W});
    if (needs(0)) r[0] = at::mm(d2, wp);
    if (needs(1)) {
      r[1] = at::mm(d2.t(), x);
      unpad_rows_all({&r[1]}, H, C, W);
    }
    if (needs(2)) r[2] = d_as;
    if (needs(3)) r[3] = d_ad;
    if (needs(4)) r[4] = gs[4].view(s[4].sizes());
    return r;
  }
};

#define DFGNN_GAT_LAYER_PARAMS                                                             \
  const at::Tensor &x, const at::Tensor &w, const at::Tensor &att_src,                         \
      const at::Tensor &att_dst, const optional<at::Tensor> &bias, DFGNN_LAYER_GRAPH_PARAMS,   \
      double slope, double p, int64_t seed, int64_t width

// out [N, H * C]
at::Tensor gat_layer_autograd(DFGNN_GAT_LAYER_PARAMS) {
  const LayerGraph g = DFGNN_LAYER_GRAPH(1.0, slope);
  return GatLayerFn::apply(x, w, att_src, att_dst, bias, &g, width)[0];
}

// (no autograd: inference mode)
at::Tensor gat_layer_cuda(DFGNN_GAT_LAYER_PARAMS) {
  return flat_heads(
      gat_layer_forward(x, w, att_src, att_dst, bias, DFGNN_LAYER_GRAPH(1.0, slope), width).out);
}

// How a layer op's backward gets Delta_i = <dO_i, O_i> (kept in its saved
// "dims"): kOutIsAttn, the output is the attention output (read by the row
// pass); kAttnSaved, the attention output is saved besides the output (read by
// the row pass); kFromOutput, from the output less the skip or bias (row_delta,
// before the attention backward).  The attention output is saved besides at
// heads of kWideHeadBytes or more: there the node tensors outweigh the per-edge
// arrays, and the Delta pass (the Transformer's skip GEMM again, three [N, H,
// C] reads) cost 5-7 % of the Transformer's 4 x 64 forward+backward on the
// 100k graphs (H100, docs/KERNELS.md, session 33).  It is saved at every
// width where the caller asks (keep_attn: calls below the GPU-bound size,
// nn/_padded.py, whose memory is small and whose time is the host's): the
// backward then takes no Delta pass (row_delta) and, in the Transformer's, no
// skip GEMM again (docs/KERNELS.md, session 41).
// (kWideHeadBytes: attention_api.h)
enum DeltaSource : int64_t { kFromOutput = 0, kOutIsAttn = 1, kAttnSaved = 2 };

// Whether an attention output of heads of W elements of `elem` bytes is saved
// besides the layer's output (kAttnSaved) rather than recovered from it
bool saves_attn(int64_t W, int64_t elem, bool keep_attn) {
  return keep_attn || W * elem >= kWideHeadBytes;
}

DeltaSource delta_source(const at::Tensor& out, const at::Tensor& attn, bool keep_attn) {
  if (out.is_same(attn)) return kOutIsAttn;
  return saves_attn(attn.size(2), attn.element_size(), keep_attn) ? kAttnSaved : kFromOutput;
}

// ---------------------------------------------------------- Transformer layer
// TransformerConv (dfgnn_C::transformer_layer; concatenated heads, no beta, no
// edge features): q / k / v as the column blocks of one GEMM with the weights
// stacked and each head's rows zero-padded to the kernels' width W
// (stack_pad_heads), the skip projection x W_s^T + b_s (or none: no root
// weight), the fused dot attention and attention[..., :C] + skip.  Backward:
// the fused backward writing d q / k / v as the blocks of one buffer, the
// projections' GEMMs (the padding rows dropped from the weight and bias
// gradients), the bias gradients as column sums (GEMVs where ``gemv``).
// Without autograd the skip is the GEMM's 4th block, added in the attention's
// epilogue where the heads are not padded (nn/transformer_conv.py, nn/_glue.py).

// [N, H * W] block b of a [N, n * H * W] projection output, as [N, H, W]
at::Tensor block(const at::Tensor& y, int64_t b, int64_t H, int64_t W) {
  return y.narrow(1, b * H * W, H * W).view({y.size(0), H, W});
}

// [N, H, C] as the layer's [N, H * C] output (a copy where C is a padded width's
// slice, as the path of several ops' reshape makes)
at::Tensor heads_out(const at::Tensor& out, int64_t C) {
  const at::Tensor o = out.size(2) == C ? out : out.narrow(2, 0, C);
  return o.reshape({o.size(0), o.size(1) * C});
}

// forward without autograd: the skip (a 4th weight in ws, or none) as the
// GEMM's 4th block, added in the kernels' epilogue where the heads are not padded
at::Tensor transformer_layer_nograd(const at::Tensor& x, at::TensorList ws, at::TensorList bs,
                                    const LayerGraph& g, int64_t H, int64_t C, int64_t W) {
  at::Tensor wp, bp;
  std::tie(wp, bp) = stack_pad_heads(ws, bs, H, C, W);
  // (bp: stack_pad_heads' empty placeholder where there are no biases, which
  // affines takes as none)
  const at::Tensor y = affines(x, {wp}, {bp})[0];
  const at::Tensor q = block(y, 0, H, W), k = block(y, 1, H, W), v = block(y, 2, H, W);
  if (ws.size() < 4) return heads_out(std::get<0>(layer_attention_fwd(2, g, q, k, v, {})), C);
  const at::Tensor skip = block(y, 3, H, W).narrow(2, 0, C);
  if (W == C) return heads_out(std::get<0>(layer_attention_fwd(2, g, q, k, v, {}, skip)), C);
  return heads_out(std::get<0>(layer_attention_fwd(2, g, q, k, v, {})).narrow(2, 0, C) + skip,
                   C);
}

// saved variables: x, the stacked padded q / k / v weight, the skip weight and
// bias (or undefined tensors), the projection output y [N, 3 H W], the output
// (flat), lse, the attention output [N, H, W] where it is saved besides
// (kAttnSaved; else undefined).  Its output: [N, H * C] (flat_alias), the
// attention output's first C columns (+ the skip).  At narrow heads on
// GPU-bound calls (no keep_attn) the attention output is not kept where it is
// not the output (a skip, or padded heads: kFromOutput): the backward takes
// Delta_i = <dO_i, O_i> from the output less the skip, recomputed (row_delta),
// one [N, H, W] tensor less from the forward to the attention backward; O's
// padded columns are zero (so are
// v's), and out - skip is O to one rounding of the output's magnitude, as
// GAT's out - bias (attention_launch.cuh).  The row pass re-sweeps a nearly
// saturated row with the exact Delta, so that rounding is not amplified there
// (attention_kernels.cuh, bwd_row_item).
struct TransformerLayerFn : public torch::autograd::Function<TransformerLayerFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& wq,
                               const optional<at::Tensor>& bq, const at::Tensor& wk,
                               const optional<at::Tensor>& bk, const at::Tensor& wv,
                               const optional<at::Tensor>& bv, const optional<at::Tensor>& ws,
                               const optional<at::Tensor>& bs, const LayerGraph* g, int64_t H,
                               int64_t C, int64_t W, bool gemv, bool keep_attn) {
    const int64_t N = x.size(0);
    const bool has_b = bq.has_value();   // (q / k / v: all biases or none)
    at::Tensor wp, bp;
    std::tie(wp, bp) = stack_pad_maps({wq, wk, wv}, {bq, bk, bv}, H, C, W);
    // q / k / v (and the skip, before the attention) from one split of x where
    // the fp32 GEMMs are split (fp32_gemm.cu).  Where the backward recomputes
    // the skip for its Delta (kFromOutput: narrow heads, no keep_attn) the
    // skip is cuBLAS' fp32 GEMM in both, bit for bit the same, and no split of
    // x is made at the backward's peak (one raised the Transformer 8 x 10 fp32
    // peak 12 % on the power-law 100k graph, H200, docs/KERNELS.md, session 45)
    const bool attn_saved = saves_attn(W, x.element_size(), keep_attn);
    std::vector<at::Tensor> maps{wp}, biases{bp};
    if (ws.has_value() && attn_saved) {
      maps.push_back(*ws);
      biases.push_back(opt(bs));
    }
    const std::vector<at::Tensor> ys = affines(x, maps, biases);
    const at::Tensor& y = ys[0];
    at::Tensor attn, lse, alpha;
    std::tie(attn, lse, alpha) =
        layer_attention_fwd(2, *g, block(y, 0, H, W), block(y, 1, H, W), block(y, 2, H, W), {});
    // [N, H, C]: the attention's first C columns (+ the skip)
    at::Tensor out = W == C ? attn : attn.narrow(2, 0, C);
    if (ws.has_value()) {
      const at::Tensor skip = ys.size() > 1 ? ys[1] : affines(x, {*ws}, {opt(bs)}, false)[0];
      out = out + skip.view({N, H, C});
    } else if (W != C) {
      out = out.contiguous();
    }
    const at::Tensor flat = flat_alias(out);
    const DeltaSource ds = delta_source(out, attn, keep_attn);
    ctx->save_for_backward(
        {x, wp, opt(ws), opt(bs), y, flat, lse, ds == kAttnSaved ? attn : at::Tensor()});
    save_graph(ctx, *g);
    ctx->saved_data["dims"] = std::vector<int64_t>{H, C, W, gemv, has_b, ws.has_value(),
                                                   bs.has_value(), ds};
    return {flat};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list r(15);
    if (!grads[0].defined()) return r;
    Phases phase;
    phase("dfgnn::transformer_layer_backward::inputs");
    const variable_list s = ctx->get_saved_variables();
    // (ws, bs: or undefined)
    const at::Tensor &x = s[0], &wp = s[1], &ws = s[2], &bs = s[3], &y = s[4], &out = s[5];
    const std::vector<int64_t> d = ctx->saved_data["dims"].toIntVector();
    const int64_t H = d[0], C = d[1], W = d[2], N = x.size(0);
    const bool gemv = d[3] != 0, has_b = d[4] != 0, has_ws = d[5] != 0, has_bs = d[6] != 0;
    const int64_t ds = d[7];   // (DeltaSource)
    // (arguments x, wq, bq, wk, bk, wv, bv, ws, bs)
    const InputGrads needs(ctx, {true, true, has_b, true, has_b, true, has_b, has_ws, has_bs});
    // (the output's gradient: the skip's, and the attention output's first C columns')
    const at::Tensor g2 = grads[0].reshape({N, H * C}).contiguous();
    at::Tensor g3 = g2.view({N, H, C});
    if (W != C) fit_all({&g3}, W);   // (one launch: constant_pad_nd takes a fill and a copy)
    const LayerGraph g = load_graph(ctx);
    // Delta from the output (less the skip, recomputed) where it is not the
    // attention output
    at::Tensor delta;
    if (ds == kFromOutput) {
      phase("dfgnn::transformer_layer_backward::delta");
      at::Tensor skip;
      if (has_ws)   // (cuBLAS' fp32 GEMM, as the forward computed it here)
        skip = affines(x, {ws}, {bs}, false)[0].view({N, H, C});
      delta = row_delta(g3, saved_heads(out, H, C), skip);
    }
    phase.end();
    // (where this backward frees the graph, d k / v are written over y's k / v
    // blocks and d q copied over its q block after: y becomes d y, and the
    // peak holds one [N, H W] gradient buffer instead of three)
    std::vector<at::Tensor> gs = layer_attention_bwd(
        2, g, block(y, 0, H, W), block(y, 1, H, W), block(y, 2, H, W), {},
        ds == kOutIsAttn ? saved_heads(out, H, W) : s[7], s[6], g3,
        /*blocks=*/true, /*fold=*/false, /*inplace=*/frees_graph(), delta);
    g3 = at::Tensor();   // (a padded copy: not needed past the attention backward)
    // d q / k / v: the column blocks of one buffer [N, 3 H W] (qkv_blocks, or y
    // itself), else joined
    const int64_t w = H * W;
    const at::Tensor &dk = gs[1], &dv = gs[2];
    if (N > 0 && dk.data_ptr() == y.narrow(1, w, w).data_ptr()) {
      y.narrow(1, 0, w).view({N, H, W}).copy_(gs[0]);
      gs[0] = block(y, 0, H, W);
    }
    const at::Tensor& dq = gs[0];
    const int64_t es = (int64_t)dq.element_size();
    const bool one = N > 0 && dq.stride(0) == 3 * w && dk.stride(0) == 3 * w &&
                     dv.stride(0) == 3 * w &&
                     (char*)dk.data_ptr() == (char*)dq.data_ptr() + w * es &&
                     (char*)dv.data_ptr() == (char*)dq.data_ptr() + 2 * w * es;
    phase("dfgnn::transformer_layer_backward::projections");
    const at::Tensor dy = one ? dq.as_strided({N, 3 * w}, {3 * w, 1})
                              : at::cat({dq.reshape({N, w}), dk.reshape({N, w}),
                                         dv.reshape({N, w})}, 1);
    if (needs(0)) r[0] = has_ws ? at::mm(dy, wp).addmm_(g2, ws) : at::mm(dy, wp);
    at::Tensor dw, db;   // (padded rows dropped from both in one launch)
    if (needs(1) || needs(3) || needs(5)) dw = at::mm(dy.t(), x);
    if (needs(2) || needs(4) || needs(6)) db = column_sum(dy, gemv);
    unpad_rows_all({&dw, &db}, 3 * H, C, W);
    for (int i = 0; i < 3; ++i) {
      if (needs(1 + 2 * i)) r[1 + 2 * i] = dw.narrow(0, i * H * C, H * C);
      if (needs(2 + 2 * i)) r[2 + 2 * i] = db.narrow(0, i * H * C, H * C);
    }
    if (needs(7)) r[7] = at::mm(g2.t(), x);
    if (needs(8)) r[8] = column_sum(g2, gemv);
    return r;
  }
};

#define DFGNN_TRANSFORMER_LAYER_PARAMS                                                     \
  const at::Tensor &x, const at::Tensor &wq, const optional<at::Tensor> &bq,                  \
      const at::Tensor &wk, const optional<at::Tensor> &bk, const at::Tensor &wv,              \
      const optional<at::Tensor> &bv, const optional<at::Tensor> &ws,                          \
      const optional<at::Tensor> &bs, DFGNN_LAYER_GRAPH_PARAMS, double scale, double p,        \
      int64_t seed, int64_t heads, int64_t chans, int64_t width, bool gemv, bool keep_attn

at::Tensor transformer_layer_nograd_call(DFGNN_TRANSFORMER_LAYER_PARAMS) {
  const LayerGraph g = DFGNN_LAYER_GRAPH(scale, 0.0);
  std::vector<at::Tensor> w{wq, wk, wv};
  if (ws.has_value()) w.push_back(*ws);
  if (!bq.has_value() && !bs.has_value())
    return transformer_layer_nograd(x, w, {}, g, heads, chans, width);
  // (biases on some maps only: zeros for the others; the path of several ops
  // then keeps the skip's own GEMM, which computes the same)
  auto b = [&](const optional<at::Tensor>& t) {
    return t.has_value() ? *t : at::zeros_like(wq.select(1, 0));
  };
  std::vector<at::Tensor> bl{b(bq), b(bk), b(bv)};
  if (ws.has_value()) bl.push_back(b(bs));
  return transformer_layer_nograd(x, w, bl, g, heads, chans, width);
}

bool requires_grad(std::initializer_list<const at::Tensor*> ts,
                   std::initializer_list<const optional<at::Tensor>*> os) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts)
    if (t->requires_grad()) return true;
  for (const optional<at::Tensor>* t : os)
    if (t->has_value() && (*t)->requires_grad()) return true;
  return false;
}

// out [N, H * C]
at::Tensor transformer_layer_autograd(DFGNN_TRANSFORMER_LAYER_PARAMS) {
  if (!requires_grad({&x, &wq, &wk, &wv}, {&bq, &bk, &bv, &ws, &bs}))
    return transformer_layer_nograd_call(x, wq, bq, wk, bk, wv, bv, ws, bs, rowptr, col, perm,
                                         t_rowptr, t_col, t_perm, sched, work, merge, t_work,
                                         t_merge, scale, p, seed, heads, chans, width, gemv,
                                         keep_attn);
  const LayerGraph g = DFGNN_LAYER_GRAPH(scale, 0.0);
  return TransformerLayerFn::apply(x, wq, bq, wk, bk, wv, bv, ws, bs, &g, heads, chans, width,
                                   gemv, keep_attn)[0];
}

// -------------------------------------------------------------- GATv2 layer
// GATv2Conv (dfgnn_C::gatv2_layer; concatenated heads, no residual, no edge
// features): x_l = x W_l^T + b_l and x_r = x W_r^T + b_r (or x_r = x_l: shared
// weights), each head's rows zero-padded to the kernels' width W where it
// differs from C (stack_pad_heads), the fused GATv2 attention with att padded
// alike, out = attention[..., :C] + bias.  Backward: the fused backward, the
// projections' GEMMs with the padding rows dropped, the bias gradients as
// column sums (GEMVs where ``gemv_proj`` / ``gemv_bias``) -- the formulas of
// nn/gatv2_conv.py's path (autograd's addmm, _glue's _PaddedParams, add_bias).

struct Gatv2Fwd {
  at::Tensor xl, xr, wlp, wrp, attp, out, lse;
};

Gatv2Fwd gatv2_forward(const at::Tensor& x, const at::Tensor& wl, const optional<at::Tensor>& bl,
                       const optional<at::Tensor>& wr, const optional<at::Tensor>& br,
                       const at::Tensor& att, const LayerGraph& g, int64_t H, int64_t C,
                       int64_t W, bool may_split) {
  Gatv2Fwd f;
  // (may_split: affines' (fp32_gemm.cu), true only where no gradient is
  // recorded (gatv2_layer_nograd).  Where one is, GATv2's projections keep
  // cuBLAS' fp32 GEMM in every fp32 GEMM mode: its gradients jump where z_ij =
  // x_l,j + x_r,i crosses 0 (LeakyReLU'), and the split GEMM's larger rounding
  // moved more edges across it: the layer bench's 4 x 64 fp32 gradient error
  // 3.5e-3 against PyG's own 1.5e-3, H200, docs/KERNELS.md, session 45.  The
  // output itself is continuous in x_l and x_r: the split's rounding moves it
  // by as little as the Transformer's and GAT's, session 46)
  // The maps in the kernels' width W: where both are padded (and both or
  // neither have a bias), in one launch, each map its own rows (the values of
  // padded_map's, one launch fewer; the second map's rows 16-byte aligned, as
  // cuBLAS sees a weight of its own); else each by padded_map.  One affines()
  // call: split, x is split once for both.
  std::vector<at::Tensor> ws, bs;
  if (wr.has_value() && W != C && bl.has_value() == br.has_value() &&
      (H * W * wl.size(1) * (int64_t)wl.element_size()) % 16 == 0) {
    at::Tensor wp, bp;
    std::tie(wp, bp) = stack_pad_maps({wl, *wr}, {bl, br}, H, C, W);
    const int64_t w = H * W;
    for (int64_t i = 0; i < 2; ++i) {
      ws.push_back(wp.narrow(0, i * w, w));
      bs.push_back(bl.has_value() ? bp.narrow(0, i * w, w) : at::Tensor());
    }
  } else {
    auto add = [&](const at::Tensor& w, const optional<at::Tensor>& b) {
      at::Tensor wp, bp;
      std::tie(wp, bp) = padded_map(w, b, H, C, W);
      ws.push_back(wp);
      bs.push_back(bp);
    };
    add(wl, bl);
    if (wr.has_value()) add(*wr, br);
  }
  const std::vector<at::Tensor> ys = affines(x, ws, bs, may_split);
  const int64_t N = x.size(0);
  f.xl = ys[0].view({N, H, W});
  f.wlp = ws[0];
  if (wr.has_value()) {
    f.xr = ys[1].view({N, H, W});
    f.wrp = ws[1];
  } else {
    f.xr = f.xl;
  }
  const at::Tensor a = att.dim() == 3 ? att.select(0, 0) : att;   // (PyG's [1, H, C])
  f.attp = a;
  if (W != C) fit_all({&f.attp}, W);   // (one launch)
  at::Tensor alpha;
  std::tie(f.out, f.lse, alpha) = layer_attention_fwd(1, g, f.xr, f.xl, {}, f.attp);
  return f;
}

// [N, H, W] attention output as the layer's [N, H, C] (+ bias [H * C]): a new
// tensor, or the output itself (unpadded, no bias)
at::Tensor gatv2_epilogue(const at::Tensor& out, const optional<at::Tensor>& bias, int64_t C) {
  const int64_t H = out.size(1);
  const at::Tensor o = out.size(2) == C ? out : out.narrow(2, 0, C);
  if (bias.has_value()) return o + bias->view({H, C});
  return o.contiguous();
}

// saved variables: x, the padded weights (W_r: or undefined, shared), x_l, x_r
// (undefined when shared), att padded, the output (flat), lse, the bias (or
// undefined), the attention output where it is saved besides (kAttnSaved;
// else undefined).  Its output: [N, H * C] (gatv2_epilogue's [N, H, C] as
// flat_alias).  At narrow heads, where the output is not the attention output
// (a bias, or padded heads: kFromOutput) and the call is GPU-bound (no
// keep_attn), the backward takes Delta from the output less the bias
// (row_delta), as the Transformer's (above) and GAT's (attention_launch.cuh).
struct Gatv2LayerFn : public torch::autograd::Function<Gatv2LayerFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& wl,
                               const optional<at::Tensor>& bl, const optional<at::Tensor>& wr,
                               const optional<at::Tensor>& br, const at::Tensor& att,
                               const optional<at::Tensor>& bias, const LayerGraph* g, int64_t H,
                               int64_t C, int64_t W, bool gemv_proj, bool gemv_bias,
                               bool keep_attn) {
    Gatv2Fwd f = gatv2_forward(x, wl, bl, wr, br, att, *g, H, C, W, false);
    const at::Tensor out = gatv2_epilogue(f.out, bias, C);
    const at::Tensor flat = flat_alias(out);
    const DeltaSource ds = delta_source(out, f.out, keep_attn);
    ctx->save_for_backward({x, f.wlp, f.wrp, f.xl, wr.has_value() ? f.xr : at::Tensor(),
                            f.attp, flat, f.lse, opt(bias),
                            ds == kAttnSaved ? f.out : at::Tensor()});
    save_graph(ctx, *g);
    ctx->saved_data["dims"] = std::vector<int64_t>{
        H, C, W, gemv_proj, gemv_bias, bl.has_value(), wr.has_value(), br.has_value(),
        bias.has_value(), att.dim(), ds};
    return {flat};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list r(14);
    if (!grads[0].defined()) return r;
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &wlp = s[1], &wrp = s[2], &xl = s[3];
    const std::vector<int64_t> d = ctx->saved_data["dims"].toIntVector();
    const int64_t H = d[0], C = d[1], W = d[2], N = x.size(0);
    const bool gemv_proj = d[3], gemv_bias = d[4], has_wr = d[6];
    const at::Tensor xr = has_wr ? s[4] : xl;
    // (arguments x, wl, bl, wr, br, att, bias)
    const InputGrads needs(ctx, {true, true, d[5] != 0, has_wr, d[7] != 0, true, d[8] != 0});
    const at::Tensor g2 = grads[0].reshape({N, H * C}).contiguous();
    // the bias gradient as the several-op path sums it: over [N, H * C] rows
    // (unpadded heads, or the GEMV), over the first dimension of [N, H, C] (padded)
    if (needs(6)) {
      if (gemv_bias) r[6] = column_sum(g2, true);
      else if (W == C) r[6] = g2.sum(0);
      else r[6] = g2.view({N, H, C}).sum(0).view({H * C});
    }
    at::Tensor g3 = g2.view({N, H, C});
    if (W != C) fit_all({&g3}, W);   // (one launch: constant_pad_nd takes a fill and a copy)
    at::Tensor delta;
    if (d[10] == kFromOutput) {
      const at::Tensor b = d[8] ? s[8].view({1, H, C}).expand({N, H, C}) : at::Tensor();
      delta = row_delta(g3, saved_heads(s[6], H, C), b);
    }
    // (with its own x_r, where this backward frees the graph: d x_l written over x_l)
    std::vector<at::Tensor> gs = layer_attention_bwd(
        1, load_graph(ctx), xr, xl, {}, s[5], d[10] == kOutIsAttn ? saved_heads(s[6], H, W) : s[9],
        s[7], g3, false, false, has_wr && frees_graph(), delta);
    // gs: d x_r, d x_l, (value), (edge), d att [H, W]
    if (needs(5)) {
      const at::Tensor da = W == C ? gs[4] : gs[4].narrow(1, 0, C);
      r[5] = d[9] == 3 ? da.unsqueeze(0) : da;
    }
    g3 = at::Tensor();   // (a padded copy: not needed past the attention backward)
    const at::Tensor dl = has_wr ? gs[1] : gs[1] + gs[0];   // (shared: x_r is x_l)
    // the input's gradient summed in place by the second GEMM (no [N, in]
    // temporaries besides it)
    at::Tensor dx;
    auto proj = [&](const at::Tensor& dp, const at::Tensor& wp, int iw, int ib) {
      const at::Tensor d2 = dp.view({N, H * W});
      if (needs(iw)) r[iw] = at::mm(d2.t(), x);
      if (needs(ib)) r[ib] = column_sum(d2, gemv_proj);
      if (needs(0)) dx = dx.defined() ? dx.addmm_(d2, wp) : at::mm(d2, wp);
    };
    proj(dl, wlp, 1, 2);
    if (has_wr) proj(gs[0], wrp, 3, 4);
    unpad_rows_all({&r[1], &r[2], &r[3], &r[4]}, H, C, W);   // (one launch)
    r[0] = dx;
    return r;
  }
};

#define DFGNN_GATV2_LAYER_PARAMS                                                           \
  const at::Tensor &x, const at::Tensor &wl, const optional<at::Tensor> &bl,                  \
      const optional<at::Tensor> &wr, const optional<at::Tensor> &br, const at::Tensor &att,   \
      const optional<at::Tensor> &bias, DFGNN_LAYER_GRAPH_PARAMS, double slope, double p,      \
      int64_t seed, int64_t heads, int64_t chans, int64_t width, bool gemv_proj,               \
      bool gemv_bias, bool keep_attn

at::Tensor gatv2_layer_nograd(DFGNN_GATV2_LAYER_PARAMS) {
  const LayerGraph g = DFGNN_LAYER_GRAPH(1.0, slope);
  return flat_heads(
      gatv2_epilogue(gatv2_forward(x, wl, bl, wr, br, att, g, heads, chans, width, true).out,
                     bias, chans));
}

// out [N, H * C]
at::Tensor gatv2_layer_autograd(DFGNN_GATV2_LAYER_PARAMS) {
  if (!requires_grad({&x, &wl, &att}, {&bl, &wr, &br, &bias}))
    return gatv2_layer_nograd(x, wl, bl, wr, br, att, bias, rowptr, col, perm, t_rowptr, t_col,
                              t_perm, sched, work, merge, t_work, t_merge, slope, p, seed, heads,
                              chans, width, gemv_proj, gemv_bias, keep_attn);
  const LayerGraph g = DFGNN_LAYER_GRAPH(1.0, slope);
  return Gatv2LayerFn::apply(x, wl, bl, wr, br, att, bias, &g, heads, chans, width, gemv_proj,
                             gemv_bias, keep_attn)[0];
}

// --------------------------------------------------------------- AGNN layer
// AGNNConv (dfgnn_C::agnn_layer; one head, keys = values = x): the prologue
// kernel (q = beta c_i x_i, c = 1 / max(|x|, eps), |x|), the dot attention with
// the key scale c, gathering one row of x per edge; backward: the folded
// attention backward (one gradient for keys and values, the row pass's fp32
// score sum) and the prologue's backward kernel; beta's gradient is the score
// sum over beta, or the prologue's sum where beta is 0 -- what ops.agnn_attention's
// two autograd Functions (_AGNNPrologue, EagerAttention) compute.

struct AgnnFwd {
  at::Tensor q, c, n, out, lse;
};

// the prologue (q = beta c_i x_i, c = 1 / max(|x|, eps), |x|) and the dot
// attention with keys = values = x and the key scale c: out [N, 1, F]
AgnnFwd agnn_forward(const at::Tensor& x, const at::Tensor& beta, const LayerGraph& g,
                     double eps) {
  AgnnFwd f;
  std::tie(f.q, f.c, f.n) = agnn_prologue(x, beta, x.size(0), eps);
  const at::Tensor x3 = x.unsqueeze(1);
  at::Tensor alpha;
  std::tie(f.out, f.lse, alpha) = layer_attention_fwd(2, g, f.q, x3, x3, f.c);
  return f;
}

// saved variables: x, beta, c, |x|, q, the output [N, F] (flat_alias), lse
struct AgnnLayerFn : public torch::autograd::Function<AgnnLayerFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& beta,
                               const LayerGraph* g, double eps) {
    const AgnnFwd f = agnn_forward(x, beta, *g, eps);
    const at::Tensor flat = flat_alias(f.out);
    ctx->save_for_backward({x, beta, f.c, f.n, f.q, flat, f.lse});
    save_graph(ctx, *g);
    ctx->saved_data["eps"] = eps;
    return {flat};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list r(4);
    if (!grads[0].defined()) return r;
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &beta = s[1], &c = s[2], &n = s[3], &q = s[4];
    const at::Tensor x3 = x.unsqueeze(1);
    std::vector<at::Tensor> gs =
        layer_attention_bwd(2, load_graph(ctx), q, x3, x3, c, s[5].unsqueeze(1), s[6],
                            grads[0].contiguous().unsqueeze(1), /*blocks=*/false, /*fold=*/true);
    // gs: d q [N, 1, F], d keys-and-values [N, 1, F], (value), (edge), d c, score sum
    at::Tensor dx, cs;
    std::tie(dx, cs) = agnn_prologue_bwd(x, gs[0].reshape({x.size(0), x.size(1)}), gs[4],
                                         gs[1].reshape({x.size(0), x.size(1)}), c, n, beta,
                                         ctx->saved_data["eps"].toDouble());
    if (ctx->needs_input_grad(0)) r[0] = dx;
    if (ctx->needs_input_grad(1)) {
      // (in fp32, two 0-d tensors, as _AGNNPrologue._dbeta divides: the fp32 sum
      // promotes beta inside the division's kernel, no conversion of its own; a
      // [1] beta would make the quotient beta's dtype by type promotion)
      const at::Tensor from_dq = cs.sum(), b0 = beta.reshape({});
      const at::Tensor d = gs.size() > 5 ? at::where(b0 != 0, gs[5] / b0, from_dq) : from_dq;
      r[1] = d.to(beta.scalar_type()).view(beta.sizes());
    }
    return r;
  }
};

#define DFGNN_AGNN_LAYER_PARAMS \
  const at::Tensor &x, const at::Tensor &beta, DFGNN_LAYER_GRAPH_PARAMS, double eps

// out [N, F]
at::Tensor agnn_layer_autograd(DFGNN_AGNN_LAYER_PARAMS) {
  const double p = 0.0;
  const int64_t seed = 0;
  const LayerGraph g = DFGNN_LAYER_GRAPH(1.0, 0.2);
  if (!requires_grad({&x, &beta}, {})) return agnn_forward(x, beta, g, eps).out.squeeze(1);
  return AgnnLayerFn::apply(x, beta, &g, eps)[0];
}

}  // namespace
}  // namespace dfgnn

TORCH_LIBRARY(dfgnn_C, m) {
  m.def(DFGNN_ATTENTION_FWD_SCHEMA);
  m.def(DFGNN_ATTENTION_FWD_RESIDUAL_SCHEMA);
  m.def(DFGNN_ATTENTION_BWD_SCHEMA);
  m.def(DFGNN_ATTENTION_BWD_FOLDED_SCHEMA);
  m.def(DFGNN_ATTENTION_BWD_BLOCKS_SCHEMA);
  m.def("gat_logits(Tensor x, Tensor att_src, Tensor att_dst) -> (Tensor, Tensor)");
  m.def("gat_logits_bwd(Tensor x, Tensor att_src, Tensor att_dst, Tensor d_src, "
        "Tensor d_dst, Tensor(a!) d_x) -> (Tensor, Tensor)");
  m.def("agnn_prologue(Tensor x, Tensor beta, int num_dst, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("agnn_prologue_bwd(Tensor x, Tensor? dq, Tensor? dc, Tensor? dk, Tensor c, Tensor n, "
        "Tensor beta, float eps) -> (Tensor, Tensor)");
  m.def("stack_pad_heads(Tensor[] ws, Tensor[] bs, int heads, int chans, int width) "
        "-> (Tensor, Tensor)");
  m.def("gat_layer(Tensor x, Tensor weight, Tensor att_src, Tensor att_dst, Tensor? bias, "
        "Tensor rowptr, Tensor col, Tensor? perm, Tensor t_rowptr, Tensor t_col, "
        "Tensor t_perm, int[] sched, Tensor? work, Tensor? merge, Tensor? t_work, "
        "Tensor? t_merge, float negative_slope, float dropout_p, int seed, int width) -> Tensor");
  m.def("transformer_layer(Tensor x, Tensor wq, Tensor? bq, Tensor wk, Tensor? bk, Tensor wv, "
        "Tensor? bv, Tensor? ws, Tensor? bs, Tensor rowptr, Tensor col, Tensor? perm, "
        "Tensor t_rowptr, Tensor t_col, Tensor t_perm, int[] sched, Tensor? work, "
        "Tensor? merge, Tensor? t_work, Tensor? t_merge, float scale, float dropout_p, "
        "int seed, int heads, int chans, int width, bool gemv, bool keep_attn=False) -> Tensor");
  m.def("gatv2_layer(Tensor x, Tensor wl, Tensor? bl, Tensor? wr, Tensor? br, Tensor att, "
        "Tensor? bias, Tensor rowptr, Tensor col, Tensor? perm, Tensor t_rowptr, "
        "Tensor t_col, Tensor t_perm, int[] sched, Tensor? work, Tensor? merge, "
        "Tensor? t_work, Tensor? t_merge, float negative_slope, float dropout_p, int seed, "
        "int heads, int chans, int width, bool gemv_proj, bool gemv_bias, "
        "bool keep_attn=False) -> Tensor");
  m.def("agnn_layer(Tensor x, Tensor beta, Tensor rowptr, Tensor col, Tensor? perm, "
        "Tensor t_rowptr, Tensor t_col, Tensor t_perm, int[] sched, Tensor? work, "
        "Tensor? merge, Tensor? t_work, Tensor? t_merge, float eps) -> Tensor");
  m.def("set_backward_mode(int mode) -> int", &dfgnn::set_backward_mode);
  m.def("get_backward_mode() -> int", &dfgnn::get_backward_mode);
  m.def("set_fp32_gemm_mode(int mode) -> int", &dfgnn::set_fp32_gemm_mode);
  m.def("linears(Tensor x, Tensor[] ws, Tensor?[] bs) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(dfgnn_C, CUDA, m) {
  m.impl("attention_fwd", &dfgnn::attention_fwd);
  m.impl("attention_fwd_residual", &dfgnn::attention_fwd_residual);
  m.impl("attention_bwd", &dfgnn::attention_bwd);
  m.impl("attention_bwd_folded", &dfgnn::attention_bwd_folded);
  m.impl("attention_bwd_blocks", &dfgnn::attention_bwd_blocks);
  m.impl("gat_logits", &dfgnn::gat_logits);
  m.impl("gat_logits_bwd", &dfgnn::gat_logits_bwd);
  m.impl("agnn_prologue", &dfgnn::agnn_prologue);
  m.impl("agnn_prologue_bwd", &dfgnn::agnn_prologue_bwd);
  m.impl("stack_pad_heads", &dfgnn::stack_pad_heads);
  m.impl("linears", &dfgnn::linears);
  m.impl("gat_layer", &dfgnn::gat_layer_cuda);
  m.impl("transformer_layer", &dfgnn::transformer_layer_nograd_call);
  m.impl("gatv2_layer", &dfgnn::gatv2_layer_nograd);
  m.impl("agnn_layer", &dfgnn::agnn_layer_autograd);
}

TORCH_LIBRARY_IMPL(dfgnn_C, Autograd, m) {
  m.impl("gat_layer", &dfgnn::gat_layer_autograd);
  m.impl("transformer_layer", &dfgnn::transformer_layer_autograd);
  m.impl("gatv2_layer", &dfgnn::gatv2_layer_autograd);
  m.impl("agnn_layer", &dfgnn::agnn_layer_autograd);
}
