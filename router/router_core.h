// RouterCore: the RequestCore the router's front ends share. It admits a
// request and hands it to a RequestDriver, whose state machine runs on
// the threads its worker channels call back on. Beyond max_inflight requests wait in a bounded
// queue, higher priority first (AdmissionQueue), for at most queue_timeout;
// a request is refused at once only while draining (UNAVAILABLE) or when the
// queue is full (RESOURCE_EXHAUSTED). An admitted request that every decode
// worker refuses as full waits in the DecodeQueue, within the same
// queue_timeout, and is woken whenever a request ends. Validation and
// prompt tokenization, the only CPU-heavy part of a request on the router,
// run on the core's executor, so that a long prompt never holds a network
// thread. No thread per request.
//
// Its environment: the clock every deadline and timestamp is read on, the
// executor that runs request preparation, sinks' refusals and timers, and
// the registry's worker channels. With a ManualExecutor on a FakeClock and
// in-process channels the whole core runs in one thread, deterministically
// (tools/sim).
//
// Thread-safe. The registry, tokenizer, chat template and executor must
// outlive the core; destroy the core after the front ends have stopped.
#ifndef TANDEM_ROUTER_ROUTER_CORE_H_
#define TANDEM_ROUTER_ROUTER_CORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/admission_queue.h"
#include "router/request_core.h"
#include "router/request_driver.h"

namespace tandem::router {

struct RouterCoreOptions {
  DriverOptions driver;
  // Requests served at once; more wait in the queue.
  int max_inflight = 256;
  // Requests that may wait; more are refused with RESOURCE_EXHAUSTED.
  int max_queued = 1024;
  // How long a request may wait before it is refused (RESOURCE_EXHAUSTED):
  // for a slot here, and then, from its arrival, for a decode worker with
  // room (the DecodeQueue).
  absl::Duration queue_timeout = absl::Seconds(30);
  // Requests waiting for a decode worker with room try again at least this
  // often (besides whenever a request ends).
  absl::Duration decode_retry_interval = absl::Milliseconds(200);
  // Threads that validate and tokenize prompts, when the core runs its own
  // executor.
  int prepare_threads = 2;
  // Every time the core reads. Must outlive the core.
  const Clock* clock = &Clock::Real();
  // Where preparation, callbacks and timers run; its clock must be `clock`.
  // Null: a ThreadPoolExecutor of prepare_threads that the core owns.
  Executor* executor = nullptr;
  // The lane of large preparations: a request whose prompt (text, or the
  // messages' contents) holds more than large_prepare_bytes is validated and
  // tokenized here rather than on `executor`, so that a few huge prompts
  // never hold the threads every small request needs. Null: one lane.
  Executor* large_executor = nullptr;
  int64_t large_prepare_bytes = int64_t{64} << 10;
  std::string served_model_name = "tandem";
};

class RouterCore final : public RequestCore {
 public:
  // `tokenizer` may be null (token-id prompts only, no text), and
  // `chat_template` too (no chat prompts).
  RouterCore(WorkerRegistry* registry, const Tokenizer* tokenizer,
             const ChatTemplate* chat_template, RouterCoreOptions options);
  ~RouterCore() override;  // Cancels what still runs and waits (bounded) for it.

  std::shared_ptr<RequestHandle> Submit(GenerateParams params,
                                        std::shared_ptr<ResponseSink> sink) override;
  ServedModelInfo ModelInfo() const override;
  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                bool add_special_tokens) const override;
  absl::StatusOr<std::vector<int32_t>> TokenizeChat(const std::vector<ChatTurn>& messages,
                                                    bool add_generation_prompt) const override;
  bool ChatPromptOpensThinking(const std::string& chat_template_kwargs) const override;
  absl::StatusOr<std::string> Detokenize(const std::vector<int32_t>& ids) const override;
  bool Serving() const override;

  // Refuse new requests with UNAVAILABLE from now on.
  void StartDraining();
  // Waits up to `timeout` until no request is in flight.
  bool WaitForIdle(absl::Duration timeout);
  // Cancels every request in flight or queued (as if each client had gone
  // away).
  void CancelAll();
  int inflight() const;
  int queued() const;
  // Admitted requests waiting for a decode worker with room.
  int waiting_for_decode() const { return decode_queue_->waiting(); }
  // Refuses the queued requests whose queue_timeout has passed by the
  // clock's time. A timer on the executor calls it; tests on a fake clock
  // may call it after advancing the clock.
  void ExpireQueued();

 private:
  // Runs `job` on the executor.
  void Enqueue(std::function<void()> job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnEnd(uint64_t id);
  // Creates the request's driver and starts it on a prepare thread.
  void StartLocked(uint64_t id, GenerateParams params, std::shared_ptr<ResponseSink> sink,
                   absl::Time arrival) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireQueuedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the expiry timer for the earliest queued request, if it moved.
  void ArmExpiryLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What Submit returns: cancels the request, queued or running.
  class Handle;
  void CancelRequest(uint64_t id);

  // Constant after construction. The executor the core made, if any
  // (declared first: destroyed last, after its tasks have run).
  std::unique_ptr<ThreadPoolExecutor> own_executor_;
  StreamProgress progress_;  // the drivers' stall deadlines read it
  DriverEnv env_;
  // Where env_.decode_queue points (its timer runs on env_.executor).
  const std::shared_ptr<DecodeQueue> decode_queue_;
  const RouterCoreOptions options_;
  const int64_t created_unix_;
  // What the core's timers check before they touch it.
  struct Life {
    absl::Mutex mu;
    bool alive ABSL_GUARDED_BY(mu) = true;
  };
  const std::shared_ptr<Life> life_ = std::make_shared<Life>();
  const uint64_t seed_base_;

  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Requests in flight, to cancel them all.
  std::map<uint64_t, std::weak_ptr<RequestDriver>> running_ ABSL_GUARDED_BY(mu_);
  // Requests waiting for a slot.
  struct Pending {
    GenerateParams params;
    std::shared_ptr<ResponseSink> sink;
    absl::Time arrival;
  };
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // The handle of every request queued or running: front ends may hold
  // theirs weakly, so the core keeps it until the request ends.
  std::map<uint64_t, std::shared_ptr<Handle>> handles_ ABSL_GUARDED_BY(mu_);
  AdmissionQueue queue_ ABSL_GUARDED_BY(mu_);
  // The expiry timer and the time it is set for.
  Executor::TimerId expiry_timer_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time expiry_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROUTER_CORE_H_
