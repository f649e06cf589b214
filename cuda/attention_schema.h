// Schemas of the fused attention ops, shared by the CUDA registration
// (cuda/dfgnn_ops.cpp, library dfgnn_C) and the CPU one (cpu/attention_cpu.cpp,
// library dfgnn_cpu).  The public ops dfgnn::attention_fwd / attention_bwd
// (pyg_dfgnn/ops/fused.py) call them with these arguments.
#pragma once

#define DFGNN_ATTENTION_FWD_SCHEMA                                                            \
  "attention_fwd(int kind, Tensor rowptr, Tensor col, Tensor? perm, Tensor t_rowptr, "       \
  "Tensor t_col, Tensor t_perm, Tensor dst, Tensor src, Tensor? value, Tensor? edge, "       \
  "Tensor? att, float scale, float negative_slope, float dropout_p, int seed, "              \
  "bool need_alpha, int[] sched, Tensor? work, Tensor? merge, Tensor? t_work, "              \
  "Tensor? t_merge) -> (Tensor, Tensor, Tensor)"

// (dfgnn_C::attention_fwd_residual, CUDA only: attention_fwd's arguments and
// dot attention's residual rows, added in the epilogue; cuda/dfgnn_ops.cpp)
#define DFGNN_ATTENTION_FWD_RESIDUAL_SCHEMA                                                   \
  "attention_fwd_residual(int kind, Tensor rowptr, Tensor col, Tensor? perm, "               \
  "Tensor t_rowptr, Tensor t_col, Tensor t_perm, Tensor dst, Tensor src, Tensor? value, "    \
  "Tensor? edge, Tensor? att, float scale, float negative_slope, float dropout_p, int seed, "\
  "bool need_alpha, int[] sched, Tensor? work, Tensor? merge, Tensor? t_work, "              \
  "Tensor? t_merge, Tensor residual) -> (Tensor, Tensor, Tensor)"

// (dfgnn_C::attention_bwd_folded, CUDA only, takes the same arguments: AGNN's
// key and value gradients folded into one, see cuda/dfgnn_ops.cpp)
#define DFGNN_ATTENTION_BWD_SCHEMA "attention_bwd" DFGNN_ATTENTION_BWD_ARGS
#define DFGNN_ATTENTION_BWD_FOLDED_SCHEMA "attention_bwd_folded" DFGNN_ATTENTION_BWD_ARGS
// (dfgnn_C::attention_bwd_blocks, CUDA only, the same arguments: q / k / v given
// as the column blocks of one buffer get gradients laid out alike)
#define DFGNN_ATTENTION_BWD_BLOCKS_SCHEMA "attention_bwd_blocks" DFGNN_ATTENTION_BWD_ARGS
#define DFGNN_ATTENTION_BWD_ARGS                                                              \
  "(int kind, Tensor rowptr, Tensor col, Tensor? perm, Tensor t_rowptr, "                    \
  "Tensor t_col, Tensor t_perm, Tensor dst, Tensor src, Tensor? value, Tensor? edge, "       \
  "Tensor? att, float scale, float negative_slope, float dropout_p, int seed, "              \
  "Tensor out, Tensor lse, Tensor grad_out, int[] sched, Tensor? work, Tensor? merge, "      \
  "Tensor? t_work, Tensor? t_merge) -> Tensor[]"
