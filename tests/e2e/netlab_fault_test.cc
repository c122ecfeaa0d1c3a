// The fault matrix: {SIGKILL, SIGSTOP for 10 s, 5% packet loss, 50 ms added
// delay, a 10 s partition, a restart} x {a prefill worker, a decode worker,
// the router}, each cell a cluster of a router, 2 prefill and 2 decode
// workers in network namespaces of their own (tests/e2e/netlab.h) under a
// load of short greedy requests from several clients.
//
// The bar for every cell: every request ends by its deadline with OK or a
// clean status; every OK request's tokens are the reference's (taken once
// on a healthy cluster); afterwards every worker still running is idle with
// all its KV blocks free, and the cluster serves a batch normally. Requests
// that start while a worker is hung, cut off or gone lose at most the
// router's 2 s deadlines (reservation, prefill's first answer) before they
// go to its peer.
//
// NETLAB_REQUESTS sets the requests per cell (default 200); NETLAB_TABLE
// names a file that gets one Markdown table row per cell; NETLAB_LOGS a
// folder that gets each cell's logs.
// scripts/fault-matrix.sh runs the 18 cells with 1,000 each.
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster_harness.h"
#include "tests/e2e/netlab.h"
#include "tests/e2e/netlab_load.h"
#include "tests/testing/model_files.h"

namespace tandem::testing {
namespace {

enum class Fault { kSigkill, kSigstop, kLoss, kDelay, kPartition, kRestart };
enum class Where { kPrefill, kDecode, kRouter };

constexpr absl::Duration kFaultWindow = absl::Seconds(10);
constexpr absl::Duration kRouterDeadlines = absl::Seconds(2);
constexpr int kClients = 8;

std::string FaultName(Fault f) {
  switch (f) {
    case Fault::kSigkill:
      return "Sigkill";
    case Fault::kSigstop:
      return "Sigstop10s";
    case Fault::kLoss:
      return "Loss5pct";
    case Fault::kDelay:
      return "Delay50ms";
    case Fault::kPartition:
      return "Partition10s";
    case Fault::kRestart:
      return "Restart";
  }
  return "";
}

std::string WhereName(Where w) {
  switch (w) {
    case Where::kPrefill:
      return "Prefill";
    case Where::kDecode:
      return "Decode";
    case Where::kRouter:
      return "Router";
  }
  return "";
}

int RequestsPerCell() {
  const char* n = std::getenv("NETLAB_REQUESTS");
  return n != nullptr && std::atoi(n) > 0 ? std::atoi(n) : 200;
}

std::vector<std::string> Prompts() {
  std::vector<std::string> prompts;
  for (const char* who : {"Lily", "Tom", "the cat", "a little bird", "Sue", "the old man"}) {
    for (const char* what : {"went to the park", "saw a big tree", "was sad", "found a box"}) {
      prompts.push_back(absl::StrCat("Once upon a time, ", who, " ", what));
    }
  }
  return prompts;
}

std::string Ms(absl::Duration d) { return absl::StrCat(absl::ToInt64Milliseconds(d), " ms"); }

std::string Counts(const std::map<std::string, int>& counts) {
  if (counts.empty()) return "0";
  std::vector<std::string> parts;
  for (const auto& [code, n] : counts) parts.push_back(absl::StrCat(n, " ", code));
  return absl::StrJoin(parts, ", ");
}

class NetlabFaultTest : public ::testing::TestWithParam<std::tuple<Fault, Where>> {
 protected:
  void SetUp() override {
    if (absl::Status s = NetLab::Available(); !s.ok()) GTEST_SKIP() << s.message();
    model_ = ModelFile("stories260K.bin");
    tokenizer_ = ModelFile("tok512.bin");
    if (model_.empty() || tokenizer_.empty()) {
      if (ModelsRequired()) FAIL() << "stories260K.bin or tok512.bin missing";
      GTEST_SKIP() << "stories260K.bin and tok512.bin not found; set TANDEM_MODELS";
    }
    auto lab = NetLab::Create();
    ASSERT_TRUE(lab.ok()) << lab.status();
    lab_ = std::move(lab).value();
    ASSERT_TRUE(lab_->AddClientNode().ok());
    for (const char* name : {"router", "prefill-0", "prefill-1", "decode-0", "decode-1"}) {
      auto node = lab_->AddNode(name);
      ASSERT_TRUE(node.ok()) << node.status();
      nodes_[name] = *node;
    }
    ClusterOptions options{
        .prefill = 2,
        .decode = 2,
        .model = model_,
        .tokenizer = tokenizer_,
        .router_flags = {absl::StrCat("--reserve_timeout=", absl::FormatDuration(kRouterDeadlines)),
                         absl::StrCat("--prefill_answer_timeout=",
                                      absl::FormatDuration(kRouterDeadlines))},
        .placement = [this](const std::string& name) {
          const NetNode& node = nodes_.at(name);
          MemberPlacement p{.prefix = lab_->Prefix(node), .host = node.ip};
          if (name != "router") p.flags = {"--kv_net_devices=" + node.dev};
          return p;
        }};
    auto cluster = Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
    load_options_.prompts = Prompts();
    if (reference_.empty()) TakeReference();
  }

  // Each prompt's tokens from the healthy cluster, once per run.
  void TakeReference() {
    LoadOptions once = load_options_;
    once.retry_unavailable = false;
    for (int i = 0; i < static_cast<int>(load_options_.prompts.size()); ++i) {
      const Outcome o = RunRequest(cluster_->router(), once, i);
      ASSERT_EQ(o.code, grpc::StatusCode::OK) << o.message << "\n" << cluster_->Logs();
      reference_.push_back(o.tokens);
    }
  }

  Member& Target(Where where) {
    switch (where) {
      case Where::kPrefill:
        return cluster_->prefill(0);
      case Where::kDecode:
        return cluster_->decode(0);
      case Where::kRouter:
        return cluster_->router_member();
    }
    return cluster_->router_member();
  }

  // Starts the fault; returns what ends it (run once the window is over).
  std::function<void()> Inject(Fault fault, Where where) {
    Member& m = Target(where);
    const std::string link = m.name;
    switch (fault) {
      case Fault::kSigkill:
        m.process->Kill();
        // A dead worker stays dead (its peer serves); a supervisor brings a
        // dead router back.
        if (where != Where::kRouter) return [] {};
        return [this, &m] { ASSERT_TRUE(cluster_->Restart(m).ok()); };
      case Fault::kSigstop:
        m.process->Signal(SIGSTOP);
        return [&m] { m.process->Signal(SIGCONT); };
      case Fault::kLoss:
        lab_->SetFault(link, {.loss = 0.05});
        return [this] { lab_->ClearFaults(); };
      case Fault::kDelay:
        lab_->SetFault(link, {.delay = absl::Milliseconds(50)});
        return [this] { lab_->ClearFaults(); };
      case Fault::kPartition:
        lab_->SetFault(link, {.cut = true});
        return [this] { lab_->ClearFaults(); };
      case Fault::kRestart: {
        const absl::Status s = cluster_->Restart(m);
        EXPECT_TRUE(s.ok()) << s;
        return [] {};
      }
    }
    return [] {};
  }

  // Batches of requests without retries until one is all OK with the
  // reference's tokens; how long that took.
  absl::StatusOr<absl::Duration> Recover(absl::Time since) {
    LoadOptions plain = load_options_;
    plain.retry_unavailable = false;
    const absl::Time until = absl::Now() + absl::Seconds(90);
    while (absl::Now() < until) {
      std::vector<Outcome> batch(kClients);
      std::vector<std::thread> threads;
      for (int i = 0; i < kClients; ++i) {
        threads.emplace_back([&, i] { batch[i] = RunRequest(cluster_->router(), plain, i); });
      }
      for (std::thread& t : threads) t.join();
      const CellFigures f = Summarize(batch, reference_);
      if (f.ok == kClients) return absl::Now() - since;
    }
    return absl::DeadlineExceededError("no batch was all OK within 90 s of the fault clearing");
  }

  static std::vector<std::vector<int32_t>> reference_;
  std::string model_, tokenizer_;
  std::unique_ptr<NetLab> lab_;
  std::map<std::string, NetNode> nodes_;
  std::unique_ptr<Cluster> cluster_;
  LoadOptions load_options_;
};

std::vector<std::vector<int32_t>> NetlabFaultTest::reference_;

TEST_P(NetlabFaultTest, Cell) {
  const auto [fault, where] = GetParam();
  const int requests = RequestsPerCell();
  const std::string cell = absl::StrCat(FaultName(fault), " ", WhereName(where));

  // The healthy figure first: the same load on the same cluster.
  absl::Duration healthy_max;
  {
    Load warm(cluster_->router(), load_options_);
    warm.Start(kClients);
    while (warm.done() < 4 * kClients) absl::SleepFor(absl::Milliseconds(10));
    const CellFigures f = Summarize(warm.Stop(), reference_);
    ASSERT_EQ(f.ok, f.requests) << cluster_->Logs();
    healthy_max = f.max_latency;
  }

  Load load(cluster_->router(), load_options_);
  load.Start(kClients);
  const absl::Time started = absl::Now();
  while (load.done() < requests / 4 && absl::Now() < started + absl::Seconds(120)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Time fault_at = absl::Now();
  std::function<void()> clear = Inject(fault, where);
  absl::SleepFor(kFaultWindow);
  clear();
  const absl::Time cleared = absl::Now();
  // The rest of the load runs after the fault, until the cell has its count.
  while (load.done() < requests && absl::Now() < cleared + absl::Seconds(300)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const std::vector<Outcome> outcomes = load.Stop();
  const CellFigures f = Summarize(outcomes, reference_);

  // The detour: requests started while the worker was down or unreachable.
  absl::Duration detour_max;
  for (const Outcome& o : outcomes) {
    if (o.start >= fault_at && o.start < cleared) detour_max = std::max(detour_max, o.latency);
  }
  const absl::StatusOr<absl::Duration> recovery = Recover(cleared);
  const absl::Status idle = cluster_->WaitUntilIdle(absl::Seconds(60));

  const std::string row = absl::StrCat(
      "| ", cell, " | ", f.requests, " | ", f.ok, " | ", Counts(f.failed), " | ", Counts(f.retried),
      " | ", f.wrong_tokens, " | ", Ms(f.p50_latency), " | ", Ms(f.p99_latency), " | ",
      Ms(f.max_latency), " | ", Ms(detour_max - healthy_max), " | ", idle.ok() ? "yes" : "no",
      " | ", recovery.ok() ? Ms(*recovery) : "never", " |");
  std::cout << row << std::endl;
  if (const char* table = std::getenv("NETLAB_TABLE"); table != nullptr) {
    std::ofstream(table, std::ios::app) << row << "\n";
  }
  if (const char* logs = std::getenv("NETLAB_LOGS"); logs != nullptr) {
    const std::string to = absl::StrCat(logs, "/", FaultName(fault), WhereName(where));
    std::filesystem::create_directories(to);
    std::filesystem::copy(cluster_->dir(), to,
                          std::filesystem::copy_options::overwrite_existing |
                              std::filesystem::copy_options::recursive);
  }
  const NetLab::Counters hub = lab_->counters();
  std::cout << "hub: " << hub.forwarded << " packets forwarded, " << hub.dropped << " dropped"
            << std::endl;

  EXPECT_GE(f.requests, requests);
  EXPECT_EQ(f.wrong_tokens, 0) << "OK requests with tokens other than the reference's";
  for (const Outcome& o : outcomes) {
    // Ended by its deadline (gRPC's own, plus scheduling slack), not hung.
    EXPECT_LE(o.latency, load_options_.deadline + absl::Seconds(5));
    EXPECT_TRUE(o.code == grpc::StatusCode::OK || o.code == grpc::StatusCode::UNAVAILABLE ||
                o.code == grpc::StatusCode::DEADLINE_EXCEEDED ||
                o.code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                o.code == grpc::StatusCode::ABORTED)
        << CodeName(o.code) << ": " << o.message;
  }
  // A worker hung, cut off, dead or restarting has a healthy peer: a
  // request sent meanwhile loses at most the router's deadlines (1.5 s of
  // margin for a loaded machine). Requests already on it when the fault
  // came are not bounded so: their tokens stream from that worker.
  if (where != Where::kRouter && fault != Fault::kLoss && fault != Fault::kDelay) {
    EXPECT_LE(detour_max - healthy_max, kRouterDeadlines + absl::Milliseconds(1500));
  }
  EXPECT_TRUE(idle.ok()) << idle << "\n" << cluster_->Logs();
  // Served normally once the fault cleared: a batch all OK without retries.
  ASSERT_TRUE(recovery.ok()) << recovery.status() << "\n" << cluster_->Logs();
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, NetlabFaultTest,
    ::testing::Combine(::testing::Values(Fault::kSigkill, Fault::kSigstop, Fault::kLoss,
                                         Fault::kDelay, Fault::kPartition, Fault::kRestart),
                       ::testing::Values(Where::kPrefill, Where::kDecode, Where::kRouter)),
    [](const auto& info) {
      return FaultName(std::get<0>(info.param)) + WhereName(std::get<1>(info.param));
    });

}  // namespace
}  // namespace tandem::testing
