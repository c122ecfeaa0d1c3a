// The tensor-core prefill attention kernel (prefill_mma.cu), which
// LaunchPrefillAttention uses where it applies. Internal to the kernels.
#ifndef TANDEM_COMMON_COMPUTE_CUDA_PREFILL_MMA_H_
#define TANDEM_COMMON_COMPUTE_CUDA_PREFILL_MMA_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "common/kvcache/kv_layout.h"

namespace tandem::cuda {

// A bf16 or f16 cache with head_dim 64 or 128, blocks of a multiple of 8
// slots, a 16-byte aligned cache and an 8-byte aligned output. Queries and
// probabilities are rounded to the cache's type for the products (f32
// accumulation): results are within that rounding of the f32 kernel's.
bool PrefillMmaApplies(const KvLayout& layout, int head_dim, const void* cache, const float* out);

// As LaunchPrefillAttention (kernels.h), where PrefillMmaApplies.
cudaError_t LaunchPrefillMma(const float* q, int q_stride, const int32_t* rows_meta,
                             const int32_t* tiles, int n_tiles, int layer, const KvLayout& layout,
                             const void* cache, int n_heads, int n_kv_heads, int head_dim,
                             float* out);

}  // namespace tandem::cuda

#endif  // TANDEM_COMMON_COMPUTE_CUDA_PREFILL_MMA_H_
