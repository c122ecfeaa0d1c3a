// The KV tier flags a worker takes (--kv_host_tier_gib, --kv_tier_dir,
// --kv_tier_gib, --kv_tier_wait, --kv_tier_io_threads) and the tiers they
// make: host memory (common/kvcache/host_tier.h), an SSD tier under the
// directory (common/kvcache/ssd_tier.h), or host memory spilling into the
// SSD, their copies and disk operations on threads of their own.
#ifndef TANDEM_COMMON_WORKER_KV_TIER_FLAGS_H_
#define TANDEM_COMMON_WORKER_KV_TIER_FLAGS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/executor.h"
#include "common/kvcache/kv_tier.h"

ABSL_DECLARE_FLAG(double, kv_host_tier_gib);
ABSL_DECLARE_FLAG(std::string, kv_tier_dir);
ABSL_DECLARE_FLAG(double, kv_tier_gib);
ABSL_DECLARE_FLAG(absl::Duration, kv_tier_wait);
ABSL_DECLARE_FLAG(int, kv_tier_io_threads);

namespace tandem {

using MakeKvTierFn = std::function<absl::StatusOr<std::unique_ptr<KvTier>>(const KvTierIdentity&)>;

struct KvTierConfig {
  uint64_t host_capacity_bytes = 0;  // 0: no host tier
  std::string dir;                   // empty: no SSD tier
  uint64_t capacity_bytes = 0;       // the SSD tier's
  absl::Duration wait = absl::Milliseconds(250);
  int io_threads = 2;
};

// What a worker needs for its tier: the disk threads (null without a
// tier), which must outlive the worker's loop, and the maker for the loop's
// options (null without a tier).
struct WorkerKvTier {
  std::unique_ptr<Executor> io;
  MakeKvTierFn make;
  absl::Duration wait;
  std::string description;  // for the start-up log line: "off", "host N GiB", "ssd DIR, N GiB"
};

// INVALID_ARGUMENT, saying which flag to change, for an SSD size without a
// directory, a directory without a positive size, a wait that is not
// positive, or fewer than one I/O thread.
absl::StatusOr<WorkerKvTier> MakeWorkerKvTier(const KvTierConfig& config);
absl::StatusOr<WorkerKvTier> WorkerKvTierFromFlags();

}  // namespace tandem

#endif  // TANDEM_COMMON_WORKER_KV_TIER_FLAGS_H_
