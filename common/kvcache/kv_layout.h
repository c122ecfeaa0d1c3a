// Where K and V live in the paged cache.
//
// The cache is one array of elements of type `dtype` (f32, bf16, f16, or
// int8 bytes), layer-major:
//
//   cache[layer][block] = { K[kv_dim][block_size], V[block_size][kv_dim] }
//
// An int8 block ends with its scales, f32, so that a block still moves as
// one range of bytes:
//
//   { K, V, K scales[kv_heads][block_size], V scales[kv_heads][block_size] }
//
// Value d of KV head h in slot s is its byte times the scale of (h, s): each
// token's head is rounded on its own (scale = largest magnitude / 127), so a
// token appended to a block never changes the others. For int8 an element
// is a byte, and a block's elements count its scales' bytes too: offsets in
// elements stay offsets in bytes.
//
// A latent layout (multi-head latent attention: DeepSeek V2/V3) holds one
// vector of kv_dim per slot, the latent and the rope key that every head
// shares, stored as the keys are, and no values (attention reads its values
// from the latent):
//
//   cache[layer][block] = { K[kv_dim][block_size] }, int8: then
//   { K scales[block_size] } (kv_heads is 1)
//
// One block of one layer is a single contiguous range of
// 2 * block_size * kv_dim elements (block_size * kv_dim when latent): the keys of its block_size
// slots stored dimension-major (element d of every slot's key together), then the values slot-major
// (each slot's kv_dim values together). A slot holds one token, all KV heads. Keys are transposed
// so that attention scores of all slots of a block come from one vector operation per key
// dimension; values are not, because the weighted sum of values runs along the dimension.
//
// One layer of one sequence is therefore one contiguous piece per block, and
// runs of adjacent block ids (which the pool hands out lowest-first) merge
// into a single piece: a transfer sends layer l of a sequence as few
// (offset, length) ranges as it has runs of consecutive block ids.
#ifndef TANDEM_COMMON_KVCACHE_KV_LAYOUT_H_
#define TANDEM_COMMON_KVCACHE_KV_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "common/base/dtype.h"

namespace tandem {

// KV blocks a sequence of `tokens` tokens occupies at `block_size` tokens
// per block: 0 for no tokens; block_size <= 0 counts as 1. In 64 bits, so
// that a count near INT32_MAX does not overflow; the quotient of an int
// count fits in an int.
constexpr int64_t BlocksFor(int64_t tokens, int block_size) {
  if (block_size <= 0) block_size = 1;
  if (tokens <= 0) return 0;
  return (tokens + block_size - 1) / block_size;
}

struct KvLayout {
  int n_layers = 0;
  int num_blocks = 0;
  int block_size = 16;
  int kv_dim = 0;
  DType dtype = DType::kF32;
  int kv_heads = 1;     // KV heads in kv_dim: an int8 cache keeps a scale per head
  bool latent = false;  // keys only (see above)

  // The width of a slot's value: kv_dim, or 0 when latent.
  int value_dim() const { return latent ? 0 : kv_dim; }
  size_t element_bytes() const { return DTypeSize(dtype); }
  // Bytes of one block's scales: 0 unless int8.
  size_t scale_bytes() const {
    const size_t vectors = latent ? 1 : 2;
    return dtype == DType::kI8 ? vectors * kv_heads * block_size * sizeof(float) : 0;
  }
  size_t block_elements() const {
    return static_cast<size_t>(block_size) * (kv_dim + value_dim()) +
           scale_bytes() / element_bytes();
  }
  size_t layer_elements() const { return block_elements() * num_blocks; }
  size_t total_elements() const { return layer_elements() * n_layers; }
  size_t block_bytes() const { return block_elements() * element_bytes(); }
  size_t layer_bytes() const { return layer_elements() * element_bytes(); }
  size_t total_bytes() const { return total_elements() * element_bytes(); }

  // Offsets in elements from the start of the cache.
  size_t BlockOffset(int layer, int32_t block) const {
    return layer * layer_elements() + static_cast<size_t>(block) * block_elements();
  }
  // Element `dim` of the key in `slot`; the block's keys for one dim are
  // block_size consecutive elements starting at KeyOffset(layer, block, 0, dim).
  size_t KeyOffset(int layer, int32_t block, int slot, int dim) const {
    return BlockOffset(layer, block) + static_cast<size_t>(dim) * block_size + slot;
  }
  // The kv_dim consecutive values of `slot` (not latent).
  size_t ValueOffset(int layer, int32_t block, int slot) const {
    return BlockOffset(layer, block) + static_cast<size_t>(block_size) * kv_dim +
           static_cast<size_t>(slot) * kv_dim;
  }
  // int8 only: the block_size key scales of `head` (its value scales follow
  // kv_heads * block_size floats later, unless latent), as an offset in bytes.
  size_t KeyScaleOffset(int layer, int32_t block, int head) const {
    return BlockOffset(layer, block) + static_cast<size_t>(block_size) * (kv_dim + value_dim()) +
           static_cast<size_t>(head) * block_size * sizeof(float);
  }
  size_t ValueScaleOffset(int layer, int32_t block, int head) const {
    return KeyScaleOffset(layer, block, head) +
           static_cast<size_t>(kv_heads) * block_size * sizeof(float);
  }
};

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_KV_LAYOUT_H_
