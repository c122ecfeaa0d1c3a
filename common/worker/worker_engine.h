// The set-up both workers share: the engine over the worker's backend with
// its KV pool sized as the flags say, the KV staging when the backend's
// memory is not host memory, and the host memory the KV transport must
// register (the staging, or the KV cache itself).
#ifndef TANDEM_COMMON_WORKER_WORKER_ENGINE_H_
#define TANDEM_COMMON_WORKER_WORKER_ENGINE_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/compute/backend.h"
#include "common/engine/engine.h"
#include "common/engine/kv_staging.h"
#include "common/model/model_weights.h"

namespace tandem {

struct WorkerEngineOptions {
  // "prefill" or "decode", for the start-up log line.
  std::string_view role;
  int block_size = 16;
  std::optional<DType> kv_dtype = std::nullopt;
  // 0: DefaultKvBlocks, or what gpu_memory_fraction leaves on a backend that
  // reports device memory.
  int kv_blocks = 0;
  double gpu_memory_fraction = kDefaultGpuMemoryFraction;
  int max_batch_tokens = 2048;
  int max_logit_rows = 0;
  // KvStaging::ForEngine's slots (0: its default).
  int kv_staging_blocks = 0;
  // For the log line: the transport's name and whether it could register
  // device memory itself.
  std::string_view transport_name;
  bool transport_device_memory = false;
};

struct WorkerEngine {
  std::unique_ptr<Engine> engine;
  // Null when the transport reaches the KV cache directly (host memory).
  std::unique_ptr<KvStaging> staging;

  // What the transport registers: the staging, or the KV cache.
  void* transport_memory() const;
  size_t transport_bytes() const;
};

// KV blocks a kv_blocks of 0 stands for on the CPU: 8 full-context
// sequences.
int DefaultKvBlocks(const ModelConfig& config, int block_size);

// ModelWeights::Fingerprint(), with its time logged: it reads every weight
// byte once.
std::string LoggedFingerprint(const ModelWeights& weights);

// Builds the engine and, when its backend has a KvCopier, the staging, and
// logs the KV path. The errors of Engine::Create and KvStaging::ForEngine.
absl::StatusOr<WorkerEngine> CreateWorkerEngine(const ModelWeights& weights,
                                                std::unique_ptr<Backend> backend,
                                                const WorkerEngineOptions& options);

}  // namespace tandem

#endif  // TANDEM_COMMON_WORKER_WORKER_ENGINE_H_
