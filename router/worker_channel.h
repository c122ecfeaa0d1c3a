// WorkerChannel: how the router's core talks to one worker, with no
// transport in sight. The messages are tandem.v1's worker messages (plain
// protobuf values: the one definition of the worker contract, which both
// workers' services already speak); gRPC is one implementation
// (router/grpc_worker_channel.h), an in-process channel to the workers'
// cores in one thread another (tools/sim).
//
// Every call reports its outcome exactly once to its callback (and, for a
// decode stream, its events before that, in order). Callbacks never run on
// the stack of the call that started them; they run on the channel's
// threads (or its executor's), must not block, and may start other calls.
// A call's deadline is on the router's clock; at it the call ends with
// DEADLINE_EXCEEDED. WorkerCall::Cancel may be called from any thread at any
// time, also after the call ended (it then does nothing); a cancelled call
// still reports its end (CANCELLED, or whatever outcome won the race).
//
// Thread-safe.
#ifndef TANDEM_ROUTER_WORKER_CHANNEL_H_
#define TANDEM_ROUTER_WORKER_CHANNEL_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "router/worker_snapshot.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::router {

// A call in flight; dropping the handle does not cancel it.
class WorkerCall {
 public:
  virtual ~WorkerCall() = default;
  virtual void Cancel() = 0;
};

class WorkerChannel {
 public:
  using DecodeEventFn = std::function<void(v1::DecodeEvent)>;
  using DoneFn = std::function<void(absl::Status)>;
  template <typename T>
  using ResultFn = std::function<void(absl::StatusOr<T>)>;

  virtual ~WorkerChannel() = default;

  // DecodeWorker.Generate: the stream's events, then its final status.
  virtual std::shared_ptr<WorkerCall> Generate(v1::DecodeRequest request, absl::Time deadline,
                                               DecodeEventFn on_event, DoneFn on_done) = 0;
  // PrefillWorker.Prefill.
  virtual std::shared_ptr<WorkerCall> Prefill(v1::PrefillRequest request, absl::Time deadline,
                                              ResultFn<v1::PrefillResponse> on_done) = 0;
  // DecodeWorker.Start.
  virtual std::shared_ptr<WorkerCall> Start(v1::StartRequest request, absl::Time deadline,
                                            ResultFn<v1::StartResponse> on_done) = 0;
  // DecodeWorker.Handoff.
  virtual std::shared_ptr<WorkerCall> Handoff(v1::HandoffRequest request, absl::Time deadline,
                                              ResultFn<v1::HandoffResponse> on_done) = 0;
  // GetStats of the worker's role.
  virtual std::shared_ptr<WorkerCall> GetStats(v1::StatsRequest request, absl::Time deadline,
                                               ResultFn<v1::WorkerStats> on_done) = 0;
};

// Opens the channel to the worker at `address` ("ip:port", or whatever the
// implementation's addresses are), resolved from `target` (the name the
// router was given, e.g. for a TLS server name check). Called by the
// registry as workers join; must not block for long.
using WorkerChannelFactory = std::function<std::unique_ptr<WorkerChannel>(
    const std::string& address, const std::string& target, WorkerRole role)>;

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_WORKER_CHANNEL_H_
