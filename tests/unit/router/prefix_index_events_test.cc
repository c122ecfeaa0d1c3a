// PrefixIndex fed with the cache events the workers report: the worker's
// reply as the registry's poller receives it (WorkerCacheEvents), the
// worker's side of the same protocol (CacheEventsReply over a BlockPool's
// events), and what the index then matches. Hashes are made up.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/kvcache/block_pool.h"
#include "common/kvcache/cache_events.h"
#include "common/worker/cache_events_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/prefix_index.h"
#include "router/worker_cache_events.h"
#include "tests/testing/status_matchers.h"

namespace tandem::router {
namespace {

using ::testing::ElementsAre;
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
  // The first reply of an epoch clears what came before.
  ASSERT_EQ(read.events.size(), 4u);
  EXPECT_EQ(read.events[0].kind, CacheEventKind::kCleared);
  EXPECT_EQ(read.events[3], (CacheEvent{CacheEventKind::kStored, Chain(1, 3)[2]}));
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
  ASSERT_EQ(read.events.size(), 1u);
  EXPECT_EQ(read.events[0].kind, CacheEventKind::kCleared);
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
