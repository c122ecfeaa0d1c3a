// Where K and V live in the paged cache.
//
// The cache is one array of floats, layer-major:
//
//   cache[layer][block] = { K[kv_dim][block_size], V[block_size][kv_dim] }
//
// One block of one layer is a single contiguous range of
// 2 * block_size * kv_dim floats: the keys of its block_size slots stored
// dimension-major (element d of every slot's key together), then the values
// slot-major (each slot's kv_dim values together). A slot holds one token,
// all KV heads. Keys are transposed so that attention scores of all slots of
// a block come from one vector operation per key dimension; values are not,
// because the weighted sum of values runs along the dimension.
//
// One layer of one sequence is therefore one contiguous piece per block, and
// runs of adjacent block ids (which the pool hands out lowest-first) merge
// into a single piece: a transfer sends layer l of a sequence as few
// (offset, length) ranges as it has runs of consecutive block ids.
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
  // Element `dim` of the key in `slot`; the block's keys for one dim are
  // block_size consecutive floats starting at KeyOffset(layer, block, 0, dim).
  size_t KeyOffset(int layer, int32_t block, int slot, int dim) const {
    return BlockOffset(layer, block) + static_cast<size_t>(dim) * block_size + slot;
  }
  // The kv_dim consecutive values of `slot`.
  size_t ValueOffset(int layer, int32_t block, int slot) const {
    return BlockOffset(layer, block) + static_cast<size_t>(block_size) * kv_dim +
           static_cast<size_t>(slot) * kv_dim;
  }
};

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_KV_LAYOUT_H_
