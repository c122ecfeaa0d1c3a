#include "common/engine/kv_staging.h"

#include <algorithm>
#include <iterator>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<KvStaging>> KvStaging::Create(KvCopier& copier,
                                                             const KvLayout& device_layout,
                                                             int capacity) {
  if (capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV staging needs at least one slot; got ", capacity));
  }
  KvLayout layout = device_layout;
  layout.num_blocks = capacity;
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buffer,
                   copier.AllocateStaging(layout.total_bytes()));
  return std::unique_ptr<KvStaging>(new KvStaging(device_layout, layout, std::move(buffer)));
}

absl::StatusOr<std::unique_ptr<KvStaging>> KvStaging::ForEngine(Engine& engine, int requested) {
  KvCopier* copier = engine.backend().kv_copier();
  // A backend that failed to make its copier says why in its status (and
  // hands out none, which must not pass for host memory).
  RETURN_IF_ERROR(engine.backend().status());
  if (copier == nullptr) {
    if (requested != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_staging_blocks is ", requested, " but the '", std::string(engine.backend().name()),
          "' backend keeps the KV cache in host memory, which the transport reads directly; "
          "leave kv_staging_blocks at 0"));
    }
    return nullptr;
  }
  const KvLayout& layout = engine.kv_layout();
  const int max_context = engine.config().seq_len;
  const int least = MinStagingSlots(layout, max_context);
  if (requested != 0 && (requested < least || requested > layout.num_blocks)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_staging_blocks is ", requested,
        "; it must be 0 (default: ", DefaultStagingSlots(layout, max_context), ") or from ", least,
        " (the blocks of the longest prompt the KV pool can hold) to ", layout.num_blocks,
        " (the KV pool's blocks)"));
  }
  const int slots = requested != 0 ? requested : DefaultStagingSlots(layout, max_context);
  absl::StatusOr<std::unique_ptr<KvStaging>> staging = Create(*copier, layout, slots);
  if (!staging.ok()) {
    return absl::Status(
        staging.status().code(),
        absl::StrCat("allocating ", slots, " blocks of KV staging (",
                     static_cast<uint64_t>(slots) * layout.block_bytes() * layout.n_layers,
                     " bytes of page-locked host memory; lower "
                     "kv_staging_blocks): ",
                     staging.status().message()));
  }
  return staging;
}

KvStaging::KvStaging(const KvLayout& device_layout, KvLayout layout,
                     std::unique_ptr<DeviceBuffer> buffer)
    : device_layout_(device_layout), layout_(layout), buffer_(std::move(buffer)) {
  free_runs_[0] = layout_.num_blocks;
  free_ = layout_.num_blocks;
}

absl::StatusOr<StagingRun> KvStaging::Allocate(int count) {
  if (count < 1 || count > capacity()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot stage ", count, " blocks: the KV staging holds 1 to ", capacity()));
  }
  int largest = 0;
  for (auto it = free_runs_.begin(); it != free_runs_.end(); ++it) {
    const auto [first, length] = *it;
    if (length < count) {
      largest = std::max(largest, length);
      continue;
    }
    free_runs_.erase(it);
    if (length > count) free_runs_[first + count] = length - count;
    free_ -= count;
    return StagingRun{first, count};
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "no ", count, " consecutive KV staging slots are free (", free_, " of ", capacity(),
      " free, the longest run ", largest, "); they come back as transfers end"));
}

void KvStaging::Free(StagingRun& run) {
  if (run.empty()) return;
  CHECK(run.first >= 0 && run.count > 0 && run.first + run.count <= capacity())
      << "freeing staging slots [" << run.first << ", " << run.first + run.count
      << ") of a staging of " << capacity();
  int first = run.first;
  int count = run.count;
  auto next = free_runs_.lower_bound(first);
  CHECK(next == free_runs_.end() || first + count <= next->first)
      << "staging slots [" << first << ", " << first + count << ") freed twice";
  if (next != free_runs_.begin()) {
    auto prev = std::prev(next);
    CHECK(prev->first + prev->second <= first)
        << "staging slots [" << first << ", " << first + count << ") freed twice";
    if (prev->first + prev->second == first) {
      first = prev->first;
      count += prev->second;
      free_runs_.erase(prev);
    }
  }
  if (next != free_runs_.end() && next->first == first + count) {
    count += next->second;
    free_runs_.erase(next);
  }
  free_runs_[first] = count;
  free_ += run.count;
  run = StagingRun{};
}

std::vector<int32_t> KvStaging::SlotIds(const StagingRun& run) {
  std::vector<int32_t> ids(run.count);
  std::iota(ids.begin(), ids.end(), run.first);
  return ids;
}

void KvStaging::Append(size_t src, size_t dst, size_t bytes, std::vector<CopyRange>& ranges) {
  if (!ranges.empty()) {
    CopyRange& last = ranges.back();
    if (last.src_offset + last.bytes == src && last.dst_offset + last.bytes == dst) {
      last.bytes += bytes;
      return;
    }
  }
  ranges.push_back(CopyRange{src, dst, bytes});
}

void KvStaging::AppendToHost(int layer, std::span<const int32_t> blocks, const StagingRun& run,
                             std::vector<CopyRange>& ranges) const {
  CHECK(static_cast<int>(blocks.size()) == run.count)
      << blocks.size() << " blocks for a staging run of " << run.count;
  const size_t element = layout_.element_bytes();
  for (int i = 0; i < run.count; ++i) {
    Append(device_layout_.BlockOffset(layer, blocks[i]) * element,
           layout_.BlockOffset(layer, run.first + i) * element, layout_.block_bytes(), ranges);
  }
}

void KvStaging::AppendToDevice(int layer, const StagingRun& run, std::span<const int32_t> blocks,
                               std::vector<CopyRange>& ranges) const {
  CHECK(static_cast<int>(blocks.size()) == run.count)
      << blocks.size() << " blocks for a staging run of " << run.count;
  const size_t element = layout_.element_bytes();
  for (int i = 0; i < run.count; ++i) {
    Append(layout_.BlockOffset(layer, run.first + i) * element,
           device_layout_.BlockOffset(layer, blocks[i]) * element, layout_.block_bytes(), ranges);
  }
}

int DefaultStagingSlots(const KvLayout& device_layout, int max_context) {
  const int64_t per_sequence = BlocksFor(max_context, device_layout.block_size);
  return static_cast<int>(std::min<int64_t>(4 * per_sequence, device_layout.num_blocks));
}

int MinStagingSlots(const KvLayout& device_layout, int max_context) {
  // A prompt leaves room for at least one generated token.
  const int64_t longest = BlocksFor(max_context - 1, device_layout.block_size);
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(longest, device_layout.num_blocks)));
}

std::string KvPathDescription(const KvStaging* staging, std::string_view transport_name,
                              bool transport_device_memory) {
  if (staging == nullptr) return "direct host";
  if (transport_device_memory) {
    return absl::StrCat("device via host staging (", std::string(transport_name),
                        " could register device memory, but the direct path is not built)");
  }
  return absl::StrCat("device via host staging (", std::string(transport_name),
                      " has no CUDA memory support)");
}

}  // namespace tandem
