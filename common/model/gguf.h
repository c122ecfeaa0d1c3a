// Reader of GGUF files, the model format of llama.cpp (versions 2 and 3,
// little-endian): header, metadata key/values, tensor infos and the tensor
// data section of a memory-mapped file.
//
// Every length, count and offset is checked against the file before use, so a
// truncated or corrupt file is an INVALID_ARGUMENT naming the file and the
// problem, never a crash or an allocation larger than the file justifies.
// Metadata values and tensor data are views into the mapping, decoded on
// access. A GgufFile is immutable after Open and safe to read from many
// threads.
#ifndef TANDEM_COMMON_MODEL_GGUF_H_
#define TANDEM_COMMON_MODEL_GGUF_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/ggml_types.h"

namespace tandem {

// `x` rounded up to a multiple of `alignment` (tensor data and offsets).
inline uint64_t AlignUp(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

// Metadata value types, numbered as in the file.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint32", "string", ...; "unknown" for numbers outside the enum.
const char* GgufValueTypeName(GgufValueType type);

// Encoded size of a fixed-size value type; 0 for string, array and unknown.
uint64_t GgufScalarSize(GgufValueType type);

// One metadata value. `bytes` is its encoding inside the file: a scalar's
// little-endian bytes, a string's characters, or an array's encoded elements
// (already checked to be well formed).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType element_type = GgufValueType::kUint8;  // arrays only
  uint64_t count = 1;                                  // array length; 1 for scalars
  std::span<const uint8_t> bytes;
};

struct GgufMetadataEntry {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ne0 first: ne0 is the contiguous dimension
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // from the start of the data section
  int64_t num_elements = 0;
  uint64_t num_bytes = 0;
  std::span<const uint8_t> data;  // inside the mapping, `offset` aligned
};

class GgufFile {
 public:
  // Maps and parses `path`. NOT_FOUND when it does not exist; INVALID_ARGUMENT
  // naming the file for anything malformed.
  static absl::StatusOr<GgufFile> Open(const std::string& path);

  // Parses `bytes` (a whole file) that `storage` keeps alive; `path` is used
  // in messages only. For files already in memory and for fuzzing.
  static absl::StatusOr<GgufFile> Parse(std::shared_ptr<const void> storage,
                                        std::span<const uint8_t> bytes, std::string path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  // Entries in file order.
  const std::vector<GgufMetadataEntry>& metadata() const { return metadata_; }
  // nullptr when absent.
  const GgufValue* FindValue(std::string_view key) const;
  bool HasKey(std::string_view key) const { return FindValue(key) != nullptr; }

  // Typed metadata. NOT_FOUND when the key is absent; INVALID_ARGUMENT when
  // the value has another type or does not fit. Integer getters accept any
  // integer type whose value fits; GetFloat accepts float32 and float64.
  absl::StatusOr<uint32_t> GetUint32(std::string_view key) const;
  absl::StatusOr<int32_t> GetInt32(std::string_view key) const;
  absl::StatusOr<uint64_t> GetUint64(std::string_view key) const;
  absl::StatusOr<float> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
  // Elements of any integer type that fit in int32.
  absl::StatusOr<std::vector<int32_t>> GetInt32Array(std::string_view key) const;

  // Tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const GgufTensorInfo* FindTensor(std::string_view name) const;

  // The whole file, and what keeps it (and so every span above) alive.
  std::span<const uint8_t> bytes() const { return bytes_; }
  const std::shared_ptr<const void>& keep_alive() const { return storage_; }

 private:
  class Parser;

  GgufFile() = default;

  // INVALID_ARGUMENT "GGUF file '<path>' <problem>".
  absl::Status Error(std::string_view problem) const;
  // Looks up `key` for a typed getter; NOT_FOUND naming the file when absent.
  absl::StatusOr<const GgufValue*> Lookup(std::string_view key) const;
  absl::Status WrongType(std::string_view key, const GgufValue& value,
                         std::string_view wanted) const;
  // Any integer scalar that fits in T.
  template <typename T>
  absl::StatusOr<T> GetInteger(std::string_view key, const char* wanted) const;

  std::string path_;
  std::shared_ptr<const void> storage_;
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<GgufMetadataEntry> metadata_;
  std::map<std::string, size_t, std::less<>> key_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GGUF_H_
