// Decode attention by paged block, for a 16-bit KV cache in blocks of 16
// slots (the engine's default) and head_dim 64 or 128: each warp of a
// block takes whole paged blocks of the (row, KV head, context split) in
// turn, copying the block's keys (one contiguous run of the transposed
// layout) and values into shared memory with cp.async, the next block's
// copy in flight while the current one is scored; it scores every query
// head of the KV head's group, keeps an online softmax per head and
// accumulates P V with lanes over dimensions. No barrier is crossed inside
// the loop; the block's warps merge their (acc, max, sum) at the end. The
// tiled kernel of attention.cu stays for every other cache.
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/compute/cuda/elements.cuh"
#include "common/compute/cuda/kernels.h"

namespace tandem::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarps = 4;                      // warps of a block
constexpr int kSlots = kBlockDecodeSlots;      // slots of a paged block
constexpr int kHeadLanes = 4;                  // lane groups of 8 that score heads
constexpr int kSplitTokens = kSlots * kWarps;  // a split's length is a multiple of this

__device__ __forceinline__ void CopyAsync16(void* shared, const void* global) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global) : "memory");
}
__device__ __forceinline__ void CommitAsync() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most one committed group of this thread is in flight.
__device__ __forceinline__ void WaitAllButOne() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

// Two 16-bit elements of a 32-bit word (the lower first), widened.
template <typename T>
__device__ __forceinline__ void Widen2(uint32_t w, float& lo, float& hi) {
  if constexpr (std::is_same_v<T, Bf16>) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  } else {
    lo = __half2float(__ushort_as_half(static_cast<uint16_t>(w & 0xffffu)));
    hi = __half2float(__ushort_as_half(static_cast<uint16_t>(w >> 16)));
  }
}

// kN consecutive 16-bit elements at p (4-byte aligned for 2, 8-byte for 4).
template <typename T, int kN>
__device__ __forceinline__ void LoadLane(const T* p, float (&out)[kN]) {
  static_assert(kN == 2 || kN == 4);
  if constexpr (kN == 4) {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    Widen2<T>(w.x, out[0], out[1]);
    Widen2<T>(w.y, out[2], out[3]);
  } else {
    Widen2<T>(*reinterpret_cast<const uint32_t*>(p), out[0], out[1]);
  }
}

// Starts the copy of one paged block's keys and values of one KV head into
// `stage`: keys [kHd][kSlots] as the block holds them, then values
// [kSlots][kHd].
template <typename T, int kHd>
__device__ __forceinline__ void StageBlock(const T* block, int kv_dim, int kv_off, T* stage,
                                           int lane) {
  constexpr int kPer16 = 16 / static_cast<int>(sizeof(T));
  constexpr int kRowPieces = kHd / kPer16;      // 16-byte pieces of one slot's values
  constexpr int kPieces = kSlots * kRowPieces;  // of the keys, and of the values
  static_assert(kPieces % kWarp == 0);
  const T* keys = block + static_cast<size_t>(kv_off) * kSlots;
  const T* values = block + static_cast<size_t>(kSlots) * kv_dim + kv_off;
#pragma unroll
  for (int c = 0; c < kPieces / kWarp; ++c) {
    const int i = lane + c * kWarp;
    CopyAsync16(stage + i * kPer16, keys + i * kPer16);
  }
#pragma unroll
  for (int c = 0; c < kPieces / kWarp; ++c) {
    const int i = lane + c * kWarp;
    const int s = i / kRowPieces, piece = i % kRowPieces;
    CopyAsync16(stage + kHd * kSlots + s * kHd + piece * kPer16,
                values + static_cast<size_t>(s) * kv_dim + piece * kPer16);
  }
}

template <int kHd, int kGroup>
struct BlockDecodeShape {
  static constexpr int kStage = 2 * kHd * kSlots;  // elements of one stage (keys, values)
  static constexpr int kQStride = kHd + 4;         // floats; keeps float4 reads aligned
  static constexpr int kMergeStride = 2 * kGroup + kGroup * kHd;  // floats a warp merges
  template <typename T>
  static constexpr size_t SharedBytes() {
    return sizeof(T) * kWarps * 2 * kStage +
           sizeof(float) * (kGroup * kQStride + kWarps * kGroup * kSlots);
  }
};

template <typename T, int kHd, int kGroup>
__global__ void __launch_bounds__(kWarps* kWarp)
    BlockDecodeKernel(const float* __restrict__ q, int q_stride, const int32_t* __restrict__ meta,
                      const int32_t* __restrict__ row_ids, DeviceLayout<T> layout, int n_heads,
                      int group, float scale, int chunk, float* __restrict__ partials,
                      float* __restrict__ out) {
  using Shape = BlockDecodeShape<kHd, kGroup>;
  constexpr int kStage = Shape::kStage, kQStride = Shape::kQStride;
  constexpr int kDpl = kHd / kWarp;                   // dimensions per lane in P V
  constexpr int kHeadsPerLane = kGroup / kHeadLanes;  // heads a lane scores
  extern __shared__ float4 block_decode_shared[];
  T* stages = reinterpret_cast<T*>(block_decode_shared);                // [kWarps][2][kStage]
  float* q_s = reinterpret_cast<float*>(stages + kWarps * 2 * kStage);  // [kGroup][kQStride]
  float* p_s = q_s + kGroup * kQStride;                                 // [kWarps][kGroup][kSlots]

  const int index = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z;
  const int r = row_ids[index];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int pos = meta[2 * r];
  const int32_t* blocks = meta + meta[2 * r + 1];
  const int begin = split * chunk, end = min(pos + 1, begin + chunk);
  const int kv_off = kv_head * kHd;
  const int head0 = kv_head * group;

  // Queries pre-scaled; rows past the group zero.
  const float* q_row = q + static_cast<size_t>(r) * q_stride + static_cast<size_t>(head0) * kHd;
  for (int i = threadIdx.x; i < kGroup * kHd; i += blockDim.x) {
    const int h = i / kHd, d = i % kHd;
    q_s[h * kQStride + d] = h < group ? q_row[i] * scale : 0.0f;
  }
  __syncthreads();

  float acc[kGroup][kDpl];
  float m[kGroup], l[kGroup];  // the same in every lane
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    m[h] = -FLT_MAX;
    l[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < kDpl; ++i) acc[h][i] = 0.0f;
  }
  float m_own[kHeadsPerLane];  // m of the heads this lane scores
#pragma unroll
  for (int j = 0; j < kHeadsPerLane; ++j) m_own[j] = -FLT_MAX;

  T* my_stages = stages + warp * 2 * kStage;
  float* my_p = p_s + warp * kGroup * kSlots;
  const int hgrp = lane / 8,
            pair = lane % 8;            // scores slots 2 pair, 2 pair + 1 of heads hgrp + 4 j
  const int last = (end - 1) / kSlots;  // begin is a multiple of kSlots
  int b = begin / kSlots + warp;
  const bool any = begin < end;
  if (any && b <= last)
    StageBlock<T, kHd>(layout.Block(blocks[b]), layout.kv_dim, kv_off, my_stages, lane);
  CommitAsync();
  int stage = 0;
  for (; any && b <= last; b += kWarps) {
    const int next = b + kWarps;
    if (next <= last) {
      StageBlock<T, kHd>(layout.Block(blocks[next]), layout.kv_dim, kv_off,
                         my_stages + (stage ^ 1) * kStage, lane);
    }
    CommitAsync();
    WaitAllButOne();
    __syncwarp();
    const T* ks = my_stages + stage * kStage;
    const T* vs = ks + kHd * kSlots;
    const int n = min(kSlots, end - b * kSlots);  // valid slots, at least 1

    // Scores of slots 2 pair and 2 pair + 1 for this lane's heads: two
    // sums each over alternating dimensions, for independent adds.
    const auto* k_words = reinterpret_cast<const uint32_t*>(ks);  // (d, pair) at d * 8 + pair
    float s[kHeadsPerLane][2][2] = {};
#pragma unroll 4
    for (int d = 0; d < kHd; d += 4) {
      float k0[4], k1[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) Widen2<T>(k_words[(d + e) * (kSlots / 2) + pair], k0[e], k1[e]);
#pragma unroll
      for (int j = 0; j < kHeadsPerLane; ++j) {
        const float4 qv =
            *reinterpret_cast<const float4*>(q_s + (hgrp + kHeadLanes * j) * kQStride + d);
        const float qd[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[j][0][e % 2] += qd[e] * k0[e];
          s[j][1][e % 2] += qd[e] * k1[e];
        }
      }
    }
    const int slot0 = 2 * pair;
    float p[kHeadsPerLane][2], block_max[kHeadsPerLane], block_sum[kHeadsPerLane];
#pragma unroll
    for (int j = 0; j < kHeadsPerLane; ++j) {
      const float a = slot0 < n ? s[j][0][0] + s[j][0][1] : -FLT_MAX;
      const float c = slot0 + 1 < n ? s[j][1][0] + s[j][1][1] : -FLT_MAX;
      float mx = fmaxf(a, c);
      for (int o = 1; o < 8; o *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      block_max[j] = mx;
      m_own[j] = fmaxf(m_own[j], mx);
      p[j][0] = slot0 < n ? expf(a - m_own[j]) : 0.0f;
      p[j][1] = slot0 + 1 < n ? expf(c - m_own[j]) : 0.0f;
      float sum = p[j][0] + p[j][1];
      for (int o = 1; o < 8; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      block_sum[j] = sum;
      const int h = hgrp + kHeadLanes * j;
      if (h < group) {
        my_p[h * kSlots + slot0] = p[j][0];
        my_p[h * kSlots + slot0 + 1] = p[j][1];
      }
    }
    // Every lane's copy of each head's max and sum, from lane 8 (h % 4).
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      const float bm = __shfl_sync(0xffffffffu, block_max[h / kHeadLanes], (h % kHeadLanes) * 8);
      const float bsum = __shfl_sync(0xffffffffu, block_sum[h / kHeadLanes], (h % kHeadLanes) * 8);
      const float m_new = fmaxf(m[h], bm);
      const float correction = expf(m[h] - m_new);
      // The lanes' p were taken against m_new; the block's sum is in those terms.
      l[h] = l[h] * correction + bsum;
#pragma unroll
      for (int i = 0; i < kDpl; ++i) acc[h][i] *= correction;
      m[h] = m_new;
    }
    __syncwarp();
#pragma unroll 4
    for (int t = 0; t < n; ++t) {
      float v[kDpl];
      LoadLane<T, kDpl>(vs + t * kHd + lane * kDpl, v);
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        if (h >= group) break;
        const float pt = my_p[h * kSlots + t];
#pragma unroll
        for (int i = 0; i < kDpl; ++i) acc[h][i] += pt * v[i];
      }
    }
    __syncwarp();  // the stage and p are read before the next block rewrites them
    stage ^= 1;
  }

  // The warps' (max, sum, acc) through shared memory (the stages are done).
  __syncthreads();
  float* all = reinterpret_cast<float*>(stages);
  float* mine = all + warp * Shape::kMergeStride;
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    if (lane == 0) {
      mine[h] = m[h];
      mine[kGroup + h] = l[h];
    }
#pragma unroll
    for (int i = 0; i < kDpl; ++i) mine[2 * kGroup + h * kHd + lane * kDpl + i] = acc[h][i];
  }
  __syncthreads();
  const int splits = gridDim.z;
  for (int i = threadIdx.x; i < group * kHd; i += blockDim.x) {
    const int h = i / kHd, d = i % kHd;
    float top = -FLT_MAX;
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, all[w * Shape::kMergeStride + h]);
    float sum = 0.0f, value = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float* part = all + w * Shape::kMergeStride;
      const float lw = part[kGroup + h];
      if (lw == 0.0f) continue;  // a warp that had no block
      const float e = expf(part[h] - top);
      sum += e * lw;
      value += e * part[2 * kGroup + h * kHd + d];
    }
    const int head = head0 + h;
    if (splits == 1) {
      out[(static_cast<size_t>(r) * n_heads + head) * kHd + d] = value / sum;
    } else {
      // As the tiled kernel's partials: [acc, max, sum]; an empty split
      // (past the row's context) leaves sum 0.
      float* part =
          partials + ((static_cast<size_t>(index) * n_heads + head) * splits + split) * (kHd + 2);
      part[d] = value;
      if (d == 0) {
        part[kHd] = top;
        part[kHd + 1] = sum;
      }
    }
  }
}

template <typename T, int kHd, int kGroup>
cudaError_t Launch(const float* q, int q_stride, const int32_t* rows_meta, const int32_t* row_ids,
                   int rows, const DeviceLayout<T>& layout, int n_heads, int n_kv_heads,
                   const AttentionPlan& plan, float* partials, float* out) {
  const size_t shared = BlockDecodeShape<kHd, kGroup>::template SharedBytes<T>();
  auto* kernel = BlockDecodeKernel<T, kHd, kGroup>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(shared));
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(n_kv_heads),
                  static_cast<unsigned>(plan.splits));
  const float scale = 1.0f / sqrtf(static_cast<float>(kHd));
  kernel<<<grid, kWarps * kWarp, shared>>>(q, q_stride, rows_meta, row_ids, layout, n_heads,
                                           n_heads / n_kv_heads, scale, plan.chunk, partials, out);
  return cudaGetLastError();
}

template <typename T, int kHd>
cudaError_t LaunchForGroup(const float* q, int q_stride, const int32_t* rows_meta,
                           const int32_t* row_ids, int rows, const DeviceLayout<T>& layout,
                           int n_heads, int n_kv_heads, const AttentionPlan& plan, float* partials,
                           float* out) {
  if (n_heads / n_kv_heads <= 4) {
    return Launch<T, kHd, 4>(q, q_stride, rows_meta, row_ids, rows, layout, n_heads, n_kv_heads,
                             plan, partials, out);
  }
  return Launch<T, kHd, 8>(q, q_stride, rows_meta, row_ids, rows, layout, n_heads, n_kv_heads, plan,
                           partials, out);
}

}  // namespace

bool BlockDecodeApplies(const KvLayout& layout, int n_heads, int n_kv_heads, int head_dim,
                        const void* cache) {
  return (layout.dtype == DType::kBF16 || layout.dtype == DType::kF16) &&
         layout.block_size == kBlockDecodeSlots && (head_dim == 64 || head_dim == 128) &&
         n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
         n_heads / n_kv_heads <= kBlockDecodeMaxGroup &&
         reinterpret_cast<uintptr_t>(cache) % 16 == 0;
}

AttentionPlan PlanBlockDecode(int rows, int max_context, int n_kv_heads, int head_dim, int n_heads,
                              int sm_count) {
  AttentionPlan plan;
  plan.by_block = true;
  // About three blocks of 72 KiB of shared memory fit an SM; eight per SM
  // in all keep every SM busy as rows of unequal contexts finish.
  const int64_t pairs = static_cast<int64_t>(rows) * n_kv_heads;
  const int64_t wanted = 8 * static_cast<int64_t>(sm_count);
  const int64_t by_work = (wanted + pairs - 1) / pairs;
  const int64_t by_length = (max_context + kSplitTokens - 1) / kSplitTokens;
  const int64_t splits = by_work < by_length ? by_work : by_length;
  if (splits <= 1) {
    plan.chunk = (max_context + kSplitTokens - 1) / kSplitTokens * kSplitTokens;
    return plan;
  }
  const int64_t per_split = (max_context + splits - 1) / splits;
  plan.chunk = static_cast<int>((per_split + kSplitTokens - 1) / kSplitTokens * kSplitTokens);
  plan.splits = (max_context + plan.chunk - 1) / plan.chunk;
  if (plan.splits > 1) {
    plan.partial_floats =
        static_cast<size_t>(rows) * n_heads * plan.splits * static_cast<size_t>(head_dim + 2);
  }
  return plan;
}

cudaError_t LaunchBlockDecode(const float* q, int q_stride, const int32_t* rows_meta,
                              const int32_t* row_ids, int rows, int layer, const KvLayout& layout,
                              const void* cache, int n_heads, int n_kv_heads, int head_dim,
                              const AttentionPlan& plan, float* partials, float* out) {
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const DeviceLayout<T> device = MakeDeviceLayout<T>(layout, layer, cache);
    if (head_dim == 64) {
      return LaunchForGroup<T, 64>(q, q_stride, rows_meta, row_ids, rows, device, n_heads,
                                   n_kv_heads, plan, partials, out);
    }
    return LaunchForGroup<T, 128>(q, q_stride, rows_meta, row_ids, rows, device, n_heads,
                                  n_kv_heads, plan, partials, out);
  };
  if (layout.dtype == DType::kBF16) return run(static_cast<Bf16*>(nullptr));
  return run(static_cast<F16*>(nullptr));
}

}  // namespace tandem::cuda
