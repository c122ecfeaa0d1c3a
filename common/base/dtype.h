// Element types of weights and KV cache buffers. Header-only so that any
// target can name a type without depending on the model library.
#ifndef TANDEM_COMMON_BASE_DTYPE_H_
#define TANDEM_COMMON_BASE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tandem {

// Element types, then GGUF's block-quantized weight types (common/base/
// quant_blocks.h has their layouts): a block of 32 or 256 weights stored
// as small integers with shared scales. Quantized types are for weight
// matrices only, never for a KV cache or an activation. kI8 is the 8-bit
// KV cache's type: one signed byte per value, with an f32 scale per token
// and KV head kept in the same block (common/kvcache/kv_layout.h); never a
// weight type. kQ8_0R16 is Q8_0 as the CPU backend repacks it in memory for
// its products (common/compute/cpu/quant_repack.h): the same bytes per row,
// 16 rows interleaved; never in a file.
enum class DType : uint8_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kQ8_0 = 3,
  kQ4_0 = 4,
  kQ4_K = 5,
  kQ5_K = 6,
  kQ6_K = 7,
  kI8 = 8,
  kQ8_0R16 = 9,
  kQ5_0 = 10,
  kQ5_1 = 11,
};

inline bool IsQuantized(DType dtype) {
  const auto v = static_cast<uint8_t>(dtype);
  return (v >= 3 && v <= 7) || (v >= 9 && v <= 11);
}

// Elements per block: 1 for element types, 32 or 256 for quantized ones.
inline int DTypeBlockElements(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0:
    case DType::kQ8_0R16:
    case DType::kQ4_0:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return 32;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return 256;
    default:
      return 1;
  }
}

// Bytes per block (per element for element types).
inline size_t DTypeBlockBytes(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kQ8_0:
    case DType::kQ8_0R16:
      return 34;
    case DType::kQ4_0:
      return 18;
    case DType::kQ5_0:
      return 22;
    case DType::kQ5_1:
      return 24;
    case DType::kQ4_K:
      return 144;
    case DType::kQ5_K:
      return 176;
    case DType::kQ6_K:
      return 210;
    case DType::kI8:
      return 1;
  }
  return 0;
}

// Bytes per element of an element type: 4 for kF32, 2 for kF16 and kBF16,
// 1 for kI8 (its scales are counted by the KV layout); 0 for a quantized
// type, which has no whole bytes per element (use DTypeBytes).
inline size_t DTypeSize(DType dtype) { return IsQuantized(dtype) ? 0 : DTypeBlockBytes(dtype); }

// Bytes of `elements` consecutive elements, a whole number of blocks.
inline size_t DTypeBytes(DType dtype, int64_t elements) {
  return static_cast<size_t>(elements / DTypeBlockElements(dtype)) * DTypeBlockBytes(dtype);
}

// "f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "q5_1", "q4_k", "q5_k",
// "q6_k", "int8" or "q8_0_r16"; "unknown" for a value outside the enum.
inline std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kQ8_0:
      return "q8_0";
    case DType::kQ4_0:
      return "q4_0";
    case DType::kQ5_0:
      return "q5_0";
    case DType::kQ5_1:
      return "q5_1";
    case DType::kQ4_K:
      return "q4_k";
    case DType::kQ5_K:
      return "q5_k";
    case DType::kQ6_K:
      return "q6_k";
    case DType::kI8:
      return "int8";
    case DType::kQ8_0R16:
      return "q8_0_r16";
  }
  return "unknown";
}

// Inverse of DTypeName for the element types (lower case only): what a KV
// cache or a converted checkpoint can be. INVALID_ARGUMENT lists the valid
// names.
inline absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (name == DTypeName(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", std::string(name), "\"; valid: f32, f16, bf16"));
}

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_DTYPE_H_
