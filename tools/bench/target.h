// Where requests go: tandem's gRPC router, an OpenAI-compatible HTTP server
// (streaming /v1/completions) or a null target that answers instantly, for
// measuring the client's own overhead.
#ifndef TANDEM_TOOLS_BENCH_TARGET_H_
#define TANDEM_TOOLS_BENCH_TARGET_H_

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "tools/bench/dataset.h"
#include "tools/bench/stats.h"

namespace tandem::bench {

struct TargetOptions {
  std::string model = "";  // the "model" field for OpenAI servers
  double timeout_s = 600;  // per request
  bool ignore_eos = true;  // ask the server to generate max_tokens (EOS ignored)
};

class Target {
 public:
  virtual ~Target() = default;
  // Streams one request to the end and fills everything in the record but
  // `start`. Called from many threads at once.
  virtual RequestRecord Send(const BenchRequest& request) = 0;
  // True when prompts should be token ids rather than text.
  virtual bool WantsTokenIds() const { return false; }
};

// "grpc://HOST:PORT", "http://HOST:PORT[/v1/completions]" or "null://".
absl::StatusOr<std::unique_ptr<Target>> MakeTarget(std::string_view url,
                                                   const TargetOptions& options);

// Times one stream: call OnTokens as each token-carrying message arrives.
class StreamTimer {
 public:
  using Clock = std::chrono::steady_clock;
  StreamTimer() : start_(Clock::now()), last_(start_) {}
  void OnTokens(int n);
  // Sets ttft, e2e, itls and (counted) output_tokens of `r`.
  void Finish(RequestRecord& r) const;
  int tokens() const { return tokens_; }

 private:
  Clock::time_point start_, last_;
  double ttft_ = 0;
  int tokens_ = 0;
  std::vector<double> itls_;
};

// Target constructors (one file each).
std::unique_ptr<Target> MakeGrpcTarget(const std::string& address, const TargetOptions& options);
std::unique_ptr<Target> MakeOpenAiTarget(const std::string& host, int port, const std::string& path,
                                         const TargetOptions& options);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_TARGET_H_
