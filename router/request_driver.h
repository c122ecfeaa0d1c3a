// RequestDriver: one client request, as a state machine driven by the
// callbacks of its worker calls (router/worker_channel.h). No thread waits
// for it: every step runs on whichever thread delivered the event, one step
// at a time per request (a strand: events that arrive while a step runs
// are queued and run by that thread after it), and nothing blocks.
//
//   disaggregated: DecodeWorker.Generate -> `reserved` -> PrefillWorker.Prefill
//     -> first tokens to the client -> DecodeWorker.Start -> tokens ->
//     a `finished` per choice -> end;
//     a prefill failure before the first token (no answer within
//     PrefillAnswerBudget counts as one) is retried once on another
//     prefill worker with a fresh decode reservation;
//   local: DecodeWorker.Generate(local_prefill) -> tokens -> finished.
// A decode stream lost after tokens reached the client (UNAVAILABLE or
// CANCELLED not by the router: the worker died, its connection broke, it
// shut down; or its worker stopped answering the registry's health polls:
// hung or cut off) moves to another decode worker, at most
// DriverOptions::max_migrations times: the new worker computes the prompt
// and each choice's tokens so far (DecodeRequest.resume), replays them
// through the choice's sampler, and sends only what follows, so the client
// sees a pause and exactly the tokens an unfaulted run gives.
// A decode worker that refuses with UNAVAILABLE or RESOURCE_EXHAUSTED
// before its first event (dead, draining, full), or sends no `reserved`
// within --reserve_timeout (hung: the stream is cancelled, so the worker
// frees the reservation when it wakes), is replaced once. When every decode
// worker is full, a request not yet started waits in the router's
// DecodeQueue (router/decode_queue.h) until one admits it, for at most
// --queue_timeout since its arrival; its timeline's router_queue counts
// that wait. Each
// decode stream gets its own worker-side request id,
// "<client id>/<router sequence>.<stream>". Tokens are detokenized
// incrementally, per choice, and checked for stop strings on the way to the
// client.
//
// Its parts, a file each: the decode stream and its refusals
// (request_driver.cc), the prefill phase and its retry
// (request_driver_prefill.cc), migration and handoff
// (request_driver_migration.cc), the wait for a decode slot
// (request_driver_queue.cc), and the client-facing stream: detokenising,
// stop strings, echo, each choice's end and the request's
// (request_driver_stream.cc).
//
// When it ends, the request is counted in RouterMetrics and leaves one JSON
// trace line (request_trace.cc) in the RequestLog, or the INFO log:
//   {"request_id", "arrival_unix_us" (on the core's clock), "status" (ok,
//    invalid_argument, ...), "error" (if not ok),
//    "finish_reason" (of choice 0), "prompt_tokens", "completion_tokens"
//    (all choices), "n", "timeline_us": {"router_queue", "reserve",
//    "prefill_call", "prefill_queue", "prefill", "kv_transfer",
//    "decode_queue", "first_token", "end"},
//    "prefill_worker", "decode_worker", "disaggregated", "routing" (why: the
//    policy's reasons), "prefill_errors" (if any)}
//
// Thread-safe.
#ifndef TANDEM_ROUTER_REQUEST_DRIVER_H_
#define TANDEM_ROUTER_REQUEST_DRIVER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
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
#include "common/base/executor.h"
#include "common/chat/chat_template.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/worker/finish_reason_proto.h"
#include "router/decode_queue.h"
#include "router/prefix_routing.h"
#include "router/request_core.h"
#include "router/request_validation.h"
#include "router/router_metrics.h"
#include "router/stop_matcher.h"
#include "router/worker_channel.h"
#include "router/worker_registry.h"
#include "tandem/v1/generate.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::router {

struct DriverOptions {
  // Prompts of at most this many tokens are prefilled on the decode worker.
  int local_prefill_tokens = 0;
  // Prefill on a decode worker with nothing waiting when every prefill
  // worker holds this many prompts (DecidePrefill); 0: never.
  int prefill_burst_queue = 0;
  // Whole-request limit when the client gives no timeout.
  absl::Duration request_timeout = absl::Seconds(300);
  // How long a decode worker may take to answer a reservation (`reserved`)
  // before the router cancels it (the worker frees what it reserved once it
  // sees the cancellation) and tries another decode worker: a hung worker
  // costs a request this much, not gRPC's keepalive timeout.
  absl::Duration reserve_timeout = absl::Seconds(2);
  // How long a prefill worker may take to answer, per unit of work: the
  // request's own prompt counts one unit per started 1024 tokens, and every
  // request this router already has open on that worker one more (it may
  // be queued behind them). Then the answer is abandoned and the request
  // retried as when the worker is lost, and so are this router's other
  // requests still waiting on that worker (Worker::MarkUnresponsive). See
  // PrefillAnswerBudget.
  absl::Duration prefill_answer_timeout = absl::Seconds(2);
  // How many times a request's stream may move to another decode worker
  // after its worker was lost mid-stream (the new worker computes the
  // prompt and the tokens sent so far, and the stream resumes); 0 = never.
  int max_migrations = 2;
  // A stream whose tokens stop for this long while other streams' tokens
  // keep arriving (its worker answers health polls but does not decode it:
  // stuck, or its engine hung) is treated as lost and moves like one. The
  // deadline stretches to 8 gaps between the stream's own tokens when its
  // worker steps slowly. 0 = off; needs a StreamProgress in the DriverEnv.
  absl::Duration decode_stall_timeout = absl::Seconds(2);
  // A stream of one choice that a draining decode worker offers moves with
  // its K/V: the new worker reserves a resume, the draining one ships the
  // K/V into it (DecodeWorker.Handoff), and nothing is recomputed. Off, or
  // when the handoff fails or takes longer than `handoff_timeout`, the new
  // worker recomputes the tokens instead.
  bool kv_handoff = true;
  absl::Duration handoff_timeout = absl::Seconds(10);
  // max_tokens when the request sets none and the context is unknown.
  int default_max_tokens = 16;
  // Where to count the request; null = nowhere. Must outlive the driver.
  RouterMetrics* metrics = nullptr;
  // Where the request's JSON trace line goes; null = the INFO log.
  RequestLog* request_log = nullptr;
  // Prefix-aware routing (--routing_policy=prefix): workers are picked by
  // cached prompt tokens against load, and the requests' prompts (and
  // finished decode sequences) are recorded in its index. Null: by load
  // alone (--routing_policy=load).
  std::shared_ptr<PrefixRouter> prefix_router;
};

// What every driver of a router shares; must outlive the drivers. The
// environment of the router's core: every time it reads comes from
// `clock`, every timer and task runs on `executor` (whose clock is
// `clock`), and the workers are reached through the registry's channels.
// When a token last reached the router from any stream: a stalled stream
// counts as lost only while others progress (the router itself, or every
// worker, pausing stalls them all).
struct StreamProgress {
  std::atomic<int64_t> last_token_unix_us{0};
};

struct DriverEnv {
  WorkerRegistry* registry = nullptr;
  StreamProgress* progress = nullptr;           // null: no stall deadline
  const Tokenizer* tokenizer = nullptr;         // null: token-id prompts only
  const ChatTemplate* chat_template = nullptr;  // null: no chat prompts
  const Clock* clock = &Clock::Real();
  Executor* executor = nullptr;
  std::string served_model_name;
  DriverOptions options;
  // Where a request that every decode worker refuses as full waits for a
  // slot, for at most `queue_timeout` since its arrival (the router's
  // --queue_timeout); null: such a request is refused at once.
  DecodeQueue* decode_queue = nullptr;
  absl::Duration queue_timeout = absl::Seconds(30);
};

// How long a prefill worker may take to answer a prompt of
// `prompt_tokens` when the router has `ahead` other requests open on it:
// `per_unit` * (ceil(prompt_tokens / 1024) + ahead). The Prefill call
// answers only once the prompt is computed and its KV shipped, so the
// budget grows with the work the worker may do before it answers.
absl::Duration PrefillAnswerBudget(absl::Duration per_unit, int prompt_tokens, int ahead);

class RequestDriver final : public RequestHandle,
                            public std::enable_shared_from_this<RequestDriver> {
 public:
  // `on_end` runs once, after the sink's OnDone.
  RequestDriver(const DriverEnv& env, GenerateParams params, std::string request_id,
                std::string worker_request_id, uint64_t fresh_seed, absl::Time arrival,
                std::shared_ptr<ResponseSink> sink, std::function<void()> on_end);
  RequestDriver(const RequestDriver&) = delete;
  RequestDriver& operator=(const RequestDriver&) = delete;

  // Validates the request (tokenizing its prompt) and sends it to the
  // workers; the outcome reaches the sink. Call once, off the thread that
  // must not see the sink (the core runs it on its own executor).
  void Run();
  void Cancel() override;

 private:
  enum class Phase { kNew, kOpening, kPrefilling, kStreaming, kDone };
  struct Choice {
    std::optional<IncrementalDetokenizer> detok;
    std::optional<StopMatcher> stop;
    std::optional<FinishReason> finish;  // Decided by the router or the worker.
    int tokens = 0;
    int32_t prev = -1;  // The last token, for logprob texts.
    // The tokens sent to the client: for the prefix index, and for a
    // migration, which resumes from them.
    std::vector<int32_t> ids;
    bool ended = false;  // Its kFinished was sent.
  };

  // Runs `step` on the strand.
  void Post(std::function<void()> step);
  void Begin();
  absl::Status Prepare();
  // Opens a decode stream; refusals before its first event try another
  // worker once.
  void OpenDecode();
  // The worker-side id of the open decode stream (and of its Prefill and
  // Start): "<client id>/<router sequence>.<stream>".
  std::string StreamRequestId() const;
  // The prefill phase (request_driver_prefill.cc), in the order it runs:
  // pick a prefill worker and reserve on a decode worker; once `reserved`,
  // send the Prefill; its answer sends the first tokens and the Start.
  void StartPrefill();
  void SendPrefill();
  // DecodeWorker.Start of the open stream's reservation (`start` names its
  // first tokens and draws); its answer reaches OnStartDone.
  void SendStart(v1::StartRequest start);
  void OnDecodeEvent(int stream, v1::DecodeEvent event);
  void OnDecodeDone(int stream, absl::Status status);
  void OnPrefillDone(int attempt, absl::StatusOr<v1::PrefillResponse> response);
  void OnStartDone(int stream, absl::Status status);
  // A refusal of the decode stream before its first event.
  void OnDecodeRefused(absl::Status status);
  // The decode queue (request_driver_queue.cc). Whether the request may
  // wait for a decode slot: a queue exists and nothing of it has started
  // on a decode worker (no resume, no handoff).
  bool CanWaitForDecode() const;
  // A fresh request parks behind those already waiting (true), so that
  // slots go in priority and arrival order.
  bool JoinDecodeQueue();
  // Every decode worker refused as full (`refusal`): parks until woken, or
  // fails once its wait is over.
  void WaitForDecode(absl::Status refusal);
  void Park();
  void OnDecodeWake(int park);
  // The wait's deadline passed.
  void OnDecodeWaitOver();
  void GiveUpWaiting();
  // The wait ended: admitted (`admitted`: the next waiter is woken, as
  // there may be room for more), or the request finished.
  void LeaveDecodeQueue(bool admitted);
  // Whether the decode stream, lost (`cause`) after tokens reached the
  // client, may move to another decode worker: migrations left, every
  // unfinished choice has a token, and another decode worker is routable.
  bool CanMigrate(const absl::Status& cause) const;
  // Moves it: the choices resume there from their tokens (resume).
  // `planned`: the worker offered the move (it drains), nothing was lost.
  void Migrate(const absl::Status& cause, bool planned = false);
  // The decode worker of the open stream drains and offered to let it go
  // (`moving`): it moves when it can, else runs on there; with its K/V
  // when the worker `ships_kv`.
  void OnDecodeWorkerDraining(bool ships_kv);
  // The K/V handoff of a move (request_driver_migration.cc): once the new
  // worker reserved the resume, the draining one ships the K/V; then the
  // Start. A failure anywhere recomputes on a decode worker instead.
  void SendHandoff();
  void OnHandoffDone(int stream, absl::StatusOr<v1::HandoffResponse> response);
  // `avoid_new`: the failure was the new worker's; the recompute goes to
  // another one when it can.
  void HandoffFailed(const absl::Status& why, bool avoid_new = false);
  // The registry found decode stream `stream`'s worker unresponsive (a
  // health poll got no answer): the stream moves when it can.
  void OnDecodeWorkerUnresponsive(int stream, const absl::Status& why);
  // Abandons the open decode stream (cancelled: the worker frees its blocks
  // when it wakes; stale from here on) and migrates it for `cause`.
  void AbandonAndMigrate(const absl::Status& cause, bool planned = false);
  // A token reached the client: the stall deadline starts over.
  void NoteProgress();
  void ArmStallTimer(absl::Time at);
  void CancelStallTimer();
  // The stall timer of decode stream `stream` fired.
  void OnStallTimer(int stream);
  // The reservation of decode stream `stream` was not answered within
  // --reserve_timeout.
  void OnReserveTimer(int stream);
  void CancelReserveTimer();
  // The prefill attempt failed before any token: retry or give up.
  void OnPrefillFailed(const absl::Status& status);
  // Another request found prefill attempt `attempt`'s worker unresponsive
  // (Worker::MarkUnresponsive): a prefill still waiting there is abandoned
  // and retried at once rather than when its own budget runs out (that
  // budget grows with the requests ahead, which a hung worker piles up).
  void OnPrefillWorkerUnresponsive(int attempt, const absl::Status& why);
  void RunLocal();
  // Every prefill attempt failed (`detail` adds to the message): the
  // request is prefilled on the decode worker, or fails when the failures
  // were not about the workers.
  void FallBackToLocal(const std::string& detail);
  void HandleStreamEvent(const v1::DecodeEvent& event);
  // Sends `ids` of `choice` to the client, checking stop tokens, stop
  // strings and max_tokens. `from_prefill`: a first token of a
  // disaggregated request, which the router checks for EOS and length
  // itself.
  void Emit(int choice, const std::vector<int32_t>& ids,
            const google::protobuf::RepeatedPtrField<v1::TokenLogprob>* logprobs,
            bool from_prefill);
  void EmitEcho(const google::protobuf::RepeatedPtrField<v1::TokenLogprob>* logprobs);
  // The choice is over (its finish decided): flushes its text and sends kFinished.
  void EndChoice(int choice);
  // All choices ended: the request is done.
  void MaybeComplete();
  bool Send(GenerateEvent event);
  // Ends the request: cancels what is in flight, logs, tells the sink.
  void Finish(absl::Status status);
  std::optional<absl::Status> OwnFault() const;
  v1::DecodeRequest MakeDecodeRequest(bool local);
  std::vector<TokenLogprob> Texts(const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& in,
                                  int32_t prev) const;
  void Log(const absl::Status& status) const;
  int64_t SinceArrivalUs() const;

  // Constant after construction.
  const DriverEnv& env_;
  const GenerateParams params_;
  const std::string request_id_;
  const std::string worker_request_id_;
  const uint64_t fresh_seed_;
  const absl::Time arrival_;
  const std::shared_ptr<ResponseSink> sink_;
  const std::function<void()> on_end_;

  std::atomic<bool> cancelled_{false};

  absl::Mutex strand_mu_;
  std::deque<std::function<void()>> strand_ ABSL_GUARDED_BY(strand_mu_);
  bool strand_running_ ABSL_GUARDED_BY(strand_mu_) = false;

  // Only strand steps touch these.
  Phase phase_ = Phase::kNew;
  ValidRequest req_;
  // The prompt's block hashes, with a prefix router.
  std::optional<PromptBlocks> prompt_blocks_;
  // Decoding began on the decode worker (Start sent, or local prefill
  // admitted): its sequences leave their blocks cached.
  bool decode_began_ = false;
  absl::Time deadline_ = absl::InfiniteFuture();
  std::vector<Choice> choices_;
  int ended_choices_ = 0;
  bool echo_sent_ = false;
  bool client_gone_ = false;
  bool local_ = false;
  // The open decode stream: its number (callbacks of older ones are
  // stale), worker, load and call.
  int stream_ = -1;
  bool awaiting_first_ = false;
  int worker_finished_ = 0;  // `finished` events of the current stream
  int stream_choices_ = 0;   // the choices it finishes (fewer when resumed)
  // Migrations so far, and the decode workers lost.
  int migrations_ = 0;
  bool resuming_ = false;  // the open stream resumes the choices' tokens
  std::vector<std::string> migrated_from_;
  int drain_moves_ = 0;  // migrations the worker offered (it drained)
  // A move whose K/V the draining worker ships: its stream stays open (the
  // worker holds the blocks) until the handoff has ended.
  struct PendingHandoff {
    std::shared_ptr<Worker> from;
    std::shared_ptr<WorkerCall> stream;
    std::string request_id;  // the stream's, on `from`
    std::shared_ptr<WorkerCall> call;
    absl::Time began;
  };
  std::optional<PendingHandoff> handoff_;
  int kv_handoffs_ = 0;
  std::shared_ptr<Worker> decode_worker_;
  std::unique_ptr<Worker::Load> decode_load_;
  std::shared_ptr<WorkerCall> decode_call_;
  // Until the stream ends (declared after decode_worker_, which must
  // outlive it).
  std::unique_ptr<Worker::Watch> decode_watch_;
  // The open stream's --reserve_timeout timer on the executor; 0: none.
  Executor::TimerId reserve_timer_ = 0;
  // The stall deadline: when a token last reached the client, the gap
  // between the current stream's tokens (an average; zero until it sent
  // two), its tokens so far, and the timer (0: none).
  absl::Time last_token_at_ = absl::InfinitePast();
  absl::Duration token_gap_ = absl::ZeroDuration();
  int stream_tokens_ = 0;
  Executor::TimerId stall_timer_ = 0;
  absl::flat_hash_set<std::string> decode_tried_;
  // The decode worker of a failed prefill attempt: the next reservation
  // goes elsewhere when another worker is routable, since the failure may
  // have been that worker's (a prefill worker cannot ship KV to a decode
  // worker cut off from the network, and the router sees only its timeout).
  std::string decode_avoid_;
  std::vector<std::string> decode_refusals_;
  bool decode_all_full_ = true;
  // The decode queue: the request's place (taken at its first park), when
  // its wait ends, whether it waits now (from its first park until
  // admitted), whether it is parked (not woken), the park's number (stale
  // wakes are dropped), whether the current OpenDecode was woken, the wait's
  // timer, and the last refusal (for the error when the wait runs out).
  std::optional<uint64_t> queue_position_;
  absl::Time wait_deadline_ = absl::InfiniteFuture();
  bool waiting_ = false;
  bool parked_ = false;
  int park_ = 0;
  bool woken_ = false;
  Executor::TimerId wait_timer_ = 0;
  std::string last_refusal_;
  v1::Reserved reserved_;
  // The prefill attempt.
  int prefill_attempt_ = 0;
  absl::flat_hash_set<std::string> prefill_tried_;
  std::shared_ptr<Worker> prefill_worker_;
  std::unique_ptr<Worker::Load> prefill_load_;
  std::shared_ptr<WorkerCall> prefill_call_;
  // Until the attempt's prefill is answered (declared after prefill_worker_,
  // which must outlive it).
  std::unique_ptr<Worker::Watch> prefill_watch_;
  // The attempt's answer budget (PrefillAnswerBudget).
  absl::Duration prefill_budget_;
  std::shared_ptr<WorkerCall> start_call_;
  absl::StatusCode last_prefill_code_ = absl::StatusCode::kUnavailable;
  // For the log line and the client's kFinished.
  Timeline timeline_;
  // When the open reservation and the last Prefill call were sent
  // (SinceArrivalUs), for timeline_.reserve_us and prefill_call_us.
  int64_t reserve_sent_us_ = 0;
  int64_t prefill_sent_us_ = 0;
  // Prompt tokens not computed (prefix cache or KV tier), those of them the
  // prefill worker's KV tier gave, those the decode worker already held
  // (not shipped), and the KV bytes shipped.
  int cached_tokens_ = 0;
  int tier_tokens_ = 0;
  int decode_held_tokens_ = 0;
  int64_t kv_bytes_ = 0;
  std::string prefill_address_;
  std::string decode_address_;
  bool disaggregated_ = false;
  std::string why_;
  std::vector<std::string> prefill_errors_;
  int decode_streams_opened_ = 0;
  absl::Time last_token_sent_;
  std::optional<absl::Status> final_status_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_REQUEST_DRIVER_H_
