// The decode core's state of one request and its choices. Private to the
// decode core's files; touched only by the loop thread.
#ifndef TANDEM_DECODE_WORKER_SEQUENCE_H_
#define TANDEM_DECODE_WORKER_SEQUENCE_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/engine/kv_staging.h"
#include "common/engine/logprobs.h"
#include "common/engine/sampler.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/block_table.h"
#include "common/kvcache/kv_layout.h"
#include "decode_worker/decode_types.h"

namespace tandem::decode {

// One of a request's n completions: its own KV cache (choice 0's receives
// or computes the prompt; the others start from a copy of it) and sampler.
struct Choice {
  Choice(int index, const Request& request, BlockTable table)
      : index(index),
        sampler(ChoiceSampling(request, index), request.prompt, request.stop_token_ids),
        table(std::move(table)),
        tokens(request.prompt) {}

  static SamplingParams ChoiceSampling(const Request& request, int index) {
    SamplingParams params = request.sampling;
    params.seed = ChoiceSeed(request.sampling.seed, index);
    return params;
  }

  const int index;
  Sampler sampler;
  BlockTable table;
  // The tokens behind `table`: the prompt, then each token fed back once a
  // step wrote its K/V. The first table.num_tokens() have their K/V written.
  std::vector<int32_t> tokens;
  // Prefix-cache hashes of the first full blocks of `tokens`, extended as
  // blocks are registered.
  std::vector<BlockHash> hashes;
  bool running = false;  // In the batch: one decode token per step.
  bool finished = false;
  int32_t next_input = -1;
  int generated = 0;  // Tokens produced so far, the first one included.
};

struct Sequence {
  // The request's life cycle. Every request starts kQueued (held, no KV
  // blocks yet) until the pool has room for it. A remote prefill then goes
  // kAdmitted, kReceiving, (kLanding, with KV staging,) kKvReady, kRunning;
  // a local one kPrefilling, kRunning. A running request whose choices
  // cannot grow may be preempted (kPreempted: its blocks are given back)
  // and later recomputed (kRecomputing) from its prompt and the tokens it
  // generated, then runs on. Any of them may end at any point: kEnded, or kCancelling first while
  // the receiver (or the copy out of the staging) may still write into its
  // blocks. MoveTo checks every transition.
  enum class State {
    kQueued,       // Waiting for admission: no blocks held.
    kAdmitted,     // Remote: blocks held, no lease issued yet.
    kReceiving,    // Remote: its lease is open (the Start may be in already).
    kLanding,      // Remote, KV staging: the lease landed in host staging;
                   // the copy into its blocks is in flight.
    kKvReady,      // Remote: every KV byte landed; waiting for the Start.
    kPrefilling,   // Local: prompt chunks still to step (on choice 0).
    kRunning,      // Its unfinished choices are in the batch.
    kPreempted,    // Its blocks were given back; waits to be recomputed.
    kRecomputing,  // Its choices' written tokens are being computed again.
    kHandingOff,   // Out of the batch: its K/V ships to the worker it moves
                   // to (Handoff); it ends when the caller cancels it.
    kCancelling,   // Ended (the sink knows); its blocks go once the lease's
                   // done callback runs (or, from kLanding, the copy ends,
                   // or, from kHandingOff, the send ends).
    kEnded,        // Ended and its blocks given back; about to be destroyed.
  };

  static bool Legal(State from, State to) {
    switch (from) {
      case State::kQueued:
        // kPreempted: a migrated request, whose tokens are recomputed.
        return to == State::kAdmitted || to == State::kPrefilling || to == State::kPreempted ||
               to == State::kEnded;
      case State::kAdmitted:
        return to == State::kReceiving || to == State::kEnded;
      case State::kReceiving:
        return to == State::kKvReady || to == State::kLanding || to == State::kCancelling ||
               to == State::kEnded;
      case State::kLanding:
        return to == State::kKvReady || to == State::kCancelling || to == State::kEnded;
      case State::kKvReady:
      case State::kPrefilling:
      case State::kRecomputing:
        return to == State::kRunning || to == State::kEnded;
      case State::kRunning:
        return to == State::kPreempted || to == State::kHandingOff || to == State::kEnded;
      case State::kHandingOff:
        return to == State::kCancelling || to == State::kEnded;
      case State::kPreempted:
        return to == State::kRecomputing || to == State::kEnded;
      case State::kCancelling:
        return to == State::kEnded;
      case State::kEnded:
        return false;
    }
    return false;
  }
  void MoveTo(State next) {
    CHECK(Legal(state, next)) << "request '" << request.request_id << "': illegal transition "
                              << static_cast<int>(state) << " -> " << static_cast<int>(next);
    state = next;
  }
  // Waiting for KV blocks: queued or preempted.
  bool waiting_for_blocks() const { return state == State::kQueued || state == State::kPreempted; }
  // The sink has heard the end.
  bool ended() const { return state == State::kCancelling || state == State::kEnded; }
  // Expect()ed and its done callback not handled yet.
  bool lease_open() const { return state == State::kReceiving || state == State::kCancelling; }

  Sequence(Ticket ticket, Request request, std::shared_ptr<EventSink> sink)
      : ticket(ticket), request(std::move(request)), sink(std::move(sink)) {}

  // Whether `token` ends a choice that has generated `generated` tokens:
  // a stop id, once min_tokens are out.
  bool IsStop(int32_t token, int generated) const {
    return generated >= request.sampling.min_tokens &&
           std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(), token) !=
               request.stop_token_ids.end();
  }
  int prompt_len() const { return static_cast<int>(request.prompt.size()); }
  // The tokens whose K/V a remote request receives: its prompt, and for a
  // resumed one also the tokens it generated elsewhere but the last (the
  // input of its next step).
  int kv_tokens() const { return static_cast<int>(choices[0].tokens.size()); }
  int n() const { return static_cast<int>(choices.size()); }
  int unfinished() const {
    return static_cast<int>(
        std::count_if(choices.begin(), choices.end(), [](const Choice& c) { return !c.finished; }));
  }

  const Ticket ticket;
  const Request request;
  const std::shared_ptr<EventSink> sink;
  std::vector<Choice> choices;
  State state = State::kQueued;
  // Hashes of the prompt's blocks to look up at admission (PromptHashes).
  std::vector<BlockHash> prompt_hashes;
  // Prompt tokens choice 0's table took from the prefix cache (whole
  // blocks): not prefilled locally, not leased remotely.
  int cached_tokens = 0;

  // Remote prefill.
  uint64_t generation = 0;
  absl::Time lease_deadline = absl::InfiniteFuture();
  // Handoff: the sender's transfer while it ships the K/V, and its
  // caller's answer (given once: when the send ends, or when the request
  // ends first).
  std::optional<uint64_t> handoff_send;
  std::shared_ptr<HandoffDoneFn> handoff_done;
  // From Start: every choice's first token, choice 0's first.
  std::optional<std::vector<int32_t>> first_tokens;
  // From Start: the random numbers each choice's first token took.
  std::vector<uint64_t> first_draws;
  StartDoneFn start_done;  // Start waiting for the KV cache.
  // KV staging (a backend whose memory the transport cannot reach): the
  // host slots the lease lands in, held from admission until the copy into
  // the blocks has finished or the lease failed; and that copy's ticket
  // while it is in flight.
  StagingRun staging;
  std::optional<uint64_t> landing;

  // Local prefill: prompt tokens already stepped, and the logprobs of the
  // prompt so far when asked for (sent once the prompt is computed).
  int prefilled = 0;
  std::vector<TokenLogprob> prompt_logprobs;

  bool stepped = false;
  // The sink heard OnMoving (the worker drains).
  bool move_offered = false;

  // Timings.
  absl::Time admitted;
  absl::Time reserved;
  absl::Time started;  // Start received (remote) or admission (local).
  absl::Time prefill_start;
  absl::Duration decode_queue;
  absl::Duration prefill;
  absl::Duration kv_wait;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_SEQUENCE_H_
