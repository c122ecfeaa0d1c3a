#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "common/compute/cuda/kernels.h"

namespace tandem::cuda {
namespace {

constexpr int kWarp = 32;
// Slots of one attention tile: keys and values of this many cached tokens
// of one KV head are staged in shared memory at a time, one slot per lane.
constexpr int kTileSlots = kWarp;
// Warps of an attention block: all stage the tiles; each scores its own
// query heads of the group.
constexpr int kAttnWarps = 4;
// Context positions one attention block covers at least before the context
// is split further.
constexpr int kMinChunk = 64;

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The cache of one layer, as kv_layout.h lays it out.
struct DeviceLayout {
  int block_size;
  int kv_dim;
  const float* layer_base;

  // A block holds the keys transposed (element d of slot s at
  // d * block_size + s), then the values by slot (slot s's kv_dim floats at
  // block_size * kv_dim + s * kv_dim).
  __device__ const float* Block(int32_t block) const {
    return layer_base + static_cast<size_t>(block) * 2 * block_size * kv_dim;
  }
};

DeviceLayout MakeLayout(const KvLayout& layout, int layer, const float* cache) {
  return DeviceLayout{layout.block_size, layout.kv_dim, cache + layer * layout.layer_elements()};
}

__global__ void EmbedKernel(const float* table, const int32_t* ids, int dim, float* out) {
  const int r = blockIdx.x;
  const float* src = table + static_cast<size_t>(ids[r]) * dim;
  float* dst = out + static_cast<size_t>(r) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

constexpr int kNormThreads = 256;

__global__ void RmsNormKernel(const float* x, const float* weight, float* out, int dim, float eps) {
  __shared__ float partial[kNormThreads / kWarp];
  __shared__ float scale;
  const int r = blockIdx.x;
  const float* row = x + static_cast<size_t>(r) * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += row[i] * row[i];
  ss = WarpSum(ss);
  if (threadIdx.x % kWarp == 0) partial[threadIdx.x / kWarp] = ss;
  __syncthreads();
  if (threadIdx.x < kWarp) {
    float v = threadIdx.x < blockDim.x / kWarp ? partial[threadIdx.x] : 0.0f;
    v = WarpSum(v);
    if (threadIdx.x == 0) scale = rsqrtf(v / static_cast<float>(dim) + eps);
  }
  __syncthreads();
  const float s = scale;
  float* dst = out + static_cast<size_t>(r) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = weight[i] * (s * row[i]);
}

__global__ void RopeKernel(float* q, int q_stride, float* k, int k_stride, const int32_t* positions,
                           int n_heads, int n_kv_heads, int head_dim, const float* cos_sin,
                           bool half_split) {
  const int r = blockIdx.x;
  const int half = head_dim / 2;
  const float* cs = cos_sin + static_cast<size_t>(positions[r]) * half * 2;
  const int pairs = (n_heads + n_kv_heads) * half;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int head = p / half, i = p % half;
    float* v = head < n_heads ? q + static_cast<size_t>(r) * q_stride + head * head_dim
                              : k + static_cast<size_t>(r) * k_stride + (head - n_heads) * head_dim;
    const float c = cs[2 * i], s = cs[2 * i + 1];
    // Pair i is (2i, 2i+1), or (i, i + half) for half-split checkpoints.
    const int ia = half_split ? i : 2 * i, ib = half_split ? i + half : 2 * i + 1;
    const float a = v[ia], b = v[ib];
    v[ia] = a * c - b * s;
    v[ib] = a * s + b * c;
  }
}

__global__ void AddBiasKernel(float* x, int stride, const float* bias, int rows, int n) {
  const size_t total = static_cast<size_t>(rows) * n;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[(i / n) * stride + i % n] += bias[i % n];
  }
}

__global__ void SwiGluKernel(const float* gate_up, float* out, int rows, int hidden) {
  const size_t total = static_cast<size_t>(rows) * hidden;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / hidden, c = i % hidden;
    const float g = gate_up[r * 2 * hidden + c];
    const float u = gate_up[r * 2 * hidden + hidden + c];
    out[i] = g / (1.0f + expf(-g)) * u;
  }
}

__global__ void WriteKvKernel(const float* k, int k_stride, const float* v, int v_stride,
                              const int32_t* meta, DeviceLayout layout, float* cache_layer) {
  const int r = blockIdx.x;
  const int pos = meta[2 * r];
  const int32_t block = meta[meta[2 * r + 1] + pos / layout.block_size];
  const int slot = pos % layout.block_size;
  // The block's layout: DeviceLayout::Block.
  float* base = cache_layer + static_cast<size_t>(block) * 2 * layout.block_size * layout.kv_dim;
  float* values = base + static_cast<size_t>(layout.block_size) * layout.kv_dim +
                  static_cast<size_t>(slot) * layout.kv_dim;
  const float* key = k + static_cast<size_t>(r) * k_stride;
  const float* value = v + static_cast<size_t>(r) * v_stride;
  for (int d = threadIdx.x; d < layout.kv_dim; d += blockDim.x) {
    base[static_cast<size_t>(d) * layout.block_size + slot] = key[d];
    values[d] = value[d];
  }
}

// Paged attention, one block per (row, KV head, context split): the block's
// warps share each tile of keys and values staged in shared memory (lane j
// of a warp scores slot j of the tile), and each warp keeps an online
// softmax (running max, sum and output; lane l accumulates dimensions l,
// l + 32, ...) for the query heads it owns, so scores never leave
// registers. With one split the block writes the
// normalised output; with several it writes its unnormalised partial
// (acc, max, sum) for CombineSplitsKernel, so that a long context is spread
// over many SMs (the split-context scheme of flash-decoding).
__global__ void __launch_bounds__(kAttnWarps* kWarp)
    PagedAttentionKernel(const float* __restrict__ q, int q_stride, const int32_t* __restrict__ meta,
                         DeviceLayout layout, int n_heads, int n_kv_heads, int head_dim,
                         float scale, int chunk, float* __restrict__ partials,
                         float* __restrict__ out) {
  extern __shared__ float shared[];
  const int group = n_heads / n_kv_heads;
  float* q_s = shared;                       // [group][head_dim], pre-scaled
  float* k_s = q_s + group * head_dim;       // [head_dim][kTileSlots]
  float* v_s = k_s + head_dim * kTileSlots;  // [kTileSlots][head_dim]
  __shared__ const float* slot_block[kTileSlots];
  __shared__ int slot_index[kTileSlots];

  const int r = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z;
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
    // Keys: element d of slot j sits at Block + d * bs + slot.
#pragma unroll 8
    for (int i = threadIdx.x; i < head_dim * kTileSlots; i += blockDim.x) {
      const int d = i / kTileSlots, j = i % kTileSlots;
      k_s[i] = j < n ? __ldg(slot_block[j] + static_cast<size_t>(kv_off + d) * bs + slot_index[j])
                     : 0.0f;
    }
    // Values: slot j's row of kv_dim floats sits after the block's keys.
#pragma unroll 8
    for (int i = threadIdx.x; i < n * head_dim; i += blockDim.x) {
      const int j = i / head_dim, d = i % head_dim;
      v_s[i] = __ldg(slot_block[j] + static_cast<size_t>(bs) * layout.kv_dim +
                     static_cast<size_t>(slot_index[j]) * layout.kv_dim + kv_off + d);
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kHeadsPerWarp; ++u) {
      const int hh = warp + u * kAttnWarps;
      if (hh >= group) break;
      const float* qh = q_s + hh * head_dim;
      float s = -FLT_MAX;
      if (lane < n) {
        s = 0.0f;
        for (int d = 0; d < head_dim; ++d) s += qh[d] * k_s[d * kTileSlots + lane];
      }
      const float m_new = fmaxf(m[u], WarpMax(s));
      const float correction = expf(m[u] - m_new);
      const float p = lane < n ? expf(s - m_new) : 0.0f;
      l[u] = l[u] * correction + WarpSum(p);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[u][i] *= correction;
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
                 ((static_cast<size_t>(r) * n_heads + head) * splits + split) * (head_dim + 2);
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
__global__ void CombineSplitsKernel(const float* __restrict__ partials, int n_heads, int head_dim,
                                    int splits, float* __restrict__ out) {
  const int r = blockIdx.x, head = blockIdx.y;
  const float* p = partials + (static_cast<size_t>(r) * n_heads + head) * splits * (head_dim + 2);
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

int ThreadsFor(int work) {
  int t = kWarp;
  while (t < work && t < 256) t *= 2;
  return t;
}

}  // namespace

cudaError_t LaunchEmbed(const float* table, const int32_t* ids, int rows, int dim, float* out) {
  if (rows <= 0) return cudaSuccess;
  EmbedKernel<<<rows, ThreadsFor(dim)>>>(table, ids, dim, out);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNorm(const float* x, const float* weight, float* out, int rows, int dim,
                          float eps) {
  if (rows <= 0) return cudaSuccess;
  RmsNormKernel<<<rows, kNormThreads>>>(x, weight, out, dim, eps);
  return cudaGetLastError();
}

cudaError_t LaunchRope(float* q, int q_stride, float* k, int k_stride, const int32_t* positions,
                       int rows, int n_heads, int n_kv_heads, int head_dim, const float* cos_sin,
                       bool half_split) {
  if (rows <= 0) return cudaSuccess;
  RopeKernel<<<rows, ThreadsFor((n_heads + n_kv_heads) * head_dim / 2)>>>(
      q, q_stride, k, k_stride, positions, n_heads, n_kv_heads, head_dim, cos_sin, half_split);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(float* x, int stride, const float* bias, int rows, int n) {
  const size_t total = static_cast<size_t>(rows) * n;
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const size_t blocks = (total + kThreads - 1) / kThreads;
  AddBiasKernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads>>>(x, stride,
                                                                                      bias, rows, n);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGlu(const float* gate_up, float* out, int rows, int hidden) {
  const size_t total = static_cast<size_t>(rows) * hidden;
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const size_t blocks = (total + kThreads - 1) / kThreads;
  SwiGluKernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads>>>(gate_up, out,
                                                                                     rows, hidden);
  return cudaGetLastError();
}

cudaError_t LaunchWriteKv(const float* k, int k_stride, const float* v, int v_stride,
                          const int32_t* rows_meta, int rows, int layer, const KvLayout& layout,
                          float* cache) {
  if (rows <= 0) return cudaSuccess;
  WriteKvKernel<<<rows, ThreadsFor(layout.kv_dim)>>>(k, k_stride, v, v_stride, rows_meta,
                                                     MakeLayout(layout, layer, cache),
                                                     cache + layer * layout.layer_elements());
  return cudaGetLastError();
}

AttentionPlan PlanPagedAttention(int rows, int max_context, int n_kv_heads, int head_dim,
                                 int n_heads, int sm_count) {
  AttentionPlan plan;
  plan.chunk = max_context;
  // Enough blocks to fill every SM a few times over without splitting:
  // prefill batches and large decode batches.
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

cudaError_t LaunchPagedAttention(const float* q, int q_stride, const int32_t* rows_meta, int rows,
                                 int layer, const KvLayout& layout, const float* cache, int n_heads,
                                 int n_kv_heads, int head_dim, const AttentionPlan& plan,
                                 float* partials, float* out) {
  if (rows <= 0) return cudaSuccess;
  const int group = n_heads / n_kv_heads;
  const size_t shared =
      sizeof(float) * (static_cast<size_t>(group) * head_dim + 2 * head_dim * kTileSlots);
  if (shared > 40 * 1024) {  // the static slot tables take the rest of the default 48 KiB
    const cudaError_t e =
        cudaFuncSetAttribute(PagedAttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(n_kv_heads),
                  static_cast<unsigned>(plan.splits));
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  PagedAttentionKernel<<<grid, kAttnWarps * kWarp, shared>>>(
      q, q_stride, rows_meta, MakeLayout(layout, layer, cache), n_heads, n_kv_heads, head_dim,
      scale, plan.chunk, partials, out);
  if (plan.splits == 1) return cudaGetLastError();
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const dim3 heads(static_cast<unsigned>(rows), static_cast<unsigned>(n_heads));
  CombineSplitsKernel<<<heads, ThreadsFor(head_dim)>>>(partials, n_heads, head_dim, plan.splits,
                                                      out);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
