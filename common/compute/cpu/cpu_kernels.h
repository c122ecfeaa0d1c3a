// Row kernels of the CPU backend. Each is compiled for several instruction
// sets (target_clones) and dispatched once by the dynamic loader.
#ifndef TANDEM_COMMON_COMPUTE_CPU_CPU_KERNELS_H_
#define TANDEM_COMMON_COMPUTE_CPU_CPU_KERNELS_H_

#include <cstdint>
#include <span>

#include "common/compute/backend.h"

namespace tandem::cpu {

// The instruction set the kernels were dispatched to on this CPU.
const char* KernelIsa();

void RmsNormRow(const float* x, const float* weight, float* out, int dim, float eps);
void SwiGluRow(const float* gate, const float* up, float* out, int n);
// Pairs (2i, 2i+1) of each head, or (i, i + head_dim/2) when `half_split`.
void RopeRow(float* x, int n_heads, int head_dim, const float* cos_sin_at_position,
             bool half_split);

// dst[i] = src[i] widened to f32, for `n` elements of type `dtype`.
void Widen(const void* src, DType dtype, float* dst, int64_t n);
// Element i of src goes to dst[i * dst_stride] (in dst's type, rounded).
// Not for kI8, whose values need a scale: QuantizeInt8.
void Narrow(const float* src, DType dtype, void* dst, int64_t n, int64_t dst_stride);
// Rounds src[0, n) to dst[i * dst_stride] in [-127, 127] with one scale,
// *scale = largest magnitude / 127 (0 for all zeros), so that src[i] is
// about dst[i * dst_stride] * *scale. A NaN or infinity makes *scale NaN.
void QuantizeInt8(const float* src, int64_t n, int8_t* dst, int64_t dst_stride, float* scale);
// dst[i] = src[i] * scales[i], or src[i] * scale when scales is null.
void WidenInt8(const int8_t* src, const float* scales, float scale, float* dst, int64_t n);

// Softmax over row[0, valid) in place; row[valid, width) is set to zero.
void CausalSoftmaxRow(float* row, int valid, int width);

// Attention of the `group` query heads that share KV head `kv_head`, for one
// row: q points at the first of those heads, out likewise. `scores` has room
// for group * (position + 1) floats.
void AttendGroup(const float* q, const AttentionRow& row, int kv_head, int group, int head_dim,
                 int layer, const KvLayout& layout, const void* cache, float* scores, float* out);

}  // namespace tandem::cpu

#endif  // TANDEM_COMMON_COMPUTE_CPU_CPU_KERNELS_H_
