// Reading, validating and writing safetensors files, the weight format of
// Hugging Face model folders.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON
//   {name: {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
//    "__metadata__": {str: str}}
// (possibly padded with spaces), then the data section; offsets are relative
// to its start. A folder holds either `model.safetensors` or shards listed by
// `model.safetensors.index.json` ({"metadata": {..}, "weight_map": {tensor:
// shard file}}).
//
// Everything is validated when opened, so a TensorInfo handed out always
// describes bytes inside the mapping whose size matches its shape. Opened
// files and folders are immutable and safe to read from many threads.
#ifndef TANDEM_COMMON_MODEL_SAFETENSORS_H_
#define TANDEM_COMMON_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/dtype.h"

namespace tandem {

// Element types as safetensors names them. Only F32, F16 and BF16 have a
// DType; callers report the others as unsupported.
enum class SafetensorsDType : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kI64,
  kU64,
  kF64,
};

// "BF16" -> kBF16 (names as in the file, upper case); nullopt when unknown.
std::optional<SafetensorsDType> ParseSafetensorsDType(std::string_view name);
// kBF16 -> "BF16".
std::string_view SafetensorsDTypeName(SafetensorsDType dtype);
// Bytes per element.
size_t SafetensorsDTypeSize(SafetensorsDType dtype);
// The DType of kF32, kF16 and kBF16; nullopt for the others.
std::optional<DType> ToDType(SafetensorsDType dtype);
SafetensorsDType ToSafetensorsDType(DType dtype);

// One tensor of an opened file.
struct TensorInfo {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;  // empty for a scalar
  int64_t num_elements = 0;    // product of shape (1 for a scalar)
  // data_offsets as in the header, relative to the data section.
  uint64_t data_begin = 0;
  uint64_t data_end = 0;
  // The tensor's bytes inside the mapping; valid while the file (or its
  // keep_alive()) lives. Aligned to the element size only if the writer
  // aligned it (this project's writer does); check before casting.
  std::span<const uint8_t> bytes;
};

// One validated safetensors file. Movable; TensorInfo pointers and spans stay
// valid across moves.
class SafetensorsFile {
 public:
  // Maps `path` and validates it. NOT_FOUND for a missing file; every other
  // error is INVALID_ARGUMENT naming the file and, where it applies, the
  // tensor and the field.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  // Validates `bytes` (a whole file) that `storage` keeps alive; `path` is
  // used in messages only. For tests and for files already in memory.
  static absl::StatusOr<SafetensorsFile> Parse(std::shared_ptr<const void> storage,
                                               std::span<const uint8_t> bytes, std::string path);

  const std::string& path() const { return path_; }
  // Tensor names in data order (by data_offsets begin, then name).
  std::vector<std::string> tensor_names() const;
  // Tensors in data order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when there is no tensor `name`.
  const TensorInfo* Find(std::string_view name) const;
  // "__metadata__" of the header; empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Keeps the mapped bytes alive; hold it beside spans that outlive the file.
  std::shared_ptr<const void> keep_alive() const { return storage_; }

 private:
  std::string path_;
  std::shared_ptr<const void> storage_;
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;  // name -> tensors_ index
  std::map<std::string, std::string> metadata_;
};

// The tensors of a model folder, one file or several shards, with one lookup
// across them.
class SafetensorsModel {
 public:
  const std::string& dir() const { return dir_; }
  // nullptr when no shard holds `name`.
  const TensorInfo* Find(std::string_view name) const;
  // All tensor names, sorted.
  std::vector<std::string> tensor_names() const;
  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  // "metadata" of the index (non-string values as JSON text); for a single
  // file, that file's "__metadata__".
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Keeps every shard's mapping alive.
  std::shared_ptr<const void> keep_alive() const { return storage_; }

 private:
  friend absl::StatusOr<std::unique_ptr<SafetensorsModel>> OpenSafetensorsFolder(
      const std::string& dir);

  std::string dir_;
  std::vector<SafetensorsFile> shards_;
  absl::flat_hash_map<std::string, const TensorInfo*> index_;
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<const void> storage_;
};

inline constexpr char kSafetensorsSingleFile[] = "model.safetensors";
inline constexpr char kSafetensorsIndexFile[] = "model.safetensors.index.json";

// Opens `dir`/model.safetensors or, when absent, every shard listed in
// `dir`/model.safetensors.index.json. Validates the index: shard names are
// plain file names in `dir`, every weight_map tensor is in the shard it
// names, every shard tensor is listed and no tensor is in two shards.
// NOT_FOUND when the folder has neither file or a shard is missing;
// INVALID_ARGUMENT otherwise.
absl::StatusOr<std::unique_ptr<SafetensorsModel>> OpenSafetensorsFolder(const std::string& dir);

// Collects tensors and writes them as a safetensors file, or a sharded
// folder. Data is laid out by element size, largest first, after a header
// padded with spaces to 8 bytes, so every tensor is aligned to its element
// size. Not thread-safe.
class SafetensorsWriter {
 public:
  SafetensorsWriter();

  // Copies `bytes`. INVALID_ARGUMENT for an empty, reserved or repeated name,
  // a negative dimension, or bytes that do not match dtype and shape.
  absl::Status Add(std::string name, SafetensorsDType dtype, std::vector<int64_t> shape,
                   std::span<const uint8_t> bytes);
  // "__metadata__" entries; {"format": "pt"} unless replaced.
  void SetMetadata(std::string key, std::string value) { metadata_[key] = std::move(value); }

  // The whole file in memory.
  std::string Serialize() const;
  // Writes `path` atomically (a temporary file in the same folder renamed
  // into place). INVALID_ARGUMENT / DATA_LOSS naming the path on failure.
  absl::Status WriteFile(const std::string& path) const;
  // Writes `dir`/model.safetensors when max_shard_bytes is 0 or the data
  // fits in one shard; otherwise model-0000i-of-0000n.safetensors shards of
  // at most max_shard_bytes of data each (a larger tensor gets a shard of its
  // own) and model.safetensors.index.json. Other files in `dir` are left.
  absl::Status WriteFolder(const std::string& dir, uint64_t max_shard_bytes = 0) const;

 private:
  struct Entry {
    std::string name;
    SafetensorsDType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  // The length field and padded JSON header for `entries`, in data order.
  std::string EncodeHeader(const std::vector<const Entry*>& entries) const;
  // `entries` stably sorted by element size, largest first.
  static std::vector<const Entry*> DataOrder(std::vector<const Entry*> entries);
  absl::Status WriteEntries(const std::string& path, std::vector<const Entry*> entries) const;

  std::vector<Entry> entries_;
  absl::flat_hash_set<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_SAFETENSORS_H_
