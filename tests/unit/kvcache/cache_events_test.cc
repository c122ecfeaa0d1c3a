// The prefix cache's event ring: cursors, bounds, lost events, and the
// events a BlockPool records as blocks are cached, evicted and flushed.
#include "common/kvcache/cache_events.h"

#include <cstdint>
#include <vector>

#include "common/kvcache/block_hash.h"
#include "common/kvcache/block_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

BlockHash H(uint64_t n) { return BlockHash{n, ~n}; }
CacheEvent Stored(uint64_t n) { return CacheEvent{CacheEventKind::kStored, H(n)}; }
CacheEvent Evicted(uint64_t n) { return CacheEvent{CacheEventKind::kEvicted, H(n)}; }
const CacheEvent kCleared{CacheEventKind::kCleared, {}};

TEST(CacheEventRing, AReaderGetsTheEventsAfterItsCursorAtMostMaxAtATime) {
  CacheEventRing ring(8);
  EXPECT_EQ(ring.last(), 0u);
  CacheEventBatch none = ring.Read(0, 10);
  EXPECT_THAT(none.events, IsEmpty());
  EXPECT_EQ(none.next, 0u);
  EXPECT_FALSE(none.lost);

  for (uint64_t n = 1; n <= 5; ++n) ring.Record(CacheEventKind::kStored, H(n));
  EXPECT_EQ(ring.last(), 5u);
  CacheEventBatch a = ring.Read(0, 2);
  EXPECT_THAT(a.events, ElementsAre(Stored(1), Stored(2)));
  EXPECT_EQ(a.next, 2u);
  EXPECT_FALSE(a.lost);
  CacheEventBatch b = ring.Read(a.next, 100);
  EXPECT_THAT(b.events, ElementsAre(Stored(3), Stored(4), Stored(5)));
  EXPECT_EQ(b.next, 5u);
  // Nothing new: the cursor stays.
  CacheEventBatch c = ring.Read(b.next, 100);
  EXPECT_THAT(c.events, IsEmpty());
  EXPECT_EQ(c.next, 5u);
  EXPECT_FALSE(c.lost);
  // Asking for none gives none and keeps the cursor.
  EXPECT_THAT(ring.Read(0, 0).events, IsEmpty());
  EXPECT_EQ(ring.Read(3, 0).next, 3u);
}

TEST(CacheEventRing, AReaderBehindTheRingIsToldItLostEventsAndRestartsAtTheOldest) {
  CacheEventRing ring(4);
  for (uint64_t n = 1; n <= 10; ++n) ring.Record(CacheEventKind::kStored, H(n));
  EXPECT_EQ(ring.first(), 7u);
  EXPECT_EQ(ring.last(), 10u);
  // Events 3..6 are gone.
  CacheEventBatch behind = ring.Read(2, 100);
  EXPECT_TRUE(behind.lost);
  EXPECT_THAT(behind.events, ElementsAre(Stored(7), Stored(8), Stored(9), Stored(10)));
  EXPECT_EQ(behind.next, 10u);
  // A reader right at the edge lost nothing.
  CacheEventBatch edge = ring.Read(6, 2);
  EXPECT_FALSE(edge.lost);
  EXPECT_THAT(edge.events, ElementsAre(Stored(7), Stored(8)));
  // A cursor past the newest event is of another numbering.
  CacheEventBatch future = ring.Read(50, 1);
  EXPECT_TRUE(future.lost);
  EXPECT_THAT(future.events, ElementsAre(Stored(7)));
  EXPECT_EQ(future.next, 7u);
}

TEST(CacheEventRing, CatchUpCopiesTheNewEventsWithTheirNumbers) {
  CacheEventRing source(4);
  CacheEventRing copy(4);
  source.Record(CacheEventKind::kStored, H(1));
  source.Record(CacheEventKind::kEvicted, H(1));
  copy.CatchUp(source);
  EXPECT_EQ(copy.last(), 2u);
  EXPECT_THAT(copy.Read(0, 10).events, ElementsAre(Stored(1), Evicted(1)));
  copy.CatchUp(source);  // Nothing new: nothing copied twice.
  EXPECT_EQ(copy.last(), 2u);
  source.Record(CacheEventKind::kCleared);
  copy.CatchUp(source);
  EXPECT_THAT(copy.Read(2, 10).events, ElementsAre(kCleared));
}

TEST(CacheEventRing, ACopyThatMissedEventsMakesItsReadersLoseThemToo) {
  CacheEventRing source(4);
  CacheEventRing copy(4);
  source.Record(CacheEventKind::kStored, H(1));
  copy.CatchUp(source);
  // Events 2..5 are gone from the source before the copy catches up.
  for (uint64_t n = 2; n <= 9; ++n) source.Record(CacheEventKind::kStored, H(n));
  copy.CatchUp(source);
  EXPECT_EQ(copy.first(), 6u);
  EXPECT_EQ(copy.last(), 9u);
  CacheEventBatch read = copy.Read(1, 100);
  EXPECT_TRUE(read.lost);
  EXPECT_THAT(read.events, ElementsAre(Stored(6), Stored(7), Stored(8), Stored(9)));
}

TEST(CacheEventLog, ReadsWhatWasRecordedOrCaughtUp) {
  CacheEventLog log(16);
  log.Record(CacheEventKind::kStored, H(3));
  EXPECT_EQ(log.last(), 1u);
  EXPECT_THAT(log.Read(0, 10).events, ElementsAre(Stored(3)));
}

// BlockPool's events.

TEST(BlockPoolEvents, CachingABlockRecordsStoredAndEvictingItForReuseRecordsEvicted) {
  BlockPool pool(2);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> blocks, pool.Allocate(2));
  EXPECT_TRUE(pool.SetCached(blocks[0], H(1)));
  EXPECT_TRUE(pool.SetCached(blocks[1], H(2)));
  // Already cached: no second event.
  EXPECT_FALSE(pool.SetCached(blocks[0], H(7)));
  EXPECT_THAT(pool.events().Read(0, 10).events, ElementsAre(Stored(1), Stored(2)));
  pool.Release(blocks);
  // Released last block first: block 1 (hash 2) goes first.
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> again, pool.Allocate(1));
  EXPECT_THAT(pool.events().Read(2, 10).events, ElementsAre(Evicted(2)));
  EXPECT_EQ(pool.evictions(), 1u);
  // The one still cached is found; evicting it is the next event.
  EXPECT_EQ(pool.Lookup(H(1)), blocks[0]);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> last, pool.Allocate(1));
  EXPECT_THAT(pool.events().Read(3, 10).events, ElementsAre(Evicted(1)));
}

TEST(BlockPoolEvents, AFlushRecordsClearedThenTheBlocksStillCachedInUse) {
  BlockPool pool(4);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> blocks, pool.Allocate(3));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.SetCached(blocks[i], H(i + 1)));
  // Blocks 0 and 1 are released (evictable); block 2 stays in use.
  pool.Release(std::vector<int32_t>{blocks[0], blocks[1]});
  const uint64_t before = pool.events().last();
  EXPECT_EQ(pool.Flush(), 2);
  EXPECT_EQ(pool.evictions(), 2u);
  CacheEventBatch flushed = pool.events().Read(before, 10);
  EXPECT_THAT(flushed.events, ElementsAre(kCleared, Stored(3)));
  // A flush that frees nothing records nothing.
  const uint64_t after = pool.events().last();
  EXPECT_EQ(pool.Flush(), 0);
  EXPECT_EQ(pool.events().last(), after);
}

TEST(BlockPoolEvents, TheRingIsBoundedAndAReaderBehindIsToldSo) {
  BlockPool pool(1, /*event_capacity=*/4);
  for (uint64_t n = 1; n <= 5; ++n) {
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> b, pool.Allocate(1));
    ASSERT_TRUE(pool.SetCached(b[0], H(n)));
    pool.Release(b);
  }
  // Stored 1, then (evicted n-1, stored n) per block: 9 events, 4 kept.
  EXPECT_EQ(pool.events().last(), 9u);
  CacheEventBatch read = pool.events().Read(0, 100);
  EXPECT_TRUE(read.lost);
  EXPECT_THAT(read.events, ElementsAre(Evicted(3), Stored(4), Evicted(4), Stored(5)));
  EXPECT_EQ(read.next, 9u);
}

}  // namespace
}  // namespace tandem
