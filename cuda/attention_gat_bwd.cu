// GAT score function: the backward's instantiation of the fused attention
// kernel family (the forward's: attention_gat.cu).
#include "attention_launch.cuh"

namespace dfgnn {
DFGNN_INSTANTIATE_BWD(GAT, gat)
}  // namespace dfgnn
