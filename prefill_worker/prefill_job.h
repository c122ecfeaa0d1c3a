// What a prefill job is: the request (prompt, sampling, the decode worker's
// KV lease), its result, and the loop's bookkeeping for it.
//
// Ownership: PrefillLoop owns a job from Submit until its reply: first in
// its queue, then in the scheduler, whose block table holds the job's KV
// blocks until the transfer has let go of them. The reply callback (`done`)
// is called exactly once, on the loop's thread (or Submit's, for a job
// refused at once), with the result or the error PrefillLoop documents.
// internal::Job is the scheduler's; only the loop's thread touches it.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_JOB_H_
#define TANDEM_PREFILL_WORKER_PREFILL_JOB_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/limits.h"
#include "common/engine/kv_staging.h"
#include "common/engine/logprobs.h"
#include "common/engine/sampler.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/block_table.h"
#include "common/kvcache/tier_link.h"
#include "kvtransfer/wire_format.h"

namespace tandem::prefill {

// Identifies a submitted job within one PrefillLoop; never reused. 0 = none.
using JobId = uint64_t;

struct PrefillJob {
  // For logs and error messages only.
  std::string request_id;
  std::vector<int32_t> tokens;
  SamplingParams sampling;
  // The decode worker's TransferLease, serialised (opaque to callers).
  std::string kv_descriptor;
  // Bounds queueing, compute and the KV transfer.
  absl::Time deadline = absl::InfiniteFuture();
  // First tokens to sample, one per choice (1 to kMaxChoices); choice i
  // samples with seed ChoiceSeed(sampling.seed, i).
  int n = 1;
  // Set: each first token's logprob with this many alternatives (0 to
  // kMaxTopLogprobs); also the alternatives of prompt_logprobs.
  std::optional<int> logprobs;
  // Compute the prompt's logprobs (PrefillResult::prompt_logprobs).
  bool prompt_logprobs = false;
  // Masked until sampling.min_tokens tokens were generated, which for the
  // first token means whenever min_tokens > 0.
  std::vector<int32_t> stop_token_ids;
};

struct PrefillResult {
  // Choice 0's first token, and the other choices' in order.
  int32_t first_token = -1;
  std::vector<int32_t> extra_first_tokens;
  // With `logprobs`: one per choice, in order (raw model distribution).
  std::vector<TokenLogprob> first_logprobs;
  // Per choice: the random numbers its sampler drew for the first token.
  std::vector<uint64_t> sampler_draws;
  // With `prompt_logprobs`: one per prompt token after the first.
  std::vector<TokenLogprob> prompt_logprobs;
  // Arrival until the job's first step.
  int64_t queue_us = 0;
  // First step until the first token was sampled.
  int64_t prefill_us = 0;
  // Last layer's KV written until the decode worker confirmed every byte.
  int64_t kv_transfer_us = 0;
  // Bytes shipped: the lease's blocks, from its first_block on.
  int64_t kv_bytes = 0;
  // Prompt tokens whose KV came from the prefix cache or the KV tier
  // (whole blocks from the start) instead of being computed, and those of
  // them the tier gave.
  int cached_tokens = 0;
  int tier_tokens = 0;
};

// Called exactly once per Submit, from the loop's thread or the caller's.
using PrefillDoneFn = absl::AnyInvocable<void(absl::StatusOr<PrefillResult>)>;

namespace internal {

// A job from submission to reply. Only the loop's thread touches it once it
// has left the inbox.
struct Job {
  enum class State {
    kQueued,        // waiting for blocks
    kLoading,       // blocks held; waiting for prefix blocks from the KV tier
    kComputing,     // blocks held; prompt chunks left to compute
    kTransferring,  // first token sampled; waiting for the decode worker
  };

  explicit Job(int block_size) : table(block_size) {}

  JobId id = 0;
  PrefillJob request;
  PrefillDoneFn done;
  kvtransfer::TransferLease lease;  // Parsed at submission.
  State state = State::kQueued;
  BlockTable table;
  // The chained hashes of the prompt's full blocks; computed on the first
  // admission attempt when the prefix cache is on.
  std::vector<BlockHash> block_hashes;
  bool hashed = false;
  int cached_tokens = 0;  // Taken from the prefix cache or the KV tier.
  int tier_tokens = 0;    // Of them, from the KV tier.
  // The KV tier's load of the blocks after the cached ones (kLoading).
  TierLink::Fetch fetch;

  absl::Time arrived;
  absl::Time started = absl::InfinitePast();  // First step.
  absl::Time computed;                        // First token sampled.
  absl::Time last_layer;                      // Last layer's KV written in the final step.
  std::vector<int32_t> first_tokens;          // One per choice.
  std::vector<uint64_t> sampler_draws;        // One per choice.
  std::vector<TokenLogprob> first_logprobs;
  std::vector<TokenLogprob> prompt_logprobs;  // Filled chunk by chunk.

  // The sender holds the job's blocks between Start and its done callback:
  // they may not be released (or reused) in between.
  bool transfer_started = false;
  bool transfer_ended = false;
  absl::Status transfer_status;  // The sender's verdict, once ended.
  // Why the job failed while its transfer was still in flight; replied
  // once the sender lets go of the blocks.
  absl::Status failure;
  bool finished = false;  // Replied; to be dropped from the active list.

  // KV staging (a backend whose memory the transport cannot read): the
  // host slots the shipped blocks are copied to, held from admission until
  // the reply, and the final step's layer copies not yet seen finished, in
  // layer order. The sender gets a layer once its copy has finished.
  struct LayerCopy {
    uint32_t layer;
    uint64_t ticket;
  };
  StagingRun staging;
  std::deque<LayerCopy> layer_copies;

  int prompt_len() const { return static_cast<int>(request.tokens.size()); }
  int remaining() const { return prompt_len() - table.num_tokens(); }
};

}  // namespace internal
}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_PREFILL_JOB_H_
