// Writing safetensors: SafetensorsWriter lays tensors out and writes a file
// or a sharded folder with its index, each file atomically. The reader is in
// safetensors.cc.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_internal.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using json = nlohmann::json;
using safetensors_internal::kMetadataKey;

// Writes `pieces` one after another to `path`, through a temporary file in
// the same folder that is synced and renamed into place, so a reader sees
// either the old file or the whole new one.
absl::Status WriteAtomically(const std::string& path,
                             std::span<const std::span<const uint8_t>> pieces) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write '", tmp, "': ", std::strerror(errno)));
  }
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return absl::DataLossError(
        absl::StrCat(what, " '", tmp, "' for '", path, "': ", std::strerror(err)));
  };
  for (std::span<const uint8_t> piece : pieces) {
    while (!piece.empty()) {
      const ssize_t n = ::write(fd, piece.data(), piece.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return fail("cannot write");
      piece = piece.subspan(static_cast<size_t>(n));
    }
  }
  if (::fsync(fd) != 0) return fail("cannot sync");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat("cannot close '", tmp, "': ", std::strerror(err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::DataLossError(
        absl::StrCat("cannot rename '", tmp, "' to '", path, "': ", std::strerror(err)));
  }
  return absl::OkStatus();
}

std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

SafetensorsWriter::SafetensorsWriter() { metadata_["format"] = "pt"; }

absl::Status SafetensorsWriter::Add(std::string name, SafetensorsDType dtype,
                                    std::vector<int64_t> shape, std::span<const uint8_t> bytes) {
  if (name.empty() || name == kMetadataKey) {
    return absl::InvalidArgumentError(absl::StrCat("tensor name '", name, "' is reserved"));
  }
  try {
    (void)json(name).dump();
  } catch (const json::exception&) {
    return absl::InvalidArgumentError(absl::StrCat("tensor name '", name, "' is not UTF-8"));
  }
  if (names_.contains(name)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' was already added"));
  }
  uint64_t elements = 1;
  for (const int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': bad shape [", absl::StrJoin(shape, ", "), "]"));
    }
  }
  uint64_t expected = 0;
  if (__builtin_mul_overflow(elements, SafetensorsDTypeSize(dtype), &expected) ||
      expected != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "': ", bytes.size(), " bytes do not match shape [",
        absl::StrJoin(shape, ", "), "] of ", std::string(SafetensorsDTypeName(dtype))));
  }
  names_.insert(name);
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), {bytes.begin(), bytes.end()}});
  return absl::OkStatus();
}

std::vector<const SafetensorsWriter::Entry*> SafetensorsWriter::DataOrder(
    std::vector<const Entry*> entries) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) {
    return SafetensorsDTypeSize(a->dtype) > SafetensorsDTypeSize(b->dtype);
  });
  return entries;
}

std::string SafetensorsWriter::EncodeHeader(const std::vector<const Entry*>& entries) const {
  // ordered_json keeps "__metadata__" first and tensors in data order, as the
  // reference writer does.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata_) meta[key] = value;
    header[std::string(kMetadataKey)] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const Entry* e : entries) {
    header[e->name] = {{"dtype", SafetensorsDTypeName(e->dtype)},
                       {"shape", e->shape},
                       {"data_offsets", {offset, offset + e->bytes.size()}}};
    offset += e->bytes.size();
  }
  std::string text = header.dump(-1, ' ', /*ensure_ascii=*/false,
                                 nlohmann::ordered_json::error_handler_t::replace);
  // Pad so that the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i, len >>= 8) out[i] = static_cast<char>(len & 0xff);
  return out + text;
}

std::string SafetensorsWriter::Serialize() const {
  std::vector<const Entry*> all;
  for (const Entry& e : entries_) all.push_back(&e);
  all = DataOrder(std::move(all));
  std::string out = EncodeHeader(all);
  for (const Entry* e : all) out.append(e->bytes.begin(), e->bytes.end());
  return out;
}

absl::Status SafetensorsWriter::WriteEntries(const std::string& path,
                                             std::vector<const Entry*> entries) const {
  entries = DataOrder(std::move(entries));
  const std::string header = EncodeHeader(entries);
  std::vector<std::span<const uint8_t>> pieces = {AsBytes(header)};
  for (const Entry* e : entries) pieces.emplace_back(e->bytes);
  return WriteAtomically(path, pieces);
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path) const {
  std::vector<const Entry*> all;
  for (const Entry& e : entries_) all.push_back(&e);
  return WriteEntries(path, std::move(all));
}

absl::Status SafetensorsWriter::WriteFolder(const std::string& dir,
                                            uint64_t max_shard_bytes) const {
  uint64_t total = 0;
  for (const Entry& e : entries_) total += e.bytes.size();
  if (max_shard_bytes == 0 || total <= max_shard_bytes) {
    return WriteFile(absl::StrCat(dir, "/", kSafetensorsSingleFile));
  }
  // Greedy in the order tensors were added, as Hugging Face shards a state
  // dict.
  std::vector<std::vector<const Entry*>> shards(1);
  uint64_t shard_bytes = 0;
  for (const Entry& e : entries_) {
    if (!shards.back().empty() && shard_bytes + e.bytes.size() > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&e);
    shard_bytes += e.bytes.size();
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size());
    RETURN_IF_ERROR(WriteEntries(absl::StrCat(dir, "/", name), shards[i]));
    for (const Entry* e : shards[i]) weight_map[e->name] = name;
  }
  // The index goes last: a reader never sees it name a shard not yet there.
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", std::move(weight_map)}};
  const std::string text =
      index.dump(2, ' ', /*ensure_ascii=*/false, nlohmann::ordered_json::error_handler_t::replace) +
      "\n";
  const std::span<const uint8_t> piece = AsBytes(text);
  return WriteAtomically(absl::StrCat(dir, "/", kSafetensorsIndexFile), {&piece, 1});
}

}  // namespace tandem
