#include "common/base/executor.h"

#include <algorithm>

namespace tandem {

// ---------------------------------------------------------------------------
// ThreadPoolExecutor

ThreadPoolExecutor::ThreadPoolExecutor(int threads, const Clock* clock) : clock_(clock) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    threads_.emplace_back([this] { WorkLoop(); });
  }
  timer_thread_ = std::thread([this] { TimerLoop(); });
}

ThreadPoolExecutor::~ThreadPoolExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  timer_thread_.join();
  for (std::thread& t : threads_) t.join();
  // Dropped outside the lock: a task's captures may post (and are refused).
  std::map<std::pair<absl::Time, TimerId>, std::function<void()>> dropped;
  {
    absl::MutexLock lock(&mu_);
    dropped.swap(timers_);
    timer_times_.clear();
  }
}

void ThreadPoolExecutor::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

Executor::TimerId ThreadPoolExecutor::PostAt(absl::Time when, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  const TimerId id = next_timer_++;
  // The timer thread needs waking only when the new timer comes first; most
  // (request timeouts) come after others and are cancelled before they are
  // due, and cost no wake-up at all.
  if (timers_.empty() || when < timers_.begin()->first.first) ++timers_version_;
  timers_.emplace(std::make_pair(when, id), std::move(task));
  timer_times_.emplace(id, when);
  return id;
}

bool ThreadPoolExecutor::CancelTimer(TimerId timer) {
  std::function<void()> dropped;
  absl::MutexLock lock(&mu_);
  auto it = timer_times_.find(timer);
  if (it == timer_times_.end()) return false;
  auto task = timers_.find(std::make_pair(it->second, timer));
  dropped = std::move(task->second);
  timers_.erase(task);
  timer_times_.erase(it);
  // No wake-up: the timer thread finds nothing due when it wakes for this
  // one, and waits for the next.
  // `dropped` goes after the lock is released (declared before the lock).
  return true;
}

void ThreadPoolExecutor::WorkLoop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); };
      mu_.Await(absl::Condition(&ready));
      // Posted tasks run even while stopping: they are often what ends a
      // request (a sink's OnDone).
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void ThreadPoolExecutor::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time now = clock_->Now();
    if (!timers_.empty() && timers_.begin()->first.first <= now) {
      auto first = timers_.begin();
      timer_times_.erase(first->first.second);
      tasks_.push_back(std::move(first->second));
      timers_.erase(first);
      continue;
    }
    const uint64_t seen = timers_version_;
    const absl::Duration left =
        timers_.empty() ? absl::Seconds(1) : timers_.begin()->first.first - now;
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || timers_version_ != seen;
    };
    mu_.AwaitWithTimeout(absl::Condition(&changed),
                         std::clamp(left, absl::ZeroDuration(), absl::Seconds(1)));
  }
}

// ---------------------------------------------------------------------------
// ManualExecutor

void ManualExecutor::Post(std::function<void()> task) { PostAt(clock_->Now(), std::move(task)); }

Executor::TimerId ManualExecutor::PostAt(absl::Time when, std::function<void()> task) {
  const TimerId id = next_++;
  tasks_.emplace(std::make_pair(when, id), std::move(task));
  times_.emplace(id, when);
  return id;
}

bool ManualExecutor::CancelTimer(TimerId timer) {
  auto it = times_.find(timer);
  if (it == times_.end()) return false;
  tasks_.erase(std::make_pair(it->second, timer));
  times_.erase(it);
  return true;
}

absl::Time ManualExecutor::next_time() const {
  return tasks_.empty() ? absl::InfiniteFuture() : tasks_.begin()->first.first;
}

int ManualExecutor::RunDue() { return RunUntil(clock_->Now()); }

int ManualExecutor::RunUntil(absl::Time when) {
  int ran = 0;
  while (!tasks_.empty() && tasks_.begin()->first.first <= when) {
    auto first = tasks_.begin();
    const absl::Time at = first->first.first;
    std::function<void()> task = std::move(first->second);
    times_.erase(first->first.second);
    tasks_.erase(first);
    if (at > clock_->Now()) clock_->Set(at);
    task();
    ++ran;
  }
  if (when > clock_->Now() && when != absl::InfiniteFuture()) clock_->Set(when);
  return ran;
}

}  // namespace tandem
