// Prefill and decode workers that answer at once, for measuring the router
// alone: real gRPC services on the callback API that never block and start
// no thread, so that the router, not they, is the bottleneck.
//
// The decode worker answers a disaggregated Generate with `reserved` and
// sends the remaining tokens when Start arrives; a local_prefill Generate
// gets its tokens at once. In hold mode a stream sends its first token (or,
// disaggregated, waits for Start) and then nothing more until ReleaseHeld,
// so that many streams stay open at once. One choice per request (n = 1).
//
// Thread-safe.
#ifndef TANDEM_TOOLS_ROUTER_BENCH_INSTANT_WORKERS_H_
#define TANDEM_TOOLS_ROUTER_BENCH_INSTANT_WORKERS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router_bench {

// What both fakes report in GetStats: one model identity, a context and a
// KV pool large enough that the router never holds a request back.
struct InstantModel {
  std::string name = "router-bench";
  std::string weights_fingerprint = "00000000be4c4000";
  std::string kv_dtype = "f32";
  int block_size = 16;
  // Must be at least the router's tokenizer's vocabulary.
  int vocab_size = 512;
  int max_context = 4096;
  int kv_blocks = 1 << 24;
};

// The token the prefill worker samples; the decode worker's follow it.
inline constexpr int32_t kFirstToken = 100;

class InstantDecodeWorker final : public v1::DecodeWorker::CallbackService {
 public:
  explicit InstantDecodeWorker(InstantModel model) : model_(std::move(model)) {}

  // From now on, new streams stop after their first token until ReleaseHeld.
  void SetHold(bool hold) { hold_.store(hold); }
  // Sends the rest of every held stream (its tokens, then `finished`);
  // returns how many there were.
  int ReleaseHeld();
  // Waits until `n` streams are held; false on timeout.
  bool WaitForHeld(int n, absl::Duration timeout) const;

  // Generate streams not yet ended.
  int open_streams() const { return open_.load(); }
  int held() const;

  grpc::ServerWriteReactor<v1::DecodeEvent>* Generate(grpc::CallbackServerContext* ctx,
                                                      const v1::DecodeRequest* request) override;
  grpc::ServerUnaryReactor* Start(grpc::CallbackServerContext* ctx, const v1::StartRequest* request,
                                  v1::StartResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const v1::StatsRequest* request,
                                     v1::WorkerStats* response) override;

 private:
  class Stream;

  // Sends tokens `from` .. max_tokens-1, then `finished`, and ends the stream.
  void Complete(const std::shared_ptr<Stream>& stream, int from);
  void Hold(const std::shared_ptr<Stream>& stream) ABSL_LOCKS_EXCLUDED(mu_);
  void Forget(const Stream* stream) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const InstantModel model_;

  std::atomic<bool> hold_{false};
  std::atomic<int> open_{0};
  std::atomic<uint64_t> next_generation_{1};
  mutable absl::Mutex mu_;
  // Disaggregated streams waiting for Start, by request id.
  absl::flat_hash_map<std::string, std::shared_ptr<Stream>> reserved_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const Stream*, std::shared_ptr<Stream>> held_ ABSL_GUARDED_BY(mu_);
};

class InstantPrefillWorker final : public v1::PrefillWorker::CallbackService {
 public:
  explicit InstantPrefillWorker(InstantModel model) : model_(std::move(model)) {}

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* ctx,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const v1::StatsRequest* request,
                                     v1::WorkerStats* response) override;

 private:
  const InstantModel model_;
};

}  // namespace tandem::router_bench

#endif  // TANDEM_TOOLS_ROUTER_BENCH_INSTANT_WORKERS_H_
