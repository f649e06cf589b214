// DOT score function instantiation of the fused attention kernel family.
#include "attention_launch.cuh"

namespace dfgnn {
DFGNN_INSTANTIATE(DOT, dot)
}  // namespace dfgnn
