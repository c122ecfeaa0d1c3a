#include "prefill_worker/prefill_scheduler.h"

#include <algorithm>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/engine/logprobs.h"
#include "common/engine/sampler.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/kv_layout.h"
#include "kvtransfer/slices.h"

namespace tandem::prefill {
namespace {

// Most rows of logits one step returns: one per final chunk, one per token
// of a chunk whose prompt logprobs are wanted.
constexpr int kMaxLogitRows = 256;

// Longest the loop waits on the transport while layer copies to the KV
// staging or loads from the KV tier are in flight: neither finishing is
// transport activity, so they are polled for.
constexpr absl::Duration kCopyPoll = absl::Microseconds(100);

int64_t Micros(absl::Duration d) { return std::max<int64_t>(0, absl::ToInt64Microseconds(d)); }

}  // namespace

std::string JobName(const internal::Job& job) {
  if (job.request.request_id.empty()) return absl::StrCat("job ", job.id);
  return absl::StrCat("request '", job.request.request_id, "'");
}

absl::StatusOr<std::unique_ptr<PrefillScheduler>> PrefillScheduler::Create(
    const ModelWeights& weights, std::unique_ptr<Backend> backend,
    kvtransfer::KvTransport* transport, const Clock* clock, const SchedulerOptions& options) {
  if (options.block_size <= 0 || options.kv_blocks < 0 || options.max_batch_tokens <= 0 ||
      options.kv_lanes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size (", options.block_size, "), max_batch_tokens (",
                     options.max_batch_tokens, ") and kv_lanes (", options.kv_lanes,
                     ") must be positive and kv_blocks (", options.kv_blocks, ") not negative"));
  }
  ASSIGN_OR_RETURN(
      WorkerEngine we,
      CreateWorkerEngine(weights, std::move(backend),
                         {.role = "prefill",
                          .block_size = options.block_size,
                          .kv_dtype = options.kv_dtype,
                          .kv_blocks = options.kv_blocks,
                          .gpu_memory_fraction = options.gpu_memory_fraction,
                          .max_batch_tokens = options.max_batch_tokens,
                          .max_logit_rows = std::min(options.max_batch_tokens, kMaxLogitRows),
                          .kv_staging_blocks = options.kv_staging_blocks,
                          .transport_name = transport->name(),
                          .transport_device_memory = options.transport_device_memory,
                          .warm_up_tokens = options.warm_up_tokens}));
  // The transport reads host memory only: the staging when there is one.
  void* const memory = we.transport_memory();
  const size_t bytes = we.transport_bytes();
  if (options.make_kv_tier && (we.staging != nullptr || !options.prefix_cache)) {
    return absl::InvalidArgumentError(
        we.staging != nullptr
            ? "a KV tier needs the KV cache in host memory; this backend keeps it on the device "
              "(run without --kv_host_tier_gib and --kv_tier_dir)"
            : "a KV tier sits below the prefix cache: turn the prefix cache on or drop the tier");
  }
  std::unique_ptr<PrefillScheduler> s(
      new PrefillScheduler(std::move(we.engine), std::move(we.staging), transport, clock, options));
  if (options.make_kv_tier) {
    ASSIGN_OR_RETURN(s->tier_,
                     options.make_kv_tier(KvTierIdentity::Of(s->salt_, s->engine_->kv_layout())));
    s->link_ = std::make_unique<TierLink>(s->tier_.get(), s->engine_->kv_layout(),
                                          static_cast<uint8_t*>(s->engine_->kv_cache()));
    s->link_->Attach(s->engine_->block_pool());
  }
  ASSIGN_OR_RETURN(s->region_,
                   s->sender_->RegisterMemory(memory, bytes, kvtransfer::MemoryKind::kHost));
  return s;
}

PrefillScheduler::PrefillScheduler(std::unique_ptr<Engine> engine,
                                   std::unique_ptr<KvStaging> staging,
                                   kvtransfer::KvTransport* transport, const Clock* clock,
                                   const SchedulerOptions& options)
    : engine_(std::move(engine)),
      executor_(options.make_executor ? options.make_executor(*engine_) : nullptr),
      clock_(clock),
      options_(options),
      max_logit_rows_(std::min(options.max_batch_tokens, kMaxLogitRows)),
      salt_(BlockHashSalt(options.weights_fingerprint, DTypeName(engine_->kv_layout().dtype),
                          options.block_size)),
      staging_(std::move(staging)),
      copier_(staging_ != nullptr ? engine_->backend().kv_copier() : nullptr),
      sender_(std::make_unique<kvtransfer::TransferSender>(
          transport, clock, kvtransfer::SenderOptions{.lanes = options.kv_lanes})) {}

PrefillScheduler::~PrefillScheduler() {
  DropSender();
  HandleTransferEnds();
  for (auto& job : active_) {
    if (!job->finished) Finish(*job, absl::CancelledError("prefill worker destroyed"));
  }
  engine_->block_pool().SetEvictionHook(nullptr);
}

void PrefillScheduler::DropSender() {
  if (sender_ == nullptr) return;
  // Deregister first, so that the transport can no longer read the cache;
  // the sender's destructor then ends what is left with CANCELLED.
  if (absl::Status s = sender_->DeregisterMemory(region_); !s.ok()) {
    LOG(WARNING) << "deregistering the KV cache: " << s;
  }
  sender_.reset();
}

bool PrefillScheduler::has_compute() const {
  return std::any_of(active_.begin(), active_.end(), [](const auto& j) {
    return !j->finished && j->state == Job::State::kComputing;
  });
}

bool PrefillScheduler::TryAdmit(std::unique_ptr<Job>& job) {
  BlockPool& pool = engine_->block_pool();
  const int block_size = options_.block_size;
  const int len = job->prompt_len();
  if (options_.prefix_cache && !job->hashed) {
    job->block_hashes = HashBlocks(salt_, job->request.tokens, block_size, len / block_size);
    job->hashed = true;
  }
  // The last prompt token is always computed: its logits give the first
  // token. Prompt logprobs need the logits of every prompt token.
  const int lookup = job->request.prompt_logprobs
                         ? 0
                         : std::min<int>((len - 1) / block_size, job->block_hashes.size());
  const std::span<const BlockHash> hashes = std::span<const BlockHash>(job->block_hashes);
  std::vector<int32_t> hits = pool.AcquirePrefix(hashes.first(lookup));
  const int held = static_cast<int>(hits.size());
  const int cached_tokens = held * block_size;
  if (!hits.empty()) job->table.Adopt(std::move(hits), cached_tokens);
  if (!job->table.Reserve(len - cached_tokens, pool).ok()) {
    job->table.Release(pool);
    return false;
  }
  // The blocks the decode worker does not hold already go through staging.
  const int shipped =
      static_cast<int>(job->table.blocks().size()) - static_cast<int>(job->lease.first_block);
  absl::Status refused;
  if (staging_ != nullptr && shipped > 0) {
    absl::StatusOr<StagingRun> run = staging_->Allocate(shipped);
    if (absl::IsResourceExhausted(run.status())) {
      // Like a full pool: it waits for transfers to end.
      job->table.Release(pool);
      return false;
    }
    if (run.ok()) {
      job->staging = *run;
    } else {
      refused = absl::Status(run.status().code(),
                             absl::StrCat(JobName(*job), ": ", run.status().message()));
    }
  }
  job->cached_tokens = cached_tokens;
  counters_.prefix_cache_queried_tokens += static_cast<uint64_t>(lookup) * block_size;
  counters_.prefix_cache_hit_tokens += cached_tokens;
  job->state = Job::State::kComputing;
  // The blocks after the cached ones that the tier holds load into the
  // blocks just reserved for them.
  if (link_ != nullptr && refused.ok() && held < lookup) {
    const std::span<const BlockHash> rest = hashes.subspan(held, lookup - held);
    counters_.tier_queried_tokens += rest.size() * block_size;
    if (const int n = link_->Probe(rest); n > 0) {
      job->fetch = link_->Start(rest.first(n), job->table.blocks().subspan(held, n),
                                clock_->Now() + options_.kv_tier_wait);
      job->state = Job::State::kLoading;
    }
  }
  active_.push_back(std::move(job));
  // Never fits (Create makes the staging hold any prompt the pool can, so
  // only a job the loop did not validate gets here): taken and failed.
  if (!refused.ok()) Finish(*active_.back(), refused);
  return true;
}

void PrefillScheduler::Cancel(JobId id) {
  for (auto& job : active_) {
    if (job->id == id && !job->finished) {
      Fail(*job, absl::CancelledError(absl::StrCat(JobName(*job), " cancelled by the client")));
    }
  }
}

bool PrefillScheduler::loads_pending() const {
  return std::any_of(active_.begin(), active_.end(), [](const auto& j) {
    return !j->finished && j->state == Job::State::kLoading;
  });
}

void PrefillScheduler::PollFetches() {
  if (link_ == nullptr) return;
  const absl::Time now = clock_->Now();
  for (auto& owned : active_) {
    Job& job = *owned;
    if (job.finished || job.state != Job::State::kLoading || !link_->Poll(job.fetch, now)) {
      continue;
    }
    const int tokens = job.fetch.loaded() * options_.block_size;
    job.table.Advance(tokens);
    job.cached_tokens += tokens;
    job.tier_tokens = tokens;
    counters_.tier_hit_tokens += tokens;
    job.state = Job::State::kComputing;
  }
}

void PrefillScheduler::RunOnce() {
  if (sender_ == nullptr) return;
  PollFetches();
  if (staging_ != nullptr) PollLayerCopies();
  sender_->Poll();
  HandleTransferEnds();
  ExpireDeadlines();
  if (has_compute()) {
    // What ended before the step is answered now, not after it.
    if (!replies_.empty() && reply_hook_) reply_hook_();
    Step();
    HandleTransferEnds();
  }
  Sweep();
}

void PrefillScheduler::WaitForTransfers(absl::Time deadline) {
  if (sender_ == nullptr) return;
  // A real-time wait, as `deadline` is: the scheduler's clock may be fake.
  if (layer_copies_pending() || loads_pending())
    deadline = std::min(deadline, absl::Now() + kCopyPoll);
  sender_->WaitForActivity(deadline);
}

std::vector<Reply> PrefillScheduler::TakeReplies() { return std::exchange(replies_, {}); }

void PrefillScheduler::Step() {
  const absl::Time now = clock_->Now();
  std::vector<BatchItem> items;
  std::vector<Job*> jobs;    // Item order.
  std::vector<Job*> finals;  // Jobs whose last chunk is in this step.
  int budget = options_.max_batch_tokens;
  // Rows of logits: one per final chunk, one per token of a chunk whose
  // prompt logprobs are wanted (so those prompts go in chunks of at most
  // the engine's max_logit_rows, bounding the logits held at once).
  int row_budget = max_logit_rows_;
  for (auto& owned : active_) {
    Job& job = *owned;
    if (job.finished || job.state != Job::State::kComputing) continue;
    if (budget == 0 || row_budget == 0) break;
    const bool all_rows = job.request.prompt_logprobs;
    const int n = std::min({job.remaining(), budget, all_rows ? row_budget : budget});
    const bool final = n == job.remaining();
    if (final && !job.transfer_started) {
      // Started before the step so that each layer can ship as soon as it
      // is written.
      if (absl::Status s = StartTransfer(job); !s.ok()) {
        Fail(job, s);
        continue;
      }
    }
    if (job.started == absl::InfinitePast()) job.started = now;
    BatchItem item{&job.table,
                   std::span<const int32_t>(job.request.tokens).subspan(job.table.num_tokens(), n),
                   final};
    item.all_logits = all_rows;
    items.push_back(item);
    jobs.push_back(&job);
    if (final) finals.push_back(&job);
    budget -= n;
    row_budget -= item.logit_rows();
  }
  // Where each item's chunk starts in its prompt (Step advances the tables).
  std::vector<int> starts;
  for (const BatchItem& item : items) starts.push_back(item.table->num_tokens());
  if (items.empty()) return;

  const int last_layer = engine_->config().n_layers - 1;
  auto kv_written = [&](int layer) {
    if (staging_ != nullptr) {
      // The layer is queued on the device, maybe not computed yet: it is
      // copied to the staging after it, and shipped once the copy is done.
      StageLayer(finals, layer);
      PollLayerCopies();
    } else {
      for (Job* job : finals) {
        // Once a transfer has failed it takes no more layers; its done
        // callback (already queued, or following) ends the job.
        if (job->transfer_ended) continue;
        (void)sender_->MarkLayerReady(job->lease.request_id, static_cast<uint32_t>(layer));
      }
    }
    if (layer == last_layer) {
      const absl::Time t = clock_->Now();
      for (Job* job : finals) job->last_layer = t;
    }
    sender_->Poll();
    if (!ended_.empty()) {
      HandleTransferEnds(/*in_step=*/true);
      if (!replies_.empty() && reply_hook_) reply_hook_();
    }
  };
  StepExecutor& executor = executor_ != nullptr ? *executor_ : *engine_;
  absl::StatusOr<std::vector<float>> logits = executor.Step(items, kv_written);
  if (!logits.ok()) {
    for (Job* job : jobs) {
      Fail(*job, absl::Status(logits.status().code(),
                              absl::StrCat(JobName(*job),
                                           ": prefill step failed: ", logits.status().message())));
    }
    return;
  }
  ++counters_.steps;
  const absl::Time computed = clock_->Now();
  const size_t vocab = static_cast<size_t>(engine_->config().vocab_size);
  size_t row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    Job& job = *jobs[i];
    const int rows = items[i].logit_rows();
    const std::span<const float> chunk =
        std::span<const float>(*logits).subspan(row * vocab, rows * vocab);
    row += rows;
    if (job.request.prompt_logprobs) AddPromptLogprobs(job, starts[i], chunk);
    if (items[i].want_logits && job.remaining() == 0) {
      CachePromptBlocks(job);
      SampleFirstTokens(job, chunk.subspan(chunk.size() - vocab));
      job.computed = computed;
      job.state = Job::State::kTransferring;
    }
  }
}

void PrefillScheduler::AddPromptLogprobs(Job& job, int start, std::span<const float> rows) {
  const size_t vocab = static_cast<size_t>(engine_->config().vocab_size);
  const std::vector<int32_t>& tokens = job.request.tokens;
  const int top = job.request.logprobs.value_or(0);
  for (size_t r = 0; r * vocab < rows.size(); ++r) {
    // Row r predicts the token after position start + r.
    const size_t next = start + r + 1;
    if (next >= tokens.size()) break;
    job.prompt_logprobs.push_back(
        ComputeLogprob(rows.subspan(r * vocab, vocab), tokens[next], top));
  }
}

void PrefillScheduler::SampleFirstTokens(Job& job, std::span<const float> last_row) {
  const PrefillJob& request = job.request;
  for (int i = 0; i < request.n; ++i) {
    SamplingParams params = request.sampling;
    params.seed = ChoiceSeed(request.sampling.seed, i);
    Sampler sampler(params, request.tokens, request.stop_token_ids);
    const int32_t token = sampler.Sample(last_row);
    job.first_tokens.push_back(token);
    job.sampler_draws.push_back(sampler.draws());
    if (request.logprobs.has_value()) {
      job.first_logprobs.push_back(ComputeLogprob(last_row, token, *request.logprobs));
    }
  }
}

void PrefillScheduler::CachePromptBlocks(const Job& job) {
  BlockPool& pool = engine_->block_pool();
  const std::span<const int32_t> blocks = job.table.blocks();
  for (size_t b = 0; b < job.block_hashes.size() && b < blocks.size(); ++b) {
    // False when the block is cached already (taken from the cache) or
    // another block holds the hash (an equal prompt computed alongside).
    (void)pool.SetCached(blocks[b], job.block_hashes[b]);
  }
}

absl::Status PrefillScheduler::StartTransfer(Job& job) {
  const std::span<const int32_t> blocks = job.table.blocks();
  if (job.lease.first_block > blocks.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(JobName(job), ": the KV lease starts at block ", job.lease.first_block,
                     " but the prompt has only ", blocks.size(), " blocks"));
  }
  kvtransfer::SendRequest request;
  request.descriptor = job.request.kv_descriptor;
  const KvLayout& layout = engine_->kv_layout();
  // The decode worker holds the blocks before first_block already.
  const std::span<const int32_t> shipped = blocks.subspan(job.lease.first_block);
  if (staging_ != nullptr) {
    // The job's staging run: one contiguous slice per layer.
    CHECK(static_cast<int>(shipped.size()) == job.staging.count);
    request.layers =
        kvtransfer::PagedKvSlices(region_, layout.n_layers, staging_->layout().layer_bytes(),
                                  layout.block_bytes(), KvStaging::SlotIds(job.staging));
  } else {
    request.layers = kvtransfer::PagedKvSlices(region_, layout.n_layers, layout.layer_bytes(),
                                               layout.block_bytes(), shipped);
  }
  request.deadline = job.request.deadline;
  // The job outlives its transfer: it is dropped only after this ran.
  request.done = [this, j = &job](uint64_t, const absl::Status& status) {
    j->transfer_ended = true;
    j->transfer_status = status;
    ended_.push_back(j);
  };
  absl::StatusOr<uint64_t> id = sender_->Start(std::move(request));
  if (!id.ok()) {
    return absl::Status(
        id.status().code(),
        absl::StrCat(JobName(job), ": cannot send the KV cache: ", id.status().message()));
  }
  job.transfer_started = true;
  return absl::OkStatus();
}

void PrefillScheduler::StageLayer(std::span<Job* const> jobs, int layer) {
  std::vector<CopyRange> ranges;
  std::vector<Job*> staged;
  for (Job* job : jobs) {
    // A failed transfer takes no more layers.
    if (job->transfer_ended || !job->failure.ok()) continue;
    staging_->AppendToHost(layer, job->table.blocks().subspan(job->lease.first_block), job->staging,
                           ranges);
    staged.push_back(job);
  }
  if (staged.empty()) return;
  // One copy for every job of the step: one event on a GPU.
  const absl::StatusOr<uint64_t> ticket =
      copier_->ToHost(engine_->kv_cache(), staging_->data(), ranges);
  for (Job* job : staged) {
    if (!ticket.ok()) {
      Fail(*job, absl::Status(ticket.status().code(),
                              absl::StrCat(JobName(*job), ": copying layer ", layer,
                                           " of the KV cache to host staging failed: ",
                                           ticket.status().message())));
      continue;
    }
    job->layer_copies.push_back(Job::LayerCopy{static_cast<uint32_t>(layer), *ticket});
  }
}

void PrefillScheduler::PollLayerCopies() {
  for (auto& owned : active_) {
    Job& job = *owned;
    while (!job.layer_copies.empty()) {
      const Job::LayerCopy copy = job.layer_copies.front();
      const absl::StatusOr<bool> finished = copier_->Finished(copy.ticket);
      if (finished.ok() && !*finished) break;  // Later layers were queued after it.
      job.layer_copies.pop_front();
      if (!finished.ok()) {
        Fail(job, absl::Status(finished.status().code(),
                               absl::StrCat(JobName(job), ": copying layer ", copy.layer,
                                            " of the KV cache to host staging failed: ",
                                            finished.status().message())));
        break;
      }
      if (!job.transfer_ended) (void)sender_->MarkLayerReady(job.lease.request_id, copy.layer);
    }
  }
}

bool PrefillScheduler::layer_copies_pending() const {
  return std::any_of(active_.begin(), active_.end(),
                     [](const auto& j) { return !j->layer_copies.empty(); });
}

void PrefillScheduler::HandleTransferEnds(bool in_step) {
  for (Job* job : std::exchange(ended_, {})) {
    if (in_step && !job->finished && job->state == Job::State::kComputing) {
      ended_.push_back(job);  // The step may be computing it.
      continue;
    }
    const absl::Status& status = job->transfer_status;
    if (status.ok()) {
      ++counters_.kv_transfers;
      counters_.kv_transfer_bytes += job->lease.total_bytes();
    } else {
      ++counters_.kv_transfers_failed;
    }
    if (!job->failure.ok()) {
      Finish(*job, job->failure);
    } else if (!status.ok()) {
      Finish(*job, status);
    } else if (job->state != Job::State::kTransferring) {
      // Cannot happen: the decode worker confirms only after every layer,
      // and the last layer is marked in the step that samples the token.
      Finish(*job, absl::InternalError(absl::StrCat(
                       JobName(*job), ": KV transfer confirmed before the prompt was computed")));
    } else {
      PrefillResult result;
      result.first_token = job->first_tokens.front();
      result.extra_first_tokens.assign(job->first_tokens.begin() + 1, job->first_tokens.end());
      result.first_logprobs = std::move(job->first_logprobs);
      result.sampler_draws = std::move(job->sampler_draws);
      result.prompt_logprobs = std::move(job->prompt_logprobs);
      result.queue_us = Micros(job->started - job->arrived);
      result.prefill_us = Micros(job->computed - job->started);
      result.kv_transfer_us = Micros(clock_->Now() - job->last_layer);
      result.kv_bytes = static_cast<int64_t>(job->lease.total_bytes());
      result.cached_tokens = job->cached_tokens;
      result.tier_tokens = job->tier_tokens;
      Finish(*job, result);
    }
  }
}

void PrefillScheduler::ExpireDeadlines() {
  const absl::Time now = clock_->Now();
  for (auto& job : active_) {
    // Started transfers carry the deadline themselves (the sender enforces it).
    if (job->finished || job->transfer_started || now < job->request.deadline) continue;
    Fail(*job, absl::DeadlineExceededError(
                   absl::StrCat(JobName(*job), ": deadline passed with ", job->table.num_tokens(),
                                " of ", job->prompt_len(), " prompt tokens computed")));
  }
}

void PrefillScheduler::Fail(Job& job, const absl::Status& status) {
  if (job.finished) return;
  // A failed transfer takes no more layers.
  job.layer_copies.clear();
  if (job.transfer_started && !job.transfer_ended) {
    // The sender may still read the blocks: release them from its done.
    if (job.failure.ok()) job.failure = status;
    if (sender_ != nullptr) (void)sender_->Cancel(job.lease.request_id);
    return;
  }
  Finish(job, status);
}

void PrefillScheduler::Finish(Job& job, absl::StatusOr<PrefillResult> result) {
  if (job.finished) return;
  job.finished = true;
  // The tier writes into the job's blocks no more once this returns.
  if (link_ != nullptr) link_->Cancel(job.fetch);
  engine_->Release(job.table);
  // The sender has let go of the run. A copy into it may still be in
  // flight (the transfer failed first); the next owner's copies are queued
  // after it and finish after it, and its transfer reads the run only then.
  job.layer_copies.clear();
  if (staging_ != nullptr) staging_->Free(job.staging);
  replies_.push_back(Reply{std::move(job.done), std::move(result)});
}

void PrefillScheduler::Sweep() {
  std::erase_if(active_, [](const auto& job) { return job->finished; });
}

void PrefillScheduler::Shutdown(const absl::Status& why, absl::Time deadline) {
  for (auto& job : active_) Fail(*job, why);
  while (sender_ != nullptr) {
    sender_->Poll();
    HandleTransferEnds();
    const absl::Time now = clock_->Now();
    if (sender_->idle() || now >= deadline) break;
    sender_->WaitForActivity(std::min(deadline, now + absl::Milliseconds(10)));
  }
  if (transfers_pending()) {
    LOG(WARNING) << sender_->pending() << " KV transfers did not end before the shutdown deadline";
  }
  DropSender();
  HandleTransferEnds();
  Sweep();
}

}  // namespace tandem::prefill
