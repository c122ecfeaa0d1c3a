// Element-wise and row kernels of the CUDA backend; attention is in
// attention.cu.
#include <cfloat>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/compute/cuda/elements.cuh"
#include "common/compute/cuda/kernels.h"
#include "common/kvcache/int8_kv.h"

namespace tandem::cuda {
namespace {

constexpr int kWarp = 32;

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

int ThreadsFor(int work) {
  int t = kWarp;
  while (t < work && t < 256) t *= 2;
  return t;
}

// Blocks of `threads` for a grid-stride loop over `work` items.
unsigned GridFor(size_t work, int threads) {
  const size_t blocks = (work + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

// Four floats at a time where x is 16-byte aligned (then n4 = n / 4), the
// rest one by one.
template <typename T>
__global__ void NarrowKernel(const float* __restrict__ x, T* __restrict__ out, size_t n,
                             size_t n4) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  for (size_t i = first; i < n4; i += stride) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(x) + i);
    out[4 * i] = FromFloat<T>(v.x);
    out[4 * i + 1] = FromFloat<T>(v.y);
    out[4 * i + 2] = FromFloat<T>(v.z);
    out[4 * i + 3] = FromFloat<T>(v.w);
  }
  for (size_t i = 4 * n4 + first; i < n; i += stride) out[i] = FromFloat<T>(x[i]);
}

template <typename T>
__global__ void FillRandomKernel(T* out, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    // A 32-bit integer hash of (i, seed).
    uint32_t h = static_cast<uint32_t>(i) * 0x9e3779b9u ^ static_cast<uint32_t>(i >> 32) ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    out[i] = FromFloat<T>(static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

__global__ void NoopKernel() {}

template <typename T>
__global__ void EmbedKernel(const T* table, const int32_t* ids, int dim, float* out) {
  const int r = blockIdx.x;
  const T* src = table + static_cast<size_t>(ids[r]) * dim;
  float* dst = out + static_cast<size_t>(r) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = ToFloat(src[i]);
}

constexpr int kNormThreads = 256;

// One block per group of `dim` values: block b normalises group b % heads
// of row b / heads (rows x_stride / out_stride apart). In place is safe:
// each thread writes only what it read after the block's sum.
__global__ void RmsNormKernel(const float* x, int x_stride, const float* weight, float* out,
                              int out_stride, int heads, int dim, float eps) {
  __shared__ float partial[kNormThreads / kWarp];
  __shared__ float scale;
  const int r = blockIdx.x / heads;
  const int g = blockIdx.x % heads;
  const float* row = x + static_cast<size_t>(r) * x_stride + static_cast<size_t>(g) * dim;
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
  float* dst = out + static_cast<size_t>(r) * out_stride + static_cast<size_t>(g) * dim;
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

__global__ void GatherRowsKernel(const float* src, const int32_t* rows, int count, int n,
                                 float* dst) {
  const size_t total = static_cast<size_t>(count) * n;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[static_cast<size_t>(rows[i / n]) * n + i % n];
  }
}

// Rows are distinct, so no two threads add to one element.
__global__ void ScatterAddRowsKernel(const float* src, const int32_t* rows, const float* weights,
                                     int count, int n, float* dst) {
  const size_t total = static_cast<size_t>(count) * n;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / n;
    dst[static_cast<size_t>(rows[r]) * n + i % n] += weights[r] * src[i];
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

template <typename T>
__global__ void WriteKvKernel(const float* k, int k_stride, const float* v, int v_stride,
                              const int32_t* meta, DeviceLayout<T> layout) {
  const int r = blockIdx.x;
  const int pos = meta[2 * r];
  const int bs = layout.block_size, kv_dim = layout.kv_dim;
  const int32_t block = meta[meta[2 * r + 1] + pos / bs];
  const int slot = pos % bs;
  T* base = const_cast<T*>(layout.Block(block));
  T* values = base + static_cast<size_t>(bs) * kv_dim + static_cast<size_t>(slot) * kv_dim;
  const float* key = k + static_cast<size_t>(r) * k_stride;
  const float* value = v + static_cast<size_t>(r) * v_stride;
  for (int d = threadIdx.x; d < kv_dim; d += blockDim.x) {
    base[static_cast<size_t>(d) * bs + slot] = FromFloat<T>(key[d]);
    values[d] = FromFloat<T>(value[d]);
  }
}

// The scale of one token's KV head (head_dim values at x) into *scale, and
// the values rounded with it to bytes `stride` apart at dst, by one warp:
// int8_kv.h's rounding, as the CPU backend's QuantizeInt8 rounds.
__device__ void QuantizeHead(const float* x, int head_dim, int8_t* dst, size_t stride,
                             float* scale) {
  const int lane = threadIdx.x;
  float amax = 0.0f;
  bool finite = true;
  for (int d = lane; d < head_dim; d += kWarp) {
    finite = finite && isfinite(x[d]);
    amax = fmaxf(amax, fabsf(x[d]));
  }
  for (int o = kWarp / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  finite = __all_sync(0xffffffffu, finite);
  if (!finite) {
    for (int d = lane; d < head_dim; d += kWarp) dst[d * stride] = 0;
    if (lane == 0) *scale = __int_as_float(0x7fc00000);  // a quiet NaN
    return;
  }
  const float inverse = Int8KvInverse(amax);
  for (int d = lane; d < head_dim; d += kWarp) dst[d * stride] = Int8KvRound(x[d], inverse);
  if (lane == 0) *scale = Int8KvScale(amax);
}

// WriteKv for an int8 cache: one warp per (row, KV head).
__global__ void WriteKvInt8Kernel(const float* k, int k_stride, const float* v, int v_stride,
                                  const int32_t* meta, DeviceLayout<int8_t> layout) {
  const int r = blockIdx.x, head = blockIdx.y;
  const int pos = meta[2 * r];
  const int bs = layout.block_size, kv_dim = layout.kv_dim;
  const int head_dim = kv_dim / layout.kv_heads;
  const int32_t block = meta[meta[2 * r + 1] + pos / bs];
  const int slot = pos % bs;
  int8_t* base = const_cast<int8_t*>(layout.Block(block));
  const size_t off = static_cast<size_t>(head) * head_dim;
  QuantizeHead(k + static_cast<size_t>(r) * k_stride + off, head_dim, base + off * bs + slot, bs,
               const_cast<float*>(layout.KeyScales(base, head)) + slot);
  QuantizeHead(v + static_cast<size_t>(r) * v_stride + off, head_dim,
               base + static_cast<size_t>(bs) * kv_dim + static_cast<size_t>(slot) * kv_dim + off,
               1, const_cast<float*>(layout.ValueScales(base, head)) + slot);
}

// Whether (v, i) goes before (best, at) in Backend::Argmax's order: larger
// first, a number before NaN, and the lower index among equals.
__device__ __forceinline__ bool Before(float v, int i, float best, int at) {
  const bool v_nan = isnan(v), best_nan = isnan(best);
  if (v_nan != best_nan) return best_nan;
  if (!v_nan && v != best) return v > best;
  return i < at;
}

constexpr int kArgmaxThreads = 512;

__global__ void ArgmaxKernel(const float* x, int n, int32_t* out) {
  __shared__ float values[kArgmaxThreads / kWarp];
  __shared__ int indices[kArgmaxThreads / kWarp];
  const float* row = x + static_cast<size_t>(blockIdx.x) * n;
  float best = __int_as_float(0x7fc00000);  // NaN: anything goes before it
  int at = INT_MAX;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = row[i];
    if (Before(v, i, best, at)) best = v, at = i;
  }
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int i = __shfl_xor_sync(0xffffffffu, at, o);
    if (Before(v, i, best, at)) best = v, at = i;
  }
  const int warp = threadIdx.x / kWarp;
  if (threadIdx.x % kWarp == 0) values[warp] = best, indices[warp] = at;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / kWarp; ++w) {
      if (Before(values[w], indices[w], best, at)) best = values[w], at = indices[w];
    }
    out[blockIdx.x] = at == INT_MAX ? 0 : at;
  }
}

}  // namespace

cudaError_t LaunchNarrow(const float* x, DType dtype, void* out, size_t n) {
  if (n == 0) return cudaSuccess;
  const size_t n4 = reinterpret_cast<uintptr_t>(x) % 16 == 0 ? n / 4 : 0;
  constexpr int kThreads = 256;
  return WithElement(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    NarrowKernel<T>
        <<<GridFor(n4 > 0 ? n4 : n, kThreads), kThreads>>>(x, static_cast<T*>(out), n, n4);
    return cudaGetLastError();
  });
}

cudaError_t LaunchFillRandom(void* data, DType dtype, size_t n, uint32_t seed) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  return WithElement(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    FillRandomKernel<T><<<GridFor(n, kThreads), kThreads>>>(static_cast<T*>(data), n, seed);
    return cudaGetLastError();
  });
}

cudaError_t LaunchFaultyKernel() {
  NoopKernel<<<1, 4096>>>();  // more threads than any block may have
  return cudaGetLastError();
}

cudaError_t LaunchEmbed(const void* table, DType dtype, const int32_t* ids, int rows, int dim,
                        float* out) {
  if (rows <= 0) return cudaSuccess;
  return WithElement(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    EmbedKernel<T><<<rows, ThreadsFor(dim)>>>(static_cast<const T*>(table), ids, dim, out);
    return cudaGetLastError();
  });
}

cudaError_t LaunchRmsNorm(const float* x, const float* weight, float* out, int rows, int dim,
                          float eps) {
  if (rows <= 0) return cudaSuccess;
  RmsNormKernel<<<rows, kNormThreads>>>(x, dim, weight, out, dim, 1, dim, eps);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormHeads(float* x, int stride, const float* weight, int rows, int heads,
                               int head_dim, float eps) {
  if (rows <= 0 || heads <= 0) return cudaSuccess;
  const int64_t blocks = int64_t{rows} * heads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  // A head of 64 or 128 values leaves most of 256 threads idle.
  const int threads = head_dim <= 128 ? 128 : kNormThreads;
  RmsNormKernel<<<static_cast<unsigned>(blocks), threads>>>(x, stride, weight, x, stride, heads,
                                                            head_dim, eps);
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
  AddBiasKernel<<<GridFor(total, kThreads), kThreads>>>(x, stride, bias, rows, n);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const float* src, const int32_t* rows, int count, int n, float* dst) {
  const size_t total = static_cast<size_t>(count) * n;
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  GatherRowsKernel<<<GridFor(total, kThreads), kThreads>>>(src, rows, count, n, dst);
  return cudaGetLastError();
}

cudaError_t LaunchScatterAddRows(const float* src, const int32_t* rows, const float* weights,
                                 int count, int n, float* dst) {
  const size_t total = static_cast<size_t>(count) * n;
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  ScatterAddRowsKernel<<<GridFor(total, kThreads), kThreads>>>(src, rows, weights, count, n, dst);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGlu(const float* gate_up, float* out, int rows, int hidden) {
  const size_t total = static_cast<size_t>(rows) * hidden;
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  SwiGluKernel<<<GridFor(total, kThreads), kThreads>>>(gate_up, out, rows, hidden);
  return cudaGetLastError();
}

cudaError_t LaunchArgmax(const float* x, int rows, int n, int32_t* out) {
  if (rows <= 0) return cudaSuccess;
  ArgmaxKernel<<<rows, kArgmaxThreads>>>(x, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchWriteKv(const float* k, int k_stride, const float* v, int v_stride,
                          const int32_t* rows_meta, int rows, int layer, const KvLayout& layout,
                          void* cache) {
  if (rows <= 0) return cudaSuccess;
  if (layout.dtype == DType::kI8) {
    if (layout.kv_heads <= 0 || layout.kv_dim % layout.kv_heads != 0) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(layout.kv_heads));
    WriteKvInt8Kernel<<<grid, kWarp>>>(k, k_stride, v, v_stride, rows_meta,
                                       MakeDeviceLayout<int8_t>(layout, layer, cache));
    return cudaGetLastError();
  }
  return WithElement(layout.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    WriteKvKernel<T><<<rows, ThreadsFor(layout.kv_dim)>>>(
        k, k_stride, v, v_stride, rows_meta, MakeDeviceLayout<T>(layout, layer, cache));
    return cudaGetLastError();
  });
}

}  // namespace tandem::cuda
