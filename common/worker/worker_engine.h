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
  std::string_view transport_name = "";
  bool transport_device_memory = false;
  // A prompt of this many tokens (capped by the step and the context) and
  // one decode step run through the engine before it is handed over, then
  // freed (WarmUpEngine); 0: none.
  int warm_up_tokens = 0;
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

// Runs a made-up prompt of `tokens` tokens (at most a step's and the
// context's) and one greedy decode step through `engine`, then frees the
// sequence, so that the first real request does not pay for what a
// backend does only once: first touches of its buffers and KV pages,
// loading and starting the BLAS library and its threads, reading weights
// in from a mapped file, a GPU's lazy module loading. The pool ends as it
// began (no block cached, none held). The prompt's length, 0 when the pool
// cannot hold it (nothing ran); the step's errors.
absl::StatusOr<int> WarmUpEngine(Engine& engine, int tokens);

// Builds the engine and, when its backend has a KvCopier, the staging,
// logs the KV path, and warms the engine up when the options ask. The
// errors of Engine::Create, KvStaging::ForEngine and WarmUpEngine.
absl::StatusOr<WorkerEngine> CreateWorkerEngine(const ModelWeights& weights,
                                                std::unique_ptr<Backend> backend,
                                                const WorkerEngineOptions& options);

}  // namespace tandem

#endif  // TANDEM_COMMON_WORKER_WORKER_ENGINE_H_
