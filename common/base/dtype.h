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

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Bytes per element: 4 for kF32, 2 for kF16 and kBF16.
inline size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  return 0;
}

// "f32", "f16" or "bf16"; "unknown" for a value outside the enum.
inline std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

// Inverse of DTypeName (lower case only). INVALID_ARGUMENT lists the valid
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
