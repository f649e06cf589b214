// GAT score function instantiation of the fused attention kernel family.
#include "attention_launch.cuh"

namespace dfgnn {
DFGNN_INSTANTIATE(GAT, gat)
}  // namespace dfgnn
