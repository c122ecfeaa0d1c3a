#include "decode_worker/decode_loop.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/worker/worker_engine.h"
#include "common/worker/worker_health.h"
#include "decode_worker/sequence.h"

namespace tandem::decode {

namespace {

// How long the loop sleeps with nothing to do: on the transport while KV is
// arriving (short, so that inbox commands are not held up), else on the
// inbox (bounded, so that reservation deadlines are noticed). Real time,
// not the loop's clock: a fake clock standing still would put a transport
// wait's deadline in the past and spin the loop.
constexpr absl::Duration kTransportWait = absl::Milliseconds(2);
constexpr absl::Duration kIdleWait = absl::Milliseconds(10);
// How long shutdown waits for the transport to let go of cancelled leases'
// destinations before the KV cache is freed.
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);
// How long the loop sleeps while copies out of the KV staging are in
// flight: a finished copy wakes nothing, so it is polled for.
constexpr absl::Duration kCopyPoll = absl::Microseconds(100);

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeLoop>> DecodeLoop::Create(const ModelWeights& weights,
                                                               std::unique_ptr<Backend> backend,
                                                               kvtransfer::KvTransport* transport,
                                                               DecodeLoopOptions options) {
  if (transport == nullptr) return absl::InvalidArgumentError("a KV transport is required");
  if (options.block_size <= 0 || options.kv_blocks < 0) {
    return absl::InvalidArgumentError("block_size must be > 0 and kv_blocks >= 0");
  }
  if (options.max_sequences <= 0 || options.max_batch_tokens < options.max_sequences) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_sequences (", options.max_sequences, ") must be > 0 and at most max_batch_tokens (",
        options.max_batch_tokens, "): every running sequence steps one token per batch"));
  }
  if (options.schedule_policy == SchedulePolicyKind::kChunked &&
      (options.prefill_chunk_tokens < options.max_sequences ||
       options.prefill_chunk_tokens > options.max_batch_tokens)) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill_chunk_tokens (", options.prefill_chunk_tokens,
                     ") must be at least max_sequences (", options.max_sequences,
                     ") and at most max_batch_tokens (", options.max_batch_tokens,
                     ") with the chunked schedule policy"));
  }
  if (options.kv_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("kv_timeout must be positive");
  }
  ASSIGN_OR_RETURN(
      WorkerEngine we,
      CreateWorkerEngine(weights, std::move(backend),
                         {.role = "decode",
                          .block_size = options.block_size,
                          .kv_dtype = options.kv_dtype,
                          .kv_blocks = options.kv_blocks,
                          .gpu_memory_fraction = options.gpu_memory_fraction,
                          .max_batch_tokens = options.max_batch_tokens,
                          // At most one row of logits per held sequence.
                          .max_logit_rows = options.max_sequences,
                          .kv_staging_blocks = options.kv_staging_blocks,
                          .transport_name = transport->name(),
                          .transport_device_memory = options.transport_device_memory}));
  const int pool_blocks = we.engine->block_pool().num_blocks();
  if (options.kv_watermark_blocks == -1) {
    options.kv_watermark_blocks = std::max(1, pool_blocks / 50);
  }
  if (options.kv_watermark_blocks < 0 || options.kv_watermark_blocks >= pool_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_watermark_blocks (", options.kv_watermark_blocks,
        ") must be -1 (2% of the pool) or in [0, ", pool_blocks, "), the KV pool's blocks"));
  }
  if (options.weights_fingerprint.empty()) options.weights_fingerprint = weights.Fingerprint();
  // The transport writes host memory only: the staging when there is one.
  void* const memory = we.transport_memory();
  const size_t bytes = we.transport_bytes();
  std::unique_ptr<DecodeLoop> loop(
      new DecodeLoop(std::move(we.engine), std::move(we.staging), transport, options));
  ASSIGN_OR_RETURN(loop->kv_region_,
                   loop->receiver_->RegisterMemory(memory, bytes, kvtransfer::MemoryKind::kHost));
  loop->PublishStats();
  if (loop->options_.own_thread) loop->thread_ = std::thread([l = loop.get()] { l->Run(); });
  return loop;
}

DecodeLoop::DecodeLoop(std::unique_ptr<Engine> engine, std::unique_ptr<KvStaging> staging,
                       kvtransfer::KvTransport* transport, DecodeLoopOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &Clock::Real()),
      config_(engine->config()),
      salt_(BlockHashSalt(options_.weights_fingerprint, DTypeName(engine->kv_layout().dtype),
                          engine->kv_layout().block_size)),
      policy_(MakeSchedulePolicy(options_.schedule_policy, options_.prefill_chunk_tokens)),
      engine_(std::move(engine)),
      staging_(std::move(staging)),
      copier_(staging_ != nullptr ? engine_->backend().kv_copier() : nullptr),
      transport_(transport),
      receiver_(
          std::make_unique<kvtransfer::TransferReceiver>(transport_, clock_, options_.receiver)) {
  if (options_.make_executor) executor_ = options_.make_executor(*engine_);
}

DecodeLoop::~DecodeLoop() {
  Stop();
  if (receiver_->idle()) {
    (void)receiver_->DeregisterMemory(kv_region_);
  } else {
    // The transport may still write into these destinations: leave the
    // region registered (the transport outlives us) rather than race it.
    LOG(ERROR) << "decode loop: " << receiver_->pending() << " KV transfers still open at shutdown";
  }
  // Now, while the sequences its done callbacks name still exist.
  receiver_.reset();
}

absl::StatusOr<DecodeLoop::Ticket> DecodeLoop::Submit(Request request,
                                                      std::shared_ptr<EventSink> sink) {
  const absl::Status valid = Validate(request);
  absl::MutexLock lock(&mu_);
  ++submitted_;
  absl::Status refusal = valid;
  if (refusal.ok() && (stop_ || draining_)) {
    refusal =
        absl::UnavailableError(stop_ ? "decode worker is shutting down" : "worker is draining");
  }
  if (refusal.ok()) refusal = EngineRefusal(*engine_, "decode worker");
  if (refusal.ok() && held_ + request.n > options_.max_sequences) {
    refusal = absl::ResourceExhaustedError(
        absl::StrCat("decode worker holds ", held_, " sequences; the request's ", request.n,
                     " choices would exceed its maximum of ", options_.max_sequences,
                     "; retry later or on another worker"));
  }
  if (!refusal.ok()) {
    ++refused_;
    if (options_.metrics != nullptr) options_.metrics->OnRefused(refusal);
    return refusal;
  }
  if (options_.metrics != nullptr) sink = options_.metrics->Wrap(std::move(sink));
  const Ticket ticket = next_ticket_++;
  if (request.request_id.empty()) request.request_id = absl::StrCat("local-", ticket);
  held_ += request.n;
  inbox_.submits.push_back(SubmitCmd{ticket, std::move(request), std::move(sink), clock_->Now()});
  return ticket;
}

DecodeLoop::Ticket DecodeLoop::RandomTicketBase() {
  std::random_device device;
  const uint64_t high = (uint64_t{device()} << 32 | device()) & ((uint64_t{1} << 62) - 1);
  return (high & ~uint64_t{0xFFFFFF}) + 1;
}

void DecodeLoop::Start(std::string request_id, uint64_t generation, int32_t first_token,
                       std::vector<int32_t> extra_first_tokens, StartDoneFn done,
                       std::vector<uint64_t> sampler_draws) {
  std::vector<int32_t> first_tokens = {first_token};
  first_tokens.insert(first_tokens.end(), extra_first_tokens.begin(), extra_first_tokens.end());
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      inbox_.starts.push_back(StartCmd{std::move(request_id), generation, std::move(first_tokens),
                                       std::move(sampler_draws), std::move(done), clock_->Now()});
      return;
    }
  }
  done(absl::UnavailableError("decode worker is shutting down"));
}

void DecodeLoop::Cancel(Ticket ticket) {
  absl::MutexLock lock(&mu_);
  if (!stop_) inbox_.cancels.push_back(ticket);
}

void DecodeLoop::Stop() {
  bool was_stopped;
  {
    absl::MutexLock lock(&mu_);
    was_stopped = std::exchange(stop_, true);
  }
  if (thread_.joinable()) {
    thread_.join();
  } else if (!options_.own_thread && !was_stopped) {
    Shutdown();  // The caller's thread drove it: it ends here.
  }
}

void DecodeLoop::FlushPrefixCache() {
  absl::MutexLock lock(&mu_);
  if (!stop_) inbox_.flush = true;
}

void DecodeLoop::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool DecodeLoop::WaitUntilIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return held_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

LoopStats DecodeLoop::Stats() const {
  absl::MutexLock lock(&mu_);
  LoopStats s = stats_;
  // What Submit decides is current; the rest is as of the loop's last round.
  s.draining = draining_;
  s.requests_total = submitted_;
  s.requests_failed += refused_;
  return s;
}

bool DecodeLoop::RunRound() {
  CHECK(!options_.own_thread) << "RunRound drives a loop made without its own thread";
  return Round().value_or(false);
}

std::optional<bool> DecodeLoop::Round() {
  Inbox commands;
  if (!TakeCommands(commands)) return std::nullopt;
  for (SubmitCmd& s : commands.submits) Enqueue(std::move(s));
  for (StartCmd& s : commands.starts) HandleStart(std::move(s));
  for (Ticket t : commands.cancels) HandleCancel(t);
  if (commands.flush) engine_->block_pool().Flush();
  receiver_->Poll();
  PollLandings();
  ExpireDeadlines();
  // The running sequences take their next blocks before waiting ones are
  // admitted into what is left.
  GrowRunning();
  AdmitWaiting();
  const bool stepped = StepOnce();
  PublishStats();
  return stepped;
}

void DecodeLoop::Run() {
  while (true) {
    const std::optional<bool> stepped = Round();
    if (!stepped.has_value()) break;
    if (*stepped) continue;
    const bool landing = landings_pending();
    if (!receiver_->idle()) {
      receiver_->WaitForActivity(absl::Now() + (landing ? kCopyPoll : kTransportWait));
    } else {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !inbox_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&wake), landing ? kCopyPoll : kIdleWait);
    }
  }
  Shutdown();
}

bool DecodeLoop::TakeCommands(Inbox& commands) {
  absl::MutexLock lock(&mu_);
  if (stop_) return false;
  std::swap(commands, inbox_);
  return true;
}

void DecodeLoop::ExpireDeadlines() {
  const absl::Time now = clock_->Now();
  std::vector<Sequence*> expired;
  for (auto& [ticket, seq] : sequences_) {
    if (seq->ended()) continue;
    // An open lease expires in the receiver (which tells the sender); a
    // complete one still needs its Start by the lease deadline.
    const bool reservation_expired = seq->state == Sequence::State::kKvReady &&
                                     !seq->first_tokens.has_value() && now >= seq->lease_deadline;
    if (reservation_expired || now >= seq->request.deadline) expired.push_back(seq.get());
  }
  for (Sequence* seq : expired) {
    if (now >= seq->request.deadline) {
      Fail(*seq, absl::DeadlineExceededError(
                     absl::StrCat("request '", seq->request.request_id, "': deadline exceeded")));
    } else {
      Fail(*seq,
           absl::DeadlineExceededError(absl::StrCat(
               "request '", seq->request.request_id, "': no Start arrived within the KV timeout (",
               absl::FormatDuration(options_.kv_timeout), ")")));
    }
  }
}

void DecodeLoop::Fail(Sequence& seq, const absl::Status& status, bool lease_ended) {
  if (seq.ended()) return;
  by_request_id_.erase(seq.request.request_id);
  if (!absl::IsCancelled(status)) ++failed_;
  if (seq.start_done) std::exchange(seq.start_done, nullptr)(status);
  seq.sink->OnFailed(status);
  if (seq.landing.has_value()) {
    // The copy out of the staging still writes into the blocks: they go
    // once it has finished (PollLandings).
    seq.MoveTo(Sequence::State::kCancelling);
    return;
  }
  if (seq.lease_open() && !lease_ended) {
    // The blocks go when the receiver's done callback runs (OnLeaseDone).
    seq.MoveTo(Sequence::State::kCancelling);
    (void)receiver_->Cancel(seq.ticket);
    return;
  }
  seq.MoveTo(Sequence::State::kEnded);
  Remove(seq);
}

bool DecodeLoop::Finish(Sequence& seq, Choice& choice, FinishReason reason) {
  choice.finished = true;
  choice.running = false;
  const bool last = seq.unfinished() == 0;
  if (last) {
    seq.MoveTo(Sequence::State::kEnded);
    by_request_id_.erase(seq.request.request_id);
  }
  Finished f;
  f.index = choice.index;
  f.last = last;
  f.reason = reason;
  f.completion_tokens = choice.generated;
  f.decode_queue = seq.decode_queue;
  f.prefill = seq.prefill;
  f.kv_wait = seq.kv_wait;
  f.cached_tokens = seq.cached_tokens;
  seq.sink->OnFinished(f);
  if (last) {
    Remove(seq);
  } else {
    // Its blocks are no longer read or written; the other choices run on.
    ReleaseChoice(choice);
  }
  return last;
}

void DecodeLoop::Remove(Sequence& seq) {
  CHECK(seq.state == Sequence::State::kEnded && !seq.landing.has_value());
  for (Choice& choice : seq.choices) ReleaseChoice(choice);
  if (staging_ != nullptr) staging_->Free(seq.staging);
  const int n = seq.request.n;
  sequences_.erase(seq.ticket);  // Destroys `seq`.
  absl::MutexLock lock(&mu_);
  held_ -= n;
}

void DecodeLoop::ReleaseChoice(Choice& choice) {
  CacheWrittenBlocks(choice);
  engine_->Release(choice.table);
}

void DecodeLoop::CacheWrittenBlocks(Choice& choice) {
  if (!options_.prefix_cache) return;
  // Only whole blocks whose every slot holds K/V: the last sampled token's
  // K/V is never written, and a block still being filled is not registered.
  const int block_size = choice.table.block_size();
  const int full = choice.table.num_tokens() / block_size;
  ExtendBlockHashes(salt_, choice.tokens, block_size, full, choice.hashes);
  BlockPool& pool = engine_->block_pool();
  const std::span<const int32_t> blocks = choice.table.blocks();
  const int n = std::min(full, static_cast<int>(choice.hashes.size()));
  // A block whose hash another block holds (a copy of the same prefix)
  // stays uncached.
  for (int i = 0; i < n; ++i) pool.SetCached(blocks[i], choice.hashes[i]);
}

void DecodeLoop::Shutdown() {
  Inbox unhandled;
  {
    absl::MutexLock lock(&mu_);
    std::swap(unhandled, inbox_);
  }
  const absl::Status down = absl::UnavailableError("decode worker is shutting down");
  for (SubmitCmd& s : unhandled.submits) {
    s.sink->OnFailed(down);
    absl::MutexLock lock(&mu_);
    held_ -= s.request.n;
  }
  for (StartCmd& s : unhandled.starts) s.done(down);
  std::vector<Sequence*> live;
  for (auto& [ticket, seq] : sequences_) live.push_back(seq.get());
  for (Sequence* seq : live) Fail(*seq, down);
  const absl::Time deadline = absl::Now() + kShutdownGrace;
  while (!receiver_->idle() && absl::Now() < deadline) {
    receiver_->Poll();
    if (!receiver_->idle()) receiver_->WaitForActivity(absl::Now() + kTransportWait);
  }
  // Copies out of the staging take a moment; the blocks wait for them.
  while (landings_pending() && absl::Now() < deadline) {
    PollLandings();
    if (landings_pending()) absl::SleepFor(kCopyPoll);
  }
  if (landings_pending()) {
    LOG(ERROR) << "decode loop: KV copies out of the staging did not finish by shutdown";
  }
  PublishStats();
}

void DecodeLoop::PublishStats() {
  LoopStats s;
  s.model = options_.model_name;
  s.weights_fingerprint = options_.weights_fingerprint;
  s.kv_dtype = std::string(DTypeName(engine_->kv_layout().dtype));
  s.vocab_size = config_.vocab_size;
  s.max_context = config_.seq_len;
  s.block_size = engine_->kv_layout().block_size;
  s.kv_blocks_total = engine_->block_pool().num_blocks();
  s.kv_blocks_free = engine_->block_pool().num_free();
  s.kv_blocks_cached = engine_->block_pool().num_cached();
  s.prefix_cache_evicted_blocks = engine_->block_pool().evictions();
  cache_events_.CatchUp(engine_->block_pool().events());
  AddEngineStats(*engine_, s);
  s.prefix_cache_queried_tokens = cache_queried_tokens_;
  s.prefix_cache_hit_tokens = cache_hit_tokens_;
  s.preemptions = preemptions_;
  for (const auto& [ticket, seq] : sequences_) {
    if (seq->ended()) continue;
    for (const Choice& choice : seq->choices) {
      if (choice.running) {
        ++s.running;
      } else if (!choice.finished) {
        ++s.waiting;
      }
    }
  }
  const kvtransfer::ReceiverStats& rx = receiver_->stats();
  s.kv_transfers = rx.completed;
  s.kv_transfer_bytes = rx.accepted_bytes;
  s.kv_transfers_failed = rx.failed - rx.cancelled;
  s.requests_failed = failed_;  // Stats() adds the refusals.
  absl::MutexLock lock(&mu_);
  // Queued, not yet admitted by the loop, counts as waiting.
  for (const SubmitCmd& cmd : inbox_.submits) s.waiting += cmd.request.n;
  if (options_.metrics != nullptr) options_.metrics->Publish(s);
  stats_ = std::move(s);
}

}  // namespace tandem::decode
