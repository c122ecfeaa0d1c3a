#include "common/kvcache/host_tier.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/executor.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/block_pool.h"
#include "common/kvcache/ssd_tier.h"
#include "common/kvcache/tier_link.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

// 3 layers of f32 blocks of 4 slots over 8 dims: 128 bytes a layer.
KvLayout Layout(int blocks = 1) {
  return KvLayout{
      .n_layers = 3, .num_blocks = blocks, .block_size = 4, .kv_dim = 8, .dtype = DType::kF32};
}
KvTierIdentity Identity() { return KvTierIdentity::Of(BlockHashSalt("model", "f32", 4), Layout()); }

BlockHash Hash(int i) { return HashBlocks(Identity().salt, std::vector<int32_t>(4, i), 4, 1)[0]; }

// A block's layers, each byte a function of (seed, layer, offset); seed 0
// is poison.
struct Block {
  explicit Block(int seed) {
    const KvTierIdentity id = Identity();
    const size_t per = id.payload_bytes() / static_cast<size_t>(id.n_layers);
    for (int l = 0; l < id.n_layers; ++l) {
      bytes.emplace_back(per, 0xEE);
      if (seed == 0) continue;
      for (size_t i = 0; i < per; ++i)
        bytes.back()[i] = static_cast<uint8_t>(seed * 31 + l * 7 + i);
    }
  }
  std::vector<std::span<const uint8_t>> in() const { return {bytes.begin(), bytes.end()}; }
  std::vector<std::span<uint8_t>> out() { return {bytes.begin(), bytes.end()}; }
  std::vector<std::vector<uint8_t>> bytes;
};

class HostTierTest : public ::testing::Test {
 protected:
  // A host tier of `records` blocks, over an SSD tier when `ssd`.
  std::unique_ptr<HostTier> Make(uint64_t records, bool ssd = false) {
    std::unique_ptr<KvTier> below;
    if (ssd) {
      auto disk = SsdTier::Open(
          {.dir = dir_,
           .capacity_bytes = 16 * (TierRecordHeader::kBytes + Identity().payload_bytes())},
          Identity(), &io_);
      EXPECT_OK(disk.status());
      ssd_ = disk->get();
      below = std::move(*disk);
    }
    auto tier = HostTier::Create({.capacity_bytes = records * Identity().payload_bytes()},
                                 Identity(), &io_, std::move(below));
    EXPECT_OK(tier.status());
    return tier.ok() ? std::move(*tier) : nullptr;
  }
  // Loads block i, running the copies; the state and what arrived.
  KvTier::LoadState Get(KvTier& tier, int i, Block* into) {
    const uint64_t ticket = tier.Load(Hash(i), into->out());
    io_.RunDue();
    return tier.Poll(ticket);
  }
  std::vector<CacheEvent> Events(const KvTier& tier) { return tier.EventsAfter(0, 100).events; }

  std::string dir_ = absl::StrCat(::tandem::testing::TempDir(), "/host-tier-",
                                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
  FakeClock clock_;
  ManualExecutor io_{&clock_};
  SsdTier* ssd_ = nullptr;
};

TEST_F(HostTierTest, StoredBlockLoadsBackVerifiedOnTheExecutor) {
  auto tier = Make(4);
  ASSERT_TRUE(tier->Store(Hash(1), Block(1).in()));
  EXPECT_TRUE(tier->Contains(Hash(1))) << "readable at once: the copy is made in Store";
  EXPECT_FALSE(tier->Store(Hash(1), Block(1).in())) << "held already";

  Block got(0);
  const uint64_t ticket = tier->Load(Hash(1), got.out());
  EXPECT_FALSE(tier->Poll(ticket).done) << "the check and copy run on the executor";
  EXPECT_EQ(got.bytes, Block(0).bytes);
  io_.RunDue();
  const KvTier::LoadState state = tier->Poll(ticket);
  EXPECT_TRUE(state.done && state.hit);
  EXPECT_EQ(got.bytes, Block(1).bytes);

  const KvTierStats stats = tier->stats();
  EXPECT_EQ(stats.stores, 1u);
  EXPECT_EQ(stats.stores_refused, 1u);
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(stats.records, 1u);
  EXPECT_EQ(stats.used_bytes, Identity().payload_bytes());
  EXPECT_EQ(stats.bytes_read, Identity().payload_bytes());
  EXPECT_THAT(Events(*tier), ::testing::ElementsAre(CacheEvent{CacheEventKind::kStored, Hash(1)}));

  Block absent(0);
  const KvTier::LoadState miss = Get(*tier, 9, &absent);
  EXPECT_TRUE(miss.done && !miss.hit);
  EXPECT_EQ(miss.miss, TierMiss::kAbsent);
  EXPECT_EQ(absent.bytes, Block(0).bytes);
}

TEST_F(HostTierTest, LeastRecentlyUsedGoesFirstAndDownToTheSsd) {
  auto tier = Make(2, /*ssd=*/true);
  ASSERT_TRUE(tier->Store(Hash(1), Block(1).in()));
  ASSERT_TRUE(tier->Store(Hash(2), Block(2).in()));
  Block touched(0);
  ASSERT_TRUE(Get(*tier, 1, &touched).hit);  // 1 is now the most recent.
  ASSERT_TRUE(tier->Store(Hash(3), Block(3).in()));
  io_.RunDue();  // The SSD writes block 2.
  EXPECT_EQ(tier->stats().evictions, 1u);
  EXPECT_EQ(tier->stats().records, 2u);
  EXPECT_TRUE(ssd_->Contains(Hash(2)));
  EXPECT_FALSE(ssd_->Contains(Hash(1)));
  EXPECT_TRUE(tier->Contains(Hash(2))) << "held below";

  // Block 2 comes back from the SSD through the host tier's ticket.
  Block got(0);
  const KvTier::LoadState state = Get(*tier, 2, &got);
  EXPECT_TRUE(state.done && state.hit);
  EXPECT_EQ(got.bytes, Block(2).bytes);
  EXPECT_EQ(tier->stats().misses[static_cast<int>(TierMiss::kAbsent)], 1u);
  EXPECT_EQ(ssd_->stats().hits, 1u);

  EXPECT_THAT(Events(*tier), ::testing::ElementsAre(CacheEvent{CacheEventKind::kStored, Hash(1)},
                                                    CacheEvent{CacheEventKind::kStored, Hash(2)},
                                                    CacheEvent{CacheEventKind::kStored, Hash(3)},
                                                    CacheEvent{CacheEventKind::kEvicted, Hash(2)}));
  EXPECT_THAT(Events(*ssd_), ::testing::ElementsAre(CacheEvent{CacheEventKind::kStored, Hash(2)}));
}

TEST_F(HostTierTest, ADamagedRecordIsDroppedAndTheSsdCopyServesInstead) {
  auto tier = Make(1, /*ssd=*/true);
  ASSERT_TRUE(tier->Store(Hash(1), Block(1).in()));
  ASSERT_TRUE(tier->Store(Hash(2), Block(2).in()));  // 1 goes down to the SSD.
  io_.RunDue();
  // The same hash stored again: host memory holds it too, then goes bad.
  ASSERT_TRUE(tier->Store(Hash(1), Block(1).in()));
  ASSERT_TRUE(tier->DamageForTest(Hash(1)));

  Block got(0);
  const uint64_t ticket = tier->Load(Hash(1), got.out());
  io_.RunDue();  // The host check fails; the SSD read is queued.
  io_.RunDue();
  const KvTier::LoadState state = tier->Poll(ticket);
  EXPECT_TRUE(state.done && state.hit);
  EXPECT_EQ(got.bytes, Block(1).bytes) << "the SSD's copy, never the damaged one";
  EXPECT_EQ(tier->stats().misses[static_cast<int>(TierMiss::kCorrupt)], 1u);
  EXPECT_FALSE(tier->DamageForTest(Hash(1))) << "the damaged record is gone";
}

TEST_F(HostTierTest, ADamagedRecordWithNothingBelowIsACorruptMissThatWritesNothing) {
  auto tier = Make(2);
  ASSERT_TRUE(tier->Store(Hash(1), Block(1).in()));
  ASSERT_TRUE(tier->DamageForTest(Hash(1)));
  Block got(0);
  const KvTier::LoadState state = Get(*tier, 1, &got);
  EXPECT_TRUE(state.done && !state.hit);
  EXPECT_EQ(state.miss, TierMiss::kCorrupt);
  EXPECT_EQ(got.bytes, Block(0).bytes);
  EXPECT_FALSE(tier->Contains(Hash(1)));
  EXPECT_EQ(Events(*tier).back(), (CacheEvent{CacheEventKind::kEvicted, Hash(1)}));
}

TEST_F(HostTierTest, CancelledAndOrphanedLoadsNeverWriteTheirDestination) {
  Block got(0);
  {
    auto tier = Make(2);
    ASSERT_TRUE(tier->Store(Hash(1), Block(1).in()));
    const uint64_t ticket = tier->Load(Hash(1), got.out());
    tier->Cancel(ticket);
    EXPECT_EQ(tier->stats().misses[static_cast<int>(TierMiss::kCancelled)], 1u);
    tier->Load(Hash(1), got.out());  // Still queued when the tier goes.
  }
  EXPECT_EQ(io_.RunDue(), 2);
  EXPECT_EQ(got.bytes, Block(0).bytes);
}

TEST_F(HostTierTest, CreateSaysWhatToChange) {
  EXPECT_THAT(HostTier::Create({.capacity_bytes = 100}, Identity(), &io_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--kv_host_tier_gib")));
  KvLayout other = Layout();
  other.kv_dim = 16;
  auto disk = SsdTier::Open({.dir = dir_, .capacity_bytes = 1 << 20},
                            KvTierIdentity::Of(Identity().salt, other), &io_);
  ASSERT_OK(disk.status());
  EXPECT_THAT(HostTier::Create({.capacity_bytes = 1 << 20}, Identity(), &io_, std::move(*disk)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("another layout")));
}

// The pool spills into host memory, host memory into the SSD; the link
// forwards both tiers' events, each tagged with its tier.
TEST_F(HostTierTest, TheLinkForwardsEveryTiersEventsTagged) {
  constexpr int kBlocks = 2;
  const KvLayout layout = Layout(kBlocks);
  std::vector<uint8_t> kv(layout.total_bytes(), 7);
  BlockPool pool(kBlocks);
  auto tier = Make(1, /*ssd=*/true);
  TierLink link(tier.get(), layout, kv.data());
  link.Attach(pool);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> blocks, pool.Allocate(kBlocks));
  ASSERT_TRUE(pool.SetCached(blocks[0], Hash(1)));
  ASSERT_TRUE(pool.SetCached(blocks[1], Hash(2)));
  pool.Release(blocks);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> all, pool.Allocate(kBlocks));  // Both spill.
  pool.Release(all);
  io_.RunDue();
  const uint64_t before = pool.events().last();
  link.ForwardEvents();
  const std::vector<CacheEvent> got = pool.events().Read(before, 100).events;
  // The block spilled first went on down when the second came.
  ASSERT_EQ(got.size(), 4u);
  const BlockHash first = got[0].hash, second = first == Hash(1) ? Hash(2) : Hash(1);
  EXPECT_THAT(got, ::testing::UnorderedElementsAre(
                       CacheEvent{CacheEventKind::kStored, first, CacheTier::kHost},
                       CacheEvent{CacheEventKind::kStored, second, CacheTier::kHost},
                       CacheEvent{CacheEventKind::kEvicted, first, CacheTier::kHost},
                       CacheEvent{CacheEventKind::kStored, first, CacheTier::kSsd}));
  EXPECT_EQ(link.Probe(std::vector<BlockHash>{Hash(1), Hash(2)}), 2);
}

}  // namespace
}  // namespace tandem
