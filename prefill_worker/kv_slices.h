// Which bytes of a paged KV cache belong to one sequence, layer by layer, as
// the KV transfer protocol wants them (the cluster contract's "layer
// slices"): for layer l, the range [BlockOffset(l, b), + block_floats) of
// each of the sequence's blocks b in order, in bytes, with runs of
// consecutive block ids merged into one Slice. The decode worker builds its
// destination the same way, so both sides agree byte for byte.
#ifndef TANDEM_PREFILL_WORKER_KV_SLICES_H_
#define TANDEM_PREFILL_WORKER_KV_SLICES_H_

#include <cstdint>
#include <span>
#include <vector>

#include "common/kvcache/kv_layout.h"
#include "kvtransfer/kv_transport.h"

namespace tandem::prefill {

// One inner vector per layer of `layout`; `region` is the registered KV cache.
std::vector<std::vector<kvtransfer::Slice>> LayerSlices(const KvLayout& layout,
                                                        kvtransfer::RegionId region,
                                                        std::span<const int32_t> blocks);

// Bytes of one layer of `num_blocks` blocks: what a lease for them expects.
inline uint64_t LayerBytes(const KvLayout& layout, int num_blocks) {
  return static_cast<uint64_t>(num_blocks) * layout.block_floats() * sizeof(float);
}

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_KV_SLICES_H_
