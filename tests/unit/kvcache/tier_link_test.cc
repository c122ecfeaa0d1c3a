#include "common/kvcache/tier_link.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/executor.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/block_pool.h"
#include "common/kvcache/ssd_tier.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

// A pool of 4 blocks of 3 layers of f32 blocks of 4 slots over 8 dims, its
// KV in host memory, over an SSD tier whose I/O the test runs.
class TierLinkTest : public ::testing::Test {
 protected:
  static constexpr int kBlocks = 4;

  void SetUp() override {
    layout_ = KvLayout{
        .n_layers = 3, .num_blocks = kBlocks, .block_size = 4, .kv_dim = 8, .dtype = DType::kF32};
    kv_.assign(layout_.total_bytes(), 0);
    salt_ = BlockHashSalt("model", "f32", 4);
    OpenTier(/*max_pending_writes=*/64);
  }

  void OpenTier(int max_pending_writes) {
    link_.reset();
    tier_.reset();
    const KvTierIdentity id = KvTierIdentity::Of(salt_, layout_);
    auto tier =
        SsdTier::Open({.dir = dir_,
                       .capacity_bytes = 16 * (TierRecordHeader::kBytes + id.payload_bytes()),
                       .max_pending_writes = max_pending_writes},
                      id, &io_);
    ASSERT_OK(tier.status());
    tier_ = std::move(*tier);
    link_ = std::make_unique<TierLink>(tier_.get(), layout_, kv_.data());
    link_->Attach(pool_);
  }

  BlockHash Hash(int i) const { return HashBlocks(salt_, std::vector<int32_t>(4, i), 4, 1)[0]; }

  // Every layer's range of `block`.
  std::vector<uint8_t*> Ranges(int32_t block) {
    std::vector<uint8_t*> ranges;
    for (int l = 0; l < layout_.n_layers; ++l) {
      ranges.push_back(kv_.data() + layout_.BlockOffset(l, block) * layout_.element_bytes());
    }
    return ranges;
  }
  void Fill(int32_t block, uint8_t seed) {
    int l = 0;
    for (uint8_t* r : Ranges(block)) {
      for (size_t i = 0; i < layout_.block_bytes(); ++i) r[i] = static_cast<uint8_t>(seed + l + i);
      ++l;
    }
  }
  bool Holds(int32_t block, uint8_t seed) {
    int l = 0;
    for (uint8_t* r : Ranges(block)) {
      for (size_t i = 0; i < layout_.block_bytes(); ++i) {
        if (r[i] != static_cast<uint8_t>(seed + l + i)) return false;
      }
      ++l;
    }
    return true;
  }
  void Poison(int32_t block) {
    for (uint8_t* r : Ranges(block)) std::memset(r, 0xEE, layout_.block_bytes());
  }
  bool Poisoned(int32_t block) {
    for (uint8_t* r : Ranges(block)) {
      for (size_t i = 0; i < layout_.block_bytes(); ++i) {
        if (r[i] != 0xEE) return false;
      }
    }
    return true;
  }

  // Caches blocks with hashes `first`.. (each filled with its own seed),
  // releases them, and evicts them all by allocating the whole pool.
  void CacheAndEvict(int first, int n) {
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> blocks, pool_.Allocate(n));
    for (int i = 0; i < n; ++i) {
      Fill(blocks[i], static_cast<uint8_t>(first + i));
      ASSERT_TRUE(pool_.SetCached(blocks[i], Hash(first + i)));
    }
    pool_.Release(blocks);
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> all, pool_.Allocate(kBlocks));
    pool_.Release(all);
  }

  std::string dir_ = absl::StrCat(::tandem::testing::TempDir(), "/tier-link-",
                                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
  KvLayout layout_;
  std::vector<uint8_t> kv_;
  BlockHash salt_;
  BlockPool pool_{kBlocks};
  FakeClock clock_;
  ManualExecutor io_{&clock_};
  std::unique_ptr<SsdTier> tier_;
  std::unique_ptr<TierLink> link_;
};

TEST_F(TierLinkTest, EvictedBlocksSpillAndFetchBackIntoOtherBlocks) {
  CacheAndEvict(10, 2);
  EXPECT_EQ(link_->stats().spilled, 2u);
  EXPECT_EQ(link_->Probe(std::vector<BlockHash>{Hash(10), Hash(11)}), 0);  // still being written
  io_.RunDue();
  const std::vector<BlockHash> hashes{Hash(10), Hash(11), Hash(12)};
  EXPECT_EQ(link_->Probe(hashes), 2);

  // Into blocks 3 and 2, which held other bytes.
  Poison(3);
  Poison(2);
  TierLink::Fetch fetch =
      link_->Start(std::span(hashes).first(2), std::vector<int32_t>{3, 2}, clock_.Now());
  EXPECT_TRUE(fetch.active());
  io_.RunDue();
  EXPECT_TRUE(link_->Poll(fetch, clock_.Now()));
  EXPECT_FALSE(fetch.active());
  EXPECT_EQ(fetch.loaded(), 2);
  EXPECT_TRUE(Holds(3, 10));
  EXPECT_TRUE(Holds(2, 11));
  EXPECT_EQ(link_->stats().blocks_fetched, 2u);
  EXPECT_EQ(link_->stats().blocks_loaded, 2u);
  EXPECT_EQ(tier_->stats().hits, 2u);
}

TEST_F(TierLinkTest, FlushSpillsNothing) {
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> blocks, pool_.Allocate(1));
  ASSERT_TRUE(pool_.SetCached(blocks[0], Hash(1)));
  pool_.Release(blocks);
  EXPECT_EQ(pool_.Flush(), 1);
  EXPECT_EQ(link_->stats().spilled + link_->stats().spills_refused, 0u);
}

TEST_F(TierLinkTest, OnlyTheLeadingVerifiedBlocksCount) {
  CacheAndEvict(20, 3);
  io_.RunDue();
  // The middle record's payload changes on disk.
  const std::string path = tier_->RecordPath(Hash(21));
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(TierRecordHeader::kBytes + 5);
    f.put('\x7f');
  }
  Poison(0);
  Poison(1);
  TierLink::Fetch fetch = link_->Start(std::vector<BlockHash>{Hash(20), Hash(21), Hash(22)},
                                       std::vector<int32_t>{0, 1, 2}, absl::InfiniteFuture());
  io_.RunDue();
  EXPECT_TRUE(link_->Poll(fetch, clock_.Now()));
  EXPECT_EQ(fetch.loaded(), 1);
  EXPECT_TRUE(Holds(0, 20));
  EXPECT_TRUE(Poisoned(1));  // never written with unverified bytes
  EXPECT_EQ(link_->stats().blocks_missed, 1u);
  EXPECT_EQ(tier_->stats().misses[static_cast<int>(TierMiss::kCorrupt)], 1u);
}

TEST_F(TierLinkTest, AFetchWaitsForItsHeadThenForNothingPastItsDeadline) {
  CacheAndEvict(30, 2);
  io_.RunDue();
  Poison(0);
  Poison(1);
  const absl::Time deadline = clock_.Now() + absl::Milliseconds(5);
  TierLink::Fetch fetch = link_->Start(std::vector<BlockHash>{Hash(30), Hash(31)},
                                       std::vector<int32_t>{0, 1}, deadline);
  EXPECT_FALSE(link_->Poll(fetch, clock_.Now()));  // the reads are queued, not run
  EXPECT_TRUE(fetch.active());
  EXPECT_TRUE(link_->Poll(fetch, deadline));
  EXPECT_EQ(fetch.loaded(), 0);
  EXPECT_EQ(link_->stats().blocks_late, 2u);
  io_.RunDue();  // the reads run now, and must not land
  EXPECT_TRUE(Poisoned(0));
  EXPECT_TRUE(Poisoned(1));
}

TEST_F(TierLinkTest, CancelKeepsWhatHadArrived) {
  CacheAndEvict(40, 2);
  io_.RunDue();
  TierLink::Fetch fetch = link_->Start(std::vector<BlockHash>{Hash(40), Hash(41)},
                                       std::vector<int32_t>{0, 1}, absl::InfiniteFuture());
  io_.RunDue();
  link_->Cancel(fetch);
  EXPECT_FALSE(fetch.active());
  EXPECT_EQ(fetch.loaded(), 2);
  EXPECT_TRUE(Holds(0, 40));
  EXPECT_TRUE(Holds(1, 41));
  link_->Cancel(fetch);  // a second cancel does nothing
  EXPECT_EQ(link_->stats().blocks_loaded, 2u);
}

TEST_F(TierLinkTest, ATierBehindOnWritesRefusesTheSpill) {
  OpenTier(/*max_pending_writes=*/1);
  CacheAndEvict(50, 2);
  EXPECT_EQ(link_->stats().spilled, 1u);
  EXPECT_EQ(link_->stats().spills_refused, 1u);
  io_.RunDue();
  // The pool evicts a released run last block first: 51 went first.
  EXPECT_EQ(link_->Probe(std::vector<BlockHash>{Hash(51)}), 1);
  EXPECT_EQ(link_->Probe(std::vector<BlockHash>{Hash(50)}), 0);
}

TEST_F(TierLinkTest, AnEmptyFetchIsOverAtOnce) {
  TierLink::Fetch fetch = link_->Start({}, {}, absl::InfiniteFuture());
  EXPECT_FALSE(fetch.active());
  EXPECT_TRUE(link_->Poll(fetch, clock_.Now()));
  EXPECT_EQ(fetch.loaded(), 0);
  EXPECT_EQ(link_->stats().fetches, 0u);
}

TEST_F(TierLinkTest, TheTiersEventsJoinThePoolsTaggedOnceWritten) {
  CacheAndEvict(60, 2);
  const uint64_t pool_events = pool_.events().last();
  link_->ForwardEvents();  // Nothing readable in the tier yet.
  EXPECT_EQ(pool_.events().last(), pool_events);
  io_.RunDue();
  link_->ForwardEvents();
  const CacheEventBatch batch = pool_.events().Read(pool_events, 100);
  ASSERT_EQ(batch.events.size(), 2u);
  // The pool evicts a released run last block first.
  EXPECT_EQ(batch.events[0], (CacheEvent{CacheEventKind::kStored, Hash(61), CacheTier::kSsd}));
  EXPECT_EQ(batch.events[1], (CacheEvent{CacheEventKind::kStored, Hash(60), CacheTier::kSsd}));
  link_->ForwardEvents();  // Each event once.
  EXPECT_EQ(pool_.events().last(), pool_events + 2);
}

// A tier whose events the test sets; nothing else of it is used.
class EventsOnlyTier final : public KvTier {
 public:
  std::string_view name() const override { return "events-only"; }
  CacheTier level() const override { return CacheTier::kSsd; }
  const KvTierIdentity& identity() const override { return identity_; }
  bool Contains(const BlockHash&) const override { return false; }
  bool Store(const BlockHash&, std::span<const std::span<const uint8_t>>) override { return false; }
  uint64_t Load(const BlockHash&, std::span<const std::span<uint8_t>>) override { return 0; }
  LoadState Poll(uint64_t) override {
    LoadState state;
    state.done = true;
    return state;
  }
  void Cancel(uint64_t) override {}
  KvTierStats stats() const override { return {}; }
  CacheEventBatch EventsAfter(uint64_t cursor, int max_events) const override {
    return log.Read(cursor, max_events);
  }

  CacheEventRing log{4};

 private:
  KvTierIdentity identity_;
};

TEST(TierLinkEvents, EventsTheTierDroppedUnreadClearTheTierFirst) {
  const KvLayout layout{
      .n_layers = 1, .num_blocks = 2, .block_size = 4, .kv_dim = 8, .dtype = DType::kF32};
  std::vector<uint8_t> kv(layout.total_bytes());
  EventsOnlyTier tier;
  BlockPool pool(2);
  TierLink link(&tier, layout, kv.data());
  link.ForwardEvents();  // Not attached: nothing to forward to.
  link.Attach(pool);
  // Dropped before the first read: there was nothing to forget yet.
  for (uint64_t n = 1; n <= 6; ++n) tier.log.Record(CacheEventKind::kStored, {n, n});
  link.ForwardEvents();
  CacheEventBatch batch = pool.events().Read(0, 100);
  ASSERT_EQ(batch.events.size(), 4u);
  EXPECT_EQ(batch.events[0], (CacheEvent{CacheEventKind::kStored, {3, 3}, CacheTier::kSsd}));
  // Dropped between two reads: the router must forget the tier's blocks.
  for (uint64_t n = 7; n <= 12; ++n) tier.log.Record(CacheEventKind::kEvicted, {n, n});
  link.ForwardEvents();
  batch = pool.events().Read(4, 100);
  ASSERT_EQ(batch.events.size(), 5u);
  EXPECT_EQ(batch.events[0], (CacheEvent{CacheEventKind::kCleared, {}, CacheTier::kSsd}));
  EXPECT_EQ(batch.events[1], (CacheEvent{CacheEventKind::kEvicted, {9, 9}, CacheTier::kSsd}));
}

}  // namespace
}  // namespace tandem
