#include "common/worker/kv_tier_flags.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/kvcache/host_tier.h"
#include "common/kvcache/ssd_tier.h"

ABSL_FLAG(double, kv_host_tier_gib, 0,
          "GiB of host memory for a KV tier below the prefix cache: evicted prompt blocks are "
          "kept there and loaded back, verified, for a prompt that shares them; with "
          "--kv_tier_dir what it evicts goes on to the SSD tier. 0: none");
ABSL_FLAG(std::string, kv_tier_dir, "",
          "A directory for the SSD KV tier below the prefix cache: evicted prompt blocks are "
          "written there and loaded back, verified, for a prompt that shares them (kept across "
          "restarts; a directory per worker). Empty: no tier");
ABSL_FLAG(double, kv_tier_gib, 0,
          "The SSD KV tier's bound in GiB (records and headers); needed with --kv_tier_dir");
ABSL_FLAG(absl::Duration, kv_tier_wait, absl::Milliseconds(250),
          "Longest a request waits for its prefix blocks from the KV tier; what has not "
          "arrived by then is computed");
ABSL_FLAG(int, kv_tier_io_threads, 2,
          "Threads that copy blocks out of the host KV tier and read and write the SSD KV tier");

namespace tandem {

absl::StatusOr<WorkerKvTier> MakeWorkerKvTier(const KvTierConfig& config) {
  WorkerKvTier out;
  out.wait = config.wait;
  out.description = "off";
  if (config.dir.empty() && config.capacity_bytes != 0) {
    return absl::InvalidArgumentError("--kv_tier_gib needs --kv_tier_dir (where the tier lives)");
  }
  if (!config.dir.empty() && config.capacity_bytes == 0) {
    return absl::InvalidArgumentError(
        "--kv_tier_dir needs --kv_tier_gib, the tier's bound (e.g. --kv_tier_gib 64)");
  }
  const bool ssd = !config.dir.empty();
  const bool host = config.host_capacity_bytes != 0;
  if (!ssd && !host) return out;
  if (config.wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_tier_wait must be positive, not ", absl::FormatDuration(config.wait)));
  }
  if (config.io_threads < 1 || config.io_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_tier_io_threads must be 1 to 64, not ", config.io_threads));
  }
  out.io = std::make_unique<ThreadPoolExecutor>(config.io_threads);
  out.make = [config, io = out.io.get()](
                 const KvTierIdentity& identity) -> absl::StatusOr<std::unique_ptr<KvTier>> {
    std::unique_ptr<KvTier> tier;
    if (!config.dir.empty()) {
      absl::StatusOr<std::unique_ptr<SsdTier>> disk =
          SsdTier::Open({.dir = config.dir, .capacity_bytes = config.capacity_bytes}, identity, io);
      if (!disk.ok()) {
        return absl::Status(disk.status().code(), absl::StrCat("--kv_tier_dir ", config.dir, ": ",
                                                               disk.status().message()));
      }
      tier = std::move(*disk);
    }
    if (config.host_capacity_bytes == 0) return tier;
    absl::StatusOr<std::unique_ptr<HostTier>> memory = HostTier::Create(
        {.capacity_bytes = config.host_capacity_bytes}, identity, io, std::move(tier));
    if (!memory.ok()) return memory.status();
    return std::unique_ptr<KvTier>(std::move(*memory));
  };
  const auto gib = [](uint64_t bytes) { return static_cast<double>(bytes) / (1ull << 30); };
  std::vector<std::string> parts;
  if (host) parts.push_back(absl::StrFormat("host %.1f GiB", gib(config.host_capacity_bytes)));
  if (ssd)
    parts.push_back(absl::StrFormat("ssd %s, %.1f GiB", config.dir, gib(config.capacity_bytes)));
  out.description = absl::StrJoin(parts, " over ");
  return out;
}

absl::StatusOr<WorkerKvTier> WorkerKvTierFromFlags() {
  const double gib = absl::GetFlag(FLAGS_kv_tier_gib);
  if (!(gib >= 0) || gib > 1e6) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_tier_gib must be 0 to 1e6, not ", gib));
  }
  const double host_gib = absl::GetFlag(FLAGS_kv_host_tier_gib);
  if (!(host_gib >= 0) || host_gib > 1e5) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_host_tier_gib must be 0 to 1e5, not ", host_gib));
  }
  return MakeWorkerKvTier(
      {.host_capacity_bytes = static_cast<uint64_t>(std::llround(host_gib * (1ull << 30))),
       .dir = absl::GetFlag(FLAGS_kv_tier_dir),
       .capacity_bytes = static_cast<uint64_t>(std::llround(gib * (1ull << 30))),
       .wait = absl::GetFlag(FLAGS_kv_tier_wait),
       .io_threads = absl::GetFlag(FLAGS_kv_tier_io_threads)});
}

}  // namespace tandem
