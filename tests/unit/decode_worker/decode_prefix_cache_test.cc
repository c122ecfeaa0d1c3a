// The decode worker's prefix cache: prompts that start with tokens whose KV
// the worker already holds reuse it (a local prefill computes only the rest,
// a remote one leases only the rest), the outputs are those of a run without
// the cache, and the next turn of a chat finds the previous turn's blocks.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/worker/worker_stats_proto.h"
#include "decode_worker/decode_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/wire_format.h"
#include "prometheus/registry.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"

namespace tandem::decode {
namespace {

using ::tandem::decode::testing::DecodeHarness;
using ::tandem::decode::testing::LocalRequest;
using ::tandem::decode::testing::NewSink;
using ::tandem::decode::testing::RandomTokens;
using ::tandem::decode::testing::RemoteRequest;
using ::tandem::decode::testing::StartResult;

using testing::kVocab;
constexpr int kBlock = 16;  // The harness's block size.

DecodeLoopOptions CacheOptions(bool prefix_cache) {
  DecodeLoopOptions options;
  options.prefix_cache = prefix_cache;
  return options;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A remote request run to its end: the lease it got, what the reservation
// and the end said about the cache, and choice 0's tokens (the first one
// included).
struct RemoteTurn {
  kvtransfer::TransferLease lease;
  int reserved_cached_tokens = -1;
  int finished_cached_tokens = -1;
  std::vector<int32_t> tokens;
};

// The stand-in prefill worker computes the whole prompt and ships the
// lease's blocks, from its first_block on.
absl::StatusOr<RemoteTurn> RunRemoteTurn(DecodeHarness& h, const Request& r) {
  auto sink = NewSink();
  RETURN_IF_ERROR(h.loop().Submit(r, sink).status());
  if (!sink->WaitReserved()) return absl::InternalError(sink->status().ToString());
  RemoteTurn turn;
  ASSIGN_OR_RETURN(turn.lease, kvtransfer::TransferLease::Parse(sink->descriptor()));
  turn.reserved_cached_tokens = sink->cached_tokens();
  ASSIGN_OR_RETURN(std::vector<int32_t> first,
                   h.prefill().PrefillChoices(r.prompt, sink->descriptor(), -1, r.sampling, r.n,
                                              r.stop_token_ids));
  StartResult start;
  h.loop().Start(r.request_id, sink->generation(), first[0],
                 std::vector<int32_t>(first.begin() + 1, first.end()), start.Callback());
  RETURN_IF_ERROR(start.Wait());
  if (!sink->WaitEnded()) return absl::DeadlineExceededError("test: stream did not end");
  RETURN_IF_ERROR(sink->status());
  if (sink->finished_count() != r.n) return absl::InternalError("test: a choice did not finish");
  turn.finished_cached_tokens = sink->finished(0)->cached_tokens;
  turn.tokens = Concat({first[0]}, sink->tokens(0));
  return turn;
}

// Runs a local request; its choice 0's tokens and how many prompt tokens
// came from the cache.
struct LocalRun {
  std::vector<int32_t> tokens;
  int cached_tokens = -1;
  std::vector<TokenLogprob> prompt_logprobs;
};

LocalRun RunLocal(DecodeHarness& h, const Request& r) {
  auto sink = NewSink();
  LocalRun run;
  absl::StatusOr<std::vector<std::vector<int32_t>>> all = h.RunLocalChoices(r, sink);
  EXPECT_OK(all.status());
  if (!all.ok()) return run;
  run.tokens = (*all)[0];
  run.cached_tokens = sink->finished(0)->cached_tokens;
  run.prompt_logprobs = sink->prompt_logprobs().value_or(std::vector<TokenLogprob>());
  return run;
}

TEST(DecodePrefixCache, LocalPrefillReusesASharedPrefixAndGivesTheSameTokens) {
  const std::vector<int32_t> a = RandomTokens(40, kVocab, 1);
  // Shares a's first 35 tokens: two whole blocks.
  const std::vector<int32_t> b =
      Concat(std::vector<int32_t>(a.begin(), a.begin() + 35), RandomTokens(20, kVocab, 2));
  std::vector<int32_t> with_cache, without_cache;
  for (bool cache : {true, false}) {
    DecodeHarness h(CacheOptions(cache));
    const LocalRun first = RunLocal(h, LocalRequest("a", a, 8));
    EXPECT_EQ(first.cached_tokens, 0);
    const LocalRun second = RunLocal(h, LocalRequest("b", b, 12));
    EXPECT_EQ(second.tokens, h.Expected(LocalRequest("b", b, 12)));
    (cache ? with_cache : without_cache) = second.tokens;
    const LoopStats s = h.loop().Stats();
    if (cache) {
      EXPECT_EQ(second.cached_tokens, 2 * kBlock);
      // a looks up (40 - 1) / 16 = 2 blocks, b (55 - 1) / 16 = 3.
      EXPECT_EQ(s.prefix_cache_queried_tokens, 5u * kBlock);
      EXPECT_EQ(s.prefix_cache_hit_tokens, 2u * kBlock);
      EXPECT_GT(s.kv_blocks_cached, 0);
    } else {
      EXPECT_EQ(second.cached_tokens, 0);
      EXPECT_EQ(s.prefix_cache_queried_tokens, 0u);
      EXPECT_EQ(s.prefix_cache_hit_tokens, 0u);
      EXPECT_EQ(s.kv_blocks_cached, 0);
    }
    EXPECT_TRUE(h.AllBlocksFree());
  }
  EXPECT_EQ(with_cache, without_cache);
}

TEST(DecodePrefixCache, TheSamePromptAgainComputesOnlyItsLastBlock) {
  DecodeHarness h;
  // 48 tokens: three whole blocks, the last of which holds the last token
  // and so is computed again.
  const std::vector<int32_t> prompt = RandomTokens(48, kVocab, 3);
  const LocalRun first = RunLocal(h, LocalRequest("first", prompt, 6));
  const LocalRun again = RunLocal(h, LocalRequest("again", prompt, 6));
  EXPECT_EQ(again.cached_tokens, 2 * kBlock);
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_EQ(again.tokens, h.Expected(LocalRequest("x", prompt, 6)));
}

TEST(DecodePrefixCache, PromptLogprobsTakeNoCachedBlocks) {
  const std::vector<int32_t> prompt = RandomTokens(50, kVocab, 4);
  std::vector<TokenLogprob> with_cache, without_cache;
  for (bool cache : {true, false}) {
    DecodeHarness h(CacheOptions(cache));
    RunLocal(h, LocalRequest("warm", prompt, 4));
    const uint64_t hits = h.loop().Stats().prefix_cache_hit_tokens;
    Request r = LocalRequest("logprobs", prompt, 4);
    r.prompt_logprobs = true;
    r.logprobs = 3;
    const LocalRun run = RunLocal(h, r);
    EXPECT_EQ(run.cached_tokens, 0);
    EXPECT_EQ(h.loop().Stats().prefix_cache_hit_tokens, hits);
    EXPECT_EQ(run.tokens, h.Expected(r));
    ASSERT_EQ(run.prompt_logprobs.size(), prompt.size() - 1);
    (cache ? with_cache : without_cache) = run.prompt_logprobs;
    EXPECT_TRUE(h.AllBlocksFree());
  }
  for (size_t i = 0; i < with_cache.size(); ++i) {
    EXPECT_EQ(with_cache[i].token_id, without_cache[i].token_id) << i;
    EXPECT_EQ(with_cache[i].top.size(), without_cache[i].top.size()) << i;
    EXPECT_EQ(with_cache[i].logprob, without_cache[i].logprob) << i;
  }
}

// Turn 1 of a chat ends; turn 2's prompt is turn 1's prompt, its output and
// new tokens. Turn 1 wrote the K/V of its prompt and of every output token
// but the last: 37 + 19 = 56 tokens, three whole blocks.
class MultiTurn : public ::testing::TestWithParam<bool> {};

TEST_P(MultiTurn, TheNextTurnLeasesOnlyTheBlocksAfterThePreviousTurn) {
  const bool turn1_local = GetParam();
  const std::vector<int32_t> p1 = RandomTokens(37, kVocab, 5);
  DecodeHarness h;
  std::vector<int32_t> t1;
  if (turn1_local) {
    t1 = RunLocal(h, LocalRequest("turn1", p1, 20)).tokens;
  } else {
    auto sink = NewSink();
    ASSERT_OK_AND_ASSIGN(t1, h.RunRemote(RemoteRequest("turn1", p1, 20), sink));
    EXPECT_EQ(sink->cached_tokens(), 0);
  }
  ASSERT_EQ(t1.size(), 20u);
  const std::vector<int32_t> p2 = Concat(Concat(p1, t1), RandomTokens(10, kVocab, 6));
  const Request r2 = RemoteRequest("turn2", p2, 15);  // 67 tokens: five blocks.

  const uint64_t bytes_before = h.loop().Stats().kv_transfer_bytes;
  ASSERT_OK_AND_ASSIGN(RemoteTurn turn2, RunRemoteTurn(h, r2));
  EXPECT_EQ(turn2.lease.first_block, 3u);
  EXPECT_EQ(turn2.reserved_cached_tokens, 3 * kBlock);
  EXPECT_EQ(turn2.finished_cached_tokens, 3 * kBlock);

  // The same turn on a worker without the cache leases all five blocks.
  DecodeHarness reference(CacheOptions(false));
  ASSERT_OK_AND_ASSIGN(RemoteTurn uncached, RunRemoteTurn(reference, r2));
  EXPECT_EQ(uncached.lease.first_block, 0u);
  ASSERT_EQ(turn2.lease.layer_bytes.size(), uncached.lease.layer_bytes.size());
  for (size_t l = 0; l < turn2.lease.layer_bytes.size(); ++l) {
    EXPECT_EQ(turn2.lease.layer_bytes[l] * 5, uncached.lease.layer_bytes[l] * 2) << l;
  }
  // Only those two blocks crossed the transport.
  EXPECT_EQ(h.loop().Stats().kv_transfer_bytes - bytes_before, turn2.lease.total_bytes());

  EXPECT_EQ(turn2.tokens, uncached.tokens);
  EXPECT_EQ(turn2.tokens, h.Expected(r2));
  EXPECT_TRUE(h.AllBlocksFree());
}

INSTANTIATE_TEST_SUITE_P(Turn1, MultiTurn, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Local" : "Remote";
                         });

TEST(DecodePrefixCache, ALocalNextTurnComputesOnlyItsNewTokens) {
  DecodeHarness h;
  const std::vector<int32_t> p1 = RandomTokens(37, kVocab, 7);
  const LocalRun turn1 = RunLocal(h, LocalRequest("turn1", p1, 20));
  const std::vector<int32_t> p2 = Concat(Concat(p1, turn1.tokens), RandomTokens(10, kVocab, 8));
  const LocalRun turn2 = RunLocal(h, LocalRequest("turn2", p2, 15));
  EXPECT_EQ(turn2.cached_tokens, 3 * kBlock);
  EXPECT_EQ(turn2.tokens, h.Expected(LocalRequest("x", p2, 15)));
}

TEST(DecodePrefixCache, RemoteReservationOfACachedPromptSkipsItsBlocks) {
  DecodeHarness h;
  const std::vector<int32_t> prompt = RandomTokens(70, kVocab, 9);
  RunLocal(h, LocalRequest("warm", prompt, 2));
  Request r = RemoteRequest("remote", prompt, 10);
  r.n = 2;  // The other choice copies the whole prompt, cached part included.
  ASSERT_OK_AND_ASSIGN(RemoteTurn run, RunRemoteTurn(h, r));
  // (70 - 1) / 16 = 4 blocks looked up and found; the fifth is shipped.
  EXPECT_EQ(run.lease.first_block, 4u);
  EXPECT_EQ(run.reserved_cached_tokens, 4 * kBlock);
  EXPECT_EQ(run.tokens, h.Expected(r));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodePrefixCache, WithTheCacheOffNothingIsCached) {
  DecodeHarness h(CacheOptions(false));
  const std::vector<int32_t> p1 = RandomTokens(40, kVocab, 10);
  RunLocal(h, LocalRequest("a", p1, 20));
  EXPECT_EQ(RunLocal(h, LocalRequest("again", p1, 4)).cached_tokens, 0);
  ASSERT_OK_AND_ASSIGN(RemoteTurn remote, RunRemoteTurn(h, RemoteRequest("remote", p1, 4)));
  EXPECT_EQ(remote.lease.first_block, 0u);
  EXPECT_EQ(remote.reserved_cached_tokens, 0);
  EXPECT_EQ(remote.finished_cached_tokens, 0);
  EXPECT_TRUE(h.AllBlocksFree());
  const LoopStats s = h.loop().Stats();
  EXPECT_EQ(s.kv_blocks_cached, 0);
  EXPECT_EQ(s.prefix_cache_queried_tokens, 0u);
  EXPECT_EQ(s.prefix_cache_hit_tokens, 0u);
}

// The value of the metric `name` (one series) in `registry`, or -1.
double MetricValue(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name || family.metric.size() != 1) continue;
    const prometheus::ClientMetric& m = family.metric[0];
    return family.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
  }
  return -1;
}

TEST(DecodePrefixCache, StatsAndMetricsShowTheHitRate) {
  prometheus::Registry registry;
  DecodeMetrics metrics(registry);
  DecodeLoopOptions options;
  options.metrics = &metrics;
  DecodeHarness h(options);
  const std::vector<int32_t> prompt = RandomTokens(33, kVocab, 11);
  RunLocal(h, LocalRequest("a", prompt, 2));
  RunLocal(h, LocalRequest("b", prompt, 2));
  // Cached unused blocks count as free; the stats are those after b's end.
  ASSERT_TRUE(h.AllBlocksFree());
  const LoopStats s = h.loop().Stats();
  EXPECT_EQ(s.prefix_cache_queried_tokens, 4u * kBlock);
  EXPECT_EQ(s.prefix_cache_hit_tokens, 2u * kBlock);
  EXPECT_EQ(s.kv_blocks_cached, 2);
  EXPECT_EQ(MetricValue(registry, "tandem_decode_prefix_cache_queried_tokens_total"), 4 * kBlock);
  EXPECT_EQ(MetricValue(registry, "tandem_decode_prefix_cache_hit_tokens_total"), 2 * kBlock);
  EXPECT_EQ(MetricValue(registry, "tandem_decode_kv_blocks_cached"), 2);
  EXPECT_EQ(MetricValue(registry, "tandem_decode_kv_blocks_used"), 0);
}

// What the router's prefix index learns from: the cache's events, as
// GetStats serves them, and the evicted blocks counted.
TEST(DecodePrefixCache, CachedAndFlushedBlocksAreEventsAndTheFlushedOnesCount) {
  prometheus::Registry registry;
  DecodeMetrics metrics(registry);
  DecodeLoopOptions options;
  options.metrics = &metrics;
  DecodeHarness h(options);
  RunLocal(h, LocalRequest("a", RandomTokens(33, kVocab, 12), 2));
  ASSERT_TRUE(h.AllBlocksFree());
  const CacheEventBatch stored = h.loop().cache_events().Read(0, 100);
  ASSERT_EQ(stored.events.size(), 2u);  // 34 tokens written: two full blocks.
  EXPECT_EQ(stored.events[0].kind, CacheEventKind::kStored);
  EXPECT_EQ(stored.events[1].kind, CacheEventKind::kStored);

  h.loop().FlushPrefixCache();
  ASSERT_TRUE(testing::WaitFor([&] { return h.loop().Stats().kv_blocks_cached == 0; }));
  EXPECT_EQ(h.loop().Stats().prefix_cache_evicted_blocks, 2u);
  EXPECT_EQ(MetricValue(registry, "tandem_decode_prefix_cache_evicted_blocks_total"), 2);
  const CacheEventBatch flushed = h.loop().cache_events().Read(stored.next, 100);
  ASSERT_EQ(flushed.events.size(), 1u);
  EXPECT_EQ(flushed.events[0].kind, CacheEventKind::kCleared);

  // GetStats's reply from them, after the cursor it is given.
  v1::StatsRequest request;
  request.set_max_cache_events(100);
  v1::WorkerStats reply;
  CacheEventsReply(h.loop().cache_events(), 9, request, &reply);
  EXPECT_EQ(reply.cache_events_next(), 3u);
  ASSERT_EQ(reply.cache_events_size(), 2);
  EXPECT_EQ(reply.cache_events(0).hashes_low_size(), 2);
  EXPECT_EQ(reply.cache_events(1).kind(), v1::CacheEvent::CLEARED);
}

TEST(DecodePrefixCache, TheServiceReportsTheCacheInItsProtos) {
  Finished f;
  f.cached_tokens = 48;
  EXPECT_EQ(ToProto(f).cached_tokens(), 48);
  LoopStats s;
  s.prefix_cache_queried_tokens = 640;
  s.prefix_cache_hit_tokens = 320;
  s.kv_blocks_cached = 7;
  const v1::WorkerStats w = ToProto(s);
  EXPECT_EQ(w.prefix_cache_queried_tokens(), 640u);
  EXPECT_EQ(w.prefix_cache_hit_tokens(), 320u);
  EXPECT_EQ(w.kv_blocks_cached(), 7);
  s.prefix_cache_evicted_blocks = 5;
  EXPECT_EQ(ToProto(s).prefix_cache_evicted_blocks(), 5u);
  s.preemptions = 3;
  EXPECT_EQ(ToProto(s).preemptions(), 3u);
  EXPECT_EQ(WorkerStatsFromProto(ToProto(s)).preemptions, 3u);
}

}  // namespace
}  // namespace tandem::decode
