// Helpers over lists of Slices: their length, the part of them that holds a
// byte range, and (for host memory) their bytes and XXH3-64 checksum.
#ifndef TANDEM_KVTRANSFER_SLICES_H_
#define TANDEM_KVTRANSFER_SLICES_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kvtransfer/kv_transport.h"

namespace tandem::kvtransfer {

uint64_t TotalBytes(std::span<const Slice> slices);

// One sequence's bytes in a paged KV cache, one inner vector per layer:
// layer l of block b lies at l * layer_stride + b * block_bytes of `region`
// (for tandem's KvLayout, layer_bytes() and block_bytes()), blocks
// in sequence order, runs of consecutive block ids merged into one Slice.
// Prefill and decode workers both build their slices here, so the two ends
// of a transfer agree byte for byte.
std::vector<std::vector<Slice>> PagedKvSlices(RegionId region, int n_layers, uint64_t layer_stride,
                                              uint64_t block_bytes,
                                              std::span<const int32_t> blocks);

// The slices that hold bytes [offset, offset + length) of the concatenation
// of `slices`; OUT_OF_RANGE when the range runs past their end.
absl::StatusOr<std::vector<Slice>> SubSlices(std::span<const Slice> slices, uint64_t offset,
                                             uint64_t length);

// XXH3-64 of the concatenation of `parts`. Thread-safe.
uint64_t Xxh3Of(std::span<const std::span<const std::byte>> parts);

// Where registered host regions lie in this process, so that code above a
// transport can read the bytes of a Slice. Thread-compatible.
class RegionMap {
 public:
  void Add(RegionId region, void* base, size_t length, MemoryKind kind);
  void Remove(RegionId region);

  // The bytes of `slice`; FAILED_PRECONDITION for device memory, NOT_FOUND
  // for an unknown region, OUT_OF_RANGE past its end.
  absl::StatusOr<std::span<std::byte>> Bytes(const Slice& slice) const;

  // The bytes of each of `slices`, in order, failing as Bytes does.
  absl::StatusOr<std::vector<std::span<const std::byte>>> Resolve(
      std::span<const Slice> slices) const;
  // XXH3-64 of the concatenated bytes of `slices`.
  absl::StatusOr<uint64_t> Checksum(std::span<const Slice> slices) const;

 private:
  struct Region {
    std::byte* base;
    size_t length;
    MemoryKind kind;
  };
  absl::flat_hash_map<RegionId, Region> regions_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_SLICES_H_
