// Where K and V live in the paged cache.
//
// The cache is one array of floats, layer-major:
//
//   cache[layer][block][K|V][slot][kv_dim]
//
// One block of one layer is a single contiguous range of
// 2 * block_size * kv_dim floats holding the keys of its block_size slots
// followed by their values; a slot's key (or value) is the kv_dim floats of
// all KV heads for one token. So one layer of one sequence is exactly one
// contiguous piece per block, and runs of adjacent block ids (which the
// pool hands out lowest-first) merge into a single piece: a transfer sends
// layer l of a sequence as few (offset, length) ranges as it has runs of
// consecutive block ids.
#ifndef TANDEM_COMMON_KVCACHE_KV_LAYOUT_H_
#define TANDEM_COMMON_KVCACHE_KV_LAYOUT_H_

#include <cstddef>
#include <cstdint>

namespace tandem {

struct KvLayout {
  int n_layers = 0;
  int num_blocks = 0;
  int block_size = 16;
  int kv_dim = 0;

  size_t block_floats() const { return size_t{2} * block_size * kv_dim; }
  size_t layer_floats() const { return block_floats() * num_blocks; }
  size_t total_floats() const { return layer_floats() * n_layers; }

  // Offsets in floats from the start of the cache.
  size_t BlockOffset(int layer, int32_t block) const {
    return layer * layer_floats() + static_cast<size_t>(block) * block_floats();
  }
  size_t KeyOffset(int layer, int32_t block, int slot) const {
    return BlockOffset(layer, block) + static_cast<size_t>(slot) * kv_dim;
  }
  size_t ValueOffset(int layer, int32_t block, int slot) const {
    return KeyOffset(layer, block, slot) + static_cast<size_t>(block_size) * kv_dim;
  }
};

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_KV_LAYOUT_H_
