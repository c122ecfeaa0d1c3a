// Where asynchronous work runs. The router's request state machines post
// their steps and timers to an Executor rather than start threads or read
// the wall clock, so that the same code runs on a thread pool in a server
// and, in a test or a simulator, one task at a time on one thread, on a
// fake clock (ManualExecutor).
//
// A task never runs on the stack of the Post or PostAt that queued it.
// Tasks may post further tasks.
#ifndef TANDEM_COMMON_BASE_EXECUTOR_H_
#define TANDEM_COMMON_BASE_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"

namespace tandem {

class Executor {
 public:
  // Names a timer for CancelTimer; 0 is never one.
  using TimerId = uint64_t;

  virtual ~Executor() = default;

  // Runs `task` soon.
  virtual void Post(std::function<void()> task) = 0;
  // Runs `task` once the executor's clock reads `when` or later.
  virtual TimerId PostAt(absl::Time when, std::function<void()> task) = 0;
  // The timer's task will not run, and is destroyed (on this thread, or on
  // the executor's). False when it has run, is running, or was cancelled.
  virtual bool CancelTimer(TimerId timer) = 0;
  // The clock PostAt's times are read on.
  virtual const Clock& clock() const = 0;
};

// A fixed set of threads for Post, and one more for the timers, which
// waits in real time for what is left on the clock (at most a second at a
// time, so that a FakeClock moved by hand is noticed). Thread-safe. The
// destructor runs the tasks already posted, drops the timers not yet due,
// and joins the threads; destroy it before anything its tasks use.
class ThreadPoolExecutor final : public Executor {
 public:
  ThreadPoolExecutor(int threads, const Clock* clock = &Clock::Real());
  ~ThreadPoolExecutor() override;

  void Post(std::function<void()> task) override;
  TimerId PostAt(absl::Time when, std::function<void()> task) override;
  bool CancelTimer(TimerId timer) override;
  const Clock& clock() const override { return *clock_; }

 private:
  void WorkLoop();
  void TimerLoop();

  const Clock* const clock_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  // (when, id) -> task.
  std::map<std::pair<absl::Time, TimerId>, std::function<void()>> timers_ ABSL_GUARDED_BY(mu_);
  std::map<TimerId, absl::Time> timer_times_ ABSL_GUARDED_BY(mu_);
  TimerId next_timer_ ABSL_GUARDED_BY(mu_) = 1;
  // Bumped when the earliest timer may have moved (wakes the timer thread).
  uint64_t timers_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_;
  std::thread timer_thread_;
};

// Runs nothing by itself: the caller runs the tasks, in the order of their
// times (a Post is due now), ties in the order they were queued, moving the
// FakeClock it owns forward to each task's time. The discrete-event loop of
// a simulation and single-threaded tests drive it. Thread-compatible.
class ManualExecutor final : public Executor {
 public:
  explicit ManualExecutor(FakeClock* clock) : clock_(clock) {}

  void Post(std::function<void()> task) override;
  TimerId PostAt(absl::Time when, std::function<void()> task) override;
  bool CancelTimer(TimerId timer) override;
  const Clock& clock() const override { return *clock_; }

  // Runs every task due by the clock's time now (those they post too, when
  // due); how many ran.
  int RunDue();
  // The time of the earliest task queued; InfiniteFuture when none is.
  absl::Time next_time() const;
  // Moves the clock to `when` (never back), running the tasks due on the
  // way at their own times; how many ran.
  int RunUntil(absl::Time when);
  size_t pending() const { return tasks_.size(); }

 private:
  FakeClock* const clock_;
  std::map<std::pair<absl::Time, TimerId>, std::function<void()>> tasks_;
  std::map<TimerId, absl::Time> times_;
  TimerId next_ = 1;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_EXECUTOR_H_
