#include "tools/sim/sim_workers.h"

#include <utility>
#include <vector>

#include "common/base/status_macros.h"
#include "common/worker/cache_events_proto.h"
#include "decode_worker/decode_proto.h"
#include "prefill_worker/prefill_proto.h"

namespace tandem::sim {
namespace {

using router::WorkerCall;
using router::WorkerChannel;

// One call's end, delivered once: whichever of the worker's answer and the
// client's Cancel comes first wins, and what comes after is dropped (as
// gRPC drops a cancelled call's late messages).
class Call final : public WorkerCall {
 public:
  explicit Call(std::function<void()> cancel_worker) : cancel_worker_(std::move(cancel_worker)) {}

  void Cancel() override {
    if (ended_ || cancelled_) return;
    cancelled_ = true;
    std::function<void()> cancel = std::move(cancel_worker_);
    if (cancel) cancel();
  }
  void set_cancel(std::function<void()> cancel) { cancel_worker_ = std::move(cancel); }
  bool ended() const { return ended_; }
  bool cancelled() const { return cancelled_; }
  // Marks the end; false if it had ended already.
  bool End() {
    cancel_worker_ = nullptr;
    return !std::exchange(ended_, true);
  }

 private:
  std::function<void()> cancel_worker_;
  bool cancelled_ = false;
  bool ended_ = false;
};

// Posts `fn` to the router's executor at the worker's time.
void Deliver(Executor* router, const Clock* worker, std::function<void()> fn) {
  router->PostAt(worker->Now(), std::move(fn));
}

// The status a cancelled call ends with, as a transport reports it.
absl::Status CancelledCall() { return absl::CancelledError("the call was cancelled"); }

// A call answered at once (a refusal, or stats read on the spot), on the
// router's executor: never on the caller's stack.
template <typename T>
std::shared_ptr<WorkerCall> AnswerNow(Executor* router, absl::StatusOr<T> result,
                                      WorkerChannel::ResultFn<T> on_done) {
  auto call = std::make_shared<Call>(nullptr);
  router->Post([call, on_done = std::move(on_done), result = std::move(result)]() mutable {
    if (call->End()) on_done(std::move(result));
  });
  return call;
}

// The GetStats answer of a worker: its stats and its cache events after the
// cursor `request` names.
template <typename Loop>
absl::StatusOr<v1::WorkerStats> StatsReply(v1::WorkerStats stats, const Loop& loop, uint64_t epoch,
                                           const v1::StatsRequest& request) {
  CacheEventsReply(loop.cache_events(), epoch, request, &stats);
  return stats;
}

class DecodeChannel final : public WorkerChannel {
 public:
  DecodeChannel(decode::DecodeLoop* loop, uint64_t epoch, Executor* router, const Clock* clock)
      : loop_(loop), epoch_(epoch), router_(router), clock_(clock) {}

  std::shared_ptr<WorkerCall> Generate(v1::DecodeRequest request, absl::Time deadline,
                                       DecodeEventFn on_event, DoneFn on_done) override {
    auto call = std::make_shared<Call>(nullptr);
    auto done = std::make_shared<DoneFn>(std::move(on_done));
    Executor* const router = router_;
    const Clock* const clock = clock_;
    auto sink = std::make_shared<decode::ProtoEventSink>(
        [call, router, clock, on_event = std::move(on_event)](v1::DecodeEvent event) {
          Deliver(router, clock, [call, on_event, event = std::move(event)]() mutable {
            if (!call->ended() && !call->cancelled()) on_event(std::move(event));
          });
        },
        [call, router, clock, done](const absl::Status& status) {
          Deliver(router, clock, [call, done, status] {
            if (call->End()) (*done)(call->cancelled() ? CancelledCall() : status);
          });
        });
    decode::Request r = decode::FromProto(request);
    r.deadline = deadline;
    absl::StatusOr<decode::DecodeLoop::Ticket> ticket = loop_->Submit(std::move(r), sink);
    if (!ticket.ok()) {
      router_->Post([call, done, status = ticket.status()] {
        if (call->End()) (*done)(status);
      });
      return call;
    }
    decode::DecodeLoop* const loop = loop_;
    call->set_cancel([loop, t = *ticket, weak = std::weak_ptr<Call>(call), router, done] {
      loop->Cancel(t);
      // The caller of Cancel holds the call; the task keeps it until it ran.
      router->Post([call = weak.lock(), done] {
        if (call != nullptr && call->End()) (*done)(CancelledCall());
      });
    });
    return call;
  }

  std::shared_ptr<WorkerCall> Prefill(v1::PrefillRequest, absl::Time,
                                      ResultFn<v1::PrefillResponse> on_done) override {
    return AnswerNow<v1::PrefillResponse>(
        router_, absl::UnimplementedError("a decode worker serves no Prefill"), std::move(on_done));
  }

  std::shared_ptr<WorkerCall> Start(v1::StartRequest request, absl::Time,
                                    ResultFn<v1::StartResponse> on_done) override {
    auto call = std::make_shared<Call>(nullptr);
    auto done = std::make_shared<ResultFn<v1::StartResponse>>(std::move(on_done));
    Executor* const router = router_;
    const Clock* const clock = clock_;
    loop_->Start(
        request.request_id(), request.generation(), request.first_token(),
        std::vector<int32_t>(request.extra_first_tokens().begin(),
                             request.extra_first_tokens().end()),
        [call, router, clock, done](absl::Status status) {
          Deliver(router, clock, [call, done, status] {
            if (!call->End()) return;
            if (call->cancelled()) {
              (*done)(CancelledCall());
            } else if (status.ok()) {
              (*done)(v1::StartResponse());
            } else {
              (*done)(status);
            }
          });
        },
        std::vector<uint64_t>(request.sampler_draws().begin(), request.sampler_draws().end()));
    return call;
  }

  // The simulator models no drains: a move recomputes.
  std::shared_ptr<WorkerCall> Handoff(v1::HandoffRequest, absl::Time,
                                      ResultFn<v1::HandoffResponse> on_done) override {
    return AnswerNow<v1::HandoffResponse>(
        router_, absl::UnimplementedError("the simulator ships no K/V between decode workers"),
        std::move(on_done));
  }

  std::shared_ptr<WorkerCall> GetStats(v1::StatsRequest request, absl::Time,
                                       ResultFn<v1::WorkerStats> on_done) override {
    return AnswerNow(router_, StatsReply(decode::ToProto(loop_->Stats()), *loop_, epoch_, request),
                     std::move(on_done));
  }

 private:
  decode::DecodeLoop* const loop_;
  const uint64_t epoch_;
  Executor* const router_;
  const Clock* const clock_;
};

class PrefillChannel final : public WorkerChannel {
 public:
  PrefillChannel(prefill::PrefillLoop* loop, uint64_t epoch, Executor* router, const Clock* clock)
      : loop_(loop), epoch_(epoch), router_(router), clock_(clock) {}

  std::shared_ptr<WorkerCall> Generate(v1::DecodeRequest, absl::Time, DecodeEventFn,
                                       DoneFn on_done) override {
    auto call = std::make_shared<Call>(nullptr);
    router_->Post([call, on_done = std::move(on_done)] {
      if (call->End()) on_done(absl::UnimplementedError("a prefill worker serves no Generate"));
    });
    return call;
  }

  std::shared_ptr<WorkerCall> Prefill(v1::PrefillRequest request, absl::Time deadline,
                                      ResultFn<v1::PrefillResponse> on_done) override {
    auto call = std::make_shared<Call>(nullptr);
    auto done = std::make_shared<ResultFn<v1::PrefillResponse>>(std::move(on_done));
    Executor* const router = router_;
    const Clock* const clock = clock_;
    prefill::PrefillJob job = prefill::JobFromProto(request);
    job.deadline = deadline;
    const prefill::JobId id = loop_->Submit(
        std::move(job), [call, router, clock, done](absl::StatusOr<prefill::PrefillResult> result) {
          absl::StatusOr<v1::PrefillResponse> response = v1::PrefillResponse();
          if (result.ok()) {
            prefill::ResultToProto(*result, &*response);
          } else {
            response = result.status();
          }
          Deliver(router, clock, [call, done, response = std::move(response)]() mutable {
            if (!call->End()) return;
            (*done)(call->cancelled() ? CancelledCall() : std::move(response));
          });
        });
    prefill::PrefillLoop* const loop = loop_;
    call->set_cancel([loop, id, weak = std::weak_ptr<Call>(call), router, done] {
      loop->Cancel(id);
      // The caller of Cancel holds the call; the task keeps it until it ran.
      router->Post([call = weak.lock(), done] {
        if (call != nullptr && call->End()) (*done)(CancelledCall());
      });
    });
    return call;
  }

  std::shared_ptr<WorkerCall> Start(v1::StartRequest, absl::Time,
                                    ResultFn<v1::StartResponse> on_done) override {
    return AnswerNow<v1::StartResponse>(
        router_, absl::UnimplementedError("a prefill worker serves no Start"), std::move(on_done));
  }

  // The simulator models no drains: a move recomputes.
  std::shared_ptr<WorkerCall> Handoff(v1::HandoffRequest, absl::Time,
                                      ResultFn<v1::HandoffResponse> on_done) override {
    return AnswerNow<v1::HandoffResponse>(
        router_, absl::UnimplementedError("the simulator ships no K/V between decode workers"),
        std::move(on_done));
  }

  std::shared_ptr<WorkerCall> GetStats(v1::StatsRequest request, absl::Time,
                                       ResultFn<v1::WorkerStats> on_done) override {
    return AnswerNow(router_,
                     StatsReply(prefill::StatsToProto(loop_->Stats()), *loop_, epoch_, request),
                     std::move(on_done));
  }

 private:
  prefill::PrefillLoop* const loop_;
  const uint64_t epoch_;
  Executor* const router_;
  const Clock* const clock_;
};

class SimDecodeWorker final : public SimWorker {
 public:
  SimDecodeWorker(std::string address, absl::Time start, const SimWorkerOptions& sim)
      : SimWorker(std::move(address), start),
        transport_(MakeTransport(sim.fabric, sim.link, sim.cluster_clock)) {}
  ~SimDecodeWorker() override { loop_.reset(); }  // Before the transport.

  bool RunRound() override { return loop_->RunRound(); }
  std::unique_ptr<WorkerChannel> OpenChannel(Executor* router) override {
    return std::make_unique<DecodeChannel>(loop_.get(), epoch_, router, &clock());
  }
  WorkerStatsRecord Stats() const override { return loop_->Stats(); }

  const std::unique_ptr<kvtransfer::KvTransport> transport_;
  std::unique_ptr<decode::DecodeLoop> loop_;
  const uint64_t epoch_ = NewCacheEpoch();
};

class SimPrefillWorker final : public SimWorker {
 public:
  SimPrefillWorker(std::string address, absl::Time start, const SimWorkerOptions& sim)
      : SimWorker(std::move(address), start),
        transport_(MakeTransport(sim.fabric, sim.link, sim.cluster_clock)) {}
  ~SimPrefillWorker() override { loop_.reset(); }  // Before the transport.

  bool RunRound() override { return loop_->RunRound(); }
  std::unique_ptr<WorkerChannel> OpenChannel(Executor* router) override {
    return std::make_unique<PrefillChannel>(loop_.get(), epoch_, router, &clock());
  }
  WorkerStatsRecord Stats() const override { return loop_->Stats(); }

  const std::unique_ptr<kvtransfer::KvTransport> transport_;
  std::unique_ptr<prefill::PrefillLoop> loop_;
  const uint64_t epoch_ = NewCacheEpoch();
};

}  // namespace

std::unique_ptr<kvtransfer::KvTransport> SimWorker::MakeTransport(
    std::shared_ptr<kvtransfer::InProcFabric> fabric,
    const std::optional<kvtransfer::LinkModel>& link, const Clock* release_clock) {
  std::unique_ptr<kvtransfer::KvTransport> transport =
      kvtransfer::InProcTransport::Create(std::move(fabric));
  if (!link.has_value()) return transport;
  auto modelled = std::make_unique<kvtransfer::LinkModelTransport>(std::move(transport), *link,
                                                                   &clock_, release_clock);
  link_ = modelled.get();
  return modelled;
}

absl::StatusOr<std::unique_ptr<SimWorker>> NewSimDecodeWorker(const ModelWeights& weights,
                                                              SimWorkerOptions sim,
                                                              decode::DecodeLoopOptions options) {
  auto worker = std::make_unique<SimDecodeWorker>(sim.address, sim.start, sim);
  FakeClock* const clock = &worker->clock();
  options.clock = clock;
  options.own_thread = false;
  if (sim.make_executor) {
    options.make_executor = [make = sim.make_executor, clock](Engine& engine) {
      return make(engine, clock);
    };
  }
  ASSIGN_OR_RETURN(worker->loop_, decode::DecodeLoop::Create(weights, std::move(sim.backend),
                                                             worker->transport_.get(), options));
  return worker;
}

absl::StatusOr<std::unique_ptr<SimWorker>> NewSimPrefillWorker(
    const ModelWeights& weights, SimWorkerOptions sim, prefill::PrefillLoopOptions options) {
  auto worker = std::make_unique<SimPrefillWorker>(sim.address, sim.start, sim);
  FakeClock* const clock = &worker->clock();
  options.own_thread = false;
  if (sim.make_executor) {
    options.make_executor = [make = sim.make_executor, clock](Engine& engine) {
      return make(engine, clock);
    };
  }
  ASSIGN_OR_RETURN(worker->loop_,
                   prefill::PrefillLoop::Create(weights, std::move(sim.backend),
                                                worker->transport_.get(), clock, options));
  return worker;
}

}  // namespace tandem::sim
