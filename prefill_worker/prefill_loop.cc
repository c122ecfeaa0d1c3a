#include "prefill_worker/prefill_loop.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/kvcache/kv_layout.h"
#include "common/worker/worker_health.h"

namespace tandem::prefill {
namespace {

std::string Name(const PrefillJob& job) {
  return job.request_id.empty() ? std::string("prefill request")
                                : absl::StrCat("request '", job.request_id, "'");
}

}  // namespace

absl::StatusOr<std::unique_ptr<PrefillLoop>> PrefillLoop::Create(
    const ModelWeights& weights, std::unique_ptr<Backend> backend,
    kvtransfer::KvTransport* transport, const Clock* clock, const PrefillLoopOptions& options) {
  if (options.max_queue < 1) {
    // Every job passes through the queue, however briefly.
    return absl::InvalidArgumentError(
        absl::StrCat("max_queue must be at least 1; got ", options.max_queue));
  }
  PrefillLoopOptions loop_options = options;
  if (loop_options.weights_fingerprint.empty()) {
    loop_options.weights_fingerprint = weights.Fingerprint();
  }
  SchedulerOptions scheduler_options;
  scheduler_options.block_size = options.block_size;
  scheduler_options.kv_dtype = options.kv_dtype;
  scheduler_options.kv_blocks = options.kv_blocks;
  scheduler_options.gpu_memory_fraction = options.gpu_memory_fraction;
  scheduler_options.kv_staging_blocks = options.kv_staging_blocks;
  scheduler_options.transport_device_memory = options.transport_device_memory;
  scheduler_options.warm_up_tokens = options.warm_up_tokens;
  scheduler_options.max_batch_tokens = options.max_batch_tokens;
  scheduler_options.kv_lanes = options.kv_lanes;
  scheduler_options.prefix_cache = options.prefix_cache;
  scheduler_options.weights_fingerprint = loop_options.weights_fingerprint;
  scheduler_options.make_executor = options.make_executor;
  scheduler_options.make_kv_tier = options.make_kv_tier;
  scheduler_options.kv_tier_wait = options.kv_tier_wait;
  ASSIGN_OR_RETURN(
      std::unique_ptr<PrefillScheduler> scheduler,
      PrefillScheduler::Create(weights, std::move(backend), transport, clock, scheduler_options));
  std::unique_ptr<PrefillLoop> loop(new PrefillLoop(std::move(scheduler), clock, loop_options));
  loop->Publish({});
  // A job whose KV transfer ends during another prompt's step is answered
  // from inside that step, not after it.
  loop->scheduler_->SetReplyHook([l = loop.get()] {
    std::vector<Reply> replies = l->scheduler_->TakeReplies();
    l->Publish(replies);
    l->Deliver(std::move(replies));
  });
  if (options.own_thread) loop->thread_ = std::thread([l = loop.get()] { l->Run(); });
  return loop;
}

PrefillLoop::PrefillLoop(std::unique_ptr<PrefillScheduler> scheduler, const Clock* clock,
                         const PrefillLoopOptions& options)
    : clock_(clock),
      options_(options),
      config_(scheduler->config()),
      layout_(scheduler->layout()),
      total_blocks_(scheduler->total_blocks()),
      scheduler_(std::move(scheduler)),
      engine_(scheduler_->engine()) {
  stats_.model = options_.model_name;
  stats_.weights_fingerprint = options_.weights_fingerprint;
  stats_.model_shape = config_.ShapeString();
  stats_.kv_dtype = std::string(DTypeName(layout_.dtype));
  stats_.vocab_size = config_.vocab_size;
  stats_.max_context = config_.seq_len;
  stats_.block_size = layout_.block_size;
  stats_.kv_blocks_total = total_blocks_;
}

PrefillLoop::~PrefillLoop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_.Signal();
  }
  if (thread_.joinable()) {
    thread_.join();
  } else {
    ShutDown();
  }
}

absl::Status PrefillLoop::Validate(const PrefillJob& job, kvtransfer::TransferLease& lease) const {
  const std::string name = Name(job);
  const int64_t len = static_cast<int64_t>(job.tokens.size());
  if (len == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": the prompt is empty; send at least one token"));
  }
  if (len >= config_.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": the prompt has ", len, " tokens but the model's context is ",
                     config_.seq_len, " (at most ", config_.seq_len - 1,
                     " prompt tokens, leaving room for one generated token); "
                     "shorten the prompt"));
  }
  for (size_t i = 0; i < job.tokens.size(); ++i) {
    if (job.tokens[i] < 0 || job.tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": token ", i, " is id ", job.tokens[i],
                                                     ", out of range; the vocabulary has ids 0 to ",
                                                     config_.vocab_size - 1));
    }
  }
  if (absl::Status s = job.sampling.ValidateForVocab(config_.vocab_size); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", s.message()));
  }
  if (job.n < 1 || job.n > kMaxChoices) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": n is ", job.n, "; ask for 1 to ", kMaxChoices, " choices"));
  }
  if (job.logprobs.has_value() && (*job.logprobs < 0 || *job.logprobs > kMaxTopLogprobs)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": logprobs is ", *job.logprobs,
                                                   "; ask for 0 to ", kMaxTopLogprobs,
                                                   " alternatives"));
  }
  for (int32_t id : job.stop_token_ids) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": stop token id ", id,
                                                     " is out of range; ids must be in [0, ",
                                                     config_.vocab_size, ")"));
    }
  }
  absl::StatusOr<kvtransfer::TransferLease> parsed =
      kvtransfer::TransferLease::Parse(job.kv_descriptor);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name,
                     ": the KV descriptor is not a valid lease (pass the decode worker's "
                     "Reserved.kv_descriptor unchanged): ",
                     parsed.status().message()));
  }
  const int blocks = static_cast<int>(BlocksFor(len, layout_.block_size));
  if (parsed->first_block > static_cast<uint32_t>(blocks)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": the KV lease starts at block ", parsed->first_block,
                     " but the prompt has only ", blocks, " blocks of ", layout_.block_size,
                     " tokens; the decode worker can hold at most the prompt's blocks"));
  }
  // The decode worker holds the blocks before first_block already.
  const int shipped = blocks - static_cast<int>(parsed->first_block);
  const uint64_t want = static_cast<uint64_t>(shipped) * layout_.block_bytes();
  if (parsed->layer_bytes.size() != static_cast<size_t>(layout_.n_layers) ||
      std::any_of(parsed->layer_bytes.begin(), parsed->layer_bytes.end(),
                  [want](uint64_t b) { return b != want; })) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": the KV lease is for ", parsed->layer_bytes.size(), " layers of ",
                     parsed->layer_bytes.empty() ? 0 : parsed->layer_bytes[0],
                     " bytes, but this prompt's KV from block ", parsed->first_block, " on is ",
                     layout_.n_layers, " layers of ", want, " bytes (", shipped, " blocks of ",
                     layout_.block_size,
                     " tokens); the decode worker must serve the same model with the "
                     "same block size and lease exactly the prompt's blocks"));
  }
  if (blocks > total_blocks_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        name, ": the prompt needs ", blocks, " KV blocks but this worker has ", total_blocks_,
        " in all; shorten the prompt or run the worker with more --kv_blocks"));
  }
  if (clock_->Now() >= job.deadline) {
    return absl::DeadlineExceededError(absl::StrCat(name, ": deadline passed before queueing"));
  }
  lease = *std::move(parsed);
  return absl::OkStatus();
}

JobId PrefillLoop::Submit(PrefillJob request, PrefillDoneFn done) {
  if (PrefillMetrics* m = options_.metrics; m != nullptr) {
    // Every way a job ends goes through its callback.
    done = [m, done = std::move(done)](absl::StatusOr<PrefillResult> result) mutable {
      m->OnReply(result);
      done(std::move(result));
    };
  }
  auto job = std::make_unique<Job>(layout_.block_size);
  absl::Status status = Validate(request, job->lease);
  JobId id = 0;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.requests_total;
    if (status.ok() && (draining_ || stop_)) {
      status = absl::UnavailableError("worker is draining");
    }
    if (status.ok()) status = EngineRefusal(engine_, "prefill worker");
    if (status.ok() && static_cast<int>(queue_.size()) >= options_.max_queue) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          "prefill queue full (", queue_.size(), " requests waiting); retry later or elsewhere"));
    }
    if (status.ok()) {
      id = next_id_++;
      job->id = id;
      job->request = std::move(request);
      job->done = std::move(done);
      job->arrived = clock_->Now();
      queue_.push_back(std::move(job));
      ++outstanding_;
      stats_.waiting = static_cast<int>(queue_.size());
      wake_.Signal();
    } else {
      ++stats_.requests_failed;
    }
  }
  if (!status.ok()) done(status);
  return id;
}

void PrefillLoop::Cancel(JobId id) {
  if (id == 0) return;
  std::vector<Reply> replies;
  {
    absl::MutexLock lock(&mu_);
    auto it =
        std::find_if(queue_.begin(), queue_.end(), [id](const auto& j) { return j->id == id; });
    if (it != queue_.end()) {
      replies.push_back(Reply{std::move((*it)->done),
                              absl::CancelledError(absl::StrCat(
                                  Name((*it)->request), " cancelled by the client while queued"))});
      queue_.erase(it);
      stats_.waiting = static_cast<int>(queue_.size());
      ++stats_.requests_failed;
    } else {
      cancels_.push_back(id);
      wake_.Signal();
    }
  }
  Deliver(std::move(replies));
}

void PrefillLoop::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  stats_.draining = true;
}

bool PrefillLoop::WaitUntilIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outstanding_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

PrefillStats PrefillLoop::Stats() const {
  PrefillStats s;
  {
    absl::MutexLock lock(&mu_);
    s = stats_;
  }
  // Current, not as of the last round: see DecodeLoop::Stats.
  s.engine_error = std::string(engine_.status().message());
  return s;
}

int PrefillLoop::FlushPrefixCache() {
  absl::MutexLock lock(&mu_);
  const uint64_t ticket = ++flushes_asked_;
  wake_.Signal();
  auto served = [this, ticket]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return flushes_done_ >= ticket || stop_; };
  mu_.Await(absl::Condition(&served));
  return flushes_done_ >= ticket ? flushed_ : 0;
}

void PrefillLoop::Intake(std::vector<Reply>& replies) {
  for (JobId id : std::exchange(cancels_, {})) scheduler_->Cancel(id);
  if (flushes_done_ < flushes_asked_) {
    flushed_ = scheduler_->FlushPrefixCache();
    flushes_done_ = flushes_asked_;
    // Visible to the caller as soon as it returns.
    stats_.kv_blocks_free = scheduler_->free_blocks();
    stats_.kv_blocks_cached = scheduler_->cached_blocks();
    scheduler_->ForwardTierEvents();
    cache_events_.CatchUp(engine_.block_pool().events());
  }
  if (const absl::Status refusal = EngineRefusal(engine_, "prefill worker"); !refusal.ok()) {
    // Never computed: another worker can serve them.
    for (std::unique_ptr<Job>& job : queue_) {
      replies.push_back(Reply{
          std::move(job->done),
          absl::Status(refusal.code(), absl::StrCat(JobName(*job), ": ", refusal.message()))});
    }
    queue_.clear();
    return;
  }
  const absl::Time now = clock_->Now();
  while (!queue_.empty()) {
    std::unique_ptr<Job>& job = queue_.front();
    if (now >= job->request.deadline) {
      replies.push_back(Reply{std::move(job->done),
                              absl::DeadlineExceededError(absl::StrCat(
                                  JobName(*job), ": deadline passed while queued for KV blocks"))});
    } else if (!scheduler_->TryAdmit(job)) {
      break;  // FIFO: later jobs wait behind the first one that does not fit.
    }
    queue_.pop_front();
  }
}

void PrefillLoop::Publish(const std::vector<Reply>& replies) {
  absl::MutexLock lock(&mu_);
  for (const Reply& r : replies) {
    if (!r.result.ok()) ++stats_.requests_failed;
  }
  stats_.kv_blocks_free = scheduler_->free_blocks();
  stats_.kv_blocks_cached = scheduler_->cached_blocks();
  stats_.running = scheduler_->active();
  stats_.waiting = static_cast<int>(queue_.size());
  const SchedulerCounters& c = scheduler_->counters();
  stats_.steps = c.steps;
  stats_.kv_transfers = c.kv_transfers;
  stats_.kv_transfer_bytes = c.kv_transfer_bytes;
  stats_.kv_transfers_failed = c.kv_transfers_failed;
  stats_.prefix_cache_queried_tokens = c.prefix_cache_queried_tokens;
  stats_.prefix_cache_hit_tokens = c.prefix_cache_hit_tokens;
  stats_.prefix_cache_evicted_blocks = engine_.block_pool().evictions();
  scheduler_->ForwardTierEvents();
  cache_events_.CatchUp(engine_.block_pool().events());
  if (const KvTier* tier = scheduler_->kv_tier(); tier != nullptr) {
    stats_.kv_tier = true;
    stats_.tiers.clear();
    for (const KvTier* t = tier; t != nullptr; t = t->below()) {
      stats_.tiers.emplace_back(t->level(), t->stats());
    }
    stats_.tier_link = scheduler_->tier_link()->stats();
    stats_.tier_queried_tokens = c.tier_queried_tokens;
    stats_.tier_hit_tokens = c.tier_hit_tokens;
  }
  stats_.kv_connections = scheduler_->pooled_connections();
  if (options_.transport_peers) stats_.kv_peers = options_.transport_peers();
  AddEngineStats(engine_, stats_);
  if (options_.metrics != nullptr) {
    options_.metrics->Publish(stats_);
    options_.metrics->PublishExpertLoad(engine_.expert_load());
  }
}

void PrefillLoop::Deliver(std::vector<Reply> replies) {
  for (Reply& r : replies) {
    r.done(std::move(r.result));
    absl::MutexLock lock(&mu_);
    --outstanding_;
  }
}

bool PrefillLoop::Round() {
  std::vector<Reply> replies;
  {
    absl::MutexLock lock(&mu_);
    Intake(replies);
  }
  const uint64_t steps_before = scheduler_->counters().steps;
  const absl::Time round_start = clock_->Now();
  scheduler_->RunOnce();
  const bool stepped = scheduler_->counters().steps != steps_before;
  if (options_.metrics != nullptr && stepped) {
    options_.metrics->ObserveStep(clock_->Now() - round_start);
  }
  for (Reply& r : scheduler_->TakeReplies()) replies.push_back(std::move(r));
  // Stats first, so that a caller woken by its reply sees its blocks free
  // and its outcome counted.
  Publish(replies);
  Deliver(std::move(replies));
  return stepped;
}

bool PrefillLoop::RunRound() {
  CHECK(!options_.own_thread) << "RunRound drives a loop made without its own thread";
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return false;
  }
  return Round();
}

void PrefillLoop::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
    }
    Round();
    if (scheduler_->has_compute()) continue;
    if (scheduler_->transfers_pending() || scheduler_->loads_pending()) {
      // Real time: a fake clock standing still would make this wait spin.
      scheduler_->WaitForTransfers(absl::Now() + options_.transfer_poll);
      continue;
    }
    absl::MutexLock lock(&mu_);
    if (!stop_ && queue_.empty() && cancels_.empty() && flushes_done_ == flushes_asked_) {
      wake_.WaitWithTimeout(&mu_, options_.idle_wait);
    }
  }
  ShutDown();
}

void PrefillLoop::ShutDown() {
  // Nothing new is admitted.
  std::vector<Reply> replies;
  {
    absl::MutexLock lock(&mu_);
    for (std::unique_ptr<Job>& job : queue_) {
      replies.push_back(Reply{std::move(job->done),
                              absl::UnavailableError(absl::StrCat(
                                  JobName(*job), ": prefill worker shut down before it started"))});
    }
    queue_.clear();
  }
  scheduler_->Shutdown(absl::UnavailableError("prefill worker shut down"),
                       clock_->Now() + options_.shutdown_timeout);
  for (Reply& r : scheduler_->TakeReplies()) replies.push_back(std::move(r));
  Publish(replies);
  Deliver(std::move(replies));
}

}  // namespace tandem::prefill
