// The decode loop's own request, event and statistics types: what the gRPC
// service translates DecodeRequest / DecodeEvent / WorkerStats to and from,
// so that the loop is tested without gRPC.
#ifndef TANDEM_DECODE_WORKER_DECODE_TYPES_H_
#define TANDEM_DECODE_WORKER_DECODE_TYPES_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/limits.h"
#include "common/engine/generate.h"
#include "common/engine/logprobs.h"
#include "common/engine/sampler.h"
#include "common/worker/worker_stats.h"

namespace tandem::decode {

// One request to decode (worker.proto DecodeRequest).
struct Request {
  // Names the request in Start; required unless `local_prefill` (one is made
  // up then). Unique among the requests the worker holds.
  std::string request_id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  // Tokens to generate in all, the first one included; at least 1.
  int max_tokens = 0;
  // Prefill the prompt here instead of receiving its KV cache.
  bool local_prefill = false;
  // Generation ends (EOS) when one of these is sampled; it is not emitted.
  // The sampler keeps them out until sampling.min_tokens were generated.
  std::vector<int32_t> stop_token_ids;
  // Completions to generate from the prompt (1 to kMaxChoices), each its own
  // sequence; choice i samples with seed ChoiceSeed(sampling.seed, i).
  int n = 1;
  // Set: every token comes with its logprob and this many alternatives (0
  // to kMaxTopLogprobs).
  std::optional<int> logprobs;
  // Local prefill only: send the prompt's logprobs before any token.
  bool prompt_logprobs = false;
  // The caller's deadline (the RPC's): the request ends DEADLINE_EXCEEDED
  // when it passes.
  absl::Time deadline = absl::InfiniteFuture();
  // Waiting requests are admitted larger first; a running request of lower
  // priority is preempted first when the KV pool runs out.
  int priority = 0;
  // A migrated request (worker.proto DecodeRequest.resume): empty, or one
  // entry per choice with the tokens it generated elsewhere.
  struct Resumed {
    std::vector<int32_t> tokens = {};
    bool finished = false;
  };
  std::vector<Resumed> resume = {};
  // The caller can move the request to another worker (worker.proto
  // DecodeRequest.movable): once the worker drains, the sink hears
  // OnMoving when every unfinished choice has a token.
  bool movable = false;
};

// How a choice ended well (worker.proto DecodeFinished).
struct Finished {
  // The choice, and whether it was the request's last to finish (nothing
  // follows it).
  int index = 0;
  bool last = true;
  FinishReason reason = FinishReason::kLength;
  // Tokens the choice produced, the first one included, a sampled stop
  // token excluded (it is never returned).
  int completion_tokens = 0;
  // Start received (local: admission) until the sequence was first stepped.
  absl::Duration decode_queue;
  // Local prefill compute; zero when the KV cache was received.
  absl::Duration prefill;
  // Reservation until every KV byte had arrived; zero when local.
  absl::Duration kv_wait;
  // Prompt tokens whose KV came from the prefix cache (local prefill: not
  // computed; remote: not shipped). The same for every choice.
  int cached_tokens = 0;
};

// A remote prefill's KV destination, reserved (worker.proto Reserved).
struct Reservation {
  // The transfer lease, for the prefill worker.
  std::string kv_descriptor;
  // Comes back in Start.
  uint64_t generation = 0;
  // Prompt tokens (whole blocks from the start) already held in the prefix
  // cache: the lease covers only the blocks after them.
  int cached_tokens = 0;
};

// Receives one request's events, in order: at most one OnReserved (remote
// prefill only), at most one OnPromptLogprobs (before any token), any number
// of OnTokens with at most one OnMoving among them, then either one OnFinished per choice (the last
// one with `last` set) or one OnFailed, which may also follow some OnFinished. Called on the decode
// loop's thread: must not block.
class EventSink {
 public:
  virtual ~EventSink() = default;
  // The KV destination is reserved; the lease goes to the prefill worker.
  virtual void OnReserved(const Reservation& reservation) = 0;
  // The prompt's logprobs, one per prompt token after the first.
  virtual void OnPromptLogprobs(std::span<const TokenLogprob> logprobs) = 0;
  // Tokens of choice `index` sampled since its previous event; with
  // Request::logprobs, one logprob per id (else empty).
  virtual void OnTokens(int index, std::span<const int32_t> ids,
                        std::span<const TokenLogprob> logprobs) = 0;
  virtual void OnFinished(const Finished& finished) = 0;
  // The worker drains and the request is movable: the caller may cancel it
  // and resume it elsewhere from the tokens it has; until then it runs on.
  // `ships_kv`: the worker can hand the stream's K/V off (Handoff).
  virtual void OnMoving(bool ships_kv) = 0;
  // The request ended with an error; every one of its KV blocks is free (or
  // is freed as soon as the transport lets go of it).
  virtual void OnFailed(const absl::Status& status) = 0;
};

// The answer to a Start: OK once the sequence is committed to the batch.
using StartDoneFn = absl::AnyInvocable<void(absl::Status)>;

// What a Handoff shipped (decode_handoff.h).
struct HandoffResult {
  uint64_t kv_bytes = 0;
  // Handoff received until the receiver confirmed every byte.
  absl::Duration transfer;
};
using HandoffDoneFn = absl::AnyInvocable<void(absl::StatusOr<HandoffResult>)>;

// Names a request its decode worker admitted (DecodeLoop::Cancel); also the
// request id of its KV lease.
using Ticket = uint64_t;

// A snapshot of the worker for WorkerStats (role "decode"; `running` counts
// the choices in the batch, `waiting` those held but not in it: queued for
// KV blocks, waiting for the KV cache or Start, prefilling locally, or
// preempted).
using LoopStats = WorkerStatsRecord;

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_TYPES_H_
