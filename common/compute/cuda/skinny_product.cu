// The weight-streaming product for decode batches: out[m, n] = x[m, k]
// w[n, k]^T for a few rows m, with 16-bit x and w and f32 sums. One warp per
// output column reads that column's weights once, 16 bytes per lane per
// load with several loads in flight (the weights are read once per step, so
// they bypass L1), and applies each 8-element chunk to every row of x (the
// rows are small and stay in cache). cuBLAS's general products reach about
// two thirds of the copy bandwidth at these shapes; this is plain streaming.
#include <cstddef>
#include <cstdint>
#include <utility>

#include "common/compute/cuda/elements.cuh"
#include "common/compute/cuda/kernels.h"

namespace tandem::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 128;  // four columns per block
// 16-byte loads each lane keeps in flight.
constexpr int kUnroll = 4;

template <typename T, int M>
__device__ __forceinline__ void Accumulate(const uint4& wv, const uint4* __restrict__ x, int chunks,
                                           int c, float (&acc)[M]) {
  float w[8];
  Widen<T>(wv, w);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float xf[8];
    Widen<T>(__ldg(x + static_cast<size_t>(m) * chunks + c), xf);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[m] = fmaf(w[e], xf[e], acc[m]);
  }
}

// k is a multiple of 8 and x, w 16-byte aligned (LaunchSkinnyProduct checks).
template <typename T, int M>
__global__ void __launch_bounds__(kThreads)
    SkinnyProductKernel(const T* __restrict__ x, const T* __restrict__ w, float* __restrict__ out,
                        int n, int k, float beta) {
  const int column = blockIdx.x * (kThreads / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (column >= n) return;
  const int chunks = k / 8;
  const uint4* row = reinterpret_cast<const uint4*>(w) + static_cast<size_t>(column) * chunks;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  int c = lane;
  for (; c + (kUnroll - 1) * kWarp < chunks; c += kUnroll * kWarp) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(row + c + u * kWarp);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) Accumulate<T, M>(wv[u], xv, chunks, c + u * kWarp, acc);
  }
  for (; c < chunks; c += kWarp) Accumulate<T, M>(__ldcs(row + c), xv, chunks, c, acc);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float sum = acc[m];
    for (int o = kWarp / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == m) {
      float* at = out + static_cast<size_t>(m) * n + column;
      // beta 0 never reads out, which may hold anything (NaN included).
      *at = beta == 0.0f ? sum : sum + beta * *at;
    }
  }
}

template <typename T, int M>
cudaError_t Launch(const void* x, const void* w, float* out, int n, int k, float beta) {
  const unsigned blocks = static_cast<unsigned>((n + kThreads / kWarp - 1) / (kThreads / kWarp));
  SkinnyProductKernel<T, M>
      <<<blocks, kThreads>>>(static_cast<const T*>(x), static_cast<const T*>(w), out, n, k, beta);
  return cudaGetLastError();
}

// Launch<T, m> for the m of 1 to kMaxSkinnyRows given at run time.
template <typename T, int... Rows>
cudaError_t LaunchRows(std::integer_sequence<int, Rows...>, const void* x, const void* w,
                       float* out, int m, int n, int k, float beta) {
  cudaError_t result = cudaErrorInvalidValue;
  ((m == Rows + 1 && (result = Launch<T, Rows + 1>(x, w, out, n, k, beta), true)) || ...);
  return result;
}

}  // namespace

bool SkinnyProductApplies(DType dtype, const void* x, const void* w, int m, int k) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return (dtype == DType::kBF16 || dtype == DType::kF16) && m >= 1 && m <= kMaxSkinnyRows &&
         k > 0 && k % 8 == 0 && aligned(x) && aligned(w);
}

cudaError_t LaunchSkinnyProduct(const void* x, const void* w, DType dtype, float* out, int m, int n,
                                int k, float beta) {
  if (n <= 0) return cudaSuccess;
  if (!SkinnyProductApplies(dtype, x, w, m, k)) return cudaErrorInvalidValue;
  constexpr auto kRows = std::make_integer_sequence<int, kMaxSkinnyRows>();
  return dtype == DType::kBF16 ? LaunchRows<Bf16>(kRows, x, w, out, m, n, k, beta)
                               : LaunchRows<F16>(kRows, x, w, out, m, n, k, beta);
}

}  // namespace tandem::cuda
