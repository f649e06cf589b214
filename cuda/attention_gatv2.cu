// GATV2 score function instantiation of the fused attention kernel family.
#include "attention_launch.cuh"

namespace dfgnn {
DFGNN_INSTANTIATE(GATV2, gatv2)
}  // namespace dfgnn
