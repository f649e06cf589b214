// AGNN score function: the backward's instantiation of the fused attention
// kernel family (the forward's: attention_agnn.cu).
#include "attention_launch.cuh"

namespace dfgnn {
DFGNN_INSTANTIATE_BWD(AGNN, agnn)
}  // namespace dfgnn
