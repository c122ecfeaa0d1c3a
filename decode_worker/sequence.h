// The decode loop's state of one request. Private to decode_loop.cc and
// decode_step.cc; touched only by the loop thread.
#ifndef TANDEM_DECODE_WORKER_SEQUENCE_H_
#define TANDEM_DECODE_WORKER_SEQUENCE_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/engine/sampler.h"
#include "common/kvcache/block_table.h"
#include "decode_worker/decode_loop.h"

namespace tandem::decode {

inline int BlocksFor(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

struct DecodeLoop::Sequence {
  enum class State {
    kAwaitingKv,  // Remote prefill: the KV cache or the Start is not in yet.
    kPrefilling,  // Local prefill: prompt chunks still to step.
    kRunning,     // In the batch: one decode token per step.
  };

  Sequence(Ticket ticket, Request request, std::shared_ptr<EventSink> sink, BlockTable table)
      : ticket(ticket),
        request(std::move(request)),
        sink(std::move(sink)),
        sampler(this->request.sampling),
        table(std::move(table)) {}

  bool IsStop(int32_t token) const {
    return std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(), token) !=
           request.stop_token_ids.end();
  }
  int prompt_len() const { return static_cast<int>(request.prompt.size()); }

  const Ticket ticket;
  const Request request;
  const std::shared_ptr<EventSink> sink;
  Sampler sampler;
  BlockTable table;
  State state = State::kAwaitingKv;
  // Set once the sink has heard the end; the sequence lingers only until
  // its lease's done callback lets the blocks go.
  bool ended = false;

  // Remote prefill.
  uint64_t generation = 0;
  absl::Time lease_deadline = absl::InfiniteFuture();
  bool lease_pending = false;          // Expect()ed and its done callback not run yet.
  bool kv_complete = false;            // Every KV byte of the prompt has landed.
  std::optional<int32_t> first_token;  // From Start.
  StartDoneFn start_done;              // Start waiting for the KV cache.

  // Local prefill: prompt tokens already stepped.
  int prefilled = 0;

  // Decoding.
  int32_t next_input = -1;
  int generated = 0;  // Tokens produced so far, the first one included.
  bool stepped = false;

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
