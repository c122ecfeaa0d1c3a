// Admission of submitted requests into the KV pool, with a watermark.
#include "decode_worker/decode_admission.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem::decode {

absl::Status Admission::Validate(const Request& r, const ModelConfig& config) {
  if (r.prompt.empty()) {
    return absl::InvalidArgumentError("prompt is empty; send at least one token (e.g. BOS)");
  }
  if (static_cast<int64_t>(r.prompt.size()) >= config.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", r.prompt.size(), " tokens; the model's context is ",
                     config.seq_len, ", so it must be shorter than that"));
  }
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", r.prompt[i],
                                                     "; token ids must be in [0, ",
                                                     config.vocab_size, ")"));
    }
  }
  for (int32_t id : r.stop_token_ids) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop token id ", id, " is out of range; ids must be in [0, ", config.vocab_size, ")"));
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
  if (!r.resume.empty()) {
    if (r.prompt_logprobs) return absl::InvalidArgumentError("resume takes no prompt_logprobs");
    if (!r.local_prefill && (r.n != 1 || r.resume[0].finished)) {
      return absl::InvalidArgumentError(
          "resume without local_prefill (the K/V of the prompt and the resumed tokens arrives "
          "over a lease) takes one unfinished choice; set local_prefill for n > 1");
    }
    if (static_cast<int>(r.resume.size()) != r.n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resume has ", r.resume.size(), " entries; send one per choice (n = ", r.n, ")"));
    }
    bool any = false;
    for (size_t i = 0; i < r.resume.size(); ++i) {
      const std::vector<int32_t>& tokens = r.resume[i].tokens;
      if (r.resume[i].finished) continue;
      any = true;
      if (tokens.empty() || static_cast<int64_t>(tokens.size()) >= r.max_tokens ||
          static_cast<int64_t>(r.prompt.size() + tokens.size()) >= config.seq_len) {
        return absl::InvalidArgumentError(absl::StrCat(
            "resume[", i, "] has ", tokens.size(),
            " tokens; an unfinished choice resumes from 1 to max_tokens - 1 tokens that leave "
            "room in the context"));
      }
      for (const int32_t id : tokens) {
        if (id < 0 || id >= config.vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat("resume[", i, "] holds token ", id,
                                                         "; token ids must be in [0, ",
                                                         config.vocab_size, ")"));
        }
      }
    }
    if (!any) return absl::InvalidArgumentError("resume has no unfinished choice");
  }
  return r.sampling.ValidateForVocab(config.vocab_size);
}

std::vector<BlockHash> Admission::PromptHashes(const Request& request) const {
  // A prompt's logprobs need every prompt token computed.
  if (!s_.options.prefix_cache || request.prompt_logprobs) return {};
  const int block_size = s_.block_size();
  // The last prompt token is always computed (or shipped): its logits give
  // the first token.
  const int max_blocks = (static_cast<int>(request.prompt.size()) - 1) / block_size;
  return HashBlocks(s_.salt, request.prompt, block_size, max_blocks);
}

void Admission::Enqueue(Submission cmd) {
  auto fail_now = [&](const absl::Status& status) {
    cmd.sink->OnFailed(status);
    ++s_.failed;
    s_.on_released(cmd.request.n);
  };
  if (s_.by_request_id.contains(cmd.request.request_id)) {
    return fail_now(absl::AlreadyExistsError(absl::StrCat(
        "request_id '", cmd.request.request_id, "' is already in use on this decode worker")));
  }
  // Every token each choice may hold must fit in the pool at once, or the
  // request could never end even alone.
  const int tokens = static_cast<int>(std::min<int64_t>(
      static_cast<int64_t>(cmd.request.prompt.size()) + cmd.request.max_tokens, s_.config.seq_len));
  const int block_size = s_.block_size();
  const int n = cmd.request.n;
  const int needed = n * static_cast<int>(BlocksFor(tokens, block_size));
  const int pool_blocks = s_.pool().num_blocks();
  if (needed > pool_blocks) {
    return fail_now(absl::ResourceExhaustedError(
        absl::StrCat("request needs ", needed, " KV blocks (", n, " choices of ", tokens,
                     " tokens) but this worker's pool has ", pool_blocks,
                     " in all; lower max_tokens or n, or shorten the prompt")));
  }
  auto owned = std::make_unique<Sequence>(cmd.ticket, std::move(cmd.request), std::move(cmd.sink));
  Sequence& seq = *owned;
  seq.choices.reserve(n);
  for (int i = 0; i < n; ++i) seq.choices.emplace_back(i, seq.request, s_.engine->NewSequence());
  seq.admitted = cmd.admitted;
  if (seq.request.resume.empty()) {
    seq.prompt_hashes = PromptHashes(seq.request);
  } else {
    Resumed(seq);
  }
  if (!seq.request.resume.empty() && !seq.request.local_prefill) {
    // Its K/V arrives as a prompt's would: the lease covers its tokens but
    // the last, after the blocks the prefix cache holds (one always ships).
    Choice& choice = seq.choices[0];
    const int block_size = s_.block_size();
    seq.prompt_hashes = std::move(choice.hashes);
    seq.prompt_hashes.resize(
        std::min<size_t>(seq.prompt_hashes.size(), (choice.tokens.size() - 1) / block_size));
    choice.hashes.clear();
  }
  s_.sequences[seq.ticket] = std::move(owned);
  s_.by_request_id[seq.request.request_id] = seq.ticket;
}

void Admission::Resumed(Sequence& seq) {
  // As if preempted after generating the tokens here: each choice holds
  // the prompt and all of its tokens but the last, which is the input of
  // its next step, and its sampler has seen them all. Resume computes them
  // (from the prefix cache where it can) once there is room.
  for (Choice& choice : seq.choices) {
    const Request::Resumed& r = seq.request.resume[choice.index];
    if (r.finished) {
      choice.finished = true;
      continue;
    }
    // Validate bounded the count far below Sampler::kMaxReplay.
    CHECK(choice.sampler.Replay(r.tokens));
    choice.generated = static_cast<int>(r.tokens.size());
    choice.tokens.insert(choice.tokens.end(), r.tokens.begin(), r.tokens.end() - 1);
    choice.next_input = r.tokens.back();
    if (s_.options.prefix_cache) {
      const int block_size = s_.block_size();
      choice.hashes = HashBlocks(s_.salt, choice.tokens, block_size,
                                 static_cast<int>(choice.tokens.size()) / block_size);
    }
  }
  if (!seq.request.local_prefill) return;  // Queued for a lease.
  seq.started = seq.admitted;
  seq.MoveTo(Sequence::State::kPreempted);
}

bool Admission::Admit(Sequence& seq) {
  // Each choice holds the prompt and room for its first decode token; the
  // running batch takes one more block per choice as each fills up.
  const int tokens = seq.kv_tokens() + 1;
  BlockPool& pool = s_.pool();
  const int block_size = s_.block_size();
  const int n = seq.n();
  // The prompt's cached prefix, which choice 0 starts from: it needs only
  // the blocks after it fresh. Taken before counting free blocks, as an
  // unused cached block counts as free until acquired.
  std::vector<int32_t> hits = pool.AcquirePrefix(seq.prompt_hashes);
  const int fresh =
      n * static_cast<int>(BlocksFor(tokens, block_size)) - static_cast<int>(hits.size());
  if (fresh > s_.AdmissionRoom()) {
    pool.Release(hits);
    return false;
  }
  if (s_.staging != nullptr && !seq.request.local_prefill) {
    // The blocks after the cached ones land in staging first. Create made
    // it hold any prompt the pool can, so a refusal only means "not now".
    const int shipped =
        static_cast<int>(BlocksFor(seq.kv_tokens(), block_size)) - static_cast<int>(hits.size());
    absl::StatusOr<StagingRun> run = s_.staging->Allocate(shipped);
    if (!run.ok()) {
      pool.Release(hits);
      return false;
    }
    seq.staging = *run;
  }
  s_.cache_queried_tokens += seq.prompt_hashes.size() * block_size;
  s_.cache_hit_tokens += hits.size() * block_size;
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
  if (absl::Status s = remote_.Expect(seq); !s.ok()) emitter_.Fail(seq, s);
  return true;
}

int DecodeState::AdmissionRoom() const {
  const int free = engine->block_pool().num_free();
  for (const auto& [ticket, seq] : sequences) {
    if (!seq->waiting_for_blocks() && seq->state != Sequence::State::kEnded) {
      return std::max(0, free - options.kv_watermark_blocks);
    }
  }
  return free;
}

void Admission::AdmitWaiting() {
  std::vector<Sequence*> waiting;
  for (auto& [ticket, seq] : s_.sequences) {
    if (seq->waiting_for_blocks()) waiting.push_back(seq.get());
  }
  std::sort(waiting.begin(), waiting.end(),
            [](const Sequence* a, const Sequence* b) { return RanksBefore(*a, *b); });
  for (Sequence* seq : waiting) {
    const bool admitted =
        seq->state == Sequence::State::kQueued ? Admit(*seq) : preemption_.Resume(*seq);
    if (!admitted) return;
  }
}

}  // namespace tandem::decode
