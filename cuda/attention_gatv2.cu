// GATV2 score function instantiation of the fused attention kernel family.
#include "attention_launch.cuh"

namespace dfgnn {
DFGNN_INSTANTIATE_FWD(GATV2, gatv2)   // (the backward: attention_gatv2_bwd.cu)
}  // namespace dfgnn
