#include "common/kvcache/block_hash.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "common/base/xxhash_dispatch.h"

namespace tandem {
namespace {

BlockHash FromXxh(XXH128_hash_t h) { return BlockHash{h.high64, h.low64}; }

BlockHash Chain(const BlockHash& parent, std::span<const int32_t> block) {
  // The parent's two words, then the ids, as one buffer.
  std::vector<uint64_t> buffer(2 + (block.size_bytes() + 7) / 8, 0);
  buffer[0] = parent.high;
  buffer[1] = parent.low;
  std::memcpy(buffer.data() + 2, block.data(), block.size_bytes());
  return FromXxh(XXH3_128bits(buffer.data(), 16 + block.size_bytes()));
}

}  // namespace

std::string BlockHash::ToString() const { return absl::StrFormat("%016x%016x", high, low); }

BlockHash BlockHashSalt(std::string_view weights_fingerprint, std::string_view kv_dtype,
                        int block_size) {
  const std::string text =
      absl::StrFormat("tandem-kv-blocks|%s|%s|%d", weights_fingerprint, kv_dtype, block_size);
  return FromXxh(XXH3_128bits(text.data(), text.size()));
}

void ExtendBlockHashes(const BlockHash& salt, std::span<const int32_t> tokens, int block_size,
                       int max_blocks, std::vector<BlockHash>& hashes) {
  if (block_size <= 0) return;
  const int full = static_cast<int>(std::min<size_t>(tokens.size() / block_size, INT32_MAX));
  const int end = std::min(full, max_blocks);
  for (int i = static_cast<int>(hashes.size()); i < end; ++i) {
    const BlockHash& parent = i == 0 ? salt : hashes[i - 1];
    hashes.push_back(Chain(parent, tokens.subspan(static_cast<size_t>(i) * block_size,
                                                  static_cast<size_t>(block_size))));
  }
}

std::vector<BlockHash> HashBlocks(const BlockHash& salt, std::span<const int32_t> tokens,
                                  int block_size, int max_blocks) {
  std::vector<BlockHash> hashes;
  ExtendBlockHashes(salt, tokens, block_size, max_blocks, hashes);
  return hashes;
}

}  // namespace tandem
