// The decode worker's prefix cache never leaks: after any mix of local and
// remote requests that complete, are cancelled at any stage or lose their
// KV transfer, every block is free or held only by the cache (unused), and
// a flush empties the cache.
#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"

namespace tandem::decode {
namespace {

using ::tandem::decode::testing::DecodeHarness;
using ::tandem::decode::testing::NewSink;
using ::tandem::decode::testing::RandomTokens;
using ::tandem::decode::testing::RecordingSink;
using ::tandem::decode::testing::RemoteRequest;
using ::tandem::decode::testing::StartResult;
using ::tandem::testing::StatusIs;

using testing::kVocab;

enum Kind {
  kLocalComplete,
  kRemoteComplete,
  kLocalCancelMidDecode,
  kRemoteCancelBeforeKv,
  kRemoteCancelBeforeStart,
  kRemoteLeaseFails,
  kRemoteCancelMidDecode,
  kKinds,
};

// Reserves, has the stand-in prefill worker ship the lease's blocks and
// starts the request; false (with a test failure) when that did not work.
bool ReceiveAndStart(DecodeHarness& h, const Request& r, const std::shared_ptr<RecordingSink>& sink,
                     std::vector<int32_t>* first) {
  EXPECT_TRUE(sink->WaitReserved());
  absl::StatusOr<std::vector<int32_t>> tokens = h.prefill().PrefillChoices(
      r.prompt, sink->descriptor(), -1, r.sampling, r.n, r.stop_token_ids);
  EXPECT_OK(tokens.status());
  if (!tokens.ok()) return false;
  StartResult start;
  h.loop().Start(r.request_id, sink->generation(), (*tokens)[0],
                 std::vector<int32_t>(tokens->begin() + 1, tokens->end()), start.Callback());
  EXPECT_OK(start.Wait());
  *first = *tokens;
  return true;
}

TEST(DecodePrefixCacheLeaks, RandomMixLeavesOnlyCachedBlocksAndFlushEmptiesTheCache) {
  DecodeLoopOptions options;
  options.kv_blocks = 24;  // Small: later requests evict cached blocks.
  DecodeHarness h(options);
  std::mt19937_64 rng(20261124);
  const std::array<std::vector<int32_t>, 3> prefixes = {
      RandomTokens(40, kVocab, 101), RandomTokens(40, kVocab, 102), RandomTokens(40, kVocab, 103)};
  // The prompt and output of the last completed request: a chat's next turn
  // starts with it.
  std::vector<int32_t> chat;
  std::array<int, kKinds> seen = {};
  int cached_requests = 0;
  for (int i = 0; i < 60; ++i) {
    std::vector<int32_t> prompt;
    if (!chat.empty() && chat.size() < 80 && rng() % 2 == 0) {
      prompt = chat;
    } else {
      const std::vector<int32_t>& p = prefixes[rng() % prefixes.size()];
      prompt.assign(p.begin(), p.begin() + 8 + rng() % 33);
    }
    const std::vector<int32_t> tail = RandomTokens(1 + rng() % 12, kVocab, rng());
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    const Kind kind = static_cast<Kind>(rng() % kKinds);
    ++seen[kind];
    const bool mid_decode = kind == kLocalCancelMidDecode || kind == kRemoteCancelMidDecode;
    // Mid-decode cancellations run until the context ends them at most.
    Request r = RemoteRequest(absl::StrCat("r", i), prompt,
                              mid_decode ? 1000 : 1 + static_cast<int>(rng() % 16));
    r.local_prefill = kind == kLocalComplete || kind == kLocalCancelMidDecode;
    r.n = 1 + static_cast<int>(rng() % 2);
    SCOPED_TRACE(
        absl::StrCat("request ", i, " kind ", kind, " prompt ", prompt.size(), " n ", r.n));

    auto sink = NewSink();
    ASSERT_OK_AND_ASSIGN(DecodeLoop::Ticket ticket, h.loop().Submit(r, sink));
    std::vector<int32_t> first;
    switch (kind) {
      case kLocalComplete:
        break;
      case kRemoteComplete:
        ASSERT_TRUE(ReceiveAndStart(h, r, sink, &first));
        break;
      case kLocalCancelMidDecode:
      case kRemoteCancelMidDecode:
        if (kind == kRemoteCancelMidDecode) {
          ASSERT_TRUE(ReceiveAndStart(h, r, sink, &first));
        }
        ASSERT_TRUE(sink->WaitTokens(2));
        h.loop().Cancel(ticket);
        break;
      case kRemoteCancelBeforeKv:
        ASSERT_TRUE(sink->WaitReserved());
        h.loop().Cancel(ticket);
        break;
      case kRemoteCancelBeforeStart:
        ASSERT_TRUE(sink->WaitReserved());
        ASSERT_OK(h.prefill().Prefill(r.prompt, sink->descriptor()).status());
        h.loop().Cancel(ticket);
        break;
      case kRemoteLeaseFails:
        ASSERT_TRUE(sink->WaitReserved());
        EXPECT_FALSE(
            h.prefill().Prefill(r.prompt, sink->descriptor(), /*abort_after_layer=*/1).ok());
        break;
      case kKinds:
        break;
    }
    ASSERT_TRUE(sink->WaitEnded());
    EXPECT_EQ(sink->events_after_end(), 0);
    // Reserved with cached blocks, or (local) finished with them.
    bool hit = sink->cached_tokens() > 0;
    if (kind == kLocalComplete || kind == kRemoteComplete) {
      ASSERT_OK(sink->status());
      std::vector<int32_t> tokens = first.empty() ? std::vector<int32_t>() : std::vector{first[0]};
      for (int32_t t : sink->tokens(0)) tokens.push_back(t);
      // Greedy: cached or not, the tokens of the single-stream engine path.
      EXPECT_EQ(tokens, h.Expected(r));
      hit = hit || sink->finished(0)->cached_tokens > 0;
      chat = prompt;
      chat.insert(chat.end(), tokens.begin(), tokens.end());
    } else if (kind == kRemoteLeaseFails) {
      EXPECT_FALSE(sink->status().ok());
    } else if (!sink->status().ok()) {
      // A mid-decode cancellation may come after the context ended it.
      EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kCancelled));
    }
    if (hit) ++cached_requests;
    // Nothing is held but what the cache keeps unused.
    ASSERT_TRUE(h.AllBlocksFree());
  }
  for (int k = 0; k < kKinds; ++k) EXPECT_GT(seen[k], 0) << "kind " << k;
  EXPECT_GT(cached_requests, 5);
  const LoopStats before = h.loop().Stats();
  RecordProperty("cached_requests", cached_requests);
  RecordProperty("hit_tokens", static_cast<int>(before.prefix_cache_hit_tokens));
  RecordProperty("queried_tokens", static_cast<int>(before.prefix_cache_queried_tokens));
  EXPECT_GT(before.kv_blocks_cached, 0);
  EXPECT_GT(before.prefix_cache_hit_tokens, 0u);

  h.loop().FlushPrefixCache();
  ASSERT_TRUE(testing::WaitFor([&] { return h.loop().Stats().kv_blocks_cached == 0; }));
  const LoopStats after = h.loop().Stats();
  EXPECT_EQ(after.kv_blocks_free, after.kv_blocks_total);
  // Nothing is found any more.
  auto sink = NewSink();
  Request again = RemoteRequest("after-flush", chat, 2);
  again.local_prefill = true;
  ASSERT_OK(h.loop().Submit(again, sink).status());
  ASSERT_TRUE(sink->WaitEnded());
  ASSERT_OK(sink->status());
  EXPECT_EQ(sink->finished(0)->cached_tokens, 0);
  EXPECT_TRUE(h.AllBlocksFree());
}

}  // namespace
}  // namespace tandem::decode
