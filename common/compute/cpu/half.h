// 16-bit float conversions for the CPU kernels, inline so that each
// target_clones variant vectorises them with its own instructions.
#ifndef TANDEM_COMMON_COMPUTE_CPU_HALF_H_
#define TANDEM_COMMON_COMPUTE_CPU_HALF_H_

#include <bit>
#include <cstdint>

namespace tandem::cpu {

// A bfloat16 as stored: the high half of a float.
struct Bf16 {
  uint16_t bits;
};

// IEEE binary16. GCC lowers conversions to F16C/AVX-512 instructions where
// the clone has them, to a library call otherwise.
using Fp16 = _Float16;

__attribute__((always_inline)) inline float ToFloat(float x) { return x; }
__attribute__((always_inline)) inline float ToFloat(Bf16 x) {
  return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16);
}
__attribute__((always_inline)) inline float ToFloat(Fp16 x) { return static_cast<float>(x); }
// An int8 KV cache's byte, before its scale.
__attribute__((always_inline)) inline float ToFloat(int8_t x) { return static_cast<float>(x); }

template <typename T>
T FromFloat(float x);
template <>
__attribute__((always_inline)) inline float FromFloat<float>(float x) {
  return x;
}
// Round to nearest even; NaN stays NaN (quiet).
template <>
__attribute__((always_inline)) inline Bf16 FromFloat<Bf16>(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return Bf16{static_cast<uint16_t>(nan ? (bits >> 16) | 0x40u : rounded)};
}
template <>
__attribute__((always_inline)) inline Fp16 FromFloat<Fp16>(float x) {
  return static_cast<Fp16>(x);
}

}  // namespace tandem::cpu

#endif  // TANDEM_COMMON_COMPUTE_CPU_HALF_H_
