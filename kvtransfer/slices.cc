#include "kvtransfer/slices.h"

#include <algorithm>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/xxhash_dispatch.h"

namespace tandem::kvtransfer {

std::vector<std::vector<Slice>> PagedKvSlices(RegionId region, int n_layers, uint64_t layer_stride,
                                              uint64_t block_bytes,
                                              std::span<const int32_t> blocks) {
  std::vector<std::vector<Slice>> layers(n_layers);
  for (int l = 0; l < n_layers; ++l) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (i > 0 && blocks[i] == blocks[i - 1] + 1) {
        layers[l].back().length += block_bytes;  // Adjacent in memory: extend.
      } else {
        layers[l].push_back(Slice{region, l * layer_stride + blocks[i] * block_bytes, block_bytes});
      }
    }
  }
  return layers;
}

uint64_t TotalBytes(std::span<const Slice> slices) {
  uint64_t total = 0;
  for (const Slice& s : slices) total += s.length;
  return total;
}

absl::StatusOr<std::vector<Slice>> SubSlices(std::span<const Slice> slices, uint64_t offset,
                                             uint64_t length) {
  std::vector<Slice> out;
  uint64_t skip = offset;
  uint64_t want = length;
  for (const Slice& s : slices) {
    if (want == 0) break;
    if (skip >= s.length) {
      skip -= s.length;
      continue;
    }
    const uint64_t take = std::min(s.length - skip, want);
    out.push_back(Slice{s.region, s.offset + skip, take});
    want -= take;
    skip = 0;
  }
  if (want != 0) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset + length,
                                              ") run past slices of ", TotalBytes(slices),
                                              " bytes"));
  }
  return out;
}

void RegionMap::Add(RegionId region, void* base, size_t length, MemoryKind kind) {
  regions_[region] = Region{static_cast<std::byte*>(base), length, kind};
}

void RegionMap::Remove(RegionId region) { regions_.erase(region); }

absl::StatusOr<std::span<std::byte>> RegionMap::Bytes(const Slice& slice) const {
  auto it = regions_.find(slice.region);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("region ", slice.region, " is not registered"));
  }
  const Region& r = it->second;
  if (r.kind != MemoryKind::kHost) {
    return absl::FailedPreconditionError(
        absl::StrCat("region ", slice.region, " is device memory; its bytes cannot be read here"));
  }
  if (slice.offset > r.length || slice.length > r.length - slice.offset) {
    return absl::OutOfRangeError(absl::StrCat("slice [", slice.offset, ", +", slice.length,
                                              ") runs past region ", slice.region, " of ", r.length,
                                              " bytes"));
  }
  return std::span<std::byte>(r.base + slice.offset, slice.length);
}

absl::StatusOr<std::vector<std::span<const std::byte>>> RegionMap::Resolve(
    std::span<const Slice> slices) const {
  std::vector<std::span<const std::byte>> parts;
  parts.reserve(slices.size());
  for (const Slice& s : slices) {
    absl::StatusOr<std::span<std::byte>> bytes = Bytes(s);
    if (!bytes.ok()) return bytes.status();
    parts.push_back(*bytes);
  }
  return parts;
}

absl::StatusOr<uint64_t> RegionMap::Checksum(std::span<const Slice> slices) const {
  absl::StatusOr<std::vector<std::span<const std::byte>>> parts = Resolve(slices);
  if (!parts.ok()) return parts.status();
  return Xxh3Of(*parts);
}

uint64_t Xxh3Of(std::span<const std::span<const std::byte>> parts) {
  if (parts.size() == 1) return XXH3_64bits(parts[0].data(), parts[0].size());
  // One streaming state a thread, made once: a chunk of many slices costs
  // no allocation.
  thread_local const std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(
      XXH3_createState(), &XXH3_freeState);
  CHECK(state != nullptr) << "cannot allocate an XXH3 state";
  XXH3_64bits_reset(state.get());
  for (std::span<const std::byte> part : parts) {
    XXH3_64bits_update(state.get(), part.data(), part.size());
  }
  return XXH3_64bits_digest(state.get());
}

}  // namespace tandem::kvtransfer
