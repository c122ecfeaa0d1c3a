// RouterService: tandem.v1.Router on gRPC's callback API.
//
// Generate admits a request (or refuses it at once: UNAVAILABLE while
// draining, RESOURCE_EXHAUSTED above max_inflight) and hands it to a
// RequestDriver on a thread of its own, which streams the response through
// an rpc::StreamWriter. A client cancel reaches the driver, which cancels
// every worker call of the request.
//
// Thread-safe. The registry, tokenizer and clock must outlive the service;
// destroy the service after the gRPC server has shut down.
#ifndef TANDEM_ROUTER_ROUTER_SERVICE_H_
#define TANDEM_ROUTER_ROUTER_SERVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/model/tokenizer.h"
#include "router/request_driver.h"
#include "router/worker_registry.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::router {

struct RouterOptions {
  DriverOptions driver;
  // Requests served at once; more are refused with RESOURCE_EXHAUSTED.
  int max_inflight = 256;
  // Timeline stamps. Must outlive the service.
  const Clock* clock = &Clock::Real();
};

class RouterService final : public v1::Router::CallbackService {
 public:
  // `tokenizer` may be null: then only token-id prompts are served and
  // responses carry no text.
  RouterService(WorkerRegistry* registry, const Tokenizer* tokenizer, RouterOptions options);
  ~RouterService() override;  // Cancels what is still running and joins it.

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;

  // Refuse new requests with UNAVAILABLE from now on.
  void StartDraining();
  // Waits up to `timeout` until no request is in flight.
  bool WaitForIdle(absl::Duration timeout);
  // Cancels every request in flight (as if each client had gone away).
  void CancelAll();
  int inflight() const;

 private:
  void ReapFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  WorkerRegistry* const registry_;
  const Tokenizer* const tokenizer_;
  const RouterOptions options_;

  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<RequestDriver>> running_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  // Threads whose request is over, to be joined.
  std::vector<uint64_t> finished_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROUTER_SERVICE_H_
