// What a worker reports and decides about its engine: the engine's part of
// the stats (device memory, KV cache, failure), and the refusal of new
// requests once the engine failed (Engine::status()). Both are thread-safe,
// as Engine::status() is.
#ifndef TANDEM_COMMON_WORKER_WORKER_HEALTH_H_
#define TANDEM_COMMON_WORKER_WORKER_HEALTH_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/engine/engine.h"
#include "common/worker/worker_stats.h"

namespace tandem {

// Sets the fields of `stats` that come from `engine` alone.
inline void AddEngineStats(const Engine& engine, WorkerStatsRecord& stats) {
  stats.device_memory_total_bytes = engine.device_memory_bytes();
  stats.kv_cache_bytes = engine.kv_cache_bytes();
  stats.engine_error = std::string(engine.status().message());
}

// OK while `engine` works; once it failed, UNAVAILABLE naming `worker` and
// the cause, for a new request: the worker will never serve it, another
// one can.
inline absl::Status EngineRefusal(const Engine& engine, std::string_view worker) {
  const absl::Status failure = engine.status();
  if (failure.ok()) return failure;
  return absl::UnavailableError(
      absl::StrCat(std::string(worker), " cannot compute: ", failure.message()));
}

}  // namespace tandem

#endif  // TANDEM_COMMON_WORKER_WORKER_HEALTH_H_
