// FP8 E4M3 weights ("OCP FP8 E4M3FN", CUDA's __NV_E4M3): 1 sign bit, 4
// exponent bits with bias 7, 3 mantissa bits. There are no infinities; the
// codes 0x7F and 0xFF are NaN, so the largest finite magnitude is 0x7E =
// 1.75 * 2^8 = 448. Exponent field 0 holds zero and the subnormals, m * 2^-9
// for m in 1..7; the smallest normal is 2^-6.
//
// The two element conversions are inline and, compiled by nvcc, also
// __host__ __device__, so kernels and host code convert alike; with a C++20
// host compiler they are constexpr as well. The CPU build needs nothing from
// CUDA. FloatToFp8E4M3 matches CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) bit for bit
// (tests/unit/base/fp8_reference_test.cc checks every float against the
// toolkit's host code). On sm_89+ devices CUDA's call is the instruction
// cvt.rn.satfinite.e4m3x2.f32 instead, which PTX specifies the same way;
// that path has not been compared here (no GPU).
//
// Quantized weights carry f32 scales: value = Fp8E4M3ToFloat(code) * scale,
// one scale per output channel (row), one per tensor, or one per block of
// rows x columns (DeepSeek-V3's 128 x 128).
#ifndef TANDEM_COMMON_BASE_FP8_H_
#define TANDEM_COMMON_BASE_FP8_H_

#include <cstdint>
#include <cstring>
#include <version>

#include "common/base/host_device.h"

// The quantization half is host code with Abseil types, left out of nvcc
// compiles so that kernels can include this header without Abseil.
#if !defined(__CUDACC__)
#include <array>
#include <vector>

#include "absl/status/statusor.h"
#endif

#if defined(__cpp_lib_bit_cast) && !defined(__CUDACC__)
#include <bit>
#endif

// constexpr only where the bit casts below are (a C++20 host compile).
#if !defined(__CUDACC__) && defined(__cpp_lib_bit_cast)
#define TANDEM_FP8_CONSTEXPR constexpr
#else
#define TANDEM_FP8_CONSTEXPR
#endif

namespace tandem {

inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr uint8_t kFp8E4M3NaN = 0x7F;

namespace fp8_internal {

TANDEM_HOST_DEVICE inline TANDEM_FP8_CONSTEXPR uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#elif defined(__cpp_lib_bit_cast) && !defined(__CUDACC__)
  return std::bit_cast<uint32_t>(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
#endif
}

TANDEM_HOST_DEVICE inline TANDEM_FP8_CONSTEXPR float BitsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#elif defined(__cpp_lib_bit_cast) && !defined(__CUDACC__)
  return std::bit_cast<float>(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

}  // namespace fp8_internal

// The exact value of an E4M3 code. Both NaN codes give a positive quiet NaN
// (CUDA's decoding drops the sign of a NaN too); 0x80 gives -0.0f.
TANDEM_HOST_DEVICE inline TANDEM_FP8_CONSTEXPR float Fp8E4M3ToFloat(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t exponent = (code >> 3) & 0xF;
  const uint32_t mantissa = code & 0x7;
  if ((code & 0x7F) == 0x7F) return fp8_internal::BitsFloat(0x7FC00000u);
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-9, exact in f32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-9f;
    return fp8_internal::BitsFloat(sign | fp8_internal::FloatBits(magnitude));
  }
  // Normal: re-bias the exponent (7 -> 127) and widen the mantissa (3 -> 23).
  return fp8_internal::BitsFloat(sign | (exponent + 127 - 7) << 23 | mantissa << 20);
}

// Rounds to the nearest E4M3 value, ties to even, as CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) does:
//  - finite magnitudes above 448 and infinities saturate to +-448 (0x7E /
//    0xFE); 464, halfway from 448 to the non-existent 480, rounds to even,
//    which is 448 as well;
//  - magnitudes up to 2^-10 (half the smallest subnormal) become a signed
//    zero, so f32 subnormals all do;
//  - any NaN becomes 0x7F whatever its sign (CUDA's host code makes every
//    NaN the positive 0x7FFFFFFF before converting).
TANDEM_HOST_DEVICE inline TANDEM_FP8_CONSTEXPR uint8_t FloatToFp8E4M3(float f) {
  const uint32_t bits = fp8_internal::FloatBits(f);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return kFp8E4M3NaN;
  // Above 464 (0x43E80000) everything, infinity included, saturates.
  if (magnitude > 0x43E80000u) return static_cast<uint8_t>(sign | 0x7E);
  // Up to 2^-10 (0x3A800000) the nearest value is zero (2^-10 is a tie
  // between 0 and 2^-9; zero is even).
  if (magnitude <= 0x3A800000u) return sign;
  const int exponent = static_cast<int>(magnitude >> 23) - 127;
  // The 24-bit significand with its leading one, and how many of its low
  // bits fall below the E4M3 quantum: 2^(exponent - 3) for normals, 2^-9
  // for subnormals (exponent < -6).
  const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  const int dropped = exponent >= -6 ? 20 : 20 + (-6 - exponent);
  const uint32_t kept = significand >> dropped;
  const uint32_t rest = significand & ((1u << dropped) - 1);
  const uint32_t half = 1u << (dropped - 1);
  // Normals: the biased exponent above the 3 mantissa bits; the leading one
  // of `kept` (bit 3) adds 1 to the field, hence exponent + 6 rather than
  // + 7. Subnormals: `kept` is the mantissa, the field stays 0. A carry out
  // of the mantissa while rounding moves to the next binade, which is what
  // rounding up to it means (and 2^-9 * 8 becomes the smallest normal).
  uint32_t code = exponent >= -6 ? (static_cast<uint32_t>(exponent + 6) << 3) + kept : kept;
  if (rest > half || (rest == half && (code & 1))) ++code;
  return sign | static_cast<uint8_t>(code);
}

#if !defined(__CUDACC__)

// All 256 decoded values, indexed by code (NaN at 0x7F and 0xFF).
const std::array<float, 256>& Fp8E4M3Table();

// E4M3 weights with f32 scales. `codes` is rows x cols, row-major, the
// layout of a weight matrix in common/model: a row is one output channel
// (out_features x in_features, as in safetensors checkpoints). Each scale
// covers a block of block_rows x block_cols elements; the blocks tile the
// matrix row-major, ceil(rows / block_rows) x ceil(cols / block_cols) of
// them, the last of each row and column cut short where the size is not a
// multiple. Per channel is 1 x cols, per tensor rows x cols. The value of
// element (r, c) is Fp8E4M3ToFloat(codes[r * cols + c]) * scale_at(r, c).
struct Fp8Quantized {
  int rows = 0;
  int cols = 0;
  int block_rows = 1;
  int block_cols = 1;
  std::vector<uint8_t> codes;
  std::vector<float> scales;

  // Blocks in a row of blocks.
  int grid_cols() const { return (cols + block_cols - 1) / block_cols; }
  float scale_at(int r, int c) const {
    return scales[static_cast<size_t>(r / block_rows) * grid_cols() + c / block_cols];
  }
};

// The scale of a block whose largest magnitude is `amax`: amax / 448, so the
// largest element maps to (about) 448 and uses the whole range. An all-zero
// block gets 1 (its codes are zeros, dequantized exactly); so does one whose
// amax / 448 underflows to zero (amax below 224 * 2^-149), whose elements
// then quantize to zeros.
float Fp8ScaleForAmax(float amax);

// Quantizes rows x cols row-major f32 weights: q = FloatToFp8E4M3(w / scale)
// with one scale per row (PerChannel), one for the tensor (PerTensor) or one
// per block_rows x block_cols block (PerBlock), each Fp8ScaleForAmax of its
// block. A NaN or infinite weight is refused with INVALID_ARGUMENT naming
// its row and column; so are negative sizes and blocks smaller than 1 x 1.
// Each dequantized value is within half an E4M3 quantum of w / scale, times
// scale (plus f32 rounding).
absl::StatusOr<Fp8Quantized> QuantizeFp8PerChannel(const float* w, int rows, int cols);
absl::StatusOr<Fp8Quantized> QuantizeFp8PerTensor(const float* w, int rows, int cols);
absl::StatusOr<Fp8Quantized> QuantizeFp8PerBlock(const float* w, int rows, int cols, int block_rows,
                                                 int block_cols);

// Writes the rows x cols values of `q` to `out` (row-major). A NaN code
// dequantizes to NaN.
void DequantizeFp8(const Fp8Quantized& q, float* out);

#endif  // !defined(__CUDACC__)

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_FP8_H_
