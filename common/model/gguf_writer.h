// Writer of GGUF v3 files (the reader is gguf.h): metadata key/values, then
// tensor infos, then tensor data, each tensor aligned.
//
// The writer records what it is given in order, repeated keys included, and
// can write values from their raw encoding, so tests also use it to build
// malformed files. It checks only that each tensor's bytes match its shape
// and (known) type. Not thread-safe; build and write from one thread.
#ifndef TANDEM_COMMON_MODEL_GGUF_WRITER_H_
#define TANDEM_COMMON_MODEL_GGUF_WRITER_H_

#include <cstdint>
#include <cstring>
#include <iosfwd>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/gguf.h"

namespace tandem {

class GgufWriter {
 public:
  // `alignment` (a power of two) is recorded as general.alignment unless it
  // is the default 32.
  explicit GgufWriter(uint32_t alignment = 32);

  void AddUint8(std::string key, uint8_t v) { AddScalar(std::move(key), GgufValueType::kUint8, v); }
  void AddInt8(std::string key, int8_t v) { AddScalar(std::move(key), GgufValueType::kInt8, v); }
  void AddUint16(std::string key, uint16_t v) {
    AddScalar(std::move(key), GgufValueType::kUint16, v);
  }
  void AddInt16(std::string key, int16_t v) { AddScalar(std::move(key), GgufValueType::kInt16, v); }
  void AddUint32(std::string key, uint32_t v) {
    AddScalar(std::move(key), GgufValueType::kUint32, v);
  }
  void AddInt32(std::string key, int32_t v) { AddScalar(std::move(key), GgufValueType::kInt32, v); }
  void AddUint64(std::string key, uint64_t v) {
    AddScalar(std::move(key), GgufValueType::kUint64, v);
  }
  void AddInt64(std::string key, int64_t v) { AddScalar(std::move(key), GgufValueType::kInt64, v); }
  void AddFloat32(std::string key, float v) {
    AddScalar(std::move(key), GgufValueType::kFloat32, v);
  }
  void AddFloat64(std::string key, double v) {
    AddScalar(std::move(key), GgufValueType::kFloat64, v);
  }
  void AddBool(std::string key, bool v) {
    AddScalar(std::move(key), GgufValueType::kBool, static_cast<uint8_t>(v ? 1 : 0));
  }
  void AddString(std::string key, std::string_view v);
  void AddStringArray(std::string key, std::span<const std::string> v);
  void AddFloat32Array(std::string key, std::span<const float> v);
  void AddInt32Array(std::string key, std::span<const int32_t> v);

  // A value of `type` given by its encoding (what follows the type field).
  void AddEncoded(std::string key, GgufValueType type, std::string encoding);
  // An array header claiming `count` elements of `element_type`, followed by
  // `elements` (their encoding) whether or not it holds that many.
  void AddEncodedArray(std::string key, GgufValueType element_type, uint64_t count,
                       std::string_view elements);

  // A tensor of `dims` (ne0 first) whose bytes the caller keeps alive until
  // the file is written.
  void AddTensor(std::string name, std::vector<int64_t> dims, GgmlType type,
                 std::span<const uint8_t> data);
  // The same with bytes the writer keeps.
  void AddTensor(std::string name, std::vector<int64_t> dims, GgmlType type,
                 std::vector<uint8_t> data);

  // The whole file in memory (small files, tests).
  absl::StatusOr<std::string> Serialize() const;
  // Writes `path`, replacing it. INVALID_ARGUMENT for a tensor whose bytes do
  // not match its shape; DATA_LOSS for a failed write.
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Entry {
    std::string key;
    GgufValueType type;
    std::string encoding;
  };
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    GgmlType type;
    std::vector<uint8_t> owned;
    std::span<const uint8_t> borrowed;
    std::span<const uint8_t> bytes() const { return owned.empty() ? borrowed : owned; }
  };

  template <typename T>
  void AddScalar(std::string key, GgufValueType type, T v) {
    std::string encoding(sizeof(T), '\0');
    std::memcpy(encoding.data(), &v, sizeof(T));
    AddEncoded(std::move(key), type, std::move(encoding));
  }

  absl::Status Check() const;
  void Write(std::ostream& out) const;

  uint32_t alignment_;
  std::vector<Entry> entries_;
  std::vector<Tensor> tensors_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GGUF_WRITER_H_
