// The benchmark's client: streaming Generate calls on gRPC's callback API,
// multiplexed over a few channels (no thread per call), to the router or,
// for the loopback floor, straight to a decode worker. Each call reports
// when its first token arrived and how it ended.
#ifndef TANDEM_TOOLS_ROUTER_BENCH_STREAM_CLIENT_H_
#define TANDEM_TOOLS_ROUTER_BENCH_STREAM_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"

namespace tandem::router_bench {

// How one call ended.
struct CallOutcome {
  // A message carrying a token arrived, `ttft` after the call was started.
  bool got_token = false;
  absl::Duration ttft;
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
};

// Where calls go. Thread-safe.
class StreamTarget {
 public:
  using OnFirst = std::function<void()>;
  using OnDone = std::function<void(const CallOutcome&)>;

  virtual ~StreamTarget() = default;

  // Starts a call generating `max_tokens` tokens. `on_first` (may be empty)
  // runs when its first token arrives, `on_done` once when it ends; both run
  // on gRPC threads and must not block. Never blocks.
  virtual void Call(int max_tokens, OnFirst on_first, OnDone on_done) = 0;
};

struct TargetOptions {
  // host:port.
  std::string address;
  // Connections the calls are spread over (round robin).
  int channels = 4;
  // Prompts are this many token ids, drawn in [3, vocab_size).
  int prompt_tokens = 16;
  int vocab_size = 512;
  // Every call's deadline.
  absl::Duration timeout = absl::Seconds(120);
  uint64_t seed = 1;
};

// tandem.v1.Router.Generate with token-id prompts, greedy.
std::unique_ptr<StreamTarget> RouterTarget(const TargetOptions& options);
// tandem.v1.DecodeWorker.Generate with local_prefill: the same stream
// without the router in between.
std::unique_ptr<StreamTarget> DecodeWorkerTarget(const TargetOptions& options);

}  // namespace tandem::router_bench

#endif  // TANDEM_TOOLS_ROUTER_BENCH_STREAM_CLIENT_H_
