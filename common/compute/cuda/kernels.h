// Launchers of the CUDA backend's kernels (kernels.cu). All run on the
// legacy default stream and return the launch's error (cudaGetLastError).
// Pointers are device memory; `rows_meta` is the packed row list of
// CudaBackend::UploadRows: [position, block list offset] per row, then the
// block lists, offsets counted from the start of rows_meta.
#ifndef TANDEM_COMMON_COMPUTE_CUDA_KERNELS_H_
#define TANDEM_COMMON_COMPUTE_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "common/kvcache/kv_layout.h"

namespace tandem::cuda {

// Most query heads per KV head, and largest head_dim, PagedAttention takes.
constexpr int kMaxGroup = 32;
constexpr int kMaxHeadDim = 256;

cudaError_t LaunchEmbed(const float* table, const int32_t* ids, int rows, int dim, float* out);
cudaError_t LaunchRmsNorm(const float* x, const float* weight, float* out, int rows, int dim,
                          float eps);
cudaError_t LaunchRope(float* q, int q_stride, float* k, int k_stride, const int32_t* positions,
                       int rows, int n_heads, int n_kv_heads, int head_dim, const float* cos_sin);
cudaError_t LaunchSwiGlu(const float* gate_up, float* out, int rows, int hidden);
cudaError_t LaunchWriteKv(const float* k, int k_stride, const float* v, int v_stride,
                          const int32_t* rows_meta, int rows, int layer, const KvLayout& layout,
                          float* cache);
cudaError_t LaunchPagedAttention(const float* q, int q_stride, const int32_t* rows_meta, int rows,
                                 int layer, const KvLayout& layout, const float* cache, int n_heads,
                                 int n_kv_heads, int head_dim, float* out);

}  // namespace tandem::cuda

#endif  // TANDEM_COMMON_COMPUTE_CUDA_KERNELS_H_
