// GAT score function instantiation of the fused attention kernel family.
#include "attention_launch.cuh"

namespace dfgnn {
DFGNN_INSTANTIATE_FWD(GAT, gat)   // (the backward: attention_gat_bwd.cu)
}  // namespace dfgnn
