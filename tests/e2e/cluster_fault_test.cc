// Workers dying or draining under load, with real processes. A synthetic
// model with a long context (random weights, so no fixtures needed) keeps
// streams running long enough to kill a worker in the middle of them.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_harness.h"
#include "tests/testing/child_process.h"
#include "tests/testing/model_files.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

class ClusterFaultTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const ModelConfig shape{.dim = 288,
                            .hidden_dim = 768,
                            .n_layers = 6,
                            .n_heads = 6,
                            .n_kv_heads = 6,
                            .vocab_size = 512,
                            .seq_len = 2048};
    auto files = WriteSyntheticModel(shape, 7, "fault");
    CHECK_OK(files.status());
    model_ = files->model;
    tokenizer_ = files->tokenizer;
  }

  void StartCluster(ClusterOptions options) {
    options.model = model_;
    options.tokenizer = tokenizer_;
    auto cluster = Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
  }

  // `kv_handoff`: a drained worker ships one-choice streams' K/V (else
  // their new worker recomputes them).
  void StreamsResumeElsewhereAfter(int signal, bool kv_handoff = true);

  static std::string model_, tokenizer_;
  std::unique_ptr<Cluster> cluster_;
};

std::string ClusterFaultTest::model_;
std::string ClusterFaultTest::tokenizer_;

// A stream run on its own thread, which signals once its first message is in.
struct LiveStream {
  absl::Notification started;
  Completion result;
  std::vector<std::vector<int32_t>> by_choice;  // tokens per choice index
  absl::Time ended;                             // When the stream's status came.
  // The longest wait between two messages after the first (what a client
  // sees of a move).
  absl::Duration longest_gap;
  std::atomic<int> received{0};  // Tokens so far, all choices.
  std::thread thread;

  void Run(v1::Router::Stub& router, v1::GenerateRequest request) {
    thread = std::thread([this, &router, request] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(90));
      auto reader = router.Generate(&ctx, request);
      v1::GenerateResponse response;
      absl::Time last = absl::InfinitePast();
      while (reader->Read(&response)) {
        const absl::Time now = absl::Now();
        if (last != absl::InfinitePast()) longest_gap = std::max(longest_gap, now - last);
        last = now;
        result.tokens.insert(result.tokens.end(), response.token_ids().begin(),
                             response.token_ids().end());
        received.fetch_add(response.token_ids_size());
        const size_t index = static_cast<size_t>(std::clamp(response.index(), 0, 15));
        if (by_choice.size() <= index) by_choice.resize(index + 1);
        by_choice[index].insert(by_choice[index].end(), response.token_ids().begin(),
                                response.token_ids().end());
        if (response.has_finished()) result.finished = response.finished();
        if (!started.HasBeenNotified()) started.Notify();
      }
      result.status = reader->Finish();
      ended = absl::Now();
      if (!started.HasBeenNotified()) started.Notify();
    });
  }
};

TEST_F(ClusterFaultTest, PrefillWorkerKilledUnderLoadRequestsStillComplete) {
  StartCluster({.prefill = 2, .decode = 2});
  constexpr int kClients = 12, kRequestsEach = 6;
  std::atomic<int> done{0};
  std::vector<std::vector<Completion>> got(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      for (int r = 0; r < kRequestsEach; ++r) {
        got[i].push_back(RunGenerate(cluster_->router(),
                                     TextRequest(absl::StrCat("the story ", i, " part ", r), 24)));
        ++done;
      }
    });
  }
  // Kill a prefill worker once the load is running.
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (done < kClients && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  cluster_->prefill(0).process->Kill();
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kClients; ++i) {
    for (const Completion& c : got[i]) {
      ASSERT_TRUE(c.status.ok()) << c.status.error_message() << "\n" << cluster_->Logs();
      EXPECT_EQ(c.finished.usage().completion_tokens(), static_cast<int>(c.tokens.size()));
    }
  }
  // New requests go to the surviving prefill worker.
  const Completion after = RunGenerate(cluster_->router(), TextRequest("after the kill", 8));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.finished.prefill_worker(), cluster_->prefill(1).address);
  const absl::Status idle = cluster_->WaitUntilIdle(absl::Seconds(15));
  EXPECT_TRUE(idle.ok()) << idle << "\n" << cluster_->Logs();
}

// The same kind of request over HTTP (/v1/completions, whole or streamed),
// run on its own thread: the status and the text it got.
struct HttpRun {
  std::thread thread;
  int status = 0;
  std::string text;
  std::string error;

  void Run(int port, int i, bool stream) {
    thread = std::thread([this, port, i, stream] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(90, 0);
      const nlohmann::json body = {{"prompt", absl::StrCat("long http story ", i)},
                                   {"max_tokens", 400},
                                   {"temperature", i % 2 == 1 ? 0.8 : 0.0},
                                   {"seed", 7 + i},
                                   {"stream", stream}};
      const httplib::Result r = client.Post("/v1/completions", body.dump(), "application/json");
      if (!r) {
        error = httplib::to_string(r.error());
        return;
      }
      status = r->status;
      if (!stream) {
        const nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
        if (j.is_discarded() || !j.contains("choices")) {
          error = r->body;
        } else {
          text = j["choices"][0].value("text", "");
        }
        return;
      }
      // Server-sent events: each "data: " line a chunk, then [DONE].
      bool done = false;
      for (absl::string_view line : absl::StrSplit(r->body, '\n', absl::SkipEmpty())) {
        if (!absl::ConsumePrefix(&line, "data: ")) continue;
        if (line == "[DONE]") {
          done = true;
          continue;
        }
        const nlohmann::json j = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
        if (j.is_discarded() || j.contains("error")) {
          error = std::string(line);
          return;
        }
        if (!j["choices"].empty()) text += j["choices"][0].value("text", "");
      }
      if (!done) error = "the stream ended without [DONE]";
    });
  }
};

// Greedy and seeded-sampled streams, of one and two choices, each running
// its 500 tokens (no end of sequence), so that every one is mid-stream at
// the fault whatever its seed draws.
v1::GenerateRequest MigrationRequest(int i) {
  v1::GenerateRequest r = TextRequest(absl::StrCat("long story ", i), 500);
  r.set_ignore_eos(true);
  if (i % 2 == 1) {
    r.mutable_sampling()->set_temperature(0.8f);
    r.mutable_sampling()->set_seed(100 + i);
  }
  if (i % 4 == 3) r.set_n(2);
  return r;
}

// Streams on a decode worker that is killed (SIGKILL: its connections
// break), stopped (SIGSTOP: they stay open, and the registry's health
// polls notice) or drained (SIGTERM: it offers them, and exits once the
// router moved them) move to the other decode worker and resume where they
// were. Every client gets status OK and exactly the tokens of an unfaulted
// run, greedy and sampled, of one choice and two; the router stops routing
// to the faulted worker; once it is back (SIGCONT) every block is free.
void ClusterFaultTest::StreamsResumeElsewhereAfter(int signal, bool kv_handoff) {
  // Without prefix caches the faulted run computes its prompts as the
  // unfaulted one did.
  const std::string log = absl::StrCat(TempDir(), "/migration-", signal, ".jsonl");
  std::filesystem::remove(log);
  StartCluster({.prefill = 1,
                .decode = 2,
                .router_flags = {"--request_log=" + log, "--health_interval=200ms",
                                 absl::StrCat("--kv_handoff=", kv_handoff)},
                .prefill_flags = {"--prefix_cache=false"},
                .decode_flags = {"--prefix_cache=false"},
                .http = true});
  constexpr int kStreams = 8;
  constexpr int kHttp = 4;  // whole and streamed, greedy and sampled
  constexpr int kTokensBeforeFault = 100;
  std::vector<LiveStream> unfaulted(kStreams);
  std::vector<HttpRun> http_unfaulted(kHttp);
  for (int i = 0; i < kStreams; ++i) unfaulted[i].Run(cluster_->router(), MigrationRequest(i));
  for (int i = 0; i < kHttp; ++i) http_unfaulted[i].Run(cluster_->http_port(), i, i >= 2);
  for (LiveStream& s : unfaulted) s.thread.join();
  for (HttpRun& h : http_unfaulted) h.thread.join();
  for (const LiveStream& s : unfaulted) {
    ASSERT_TRUE(s.result.status.ok()) << s.result.status.error_message() << "\n"
                                      << cluster_->Logs();
  }

  std::vector<LiveStream> streams(kStreams);
  std::vector<HttpRun> http(kHttp);
  for (int i = 0; i < kStreams; ++i) streams[i].Run(cluster_->router(), MigrationRequest(i));
  for (int i = 0; i < kHttp; ++i) http[i].Run(cluster_->http_port(), i, i >= 2);
  for (LiveStream& s : streams)
    ASSERT_TRUE(s.started.WaitForNotificationWithTimeout(absl::Seconds(60)));
  // Well into every stream, so that a move has tokens to carry.
  const absl::Time into = absl::Now() + absl::Seconds(60);
  for (LiveStream& s : streams) {
    while (s.received.load() < kTokensBeforeFault && absl::Now() < into) {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  const std::string victim = cluster_->decode(0).address;
  const absl::Time faulted = absl::Now();
  std::thread drained;
  int drained_status = -1;
  absl::Time exited = absl::InfiniteFuture();
  if (signal == SIGKILL) {
    cluster_->decode(0).process->Kill();
  } else {
    cluster_->decode(0).process->Signal(signal);
  }
  if (signal == SIGTERM) {
    drained = std::thread([&] {
      drained_status = cluster_->decode(0).process->Wait(absl::Seconds(60));
      exited = absl::Now();
    });
  }
  for (LiveStream& s : streams) s.thread.join();
  for (HttpRun& h : http) h.thread.join();
  absl::Time last_end = faulted;
  std::vector<absl::Duration> pauses;
  for (const LiveStream& s : streams) {
    last_end = std::max(last_end, s.ended);
    pauses.push_back(s.longest_gap);
  }
  std::sort(pauses.begin(), pauses.end());
  std::cout << "signal " << signal << (kv_handoff ? "" : " (no K/V handoff)")
            << ": longest pause per gRPC stream, median "
            << absl::FormatDuration(pauses[pauses.size() / 2]) << ", max "
            << absl::FormatDuration(pauses.back()) << "; streams done "
            << absl::FormatDuration(last_end - faulted) << " after the signal\n";
  if (signal == SIGTERM) {
    drained.join();
    // The drain ends when the streams have moved, not when they end.
    EXPECT_EQ(drained_status, 0) << cluster_->Logs();
    std::cout << "drained worker exited " << absl::FormatDuration(exited - faulted)
              << " after SIGTERM\n";
    EXPECT_LT(exited, last_end) << "the drain waited for the streams to end";
    const absl::Status offered =
        cluster_->WaitForLog(cluster_->router_member(), "is draining; resuming", absl::Seconds(5));
    EXPECT_TRUE(offered.ok()) << offered << "\n" << cluster_->Logs();
    // One-choice streams took their K/V along, or were recomputed.
    const absl::Status shipped = cluster_->WaitForLog(
        cluster_->router_member(), kv_handoff ? "of K/V handed off" : "is draining; resuming",
        absl::Seconds(5));
    EXPECT_TRUE(shipped.ok()) << shipped << "\n" << cluster_->Logs();
    EXPECT_FALSE(
        cluster_->WaitForLog(cluster_->router_member(), "handoff failed", absl::ZeroDuration())
            .ok())
        << cluster_->Logs();
    if (!kv_handoff) {
      EXPECT_FALSE(
          cluster_->WaitForLog(cluster_->router_member(), "of K/V handed off", absl::ZeroDuration())
              .ok());
    }
  }
  for (int i = 0; i < kHttp; ++i) {
    ASSERT_EQ(http_unfaulted[i].status, 200) << http_unfaulted[i].error;
    EXPECT_EQ(http[i].status, 200) << "HTTP " << i << ": " << http[i].error << "\n"
                                   << cluster_->Logs();
    EXPECT_EQ(http[i].text, http_unfaulted[i].text) << "HTTP " << i << ": " << http[i].error;
  }

  for (int i = 0; i < kStreams; ++i) {
    const LiveStream& s = streams[i];
    ASSERT_TRUE(s.result.status.ok())
        << "stream " << i << ": " << s.result.status.error_message() << "\n"
        << cluster_->Logs();
    EXPECT_EQ(s.result.finished.decode_worker(), cluster_->decode(1).address);
    ASSERT_EQ(s.by_choice.size(), unfaulted[i].by_choice.size()) << "stream " << i;
    for (size_t c = 0; c < s.by_choice.size(); ++c) {
      EXPECT_EQ(s.by_choice[c], unfaulted[i].by_choice[c]) << "stream " << i << " choice " << c;
    }
  }
  // The moved streams' lines in the request log say so.
  std::ifstream in(log);
  int logged = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"migrated_from\":[\"" + victim) != std::string::npos) ++logged;
  }
  EXPECT_GT(logged, 0) << "no stream was on the faulted worker";
  if (signal == SIGSTOP) {
    // Moved when the health polls went unanswered, not when gRPC's
    // keepalive gave up on the connection.
    const absl::Status polled =
        cluster_->WaitForLog(cluster_->router_member(), "stopped answering", absl::Seconds(5));
    EXPECT_TRUE(polled.ok()) << polled << "\n" << cluster_->Logs();
  }

  // The router stops routing to the faulted worker.
  for (int i = 0; i < 6; ++i) {
    const Completion c = RunGenerate(cluster_->router(), TextRequest(absl::StrCat("next ", i), 8));
    ASSERT_TRUE(c.status.ok()) << c.status.error_message() << "\n" << cluster_->Logs();
    EXPECT_EQ(c.finished.decode_worker(), cluster_->decode(1).address);
  }
  if (signal == SIGSTOP) cluster_->decode(0).process->Signal(SIGCONT);
  // Back, a stopped worker frees the streams the router cancelled.
  const absl::Status idle = cluster_->WaitUntilIdle(absl::Seconds(30));
  EXPECT_TRUE(idle.ok()) << idle << "\n" << cluster_->Logs();
}

TEST_F(ClusterFaultTest, DecodeWorkerKilledMidStreamItsStreamsResumeElsewhere) {
  StreamsResumeElsewhereAfter(SIGKILL);
}

TEST_F(ClusterFaultTest, DecodeWorkerStoppedMidStreamItsStreamsResumeElsewhere) {
  StreamsResumeElsewhereAfter(SIGSTOP);
}

TEST_F(ClusterFaultTest, DecodeWorkerDrainedMidStreamItsStreamsMoveElsewhere) {
  StreamsResumeElsewhereAfter(SIGTERM);
}

// The same drain recomputing every moved stream: the pause it prints is
// what the handoff saves.
TEST_F(ClusterFaultTest, DecodeWorkerDrainedWithoutKvHandoffItsStreamsAreRecomputed) {
  StreamsResumeElsewhereAfter(SIGTERM, /*kv_handoff=*/false);
}

// Runs `n` requests at once; returns each one's outcome and how long it took.
std::vector<std::pair<Completion, absl::Duration>> RunConcurrently(v1::Router::Stub& router,
                                                                   const std::string& tag, int n) {
  std::vector<std::pair<Completion, absl::Duration>> out(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const absl::Time start = absl::Now();
      out[i].first = RunGenerate(router, TextRequest(absl::StrCat(tag, " story ", i), 8));
      out[i].second = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

// Whether every thread of `pid` is stopped (SIGSTOP takes effect on each
// thread when it next runs; until then the worker may still answer).
bool AllThreadsStopped(pid_t pid) {
  const std::filesystem::path tasks = absl::StrCat("/proc/", pid, "/task");
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator(tasks, error)) {
    std::ifstream in(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t name_end = stat.rfind(')');
    if (name_end == std::string::npos || name_end + 2 >= stat.size()) return false;
    const char state = stat[name_end + 2];
    if (state != 'T' && state != 't') return false;
  }
  return !error;
}

// A decode worker that hangs (SIGSTOP: its connections stay open, so gRPC
// notices nothing for its keepalive timeout) costs the requests sent to it
// --reserve_timeout, then they go to the other worker; once it wakes, it
// frees the reservations the router cancelled.
TEST_F(ClusterFaultTest, HungDecodeWorkerCostsARequestAtMostTheReserveTimeout) {
  constexpr absl::Duration kReserveTimeout = absl::Seconds(2);
  StartCluster({.prefill = 1,
                .decode = 2,
                .router_flags = {
                    absl::StrCat("--reserve_timeout=", absl::FormatDuration(kReserveTimeout))}});
  constexpr int kRequests = 6;
  // The normal time of such a batch, both workers up (the first batch warms up).
  RunConcurrently(cluster_->router(), "warm", kRequests);
  absl::Duration normal;
  for (const auto& [c, took] : RunConcurrently(cluster_->router(), "normal", kRequests)) {
    ASSERT_TRUE(c.status.ok()) << c.status.error_message() << "\n" << cluster_->Logs();
    normal = std::max(normal, took);
  }
  cluster_->decode(0).process->Signal(SIGSTOP);
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!AllThreadsStopped(cluster_->decode(0).process->pid()) && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(AllThreadsStopped(cluster_->decode(0).process->pid()));
  const auto hung = RunConcurrently(cluster_->router(), "hung", kRequests);
  cluster_->decode(0).process->Signal(SIGCONT);
  for (const auto& [c, took] : hung) {
    EXPECT_TRUE(c.status.ok()) << c.status.error_message() << "\n" << cluster_->Logs();
    EXPECT_EQ(c.finished.decode_worker(), cluster_->decode(1).address);
    // The batch's work all lands on one worker: twice its normal time, plus
    // the wait for the hung one (not the 15 s of gRPC's keepalive).
    EXPECT_LT(took, kReserveTimeout + 2 * normal + absl::Seconds(1))
        << "normal batch time " << normal;
  }
  // Some went to the hung worker first (the router's trace says why they moved).
  const absl::Status moved =
      cluster_->WaitForLog(cluster_->router_member(), "no reservation within", absl::Seconds(5));
  EXPECT_TRUE(moved.ok()) << moved << "\n" << cluster_->Logs();
  // Awake, the worker frees the cancelled reservations: every block free.
  const absl::Status idle = cluster_->WaitUntilIdle(absl::Seconds(30));
  EXPECT_TRUE(idle.ok()) << idle << "\n" << cluster_->Logs();
}

TEST_F(ClusterFaultTest, SigtermDrainsAWorkerWithoutLosingItsStreams) {
  // A drain finishes streams as long as --drain_timeout allows; give it more
  // than this busy machine needs.
  StartCluster({.prefill = 1, .decode = 2, .decode_flags = {"--drain_timeout=90s"}});
  constexpr int kStreams = 4;
  std::vector<LiveStream> streams(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    streams[i].Run(cluster_->router(), TextRequest(absl::StrCat("drain story ", i), 300));
  }
  for (LiveStream& s : streams)
    ASSERT_TRUE(s.started.WaitForNotificationWithTimeout(absl::Seconds(60)));
  cluster_->decode(0).process->Signal(SIGTERM);
  for (LiveStream& s : streams) s.thread.join();
  for (const LiveStream& s : streams) {
    ASSERT_TRUE(s.result.status.ok()) << s.result.status.error_message() << "\n"
                                      << cluster_->Logs();
    EXPECT_EQ(s.result.finished.usage().completion_tokens(),
              static_cast<int>(s.result.tokens.size()));
  }
  EXPECT_EQ(cluster_->decode(0).process->Wait(absl::Seconds(40)), 0) << cluster_->Logs();
  const Completion c = RunGenerate(cluster_->router(), TextRequest("after the drain", 8));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message() << "\n" << cluster_->Logs();
  EXPECT_EQ(c.finished.decode_worker(), cluster_->decode(1).address);
}

// A router told to stop while it still waits for its first healthy decode
// worker (a pod deleted during start-up) exits at once with status 0, rather
// than ignoring the signal until --startup_timeout runs out.
TEST(RouterStartupTest, SigtermWhileWaitingForADecodeWorkerExitsZero) {
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer, "tok512.bin");
  const std::string log = TempDir() + "/router-startup.log";
  // The log is appended to: an earlier run's "waiting up to" would send the
  // signal before this router has blocked it.
  std::error_code ignored;
  std::filesystem::remove(log, ignored);
  Child router({TANDEM_ROUTER_BIN, "--listen=127.0.0.1:0", "--decode_workers=127.0.0.1:1",
                "--tokenizer=" + tokenizer, "--startup_timeout=120s"},
               log);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::string text;
  while (text.find("waiting up to") == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    std::ifstream in(log);
    std::stringstream all;
    all << in.rdbuf();
    text = all.str();
  }
  ASSERT_THAT(text, HasSubstr("waiting up to"));
  router.Signal(SIGTERM);
  EXPECT_EQ(router.Wait(absl::Seconds(30)), 0) << text;
}

}  // namespace
}  // namespace tandem::testing
