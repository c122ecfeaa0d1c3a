#include "tools/bench/target.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::bench {
namespace {

double Seconds(StreamTimer::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Streams max_tokens tokens with no work at all: what is left is the
// client's own cost per stream (timing, records, threads).
class NullTarget : public Target {
 public:
  RequestRecord Send(const BenchRequest& request) override {
    StreamTimer timer;
    for (int i = 0; i < request.max_tokens; ++i) timer.OnTokens(1);
    RequestRecord r;
    timer.Finish(r);
    r.success = true;
    r.prompt_tokens = request.prompt_len;
    return r;
  }
};

}  // namespace

void StreamTimer::OnTokens(int n) {
  if (n <= 0) return;
  const Clock::time_point now = Clock::now();
  if (tokens_ == 0) {
    ttft_ = Seconds(now - start_);
  } else {
    itls_.push_back(Seconds(now - last_));
  }
  last_ = now;
  tokens_ += n;
}

void StreamTimer::Finish(RequestRecord& r) const {
  r.ttft = ttft_;
  r.e2e = Seconds(Clock::now() - start_);
  r.itls = itls_;
  r.output_tokens = tokens_;
}

absl::StatusOr<std::unique_ptr<Target>> MakeTarget(std::string_view url_view,
                                                   const TargetOptions& options) {
  const std::string url(url_view);
  if (url == "null://" || url == "null") return std::make_unique<NullTarget>();
  if (url.rfind("grpc://", 0) == 0) {
    const std::string address = url.substr(7);
    if (address.empty()) return absl::InvalidArgumentError("--target grpc:// needs HOST:PORT");
    return MakeGrpcTarget(address, options);
  }
  if (url.rfind("http://", 0) == 0) {
    const std::string rest = url.substr(7);
    const size_t slash = rest.find('/');
    const std::string hostport = rest.substr(0, slash);
    std::string path = slash == std::string::npos ? "/v1/completions" : rest.substr(slash);
    if (path == "/") path = "/v1/completions";
    const size_t colon = hostport.rfind(':');
    int port = 80;
    if (colon != std::string::npos && !absl::SimpleAtoi(hostport.substr(colon + 1), &port)) {
      return absl::InvalidArgumentError(absl::StrCat("bad port in --target '", url, "'"));
    }
    const std::string host = hostport.substr(0, colon);
    if (host.empty()) return absl::InvalidArgumentError("--target http:// needs HOST:PORT");
    return MakeOpenAiTarget(host, port, path, options);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown --target '", url, "': use grpc://HOST:PORT, http://HOST:PORT or null://"));
}

}  // namespace tandem::bench
