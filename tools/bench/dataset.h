// What is sent: synthetic prompts, shared-prefix prompts, multi-turn chats,
// a JSONL file or a replayed request log.
#ifndef TANDEM_TOOLS_BENCH_DATASET_H_
#define TANDEM_TOOLS_BENCH_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::bench {

struct BenchRequest {
  std::string prompt;              // text, used when token_ids is empty
  std::vector<int32_t> token_ids;  // used as given when not empty
  int prompt_len = 0;              // expected prompt tokens (for throughput)
  int max_tokens = 0;
  // When to send it, in seconds from the run's start (a replayed request
  // log); negative: when the arrival schedule says.
  double arrival_s = -1;
  // A later turn of a conversation (multi_turn): sent `think_s` after
  // request `follows` (the conversation's previous turn) has ended, not
  // when the arrival schedule says; -1: a request of its own.
  int64_t follows = -1;
  double think_s = 0;
};

struct DatasetOptions {
  // synthetic | shared_prefix | multi_turn | jsonl | request_log
  std::string kind = "synthetic";
  std::string path = "";  // jsonl, request_log
  int input_len = 128;
  int output_len = 128;
  double range_ratio = 0;  // lengths uniform in [len*(1-r), len*(1+r)]
  int num_prefixes = 4;
  int prefix_len = 64;
  // multi_turn: turns per conversation, and the pause between a reply's end
  // and the next turn.
  int turns = 4;
  double think_time_s = 0;
  // Send token ids in [first_token_id, vocab_size) instead of text (gRPC
  // only: the router takes ids; OpenAI servers get text).
  bool token_ids = false;
  int vocab_size = 512;
  uint64_t seed = 0;
};

// A deterministic, endless list of requests: Get(i) is the same for the
// same options, and a JSONL file is cycled.
// Thread-safe: Get is const and touches nothing shared, so the benchmark's
// client threads may call it at once.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual BenchRequest Get(size_t index) const = 0;
};

absl::StatusOr<std::unique_ptr<Dataset>> MakeDataset(const DatasetOptions& options);

// Parses JSONL text: one object per line with a string "prompt" and an
// optional positive integer "max_tokens" (else `default_max_tokens`). Blank
// lines are skipped; anything else is an error naming the line.
absl::StatusOr<std::vector<BenchRequest>> ParseJsonl(std::string_view text, int default_max_tokens);

// Parses the router's request log (--request_log: one JSON object per
// request) into a replay: each request that ended "ok" becomes a prompt of
// its prompt_tokens (random ids in [3, vocab_size): the log keeps counts,
// not tokens, so prefixes shared in the original are not shared here) and
// max_tokens of its completion tokens per choice, sent at its
// arrival_unix_us, counted from the first. Other requests are left out
// (`skipped` counts them); a line that is not such an object is an error
// naming it.
absl::StatusOr<std::vector<BenchRequest>> ParseRequestLog(std::string_view text,
                                                          const DatasetOptions& options,
                                                          int* skipped = nullptr);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_DATASET_H_
