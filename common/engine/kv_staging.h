// KvStaging: page-locked host memory that KV blocks of a cache in device
// memory pass through on their way to and from a KV transport, which reads
// and writes host memory only (Debian's UCX has no CUDA transports).
//
// The staging is laid out like a KV cache of `capacity()` blocks, layout()
// ([layer][slot]: one slot holds one block of one layer, block_bytes()), so
// that a transfer holding a contiguous run of slots reads or writes ONE
// contiguous host range per layer, whatever device blocks it stands for.
// Runs are handed out first fit, lowest slot first.
//
// The workers copy with the backend's KvCopier: the prefill worker queues
// each layer's blocks to its run as the engine writes them (AppendToHost)
// and lets the sender ship a layer once that copy has finished; the decode
// worker lands a lease in a run and copies it into the reserved blocks
// (AppendToDevice) before committing them. A run is freed when its transfer
// has ended and no copy into or out of it is needed any more.
//
// Thread-compatible: the worker's scheduling thread uses it.
#ifndef TANDEM_COMMON_ENGINE_KV_STAGING_H_
#define TANDEM_COMMON_ENGINE_KV_STAGING_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/engine/engine.h"
#include "common/kvcache/kv_layout.h"

namespace tandem {

// Consecutive staging slots [first, first + count); count 0: none.
struct StagingRun {
  int first = 0;
  int count = 0;

  bool empty() const { return count == 0; }
};

class KvStaging {
 public:
  // `capacity` slots per layer for blocks of `device_layout`, in memory from
  // `copier` (which must outlive the staging). INVALID_ARGUMENT for a
  // capacity below 1.
  static absl::StatusOr<std::unique_ptr<KvStaging>> Create(KvCopier& copier,
                                                           const KvLayout& device_layout,
                                                           int capacity);

  // The staging `engine` needs: null when its backend has no KvCopier (its
  // memory is host memory, which a transport uses directly), in which case
  // `requested` must be 0. `requested` slots, or 0 for
  // DefaultStagingSlots(); INVALID_ARGUMENT (saying what to change) below
  // MinStagingSlots() or above the KV pool's blocks.
  static absl::StatusOr<std::unique_ptr<KvStaging>> ForEngine(Engine& engine, int requested);

  KvStaging(const KvStaging&) = delete;
  KvStaging& operator=(const KvStaging&) = delete;

  // The memory, for registering with a transport.
  void* data() { return buffer_->data(); }
  size_t bytes() const { return buffer_->size(); }
  // The staging as a KV cache of capacity() blocks.
  const KvLayout& layout() const { return layout_; }
  int capacity() const { return layout_.num_blocks; }
  int num_free() const { return free_; }

  // The lowest run of `count` free slots. RESOURCE_EXHAUSTED when no run
  // that long is free now (wait for transfers to end), INVALID_ARGUMENT for
  // a count below 1 or above the capacity.
  absl::StatusOr<StagingRun> Allocate(int count);
  // Gives `run` back and empties it; nothing for an empty run. Freeing slots
  // that are not held is a broken invariant (CHECK).
  void Free(StagingRun& run);

  // The slot ids of `run` in order, to describe it as the blocks of a
  // layer (kvtransfer::PagedKvSlices over layout() gives one slice per
  // layer).
  static std::vector<int32_t> SlotIds(const StagingRun& run);

  // Appends the copies of layer `layer` of device blocks `blocks` (the
  // device cache laid out as `device_layout` of Create) to slots `run`,
  // block i to slot run.first + i, as byte offsets from the device cache
  // (src) and data() (dst). Ranges of adjacent device blocks are merged.
  // `blocks` must have run.count entries.
  void AppendToHost(int layer, std::span<const int32_t> blocks, const StagingRun& run,
                    std::vector<CopyRange>& ranges) const;
  // The reverse: slots `run` (src, from data()) to device blocks `blocks`
  // (dst, from the device cache).
  void AppendToDevice(int layer, const StagingRun& run, std::span<const int32_t> blocks,
                      std::vector<CopyRange>& ranges) const;

 private:
  KvStaging(const KvLayout& device_layout, KvLayout layout, std::unique_ptr<DeviceBuffer> buffer);
  // Appends one copy, merged into the last one when both ends continue it.
  static void Append(size_t src, size_t dst, size_t bytes, std::vector<CopyRange>& ranges);

  // Constant after construction.
  const KvLayout device_layout_;
  const KvLayout layout_;
  const std::unique_ptr<DeviceBuffer> buffer_;

  // Free runs: first slot -> count; never two adjacent ones.
  std::map<int, int> free_runs_;
  int free_ = 0;
};

// Slots a worker stages through by default: room for four prompts of the
// longest context, but never more than the KV pool's blocks.
int DefaultStagingSlots(const KvLayout& device_layout, int max_context);
// The fewest slots a worker accepts: the longest prompt's blocks (at most
// max_context - 1 tokens), or the whole pool when that is smaller, so that
// every prompt the pool can hold also fits the staging alone.
int MinStagingSlots(const KvLayout& device_layout, int max_context);

// How a worker's KV cache meets its transport, for the start-up log:
// "direct host" without staging; with it, "device via host staging", and
// why: the transport `transport_name` has no device memory support, or it
// has (`transport_device_memory`) but registering device memory directly is
// not implemented.
std::string KvPathDescription(const KvStaging* staging, std::string_view transport_name,
                              bool transport_device_memory);

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_KV_STAGING_H_
