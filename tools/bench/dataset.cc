#include "tools/bench/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem::bench {
namespace {

// Short common words: most tokenizers (TinyStories' 512-token one
// included) give about one token each, so N words is about N tokens.
constexpr std::string_view kWords[] = {"the",    "a",    "cat",    "dog",  "sun",  "day",  "big",
                                       "red",    "run",  "play",   "tree", "ball", "and",  "was",
                                       "he",     "she",  "it",     "to",   "in",   "on",   "happy",
                                       "little", "girl", "boy",    "went", "saw",  "home", "fun",
                                       "park",   "bird", "friend", "mom",  "sky",  "blue", "good"};
constexpr int kFirstTokenId = 3;  // skip <unk>, <s>, </s>

// Per-request randomness that depends only on (seed, stream, index).
std::mt19937_64 Rng(uint64_t seed, uint64_t stream, uint64_t index) {
  std::seed_seq seq{seed, stream, index};
  return std::mt19937_64(seq);
}

int DrawLen(std::mt19937_64& rng, int len, double ratio) {
  const int lo = std::max(1, static_cast<int>(std::floor(len * (1 - ratio))));
  const int hi = std::max(lo, static_cast<int>(std::ceil(len * (1 + ratio))));
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

// Appends `n` random words (text) or ids to `r`.
void AppendRandom(const DatasetOptions& o, std::mt19937_64& rng, int n, BenchRequest& r) {
  if (o.token_ids) {
    std::uniform_int_distribution<int32_t> id(kFirstTokenId,
                                              std::max(kFirstTokenId, o.vocab_size - 1));
    for (int i = 0; i < n; ++i) r.token_ids.push_back(id(rng));
    return;
  }
  std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
  for (int i = 0; i < n; ++i) {
    if (!r.prompt.empty()) r.prompt += ' ';
    r.prompt += kWords[word(rng)];
  }
}

class SyntheticDataset : public Dataset {
 public:
  explicit SyntheticDataset(DatasetOptions o) : o_(std::move(o)) {}
  BenchRequest Get(size_t index) const override {
    auto rng = Rng(o_.seed, 1, index);
    BenchRequest r;
    r.prompt_len = DrawLen(rng, o_.input_len, o_.range_ratio);
    r.max_tokens = DrawLen(rng, o_.output_len, o_.range_ratio);
    AppendRandom(o_, rng, r.prompt_len, r);
    return r;
  }

 private:
  DatasetOptions o_;
};

class SharedPrefixDataset : public Dataset {
 public:
  explicit SharedPrefixDataset(DatasetOptions o) : o_(std::move(o)) {
    for (int k = 0; k < o_.num_prefixes; ++k) {
      auto rng = Rng(o_.seed, 2, k);
      BenchRequest prefix;
      AppendRandom(o_, rng, o_.prefix_len, prefix);
      prefixes_.push_back(std::move(prefix));
    }
  }
  BenchRequest Get(size_t index) const override {
    auto rng = Rng(o_.seed, 3, index);
    BenchRequest r = prefixes_[index % prefixes_.size()];
    const int suffix = DrawLen(rng, o_.input_len, o_.range_ratio);
    r.prompt_len = o_.prefix_len + suffix;
    r.max_tokens = DrawLen(rng, o_.output_len, o_.range_ratio);
    AppendRandom(o_, rng, suffix, r);
    return r;
  }

 private:
  DatasetOptions o_;
  std::vector<BenchRequest> prefixes_;
};

// Conversations of `turns` requests each: request i is turn i % turns of
// conversation i / turns. Each turn's prompt is the conversation so far
// (every earlier turn's user message and a stand-in for its reply, as long
// as that turn's max_tokens) and a new user message, so it begins with the
// previous turn's whole prompt; it follows that turn after the think time.
// The stand-in is not what the model replied, so a server's prefix cache
// holds the previous turn's prompt for it but not the reply's blocks.
class MultiTurnDataset : public Dataset {
 public:
  explicit MultiTurnDataset(DatasetOptions o) : o_(std::move(o)) {}
  BenchRequest Get(size_t index) const override {
    const size_t turns = static_cast<size_t>(o_.turns);
    const size_t conversation = index / turns, turn = index % turns;
    BenchRequest r;
    for (size_t t = 0; t <= turn; ++t) {
      auto rng = Rng(o_.seed, 5 + t, conversation);
      const int user = DrawLen(rng, o_.input_len, o_.range_ratio);
      const int reply = DrawLen(rng, o_.output_len, o_.range_ratio);
      AppendRandom(o_, rng, user, r);
      r.prompt_len += user;
      if (t == turn) {
        r.max_tokens = reply;
      } else {
        AppendRandom(o_, rng, reply, r);
        r.prompt_len += reply;
      }
    }
    if (turn > 0) {
      r.follows = static_cast<int64_t>(index) - 1;
      r.think_s = o_.think_time_s;
    }
    return r;
  }

 private:
  DatasetOptions o_;
};

class ListDataset : public Dataset {
 public:
  explicit ListDataset(std::vector<BenchRequest> list) : list_(std::move(list)) {}
  BenchRequest Get(size_t index) const override { return list_[index % list_.size()]; }

 private:
  std::vector<BenchRequest> list_;
};

// A replayed log, cycled: each pass comes one span (and one mean gap)
// after the last.
class ReplayDataset : public Dataset {
 public:
  explicit ReplayDataset(std::vector<BenchRequest> list) : list_(std::move(list)) {
    const double span = list_.back().arrival_s;
    period_ = span + (list_.size() > 1 ? span / static_cast<double>(list_.size() - 1) : 1.0);
  }
  BenchRequest Get(size_t index) const override {
    BenchRequest r = list_[index % list_.size()];
    r.arrival_s += period_ * static_cast<double>(index / list_.size());
    return r;
  }

 private:
  std::vector<BenchRequest> list_;
  double period_ = 0;
};

// Calls `fn` with each non-blank line of `text`, which must be a JSON
// object, and its number; stops at the first error, the line's or `fn`'s.
absl::Status ForEachJsonObject(std::string_view text,
                               const std::function<absl::Status(const nlohmann::json&, int)>& fn) {
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(std::string_view(line.data(), line.size()),
                                                   nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": not a JSON object: ", line.substr(0, 80)));
    }
    RETURN_IF_ERROR(fn(j, line_no));
  }
  return absl::OkStatus();
}

// The integer field `name` of `j`, at least `min`; an error naming the line.
absl::StatusOr<int64_t> LogInt(const nlohmann::json& j, const char* name, int64_t min,
                               int line_no) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("line ", line_no, ": needs an integer \"", name, "\" of at least ", min));
  }
  return it->get<int64_t>();
}

}  // namespace

absl::StatusOr<std::vector<BenchRequest>> ParseRequestLog(std::string_view text,
                                                          const DatasetOptions& options,
                                                          int* skipped) {
  if (!options.token_ids) {
    return absl::InvalidArgumentError(
        "a request log replays token counts, not texts: send token ids (--token_ids, on a gRPC "
        "target or in tandem-sim)");
  }
  std::vector<BenchRequest> out;
  std::vector<int64_t> arrivals;
  int left_out = 0;
  RETURN_IF_ERROR(
      ForEachJsonObject(text, [&](const nlohmann::json& j, int line_no) -> absl::Status {
        if (j.value("status", "") != "ok") {
          ++left_out;
          return absl::OkStatus();
        }
        auto ints = [&](const char* name, int64_t min) { return LogInt(j, name, min, line_no); };
        ASSIGN_OR_RETURN(const int64_t arrival, ints("arrival_unix_us", 0));
        ASSIGN_OR_RETURN(const int64_t prompt, ints("prompt_tokens", 1));
        ASSIGN_OR_RETURN(const int64_t completion, ints("completion_tokens", 0));
        ASSIGN_OR_RETURN(const int64_t n, ints("n", 1));
        if (prompt > (1 << 20)) {
          return absl::InvalidArgumentError(
              absl::StrCat("line ", line_no, ": prompt_tokens is ", prompt, "; at most 1048576"));
        }
        BenchRequest r;
        r.prompt_len = static_cast<int>(prompt);
        r.max_tokens = static_cast<int>(std::max<int64_t>(1, completion / n));
        auto rng = Rng(options.seed, 4, out.size());
        AppendRandom(options, rng, r.prompt_len, r);
        out.push_back(std::move(r));
        arrivals.push_back(arrival);
        return absl::OkStatus();
      }));
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request log holds no request that ended ok (", left_out, " others)"));
  }
  // Sent in arrival order, from the first.
  std::vector<size_t> order(out.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return arrivals[a] < arrivals[b]; });
  std::vector<BenchRequest> sorted;
  for (size_t i : order) {
    sorted.push_back(std::move(out[i]));
    sorted.back().arrival_s = static_cast<double>(arrivals[i] - arrivals[order[0]]) / 1e6;
  }
  if (skipped != nullptr) *skipped = left_out;
  return sorted;
}

absl::StatusOr<std::vector<BenchRequest>> ParseJsonl(std::string_view text,
                                                     int default_max_tokens) {
  std::vector<BenchRequest> out;
  RETURN_IF_ERROR(
      ForEachJsonObject(text, [&](const nlohmann::json& j, int line_no) -> absl::Status {
        auto prompt = j.find("prompt");
        if (prompt == j.end() || !prompt->is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("line ", line_no, ": needs a string \"prompt\""));
        }
        BenchRequest r;
        r.prompt = prompt->get<std::string>();
        // Words are a rough token count; the server's usage replaces it when sent.
        r.prompt_len = static_cast<int>(
            std::vector<absl::string_view>(absl::StrSplit(r.prompt, ' ', absl::SkipEmpty()))
                .size());
        r.max_tokens = default_max_tokens;
        if (auto mt = j.find("max_tokens"); mt != j.end()) {
          if (!mt->is_number_integer() || mt->get<int64_t>() < 1) {
            return absl::InvalidArgumentError(
                absl::StrCat("line ", line_no, ": \"max_tokens\" must be a positive integer"));
          }
          r.max_tokens = mt->get<int>();
        }
        out.push_back(std::move(r));
        return absl::OkStatus();
      }));
  if (out.empty()) return absl::InvalidArgumentError("no prompts in the JSONL input");
  return out;
}

absl::StatusOr<std::unique_ptr<Dataset>> MakeDataset(const DatasetOptions& o) {
  if (o.input_len < 1 || o.output_len < 1) {
    return absl::InvalidArgumentError("--input_len and --output_len must be >= 1");
  }
  if (o.range_ratio < 0 || o.range_ratio >= 1) {
    return absl::InvalidArgumentError("--range_ratio must be in [0, 1)");
  }
  if (o.kind == "synthetic") return std::make_unique<SyntheticDataset>(o);
  if (o.kind == "shared_prefix") {
    if (o.num_prefixes < 1 || o.prefix_len < 1) {
      return absl::InvalidArgumentError("--num_prefixes and --prefix_len must be >= 1");
    }
    return std::make_unique<SharedPrefixDataset>(o);
  }
  if (o.kind == "multi_turn") {
    if (o.turns < 1 || o.turns > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("--turns is ", o.turns, "; give 1 to 64 turns per conversation"));
    }
    if (!(o.think_time_s >= 0 && o.think_time_s <= 3600)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--think_time is ", o.think_time_s, " s; give 0 to 3600 seconds"));
    }
    return std::make_unique<MultiTurnDataset>(o);
  }
  if (o.kind == "jsonl") {
    std::ifstream in(o.path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read --dataset_path '", o.path, "'"));
    std::stringstream ss;
    ss << in.rdbuf();
    auto list = ParseJsonl(ss.str(), o.output_len);
    if (!list.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(o.path, ": ", list.status().message()));
    }
    return std::make_unique<ListDataset>(*std::move(list));
  }
  if (o.kind == "request_log") {
    std::ifstream in(o.path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read --dataset_path '", o.path, "'"));
    std::stringstream ss;
    ss << in.rdbuf();
    auto list = ParseRequestLog(ss.str(), o);
    if (!list.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(o.path, ": ", list.status().message()));
    }
    return std::make_unique<ReplayDataset>(*std::move(list));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown --dataset '", o.kind,
                   "' (synthetic, shared_prefix, multi_turn, jsonl or request_log)"));
}

}  // namespace tandem::bench
