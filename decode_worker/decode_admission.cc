// Admission of requests and the remote-prefill protocol of the decode loop:
// validating and reserving, leasing the KV destination (the KV cache, or
// host staging), Start, Cancel, copying staged KV into its blocks, and
// committing a received KV cache into the running batch.
#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "decode_worker/decode_loop.h"
#include "decode_worker/sequence.h"
#include "kvtransfer/slices.h"

namespace tandem::decode {

absl::Status DecodeLoop::Validate(const Request& r) const {
  if (r.prompt.empty()) {
    return absl::InvalidArgumentError("prompt is empty; send at least one token (e.g. BOS)");
  }
  if (static_cast<int64_t>(r.prompt.size()) >= config_.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", r.prompt.size(), " tokens; the model's context is ",
                     config_.seq_len, ", so it must be shorter than that"));
  }
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", r.prompt[i],
                                                     "; token ids must be in [0, ",
                                                     config_.vocab_size, ")"));
    }
  }
  for (int32_t id : r.stop_token_ids) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop token id ", id, " is out of range; ids must be in [0, ", config_.vocab_size, ")"));
    }
  }
  if (r.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens is ", r.max_tokens, "; it must be at least 1"));
  }
  if (!r.local_prefill && r.request_id.empty()) {
    return absl::InvalidArgumentError(
        "request_id is empty; a request without local_prefill needs one (Start names it)");
  }
  if (r.n < 1 || r.n > kMaxChoices) {
    return absl::InvalidArgumentError(
        absl::StrCat("n is ", r.n, "; ask for 1 to ", kMaxChoices, " choices"));
  }
  if (r.logprobs.has_value() && (*r.logprobs < 0 || *r.logprobs > kMaxTopLogprobs)) {
    return absl::InvalidArgumentError(absl::StrCat("logprobs is ", *r.logprobs, "; ask for 0 to ",
                                                   kMaxTopLogprobs, " alternatives"));
  }
  if (r.prompt_logprobs && !r.local_prefill) {
    return absl::InvalidArgumentError(
        "prompt_logprobs needs local_prefill; with a prefill worker, ask it for them");
  }
  return r.sampling.ValidateForVocab(config_.vocab_size);
}

std::vector<BlockHash> DecodeLoop::PromptHashes(const Request& request) const {
  // A prompt's logprobs need every prompt token computed.
  if (!options_.prefix_cache || request.prompt_logprobs) return {};
  const int block_size = engine_->kv_layout().block_size;
  // The last prompt token is always computed (or shipped): its logits give
  // the first token.
  const int max_blocks = (static_cast<int>(request.prompt.size()) - 1) / block_size;
  return HashBlocks(salt_, request.prompt, block_size, max_blocks);
}

void DecodeLoop::Enqueue(SubmitCmd cmd) {
  auto fail_now = [&](const absl::Status& status) {
    cmd.sink->OnFailed(status);
    ++failed_;
    absl::MutexLock lock(&mu_);
    held_ -= cmd.request.n;
  };
  if (by_request_id_.contains(cmd.request.request_id)) {
    return fail_now(absl::AlreadyExistsError(absl::StrCat(
        "request_id '", cmd.request.request_id, "' is already in use on this decode worker")));
  }
  // Every token each choice may hold must fit in the pool at once, or the
  // request could never end even alone.
  const int tokens = static_cast<int>(std::min<int64_t>(
      static_cast<int64_t>(cmd.request.prompt.size()) + cmd.request.max_tokens, config_.seq_len));
  const int block_size = engine_->kv_layout().block_size;
  const int n = cmd.request.n;
  const int needed = n * static_cast<int>(BlocksFor(tokens, block_size));
  const int pool_blocks = engine_->block_pool().num_blocks();
  if (needed > pool_blocks) {
    return fail_now(absl::ResourceExhaustedError(
        absl::StrCat("request needs ", needed, " KV blocks (", n, " choices of ", tokens,
                     " tokens) but this worker's pool has ", pool_blocks,
                     " in all; lower max_tokens or n, or shorten the prompt")));
  }
  auto owned = std::make_unique<Sequence>(cmd.ticket, std::move(cmd.request), std::move(cmd.sink));
  Sequence& seq = *owned;
  seq.prompt_hashes = PromptHashes(seq.request);
  seq.choices.reserve(n);
  for (int i = 0; i < n; ++i) seq.choices.emplace_back(i, seq.request, engine_->NewSequence());
  seq.admitted = cmd.admitted;
  sequences_[seq.ticket] = std::move(owned);
  by_request_id_[seq.request.request_id] = seq.ticket;
}

bool DecodeLoop::Admit(Sequence& seq) {
  // Each choice holds the prompt and room for its first decode token; the
  // running batch takes one more block per choice as each fills up.
  const int tokens = seq.prompt_len() + 1;
  BlockPool& pool = engine_->block_pool();
  const int block_size = engine_->kv_layout().block_size;
  const int n = seq.n();
  // The prompt's cached prefix, which choice 0 starts from: it needs only
  // the blocks after it fresh. Taken before counting free blocks, as an
  // unused cached block counts as free until acquired.
  std::vector<int32_t> hits = pool.AcquirePrefix(seq.prompt_hashes);
  const int fresh =
      n * static_cast<int>(BlocksFor(tokens, block_size)) - static_cast<int>(hits.size());
  if (fresh > AdmissionRoom()) {
    pool.Release(hits);
    return false;
  }
  if (staging_ != nullptr && !seq.request.local_prefill) {
    // The blocks after the cached ones land in staging first. Create made
    // it hold any prompt the pool can, so a refusal only means "not now".
    const int shipped =
        static_cast<int>(BlocksFor(seq.prompt_len(), block_size)) - static_cast<int>(hits.size());
    absl::StatusOr<StagingRun> run = staging_->Allocate(shipped);
    if (!run.ok()) {
      pool.Release(hits);
      return false;
    }
    seq.staging = *run;
  }
  cache_queried_tokens_ += seq.prompt_hashes.size() * block_size;
  cache_hit_tokens_ += hits.size() * block_size;
  seq.cached_tokens = static_cast<int>(hits.size()) * block_size;
  std::vector<BlockHash> hashes = std::move(seq.prompt_hashes);
  seq.prompt_hashes = {};
  hashes.resize(hits.size());
  for (Choice& choice : seq.choices) {
    if (choice.index == 0) choice.table.Adopt(std::move(hits), seq.cached_tokens);
    // Cannot fail: the free blocks were counted above.
    CHECK_OK(choice.table.Reserve(tokens - choice.table.num_tokens(), pool));
  }
  seq.choices[0].hashes = std::move(hashes);
  if (seq.request.local_prefill) {
    seq.MoveTo(Sequence::State::kPrefilling);
    seq.started = seq.admitted;
    seq.prefilled = seq.cached_tokens;
    return true;
  }
  seq.MoveTo(Sequence::State::kAdmitted);
  if (absl::Status s = ExpectKv(seq); !s.ok()) Fail(seq, s);
  return true;
}

absl::Status DecodeLoop::ExpectKv(Sequence& seq) {
  // The prompt's blocks after the cached ones, layer by layer, runs of
  // adjacent ids merged: the layout a prefill worker sends (see the
  // contract's "Layer slices").
  const KvLayout& layout = engine_->kv_layout();
  const int prompt_blocks = static_cast<int>(BlocksFor(seq.prompt_len(), layout.block_size));
  const int first_block = seq.cached_tokens / layout.block_size;
  // With staging: the request's run of slots, one slice per layer.
  std::vector<std::vector<kvtransfer::Slice>> layers =
      staging_ != nullptr
          ? kvtransfer::PagedKvSlices(kv_region_, layout.n_layers, staging_->layout().layer_bytes(),
                                      layout.block_bytes(), KvStaging::SlotIds(seq.staging))
          : kvtransfer::PagedKvSlices(
                kv_region_, layout.n_layers, layout.layer_bytes(), layout.block_bytes(),
                seq.choices[0].table.blocks().subspan(first_block, prompt_blocks - first_block));
  const Ticket ticket = seq.ticket;
  seq.reserved = clock_->Now();
  seq.lease_deadline = seq.reserved + options_.kv_timeout;
  ASSIGN_OR_RETURN(kvtransfer::TransferLease lease,
                   receiver_->Expect(kvtransfer::ReceiveRequest{
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

void DecodeLoop::HandleStart(StartCmd cmd) {
  auto it = by_request_id_.find(cmd.request_id);
  if (it == by_request_id_.end()) {
    cmd.done(absl::NotFoundError(absl::StrCat(
        "request '", cmd.request_id,
        "' holds no reservation here (never reserved, or cancelled, expired or finished)")));
    return;
  }
  Sequence& seq = *sequences_.at(it->second);
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
    if (token < 0 || token >= config_.vocab_size) {
      cmd.done(absl::InvalidArgumentError(absl::StrCat("first token ", token,
                                                       " is out of range; ids must be in [0, ",
                                                       config_.vocab_size, ")")));
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
    if (draws > Sampler::kMaxAdvance) {
      cmd.done(absl::InvalidArgumentError(absl::StrCat(
          "a sampler draw count of ", draws, " is out of range; at most ", Sampler::kMaxAdvance)));
      return;
    }
  }
  seq.first_tokens = std::move(cmd.first_tokens);
  seq.first_draws = std::move(cmd.sampler_draws);
  seq.first_draws.resize(seq.n(), 0);
  seq.started = cmd.received;
  seq.start_done = std::move(cmd.done);
  // Otherwise it waits for the lease: OnLeaseDone commits or fails it.
  if (seq.state == Sequence::State::kKvReady) Commit(seq);
}

void DecodeLoop::HandleCancel(Ticket ticket) {
  auto it = sequences_.find(ticket);
  if (it == sequences_.end() || it->second->ended()) return;
  Fail(*it->second, absl::CancelledError(absl::StrCat("request '", it->second->request.request_id,
                                                      "' cancelled by the client")));
}

void DecodeLoop::OnLeaseDone(Ticket ticket, const absl::Status& status) {
  auto it = sequences_.find(ticket);
  if (it == sequences_.end()) return;
  Sequence& seq = *it->second;
  if (seq.state == Sequence::State::kCancelling) {
    // The receiver has let go of the destination at last.
    seq.MoveTo(Sequence::State::kEnded);
    Remove(seq);
    return;
  }
  if (!status.ok()) {
    Fail(seq, status, /*lease_ended=*/true);
    return;
  }
  if (staging_ != nullptr) {
    LandKv(seq);
  } else {
    KvReady(seq);
  }
}

void DecodeLoop::KvReady(Sequence& seq) {
  seq.MoveTo(Sequence::State::kKvReady);
  seq.kv_wait = clock_->Now() - seq.reserved;
  // The received blocks follow the cached ones; their K/V is final.
  seq.choices[0].table.Advance(seq.prompt_len() - seq.cached_tokens);
  CacheWrittenBlocks(seq.choices[0]);
  if (seq.first_tokens.has_value()) Commit(seq);
}

void DecodeLoop::LandKv(Sequence& seq) {
  seq.MoveTo(Sequence::State::kLanding);
  const KvLayout& layout = engine_->kv_layout();
  const std::span<const int32_t> blocks = seq.choices[0].table.blocks().subspan(
      seq.cached_tokens / layout.block_size, seq.staging.count);
  std::vector<CopyRange> ranges;
  for (int layer = 0; layer < layout.n_layers; ++layer) {
    staging_->AppendToDevice(layer, seq.staging, blocks, ranges);
  }
  const absl::StatusOr<uint64_t> ticket =
      copier_->ToDevice(staging_->data(), engine_->kv_cache(), ranges);
  if (!ticket.ok()) {
    Fail(seq, absl::Status(ticket.status().code(),
                           absl::StrCat("request '", seq.request.request_id,
                                        "': copying the received KV cache from host staging to "
                                        "the device failed: ",
                                        ticket.status().message())));
    return;
  }
  seq.landing = *ticket;
}

void DecodeLoop::PollLandings() {
  if (staging_ == nullptr) return;
  std::vector<Sequence*> landing;
  for (auto& [ticket, seq] : sequences_) {
    if (seq->landing.has_value()) landing.push_back(seq.get());
  }
  for (Sequence* seq : landing) {
    const absl::StatusOr<bool> finished = copier_->Finished(*seq->landing);
    if (finished.ok() && !*finished) continue;
    seq->landing.reset();
    // Nothing reads the run any more.
    staging_->Free(seq->staging);
    if (seq->state == Sequence::State::kCancelling) {
      // Ended meanwhile; now nothing writes into its blocks either.
      seq->MoveTo(Sequence::State::kEnded);
      Remove(*seq);
    } else if (!finished.ok()) {
      Fail(*seq, absl::Status(finished.status().code(),
                              absl::StrCat("request '", seq->request.request_id,
                                           "': copying the received KV cache from host staging "
                                           "to the device failed: ",
                                           finished.status().message())));
    } else {
      KvReady(*seq);
    }
  }
}

bool DecodeLoop::landings_pending() const {
  return std::any_of(sequences_.begin(), sequences_.end(),
                     [](const auto& entry) { return entry.second->landing.has_value(); });
}

void DecodeLoop::Commit(Sequence& seq) {
  if (seq.start_done) std::exchange(seq.start_done, nullptr)(absl::OkStatus());
  if (!ForkChoices(seq)) return;
  seq.MoveTo(Sequence::State::kRunning);
  const std::vector<int32_t> first = *seq.first_tokens;
  for (int i = 0; i < seq.n(); ++i) {
    Choice& choice = seq.choices[i];
    // The prefill worker sampled this first token with a Sampler of the same
    // parameters and seed, which drew this many numbers from its random
    // stream: skip them, so that the tokens that follow are exactly those a
    // local run of the request gives.
    CHECK(choice.sampler.Advance(seq.first_draws[i]));
    // The first token counts, but the client already has it: not emitted.
    const int32_t token = first[i];
    bool ended = false;
    if (seq.IsStop(token, 0)) {
      ended = Finish(seq, choice, FinishReason::kEos);
    } else {
      choice.sampler.Accept(token);
      choice.generated = 1;
      if (seq.request.max_tokens <= 1) {
        ended = Finish(seq, choice, FinishReason::kLength);
      } else {
        choice.next_input = token;
        choice.running = true;
      }
    }
    if (ended) return;  // `seq` is gone.
  }
}

bool DecodeLoop::ForkChoices(Sequence& seq) {
  const Choice& source = seq.choices[0];
  for (int i = 1; i < seq.n(); ++i) {
    if (absl::Status s =
            engine_->CopySequence(source.table, seq.prompt_len(), seq.choices[i].table);
        !s.ok()) {
      Fail(seq, absl::InternalError(absl::StrCat("copying the prompt's KV cache to choice ", i,
                                                 ": ", s.message())));
      return false;
    }
  }
  return true;
}

}  // namespace tandem::decode
