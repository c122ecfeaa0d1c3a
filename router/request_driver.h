// RequestDriver: runs one client Generate request against the workers.
//
// It runs on a thread of its own and uses the synchronous gRPC client API,
// every call bounded by the request's deadline:
//   disaggregated: DecodeWorker.Generate -> `reserved` -> PrefillWorker.Prefill
//     -> first token to the client -> DecodeWorker.Start -> tokens -> finished;
//     a prefill failure before the first token is retried once on another
//     prefill worker with a fresh decode reservation;
//   local: DecodeWorker.Generate(local_prefill) -> tokens -> finished.
// A decode worker that refuses with UNAVAILABLE before its first event (dead,
// draining) is marked unavailable and replaced once. Each decode stream gets
// its own worker-side request id, "<client id>/<router sequence>.<stream>".
// Tokens are detokenized incrementally and checked for stop strings on the
// way to the client.
//
// When it ends, the request is counted in RouterMetrics and leaves one JSON
// trace line (request_trace.cc) in the RequestLog, or the INFO log:
//   {"request_id", "status" (ok, invalid_argument, ...), "error" (if not ok),
//    "finish_reason", "prompt_tokens", "completion_tokens", "timeline_us":
//    {"router_queue", "prefill_queue", "prefill", "kv_transfer", "decode_queue",
//    "first_token", "end"}, "prefill_worker", "decode_worker", "disaggregated",
//    "routing" (why: the policy's reasons), "prefill_errors" (if any)}
//
// Thread-safe: Run() on one thread, Cancel() from any.
#ifndef TANDEM_ROUTER_REQUEST_DRIVER_H_
#define TANDEM_ROUTER_REQUEST_DRIVER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/model/incremental_detokenizer.h"
#include "common/model/tokenizer.h"
#include "common/rpc/stream_writer.h"
#include "router/request_validation.h"
#include "router/router_metrics.h"
#include "router/stop_matcher.h"
#include "router/worker_registry.h"
#include "tandem/v1/generate.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

struct DriverOptions {
  // Prompts of at most this many tokens are prefilled on the decode worker.
  int local_prefill_tokens = 0;
  // Whole-request limit when the client gives no timeout_ms.
  absl::Duration request_timeout = absl::Seconds(300);
  // Where to count the request; null = nowhere. Must outlive the driver.
  RouterMetrics* metrics = nullptr;
  // Where the request's JSON trace line goes; null = the INFO log.
  RequestLog* request_log = nullptr;
  // Renders chat prompts (GenerateRequest.messages); null = chat prompts
  // are refused. Must outlive the driver.
  const ChatTemplate* chat_template = nullptr;
};

class RequestDriver {
 public:
  // `registry`, `tokenizer` (may be null) and `clock` must outlive the
  // driver. `worker_request_id` is the request id sent to the workers,
  // unique per router (an attempt number is appended to it).
  RequestDriver(WorkerRegistry* registry, const Tokenizer* tokenizer, const Clock& clock,
                DriverOptions options, v1::GenerateRequest request, std::string request_id,
                std::string worker_request_id, absl::Time arrival, absl::Time grpc_deadline,
                std::shared_ptr<rpc::StreamWriter<v1::GenerateResponse>> writer);
  RequestDriver(const RequestDriver&) = delete;
  RequestDriver& operator=(const RequestDriver&) = delete;

  // Serves the request to its end and finishes the client stream. Blocks.
  void Run();

  // The client went away (or the router shuts down): cancels every worker
  // call of the request, which frees its KV blocks there. Non-blocking.
  void Cancel();

 private:
  class Call;  // A ClientContext that Cancel() reaches.
  using DecodeReader = grpc::ClientReader<v1::DecodeEvent>;

  // A decode worker's Generate stream, opened and its first event read.
  // Members go in reverse: reader, then call, then load.
  struct DecodeStream {
    std::shared_ptr<Worker> worker;
    std::unique_ptr<Worker::Load> load;
    std::unique_ptr<Call> call;
    std::unique_ptr<DecodeReader> reader;
    v1::DecodeEvent first;
  };

  absl::Status Drive();
  absl::Status RunLocal();
  absl::Status RunDisaggregated();
  // One disaggregated attempt. Sets *prefill_failed when the prefill worker
  // failed before any token was sent (the caller may retry).
  absl::Status TryDisaggregated(const std::string& prefill_address, bool* prefill_failed);
  // Picks a decode worker, opens its Generate stream and reads the first
  // event. A worker that refuses with UNAVAILABLE before that (dead,
  // draining) is marked so and another one is tried, once.
  absl::StatusOr<DecodeStream> OpenDecode(bool local);
  // Reads the decode stream to its end, forwarding tokens. `first`: an
  // event already read, or null.
  absl::Status ForwardDecodeStream(DecodeStream& stream, const v1::DecodeEvent* first);
  // Handles one event of the decode stream; false to stop reading.
  bool HandleDecodeEvent(const v1::DecodeEvent& event, bool* worker_finished, bool* protocol_error);
  v1::DecodeRequest MakeDecodeRequest(bool local);

  // Sends `ids` to the client (text included), checking stop tokens, stop
  // strings and max_tokens. `from_prefill`: the first token of a
  // disaggregated request, which the router must check for EOS and length
  // itself. Returns false once the request is done on the router's side
  // (finish_ set) or the client is gone.
  bool Emit(const std::vector<int32_t>& ids, bool from_prefill);
  absl::Status SendFinal();
  // The status for a worker call that failed because of us (client cancel,
  // deadline), or nullopt when the worker is to blame.
  std::optional<absl::Status> OwnFault() const;
  // Counts the finished request and writes its JSON trace line.
  void Log(const absl::Status& status) const;
  int64_t SinceArrivalUs() const;

  // Constant after construction.
  WorkerRegistry* const registry_;
  const Tokenizer* const tokenizer_;
  const Clock& clock_;
  const DriverOptions options_;
  const v1::GenerateRequest request_;
  const std::string request_id_;
  const std::string worker_request_id_;
  const absl::Time arrival_;
  const absl::Time grpc_deadline_;
  const std::shared_ptr<rpc::StreamWriter<v1::GenerateResponse>> writer_;

  // Only the Run() thread touches these.
  ValidRequest req_;
  absl::Time deadline_ = absl::InfiniteFuture();
  std::optional<IncrementalDetokenizer> detok_;
  std::optional<StopMatcher> stop_;
  std::optional<v1::FinishReason> finish_;  // Decided by the router or the worker.
  bool client_gone_ = false;
  int completion_tokens_ = 0;
  v1::Timeline timeline_;
  std::string prefill_address_;
  std::string decode_address_;
  bool disaggregated_ = false;
  std::string why_;  // Routing reasons, for the log line.
  std::vector<std::string> prefill_errors_;
  int decode_streams_opened_ = 0;  // Numbers the worker-side request ids.
  absl::Time last_token_sent_;     // For the inter-token latency.

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_REQUEST_DRIVER_H_
