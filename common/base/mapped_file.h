// A read-only memory mapping of a whole file. Movable, not copyable; the
// mapping lives as long as the object. Not thread-compatible for moves, but
// the mapped bytes may be read from any thread.
#ifndef TANDEM_COMMON_BASE_MAPPED_FILE_H_
#define TANDEM_COMMON_BASE_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

class MappedFile {
 public:
  // Maps `path` read-only. NOT_FOUND / PERMISSION_DENIED / INVALID_ARGUMENT
  // (not a regular file) name the path.
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_MAPPED_FILE_H_
