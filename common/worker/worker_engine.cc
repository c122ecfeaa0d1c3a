#include "common/worker/worker_engine.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/kvcache/kv_layout.h"

namespace tandem {

void* WorkerEngine::transport_memory() const {
  return staging != nullptr ? staging->data() : engine->kv_cache();
}

size_t WorkerEngine::transport_bytes() const {
  return staging != nullptr ? staging->bytes() : engine->kv_cache_bytes();
}

int DefaultKvBlocks(const ModelConfig& config, int block_size) {
  return 8 * static_cast<int>(BlocksFor(config.seq_len, block_size));
}

absl::StatusOr<WorkerEngine> CreateWorkerEngine(const ModelWeights& weights,
                                                std::unique_ptr<Backend> backend,
                                                const WorkerEngineOptions& options) {
  EngineOptions engine_options;
  engine_options.block_size = options.block_size;
  engine_options.kv_dtype = options.kv_dtype;
  engine_options.num_blocks = options.kv_blocks > 0
                                  ? options.kv_blocks
                                  : DefaultKvBlocks(weights.config, options.block_size);
  if (options.kv_blocks == 0) engine_options.gpu_memory_fraction = options.gpu_memory_fraction;
  engine_options.max_batch_tokens = options.max_batch_tokens;
  engine_options.max_logit_rows = options.max_logit_rows;
  WorkerEngine out;
  ASSIGN_OR_RETURN(out.engine, Engine::Create(weights, std::move(backend), engine_options));
  ASSIGN_OR_RETURN(out.staging, KvStaging::ForEngine(*out.engine, options.kv_staging_blocks));
  if (options.warm_up_tokens > 0) {
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(const int tokens, WarmUpEngine(*out.engine, options.warm_up_tokens));
    if (tokens > 0) {
      LOG(INFO) << options.role << " worker warmed up with " << tokens << " tokens in "
                << absl::Now() - start;
    } else {
      LOG(WARNING) << options.role
                   << " worker not warmed up: its step, context or KV pool is too small for a "
                      "warm-up prompt";
    }
  }
  LOG(INFO) << options.role << " worker KV path: "
            << KvPathDescription(out.staging.get(), options.transport_name,
                                 options.transport_device_memory)
            << (out.staging != nullptr
                    ? absl::StrCat(", ", out.staging->capacity(), " blocks of staging")
                    : "");
  return out;
}

absl::StatusOr<int> WarmUpEngine(Engine& engine, int tokens) {
  const StepLimits limits = engine.step_limits();
  const int n = std::min({tokens, limits.max_batch_tokens, limits.seq_len - 1});
  const int blocks = (n + 1 + limits.block_size - 1) / limits.block_size;
  if (n <= 0 || engine.block_pool().num_free() < blocks) return 0;
  std::vector<int32_t> prompt(n);
  for (int i = 0; i < n; ++i) {
    prompt[i] = static_cast<int32_t>((int64_t{i} * 7919 + 1) % limits.vocab_size);
  }
  BlockTable table = engine.NewSequence();
  const BatchItem prefill{.table = &table, .tokens = prompt};
  absl::StatusOr<std::vector<float>> logits = engine.Step({&prefill, 1});
  if (logits.ok()) {
    std::vector<int32_t> picks;
    const int32_t next = prompt.back();
    const BatchItem decode{
        .table = &table, .tokens = {&next, 1}, .want_logits = true, .pick_greedy = true};
    logits = engine.Step({&decode, 1}, nullptr, &picks);
  }
  engine.Release(table);
  // The made-up prompt's routing is no user's: the expert load counts served tokens.
  engine.ResetExpertLoad();
  if (!logits.ok()) return logits.status();
  return n;
}

std::string LoggedFingerprint(const ModelWeights& weights) {
  const absl::Time start = absl::Now();
  std::string fingerprint = weights.Fingerprint();
  LOG(INFO) << "weights fingerprint " << fingerprint << " (" << DTypeName(weights.dtype())
            << " weights, hashed in " << absl::Now() - start << ")";
  return fingerprint;
}

}  // namespace tandem
