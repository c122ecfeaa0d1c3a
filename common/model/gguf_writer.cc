#include "common/model/gguf_writer.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <ostream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

constexpr uint32_t kVersion = 3;
constexpr uint32_t kDefaultAlignment = 32;

template <typename T>
void Put(std::ostream& out, T v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
void Append(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void PutString(std::ostream& out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

void PutPadding(std::ostream& out, uint64_t written, uint64_t alignment) {
  static const char kZeros[256] = {};
  uint64_t pad = (alignment - written % alignment) % alignment;
  while (pad > 0) {
    const uint64_t n = std::min<uint64_t>(pad, sizeof(kZeros));
    out.write(kZeros, static_cast<std::streamsize>(n));
    pad -= n;
  }
}

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  if (alignment_ != kDefaultAlignment) AddUint32("general.alignment", alignment_);
}

void GgufWriter::AddString(std::string key, std::string_view v) {
  std::string encoding;
  Append<uint64_t>(encoding, v.size());
  encoding.append(v);
  AddEncoded(std::move(key), GgufValueType::kString, std::move(encoding));
}

void GgufWriter::AddStringArray(std::string key, std::span<const std::string> v) {
  std::string elements;
  for (const std::string& s : v) {
    Append<uint64_t>(elements, s.size());
    elements.append(s);
  }
  AddEncodedArray(std::move(key), GgufValueType::kString, v.size(), elements);
}

void GgufWriter::AddFloat32Array(std::string key, std::span<const float> v) {
  AddEncodedArray(std::move(key), GgufValueType::kFloat32, v.size(),
                  std::string_view(reinterpret_cast<const char*>(v.data()), v.size_bytes()));
}

void GgufWriter::AddInt32Array(std::string key, std::span<const int32_t> v) {
  AddEncodedArray(std::move(key), GgufValueType::kInt32, v.size(),
                  std::string_view(reinterpret_cast<const char*>(v.data()), v.size_bytes()));
}

void GgufWriter::AddEncoded(std::string key, GgufValueType type, std::string encoding) {
  entries_.push_back({std::move(key), type, std::move(encoding)});
}

void GgufWriter::AddEncodedArray(std::string key, GgufValueType element_type, uint64_t count,
                                 std::string_view elements) {
  std::string encoding;
  Append<uint32_t>(encoding, static_cast<uint32_t>(element_type));
  Append<uint64_t>(encoding, count);
  encoding.append(elements);
  AddEncoded(std::move(key), GgufValueType::kArray, std::move(encoding));
}

void GgufWriter::AddTensor(std::string name, std::vector<int64_t> dims, GgmlType type,
                           std::span<const uint8_t> data) {
  tensors_.push_back({std::move(name), std::move(dims), type, {}, data});
}

void GgufWriter::AddTensor(std::string name, std::vector<int64_t> dims, GgmlType type,
                           std::vector<uint8_t> data) {
  tensors_.push_back({std::move(name), std::move(dims), type, std::move(data), {}});
}

absl::Status GgufWriter::Check() const {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF alignment ", alignment_, " is not a power of two"));
  }
  for (const Tensor& t : tensors_) {
    const std::optional<GgmlTypeTraits> traits = GgmlTypeTraitsOf(t.type);
    if (!traits) continue;  // unknown types are written as given
    int64_t elements = 1;
    for (int64_t d : t.dims) {
      if (d < 0 || (d != 0 && elements > std::numeric_limits<int64_t>::max() / d)) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF tensor '", t.name, "' has a negative or oversized dimension"));
      }
      elements *= d;
    }
    const int64_t row = t.dims.empty() ? 1 : t.dims[0];
    if (row % traits->block_elements != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF tensor '", t.name, "' has rows of ", row, " elements, not a multiple of the ",
          traits->name, " block of ", traits->block_elements));
    }
    const uint64_t expected =
        static_cast<uint64_t>(elements / traits->block_elements * traits->block_bytes);
    if (t.bytes().size() != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF tensor '", t.name, "' has ", t.bytes().size(), " bytes but its shape [",
          absl::StrJoin(t.dims, ", "), "] and type ", traits->name, " need ", expected));
    }
  }
  return absl::OkStatus();
}

void GgufWriter::Write(std::ostream& out) const {
  uint64_t written = 0;
  auto count = [&written](uint64_t n) { written += n; };
  out.write("GGUF", 4);
  Put<uint32_t>(out, kVersion);
  Put<uint64_t>(out, tensors_.size());
  Put<uint64_t>(out, entries_.size());
  count(4 + 4 + 8 + 8);
  for (const Entry& e : entries_) {
    PutString(out, e.key);
    Put<uint32_t>(out, static_cast<uint32_t>(e.type));
    out.write(e.encoding.data(), static_cast<std::streamsize>(e.encoding.size()));
    count(8 + e.key.size() + 4 + e.encoding.size());
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(out, t.name);
    Put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(out, static_cast<uint64_t>(d));
    Put<uint32_t>(out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(out, offset);
    count(8 + t.name.size() + 4 + 8 * t.dims.size() + 4 + 8);
    offset = AlignUp(offset + t.bytes().size(), alignment_);
  }
  // The data section exists only when there are tensors; a vocabulary-only
  // file ends right after its metadata, as llama.cpp writes it.
  if (tensors_.empty()) return;
  PutPadding(out, written, alignment_);
  for (const Tensor& t : tensors_) {
    const std::span<const uint8_t> bytes = t.bytes();
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    PutPadding(out, bytes.size(), alignment_);
  }
}

absl::StatusOr<std::string> GgufWriter::Serialize() const {
  RETURN_IF_ERROR(Check());
  std::ostringstream out;
  Write(out);
  return std::move(out).str();
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  RETURN_IF_ERROR(Check());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InvalidArgumentError(absl::StrCat("cannot write '", path, "'"));
  Write(out);
  out.flush();
  if (!out) return absl::DataLossError(absl::StrCat("short write to '", path, "'"));
  return absl::OkStatus();
}

}  // namespace tandem
