#include "prefill_worker/kv_slices.h"

namespace tandem::prefill {

std::vector<std::vector<kvtransfer::Slice>> LayerSlices(const KvLayout& layout,
                                                        kvtransfer::RegionId region,
                                                        std::span<const int32_t> blocks) {
  const uint64_t block_bytes = layout.block_floats() * sizeof(float);
  std::vector<std::vector<kvtransfer::Slice>> layers(layout.n_layers);
  for (int l = 0; l < layout.n_layers; ++l) {
    std::vector<kvtransfer::Slice>& slices = layers[l];
    for (size_t i = 0; i < blocks.size(); ++i) {
      const uint64_t offset = layout.BlockOffset(l, blocks[i]) * sizeof(float);
      // Blocks b and b + 1 of one layer are adjacent in memory.
      if (i > 0 && blocks[i] == blocks[i - 1] + 1) {
        slices.back().length += block_bytes;
      } else {
        slices.push_back(kvtransfer::Slice{region, offset, block_bytes});
      }
    }
  }
  return layers;
}

}  // namespace tandem::prefill
