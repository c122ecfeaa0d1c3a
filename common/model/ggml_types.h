// Element types of ggml tensors as GGUF files number them, and conversions
// of the 16-bit float formats.
#ifndef TANDEM_COMMON_MODEL_GGML_TYPES_H_
#define TANDEM_COMMON_MODEL_GGML_TYPES_H_

#include <cstdint>
#include <optional>
#include <string>

namespace tandem {

// ggml tensor element types, numbered as in the file. Only the ones this
// project names are listed; others pass through as plain numbers.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ8_0 = 8,
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

// IEEE binary16 and bfloat16 conversions (round to nearest even on the way
// down; NaN stays NaN, overflow becomes infinity).
float Fp16ToFp32(uint16_t h);
uint16_t Fp32ToFp16(float f);
float Bf16ToFp32(uint16_t h);
uint16_t Fp32ToBf16(float f);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GGML_TYPES_H_
