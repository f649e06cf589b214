// DOT score function: the backward's instantiation of the fused attention
// kernel family (the forward's: attention_dot.cu).
#include "attention_launch.cuh"

namespace dfgnn {
DFGNN_INSTANTIATE_BWD(DOT, dot)
}  // namespace dfgnn
