// Element types of ggml tensors as GGUF files number them.
#ifndef TANDEM_COMMON_MODEL_GGML_TYPES_H_
#define TANDEM_COMMON_MODEL_GGML_TYPES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "common/base/float16.h"

namespace tandem {

// ggml tensor element types, numbered as in the file. Only the ones this
// project names are listed; others pass through as plain numbers.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

// Storage of a ggml type: `block_bytes` bytes hold `block_elements` values.
struct GgmlTypeTraits {
  const char* name;
  int64_t block_elements;
  int64_t block_bytes;
};

// Traits of the ggml types that llama.cpp writes; nullopt for unknown ones.
std::optional<GgmlTypeTraits> GgmlTypeTraitsOf(GgmlType type);

// "F16", "Q4_K", ... or "type N" when unknown.
std::string GgmlTypeName(GgmlType type);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GGML_TYPES_H_
