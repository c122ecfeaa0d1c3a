// Prefix caching across the pools: greedy outputs are the same with the
// caches on and off, colocated and disaggregated; repeated prefixes are not
// computed again; a multi-turn chat ships only its new blocks; the router's
// prefix index follows a worker's evictions through its cache events; a
// prefill worker's SSD KV tier gives back a prompt its pool evicted.
#include <signal.h>

#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster_harness.h"
#include "tests/e2e/metrics_scrape.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem::testing {
namespace {

constexpr int kBlock = 16;

class PrefixCacheClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const ModelConfig shape{.dim = 64,
                            .hidden_dim = 160,
                            .n_layers = 4,
                            .n_heads = 4,
                            .n_kv_heads = 2,
                            .vocab_size = 512,
                            .seq_len = 1024};
    auto files = WriteSyntheticModel(shape, 11, "prefix");
    CHECK_OK(files.status());
    model_ = files->model;
    tokenizer_ = files->tokenizer;
  }

  static std::unique_ptr<Cluster> Start(int prefill, bool cache) {
    ClusterOptions options{
        .prefill = prefill, .decode = 1, .model = model_, .tokenizer = tokenizer_};
    if (!cache) {
      options.prefill_flags = {"--noprefix_cache"};
      options.decode_flags = {"--noprefix_cache"};
    }
    auto cluster = Cluster::Start(options);
    CHECK_OK(cluster.status());
    return std::move(cluster).value();
  }

  static v1::GenerateRequest Greedy(const std::vector<int32_t>& prompt, int max_tokens) {
    v1::GenerateRequest r;
    r.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
    r.set_max_tokens(max_tokens);
    r.mutable_sampling()->set_temperature(0);
    r.set_ignore_eos(true);
    return r;
  }

  static std::vector<int32_t> Tokens(int n, int32_t from) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(3 + (from + 7 * i) % 500);
    return v;
  }

  static std::string model_, tokenizer_;
};

std::string PrefixCacheClusterTest::model_;
std::string PrefixCacheClusterTest::tokenizer_;

// Three prompts share a 64-token prefix; the same outputs come back with
// the caches on and off, and only the cache-on cluster skips the prefix.
TEST_F(PrefixCacheClusterTest, SharedPrefixesGiveTheSameTokensAndAreNotComputedAgain) {
  for (int prefill : {1, 0}) {
    SCOPED_TRACE(prefill == 1 ? "disaggregated" : "colocated");
    std::unique_ptr<Cluster> on = Start(prefill, true);
    std::unique_ptr<Cluster> off = Start(prefill, false);
    const std::vector<int32_t> system = Tokens(64, 1);
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> prompt = system;
      const std::vector<int32_t> tail = Tokens(20 + 5 * i, 100 * (i + 1));
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      const Completion a = RunGenerate(on->router(), Greedy(prompt, 12));
      const Completion b = RunGenerate(off->router(), Greedy(prompt, 12));
      ASSERT_TRUE(a.status.ok()) << a.status.error_message() << on->Logs();
      ASSERT_TRUE(b.status.ok()) << b.status.error_message() << off->Logs();
      EXPECT_EQ(a.tokens, b.tokens) << "prompt " << i;
      EXPECT_EQ(a.finished.usage().cached_tokens(), i == 0 ? 0 : 64) << "prompt " << i;
      EXPECT_EQ(b.finished.usage().cached_tokens(), 0);
    }
    EXPECT_TRUE(on->WaitUntilIdle(absl::Seconds(30)).ok());
  }
}

// Each turn's prompt is the previous prompt, the previous reply and a new
// message. With the decode worker's cache the prefill worker ships only the
// blocks the decode worker does not hold yet; the replies do not change.
TEST_F(PrefixCacheClusterTest, AMultiTurnChatShipsOnlyItsNewBlocks) {
  std::unique_ptr<Cluster> on = Start(1, true);
  std::unique_ptr<Cluster> off = Start(1, false);
  std::vector<int32_t> history;
  uint64_t on_bytes = 0, off_bytes = 0;
  for (int turn = 0; turn < 5; ++turn) {
    const std::vector<int32_t> message = Tokens(24, 1000 + 37 * turn);
    history.insert(history.end(), message.begin(), message.end());
    const Completion a = RunGenerate(on->router(), Greedy(history, 10));
    const Completion b = RunGenerate(off->router(), Greedy(history, 10));
    ASSERT_TRUE(a.status.ok()) << a.status.error_message() << on->Logs();
    ASSERT_TRUE(b.status.ok()) << b.status.error_message() << off->Logs();
    ASSERT_EQ(a.tokens, b.tokens) << "turn " << turn;
    auto on_stats = on->Stats(on->decode(0));
    auto off_stats = off->Stats(off->decode(0));
    ASSERT_TRUE(on_stats.ok() && off_stats.ok());
    const uint64_t on_turn = on_stats->kv_transfer_bytes() - on_bytes;
    const uint64_t off_turn = off_stats->kv_transfer_bytes() - off_bytes;
    on_bytes = on_stats->kv_transfer_bytes();
    off_bytes = off_stats->kv_transfer_bytes();
    // Without the cache every turn ships the whole prompt's blocks.
    const uint64_t whole = (history.size() + kBlock - 1) / kBlock;
    ASSERT_GT(off_turn, 0u);
    const uint64_t block_bytes = off_turn / whole;
    if (turn == 0) {
      EXPECT_EQ(on_turn, off_turn);
    } else {
      // The decode worker holds every whole block of the previous turn's
      // prompt and reply but the reply's last token (its KV is never
      // written): only the blocks after them travel.
      const uint64_t held = (history.size() - message.size() - 1) / kBlock;
      EXPECT_EQ(on_turn, block_bytes * (whole - held)) << "turn " << turn;
      EXPECT_LT(on_turn, off_turn) << "turn " << turn;
    }
    history.insert(history.end(), a.tokens.begin(), a.tokens.end());
  }
  EXPECT_TRUE(on->WaitUntilIdle(absl::Seconds(30)).ok());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Waits (bounded) until `path` holds at least `n` times `what`.
absl::Status WaitForCount(const std::string& path, const std::string& what, int n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (CountOf(ReadAll(path), what) < n) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(path, " does not hold '", what, "' ", n, " times"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::OkStatus();
}

// The prompt tokens the router's prefix index said the decode worker held
// for request `id`, from its line in the request log (waited for, bounded).
absl::StatusOr<int> IndexedCachedTokens(const std::string& request_log, const std::string& id) {
  const std::string key = absl::StrCat("\"request_id\":\"", id, "\"");
  if (absl::Status s = WaitForCount(request_log, key, 1); !s.ok()) return s;
  const std::vector<std::string> lines = absl::StrSplit(ReadAll(request_log), '\n');
  for (const std::string& line : lines) {
    if (line.find(key) == std::string::npos) continue;
    static const std::regex kClaim(
        "decode [^ ]+: ([0-9]+) of [0-9]+ prompt tokens cached per the prefix index");
    std::smatch match;
    if (!std::regex_search(line, match, kClaim)) {
      return absl::NotFoundError(absl::StrCat("no prefix index claim in ", line));
    }
    return std::stoi(match[1].str());
  }
  return absl::NotFoundError(absl::StrCat("no line of ", id));
}

// A decode worker whose cache evicts a prefix while generating a long
// sequence the router never records (cancelled): the router hears of the
// eviction from the worker's cache events, and the next request with the
// prefix is not scored by a stale entry. The router's index would otherwise
// still list the evicted blocks: they are within its capacity, and the
// drop in kv_blocks_cached is too small to trim it.
TEST_F(PrefixCacheClusterTest, AnEvictedPrefixIsNotCountedByTheRoutersIndex) {
  const std::string request_log = absl::StrCat(TempDir(), "/evicted-prefix-requests.jsonl");
  std::remove(request_log.c_str());
  auto started = Cluster::Start(
      ClusterOptions{.prefill = 0,
                     .decode = 1,
                     .model = model_,
                     .tokenizer = tokenizer_,
                     .router_flags = {"--routing_policy=prefix", "--health_interval=50ms",
                                      "--request_log=" + request_log},
                     // 32 blocks of 16 tokens: a 512-token sequence fills it.
                     .decode_flags = {"--kv_blocks=32"}});
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;

  // Four shared blocks, one more block and a tail: 84 tokens, 5 full
  // blocks cached when the sequence finishes.
  const std::vector<int32_t> shared = Tokens(80, 1);
  std::vector<int32_t> first = shared;
  for (int32_t t : Tokens(4, 300)) first.push_back(t);
  v1::GenerateRequest first_request = Greedy(first, 4);
  first_request.set_request_id("first");
  const Completion a = RunGenerate(cluster.router(), first_request);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message() << cluster.Logs();
  ASSERT_OK_AND_ASSIGN(const int first_claim, IndexedCachedTokens(request_log, "first"));
  EXPECT_EQ(first_claim, 0);

  // A 16-token prompt generating into nearly the whole pool: the cache
  // gives up its least recently released blocks, the tail of `first`.
  auto evicted_before = cluster.Stats(cluster.decode(0));
  ASSERT_TRUE(evicted_before.ok()) << evicted_before.status();
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(60)));
    auto reader = cluster.router().Generate(&ctx, Greedy(Tokens(16, 700), 490));
    v1::GenerateResponse response;
    int received = 0;
    while (received < 440 && reader->Read(&response)) received += response.token_ids_size();
    ASSERT_GE(received, 440) << cluster.Logs();
    ctx.TryCancel();
    while (reader->Read(&response)) {
    }
    reader->Finish();
  }
  ASSERT_TRUE(cluster.WaitUntilIdle(absl::Seconds(30)).ok()) << cluster.Logs();
  auto evicted_after = cluster.Stats(cluster.decode(0));
  ASSERT_TRUE(evicted_after.ok()) << evicted_after.status();
  ASSERT_GE(evicted_after->prefix_cache_evicted_blocks(),
            evicted_before->prefix_cache_evicted_blocks() + 2)
      << "the long sequence should have evicted cached blocks";

  // The router has polled the worker since: stop it until a poll fails,
  // and wait for the router to see it healthy again (a poll answered after
  // the evictions, whose events the registry takes before the health).
  const std::string healthy = absl::StrCat("decode worker ", cluster.decode(0).address);
  const int seen = CountOf(ReadAll(cluster.router_member().log), healthy + " is healthy");
  cluster.decode(0).process->Signal(SIGSTOP);
  ASSERT_TRUE(
      cluster.WaitForLog(cluster.router_member(), healthy + " is unhealthy", absl::Seconds(30))
          .ok());
  cluster.decode(0).process->Signal(SIGCONT);
  ASSERT_TRUE(WaitForCount(cluster.router_member().log, healthy + " is healthy", seen + 1).ok())
      << cluster.Logs();

  // The same five blocks and another tail: the index claims what the
  // worker still holds, no more.
  std::vector<int32_t> second = shared;
  for (int32_t t : Tokens(4, 400)) second.push_back(t);
  v1::GenerateRequest second_request = Greedy(second, 4);
  second_request.set_request_id("second");
  const Completion b = RunGenerate(cluster.router(), second_request);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message() << cluster.Logs();
  const int held = b.finished.usage().cached_tokens();
  EXPECT_LT(held, 80) << "the tail block should have been evicted";
  ASSERT_OK_AND_ASSIGN(const int claim, IndexedCachedTokens(request_log, "second"));
  EXPECT_EQ(claim, held) << ReadAll(request_log);
}

// A prefill worker with a pool of 16 blocks over an SSD tier: a prompt's
// blocks, evicted from the pool by two long prompts, come back from the
// tier, verified, and the reply is the one a cluster without cache gives.
TEST_F(PrefixCacheClusterTest, APromptEvictedFromThePrefillPoolComesBackFromItsSsdTier) {
  const std::string dir = TempDir();
  const std::string request_log = dir + "/tier-requests.jsonl";
  auto started = Cluster::Start(
      ClusterOptions{.prefill = 1,
                     .decode = 1,
                     .model = model_,
                     .tokenizer = tokenizer_,
                     .router_flags = {"--request_log=" + request_log},
                     .prefill_flags = {"--kv_blocks=16", "--kv_tier_dir=" + dir + "/tier",
                                       "--kv_tier_gib=0.05", "--metrics_listen=127.0.0.1:0",
                                       "--metrics_port_file=" + dir + "/prefill.mport"},
                     // The decode worker holds no prefix: every prompt block is the
                     // prefill worker's to give.
                     .decode_flags = {"--noprefix_cache"}});
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& on = **started;
  std::unique_ptr<Cluster> off = Start(1, false);
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadAll(dir + "/prefill.mport")), &port))
      << on.Logs();

  const std::vector<int32_t> prompt = Tokens(84, 9);  // 5 full blocks cached
  const Completion first = RunGenerate(on.router(), Greedy(prompt, 8));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message() << on.Logs();
  EXPECT_EQ(first.finished.usage().cached_tokens(), 0);
  for (int32_t from : {2000, 3000}) {  // 15 blocks each: the pool evicts the prompt
    const Completion c = RunGenerate(on.router(), Greedy(Tokens(240, from), 2));
    ASSERT_TRUE(c.status.ok()) << c.status.error_message() << on.Logs();
  }
  // Every block spilled is written (the tier is far from full).
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  Samples m = Scrape(port);
  while (!(Get(m, "tandem_prefill_kv_tier_spilled_blocks_total") >= 5 &&
           Get(m, "tandem_prefill_kv_tier_records{tier=\"ssd\"}") ==
               Get(m, "tandem_prefill_kv_tier_spilled_blocks_total"))) {
    ASSERT_LT(absl::Now(), deadline) << "tier writes did not land\n" << on.Logs();
    absl::SleepFor(absl::Milliseconds(20));
    m = Scrape(port);
  }

  v1::GenerateRequest again = Greedy(prompt, 8);
  again.set_request_id("again");
  const Completion b = RunGenerate(on.router(), again);
  const Completion want = RunGenerate(off->router(), Greedy(prompt, 8));
  ASSERT_TRUE(b.status.ok()) << b.status.error_message() << on.Logs();
  ASSERT_TRUE(want.status.ok()) << want.status.error_message() << off->Logs();
  EXPECT_EQ(b.tokens, want.tokens);
  EXPECT_EQ(b.tokens, first.tokens);
  EXPECT_EQ(b.finished.usage().cached_tokens(), 80);
  m = Scrape(port);
  EXPECT_EQ(Get(m, "tandem_prefill_kv_tier_hit_tokens_total"), 80);
  EXPECT_EQ(Get(m, "tandem_prefill_kv_tier_load_misses_total{reason=\"corrupt\",tier=\"ssd\"}"), 0);
  // The request log says the prefix came from the tier.
  ASSERT_OK(WaitForCount(request_log, "\"request_id\":\"again\"", 1));
  EXPECT_THAT(ReadAll(request_log), ::testing::HasSubstr("\"tier_cached_tokens\":80"));
  EXPECT_TRUE(on.WaitUntilIdle(absl::Seconds(30)).ok());
}

// The same over a tier of host memory: the prompt's blocks come back from
// it, and the router counted them as the worker's host-tier blocks.
TEST_F(PrefixCacheClusterTest, APromptEvictedFromThePrefillPoolComesBackFromHostMemory) {
  const std::string dir = TempDir();
  auto started = Cluster::Start(ClusterOptions{
      .prefill = 1,
      .decode = 1,
      .model = model_,
      .tokenizer = tokenizer_,
      .prefill_flags = {"--kv_blocks=16", "--kv_host_tier_gib=0.05", "--metrics_listen=127.0.0.1:0",
                        "--metrics_port_file=" + dir + "/prefill.mport"},
      .decode_flags = {"--noprefix_cache"}});
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& on = **started;
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadAll(dir + "/prefill.mport")), &port))
      << on.Logs();
  const std::vector<int32_t> prompt = Tokens(84, 11);
  const Completion first = RunGenerate(on.router(), Greedy(prompt, 8));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message() << on.Logs();
  for (int32_t from : {2000, 3000}) {
    const Completion c = RunGenerate(on.router(), Greedy(Tokens(240, from), 2));
    ASSERT_TRUE(c.status.ok()) << c.status.error_message() << on.Logs();
  }
  Samples m = Scrape(port);
  EXPECT_GE(Get(m, "tandem_prefill_kv_tier_records{tier=\"host\"}"), 5);
  EXPECT_EQ(Get(m, "tandem_prefill_kv_tier_records{tier=\"ssd\"}"), 0);
  const Completion again = RunGenerate(on.router(), Greedy(prompt, 8));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message() << on.Logs();
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_EQ(again.finished.usage().cached_tokens(), 80);
  m = Scrape(port);
  EXPECT_EQ(Get(m, "tandem_prefill_kv_tier_hit_tokens_total"), 80);
  EXPECT_GT(Get(m, "tandem_prefill_kv_tier_read_bytes_total{tier=\"host\"}"), 0);
  EXPECT_TRUE(on.WaitUntilIdle(absl::Seconds(30)).ok());
}

// A prefill worker's GetStats serves its cache events after a cursor, as
// the router's polls ask for them.
TEST_F(PrefixCacheClusterTest, APrefillWorkerReportsTheBlocksItCachedAfterTheCursor) {
  std::unique_ptr<Cluster> cluster = Start(1, true);
  const std::vector<int32_t> prompt = Tokens(84, 5);
  const Completion a = RunGenerate(cluster->router(), Greedy(prompt, 2));
  ASSERT_TRUE(a.status.ok()) << a.status.error_message() << cluster->Logs();
  ASSERT_TRUE(cluster->WaitUntilIdle(absl::Seconds(30)).ok()) << cluster->Logs();

  auto stub = v1::PrefillWorker::NewStub(rpc::MakeChannel(cluster->prefill(0).address));
  auto ask = [&stub](uint64_t epoch, uint64_t after, int max) {
    v1::StatsRequest request;
    request.set_cache_epoch(epoch);
    request.set_cache_events_after(after);
    request.set_max_cache_events(max);
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(10)));
    v1::WorkerStats stats;
    const grpc::Status status = stub->GetStats(&ctx, request, &stats);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return stats;
  };
  // Every full block but the one holding the last prompt token is cached.
  const int cached = (84 - 1) / kBlock;
  const v1::WorkerStats all = ask(0, 0, 100);
  ASSERT_NE(all.cache_epoch(), 0u);
  EXPECT_FALSE(all.cache_events_lost());
  EXPECT_EQ(all.cache_events_next(), static_cast<uint64_t>(cached));
  ASSERT_EQ(all.cache_events_size(), 1);
  EXPECT_EQ(all.cache_events(0).kind(), v1::CacheEvent::STORED);
  EXPECT_EQ(all.cache_events(0).hashes_high_size(), cached);
  EXPECT_EQ(all.cache_events(0).hashes_low_size(), cached);
  // Two at a time, then nothing new after the last.
  const v1::WorkerStats two = ask(all.cache_epoch(), 0, 2);
  EXPECT_EQ(two.cache_events_next(), 2u);
  ASSERT_EQ(two.cache_events_size(), 1);
  EXPECT_EQ(two.cache_events(0).hashes_low(1), all.cache_events(0).hashes_low(1));
  const v1::WorkerStats none = ask(all.cache_epoch(), all.cache_events_next(), 100);
  EXPECT_EQ(none.cache_events_size(), 0);
  EXPECT_EQ(none.cache_events_next(), all.cache_events_next());
  // A cursor of another process starts from the beginning.
  const v1::WorkerStats other = ask(all.cache_epoch() + 1, 3, 100);
  EXPECT_EQ(other.cache_events_next(), static_cast<uint64_t>(cached));
  ASSERT_EQ(other.cache_events_size(), 1);
  EXPECT_EQ(other.cache_events(0).hashes_high_size(), cached);
}

}  // namespace
}  // namespace tandem::testing
