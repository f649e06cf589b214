// AGNN score function instantiation of the fused attention kernel family: dot
// attention whose keys are the values, scaled per source (one gather per edge).
#include "attention_launch.cuh"

namespace dfgnn {
DFGNN_INSTANTIATE(AGNN, agnn)
}  // namespace dfgnn
