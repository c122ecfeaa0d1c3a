// Launchers of the CUDA backend's kernels (kernels.cu, attention.cu,
// prefill_mma.cu, skinny_product.cu). All run on the legacy default stream and return the
// launch's error (cudaGetLastError). Pointers are device memory;
// `rows_meta` is the packed row list of CudaBackend::UploadRows: [position,
// block list offset] per row, then the block lists, offsets counted from the
// start of rows_meta.
//
// 16-bit elements (weights, KV cache) are f16 or bf16 as `DType` says; sums
// are f32 throughout, and so are products but on the tensor cores.
#ifndef TANDEM_COMMON_COMPUTE_CUDA_KERNELS_H_
#define TANDEM_COMMON_COMPUTE_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/base/dtype.h"
#include "common/kvcache/kv_layout.h"

namespace tandem::cuda {

// Most query heads per KV head, and largest head_dim, PagedAttention takes.
constexpr int kMaxGroup = 32;
constexpr int kMaxHeadDim = 256;
// Queries of one sequence at consecutive positions that the tiled (prefill)
// attention kernel takes per block, and the shortest run it is used for:
// shorter runs go through the per-row kernel.
constexpr int kPrefillTileRows = 64;
constexpr int kMinPrefillRun = 16;

// out[i] = x[i] rounded to nearest even in `dtype` (f16 or bf16), for
// i < n: the activations of a product with 16-bit weights.
cudaError_t LaunchNarrow(const float* x, DType dtype, void* out, size_t n);
// Fills n elements of `dtype` with values in [-1, 1) drawn from `seed`
// (benchmark operands).
cudaError_t LaunchFillRandom(void* data, DType dtype, size_t n, uint32_t seed);
// Launches a kernel with more threads per block than any device allows,
// which fails as a bad launch does (cudaErrorInvalidValue from CUDA 13's
// runtime): the fault CudaBackend::InjectFaultForTesting plants.
cudaError_t LaunchFaultyKernel();

// The weight-streaming product of decode (skinny_product.cu): out[m, n] =
// x[m, k] w[n, k]^T (+ beta * out) with x and w both f16 or both bf16 and
// f32 sums, for 1 to kMaxSkinnyRows rows; k a multiple of 8 and x, w
// 16-byte aligned (SkinnyProductApplies), else cudaErrorInvalidValue.
constexpr int kMaxSkinnyRows = 8;
bool SkinnyProductApplies(DType dtype, const void* x, const void* w, int m, int k);
cudaError_t LaunchSkinnyProduct(const void* x, const void* w, DType dtype, float* out, int m, int n,
                                int k, float beta);

cudaError_t LaunchEmbed(const void* table, DType dtype, const int32_t* ids, int rows, int dim,
                        float* out);
cudaError_t LaunchRmsNorm(const float* x, const float* weight, float* out, int rows, int dim,
                          float eps);
// In place over `heads` groups of head_dim values per row, rows `stride`
// apart (Backend::RmsNormHeads).
cudaError_t LaunchRmsNormHeads(float* x, int stride, const float* weight, int rows, int heads,
                               int head_dim, float eps);
cudaError_t LaunchRope(float* q, int q_stride, float* k, int k_stride, const int32_t* positions,
                       int rows, int n_heads, int n_kv_heads, int head_dim, const float* cos_sin,
                       bool half_split);
// Backend::GatherRows and ScatterAddRows; `rows` and `weights` in device
// memory.
cudaError_t LaunchGatherRows(const float* src, const int32_t* rows, int count, int n, float* dst);
cudaError_t LaunchScatterAddRows(const float* src, const int32_t* rows, const float* weights,
                                 int count, int n, float* dst);
cudaError_t LaunchAddBias(float* x, int stride, const float* bias, int rows, int n);
// out[r] = the index of the largest of x[r, 0..n) (Backend::Argmax), one
// block per row.
cudaError_t LaunchArgmax(const float* x, int rows, int n, int32_t* out);
cudaError_t LaunchSwiGlu(const float* gate_up, float* out, int rows, int hidden);
// Rounds to layout.dtype as the CPU backend does (nearest even); an int8
// cache gets each token's KV head scaled and rounded as int8_kv.h says (one
// warp per row and head). cudaErrorInvalidValue, before any launch, for an
// int8 cache whose kv_dim is not a whole number of its kv_heads.
cudaError_t LaunchWriteKv(const float* k, int k_stride, const float* v, int v_stride,
                          const int32_t* rows_meta, int rows, int layer, const KvLayout& layout,
                          void* cache);

// How LaunchPagedAttention divides the work: each (row, KV head) is split
// into `splits` ranges of `chunk` context positions when there are too few
// rows to fill the GPU; the splits' partial results need `partial_floats`
// floats of device scratch, merged by a second kernel.
struct AttentionPlan {
  int splits = 1;
  int chunk = 0;
  size_t partial_floats = 0;
  bool by_block = false;  // the paged-block kernel (decode_attention.cu)
};
AttentionPlan PlanPagedAttention(int rows, int max_context, int n_kv_heads, int head_dim,
                                 int n_heads, int sm_count);
// The paged-block decode kernel: a bf16 or f16 cache in blocks of
// kBlockDecodeSlots, head_dim 64 or 128, at most kBlockDecodeMaxGroup query
// heads per KV head, the cache 16-byte aligned. Its plan's chunk is a
// multiple of 64 positions (a paged block for each of a block's 4 warps).
constexpr int kBlockDecodeSlots = 16;
constexpr int kBlockDecodeMaxGroup = 8;
bool BlockDecodeApplies(const KvLayout& layout, int n_heads, int n_kv_heads, int head_dim,
                        const void* cache);
AttentionPlan PlanBlockDecode(int rows, int max_context, int n_kv_heads, int head_dim, int n_heads,
                              int sm_count);
// The first kernel of LaunchPagedAttention for a by_block plan.
cudaError_t LaunchBlockDecode(const float* q, int q_stride, const int32_t* rows_meta,
                              const int32_t* row_ids, int rows, int layer, const KvLayout& layout,
                              const void* cache, int n_heads, int n_kv_heads, int head_dim,
                              const AttentionPlan& plan, float* partials, float* out);
// Attention of the `rows` rows whose indices are row_ids[0, rows), one
// block per (row, KV head, split), over an f32, bf16, f16 or int8 cache. `partials` holds
// plan.partial_floats floats (may be null for one split).
cudaError_t LaunchPagedAttention(const float* q, int q_stride, const int32_t* rows_meta,
                                 const int32_t* row_ids, int rows, int layer,
                                 const KvLayout& layout, const void* cache, int n_heads,
                                 int n_kv_heads, int head_dim, const AttentionPlan& plan,
                                 float* partials, float* out);
// Attention of query tiles, flash-attention style: tile t is the rows
// [tiles[2t], tiles[2t] + tiles[2t+1]) (at most kPrefillTileRows) of one
// sequence at consecutive positions; one block per (tile, query head) walks
// the tile's causal context in KV tiles staged in shared memory with an
// online softmax. Tiles are best ordered longest context first. In f32 on
// the CUDA cores, or on the tensor cores for a 16-bit cache where
// PrefillMmaApplies (prefill_mma.h).
cudaError_t LaunchPrefillAttention(const float* q, int q_stride, const int32_t* rows_meta,
                                   const int32_t* tiles, int n_tiles, int layer,
                                   const KvLayout& layout, const void* cache, int n_heads,
                                   int n_kv_heads, int head_dim, float* out);

// Device checks of what the host and the device share (shared_functions.cu):
// out[i] = PhiloxUniform(seed, start + i) for i < n; and, for the n float bit
// patterns from first_bits on, ours[i] = FloatToFp8E4M3 and device[i] = the
// device's own satfinite E4M3 conversion.
cudaError_t LaunchPhiloxUniform(uint64_t seed, uint64_t start, int n, double* out);
cudaError_t LaunchFp8E4M3Encode(uint32_t first_bits, int n, uint8_t* ours, uint8_t* device);

}  // namespace tandem::cuda

#endif  // TANDEM_COMMON_COMPUTE_CUDA_KERNELS_H_
