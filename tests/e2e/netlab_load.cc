#include "tests/e2e/netlab_load.h"

#include <algorithm>
#include <thread>

#include "absl/time/clock.h"

namespace tandem::testing {

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    default:
      return "CODE_" + std::to_string(static_cast<int>(code));
  }
}

Outcome RunRequest(v1::Router::Stub& router, const LoadOptions& options, int prompt) {
  Outcome out;
  out.prompt = prompt;
  const absl::Time start = absl::Now();
  out.start = start;
  const absl::Time deadline = start + options.deadline;
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    const Completion c = RunGenerate(
        router, TextRequest(options.prompts[prompt], options.max_tokens), deadline - absl::Now());
    out.code = c.status.error_code();
    out.message = c.status.error_message();
    out.tokens = c.tokens;
    if (c.status.ok() || c.status.error_code() != grpc::StatusCode::UNAVAILABLE ||
        !options.retry_unavailable || absl::Now() + backoff >= deadline) {
      break;
    }
    out.retried.push_back(c.status.error_code());
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Seconds(1));
  }
  out.latency = absl::Now() - start;
  return out;
}

void Load::Start(int clients) {
  for (int i = 0; i < clients; ++i) {
    threads_.emplace_back([this] {
      while (!stop_) {
        const int prompt = next_++ % static_cast<int>(options_.prompts.size());
        Outcome o = RunRequest(router_, options_, prompt);
        absl::MutexLock lock(&mu_);
        outcomes_.push_back(std::move(o));
        ++done_;
      }
    });
  }
}

std::vector<Outcome> Load::Stop() {
  stop_ = true;
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  absl::MutexLock lock(&mu_);
  return std::move(outcomes_);
}

CellFigures Summarize(const std::vector<Outcome>& outcomes,
                      const std::vector<std::vector<int32_t>>& reference) {
  CellFigures f;
  std::vector<absl::Duration> latencies;
  for (const Outcome& o : outcomes) {
    ++f.requests;
    latencies.push_back(o.latency);
    for (grpc::StatusCode code : o.retried) ++f.retried[CodeName(code)];
    if (o.code != grpc::StatusCode::OK) {
      ++f.failed[CodeName(o.code)];
    } else if (o.tokens != reference[o.prompt]) {
      ++f.wrong_tokens;
    } else {
      ++f.ok;
    }
  }
  std::sort(latencies.begin(), latencies.end());
  if (!latencies.empty()) {
    f.max_latency = latencies.back();
    f.p99_latency = latencies[latencies.size() * 99 / 100];
    f.p50_latency = latencies[latencies.size() / 2];
  }
  return f;
}

}  // namespace tandem::testing
