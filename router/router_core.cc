#include "router/router_core.h"

#include <algorithm>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "router/reasoning.h"

namespace tandem::router {
namespace {

// A fixed request that is refused on arrival: its sink hears the status on
// a prepare thread, never inside Submit.
class NoOpHandle final : public RequestHandle {
 public:
  void Cancel() override {}
};

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// What preparing the request's prompt reads: its text, or its messages'
// contents (token ids need no tokenizing).
int64_t PromptBytes(const GenerateParams& params) {
  int64_t bytes = params.text.has_value() ? static_cast<int64_t>(params.text->size()) : 0;
  if (params.messages.has_value()) {
    for (const ChatTurn& turn : *params.messages) {
      bytes += static_cast<int64_t>(turn.content.size() + turn.tool_calls.size());
    }
  }
  return bytes;
}

}  // namespace

class RouterCore::Handle final : public RequestHandle {
 public:
  Handle(RouterCore* core, uint64_t id) : core_(core), id_(id) {}
  void Cancel() override { core_->CancelRequest(id_); }

 private:
  RouterCore* const core_;
  const uint64_t id_;
};

RouterCore::RouterCore(WorkerRegistry* registry, const Tokenizer* tokenizer,
                       const ChatTemplate* chat_template, RouterCoreOptions options)
    : own_executor_(options.executor == nullptr ? std::make_unique<ThreadPoolExecutor>(
                                                      options.prepare_threads, options.clock)
                                                : nullptr),
      env_{.registry = registry,
           .progress = &progress_,
           .tokenizer = tokenizer,
           .chat_template = chat_template,
           .clock = options.clock,
           .executor = options.executor != nullptr ? options.executor : own_executor_.get(),
           .served_model_name = options.served_model_name,
           .options = options.driver,
           .queue_timeout = options.queue_timeout},
      decode_queue_(std::make_shared<DecodeQueue>(env_.executor, options.decode_retry_interval)),
      options_(std::move(options)),
      created_unix_(absl::ToUnixSeconds(options_.clock->Now())),
      seed_base_((uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()),
      queue_(options_.max_inflight, options_.max_queued, options_.queue_timeout) {
  env_.decode_queue = decode_queue_.get();
}

RouterCore::~RouterCore() {
  StartDraining();
  CancelAll();
  // Cancelled worker calls end at once.
  if (!WaitForIdle(absl::Seconds(10))) {
    LOG(WARNING) << inflight() << " requests still running as the router core stops";
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (expiry_timer_ != 0) env_.executor->CancelTimer(expiry_timer_);
    expiry_timer_ = 0;
  }
  decode_queue_->Stop();
  {
    absl::MutexLock alive(&life_->mu);
    life_->alive = false;
  }
  // Runs what is still posted (refusals' OnDone) and joins its threads
  // while the core's members are still alive.
  own_executor_.reset();
}

void RouterCore::Enqueue(std::function<void()> job) { env_.executor->Post(std::move(job)); }

std::shared_ptr<RequestHandle> RouterCore::Submit(GenerateParams params,
                                                  std::shared_ptr<ResponseSink> sink) {
  const absl::Time arrival = options_.clock->Now();
  RouterMetrics* const metrics = options_.driver.metrics;
  absl::MutexLock lock(&mu_);
  auto refuse = [&](absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (metrics != nullptr) metrics->requests.Count(status.code());
    Enqueue([sink, status = std::move(status)] { sink->OnDone(status); });
    return std::make_shared<NoOpHandle>();
  };
  if (draining_) {
    return refuse(
        absl::UnavailableError("the router is draining; send the request to another router"));
  }
  if (params.priority < kMinPriority || params.priority > kMaxPriority) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("priority is ", params.priority, "; it must be ", kMinPriority, " to ",
                     kMaxPriority, " (larger is served first)")));
  }
  const uint64_t id = next_id_++;
  switch (queue_.Arrive(id, params.priority, arrival)) {
    case AdmissionQueue::Decision::kFull:
      return refuse(absl::ResourceExhaustedError(
          absl::StrCat("the router is serving its limit of ", options_.max_inflight,
                       " requests (--max_inflight) and ", options_.max_queued,
                       " more are waiting (--max_queued); retry later")));
    case AdmissionQueue::Decision::kQueued:
      pending_.emplace(id, Pending{std::move(params), std::move(sink), arrival});
      ArmExpiryLocked();
      if (metrics != nullptr) metrics->requests_queued.Increment();
      break;
    case AdmissionQueue::Decision::kRun:
      StartLocked(id, std::move(params), std::move(sink), arrival);
      break;
  }
  auto handle = std::make_shared<Handle>(this, id);
  handles_.emplace(id, handle);
  return handle;
}

void RouterCore::StartLocked(uint64_t id, GenerateParams params, std::shared_ptr<ResponseSink> sink,
                             absl::Time arrival) {
  const int64_t prompt_bytes = PromptBytes(params);
  std::string request_id = std::move(params.request_id);
  if (request_id.size() > 256) request_id.resize(256);
  if (request_id.empty()) {
    request_id = absl::StrFormat("req-%016x", SplitMix64(seed_base_ ^ (id * 0x9e37)));
  }
  // Workers key reservations by request id: make it unique per router even
  // when a client reuses ids.
  std::string worker_request_id = absl::StrCat(request_id, "/", id);
  auto driver = std::make_shared<RequestDriver>(
      env_, std::move(params), std::move(request_id), std::move(worker_request_id),
      SplitMix64(seed_base_ + id), arrival, std::move(sink), [this, id] { OnEnd(id); });
  running_.emplace(id, driver);
  if (options_.driver.metrics != nullptr) options_.driver.metrics->requests_in_flight.Increment();
  Executor* const lane =
      options_.large_executor != nullptr && prompt_bytes > options_.large_prepare_bytes
          ? options_.large_executor
          : env_.executor;
  lane->Post([driver] { driver->Run(); });
}

void RouterCore::OnEnd(uint64_t id) {
  RouterMetrics* const metrics = options_.driver.metrics;
  if (metrics != nullptr) metrics->requests_in_flight.Decrement();
  // Its decode slot, if it held one, may be free now.
  decode_queue_->WakeOne();
  absl::MutexLock lock(&mu_);
  running_.erase(id);
  handles_.erase(id);
  if (std::optional<uint64_t> next = queue_.Finish(); next.has_value()) {
    auto it = pending_.find(*next);
    Pending p = std::move(it->second);
    pending_.erase(it);
    if (metrics != nullptr) metrics->requests_queued.Decrement();
    StartLocked(*next, std::move(p.params), std::move(p.sink), p.arrival);
  }
}

void RouterCore::CancelRequest(uint64_t id) {
  std::shared_ptr<RequestDriver> driver;
  {
    absl::MutexLock lock(&mu_);
    if (queue_.Remove(id)) {
      auto it = pending_.find(id);
      std::shared_ptr<ResponseSink> sink = std::move(it->second.sink);
      pending_.erase(it);
      handles_.erase(id);
      if (RouterMetrics* m = options_.driver.metrics; m != nullptr) {
        m->requests_queued.Decrement();
        m->requests.Count(absl::StatusCode::kCancelled);
      }
      Enqueue([sink] { sink->OnDone(absl::CancelledError("the client went away")); });
      return;
    }
    auto it = running_.find(id);
    if (it != running_.end()) driver = it->second.lock();
  }
  if (driver != nullptr) driver->Cancel();
}

void RouterCore::ExpireQueued() {
  absl::MutexLock lock(&mu_);
  ExpireQueuedLocked();
}

void RouterCore::ExpireQueuedLocked() {
  const std::vector<uint64_t> expired = queue_.Expire(options_.clock->Now());
  ArmExpiryLocked();
  for (uint64_t id : expired) {
    auto it = pending_.find(id);
    std::shared_ptr<ResponseSink> sink = std::move(it->second.sink);
    pending_.erase(it);
    handles_.erase(id);
    const absl::Status status = absl::ResourceExhaustedError(
        absl::StrCat("the request waited ", absl::FormatDuration(options_.queue_timeout),
                     " in the router's queue (--queue_timeout) without a free slot; retry later"));
    if (RouterMetrics* m = options_.driver.metrics; m != nullptr) {
      m->requests_queued.Decrement();
      m->requests.Count(status.code());
    }
    Enqueue([sink, status] { sink->OnDone(status); });
  }
}

void RouterCore::ArmExpiryLocked() {
  const absl::Time next = queue_.next_expiry();
  if (stopping_ || next == expiry_at_) return;
  if (expiry_timer_ != 0) env_.executor->CancelTimer(expiry_timer_);
  expiry_timer_ = 0;
  expiry_at_ = next;
  if (next == absl::InfiniteFuture()) return;
  expiry_timer_ = env_.executor->PostAt(next, [this, life = life_, next] {
    // The core may be going: its destructor waits for a timer running here.
    absl::MutexLock alive(&life->mu);
    if (!life->alive) return;
    absl::MutexLock lock(&mu_);
    if (expiry_at_ != next) return;  // Replaced meanwhile.
    expiry_timer_ = 0;
    expiry_at_ = absl::InfiniteFuture();
    ExpireQueuedLocked();
  });
}

ServedModelInfo RouterCore::ModelInfo() const {
  const DecodePoolLimits limits = LimitsOf(env_.registry->Snapshot(WorkerRole::kDecode));
  ServedModelInfo info{.id = options_.served_model_name,
                       .created_unix = created_unix_,
                       .max_context = limits.max_context,
                       .vocab_size = limits.vocab_size};
  if (env_.chat_template != nullptr) {
    info.tool_format = ToolFormatOf(env_.chat_template->source());
    info.thinking = WritesThinking(env_.chat_template->source());
  }
  if (info.vocab_size == 0 && env_.tokenizer != nullptr) {
    info.vocab_size = env_.tokenizer->vocab_size();
  }
  return info;
}

absl::StatusOr<std::vector<int32_t>> RouterCore::Tokenize(const std::string& text,
                                                          bool add_special_tokens) const {
  if (env_.tokenizer == nullptr) {
    return absl::FailedPreconditionError("this router has no tokenizer");
  }
  if (text.size() > kMaxPromptBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the text has ", text.size(), " bytes; at most ",
                                                   kMaxPromptBytes, " are served"));
  }
  absl::StatusOr<std::vector<int32_t>> ids = env_.tokenizer->Encode(text, add_special_tokens);
  if (!ids.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot tokenize the text: ", ids.status().message()));
  }
  return ids;
}

absl::StatusOr<std::vector<int32_t>> RouterCore::TokenizeChat(const std::vector<ChatTurn>& messages,
                                                              bool add_generation_prompt) const {
  if (env_.tokenizer == nullptr || env_.chat_template == nullptr) {
    return absl::FailedPreconditionError("this router has no tokenizer or chat template");
  }
  return ChatPromptIds(messages, *env_.tokenizer, *env_.chat_template, add_generation_prompt);
}

bool RouterCore::ChatPromptOpensThinking(const std::string& chat_template_kwargs) const {
  return env_.chat_template != nullptr &&
         GenerationPromptOpensThinking(*env_.chat_template, chat_template_kwargs);
}

absl::StatusOr<std::string> RouterCore::Detokenize(const std::vector<int32_t>& ids) const {
  if (env_.tokenizer == nullptr) {
    return absl::FailedPreconditionError("this router has no tokenizer");
  }
  if (ids.size() > static_cast<size_t>(kMaxPromptTokenIds)) {
    return absl::InvalidArgumentError(absl::StrCat("there are ", ids.size(), " token ids; at most ",
                                                   kMaxPromptTokenIds, " are served"));
  }
  return DetokenizeIds(*env_.tokenizer, ids);
}

bool RouterCore::Serving() const {
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return false;
  }
  return LimitsOf(env_.registry->Snapshot(WorkerRole::kDecode)).any_routable;
}

void RouterCore::StartDraining() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool RouterCore::WaitForIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return running_.empty() && pending_.empty();
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void RouterCore::CancelAll() {
  std::vector<std::shared_ptr<RequestDriver>> drivers;
  {
    absl::MutexLock lock(&mu_);
    std::vector<uint64_t> queued;
    for (const auto& [id, p] : pending_) queued.push_back(id);
    for (uint64_t id : queued) {
      queue_.Remove(id);
      std::shared_ptr<ResponseSink> sink = std::move(pending_.at(id).sink);
      pending_.erase(id);
      handles_.erase(id);
      if (RouterMetrics* m = options_.driver.metrics; m != nullptr) {
        m->requests_queued.Decrement();
        m->requests.Count(absl::StatusCode::kCancelled);
      }
      Enqueue([sink] { sink->OnDone(absl::CancelledError("the router is stopping")); });
    }
    ArmExpiryLocked();
    for (auto& [id, weak] : running_) {
      if (std::shared_ptr<RequestDriver> d = weak.lock()) drivers.push_back(std::move(d));
    }
  }
  for (auto& d : drivers) d->Cancel();
}

int RouterCore::inflight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(running_.size());
}

int RouterCore::queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.queued();
}

}  // namespace tandem::router
