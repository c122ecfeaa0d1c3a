// The remote-prefill protocol of the decode core: the lease, the Start,
// landing staged KV and committing a received prompt into the batch.
#include "decode_worker/decode_remote_prefill.h"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "kvtransfer/slices.h"

namespace tandem::decode {

absl::Status RemotePrefill::Expect(Sequence& seq) {
  // The prompt's blocks after the cached ones, layer by layer, runs of
  // adjacent ids merged: the layout a prefill worker sends (see the
  // contract's "Layer slices").
  const KvLayout& layout = s_.engine->kv_layout();
  const int prompt_blocks = static_cast<int>(BlocksFor(seq.kv_tokens(), layout.block_size));
  const int first_block = seq.cached_tokens / layout.block_size;
  // With staging: the request's run of slots, one slice per layer.
  std::vector<std::vector<kvtransfer::Slice>> layers =
      s_.staging != nullptr
          ? kvtransfer::PagedKvSlices(s_.kv_region, layout.n_layers,
                                      s_.staging->layout().layer_bytes(), layout.block_bytes(),
                                      KvStaging::SlotIds(seq.staging))
          : kvtransfer::PagedKvSlices(
                s_.kv_region, layout.n_layers, layout.layer_bytes(), layout.block_bytes(),
                seq.choices[0].table.blocks().subspan(first_block, prompt_blocks - first_block));
  const Ticket ticket = seq.ticket;
  seq.reserved = s_.clock->Now();
  seq.lease_deadline = seq.reserved + s_.options.kv_timeout;
  ASSIGN_OR_RETURN(kvtransfer::TransferLease lease,
                   s_.receiver->Expect(kvtransfer::ReceiveRequest{
                       .request_id = ticket,
                       .layers = std::move(layers),
                       .deadline = seq.lease_deadline,
                       .done =
                           [this, ticket](uint64_t, uint64_t, const absl::Status& status) {
                             // Mid-step the engine's batch and the pool are in
                             // use: the lease's end is handled once the step
                             // has returned.
                             if (in_step_) {
                               ended_mid_step_.emplace_back(ticket, status);
                             } else {
                               OnLeaseDone(ticket, status);
                             }
                           },
                       .first_block = static_cast<uint32_t>(first_block)}));
  seq.MoveTo(Sequence::State::kReceiving);
  seq.generation = lease.generation;
  seq.sink->OnReserved(Reservation{.kv_descriptor = lease.Serialize(),
                                   .generation = lease.generation,
                                   .cached_tokens = seq.cached_tokens});
  return absl::OkStatus();
}

void RemotePrefill::Start(StartCommand cmd) {
  auto it = s_.by_request_id.find(cmd.request_id);
  if (it == s_.by_request_id.end()) {
    cmd.done(absl::NotFoundError(absl::StrCat(
        "request '", cmd.request_id,
        "' holds no reservation here (never reserved, or cancelled, expired or finished)")));
    return;
  }
  Sequence& seq = *s_.sequences.at(it->second);
  if (seq.request.local_prefill) {
    cmd.done(absl::FailedPreconditionError(
        absl::StrCat("request '", cmd.request_id, "' prefills locally; it takes no Start")));
    return;
  }
  if (seq.state == Sequence::State::kQueued) {
    cmd.done(absl::FailedPreconditionError(absl::StrCat(
        "request '", cmd.request_id, "' is queued for KV blocks; it has no reservation yet")));
    return;
  }
  if (cmd.generation != seq.generation) {
    cmd.done(absl::FailedPreconditionError(
        absl::StrCat("Start for request '", cmd.request_id, "' names generation ", cmd.generation,
                     " but its reservation has generation ", seq.generation, " (stale lease)")));
    return;
  }
  if (seq.first_tokens.has_value()) {
    cmd.done(absl::FailedPreconditionError(
        absl::StrCat("request '", cmd.request_id, "' was already started")));
    return;
  }
  if (static_cast<int>(cmd.first_tokens.size()) != seq.n()) {
    cmd.done(absl::InvalidArgumentError(absl::StrCat(
        "Start for request '", cmd.request_id, "' carries ", cmd.first_tokens.size(),
        " first tokens but the request has ", seq.n(),
        " choices; send first_token and one extra_first_tokens entry per other choice")));
    return;
  }
  for (int32_t token : cmd.first_tokens) {
    if (token < 0 || token >= s_.config.vocab_size) {
      cmd.done(absl::InvalidArgumentError(absl::StrCat("first token ", token,
                                                       " is out of range; ids must be in [0, ",
                                                       s_.config.vocab_size, ")")));
      return;
    }
  }
  if (!cmd.sampler_draws.empty() && static_cast<int>(cmd.sampler_draws.size()) != seq.n()) {
    cmd.done(absl::InvalidArgumentError(
        absl::StrCat("Start for request '", cmd.request_id, "' carries ", cmd.sampler_draws.size(),
                     " sampler draw counts but the request has ", seq.n(), " choices")));
    return;
  }
  for (uint64_t draws : cmd.sampler_draws) {
    if (draws > Sampler::kMaxReplay) {
      cmd.done(absl::InvalidArgumentError(absl::StrCat(
          "a sampler draw count of ", draws, " is out of range; at most ", Sampler::kMaxReplay)));
      return;
    }
  }
  const bool resumed = !seq.request.resume.empty();
  if (resumed && (cmd.first_tokens[0] != seq.choices[0].next_input ||
                  std::any_of(cmd.sampler_draws.begin(), cmd.sampler_draws.end(),
                              [](uint64_t d) { return d != 0; }))) {
    cmd.done(absl::InvalidArgumentError(absl::StrCat(
        "Start for resumed request '", cmd.request_id, "' carries first token ",
        cmd.first_tokens[0], "; send its last resumed token (", seq.choices[0].next_input,
        ") and no sampler draws (the worker replayed them)")));
    return;
  }
  seq.first_tokens = std::move(cmd.first_tokens);
  seq.first_draws = std::move(cmd.sampler_draws);
  seq.first_draws.resize(seq.n(), 0);
  seq.started = cmd.received;
  seq.start_done = std::move(cmd.done);
  // Otherwise it waits for the lease: OnLeaseDone commits or fails it.
  if (seq.state == Sequence::State::kKvReady) Commit(seq);
}

void RemotePrefill::OnLeaseDone(Ticket ticket, const absl::Status& status) {
  Sequence* found = s_.Find(ticket);
  if (found == nullptr) return;
  Sequence& seq = *found;
  if (seq.state == Sequence::State::kCancelling) {
    // The receiver has let go of the destination at last.
    seq.MoveTo(Sequence::State::kEnded);
    emitter_.Remove(seq);
    return;
  }
  if (!status.ok()) {
    emitter_.Fail(seq, status, /*lease_ended=*/true);
    return;
  }
  if (s_.staging != nullptr) {
    LandKv(seq);
  } else {
    KvReady(seq);
  }
}

void RemotePrefill::KvReady(Sequence& seq) {
  seq.MoveTo(Sequence::State::kKvReady);
  seq.kv_wait = s_.clock->Now() - seq.reserved;
  // The received blocks follow the cached ones; their K/V is final.
  seq.choices[0].table.Advance(seq.kv_tokens() - seq.cached_tokens);
  emitter_.CacheWrittenBlocks(seq.choices[0]);
  if (seq.first_tokens.has_value()) Commit(seq);
}

void RemotePrefill::LandKv(Sequence& seq) {
  seq.MoveTo(Sequence::State::kLanding);
  const KvLayout& layout = s_.engine->kv_layout();
  const std::span<const int32_t> blocks = seq.choices[0].table.blocks().subspan(
      seq.cached_tokens / layout.block_size, seq.staging.count);
  std::vector<CopyRange> ranges;
  for (int layer = 0; layer < layout.n_layers; ++layer) {
    s_.staging->AppendToDevice(layer, seq.staging, blocks, ranges);
  }
  const absl::StatusOr<uint64_t> ticket =
      s_.copier->ToDevice(s_.staging->data(), s_.engine->kv_cache(), ranges);
  if (!ticket.ok()) {
    emitter_.Fail(seq,
                  absl::Status(ticket.status().code(),
                               absl::StrCat("request '", seq.request.request_id,
                                            "': copying the received KV cache from host staging to "
                                            "the device failed: ",
                                            ticket.status().message())));
    return;
  }
  seq.landing = *ticket;
}

void RemotePrefill::PollLandings() {
  if (s_.staging == nullptr) return;
  std::vector<Sequence*> landing;
  for (auto& [ticket, seq] : s_.sequences) {
    if (seq->landing.has_value()) landing.push_back(seq.get());
  }
  for (Sequence* seq : landing) {
    const absl::StatusOr<bool> finished = s_.copier->Finished(*seq->landing);
    if (finished.ok() && !*finished) continue;
    seq->landing.reset();
    // Nothing reads the run any more.
    s_.staging->Free(seq->staging);
    if (seq->state == Sequence::State::kCancelling) {
      // Ended meanwhile; now nothing writes into its blocks either.
      seq->MoveTo(Sequence::State::kEnded);
      emitter_.Remove(*seq);
    } else if (!finished.ok()) {
      emitter_.Fail(*seq,
                    absl::Status(finished.status().code(),
                                 absl::StrCat("request '", seq->request.request_id,
                                              "': copying the received KV cache from host staging "
                                              "to the device failed: ",
                                              finished.status().message())));
    } else {
      KvReady(*seq);
    }
  }
}

bool RemotePrefill::landings_pending() const {
  return std::any_of(s_.sequences.begin(), s_.sequences.end(),
                     [](const auto& entry) { return entry.second->landing.has_value(); });
}

void RemotePrefill::Commit(Sequence& seq) {
  if (seq.start_done) std::exchange(seq.start_done, nullptr)(absl::OkStatus());
  if (!emitter_.ForkChoices(seq)) return;
  seq.MoveTo(Sequence::State::kRunning);
  if (!seq.request.resume.empty()) {
    // Its sampler replayed the resumed tokens at admission, and their last
    // is the input of its next step (Start checked it).
    seq.choices[0].running = true;
    return;
  }
  const std::vector<int32_t> first = *seq.first_tokens;
  for (int i = 0; i < seq.n(); ++i) {
    Choice& choice = seq.choices[i];
    // The prefill worker sampled this first token with a Sampler of the same
    // parameters and seed, which drew this many numbers from its random
    // stream: skip them, so that the tokens that follow are exactly those a
    // local run of the request gives.
    choice.sampler.Advance(seq.first_draws[i]);
    // The first token counts, but the client already has it: not emitted.
    const int32_t token = first[i];
    bool ended = false;
    if (seq.IsStop(token, 0)) {
      ended = emitter_.Finish(seq, choice, FinishReason::kEos);
    } else {
      choice.sampler.Accept(token);
      choice.generated = 1;
      if (seq.request.max_tokens <= 1) {
        ended = emitter_.Finish(seq, choice, FinishReason::kLength);
      } else {
        choice.next_input = token;
        choice.running = true;
      }
    }
    if (ended) return;  // `seq` is gone.
  }
}

void RemotePrefill::EndStep() {
  in_step_ = false;
  std::vector<std::pair<Ticket, absl::Status>> ended = std::move(ended_mid_step_);
  ended_mid_step_.clear();
  for (const auto& [ticket, status] : ended) OnLeaseDone(ticket, status);
}

}  // namespace tandem::decode
