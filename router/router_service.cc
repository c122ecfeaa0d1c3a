#include "router/router_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/rpc/stream_writer.h"

namespace tandem::router {

RouterService::RouterService(WorkerRegistry* registry, const Tokenizer* tokenizer,
                             RouterOptions options)
    : registry_(registry), tokenizer_(tokenizer), options_(options), rng_(std::random_device{}()) {}

RouterService::~RouterService() {
  StartDraining();
  CancelAll();
  std::map<uint64_t, std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  // Cancelled worker calls end at once, so these joins are short.
  for (auto& [id, thread] : threads) thread.join();
}

grpc::ServerWriteReactor<v1::GenerateResponse>* RouterService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto [reactor, writer] = rpc::StreamWriter<v1::GenerateResponse>::Create();
  const absl::Time arrival = options_.clock->Now();
  absl::MutexLock lock(&mu_);
  ReapFinishedLocked();
  RouterMetrics* const metrics = options_.driver.metrics;
  if (draining_) {
    if (metrics != nullptr) metrics->requests.Count(absl::StatusCode::kUnavailable);
    writer->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                "the router is draining; send the request to another router"));
    return reactor;
  }
  if (static_cast<int>(running_.size()) >= options_.max_inflight) {
    if (metrics != nullptr) metrics->requests.Count(absl::StatusCode::kResourceExhausted);
    writer->Finish(
        grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     absl::StrCat("the router is serving its limit of ", options_.max_inflight,
                                  " requests (--max_inflight); retry later")));
    return reactor;
  }
  const uint64_t id = next_id_++;
  std::string request_id = request->request_id();
  if (request_id.empty()) request_id = absl::StrFormat("req-%016x", rng_());
  // Workers key reservations by request id: make it unique per router even
  // when a client reuses ids.
  std::string worker_request_id = absl::StrCat(request_id, "/", id);
  auto driver = std::make_shared<RequestDriver>(
      registry_, tokenizer_, *options_.clock, options_.driver, *request, std::move(request_id),
      std::move(worker_request_id), arrival, absl::FromChrono(context->deadline()), writer);
  running_.emplace(id, driver);
  std::weak_ptr<RequestDriver> weak = driver;
  writer->OnCancel([weak] {
    if (std::shared_ptr<RequestDriver> d = weak.lock()) d->Cancel();
  });
  if (metrics != nullptr) metrics->requests_in_flight.Increment();
  threads_.emplace(id, std::thread([this, id, driver, metrics] {
                     driver->Run();
                     if (metrics != nullptr) metrics->requests_in_flight.Decrement();
                     absl::MutexLock lock(&mu_);
                     running_.erase(id);
                     finished_.push_back(id);
                   }));
  return reactor;
}

void RouterService::ReapFinishedLocked() {
  for (uint64_t id : finished_) {
    auto it = threads_.find(id);
    if (it == threads_.end()) continue;
    // The thread has done its work and is returning.
    it->second.join();
    threads_.erase(it);
  }
  finished_.clear();
}

void RouterService::StartDraining() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool RouterService::WaitForIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_.empty(); };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void RouterService::CancelAll() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, driver] : running_) driver->Cancel();
}

int RouterService::inflight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(running_.size());
}

}  // namespace tandem::router
