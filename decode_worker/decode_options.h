// The decode worker's options: its KV pool, batching, schedule policy,
// prefix cache and timeouts, and the seams a simulator or a timing test
// replaces (clock, step executor, own thread). DecodeLoop::Create checks
// them.
#ifndef TANDEM_DECODE_WORKER_DECODE_OPTIONS_H_
#define TANDEM_DECODE_WORKER_DECODE_OPTIONS_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/dtype.h"
#include "common/engine/engine.h"
#include "common/engine/step_executor.h"
#include "decode_worker/decode_metrics.h"
#include "decode_worker/schedule_policy.h"
#include "kvtransfer/transfer_receiver.h"

namespace tandem::decode {

struct DecodeLoopOptions {
  // Reported in stats so that the router can check every worker serves the
  // same model: the served name and ModelWeights::Fingerprint() of the
  // weights (empty: Create computes it).
  std::string model_name;
  std::string weights_fingerprint;
  int block_size = 16;
  // Element type of the KV cache; unset: the weights' type. Every worker of
  // a pool must use the same one (KV blocks are copied byte for byte).
  std::optional<DType> kv_dtype;
  // KV blocks in the pool; 0 sizes it for 8 full-context sequences, or,
  // with a backend that reports device memory, to what
  // gpu_memory_fraction of it leaves (EngineOptions).
  int kv_blocks = 0;
  double gpu_memory_fraction = kDefaultGpuMemoryFraction;
  // Blocks admission leaves free for the running sequences to grow into
  // (fewer preemptions; less room for waiting requests); -1: 2% of the
  // pool, at least 1. Below the pool's size.
  int kv_watermark_blocks = -1;
  // Most tokens one step carries (decode tokens and prefill chunks).
  int max_batch_tokens = 2048;
  // How a step is filled (schedule_policy.h).
  SchedulePolicyKind schedule_policy = SchedulePolicyKind::kDecodePriority;
  // The chunked policy's tokens per step, decode tokens included: at least
  // max_sequences (so that a waiting prompt always gains a chunk) and at
  // most max_batch_tokens.
  int prefill_chunk_tokens = 512;
  // Most sequences held at once (running, waiting and being admitted): a
  // request counts once per choice.
  int max_sequences = 64;
  // How long a reservation waits for its KV cache and its Start.
  absl::Duration kv_timeout = absl::Seconds(30);
  // Chunk size and checksums of the leases this worker issues.
  kvtransfer::ReceiverOptions receiver;
  // Keep computed and received KV blocks in a prefix cache and reuse them
  // for prompts that start with the same tokens.
  bool prefix_cache = true;
  // Blocks of host staging received KV lands in when the backend has a
  // KvCopier (device memory); 0: DefaultStagingSlots(). Must be 0 for a
  // backend in host memory. A remote request waits for admission until
  // its blocks fit.
  int kv_staging_blocks = 0;
  // Whether the transport could register device memory itself (for the
  // start-up log line only: device KV always goes through the staging).
  bool transport_device_memory = false;
  // Tokens of the made-up prompt the engine is warmed up with before the
  // worker serves (WorkerEngineOptions::warm_up_tokens); 0: none.
  int warm_up_tokens = 0;
  // A second transport (the receiver consumes the first one's events)
  // over which a draining worker ships the K/V of the streams it hands
  // off; null: handoffs are refused and moves recompute. Must outlive the
  // loop. Unused when the KV cache is not in host memory (staging).
  kvtransfer::KvTransport* handoff_transport = nullptr;
  // Time source for deadlines and timings; null: the real clock.
  const Clock* clock = nullptr;
  // Prometheus metrics to feed; null = none. Must outlive the loop.
  DecodeMetrics* metrics = nullptr;
  // What runs the steps, made once the engine exists; null: the engine. A
  // simulator or a timing test gives a SimulatedExecutor over the engine's
  // block pool and a FakeClock (`clock` above), and the loop schedules as
  // it would on real compute.
  std::function<std::unique_ptr<StepExecutor>(Engine& engine)> make_executor = nullptr;
  // False: Create starts no thread, and the caller drives the loop a round
  // at a time with RunRound() (a discrete-event simulator, on the clock its
  // executor moves).
  bool own_thread = true;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_OPTIONS_H_
