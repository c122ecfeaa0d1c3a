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
                       int rows, int n_heads, int n_kv_heads, int head_dim, const float* cos_sin,
                       bool half_split);
cudaError_t LaunchAddBias(float* x, int stride, const float* bias, int rows, int n);
cudaError_t LaunchSwiGlu(const float* gate_up, float* out, int rows, int hidden);
cudaError_t LaunchWriteKv(const float* k, int k_stride, const float* v, int v_stride,
                          const int32_t* rows_meta, int rows, int layer, const KvLayout& layout,
                          float* cache);
// How LaunchPagedAttention divides the work: each (row, KV head) is split
// into `splits` ranges of `chunk` context positions when there are too few
// rows to fill the GPU; the splits' partial results need `partial_floats`
// floats of device scratch, merged by a second kernel.
struct AttentionPlan {
  int splits = 1;
  int chunk = 0;
  size_t partial_floats = 0;
};
AttentionPlan PlanPagedAttention(int rows, int max_context, int n_kv_heads, int head_dim,
                                 int n_heads, int sm_count);
// `partials` holds plan.partial_floats floats (may be null for one split).
cudaError_t LaunchPagedAttention(const float* q, int q_stride, const int32_t* rows_meta, int rows,
                                 int layer, const KvLayout& layout, const float* cache, int n_heads,
                                 int n_kv_heads, int head_dim, const AttentionPlan& plan,
                                 float* partials, float* out);

}  // namespace tandem::cuda

#endif  // TANDEM_COMMON_COMPUTE_CUDA_KERNELS_H_
