#include "tools/bench/runner.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>

#include "absl/strings/str_format.h"
#include "tools/bench/arrivals.h"

namespace tandem::bench {
namespace {

class SteadyClock final : public RunClock {
 public:
  using Steady = std::chrono::steady_clock;
  double Now() override {
    return std::chrono::duration<double>(Steady::now().time_since_epoch()).count();
  }
  void SleepUntil(double t) override {
    std::this_thread::sleep_until(Steady::time_point(
        std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(t))));
  }
};

// Threads that grow with demand: a new one only when no idle thread can
// take a job, so a sync stream per thread never waits for another.
class ElasticPool {
 public:
  ~ElasticPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  void Submit(std::function<void()> job) {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
    if (static_cast<int>(jobs_.size()) > idle_) {
      threads_.emplace_back([this] { Loop(); });
    } else {
      cv_.notify_one();
    }
  }

 private:
  void Loop() {
    std::unique_lock lock(mu_);
    while (true) {
      ++idle_;
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;  // stopping
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  bool stop_ = false;
};

// Prints progress until Stop(); a redrawn bar on a terminal, else a line
// every few seconds so logs stay short.
class Progress {
 public:
  Progress(const RunOptions& o, const std::atomic<int>& done, const std::atomic<int>& failed,
           RunClock& clock, double t0)
      : o_(o),
        done_(done),
        failed_(failed),
        clock_(clock),
        t0_(t0),
        tty_(isatty(STDERR_FILENO) == 1) {
    if (o.progress) thread_ = std::thread([this] { Loop(); });
  }
  void Stop(int sent) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      sent_ = sent;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    std::unique_lock lock(mu_);
    const auto period = std::chrono::milliseconds(tty_ ? 200 : 5000);
    while (!cv_.wait_for(lock, period, [this] { return stop_; })) Draw(false);
    Draw(true);
  }
  void Draw(bool last) {
    const int done = done_.load(), failed = failed_.load();
    const double t = clock_.Now() - t0_;
    double frac;
    std::string count;
    if (o_.duration_s > 0 && !last) {
      frac = std::min(1.0, t / o_.duration_s);
      count = absl::StrFormat("%d done", done);
    } else {
      const int total = last ? sent_ : o_.num_requests;
      frac = total > 0 ? static_cast<double>(done) / total : 1;
      count = absl::StrFormat("%d/%d", done, total);
    }
    const std::string line = absl::StrFormat("%s requests, %d failed, %.1fs", count, failed, t);
    if (tty_) {
      constexpr int kWidth = 30;
      const int fill = static_cast<int>(frac * kWidth);
      std::fprintf(stderr, "\r[%s%s] %3.0f%% %s", std::string(fill, '#').c_str(),
                   std::string(kWidth - fill, ' ').c_str(), frac * 100, line.c_str());
      if (last) std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "[tandem-bench] %s\n", line.c_str());
    }
    std::fflush(stderr);
  }
  const RunOptions& o_;
  const std::atomic<int>& done_;
  const std::atomic<int>& failed_;
  RunClock& clock_;
  const double t0_;
  bool tty_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int sent_ = 0;
  std::thread thread_;
};

// The longest max_tokens among the wave of requests starting at `first`.
int WaveMaxTokens(const Dataset& dataset, int first, const RunOptions& o) {
  int longest = 0;
  for (int j = first; j < first + o.max_concurrency; ++j) {
    if (o.duration_s <= 0 && j >= o.num_requests) break;
    longest = std::max(longest, dataset.Get(j).max_tokens);
  }
  return longest;
}

// Cuts a padded request's record to its first `own` tokens.
void KeepOwnTokens(RequestRecord& r, int own) {
  if (!r.success || own <= 0 || r.output_tokens <= own) return;
  if (static_cast<int>(r.itls.size()) == r.output_tokens - 1) {
    r.itls.resize(own - 1);
    r.e2e = r.ttft + std::accumulate(r.itls.begin(), r.itls.end(), 0.0);
  }
  r.output_tokens = own;
}

}  // namespace

absl::StatusOr<RunResult> RunBenchmark(Target& target, const Dataset& dataset,
                                       const RunOptions& o) {
  const bool unpaced = !(o.request_rate > 0) || std::isinf(o.request_rate);
  if (o.duration_s > 0 && unpaced && o.max_concurrency <= 0) {
    return absl::InvalidArgumentError(
        "--duration needs a --request_rate or a --max_concurrency to bound the load");
  }
  if (o.duration_s <= 0 && o.num_requests < 1) {
    return absl::InvalidArgumentError("give --num_requests >= 1 or a --duration");
  }
  if (o.burstiness <= 0) return absl::InvalidArgumentError("--burstiness must be > 0");
  if (o.waves && o.max_concurrency <= 0) {
    return absl::InvalidArgumentError("--waves needs a --max_concurrency (the wave size)");
  }
  if (o.pad_waves && !o.waves) {
    return absl::InvalidArgumentError("--pad_waves needs --waves (and a --max_concurrency)");
  }

  // A conversation's later turns (multi_turn) are sent by the stream that
  // sent its first, one after the other.
  const bool chats = dataset.Get(1).follows >= 0;
  if (chats && o.waves) {
    return absl::InvalidArgumentError(
        "--waves sends independent requests; a multi_turn dataset's turns follow each other");
  }

  ArrivalGenerator arrivals(o.request_rate, o.burstiness, o.seed);
  std::deque<RequestRecord> records;  // stable addresses while growing
  std::atomic<int> done{0}, failed{0};
  std::mutex mu;
  std::condition_variable slot_freed;
  int in_flight = 0;
  SteadyClock steady;
  RunClock& clock = o.clock != nullptr ? *o.clock : steady;
  const double t0 = clock.Now();
  auto since_start = [&] { return clock.Now() - t0; };
  auto new_record = [&] {
    std::lock_guard lock(mu);
    RequestRecord* record = &records.emplace_back();
    record->start = since_start();
    return record;
  };
  // Sends `request` into `record` (whose start is set).
  auto send = [&](RequestRecord* record, const BenchRequest& request, int own_tokens) {
    const double start = record->start;
    *record = target.Send(request);
    record->start = start;
    if (o.pad_waves) KeepOwnTokens(*record, own_tokens);
    if (!record->success) failed.fetch_add(1);
    done.fetch_add(1);
  };
  Progress progress(o, done, failed, clock, t0);
  {
    ElasticPool pool;
    double next = 0;
    int wave_tokens = 0;  // pad_waves: the current wave's longest max_tokens
    for (int i = 0;; ++i) {
      if (o.duration_s <= 0 && i >= o.num_requests) break;
      BenchRequest request = dataset.Get(i);
      if (request.follows >= 0) continue;  // Its conversation sends it.
      // A replayed log's own times, else the schedule's.
      if (request.arrival_s >= 0) {
        next = request.arrival_s;
      } else if (i > 0) {
        next += arrivals.NextGap();
      }
      if (o.duration_s > 0 && (next >= o.duration_s || since_start() >= o.duration_s)) break;
      clock.SleepUntil(t0 + next);
      if (o.max_concurrency > 0) {
        std::unique_lock lock(mu);
        // A wave starts only once the previous one has wholly ended.
        const bool wave_start = o.waves && i % o.max_concurrency == 0;
        slot_freed.wait(
            lock, [&] { return wave_start ? in_flight == 0 : in_flight < o.max_concurrency; });
        ++in_flight;
        // A slot may free long after the duration is over.
        if (o.duration_s > 0 && since_start() >= o.duration_s) break;
      }
      std::vector<BenchRequest> later;  // The conversation's later turns.
      for (int j = i + 1; chats && (o.duration_s > 0 || j < o.num_requests); ++j) {
        BenchRequest turn = dataset.Get(j);
        if (turn.follows != j - 1) break;
        later.push_back(std::move(turn));
      }
      RequestRecord* record = new_record();
      const int own_tokens = request.max_tokens;
      if (o.pad_waves) {
        if (i % o.max_concurrency == 0) wave_tokens = WaveMaxTokens(dataset, i, o);
        request.max_tokens = wave_tokens;
      }
      pool.Submit(
          [&, first = record, own_tokens, request = std::move(request), later = std::move(later)] {
            send(first, request, own_tokens);
            // A failed turn ends its conversation, as it would a user's.
            bool ok = first->success;
            for (size_t t = 0; t < later.size() && ok; ++t) {
              clock.SleepUntil(clock.Now() + later[t].think_s);
              if (o.duration_s > 0 && since_start() >= o.duration_s) break;
              RequestRecord* record = new_record();
              send(record, later[t], later[t].max_tokens);
              ok = record->success;
            }
            if (o.max_concurrency > 0) {
              std::lock_guard lock(mu);
              --in_flight;
              slot_freed.notify_one();
            }
          });
    }
  }  // the pool joins every stream
  const double duration = since_start();
  progress.Stop(static_cast<int>(records.size()));
  RunResult result;
  result.options = o;
  result.records.assign(records.begin(), records.end());
  result.metrics = ComputeMetrics(result.records, duration, o.slo);
  return result;
}

}  // namespace tandem::bench
