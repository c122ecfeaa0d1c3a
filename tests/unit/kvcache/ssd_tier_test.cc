#include "common/kvcache/ssd_tier.h"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/executor.h"
#include "common/kvcache/block_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

// 3 layers of f32 blocks of 4 slots over 8 dims: 256 bytes a layer.
KvTierIdentity Identity(std::string_view model = "model-a", DType dtype = DType::kF32) {
  KvLayout layout{.n_layers = 3, .num_blocks = 1, .block_size = 4, .kv_dim = 8, .dtype = dtype};
  return KvTierIdentity::Of(BlockHashSalt(model, DTypeName(dtype), 4), layout);
}

BlockHash Hash(int i) { return HashBlocks(Identity().salt, std::vector<int32_t>(4, i), 4, 1)[0]; }

// A block's layers, each byte a function of (seed, layer, offset).
struct Block {
  Block(const KvTierIdentity& id, int seed) {
    const size_t per = id.payload_bytes() / static_cast<size_t>(id.n_layers);
    for (int l = 0; l < id.n_layers; ++l) {
      bytes.emplace_back(per);
      for (size_t i = 0; i < per; ++i)
        bytes.back()[i] = static_cast<uint8_t>(seed * 31 + l * 7 + i);
    }
  }
  explicit Block(const KvTierIdentity& id) : Block(id, 0) {
    for (auto& layer : bytes) std::fill(layer.begin(), layer.end(), 0xEE);  // poison
  }
  std::vector<std::span<const uint8_t>> in() const { return {bytes.begin(), bytes.end()}; }
  std::vector<std::span<uint8_t>> out() { return {bytes.begin(), bytes.end()}; }
  std::vector<std::vector<uint8_t>> bytes;
};

class SsdTierTest : public ::testing::Test {
 protected:
  std::unique_ptr<SsdTier> Open(uint64_t records = 16, const KvTierIdentity& id = Identity()) {
    SsdTierOptions options{
        .dir = dir_, .capacity_bytes = records * (TierRecordHeader::kBytes + id.payload_bytes())};
    auto tier = SsdTier::Open(options, id, &io_);
    EXPECT_OK(tier.status());
    return tier.ok() ? std::move(*tier) : nullptr;
  }
  void Put(SsdTier& tier, int i) {
    ASSERT_TRUE(tier.Store(Hash(i), Block(tier.identity(), i).in()));
    io_.RunDue();
  }
  // Loads block i, running the I/O; the state and what arrived.
  KvTier::LoadState Get(SsdTier& tier, int i, Block* into) {
    const uint64_t ticket = tier.Load(Hash(i), into->out());
    io_.RunDue();
    return tier.Poll(ticket);
  }
  void Rewrite(const std::string& path, const std::function<void(std::string&)>& edit) {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    in.close();
    edit(bytes);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }

  std::string dir_ = absl::StrCat(::tandem::testing::TempDir(), "/ssd-",
                                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
  FakeClock clock_;
  ManualExecutor io_{&clock_};
};

TEST_F(SsdTierTest, StoredBlockLoadsBackVerified) {
  auto tier = Open();
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(tier->Store(Hash(1), Block(tier->identity(), 1).in()));
  EXPECT_FALSE(tier->Contains(Hash(1))) << "readable only once written";
  EXPECT_FALSE(tier->Store(Hash(1), Block(tier->identity(), 1).in())) << "already being written";
  io_.RunDue();
  EXPECT_TRUE(tier->Contains(Hash(1)));
  EXPECT_TRUE(fs::exists(tier->RecordPath(Hash(1))));

  Block got(tier->identity());
  const uint64_t ticket = tier->Load(Hash(1), got.out());
  EXPECT_FALSE(tier->Poll(ticket).done) << "the read runs on the I/O executor";
  io_.RunDue();
  const KvTier::LoadState state = tier->Poll(ticket);
  EXPECT_TRUE(state.done);
  EXPECT_TRUE(state.hit);
  EXPECT_EQ(got.bytes, Block(tier->identity(), 1).bytes);

  const KvTierStats stats = tier->stats();
  EXPECT_EQ(stats.stores, 1u);
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(stats.records, 1u);
  EXPECT_EQ(stats.used_bytes, TierRecordHeader::kBytes + tier->identity().payload_bytes());
  const CacheEventBatch events = tier->EventsAfter(0, 10);
  ASSERT_EQ(events.events.size(), 1u);
  EXPECT_EQ(events.events[0], (CacheEvent{CacheEventKind::kStored, Hash(1)}));
}

TEST_F(SsdTierTest, AbsentAndWrongShapeAreCleanMisses) {
  auto tier = Open();
  Block got(tier->identity());
  const KvTier::LoadState absent = Get(*tier, 7, &got);
  EXPECT_TRUE(absent.done);
  EXPECT_FALSE(absent.hit);
  EXPECT_EQ(absent.miss, TierMiss::kAbsent);
  EXPECT_EQ(got.bytes, Block(tier->identity()).bytes) << "a miss writes nothing";

  Block wrong(Identity(), 2);
  wrong.bytes.pop_back();
  EXPECT_FALSE(tier->Store(Hash(2), wrong.in()));
  EXPECT_EQ(tier->stats().stores_refused, 1u);
}

TEST_F(SsdTierTest, SurvivesAReopenInItsEvictionOrder) {
  {
    auto tier = Open(/*records=*/2);
    Put(*tier, 1);
    Put(*tier, 2);
  }
  // Reopened with room for one: the older record goes.
  fs::last_write_time(absl::StrCat(dir_, "/", Hash(1).ToString(), ".kvb"),
                      fs::file_time_type::clock::now() - std::chrono::hours(1));
  auto tier = Open(/*records=*/1);
  EXPECT_EQ(tier->open_report().evicted_over_capacity, 1u);
  EXPECT_FALSE(tier->Contains(Hash(1)));
  ASSERT_TRUE(tier->Contains(Hash(2)));
  Block got(tier->identity());
  EXPECT_TRUE(Get(*tier, 2, &got).hit);
  EXPECT_EQ(got.bytes, Block(tier->identity(), 2).bytes);
}

TEST_F(SsdTierTest, RecordsOfAnotherModelOrDtypeAreNeverRead) {
  {
    auto tier = Open(16, Identity("model-a", DType::kF32));
    Put(*tier, 1);
  }
  {
    auto other_dtype = Open(16, Identity("model-a", DType::kBF16));
    EXPECT_EQ(other_dtype->open_report().removed_foreign, 1u);
    EXPECT_EQ(other_dtype->open_report().kept, 0u);
    Put(*other_dtype, 1);
  }
  auto other_model = Open(16, Identity("model-b", DType::kF32));
  EXPECT_EQ(other_model->open_report().removed_foreign, 1u);
  Block got(other_model->identity());
  EXPECT_EQ(Get(*other_model, 1, &got).miss, TierMiss::kAbsent);
  EXPECT_FALSE(fs::exists(other_model->RecordPath(Hash(1))));
}

TEST_F(SsdTierTest, CorruptPayloadIsAMissAndTheRecordIsDropped) {
  auto tier = Open();
  Put(*tier, 1);
  Rewrite(tier->RecordPath(Hash(1)),
          [](std::string& b) { b[TierRecordHeader::kBytes + 100] ^= 1; });
  Block got(tier->identity());
  const KvTier::LoadState state = Get(*tier, 1, &got);
  EXPECT_TRUE(state.done);
  EXPECT_FALSE(state.hit);
  EXPECT_EQ(state.miss, TierMiss::kCorrupt);
  EXPECT_EQ(got.bytes, Block(tier->identity()).bytes) << "no unverified byte reaches the pool";
  EXPECT_FALSE(tier->Contains(Hash(1)));
  EXPECT_FALSE(fs::exists(tier->RecordPath(Hash(1))));
  EXPECT_EQ(tier->stats().misses[static_cast<int>(TierMiss::kCorrupt)], 1u);
  EXPECT_EQ(tier->stats().used_bytes, 0u);
  const CacheEventBatch events = tier->EventsAfter(0, 10);
  ASSERT_EQ(events.events.size(), 2u);
  EXPECT_EQ(events.events[1], (CacheEvent{CacheEventKind::kEvicted, Hash(1)}));
}

TEST_F(SsdTierTest, TruncatedRecordIsAMissAndIsRemovedAtOpen) {
  auto tier = Open();
  Put(*tier, 1);
  Put(*tier, 2);
  Rewrite(tier->RecordPath(Hash(1)), [](std::string& b) { b.resize(b.size() - 10); });
  Block got(tier->identity());
  EXPECT_EQ(Get(*tier, 1, &got).miss, TierMiss::kTruncated);
  EXPECT_EQ(got.bytes, Block(tier->identity()).bytes);

  Rewrite(tier->RecordPath(Hash(2)), [](std::string& b) { b.resize(50); });
  tier.reset();
  std::ofstream(dir_ + "/.tmp-interrupted") << "half a record";
  auto reopened = Open();
  EXPECT_EQ(reopened->open_report().removed_damaged, 1u);
  EXPECT_EQ(reopened->open_report().removed_partial, 1u);
  EXPECT_EQ(reopened->open_report().kept, 0u);
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(SsdTierTest, StaleRecordUnderAnotherBlocksNameIsAMiss) {
  // A store that returns the bytes of another block: a valid record, of
  // the wrong hash.
  auto tier = Open();
  Put(*tier, 1);
  Put(*tier, 2);
  fs::copy_file(tier->RecordPath(Hash(2)), tier->RecordPath(Hash(1)),
                fs::copy_options::overwrite_existing);
  Block got(tier->identity());
  EXPECT_EQ(Get(*tier, 1, &got).miss, TierMiss::kCorrupt);
  EXPECT_EQ(got.bytes, Block(tier->identity()).bytes);
  EXPECT_TRUE(Get(*tier, 2, &got).hit);
}

TEST_F(SsdTierTest, BoundEvictsTheLeastRecentlyUsed) {
  auto tier = Open(/*records=*/3);
  Put(*tier, 1);
  Put(*tier, 2);
  Put(*tier, 3);
  Block got(tier->identity());
  EXPECT_TRUE(Get(*tier, 1, &got).hit);  // 2 is now the oldest use
  Put(*tier, 4);
  EXPECT_TRUE(tier->Contains(Hash(1)));
  EXPECT_FALSE(tier->Contains(Hash(2)));
  EXPECT_FALSE(fs::exists(tier->RecordPath(Hash(2))));
  EXPECT_TRUE(tier->Contains(Hash(4)));
  EXPECT_EQ(tier->stats().evictions, 1u);
  EXPECT_EQ(tier->stats().used_bytes, 3 * (TierRecordHeader::kBytes + Identity().payload_bytes()));
  int files = 0;
  for ([[maybe_unused]] const auto& f : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 3);
}

TEST_F(SsdTierTest, PendingWritesAreBounded) {
  SsdTierOptions options{.dir = dir_, .capacity_bytes = 1 << 20, .max_pending_writes = 2};
  ASSERT_OK_AND_ASSIGN(auto tier, SsdTier::Open(options, Identity(), &io_));
  EXPECT_TRUE(tier->Store(Hash(1), Block(Identity(), 1).in()));
  EXPECT_TRUE(tier->Store(Hash(2), Block(Identity(), 2).in()));
  EXPECT_FALSE(tier->Store(Hash(3), Block(Identity(), 3).in())) << "the disk is behind";
  io_.RunDue();
  EXPECT_TRUE(tier->Store(Hash(3), Block(Identity(), 3).in()));
}

TEST_F(SsdTierTest, CancelledLoadNeverWritesItsDestination) {
  auto tier = Open();
  Put(*tier, 1);
  Block got(tier->identity());
  const uint64_t ticket = tier->Load(Hash(1), got.out());
  tier->Cancel(ticket);
  io_.RunDue();
  EXPECT_EQ(got.bytes, Block(tier->identity()).bytes);
  EXPECT_EQ(tier->Poll(ticket).miss, TierMiss::kAbsent) << "the ticket is forgotten";
  EXPECT_EQ(tier->stats().misses[static_cast<int>(TierMiss::kCancelled)], 1u);
  // A load still queued when the tier closes touches nothing either.
  const uint64_t late = tier->Load(Hash(1), got.out());
  (void)late;
  tier.reset();
  io_.RunDue();
  EXPECT_EQ(got.bytes, Block(Identity()).bytes);
}

TEST_F(SsdTierTest, BadOptionsSayWhatToChange) {
  SsdTierOptions tiny{.dir = dir_, .capacity_bytes = 100};
  EXPECT_THAT(SsdTier::Open(tiny, Identity(), &io_).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("below one block's record")));
  std::ofstream(dir_ + "-file") << "x";
  SsdTierOptions not_dir{.dir = dir_ + "-file/sub", .capacity_bytes = 1 << 20};
  EXPECT_THAT(SsdTier::Open(not_dir, Identity(), &io_).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("directory")));
}

TEST(TierRecordHeaderTest, RoundTripsAndRefusesDamage) {
  TierRecordHeader h{.identity = Identity("m", DType::kI8),
                     .hash = Hash(3),
                     .payload_bytes = 999,
                     .payload_checksum = 0x1234};
  auto bytes = EncodeTierHeader(h);
  ASSERT_OK_AND_ASSIGN(TierRecordHeader back, DecodeTierHeader(bytes));
  EXPECT_EQ(back.identity, h.identity);
  EXPECT_EQ(back.hash, h.hash);
  EXPECT_EQ(back.payload_bytes, 999u);
  EXPECT_EQ(back.payload_checksum, 0x1234u);
  for (size_t i = 0; i < bytes.size(); i += 7) {
    auto damaged = bytes;
    damaged[i] ^= 0x40;
    EXPECT_FALSE(DecodeTierHeader(damaged).ok()) << "byte " << i;
  }
  EXPECT_THAT(DecodeTierHeader(std::span(bytes).first(40)).status(),
              StatusIs(absl::StatusCode::kOutOfRange));
}

TEST(TierRecordHeaderTest, ALatentLayoutIsPartOfTheIdentity) {
  TierRecordHeader h{.identity = Identity("m", DType::kBF16), .hash = Hash(4)};
  const KvTierIdentity keys_and_values = h.identity;
  h.identity.latent = true;
  EXPECT_FALSE(h.identity == keys_and_values);
  EXPECT_LT(h.identity.payload_bytes(), keys_and_values.payload_bytes());
  ASSERT_OK_AND_ASSIGN(TierRecordHeader back, DecodeTierHeader(EncodeTierHeader(h)));
  EXPECT_TRUE(back.identity.latent);
  EXPECT_EQ(back.identity, h.identity);
}

}  // namespace
}  // namespace tandem
