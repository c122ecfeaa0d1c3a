// Declarations shared by the safetensors reader (safetensors.cc) and writer
// (safetensors_writer.cc); internal to common/model.
#ifndef TANDEM_COMMON_MODEL_SAFETENSORS_INTERNAL_H_
#define TANDEM_COMMON_MODEL_SAFETENSORS_INTERNAL_H_

namespace tandem::safetensors_internal {

// The header key of the string-to-string metadata; never a tensor name.
inline constexpr char kMetadataKey[] = "__metadata__";

}  // namespace tandem::safetensors_internal

#endif  // TANDEM_COMMON_MODEL_SAFETENSORS_INTERNAL_H_
