// Live rescaling under a steady load: the router takes its pools from
// file: targets, workers join by being started and listed, and leave by
// being unlisted and, once the router has let them go, sent SIGTERM (the
// order of a Kubernetes rollout with a preStop delay). No request may
// fail, a leaving worker must drain and exit 0, and a new worker must be
// routed to soon after it is ready.
#include <signal.h>

#include <atomic>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster_harness.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem::testing {
namespace {

// Generous for a 2-core machine that other jobs keep busy.
constexpr absl::Duration kDeadline = absl::Seconds(30);
// The router re-reads the files and polls the workers this often.
constexpr char kInterval[] = "200ms";
// From a worker's readiness to the end of the first request routed to it:
// a re-read, a poll and the pool check, then one short request.
constexpr absl::Duration kJoinBound = absl::Seconds(2);

// What one request of the load saw.
struct Record {
  absl::Time start;
  absl::Time end;
  grpc::Status status;
  std::string prefill_worker;
  std::string decode_worker;
};

// Client threads issuing short requests back to back until Stop().
class SteadyLoad {
 public:
  SteadyLoad(v1::Router::Stub& router, int clients) : router_(router) {
    for (int i = 0; i < clients; ++i) {
      threads_.emplace_back([this, i] { Run(i); });
    }
  }

  // `n` more requests, each generating `tokens` tokens (EOS ignored), on
  // threads of their own; Stop() waits for them too.
  void StartLong(int n, int tokens) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this, i, tokens] {
        v1::GenerateRequest request = TextRequest(absl::StrCat("long ", i, ": once upon"), tokens);
        request.set_ignore_eos(true);
        Send(request);
      });
    }
  }
  ~SteadyLoad() { Stop(); }

  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  std::vector<Record> records() const {
    absl::MutexLock lock(&mu_);
    return records_;
  }

  // Waits up to kDeadline for the first request served by `address` (as
  // its prefill or decode worker).
  std::optional<Record> FirstOn(const std::string& address) const {
    absl::MutexLock lock(&mu_);
    std::optional<Record> found;
    auto served = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const Record& r : records_) {
        if (r.prefill_worker == address || r.decode_worker == address) {
          found = r;
          return true;
        }
      }
      return false;
    };
    mu_.AwaitWithTimeout(absl::Condition(&served), kDeadline);
    return found;
  }

  // Waits up to kDeadline until `n` requests that started after `since`
  // have ended.
  bool WaitForRequestsSince(absl::Time since, int n) const {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      int count = 0;
      for (const Record& r : records_) count += r.start > since ? 1 : 0;
      return count >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kDeadline);
  }

 private:
  void Run(int client) {
    for (int n = 0; !stop_; ++n) {
      // Prompts differ from their first token: no worker holds another's
      // prefix, so routing follows load alone.
      Send(TextRequest(
          absl::StrCat(n, " and ", client, ": once upon a time there was a girl who liked to play"),
          8));
    }
  }

  void Send(const v1::GenerateRequest& request) {
    Record r;
    r.start = absl::Now();
    const Completion c = RunGenerate(router_, request, kDeadline);
    r.end = absl::Now();
    r.status = c.status;
    r.prefill_worker = c.finished.prefill_worker();
    r.decode_worker = c.finished.decode_worker();
    absl::MutexLock lock(&mu_);
    records_.push_back(std::move(r));
  }

  v1::Router::Stub& router_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  mutable absl::Mutex mu_;
  std::vector<Record> records_ ABSL_GUARDED_BY(mu_);
};

TEST(RescaleTest, PoolsGrowAndShrinkUnderSteadyLoadWithoutAFailedRequest) {
  TANDEM_MODEL_FILE_OR_SKIP(model, "stories260K.bin");
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer, "tok512.bin");
  absl::StatusOr<std::unique_ptr<Cluster>> started = Cluster::Start({
      .prefill = 1,
      .decode = 1,
      .model = model,
      .tokenizer = tokenizer,
      .router_flags = {absl::StrCat("--resolve_interval=", kInterval),
                       absl::StrCat("--health_interval=", kInterval)},
      .prefill_flags = {"--drain_timeout=60s"},
      .decode_flags = {"--drain_timeout=60s"},
      .target_files = true,
  });
  ASSERT_OK(started.status());
  Cluster& cluster = **started;

  constexpr int kClients = 3;
  SteadyLoad load(cluster.router(), kClients);
  ASSERT_TRUE(load.WaitForRequestsSince(absl::InfinitePast(), 2 * kClients)) << cluster.Logs();

  // Each new worker is listed as soon as it is ready; requests must reach
  // it within kJoinBound.
  std::map<std::string, absl::Duration> join_times;
  auto expect_traffic_soon = [&](const Member& m) {
    const std::optional<Record> first = load.FirstOn(m.address);
    ASSERT_TRUE(first.has_value()) << m.name << " got no request\n" << cluster.Logs();
    join_times[m.name] = first->end - m.ready_at;
    EXPECT_LE(first->end - m.ready_at, kJoinBound) << m.name << "\n" << cluster.Logs();
  };
  // Decode 1 -> 3.
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK_AND_ASSIGN(Member * added, cluster.AddDecodeWorker());
    expect_traffic_soon(*added);
  }
  // Prefill 1 -> 2.
  ASSERT_OK_AND_ASSIGN(Member * added_prefill, cluster.AddPrefillWorker());
  expect_traffic_soon(*added_prefill);

  // Decode 3 -> 1 and prefill 2 -> 1: the first workers leave, and one of
  // those added.
  const std::vector<Member*> leaving = {&cluster.decode(0), &cluster.decode(1),
                                        &cluster.prefill(0)};
  // Streams of about half a second (here), most of them routed before the
  // router re-reads the files: leaving workers have requests to finish.
  load.StartLong(2 * cluster.num_decode(), 480);
  for (Member* m : leaving) ASSERT_OK(cluster.Unlist(*m));
  for (Member* m : leaving) {
    ASSERT_OK(cluster.WaitForLog(cluster.router_member(),
                                 absl::StrCat(" worker ", m->address, " left the pool"),
                                 kDeadline));
  }
  const absl::Time gone = absl::Now();
  std::map<std::string, absl::Time> sigterm_at;
  for (Member* m : leaving) {
    sigterm_at[m->address] = absl::Now();
    m->process->Signal(SIGTERM);
  }
  for (Member* m : leaving) {
    EXPECT_EQ(m->process->Wait(absl::Seconds(90)), 0) << m->name << "\n" << cluster.Logs();
  }
  // The load goes on, on the workers left.
  ASSERT_TRUE(load.WaitForRequestsSince(absl::Now(), 2 * kClients)) << cluster.Logs();
  load.Stop();

  const std::vector<Record> records = load.records();
  std::map<std::string, int> served;
  // Streams a leaving decode worker still had when it got SIGTERM (it
  // finished them).
  std::map<std::string, int> drained;
  int failed = 0;
  for (const Record& r : records) {
    if (auto it = sigterm_at.find(r.decode_worker);
        it != sigterm_at.end() && r.start < it->second && r.end > it->second) {
      ++drained[r.decode_worker];
    }
    if (!r.status.ok()) {
      // The first few say why; the count says how many.
      if (++failed <= 3) ADD_FAILURE() << "request failed: " << r.status.error_message();
      continue;
    }
    ++served[r.prefill_worker];
    ++served[r.decode_worker];
    if (r.start > gone) {
      for (const Member* m : leaving) {
        EXPECT_NE(r.prefill_worker, m->address) << m->name << " was routed to after it left";
        EXPECT_NE(r.decode_worker, m->address) << m->name << " was routed to after it left";
      }
    }
  }
  EXPECT_EQ(failed, 0) << cluster.Logs();
  std::cout << records.size() << " requests, " << failed << " failed; served by";
  for (int i = 0; i < cluster.num_prefill(); ++i) {
    std::cout << " " << cluster.prefill(i).name << "=" << served[cluster.prefill(i).address];
  }
  for (int i = 0; i < cluster.num_decode(); ++i) {
    std::cout << " " << cluster.decode(i).name << "=" << served[cluster.decode(i).address];
  }
  std::cout << "\nfrom ready to the end of the first request routed there:";
  for (const auto& [name, d] : join_times) std::cout << " " << name << "=" << d;
  std::cout << "\nstreams running at SIGTERM:";
  for (const Member* m : leaving) {
    if (m->name.rfind("decode", 0) == 0) std::cout << " " << m->name << "=" << drained[m->address];
  }
  std::cout << std::endl;
  const absl::Status idle = cluster.WaitUntilIdle(absl::Seconds(15));
  EXPECT_TRUE(idle.ok()) << idle << "\n" << cluster.Logs();
}

}  // namespace
}  // namespace tandem::testing
