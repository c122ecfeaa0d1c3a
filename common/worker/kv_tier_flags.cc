#include "common/worker/kv_tier_flags.h"

#include <cmath>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/kvcache/ssd_tier.h"

ABSL_FLAG(std::string, kv_tier_dir, "",
          "A directory for the SSD KV tier below the prefix cache: evicted prompt blocks are "
          "written there and loaded back, verified, for a prompt that shares them (kept across "
          "restarts; a directory per worker). Empty: no tier");
ABSL_FLAG(double, kv_tier_gib, 0,
          "The SSD KV tier's bound in GiB (records and headers); needed with --kv_tier_dir");
ABSL_FLAG(absl::Duration, kv_tier_wait, absl::Milliseconds(250),
          "Longest a request waits for its prefix blocks from the KV tier; what has not "
          "arrived by then is computed");
ABSL_FLAG(int, kv_tier_io_threads, 2, "Threads that read and write the SSD KV tier");

namespace tandem {

absl::StatusOr<WorkerKvTier> MakeWorkerKvTier(const SsdTierConfig& config) {
  WorkerKvTier out;
  out.wait = config.wait;
  out.description = "off";
  if (config.dir.empty()) {
    if (config.capacity_bytes != 0) {
      return absl::InvalidArgumentError("--kv_tier_gib needs --kv_tier_dir (where the tier lives)");
    }
    return out;
  }
  if (config.capacity_bytes == 0) {
    return absl::InvalidArgumentError(
        "--kv_tier_dir needs --kv_tier_gib, the tier's bound (e.g. --kv_tier_gib 64)");
  }
  if (config.wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_tier_wait must be positive, not ", absl::FormatDuration(config.wait)));
  }
  if (config.io_threads < 1 || config.io_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_tier_io_threads must be 1 to 64, not ", config.io_threads));
  }
  out.io = std::make_unique<ThreadPoolExecutor>(config.io_threads);
  out.make = [options = SsdTierOptions{.dir = config.dir, .capacity_bytes = config.capacity_bytes},
              io = out.io.get()](
                 const KvTierIdentity& identity) -> absl::StatusOr<std::unique_ptr<KvTier>> {
    absl::StatusOr<std::unique_ptr<SsdTier>> tier = SsdTier::Open(options, identity, io);
    if (!tier.ok()) {
      return absl::Status(tier.status().code(), absl::StrCat("--kv_tier_dir ", options.dir, ": ",
                                                             tier.status().message()));
    }
    return std::unique_ptr<KvTier>(std::move(*tier));
  };
  out.description = absl::StrFormat("ssd %s, %.1f GiB", config.dir,
                                    static_cast<double>(config.capacity_bytes) / (1ull << 30));
  return out;
}

absl::StatusOr<WorkerKvTier> WorkerKvTierFromFlags() {
  const double gib = absl::GetFlag(FLAGS_kv_tier_gib);
  if (!(gib >= 0) || gib > 1e6) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_tier_gib must be 0 to 1e6, not ", gib));
  }
  return MakeWorkerKvTier(
      {.dir = absl::GetFlag(FLAGS_kv_tier_dir),
       .capacity_bytes = static_cast<uint64_t>(std::llround(gib * (1ull << 30))),
       .wait = absl::GetFlag(FLAGS_kv_tier_wait),
       .io_threads = absl::GetFlag(FLAGS_kv_tier_io_threads)});
}

}  // namespace tandem
