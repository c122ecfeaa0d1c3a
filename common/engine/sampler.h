// Token sampling from logits: greedy, temperature, top-k, top-p, min-p,
// with a per-request seed so that the same seed gives the same tokens, and the
// logit processors of the OpenAI API: logit bias, min_tokens, repetition,
// presence and frequency penalties.
#ifndef TANDEM_COMMON_ENGINE_SAMPLER_H_
#define TANDEM_COMMON_ENGINE_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/base/limits.h"
#include "common/grammar/token_mask.h"

namespace tandem {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = no limit
  float top_p = 1.0f;        // 1 = no nucleus cut
  float min_p = 0.0f;        // 0 = no cut; else relative to the top token
  uint64_t seed = 0;
  // OpenAI: logit -= presence * (count > 0) + frequency * count, where count
  // is how often the token was generated (the prompt does not count).
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Hugging Face / vLLM: the logit of every token seen in the prompt or the
  // output is divided by it when positive, multiplied when not; 1 = off.
  float repetition_penalty = 1.0f;
  // Added to the logit of the token; ids unique and inside the vocabulary.
  std::vector<std::pair<int32_t, float>> logit_bias = {};
  // The stop ids cannot be sampled while fewer tokens were generated.
  int min_tokens = 0;
  // The output must be a sentence of this grammar (structured outputs):
  // tokens it refuses are masked, and the stop ids pass only once the
  // output is complete. Shared by every sequence that uses it; null = free.
  std::shared_ptr<grammar::CompiledGrammar> grammar = nullptr;

  // INVALID_ARGUMENT saying which parameter to change. Does not know the
  // vocabulary: ValidateForVocab checks the ids.
  absl::Status Validate() const;
  // Validate(), and every logit_bias id in [0, vocab_size).
  absl::Status ValidateForVocab(int vocab_size) const;

  // True when some processor may change logits (bias, penalties,
  // min_tokens, a grammar).
  bool HasLogitProcessors() const;
};

// The seed of choice `index` of n sampled from one request: index 0 gets
// `seed` itself (so n = 1 samples as a request without choices), the others
// a 64-bit mix of both, far apart from each other and from `seed`.
uint64_t ChoiceSeed(uint64_t seed, int index);

// One sequence's sampler. Sample() picks the next token from a row of raw
// logits after applying, in order: logit bias, the min_tokens mask on the
// stop ids (-inf), the repetition penalty, the presence and frequency
// penalties, the grammar's mask; then top-k, the softmax at the
// temperature, and the shorter of the top-p and min-p prefixes of the
// tokens by probability (highest logit first, ties by lower id). The draw
// u, number draws() of the seed's Philox stream (common/base/philox.h, a
// function of the seed and the count of earlier draws alone), picks the
// first kept token in id order whose running sum of probabilities exceeds
// u times their total: no sort is needed without a cut, and a device can
// do the same with a prefix sum.
// Accept() records the token that was actually appended, which the
// penalties and min_tokens count and the grammar advances over.
//
// Costs: with no processor set Sample reads the row in place; otherwise it
// copies the row once and touches only the biased, stop and seen tokens
// (seen tokens are kept in small hash maps). Without top_k, top_p or min_p
// a draw is one pass of exp over the row; top_k sorts its k, top_p sorts
// growing spans of the best tokens until its mass is reached.
//
// Not thread-safe; cheap to create.
class Sampler {
 public:
  // A sampler without prompt or stop ids (penalties see only Accept()ed
  // tokens, min_tokens masks nothing).
  explicit Sampler(const SamplingParams& params);
  // `prompt` feeds the repetition penalty; `stop_ids` are masked until
  // min_tokens tokens were accepted. Both are copied only when needed.
  Sampler(const SamplingParams& params, std::span<const int32_t> prompt,
          std::span<const int32_t> stop_ids);

  // The next token for `logits` (one row, the vocabulary). Does not record
  // it: call Accept. Ids of the processors outside the row are ignored
  // (ValidateForVocab refuses them up front). Draws exactly one number from
  // the random stream unless greedy.
  int32_t Sample(std::span<const float> logits);
  // True when the next Sample would return the index of the row's largest
  // logit as it stands (greedy, and no processor changes the row now), so
  // that the engine may pick it where the logits are (BatchItem::
  // pick_greedy) and the caller Accept()s the pick instead of sampling.
  bool PicksRawArgmax() const { return greedy() && !ChangesLogits(); }

  // Records a token appended to the sequence (sampled here or elsewhere).
  void Accept(int32_t token);

  // Numbers drawn from the random stream so far (0 while greedy).
  uint64_t draws() const { return draws_; }
  // Advances the random stream by `n` numbers (no cost: the stream is
  // counter-based): what another sampler of the same parameters and seed
  // drew (its draws()) for tokens this one then Accept()s.
  void Advance(uint64_t n) { draws_ += n; }
  // Takes the state a sampler of the same parameters and seed had after
  // generating `tokens` (a stream migrated from another worker): one draw
  // of the random stream per token unless greedy (Sample draws exactly
  // one), and each token Accept()ed. False (nothing changes) beyond
  // kMaxReplay tokens.
  static constexpr uint64_t kMaxReplay = uint64_t{1} << 24;
  bool Replay(std::span<const int32_t> tokens);

  // The row Sample draws from: `logits` after the processors (the row
  // itself when none is set; else valid until the next call).
  std::span<const float> Processed(std::span<const float> logits);

  // Tokens accepted so far.
  int generated() const { return generated_; }
  // The grammar's state after the accepted tokens (grammar::kDeadState
  // once a token it refuses was accepted: then only stop ids may follow).
  int32_t grammar_state() const { return grammar_state_; }
  const SamplingParams& params() const { return params_; }

 private:
  bool greedy() const { return params_.temperature == 0.0f || params_.top_k == 1; }
  // Whether Processed would change the row now (min_tokens alone changes
  // nothing once enough tokens were accepted).
  bool ChangesLogits() const {
    return processors_ && (touches_seen_or_biased_ || params_.grammar != nullptr ||
                           generated_ < params_.min_tokens);
  }
  // Masks processed_ with the grammar's tokens for grammar_state_.
  void ApplyGrammar();
  // The token whose running sum of probs_[0, n) first exceeds u; id_of(i)
  // is the token of probs_[i].
  template <typename IdOf>
  int32_t Walk(double u, int n, IdOf id_of) const;

  SamplingParams params_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<double> probs_;

  // Logit processors' state.
  const bool processors_;
  const bool touches_seen_or_biased_;  // anything but min_tokens set
  const bool count_output_;            // presence / frequency penalties set
  std::vector<int32_t> stop_ids_;
  absl::flat_hash_set<int32_t> prompt_seen_;  // repetition penalty only
  absl::flat_hash_map<int32_t, int> output_counts_;
  int generated_ = 0;
  int32_t grammar_state_ = 0;
  uint64_t draws_ = 0;
  std::vector<float> processed_;
  std::vector<std::pair<int32_t, float>> stop_values_;
};

// Index of the largest logit (the lowest index among equals).
int32_t Argmax(std::span<const float> logits);

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_SAMPLER_H_
