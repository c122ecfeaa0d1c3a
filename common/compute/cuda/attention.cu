// Paged attention kernels of the CUDA backend: one block per (row, KV head)
// for decode rows, query tiles flash-attention style for prefill chunks.
// The KV cache is f32, bf16, f16 or int8 (kernel templates on the element
// type); scores, softmax and sums are f32, with keys and values widened (an
// int8 cache's bytes times their token's scale) as they are staged in shared
// memory.
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/compute/cuda/elements.cuh"
#include "common/compute/cuda/kernels.h"
#include "common/compute/cuda/prefill_mma.h"

namespace tandem::cuda {
namespace {

constexpr int kWarp = 32;
// Slots of one decode attention tile: keys and values of this many cached
// tokens of one KV head are staged in shared memory at a time, one slot per
// lane.
constexpr int kTileSlots = kWarp;
// Warps of a decode attention block: all stage the tiles; each scores its
// own query heads of the group.
constexpr int kAttnWarps = 4;
// Context positions one decode attention block covers at least before the
// context is split further.
constexpr int kMinChunk = 64;

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Whether keys and values can be read 16 bytes at a time: runs of kVec<T>
// slots (keys) and dimensions (values) that start at a multiple of kVec<T>
// are aligned and never cross a block.
template <typename T>
bool VectorLoads(const KvLayout& layout, int head_dim, const void* cache) {
  if constexpr (std::is_same_v<T, int8_t>) {
    return false;  // staged byte by byte, each times its scale
  } else {
    constexpr int v = kVec<T>;
    return layout.block_size % v == 0 && head_dim % v == 0 &&
           reinterpret_cast<uintptr_t>(cache) % 16 == 0;
  }
}

// Stages keys [t0, t0 + n) of one KV head in k_s[d][kSlots] (zero past n)
// and values in v_s[j][v_stride] (zero rows past n) as f32. slot_block and
// slot_index give each slot's block and index in it. `vec` as VectorLoads
// says; t0 is a multiple of kVec<T> then.
template <typename T, int kSlots>
__device__ __forceinline__ void StageKvWide(const DeviceLayout<T>& layout,
                                            const T* const* slot_block, const int* slot_index,
                                            int n, int kv_off, int head_dim, bool vec, float* k_s,
                                            float* v_s, int v_stride) {
  const int bs = layout.block_size;
  const size_t values_at = static_cast<size_t>(bs) * layout.kv_dim;
  if (vec) {
    constexpr int kV = kVec<T>;
    constexpr int kGroups = kSlots / kV;
    // Keys: kV slots of one dimension are adjacent in a block.
    for (int i = threadIdx.x; i < head_dim * kGroups; i += blockDim.x) {
      const int d = i / kGroups, j0 = (i % kGroups) * kV;
      float f[kV];
      if (j0 < n) {
        LoadVec(slot_block[j0] + static_cast<size_t>(kv_off + d) * bs + slot_index[j0], f);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          if (j0 + e >= n) f[e] = 0.0f;  // past the context: maybe never written
        }
      } else {
#pragma unroll
        for (int e = 0; e < kV; ++e) f[e] = 0.0f;
      }
      StoreFloats(k_s + d * kSlots + j0, f);
    }
    // Values: a slot's head_dim values are adjacent.
    const int per_slot = head_dim / kV;
    for (int i = threadIdx.x; i < kSlots * per_slot; i += blockDim.x) {
      const int j = i / per_slot, d0 = (i % per_slot) * kV;
      float f[kV];
      if (j < n) {
        LoadVec(slot_block[j] + values_at + static_cast<size_t>(slot_index[j]) * layout.kv_dim +
                    kv_off + d0,
                f);
      } else {
#pragma unroll
        for (int e = 0; e < kV; ++e) f[e] = 0.0f;
      }
      StoreFloats(v_s + j * v_stride + d0, f);
    }
    return;
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < head_dim * kSlots; i += blockDim.x) {
    const int d = i / kSlots, j = i % kSlots;
    k_s[i] =
        j < n ? ToFloat(slot_block[j][static_cast<size_t>(kv_off + d) * bs + slot_index[j]]) : 0.0f;
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < kSlots * head_dim; i += blockDim.x) {
    const int j = i / head_dim, d = i % head_dim;
    v_s[j * v_stride + d] =
        j < n
            ? ToFloat(slot_block[j][values_at + static_cast<size_t>(slot_index[j]) * layout.kv_dim +
                                    kv_off + d])
            : 0.0f;
  }
}

// StageKv for an int8 cache: each byte times its token's scale for this KV
// head, as the CPU backend reads an int8 cache.
template <int kSlots>
__device__ __forceinline__ void StageKvInt8(const DeviceLayout<int8_t>& layout,
                                            const int8_t* const* slot_block, const int* slot_index,
                                            int n, int kv_off, int head_dim, float* k_s, float* v_s,
                                            int v_stride) {
  const int bs = layout.block_size;
  const size_t values_at = static_cast<size_t>(bs) * layout.kv_dim;
  const int kv_head = kv_off / head_dim;
#pragma unroll 4
  for (int i = threadIdx.x; i < head_dim * kSlots; i += blockDim.x) {
    const int d = i / kSlots, j = i % kSlots;
    k_s[i] = j < n ? static_cast<float>(
                         slot_block[j][static_cast<size_t>(kv_off + d) * bs + slot_index[j]]) *
                         layout.KeyScales(slot_block[j], kv_head)[slot_index[j]]
                   : 0.0f;
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < kSlots * head_dim; i += blockDim.x) {
    const int j = i / head_dim, d = i % head_dim;
    v_s[j * v_stride + d] =
        j < n ? static_cast<float>(
                    slot_block[j][values_at + static_cast<size_t>(slot_index[j]) * layout.kv_dim +
                                  kv_off + d]) *
                    layout.ValueScales(slot_block[j], kv_head)[slot_index[j]]
              : 0.0f;
  }
}

template <typename T, int kSlots>
__device__ __forceinline__ void StageKv(const DeviceLayout<T>& layout, const T* const* slot_block,
                                        const int* slot_index, int n, int kv_off, int head_dim,
                                        bool vec, float* k_s, float* v_s, int v_stride) {
  if constexpr (std::is_same_v<T, int8_t>) {
    StageKvInt8<kSlots>(layout, slot_block, slot_index, n, kv_off, head_dim, k_s, v_s, v_stride);
  } else {
    StageKvWide<T, kSlots>(layout, slot_block, slot_index, n, kv_off, head_dim, vec, k_s, v_s,
                           v_stride);
  }
}

// Decode attention, one block per (row, KV head, context split): the
// block's warps share each tile of keys and values staged in shared memory
// (lane j of a warp scores slot j of the tile), and each warp keeps an
// online softmax (running max, sum and output; lane l accumulates
// dimensions l, l + 32, ...) for the query heads it owns, so scores never
// leave registers. With one split the block writes the normalised output;
// with several it writes its unnormalised partial (acc, max, sum) for
// CombineSplitsKernel, so that a long context is spread over many SMs (the
// split-context scheme of flash-decoding).
template <typename T>
__global__ void __launch_bounds__(kAttnWarps* kWarp)
    DecodeAttentionKernel(const float* __restrict__ q, int q_stride,
                          const int32_t* __restrict__ meta, const int32_t* __restrict__ row_ids,
                          DeviceLayout<T> layout, int n_heads, int n_kv_heads, int head_dim,
                          float scale, int chunk, bool vec, float* __restrict__ partials,
                          float* __restrict__ out) {
  extern __shared__ float4 decode_shared[];  // float4: 16-byte aligned
  const int group = n_heads / n_kv_heads;
  float* q_s = reinterpret_cast<float*>(decode_shared);  // [group][head_dim], pre-scaled
  float* k_s = q_s + group * head_dim;                   // [head_dim][kTileSlots]
  float* v_s = k_s + head_dim * kTileSlots;              // [kTileSlots][head_dim]
  __shared__ const T* slot_block[kTileSlots];
  __shared__ int slot_index[kTileSlots];

  const int index = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z;
  const int r = row_ids[index];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int pos = meta[2 * r];
  const int32_t* blocks = meta + meta[2 * r + 1];
  const int begin = split * chunk, end = min(pos + 1, begin + chunk);
  const int kv_off = kv_head * head_dim;
  const int head0 = kv_head * group;
  const int bs = layout.block_size;

  const float* q_row =
      q + static_cast<size_t>(r) * q_stride + static_cast<size_t>(head0) * head_dim;
  for (int i = threadIdx.x; i < group * head_dim; i += blockDim.x) q_s[i] = q_row[i] * scale;

  constexpr int kPerLane = kMaxHeadDim / kWarp;
  constexpr int kHeadsPerWarp = kMaxGroup / kAttnWarps;
  float acc[kHeadsPerWarp][kPerLane];
  float m[kHeadsPerWarp], l[kHeadsPerWarp];
#pragma unroll
  for (int u = 0; u < kHeadsPerWarp; ++u) {
    m[u] = -FLT_MAX;
    l[u] = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[u][i] = 0.0f;
  }

  for (int t0 = begin; t0 < end; t0 += kTileSlots) {
    const int n = min(kTileSlots, end - t0);
    __syncthreads();  // the previous tile is consumed (and q_s written)
    if (threadIdx.x < n) {
      const int t = t0 + threadIdx.x;
      slot_block[threadIdx.x] = layout.Block(blocks[t / bs]);
      slot_index[threadIdx.x] = t % bs;
    }
    __syncthreads();
    StageKv<T, kTileSlots>(layout, slot_block, slot_index, n, kv_off, head_dim, vec, k_s, v_s,
                           head_dim);
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kHeadsPerWarp; ++u) {
      const int hh = warp + u * kAttnWarps;
      if (hh >= group) break;
      const float* qh = q_s + hh * head_dim;
      float s = -FLT_MAX;
      if (lane < n) {
        // Four independent sums: a single chain of dependent adds would
        // leave the warp waiting on each one.
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int d = 0;
        for (; d + 4 <= head_dim; d += 4) {
#pragma unroll
          for (int i = 0; i < 4; ++i) part[i] += qh[d + i] * k_s[(d + i) * kTileSlots + lane];
        }
        for (; d < head_dim; ++d) part[0] += qh[d] * k_s[d * kTileSlots + lane];
        s = (part[0] + part[1]) + (part[2] + part[3]);
      }
      const float m_new = fmaxf(m[u], WarpMax(s));
      const float correction = expf(m[u] - m_new);
      const float p = lane < n ? expf(s - m_new) : 0.0f;
      l[u] = l[u] * correction + WarpSum(p);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[u][i] *= correction;
#pragma unroll 4
      for (int j = 0; j < n; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        const float* vj = v_s + j * head_dim;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const int d = lane + i * kWarp;
          if (d < head_dim) acc[u][i] += pj * vj[d];
        }
      }
      m[u] = m_new;
    }
  }

  const int splits = gridDim.z;
#pragma unroll
  for (int u = 0; u < kHeadsPerWarp; ++u) {
    const int hh = warp + u * kAttnWarps;
    if (hh >= group) break;
    const int head = head0 + hh;
    if (splits == 1) {
      const float inv = 1.0f / l[u];
      float* o = out + (static_cast<size_t>(r) * n_heads + head) * head_dim;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + i * kWarp;
        if (d < head_dim) o[d] = acc[u][i] * inv;
      }
    } else {
      // [acc(head_dim), max, sum] per (row, head, split); an empty split
      // (past the row's context) leaves max -FLT_MAX and sum 0.
      float* p = partials +
                 ((static_cast<size_t>(index) * n_heads + head) * splits + split) * (head_dim + 2);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + i * kWarp;
        if (d < head_dim) p[d] = acc[u][i];
      }
      if (lane == 0) {
        p[head_dim] = m[u];
        p[head_dim + 1] = l[u];
      }
    }
  }
}

// Merges the splits of one (row, head): rescales each partial to the
// largest max and normalises by the merged sum.
__global__ void CombineSplitsKernel(const float* __restrict__ partials,
                                    const int32_t* __restrict__ row_ids, int n_heads, int head_dim,
                                    int splits, float* __restrict__ out) {
  const int index = blockIdx.x, head = blockIdx.y;
  const int r = row_ids[index];
  const float* p =
      partials + (static_cast<size_t>(index) * n_heads + head) * splits * (head_dim + 2);
  float top = -FLT_MAX;
  for (int s = 0; s < splits; ++s) top = fmaxf(top, p[s * (head_dim + 2) + head_dim]);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f, value = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float* part = p + s * (head_dim + 2);
      if (part[head_dim + 1] == 0.0f) continue;  // empty split
      const float w = expf(part[head_dim] - top);
      sum += w * part[head_dim + 1];
      value += w * part[d];
    }
    out[(static_cast<size_t>(r) * n_heads + head) * head_dim + d] = value / sum;
  }
}

constexpr int kPrefillThreads = 256;
// The threads of a prefill block as a 16 x 16 grid: thread (tx, ty) owns
// query rows 4ty .. 4ty + 3 of the tile, the keys kKeys / 16 * tx ... of each
// KV tile for scores, and output dimensions 64c + 4tx .. 64c + 4tx + 3.
constexpr int kGridSide = 16;

template <int N>
__device__ __forceinline__ void LoadShared(const float* p, float (&out)[N]) {
  if constexpr (N == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  } else {
    static_assert(N == 2);
    const float2 v = *reinterpret_cast<const float2*>(p);
    out[0] = v.x;
    out[1] = v.y;
  }
}

template <int N>
__device__ __forceinline__ void StoreShared(float* p, const float (&in)[N]) {
  if constexpr (N == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
  } else {
    static_assert(N == 2);
    *reinterpret_cast<float2*>(p) = make_float2(in[0], in[1]);
  }
}

// Max over the 16 lanes of a half warp (one row group of the thread grid).
__device__ __forceinline__ float RowGroupMax(float v) {
#pragma unroll
  for (int o = kGridSide / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float RowGroupSum(float v) {
#pragma unroll
  for (int o = kGridSide / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Prefill attention, one block per (query head, tile of up to
// kPrefillTileRows queries at consecutive positions of one sequence): the
// block walks the keys [0, last query's position] in tiles of kKeys staged
// in shared memory (f32), computes the tile's scores S = Q K^T as a
// register-blocked product, masks the keys past each query (causal), keeps
// an online softmax per query row and accumulates P V. Each thread holds 4
// rows x kKeys/16 scores and 4 rows x kMaxD/16 outputs; each row's max is
// reduced over its 16 threads per tile, its sum once at the end.
//
// Shared memory: q_s [hd_pad][rows] (pre-scaled; zero past head_dim and
// past the tile's rows), k_s [hd_pad][kKeys], v_s [kKeys][hd_pad], p_s
// [rows][kKeys]; hd_pad is head_dim rounded up to 4.
template <typename T, int kMaxD, int kKeys>
__global__ void __launch_bounds__(kPrefillThreads)
    PrefillAttentionKernel(const float* __restrict__ q, int q_stride,
                           const int32_t* __restrict__ meta, const int32_t* __restrict__ tiles,
                           DeviceLayout<T> layout, int n_heads, int group, int head_dim, int hd_pad,
                           float scale, bool vec, float* __restrict__ out) {
  constexpr int kRows = kPrefillTileRows;
  constexpr int kRowsPerThread = kRows / kGridSide;
  static_assert(kRowsPerThread == 4);
  constexpr int kKpt = kKeys / kGridSide;  // keys per thread
  constexpr int kDimGroups = kMaxD / (4 * kGridSide);
  extern __shared__ float4 prefill_shared[];  // float4: 16-byte aligned
  float* q_s = reinterpret_cast<float*>(prefill_shared);
  float* k_s = q_s + hd_pad * kRows;
  float* v_s = k_s + hd_pad * kKeys;
  float* p_s = v_s + kKeys * hd_pad;
  __shared__ const T* slot_block[kKeys];
  __shared__ int slot_index[kKeys];

  const int head = blockIdx.x, tile = blockIdx.y;
  const int kv_off = head / group * head_dim;
  const int first = tiles[2 * tile], count = tiles[2 * tile + 1];
  const int p0 = meta[2 * first];
  const int32_t* blocks = meta + meta[2 * first + 1];
  const int key_end = p0 + count;  // the last query attends to key_end - 1
  const int tx = threadIdx.x % kGridSide, ty = threadIdx.x / kGridSide;
  const int bs = layout.block_size;

  for (int i = threadIdx.x; i < hd_pad * kRows; i += blockDim.x) {
    const int row = i % kRows, d = i / kRows;
    q_s[i] = row < count && d < head_dim ? q[static_cast<size_t>(first + row) * q_stride +
                                             static_cast<size_t>(head) * head_dim + d] *
                                               scale
                                         : 0.0f;
  }
  // Key rows past head_dim are never staged: zero, so that they add nothing.
  for (int i = head_dim * kKeys + threadIdx.x; i < hd_pad * kKeys; i += blockDim.x) k_s[i] = 0.0f;

  float o[kRowsPerThread][kDimGroups][4];
  float m[kRowsPerThread], l[kRowsPerThread];  // l: this thread's keys only
#pragma unroll
  for (int a = 0; a < kRowsPerThread; ++a) {
    m[a] = -INFINITY;
    l[a] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDimGroups; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[a][c][e] = 0.0f;
    }
  }

  for (int t0 = 0; t0 < key_end; t0 += kKeys) {
    const int n = min(kKeys, key_end - t0);
    __syncthreads();  // the previous tile is consumed (and q_s written)
    if (threadIdx.x < n) {
      const int t = t0 + threadIdx.x;
      slot_block[threadIdx.x] = layout.Block(blocks[t / bs]);
      slot_index[threadIdx.x] = t % bs;
    }
    __syncthreads();
    StageKv<T, kKeys>(layout, slot_block, slot_index, n, kv_off, head_dim, vec, k_s, v_s, hd_pad);
    __syncthreads();

    float s[kRowsPerThread][kKpt];
#pragma unroll
    for (int a = 0; a < kRowsPerThread; ++a) {
#pragma unroll
      for (int b = 0; b < kKpt; ++b) s[a][b] = 0.0f;
    }
#pragma unroll 4
    for (int d = 0; d < hd_pad; ++d) {
      float qa[4], kb[kKpt];
      LoadShared(q_s + d * kRows + ty * kRowsPerThread, qa);
      LoadShared(k_s + d * kKeys + tx * kKpt, kb);
#pragma unroll
      for (int a = 0; a < kRowsPerThread; ++a) {
#pragma unroll
        for (int b = 0; b < kKpt; ++b) s[a][b] += qa[a] * kb[b];
      }
    }
    // Keys past a query's position are masked; only tiles reaching past the
    // first query's position have any.
    if (t0 + kKeys - 1 > p0) {
#pragma unroll
      for (int a = 0; a < kRowsPerThread; ++a) {
#pragma unroll
        for (int b = 0; b < kKpt; ++b) {
          if (t0 + tx * kKpt + b > p0 + ty * kRowsPerThread + a) s[a][b] = -INFINITY;
        }
      }
    }
#pragma unroll
    for (int a = 0; a < kRowsPerThread; ++a) {
      float top = s[a][0];
#pragma unroll
      for (int b = 1; b < kKpt; ++b) top = fmaxf(top, s[a][b]);
      // Finite: key 0 of the first tile is never masked.
      const float m_new = fmaxf(m[a], RowGroupMax(top));
      const float correction = expf(m[a] - m_new);
      float p[kKpt], sum = 0.0f;
#pragma unroll
      for (int b = 0; b < kKpt; ++b) {
        p[b] = expf(s[a][b] - m_new);
        sum += p[b];
      }
      StoreShared(p_s + (ty * kRowsPerThread + a) * kKeys + tx * kKpt, p);
      l[a] = l[a] * correction + sum;
      m[a] = m_new;
#pragma unroll
      for (int c = 0; c < kDimGroups; ++c) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[a][c][e] *= correction;
      }
    }
    __syncthreads();  // p_s is whole

    // Keys past n have p = 0 for every real row and zero values.
#pragma unroll 2
    for (int j = 0; j < kKeys; j += 4) {
      float pa[kRowsPerThread][4];
#pragma unroll
      for (int a = 0; a < kRowsPerThread; ++a) {
        LoadShared(p_s + (ty * kRowsPerThread + a) * kKeys + j, pa[a]);
      }
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
        for (int c = 0; c < kDimGroups; ++c) {
          const int d0 = c * 4 * kGridSide + tx * 4;
          if (d0 >= head_dim) continue;
          float vv[4];
          LoadShared(v_s + (j + jj) * hd_pad + d0, vv);
#pragma unroll
          for (int a = 0; a < kRowsPerThread; ++a) {
#pragma unroll
            for (int e = 0; e < 4; ++e) o[a][c][e] += pa[a][jj] * vv[e];
          }
        }
      }
    }
  }

  const size_t out_stride = static_cast<size_t>(n_heads) * head_dim;
#pragma unroll
  for (int a = 0; a < kRowsPerThread; ++a) {
    const float inv = 1.0f / RowGroupSum(l[a]);
    const int row = ty * kRowsPerThread + a;
    if (row >= count) continue;
    float* dst =
        out + static_cast<size_t>(first + row) * out_stride + static_cast<size_t>(head) * head_dim;
#pragma unroll
    for (int c = 0; c < kDimGroups; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = c * 4 * kGridSide + tx * 4 + e;
        if (d < head_dim) dst[d] = o[a][c][e] * inv;
      }
    }
  }
}

int ThreadsFor(int work) {
  int t = kWarp;
  while (t < work && t < 256) t *= 2;
  return t;
}

template <typename T, int kMaxD, int kKeys>
cudaError_t LaunchPrefill(const float* q, int q_stride, const int32_t* rows_meta,
                          const int32_t* tiles, int n_tiles, int layer, const KvLayout& layout,
                          const void* cache, int n_heads, int n_kv_heads, int head_dim,
                          float* out) {
  const int hd_pad = (head_dim + 3) / 4 * 4;
  const size_t shared =
      sizeof(float) * (static_cast<size_t>(hd_pad) * (kPrefillTileRows + 2 * kKeys) +
                       static_cast<size_t>(kPrefillTileRows) * kKeys);
  auto* kernel = PrefillAttentionKernel<T, kMaxD, kKeys>;
  if (shared > 46 * 1024) {  // the static slot tables take the rest of the default 48 KiB
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(shared));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>(n_heads), static_cast<unsigned>(n_tiles));
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  kernel<<<grid, kPrefillThreads, shared>>>(
      q, q_stride, rows_meta, tiles, MakeDeviceLayout<T>(layout, layer, cache), n_heads,
      n_heads / n_kv_heads, head_dim, hd_pad, scale, VectorLoads<T>(layout, head_dim, cache), out);
  return cudaGetLastError();
}

// The tiled decode kernel's launch: the first kernel of
// LaunchPagedAttention for a plan that is not by_block.
cudaError_t LaunchTiledDecode(const float* q, int q_stride, const int32_t* rows_meta,
                              const int32_t* row_ids, int rows, int layer, const KvLayout& layout,
                              const void* cache, int n_heads, int n_kv_heads, int head_dim,
                              const AttentionPlan& plan, float* partials, float* out) {
  const int group = n_heads / n_kv_heads;
  const size_t shared =
      sizeof(float) * (static_cast<size_t>(group) * head_dim + 2 * head_dim * kTileSlots);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(n_kv_heads),
                  static_cast<unsigned>(plan.splits));
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  return WithKvElement(layout.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto* kernel = DecodeAttentionKernel<T>;
    if (shared > 46 * 1024) {  // the static slot tables take the rest of the default 48 KiB
      const cudaError_t e = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
      if (e != cudaSuccess) return e;
    }
    kernel<<<grid, kAttnWarps * kWarp, shared>>>(
        q, q_stride, rows_meta, row_ids, MakeDeviceLayout<T>(layout, layer, cache), n_heads,
        n_kv_heads, head_dim, scale, plan.chunk, VectorLoads<T>(layout, head_dim, cache), partials,
        out);
    return cudaGetLastError();
  });
}

}  // namespace

AttentionPlan PlanPagedAttention(int rows, int max_context, int n_kv_heads, int head_dim,
                                 int n_heads, int sm_count) {
  AttentionPlan plan;
  plan.chunk = max_context;
  // Enough blocks to fill every SM a few times over without splitting:
  // large decode batches.
  const int64_t blocks = static_cast<int64_t>(rows) * n_kv_heads;
  const int64_t wanted = 4 * static_cast<int64_t>(sm_count);
  if (blocks >= wanted || max_context <= kMinChunk) return plan;
  const int64_t by_work = (wanted + blocks - 1) / blocks;
  const int64_t by_length = (max_context + kMinChunk - 1) / kMinChunk;
  plan.splits = static_cast<int>(by_work < by_length ? by_work : by_length);
  if (plan.splits <= 1) {
    plan.splits = 1;
    return plan;
  }
  const int per_split = (max_context + plan.splits - 1) / plan.splits;
  plan.chunk = (per_split + kTileSlots - 1) / kTileSlots * kTileSlots;
  plan.splits = (max_context + plan.chunk - 1) / plan.chunk;
  plan.partial_floats =
      static_cast<size_t>(rows) * n_heads * plan.splits * static_cast<size_t>(head_dim + 2);
  return plan;
}

cudaError_t LaunchPagedAttention(const float* q, int q_stride, const int32_t* rows_meta,
                                 const int32_t* row_ids, int rows, int layer,
                                 const KvLayout& layout, const void* cache, int n_heads,
                                 int n_kv_heads, int head_dim, const AttentionPlan& plan,
                                 float* partials, float* out) {
  if (rows <= 0) return cudaSuccess;
  const cudaError_t launched = (plan.by_block ? LaunchBlockDecode : LaunchTiledDecode)(
      q, q_stride, rows_meta, row_ids, rows, layer, layout, cache, n_heads, n_kv_heads, head_dim,
      plan, partials, out);
  if (launched != cudaSuccess || plan.splits == 1) return launched;
  const dim3 heads(static_cast<unsigned>(rows), static_cast<unsigned>(n_heads));
  CombineSplitsKernel<<<heads, ThreadsFor(head_dim)>>>(partials, row_ids, n_heads, head_dim,
                                                       plan.splits, out);
  return cudaGetLastError();
}

cudaError_t LaunchPrefillAttention(const float* q, int q_stride, const int32_t* rows_meta,
                                   const int32_t* tiles, int n_tiles, int layer,
                                   const KvLayout& layout, const void* cache, int n_heads,
                                   int n_kv_heads, int head_dim, float* out) {
  if (n_tiles <= 0) return cudaSuccess;
  if (PrefillMmaApplies(layout, head_dim, cache, out)) {
    return LaunchPrefillMma(q, q_stride, rows_meta, tiles, n_tiles, layer, layout, cache, n_heads,
                            n_kv_heads, head_dim, out);
  }
  return WithKvElement(layout.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (head_dim <= 64) {
      return LaunchPrefill<T, 64, 64>(q, q_stride, rows_meta, tiles, n_tiles, layer, layout, cache,
                                      n_heads, n_kv_heads, head_dim, out);
    }
    if (head_dim <= 128) {
      return LaunchPrefill<T, 128, 64>(q, q_stride, rows_meta, tiles, n_tiles, layer, layout, cache,
                                       n_heads, n_kv_heads, head_dim, out);
    }
    return LaunchPrefill<T, 256, 32>(q, q_stride, rows_meta, tiles, n_tiles, layer, layout, cache,
                                     n_heads, n_kv_heads, head_dim, out);
  });
}

}  // namespace tandem::cuda
