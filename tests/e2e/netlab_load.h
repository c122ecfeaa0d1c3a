// The load of a fault-matrix cell: clients that send short greedy requests
// to the router, each with a deadline, and retry on UNAVAILABLE with backoff
// as a real client would; and the figures of what they got.
#ifndef TANDEM_TESTS_E2E_NETLAB_LOAD_H_
#define TANDEM_TESTS_E2E_NETLAB_LOAD_H_

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tests/e2e/cluster_harness.h"

namespace tandem::testing {

// One request from its first attempt to its last.
struct Outcome {
  int prompt = 0;
  grpc::StatusCode code = grpc::StatusCode::OK;  // of the last attempt
  std::string message;
  std::vector<int32_t> tokens;
  absl::Time start;                       // of the first attempt
  absl::Duration latency;                 // first attempt to last answer
  std::vector<grpc::StatusCode> retried;  // the codes of the attempts retried
};

struct LoadOptions {
  std::vector<std::string> prompts;
  int max_tokens = 12;
  absl::Duration deadline = absl::Seconds(30);
  bool retry_unavailable = true;
};

// Runs prompt `prompt` until it succeeds, fails otherwise than UNAVAILABLE,
// or its deadline would pass.
Outcome RunRequest(v1::Router::Stub& router, const LoadOptions& options, int prompt);

// Clients sending requests one after another until told to stop.
class Load {
 public:
  Load(v1::Router::Stub& router, LoadOptions options) : router_(router), options_(options) {}
  // Starts `clients` threads.
  void Start(int clients);
  // Asks the clients to stop after their current request, and joins them.
  std::vector<Outcome> Stop();
  int done() const { return done_; }

 private:
  v1::Router::Stub& router_;
  const LoadOptions options_;
  std::atomic<bool> stop_{false};
  std::atomic<int> done_{0};
  std::atomic<int> next_{0};
  absl::Mutex mu_;
  std::vector<Outcome> outcomes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

// What a cell's load got, for the table.
struct CellFigures {
  int requests = 0;
  int ok = 0;
  int wrong_tokens = 0;
  std::map<std::string, int> failed;   // by code name
  std::map<std::string, int> retried;  // attempts retried, by code name
  absl::Duration max_latency;
  absl::Duration p99_latency;
  absl::Duration p50_latency;
};

// `reference` holds each prompt's tokens from a healthy cluster.
CellFigures Summarize(const std::vector<Outcome>& outcomes,
                      const std::vector<std::vector<int32_t>>& reference);

std::string CodeName(grpc::StatusCode code);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_E2E_NETLAB_LOAD_H_
