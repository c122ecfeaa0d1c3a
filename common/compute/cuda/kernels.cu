#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "common/compute/cuda/kernels.h"

namespace tandem::cuda {
namespace {

constexpr int kWarp = 32;
// Slots of one attention tile: keys and values of this many cached tokens
// of one KV head are staged in shared memory at a time.
constexpr int kTileSlots = 32;

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

  __device__ const float* Block(int32_t block) const {
    return layer_base + static_cast<size_t>(block) * 2 * block_size * kv_dim;
  }
  // Element `dim` of every slot's key: block_size consecutive floats.
  __device__ const float* Keys(int32_t block, int dim) const {
    return Block(block) + static_cast<size_t>(dim) * block_size;
  }
  __device__ const float* Value(int32_t block, int slot) const {
    return Block(block) + static_cast<size_t>(block_size) * kv_dim +
           static_cast<size_t>(slot) * kv_dim;
  }
};

DeviceLayout MakeLayout(const KvLayout& layout, int layer, const float* cache) {
  return DeviceLayout{layout.block_size, layout.kv_dim, cache + layer * layout.layer_floats()};
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
                           int n_heads, int n_kv_heads, int head_dim, const float* cos_sin) {
  const int r = blockIdx.x;
  const int half = head_dim / 2;
  const float* cs = cos_sin + static_cast<size_t>(positions[r]) * half * 2;
  const int pairs = (n_heads + n_kv_heads) * half;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int head = p / half, i = p % half;
    float* v = head < n_heads ? q + static_cast<size_t>(r) * q_stride + head * head_dim
                              : k + static_cast<size_t>(r) * k_stride + (head - n_heads) * head_dim;
    const float c = cs[2 * i], s = cs[2 * i + 1];
    const float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * c - b * s;
    v[2 * i + 1] = a * s + b * c;
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
  // Writable views of the (const) layout helpers.
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

// One thread block per (row, KV head); one warp per query head of the
// group. Keys and values of kTileSlots cached tokens at a time go through
// shared memory; each warp keeps a running max, sum and output (online
// softmax), so scores never leave registers. Lane j scores slot j of the
// tile; lane l accumulates dimensions l, l + 32, ... of the output.
__global__ void PagedAttentionKernel(const float* q, int q_stride, const int32_t* meta,
                                     DeviceLayout layout, int n_heads, int n_kv_heads, int head_dim,
                                     float scale, float* out) {
  extern __shared__ float shared[];
  const int group = n_heads / n_kv_heads;
  float* q_s = shared;                       // [group][head_dim], pre-scaled
  float* k_s = q_s + group * head_dim;       // [head_dim][kTileSlots]
  float* v_s = k_s + head_dim * kTileSlots;  // [kTileSlots][head_dim]

  const int r = blockIdx.x, kv_head = blockIdx.y;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int pos = meta[2 * r];
  const int32_t* blocks = meta + meta[2 * r + 1];
  const int ctx = pos + 1;
  const int kv_off = kv_head * head_dim;
  const int head0 = kv_head * group;

  const float* q_row =
      q + static_cast<size_t>(r) * q_stride + static_cast<size_t>(head0) * head_dim;
  for (int i = threadIdx.x; i < group * head_dim; i += blockDim.x) q_s[i] = q_row[i] * scale;

  constexpr int kPerLane = kMaxHeadDim / kWarp;
  float acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
  float m = -FLT_MAX, l = 0.0f;

  const int bs = layout.block_size;
  for (int t0 = 0; t0 < ctx;) {
    const int b = t0 / bs, s0 = t0 % bs;
    const int n = min(kTileSlots, min(bs - s0, ctx - t0));
    const int32_t block = blocks[b];
    __syncthreads();  // the previous tile is consumed (and q_s written)
    for (int i = threadIdx.x; i < head_dim * n; i += blockDim.x) {
      const int d = i / n, j = i % n;
      k_s[d * kTileSlots + j] = layout.Keys(block, kv_off + d)[s0 + j];
    }
    for (int i = threadIdx.x; i < n * head_dim; i += blockDim.x) {
      const int j = i / head_dim, d = i % head_dim;
      v_s[j * head_dim + d] = layout.Value(block, s0 + j)[kv_off + d];
    }
    __syncthreads();
    if (warp < group) {
      const float* qh = q_s + warp * head_dim;
      float s = -FLT_MAX;
      if (lane < n) {
        s = 0.0f;
        for (int d = 0; d < head_dim; ++d) s += qh[d] * k_s[d * kTileSlots + lane];
      }
      const float m_new = fmaxf(m, WarpMax(s));
      const float correction = expf(m - m_new);
      const float p = lane < n ? expf(s - m_new) : 0.0f;
      l = l * correction + WarpSum(p);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[i] *= correction;
      for (int j = 0; j < n; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        const float* vj = v_s + j * head_dim;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const int d = lane + i * kWarp;
          if (d < head_dim) acc[i] += pj * vj[d];
        }
      }
      m = m_new;
    }
    t0 += n;
  }
  if (warp < group) {
    const float inv = 1.0f / l;
    float* o = out + static_cast<size_t>(r) * n_heads * head_dim +
               static_cast<size_t>(head0 + warp) * head_dim;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + i * kWarp;
      if (d < head_dim) o[d] = acc[i] * inv;
    }
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
                       int rows, int n_heads, int n_kv_heads, int head_dim, const float* cos_sin) {
  if (rows <= 0) return cudaSuccess;
  RopeKernel<<<rows, ThreadsFor((n_heads + n_kv_heads) * head_dim / 2)>>>(
      q, q_stride, k, k_stride, positions, n_heads, n_kv_heads, head_dim, cos_sin);
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
                                                     cache + layer * layout.layer_floats());
  return cudaGetLastError();
}

cudaError_t LaunchPagedAttention(const float* q, int q_stride, const int32_t* rows_meta, int rows,
                                 int layer, const KvLayout& layout, const float* cache, int n_heads,
                                 int n_kv_heads, int head_dim, float* out) {
  if (rows <= 0) return cudaSuccess;
  const int group = n_heads / n_kv_heads;
  const size_t shared =
      sizeof(float) * (static_cast<size_t>(group) * head_dim + 2 * head_dim * kTileSlots);
  if (shared > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(PagedAttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(n_kv_heads));
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  PagedAttentionKernel<<<grid, group * kWarp, shared>>>(q, q_stride, rows_meta,
                                                        MakeLayout(layout, layer, cache), n_heads,
                                                        n_kv_heads, head_dim, scale, out);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
