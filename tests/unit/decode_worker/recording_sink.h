// Test helpers that record what a decode loop tells a request: a sink of
// its events and the answer to a Start, plus bounded waiting.
#ifndef TANDEM_TESTS_UNIT_DECODE_WORKER_RECORDING_SINK_H_
#define TANDEM_TESTS_UNIT_DECODE_WORKER_RECORDING_SINK_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/engine/logprobs.h"
#include "decode_worker/decode_types.h"

namespace tandem::decode::testing {

// Long enough for a loaded machine, short enough that a hang fails fast.
inline constexpr absl::Duration kWait = absl::Seconds(30);

// Polls `pred` until it holds or `timeout` passes.
template <typename Pred>
bool WaitFor(Pred pred, absl::Duration timeout = kWait) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!pred()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Records one request's events, per choice. Thread-safe.
class RecordingSink final : public EventSink {
 public:
  void OnReserved(const Reservation& reservation) override {
    absl::MutexLock lock(&mu_);
    ++reserved_count_;
    descriptor_ = reservation.kv_descriptor;
    generation_ = reservation.generation;
    cached_tokens_ = reservation.cached_tokens;
  }
  void OnPromptLogprobs(std::span<const TokenLogprob> logprobs) override {
    absl::MutexLock lock(&mu_);
    if (ended() || !tokens_.empty()) ++events_out_of_order_;
    prompt_logprobs_.emplace(logprobs.begin(), logprobs.end());
  }
  void OnTokens(int index, std::span<const int32_t> ids,
                std::span<const TokenLogprob> logprobs) override {
    absl::MutexLock lock(&mu_);
    if (ended() || finished_.contains(index)) ++events_out_of_order_;
    std::vector<int32_t>& t = tokens_[index];
    t.insert(t.end(), ids.begin(), ids.end());
    std::vector<TokenLogprob>& l = logprobs_[index];
    l.insert(l.end(), logprobs.begin(), logprobs.end());
  }
  void OnFinished(const Finished& finished) override {
    absl::MutexLock lock(&mu_);
    if (ended() || finished_.contains(finished.index)) ++events_out_of_order_;
    finished_[finished.index] = finished;
    if (finished.last) last_finished_ = true;
  }
  void OnMoving(bool ships_kv) override {
    absl::MutexLock lock(&mu_);
    ships_kv_ = ships_kv;
    if (ended() || moving_ > 0) ++events_out_of_order_;
    ++moving_;
    tokens_at_moving_ = tokens_;
  }
  void OnFailed(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    if (ended()) ++events_out_of_order_;
    failed_ = status;
  }
  // OnMoving came (or the request ended).
  bool WaitMoving(absl::Duration timeout = kWait) {
    absl::MutexLock lock(&mu_);
    auto cond = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return moving_ > 0 || ended(); };
    return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout) && moving_ > 0;
  }
  bool ships_kv() const {
    absl::MutexLock lock(&mu_);
    return ships_kv_;
  }
  int moving_count() const {
    absl::MutexLock lock(&mu_);
    return moving_;
  }
  // Choice `index`'s tokens when OnMoving came.
  std::vector<int32_t> tokens_at_moving(int index = 0) const {
    absl::MutexLock lock(&mu_);
    auto it = tokens_at_moving_.find(index);
    return it == tokens_at_moving_.end() ? std::vector<int32_t>() : it->second;
  }

  bool WaitReserved(absl::Duration timeout = kWait) {
    absl::MutexLock lock(&mu_);
    auto cond = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return reserved_count_ > 0 || ended(); };
    return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout) && reserved_count_ > 0;
  }
  bool WaitEnded(absl::Duration timeout = kWait) {
    absl::MutexLock lock(&mu_);
    auto cond = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return ended(); };
    return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout);
  }
  // Choice 0's tokens.
  bool WaitTokens(size_t n, absl::Duration timeout = kWait) {
    absl::MutexLock lock(&mu_);
    auto cond = [this, n]()
                    ABSL_SHARED_LOCKS_REQUIRED(mu_) { return tokens_[0].size() >= n || ended(); };
    return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout) && tokens_[0].size() >= n;
  }

  std::string descriptor() const {
    absl::MutexLock lock(&mu_);
    return descriptor_;
  }
  uint64_t generation() const {
    absl::MutexLock lock(&mu_);
    return generation_;
  }
  // The reservation's prompt tokens held in the prefix cache.
  int cached_tokens() const {
    absl::MutexLock lock(&mu_);
    return cached_tokens_;
  }
  int reserved_count() const {
    absl::MutexLock lock(&mu_);
    return reserved_count_;
  }
  std::vector<int32_t> tokens(int index = 0) const {
    absl::MutexLock lock(&mu_);
    auto it = tokens_.find(index);
    return it == tokens_.end() ? std::vector<int32_t>() : it->second;
  }
  std::vector<TokenLogprob> logprobs(int index = 0) const {
    absl::MutexLock lock(&mu_);
    auto it = logprobs_.find(index);
    return it == logprobs_.end() ? std::vector<TokenLogprob>() : it->second;
  }
  std::optional<std::vector<TokenLogprob>> prompt_logprobs() const {
    absl::MutexLock lock(&mu_);
    return prompt_logprobs_;
  }
  std::optional<Finished> finished(int index = 0) const {
    absl::MutexLock lock(&mu_);
    auto it = finished_.find(index);
    if (it == finished_.end()) return std::nullopt;
    return it->second;
  }
  int finished_count() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(finished_.size());
  }
  // OK while running or after the last OnFinished.
  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    return failed_.value_or(absl::OkStatus());
  }
  // Events after the end, tokens of a finished choice, prompt logprobs
  // after a token: none may happen.
  int events_after_end() const {
    absl::MutexLock lock(&mu_);
    return events_out_of_order_;
  }

 private:
  bool ended() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return last_finished_ || failed_.has_value();
  }

  mutable absl::Mutex mu_;
  int reserved_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::string descriptor_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, std::vector<int32_t>> tokens_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::vector<TokenLogprob>> logprobs_ ABSL_GUARDED_BY(mu_);
  std::optional<std::vector<TokenLogprob>> prompt_logprobs_ ABSL_GUARDED_BY(mu_);
  std::map<int, Finished> finished_ ABSL_GUARDED_BY(mu_);
  bool last_finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  int events_out_of_order_ ABSL_GUARDED_BY(mu_) = 0;
  int moving_ ABSL_GUARDED_BY(mu_) = 0;
  bool ships_kv_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int, std::vector<int32_t>> tokens_at_moving_ ABSL_GUARDED_BY(mu_);
};

inline std::shared_ptr<RecordingSink> NewSink() { return std::make_shared<RecordingSink>(); }

// Collects the answer to a DecodeLoop::Start. The callback shares its
// state, so it stays safe to run after the test gave up on it.
class StartResult {
 public:
  StartDoneFn Callback() {
    return [state = state_](absl::Status s) {
      absl::MutexLock lock(&state->mu);
      state->status = std::move(s);
    };
  }
  // The answer, or DEADLINE_EXCEEDED from the test when none came in time.
  absl::Status Wait(absl::Duration timeout = kWait) {
    absl::MutexLock lock(&state_->mu);
    State* s = state_.get();
    auto cond = [s]() ABSL_SHARED_LOCKS_REQUIRED(s->mu) { return s->status.has_value(); };
    if (!state_->mu.AwaitWithTimeout(absl::Condition(&cond), timeout)) {
      return absl::DeadlineExceededError("test: no answer to Start");
    }
    return *state_->status;
  }
  bool answered() const {
    absl::MutexLock lock(&state_->mu);
    return state_->status.has_value();
  }

 private:
  struct State {
    absl::Mutex mu;
    std::optional<absl::Status> status ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace tandem::decode::testing

#endif  // TANDEM_TESTS_UNIT_DECODE_WORKER_RECORDING_SINK_H_
