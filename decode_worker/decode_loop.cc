#include "decode_worker/decode_loop.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/worker/worker_health.h"

namespace tandem::decode {

namespace {

// How long the loop sleeps on its inbox with nothing to do (bounded, so
// that reservation deadlines are noticed); on the transport it sleeps
// DecodeCore::kTransportWait, or kCopyPoll while copies are in flight.
constexpr absl::Duration kIdleWait = absl::Milliseconds(10);
constexpr absl::Duration kTransportWait = DecodeCore::kTransportWait;
constexpr absl::Duration kCopyPoll = DecodeCore::kCopyPoll;

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeLoop>> DecodeLoop::Create(const ModelWeights& weights,
                                                               std::unique_ptr<Backend> backend,
                                                               kvtransfer::KvTransport* transport,
                                                               DecodeLoopOptions options) {
  const Clock* const clock = options.clock != nullptr ? options.clock : &Clock::Real();
  std::unique_ptr<DecodeLoop> loop(new DecodeLoop(clock));
  ASSIGN_OR_RETURN(loop->core_,
                   DecodeCore::Create(weights, std::move(backend), transport, std::move(options),
                                      [l = loop.get()](int n) { l->Released(n); }));
  loop->PublishStats();
  if (loop->core_->options().own_thread)
    loop->thread_ = std::thread([l = loop.get()] { l->Run(); });
  return loop;
}

DecodeLoop::~DecodeLoop() {
  Stop();
  // Before the members its callbacks reach (Released takes mu_).
  core_.reset();
}

absl::StatusOr<DecodeLoop::Ticket> DecodeLoop::Submit(Request request,
                                                      std::shared_ptr<EventSink> sink) {
  const absl::Status valid = core_->Validate(request);
  absl::MutexLock lock(&mu_);
  ++submitted_;
  absl::Status refusal = valid;
  if (refusal.ok() && (stop_ || draining_)) {
    refusal =
        absl::UnavailableError(stop_ ? "decode worker is shutting down" : "worker is draining");
  }
  if (refusal.ok()) refusal = EngineRefusal(core_->engine(), "decode worker");
  const DecodeLoopOptions& options = core_->options();
  if (refusal.ok() && request.n > options.max_sequences) {
    // Never admitted, however long it waited.
    refusal = absl::InvalidArgumentError(absl::StrCat(
        "the request asks for ", request.n, " choices; this decode worker holds at most ",
        options.max_sequences, " sequences (--max_sequences): lower n"));
  }
  if (refusal.ok() && held_ + request.n > options.max_sequences) {
    refusal = absl::ResourceExhaustedError(
        absl::StrCat("decode worker holds ", held_, " sequences; the request's ", request.n,
                     " choices would exceed its maximum of ", options.max_sequences,
                     "; retry later or on another worker"));
  }
  if (!refusal.ok()) {
    ++refused_;
    if (options.metrics != nullptr) options.metrics->OnRefused(refusal);
    return refusal;
  }
  if (options.metrics != nullptr) sink = options.metrics->Wrap(std::move(sink));
  const Ticket ticket = next_ticket_++;
  if (request.request_id.empty()) request.request_id = absl::StrCat("local-", ticket);
  held_ += request.n;
  inbox_.submits.push_back(Submission{ticket, std::move(request), std::move(sink), clock_->Now()});
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
      inbox_.starts.push_back(StartCommand{std::move(request_id), generation,
                                           std::move(first_tokens), std::move(sampler_draws),
                                           std::move(done), clock_->Now()});
      return;
    }
  }
  done(absl::UnavailableError("decode worker is shutting down"));
}

void DecodeLoop::Handoff(std::string request_id, std::string kv_descriptor,
                         std::vector<int32_t> tokens, HandoffDoneFn done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      inbox_.handoffs.push_back(HandoffCommand{std::move(request_id), std::move(kv_descriptor),
                                               std::move(tokens), std::move(done), clock_->Now()});
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
  } else if (core_ != nullptr && !core_->options().own_thread && !was_stopped) {
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
  if (!stop_) inbox_.drain = true;
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
  // The engine's failure is current too: a client that saw its request fail
  // on it must find the cause here, not the round before's stats.
  s.engine_error = std::string(core_->engine().status().message());
  return s;
}

bool DecodeLoop::RunRound() {
  CHECK(!core_->options().own_thread) << "RunRound drives a loop made without its own thread";
  return Round().value_or(false);
}

std::optional<bool> DecodeLoop::Round() {
  Inbox commands;
  if (!TakeCommands(commands)) return std::nullopt;
  for (Submission& s : commands.submits) core_->Submit(std::move(s));
  for (StartCommand& s : commands.starts) core_->Start(std::move(s));
  for (HandoffCommand& h : commands.handoffs) core_->Handoff(std::move(h));
  for (Ticket t : commands.cancels) core_->Cancel(t);
  if (commands.flush) core_->FlushPrefixCache();
  if (commands.drain) core_->Drain();
  const bool stepped = core_->RunRound();
  PublishStats();
  return stepped;
}

void DecodeLoop::Run() {
  while (true) {
    const std::optional<bool> stepped = Round();
    if (!stepped.has_value()) break;
    if (*stepped) continue;
    // Finished copies and sends wake nothing: they are polled for.
    const bool landing = core_->landings_pending() || core_->sends_pending();
    if (!core_->receiver_idle()) {
      core_->WaitForTransport(absl::Now() + (landing ? kCopyPoll : kTransportWait));
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

void DecodeLoop::Shutdown() {
  Inbox unhandled;
  {
    absl::MutexLock lock(&mu_);
    std::swap(unhandled, inbox_);
  }
  const absl::Status down = absl::UnavailableError("decode worker is shutting down");
  for (Submission& s : unhandled.submits) {
    s.sink->OnFailed(down);
    Released(s.request.n);
  }
  for (StartCommand& s : unhandled.starts) s.done(down);
  for (HandoffCommand& h : unhandled.handoffs) h.done(down);
  core_->Shutdown(down);
  PublishStats();
}

void DecodeLoop::PublishStats() {
  LoopStats s = core_->Snapshot();
  cache_events_.CatchUp(core_->engine().block_pool().events());
  absl::MutexLock lock(&mu_);
  // Queued, not yet admitted by the loop, counts as waiting.
  for (const Submission& cmd : inbox_.submits) s.waiting += cmd.request.n;
  DecodeMetrics* const metrics = core_->options().metrics;
  if (metrics != nullptr) {
    metrics->Publish(s);
    metrics->PublishExpertLoad(core_->engine().expert_load());
  }
  stats_ = std::move(s);
}

void DecodeLoop::Released(int n) {
  absl::MutexLock lock(&mu_);
  held_ -= n;
}

}  // namespace tandem::decode
