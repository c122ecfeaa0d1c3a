#include "common/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "common/base/philox.h"

namespace tandem {
namespace {

absl::Status CheckPenalty(const char* name, float value) {
  if (!(value >= -2.0f && value <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " ", value, " must be in [-2, 2] (0 = off)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature ", temperature, " must be a finite number >= 0 (0 = greedy)"));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k ", top_k, " must be >= 0 (0 = off)"));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p ", top_p, " must be in (0, 1]"));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_p ", min_p, " must be in [0, 1] (0 = off)"));
  }
  if (absl::Status s = CheckPenalty("presence_penalty", presence_penalty); !s.ok()) return s;
  if (absl::Status s = CheckPenalty("frequency_penalty", frequency_penalty); !s.ok()) return s;
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return absl::InvalidArgumentError(absl::StrCat("repetition_penalty ", repetition_penalty,
                                                   " must be a finite number > 0 (1 = off)"));
  }
  if (logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logit_bias has ", logit_bias.size(), " entries; at most ", kMaxLogitBias, " are allowed"));
  }
  absl::flat_hash_set<int32_t> ids;
  for (const auto& [id, bias] : logit_bias) {
    if (!(bias >= -kMaxLogitBiasValue && bias <= kMaxLogitBiasValue)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias of token ", id, " is ", bias,
                                                     "; it must be in [", -kMaxLogitBiasValue, ", ",
                                                     kMaxLogitBiasValue, "]"));
    }
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias names token id ", id, "; ids are >= 0"));
    }
    if (!ids.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias names token id ", id, " twice; give each id once"));
    }
  }
  if (min_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_tokens ", min_tokens, " must be >= 0 (0 = off)"));
  }
  return absl::OkStatus();
}

absl::Status SamplingParams::ValidateForVocab(int vocab_size) const {
  if (absl::Status s = Validate(); !s.ok()) return s;
  for (const auto& [id, bias] : logit_bias) {
    if (id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias names token id ", id,
                                                     ", outside the vocabulary of ", vocab_size,
                                                     " ids (0 to ", vocab_size - 1, ")"));
    }
  }
  return absl::OkStatus();
}

bool SamplingParams::HasLogitProcessors() const {
  return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f ||
         !logit_bias.empty() || min_tokens > 0 || grammar != nullptr;
}

uint64_t ChoiceSeed(uint64_t seed, int index) {
  if (index == 0) return seed;
  // SplitMix64's finalizer over the seed offset by the index times the
  // golden-ratio increment: consecutive indexes land far apart.
  uint64_t z = seed + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

int32_t Argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingParams& params) : Sampler(params, {}, {}) {}

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt,
                 std::span<const int32_t> stop_ids)
    : params_(params),
      processors_(params.HasLogitProcessors()),
      touches_seen_or_biased_(!params.logit_bias.empty() || params.presence_penalty != 0.0f ||
                              params.frequency_penalty != 0.0f ||
                              params.repetition_penalty != 1.0f),
      count_output_(params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f ||
                    params.repetition_penalty != 1.0f) {
  if (params_.min_tokens > 0 || params_.grammar != nullptr) {
    stop_ids_.assign(stop_ids.begin(), stop_ids.end());
  }
  if (params_.grammar != nullptr) grammar_state_ = params_.grammar->start();
  if (params_.repetition_penalty != 1.0f) prompt_seen_.insert(prompt.begin(), prompt.end());
}

void Sampler::Accept(int32_t token) {
  ++generated_;
  if (count_output_) ++output_counts_[token];
  if (params_.grammar != nullptr && !absl::c_linear_search(stop_ids_, token)) {
    grammar_state_ = params_.grammar->Advance(grammar_state_, token);
  }
}

bool Sampler::Replay(std::span<const int32_t> tokens) {
  if (tokens.size() > kMaxReplay) return false;
  if (!greedy()) Advance(tokens.size());
  for (const int32_t token : tokens) Accept(token);
  return true;
}

std::span<const float> Sampler::Processed(std::span<const float> logits) {
  if (!ChangesLogits()) return logits;
  processed_.assign(logits.begin(), logits.end());
  const int64_t vocab = static_cast<int64_t>(processed_.size());
  auto in_vocab = [vocab](int32_t id) { return id >= 0 && id < vocab; };
  for (const auto& [id, bias] : params_.logit_bias) {
    if (in_vocab(id)) processed_[id] += bias;
  }
  if (generated_ < params_.min_tokens) {
    for (int32_t id : stop_ids_) {
      if (in_vocab(id)) processed_[id] = -std::numeric_limits<float>::infinity();
    }
  }
  const float rep = params_.repetition_penalty;
  if (rep != 1.0f) {
    auto penalize = [&](int32_t id) {
      float& x = processed_[id];
      x = x > 0.0f ? x / rep : x * rep;
    };
    for (int32_t id : prompt_seen_) {
      if (in_vocab(id)) penalize(id);
    }
    for (const auto& [id, count] : output_counts_) {
      if (in_vocab(id) && !prompt_seen_.contains(id)) penalize(id);
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [id, count] : output_counts_) {
      if (!in_vocab(id)) continue;
      processed_[id] -= params_.presence_penalty + params_.frequency_penalty * count;
    }
  }
  if (params_.grammar != nullptr) ApplyGrammar();
  return processed_;
}

void Sampler::ApplyGrammar() {
  const std::shared_ptr<const grammar::TokenMask> mask = params_.grammar->Mask(grammar_state_);
  // The stop ids have no bytes, so no mask holds them: they pass (as the
  // processors left them) once the output is complete.
  stop_values_.clear();
  const bool may_stop = mask->accepting && generated_ >= params_.min_tokens;
  const int64_t vocab = static_cast<int64_t>(processed_.size());
  if (may_stop) {
    for (int32_t id : stop_ids_) {
      if (id >= 0 && id < vocab) stop_values_.emplace_back(id, processed_[id]);
    }
  }
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (int64_t base = 0; base < vocab; base += 64) {
    const size_t w = static_cast<size_t>(base / 64);
    const uint64_t bits = w < mask->words.size() ? mask->words[w] : 0;
    if (bits == ~uint64_t{0}) continue;
    const int64_t end = std::min(vocab, base + 64);
    if (bits == 0) {
      std::fill(processed_.begin() + base, processed_.begin() + end, kMasked);
      continue;
    }
    // Branch-free, so that the compiler vectorises it.
    float* row = processed_.data() + base;
    for (int64_t j = 0; j < end - base; ++j) {
      row[j] = ((bits >> j) & 1) != 0 ? row[j] : kMasked;
    }
  }
  for (const auto& [id, value] : stop_values_) processed_[id] = value;
}

int32_t Sampler::Sample(std::span<const float> raw) {
  const std::span<const float> logits = Processed(raw);
  if (greedy()) return Argmax(logits);
  // Drawn before any early return so that every non-greedy Sample advances
  // the stream exactly once.
  const double uniform = PhiloxUniform(params_.seed, draws_);
  ++draws_;
  const int vocab = static_cast<int>(logits.size());
  const bool cut_k = params_.top_k > 0 && params_.top_k < vocab;
  const bool cut_p = params_.top_p<1.0f, cut_min_p = params_.min_p> 0.0f;
  // The candidates in the order of the cuts: highest logit first, ties by
  // lower id. Only as much of that order is made as the cuts read.
  auto better = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  int n = vocab;
  int32_t top;
  if (cut_k) {
    candidates_.resize(vocab);
    for (int i = 0; i < vocab; ++i) candidates_[i] = {logits[i], i};
    n = params_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end(), better);
    candidates_.resize(n);
    top = candidates_[0].second;
  } else {
    top = Argmax(logits);
  }
  const double max = logits[top];
  // Every token masked (only possible when all are stop ids): the best one.
  if (std::isinf(max) && max < 0) return top;
  const double temperature = params_.temperature;
  auto prob = [&](float x) { return std::exp((static_cast<double>(x) - max) / temperature); };

  if (!cut_k && !cut_p && !cut_min_p) {
    // Every token: no order but the ids' is needed.
    probs_.resize(vocab);
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) sum += probs_[i] = prob(logits[i]);
    return Walk(uniform * sum, vocab, [&](int i) { return i; });
  }

  if (!cut_k) {
    candidates_.resize(vocab);
    for (int i = 0; i < vocab; ++i) candidates_[i] = {logits[i], i};
  }
  double total = 0.0;
  for (int i = 0; i < n; ++i) total += prob(candidates_[i].first);
  // Min-p keeps the tokens whose probability is at least min_p times the
  // top token's (whose is exp(0) = 1): a prefix of the order.
  int keep = n;
  if (cut_min_p) {
    const auto below =
        std::partition(candidates_.begin(), candidates_.begin() + n,
                       [&](const auto& c) { return prob(c.first) >= params_.min_p; });
    keep = static_cast<int>(below - candidates_.begin());
  }
  // Nucleus: the shortest prefix whose mass reaches top_p of the total,
  // ordered in growing spans until it does.
  if (cut_p) {
    const double target = params_.top_p * total;
    double mass = 0.0;
    int ordered = cut_k && !cut_min_p ? keep : 0;
    for (int i = 0; i < keep; ++i) {
      if (i == ordered) {
        ordered = std::min(keep, std::max(64, 2 * ordered));
        std::partial_sort(candidates_.begin() + i, candidates_.begin() + ordered,
                          candidates_.begin() + keep, better);
      }
      mass += prob(candidates_[i].first);
      if (mass >= target) {
        keep = i + 1;
        break;
      }
    }
  }
  // The draw walks the kept tokens in id order.
  std::sort(candidates_.begin(), candidates_.begin() + keep,
            [](const auto& a, const auto& b) { return a.second < b.second; });
  probs_.resize(keep);
  double kept_sum = 0.0;
  for (int i = 0; i < keep; ++i) kept_sum += probs_[i] = prob(candidates_[i].first);
  return Walk(uniform * kept_sum, keep, [&](int i) { return candidates_[i].second; });
}

template <typename IdOf>
int32_t Sampler::Walk(double u, int n, IdOf id_of) const {
  double acc = 0.0;
  int last = 0;
  for (int i = 0; i < n; ++i) {
    if (probs_[i] == 0.0) continue;
    acc += probs_[i];
    last = i;
    if (u < acc) return id_of(i);
  }
  // u rounded up to the whole sum: the last token that has probability.
  return id_of(last);
}

}  // namespace tandem
