// GATv2 score function: the backward's instantiation of the fused attention
// kernel family (the forward's: attention_gatv2.cu).
#include "attention_launch.cuh"

namespace dfgnn {
DFGNN_INSTANTIATE_BWD(GATV2, gatv2)
}  // namespace dfgnn
