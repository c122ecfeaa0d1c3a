// Element types of the CUDA kernels: f32, and bf16 and f16 held as bit
// patterns, with the conversions of the CPU backend (cpu/half.h: round to
// nearest even) and 16-byte vector loads. Included by the .cu files only.
#ifndef TANDEM_COMMON_COMPUTE_CUDA_ELEMENTS_CUH_
#define TANDEM_COMMON_COMPUTE_CUDA_ELEMENTS_CUH_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/base/dtype.h"
#include "common/compute/cuda/device_layout.h"

namespace tandem::cuda {

struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(Bf16 x) {
  return __uint_as_float(static_cast<uint32_t>(x.bits) << 16);
}
__device__ __forceinline__ float ToFloat(F16 x) { return __half2float(__ushort_as_half(x.bits)); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
// As the CPU backend rounds: nearest even, NaN stays a (quiet) NaN.
template <>
__device__ __forceinline__ Bf16 FromFloat<Bf16>(float x) {
  const uint32_t bits = __float_as_uint(x);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return Bf16{static_cast<uint16_t>(nan ? (bits >> 16) | 0x40u : rounded)};
}
template <>
__device__ __forceinline__ F16 FromFloat<F16>(float x) {
  return F16{__half_as_ushort(__float2half_rn(x))};
}

// Elements in 16 bytes.
template <typename T>
inline constexpr int kVec = static_cast<int>(16 / sizeof(T));

// The 16 bytes at `p` (16-byte aligned, read-only for the kernel's life),
// widened.
__device__ __forceinline__ void LoadVec(const float* p, float (&out)[4]) {
  const float4 v = __ldg(reinterpret_cast<const float4*>(p));
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}
// 16 bytes of 16-bit elements of type T (Bf16 or F16), widened.
template <typename T>
__device__ __forceinline__ void Widen(const uint4& v, float (&out)[8]);
template <>
__device__ __forceinline__ void Widen<Bf16>(const uint4& v, float (&out)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}
template <>
__device__ __forceinline__ void Widen<F16>(const uint4& v, float (&out)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __half2float(__ushort_as_half(static_cast<uint16_t>(words[i] & 0xffffu)));
    out[2 * i + 1] = __half2float(__ushort_as_half(static_cast<uint16_t>(words[i] >> 16)));
  }
}
__device__ __forceinline__ void LoadVec(const Bf16* p, float (&out)[8]) {
  Widen<Bf16>(__ldg(reinterpret_cast<const uint4*>(p)), out);
}
__device__ __forceinline__ void LoadVec(const F16* p, float (&out)[8]) {
  Widen<F16>(__ldg(reinterpret_cast<const uint4*>(p)), out);
}

// Stores n floats (a multiple of 4) at 16-byte aligned shared memory.
template <int N>
__device__ __forceinline__ void StoreFloats(float* dst, const float (&src)[N]) {
  static_assert(N % 4 == 0);
#pragma unroll
  for (int i = 0; i < N; i += 4) {
    *reinterpret_cast<float4*>(dst + i) = make_float4(src[i], src[i + 1], src[i + 2], src[i + 3]);
  }
}

// Calls f with a null pointer of `dtype`'s storage type: the launchers'
// dispatch to a kernel template.
template <typename F>
cudaError_t WithElement(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(static_cast<float*>(nullptr));
    case DType::kBF16:
      return f(static_cast<Bf16*>(nullptr));
    case DType::kF16:
      return f(static_cast<F16*>(nullptr));
    default:  // quantized weights are widened before they reach a kernel
      break;
  }
  return cudaErrorInvalidValue;
}

// The same for a KV cache's type, which may also be int8 (bytes with a
// scale per token and KV head: DeviceLayout).
template <typename F>
cudaError_t WithKvElement(DType dtype, F&& f) {
  if (dtype == DType::kI8) return f(static_cast<int8_t*>(nullptr));
  return WithElement(dtype, static_cast<F&&>(f));
}

}  // namespace tandem::cuda

#endif  // TANDEM_COMMON_COMPUTE_CUDA_ELEMENTS_CUH_
