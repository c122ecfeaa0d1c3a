// PrefixIndex fed with the cache events the workers report: the worker's
// reply as the registry's poller receives it (WorkerCacheEvents), the
// worker's side of the same protocol (CacheEventsReply over a BlockPool's
// events), and what the index then matches. Hashes are made up.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/kvcache/block_pool.h"
#include "common/kvcache/cache_events.h"
#include "common/worker/cache_events_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/prefix_index.h"
#include "router/prefix_routing.h"
#include "router/worker_cache_events.h"
#include "tests/testing/status_matchers.h"

namespace tandem::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<BlockHash> Chain(uint64_t chain, int n, int first = 0) {
  std::vector<BlockHash> out;
  for (int i = first; i < first + n; ++i) out.push_back({chain, static_cast<uint64_t>(i)});
  return out;
}

// A worker process as the router sees it through GetStats: its events, its
// epoch, and the poller's side.
struct FakeWorker {
  explicit FakeWorker(uint64_t epoch, int event_capacity = 1024)
      : epoch(epoch), log(event_capacity) {}

  void Store(std::span<const BlockHash> hashes) {
    for (const BlockHash& h : hashes) log.Record(CacheEventKind::kStored, h);
  }
  void Evict(std::span<const BlockHash> hashes) {
    for (const BlockHash& h : hashes) log.Record(CacheEventKind::kEvicted, h);
  }
  // The same in its SSD tier.
  void StoreSsd(std::span<const BlockHash> hashes) {
    for (const BlockHash& h : hashes) log.Record(CacheEventKind::kStored, h, CacheTier::kSsd);
  }
  void EvictSsd(std::span<const BlockHash> hashes) {
    for (const BlockHash& h : hashes) log.Record(CacheEventKind::kEvicted, h, CacheTier::kSsd);
  }

  // One stats poll of `events`.
  void Poll(WorkerCacheEvents& events) const {
    v1::StatsRequest request;
    events.FillRequest(&request);
    v1::WorkerStats reply;
    CacheEventsReply(log, epoch, request, &reply);
    events.Receive(request, reply);
  }

  uint64_t epoch;
  CacheEventLog log;
};

WorkerSnapshot Snapshot(std::string address, std::shared_ptr<const WorkerCacheEvents> events,
                        uint64_t requests_total = 0) {
  WorkerSnapshot s;
  s.address = std::move(address);
  s.healthy = true;
  s.weights_fingerprint = "00000000000fa4e1";
  s.kv_dtype = "f32";
  s.block_size = 16;
  s.kv_blocks_total = 1000;
  s.requests_total = requests_total;
  s.prefix_cache_queried_tokens = requests_total * 16;
  s.kv_blocks_cached = 1;
  s.cache_events = std::move(events);
  return s;
}

TEST(PrefixIndexEvents, StoredBlocksMatchAndEvictedOnesNoLonger) {
  auto events = std::make_shared<WorkerCacheEvents>();
  FakeWorker worker(/*epoch=*/7);
  PrefixIndex index;
  index.Sync({Snapshot("a", events)});
  EXPECT_FALSE(events->reporting());

  // Blocks cached by requests the router never routed there are learned.
  worker.Store(Chain(1, 4));
  worker.Poll(*events);
  EXPECT_TRUE(events->reporting());
  index.Sync({Snapshot("a", events)});
  EXPECT_EQ(index.Match("a", Chain(1, 4)), 4);

  // The worker evicts the tail, then the whole prefix: the index follows.
  worker.Evict(Chain(1, 2, /*first=*/2));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  EXPECT_EQ(index.Match("a", Chain(1, 4)), 2);
  worker.Evict(Chain(1, 2));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  EXPECT_EQ(index.Match("a", Chain(1, 4)), 0);
  EXPECT_EQ(index.size("a"), 0);
}

TEST(PrefixIndexEvents, RoutingHistoryIsImmediateAndEventsCorrectIt) {
  auto events = std::make_shared<WorkerCacheEvents>();
  FakeWorker worker(7);
  PrefixIndex index;
  index.Sync({Snapshot("a", events)});
  // Routed: known at once, before the worker reports anything.
  index.Insert("a", Chain(2, 3));
  EXPECT_EQ(index.Match("a", Chain(2, 3)), 3);
  // The worker stored it, and later evicted its first block.
  worker.Store(Chain(2, 3));
  worker.Evict(Chain(2, 1));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  EXPECT_EQ(index.Match("a", Chain(2, 3)), 0);
  EXPECT_EQ(index.size("a"), 2);
}

TEST(PrefixIndexEvents, AFlushClearsTheWorkerAndWhatStaysCachedIsStoredAgain) {
  auto events = std::make_shared<WorkerCacheEvents>();
  FakeWorker worker(7);
  PrefixIndex index;
  worker.Store(Chain(1, 2));
  worker.Store(Chain(3, 2));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  index.Insert("a", Chain(5, 2));
  // As BlockPool::Flush records it: chain 3 is in use and stays.
  worker.log.Record(CacheEventKind::kCleared);
  worker.Store(Chain(3, 2));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  EXPECT_EQ(index.Match("a", Chain(1, 2)), 0);
  EXPECT_EQ(index.Match("a", Chain(5, 2)), 0);
  EXPECT_EQ(index.Match("a", Chain(3, 2)), 2);
  EXPECT_EQ(index.size("a"), 2);
}

TEST(PrefixIndexEvents, EventsTheWorkerDroppedBeforeThePollClearTheWorker) {
  auto events = std::make_shared<WorkerCacheEvents>();
  FakeWorker worker(7, /*event_capacity=*/4);
  PrefixIndex index;
  worker.Store(Chain(1, 2));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  index.Insert("a", Chain(9, 2));
  ASSERT_EQ(index.Match("a", Chain(1, 2)), 2);
  // Chain 1 is evicted and six more events follow: the eviction is lost.
  worker.Evict(Chain(1, 2));
  worker.Store(Chain(2, 6));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  // Nothing known before can be trusted; the events kept are applied.
  EXPECT_EQ(index.Match("a", Chain(1, 2)), 0);
  EXPECT_EQ(index.Match("a", Chain(9, 2)), 0);
  EXPECT_EQ(index.Match("a", Chain(2, 6)), 0);  // Blocks 0 and 1 were lost.
  EXPECT_EQ(index.Match("a", Chain(2, 4, /*first=*/2)), 4);
}

TEST(PrefixIndexEvents, AReaderFallenBehindTheRoutersLogClearsTheWorker) {
  auto events = std::make_shared<WorkerCacheEvents>();
  // The worker keeps more than the router: it loses nothing here.
  FakeWorker worker(7, /*event_capacity=*/CacheEventRing::kDefaultCapacity);
  PrefixIndex index;
  worker.Store(Chain(1, 2));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  ASSERT_EQ(index.Match("a", Chain(1, 2)), 2);
  // More events than the router keeps per worker arrive between two syncs
  // (over several polls, each capped), the eviction of chain 1 among them.
  worker.Evict(Chain(1, 2));
  worker.Store(Chain(2, WorkerCacheEvents::kCapacity));
  const int polls = WorkerCacheEvents::kCapacity / WorkerCacheEvents::kMaxPerPoll + 1;
  for (int i = 0; i < polls; ++i) worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  EXPECT_EQ(index.Match("a", Chain(1, 2)), 0);
  EXPECT_EQ(index.Match("a", Chain(2, 1, WorkerCacheEvents::kCapacity - 1)), 1);
}

TEST(PrefixIndexEvents, ARestartedWorkerIsClearedByItsNewEpoch) {
  auto events = std::make_shared<WorkerCacheEvents>();
  FakeWorker before(7);
  PrefixIndex index;
  before.Store(Chain(1, 3));
  before.Poll(*events);
  index.Sync({Snapshot("a", events, /*requests_total=*/5)});
  index.Insert("a", Chain(4, 2));
  ASSERT_EQ(index.Match("a", Chain(1, 3)), 3);
  // The same address, a new process, whose counters happen not to drop
  // (they are never compared across its start): only the epoch tells.
  FakeWorker after(8);
  after.Store(Chain(6, 1));
  after.Poll(*events);
  index.Sync({Snapshot("a", events, /*requests_total=*/9)});
  EXPECT_EQ(index.Match("a", Chain(1, 3)), 0);
  EXPECT_EQ(index.Match("a", Chain(4, 2)), 0);
  EXPECT_EQ(index.Match("a", Chain(6, 1)), 1);
}

TEST(PrefixIndexEvents, AWorkerBackAtItsAddressWithFreshEventsStartsEmpty) {
  auto first = std::make_shared<WorkerCacheEvents>();
  FakeWorker worker(7);
  PrefixIndex index;
  worker.Store(Chain(1, 2));
  worker.Poll(*first);
  index.Sync({Snapshot("a", first)});
  ASSERT_EQ(index.Match("a", Chain(1, 2)), 2);
  // The registry made a new worker object for the address (it left and
  // came back before the index saw it go): its log numbers from 1 again.
  auto second = std::make_shared<WorkerCacheEvents>();
  FakeWorker back(9);
  back.Store(Chain(2, 1));
  back.Poll(*second);
  index.Sync({Snapshot("a", second)});
  EXPECT_EQ(index.Match("a", Chain(1, 2)), 0);
  EXPECT_EQ(index.Match("a", Chain(2, 1)), 1);
}

TEST(PrefixIndexEvents, AWorkerReportingEventsIsNotTrimmedByItsCachedCount) {
  auto events = std::make_shared<WorkerCacheEvents>();
  FakeWorker worker(7);
  PrefixIndex index;
  worker.Store(Chain(1, 100));
  worker.Poll(*events);
  WorkerSnapshot s = Snapshot("a", events);
  s.kv_blocks_cached = 100;
  index.Sync({s});
  // The cached count drops (e.g. a stats poll raced the events): the
  // events, not the count, say which blocks left.
  s.kv_blocks_cached = 10;
  index.Sync({s});
  EXPECT_EQ(index.Match("a", Chain(1, 100)), 100);
}

// A worker with an SSD tier below its pool.

TEST(PrefixIndexTiers, TheTierCountsFromThePoolsFirstMissAndIsKeptApart) {
  auto events = std::make_shared<WorkerCacheEvents>();
  FakeWorker worker(7);
  PrefixIndex index;
  worker.Store(Chain(1, 8));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  // The pool evicts blocks 2..7, which spill into the tier.
  worker.Evict(Chain(1, 6, /*first=*/2));
  worker.StoreSsd(Chain(1, 6, /*first=*/2));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  PrefixMatch m = index.MatchTiers("a", Chain(1, 8));
  EXPECT_EQ(m.pool, 2);
  EXPECT_EQ(m.tier, 6);
  EXPECT_EQ(index.Match("a", Chain(1, 8)), 2);
  EXPECT_EQ(index.size("a"), 2);
  EXPECT_EQ(index.tier_size("a"), 6);
  // A block held in both counts once, from the pool.
  worker.Store(Chain(1, 1, /*first=*/2));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  m = index.MatchTiers("a", Chain(1, 8));
  EXPECT_EQ(m.pool, 3);
  EXPECT_EQ(m.tier, 5);
  // The tier drops block 5: its run ends there.
  worker.EvictSsd(Chain(1, 1, /*first=*/5));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  m = index.MatchTiers("a", Chain(1, 8));
  EXPECT_EQ(m.pool, 3);
  EXPECT_EQ(m.tier, 2);
  // Routing history fills the pool only.
  index.Insert("a", Chain(4, 2));
  EXPECT_EQ(index.MatchTiers("a", Chain(4, 2)).pool, 2);
  EXPECT_EQ(index.tier_size("a"), 5);
}

TEST(PrefixIndexTiers, AClearOfOneTierLeavesTheOther) {
  auto events = std::make_shared<WorkerCacheEvents>();
  FakeWorker worker(7);
  PrefixIndex index;
  worker.Store(Chain(1, 2));
  worker.StoreSsd(Chain(2, 3));
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  // A flush of the pool (BlockPool::Flush): the tier keeps its blocks.
  worker.log.Record(CacheEventKind::kCleared);
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  EXPECT_EQ(index.Match("a", Chain(1, 2)), 0);
  EXPECT_EQ(index.MatchTiers("a", Chain(2, 3)).tier, 3);
  // The tier lost events (TierLink::ForwardEvents clears it): the pool
  // keeps its blocks.
  worker.Store(Chain(1, 2));
  worker.log.Record(CacheEventKind::kCleared, {}, CacheTier::kSsd);
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  EXPECT_EQ(index.Match("a", Chain(1, 2)), 2);
  EXPECT_EQ(index.tier_size("a"), 0);
  EXPECT_EQ(index.MatchTiers("a", Chain(2, 3)).tier, 0);
}

// A block moving from host memory down to the SSD is stored in one tier
// and evicted from the other, in either order: it stays counted, and a
// clear of one tier leaves what the other holds.
TEST(PrefixIndexTiers, BlocksMovingFromHostMemoryToTheSsdStayCounted) {
  auto events = std::make_shared<WorkerCacheEvents>();
  FakeWorker worker(7);
  PrefixIndex index;
  const std::vector<BlockHash> chain = Chain(1, 4);
  for (const BlockHash& h : chain) worker.log.Record(CacheEventKind::kStored, h, CacheTier::kHost);
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  EXPECT_EQ(index.MatchTiers("a", chain).tier, 4);
  // Blocks 0 and 1 go down: the SSD's store after the host's eviction for
  // one, before it for the other.
  worker.log.Record(CacheEventKind::kEvicted, chain[0], CacheTier::kHost);
  worker.log.Record(CacheEventKind::kStored, chain[0], CacheTier::kSsd);
  worker.log.Record(CacheEventKind::kStored, chain[1], CacheTier::kSsd);
  worker.log.Record(CacheEventKind::kEvicted, chain[1], CacheTier::kHost);
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  EXPECT_EQ(index.MatchTiers("a", chain).tier, 4);
  EXPECT_EQ(index.tier_size("a"), 4);
  worker.log.Record(CacheEventKind::kCleared, {}, CacheTier::kHost);
  worker.Poll(*events);
  index.Sync({Snapshot("a", events)});
  EXPECT_EQ(index.MatchTiers("a", chain).tier, 2) << "the SSD still holds blocks 0 and 1";
}

TEST(PrefixIndexTiers, ARestartOrLostEventsClearEveryTier) {
  auto events = std::make_shared<WorkerCacheEvents>();
  FakeWorker before(7, /*event_capacity=*/4);
  PrefixIndex index;
  before.StoreSsd(Chain(1, 2));
  before.Poll(*events);
  index.Sync({Snapshot("a", events, /*requests_total=*/5)});
  ASSERT_EQ(index.tier_size("a"), 2);
  // Events dropped before the poll.
  before.EvictSsd(Chain(1, 2));
  before.Store(Chain(3, 4));
  before.Poll(*events);
  index.Sync({Snapshot("a", events, /*requests_total=*/5)});
  EXPECT_EQ(index.tier_size("a"), 0);
  EXPECT_EQ(index.size("a"), 4);
  // A new process at the address.
  before.StoreSsd(Chain(5, 2));
  before.Poll(*events);
  index.Sync({Snapshot("a", events, /*requests_total=*/5)});
  ASSERT_EQ(index.tier_size("a"), 2);
  FakeWorker after(8);
  after.Poll(*events);
  index.Sync({Snapshot("a", events, /*requests_total=*/9)});
  EXPECT_EQ(index.tier_size("a"), 0);
  EXPECT_EQ(index.size("a"), 0);
}

// Prompt blocks a worker would load from its tier count for the prefill
// pick at --prefix_routing_tier_credit of blocks in a pool.
TEST(PrefixIndexTiers, APrefillPickCreditsTierBlocksBelowPoolBlocks) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 65; ++i) prompt.push_back(3 + i % 50);  // 4 looked-up blocks of 16.
  auto events_a = std::make_shared<WorkerCacheEvents>();
  auto events_b = std::make_shared<WorkerCacheEvents>();
  const std::vector<WorkerSnapshot> pool = {Snapshot("a", events_a), Snapshot("b", events_b)};
  PromptBlocks blocks(prompt);
  const std::vector<BlockHash> hashes = blocks.Hashes(HashKeyOf(pool[0]));
  ASSERT_EQ(hashes.size(), 4u);
  FakeWorker a(7);
  FakeWorker b(8);
  b.StoreSsd(hashes);
  a.Poll(*events_a);
  b.Poll(*events_b);

  PrefixRouter credited(PrefixRoutingOptions{.load_tokens = 16, .tier_credit = 0.75});
  const PrefixAffinity affinity = credited.Affinity(WorkerRole::kPrefill, pool, blocks, {});
  EXPECT_EQ(affinity.cached_tokens.at("a"), 0);
  EXPECT_EQ(affinity.cached_tokens.at("b"), 48);
  std::optional<Pick> pick = credited.PickPrefill(pool, blocks);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");

  // No credit: a tie, which goes to the first address.
  PrefixRouter uncredited(PrefixRoutingOptions{.load_tokens = 16, .tier_credit = 0});
  pick = uncredited.PickPrefill(pool, blocks);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "a");

  // The same blocks in a's pool beat b's tier.
  a.Store(hashes);
  a.Poll(*events_a);
  pick = credited.PickPrefill(pool, blocks);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "a");
}

TEST(CacheEventsReply, RunsSplitWhereTheTierChangesAndComeBackTagged) {
  CacheEventLog log;
  log.Record(CacheEventKind::kStored, {1, 1});
  log.Record(CacheEventKind::kStored, {1, 2}, CacheTier::kSsd);
  log.Record(CacheEventKind::kStored, {1, 3}, CacheTier::kSsd);
  log.Record(CacheEventKind::kCleared, {}, CacheTier::kSsd);
  log.Record(CacheEventKind::kStored, {1, 4}, CacheTier::kHost);
  v1::StatsRequest request;
  request.set_max_cache_events(100);
  v1::WorkerStats reply;
  CacheEventsReply(log, 5, request, &reply);
  ASSERT_EQ(reply.cache_events_size(), 4);
  EXPECT_EQ(reply.cache_events(0).tier(), v1::CacheEvent::TIER_POOL);
  EXPECT_EQ(reply.cache_events(1).tier(), v1::CacheEvent::TIER_SSD);
  EXPECT_THAT(reply.cache_events(1).hashes_low(), ElementsAre(2u, 3u));
  EXPECT_EQ(reply.cache_events(2).kind(), v1::CacheEvent::CLEARED);
  EXPECT_EQ(reply.cache_events(2).tier(), v1::CacheEvent::TIER_SSD);
  EXPECT_EQ(reply.cache_events(3).tier(), v1::CacheEvent::TIER_HOST);
  ASSERT_OK_AND_ASSIGN(std::vector<CacheEvent> back, CacheEventsFromProto(reply));
  EXPECT_THAT(back, ElementsAre(CacheEvent{CacheEventKind::kStored, {1, 1}, CacheTier::kPool},
                                CacheEvent{CacheEventKind::kStored, {1, 2}, CacheTier::kSsd},
                                CacheEvent{CacheEventKind::kStored, {1, 3}, CacheTier::kSsd},
                                CacheEvent{CacheEventKind::kCleared, {}, CacheTier::kSsd},
                                CacheEvent{CacheEventKind::kStored, {1, 4}, CacheTier::kHost}));
}

// The poller's side of the protocol.

TEST(WorkerCacheEvents, AsksAfterItsCursorAndIgnoresLateAndEpochlessReplies) {
  WorkerCacheEvents events;
  v1::StatsRequest first;
  events.FillRequest(&first);
  EXPECT_EQ(first.cache_epoch(), 0u);
  EXPECT_EQ(first.cache_events_after(), 0u);
  EXPECT_EQ(first.max_cache_events(), WorkerCacheEvents::kMaxPerPoll);

  // A worker that reports no events (no epoch).
  events.Receive(first, v1::WorkerStats());
  EXPECT_FALSE(events.reporting());

  FakeWorker worker(7);
  worker.Store(Chain(1, 3));
  v1::WorkerStats reply;
  CacheEventsReply(worker.log, worker.epoch, first, &reply);
  EXPECT_EQ(reply.cache_epoch(), 7u);
  EXPECT_EQ(reply.cache_events_next(), 3u);
  events.Receive(first, reply);
  v1::StatsRequest second;
  events.FillRequest(&second);
  EXPECT_EQ(second.cache_epoch(), 7u);
  EXPECT_EQ(second.cache_events_after(), 3u);
  // The same reply again (a late answer to the old request) adds nothing.
  events.Receive(first, reply);
  CacheEventBatch read = events.Read(0, 100);
  // The first reply of an epoch clears what came before, in every tier.
  ASSERT_EQ(read.events.size(), 6u);
  EXPECT_EQ(read.events[0], (CacheEvent{CacheEventKind::kCleared, {}, CacheTier::kPool}));
  EXPECT_EQ(read.events[1], (CacheEvent{CacheEventKind::kCleared, {}, CacheTier::kSsd}));
  EXPECT_EQ(read.events[2], (CacheEvent{CacheEventKind::kCleared, {}, CacheTier::kHost}));
  EXPECT_EQ(read.events[5], (CacheEvent{CacheEventKind::kStored, Chain(1, 3)[2]}));
}

TEST(WorkerCacheEvents, AMalformedReplyClearsTheWorker) {
  WorkerCacheEvents events;
  v1::StatsRequest request;
  events.FillRequest(&request);
  v1::WorkerStats reply;
  reply.set_cache_epoch(7);
  reply.set_cache_events_next(1);
  v1::CacheEvent* bad = reply.add_cache_events();
  bad->set_kind(v1::CacheEvent::STORED);
  bad->add_hashes_high(1);  // No low half.
  events.Receive(request, reply);
  CacheEventBatch read = events.Read(0, 100);
  ASSERT_EQ(read.events.size(), 3u);
  for (const CacheEvent& e : read.events) EXPECT_EQ(e.kind, CacheEventKind::kCleared);

  // A tier this router does not know of.
  v1::WorkerStats unknown;
  unknown.set_cache_epoch(7);
  unknown.set_cache_events_next(2);
  v1::CacheEvent* odd = unknown.add_cache_events();
  odd->set_kind(v1::CacheEvent::STORED);
  odd->set_tier(static_cast<v1::CacheEvent::Tier>(9));
  odd->add_hashes_high(1);
  odd->add_hashes_low(1);
  EXPECT_THAT(
      CacheEventsFromProto(unknown).status(),
      ::tandem::testing::StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown tier 9")));
}

// The worker's side.

TEST(CacheEventsReply, CapsTheEventsAndGroupsRunsOfOneKind) {
  BlockPool pool(2);
  CacheEventLog log;
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> b, pool.Allocate(2));
  ASSERT_TRUE(pool.SetCached(b[0], {1, 1}));
  ASSERT_TRUE(pool.SetCached(b[1], {1, 2}));
  pool.Release(b);
  ASSERT_OK(pool.Allocate(2).status());  // Evicts both.
  log.CatchUp(pool.events());

  v1::StatsRequest request;
  request.set_max_cache_events(1 << 30);
  v1::WorkerStats reply;
  CacheEventsReply(log, 5, request, &reply);
  ASSERT_EQ(reply.cache_events_size(), 2);
  EXPECT_EQ(reply.cache_events(0).kind(), v1::CacheEvent::STORED);
  EXPECT_THAT(reply.cache_events(0).hashes_low(), ElementsAre(1u, 2u));
  EXPECT_EQ(reply.cache_events(1).kind(), v1::CacheEvent::EVICTED);
  EXPECT_THAT(reply.cache_events(1).hashes_low(), ElementsAre(2u, 1u));
  EXPECT_EQ(reply.cache_events_next(), 4u);
  EXPECT_FALSE(reply.cache_events_lost());
  ASSERT_OK_AND_ASSIGN(std::vector<CacheEvent> back, CacheEventsFromProto(reply));
  EXPECT_EQ(back.size(), 4u);

  // The server caps what a client asks for.
  CacheEventLog many;
  for (int i = 0; i < kMaxCacheEventsPerReply + 10; ++i) {
    many.Record(CacheEventKind::kStored, {2, static_cast<uint64_t>(i)});
  }
  v1::WorkerStats capped;
  CacheEventsReply(many, 5, request, &capped);
  ASSERT_EQ(capped.cache_events_size(), 1);
  EXPECT_EQ(capped.cache_events(0).hashes_low_size(), kMaxCacheEventsPerReply);
  EXPECT_EQ(capped.cache_events_next(), static_cast<uint64_t>(kMaxCacheEventsPerReply));

  // No count asked: no events, cursor unchanged.
  v1::WorkerStats none;
  CacheEventsReply(many, 5, v1::StatsRequest(), &none);
  EXPECT_THAT(none.cache_events(), IsEmpty());
  EXPECT_EQ(none.cache_epoch(), 5u);

  // A cursor of another epoch counts as 0.
  v1::StatsRequest other;
  other.set_cache_epoch(4);
  other.set_cache_events_after(3);
  other.set_max_cache_events(2);
  v1::WorkerStats fresh;
  CacheEventsReply(log, 5, other, &fresh);
  EXPECT_EQ(fresh.cache_events_next(), 2u);
  EXPECT_FALSE(fresh.cache_events_lost());
}

}  // namespace
}  // namespace tandem::router
