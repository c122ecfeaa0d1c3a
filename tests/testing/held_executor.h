// HeldExecutor: an Executor whose posted tasks wait until the test runs
// them, so that a test can hold work "in progress" on another thread (a
// grammar being compiled, say) and look at the system meanwhile.
// Thread-safe.
#ifndef TANDEM_TESTS_TESTING_HELD_EXECUTOR_H_
#define TANDEM_TESTS_TESTING_HELD_EXECUTOR_H_

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/executor.h"

namespace tandem::testing {

class HeldExecutor final : public Executor {
 public:
  void Post(std::function<void()> task) override {
    absl::MutexLock lock(&mu_);
    held_.push_back(std::move(task));
    ++posted_;
  }
  // Timers are not held: nothing under test here sets one.
  TimerId PostAt(absl::Time, std::function<void()>) override { return 0; }
  bool CancelTimer(TimerId) override { return false; }
  const Clock& clock() const override { return Clock::Real(); }

  // True once `n` tasks have been posted in all; false after `timeout`.
  bool AwaitPosted(size_t n, absl::Duration timeout = absl::Seconds(60)) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return posted_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  // Runs every task held (and those they post), on this thread; how many.
  int RunHeld() {
    int ran = 0;
    for (;;) {
      std::vector<std::function<void()>> tasks;
      {
        absl::MutexLock lock(&mu_);
        tasks.swap(held_);
      }
      if (tasks.empty()) return ran;
      for (std::function<void()>& task : tasks) task();
      ran += static_cast<int>(tasks.size());
    }
  }

 private:
  absl::Mutex mu_;
  std::vector<std::function<void()>> held_ ABSL_GUARDED_BY(mu_);
  size_t posted_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TESTING_HELD_EXECUTOR_H_
