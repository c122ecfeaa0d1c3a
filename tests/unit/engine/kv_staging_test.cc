#include "common/engine/kv_staging.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/base/logging.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/host_kv_copier.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::CopierBackend;
using ::tandem::testing::HostKvCopier;
using ::tandem::testing::IsOkAndHolds;
using ::tandem::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

KvLayout DeviceLayout() {
  return KvLayout{
      .n_layers = 3, .num_blocks = 20, .block_size = 4, .kv_dim = 2, .dtype = DType::kF32};
}

std::unique_ptr<KvStaging> MakeStaging(HostKvCopier& copier, int capacity) {
  auto staging = KvStaging::Create(copier, DeviceLayout(), capacity);
  CHECK_OK(staging.status());
  return std::move(staging).value();
}

TEST(KvStaging, IsLaidOutAsACacheOfItsSlots) {
  HostKvCopier copier;
  std::unique_ptr<KvStaging> staging = MakeStaging(copier, 8);
  const KvLayout device = DeviceLayout();
  EXPECT_EQ(staging->capacity(), 8);
  EXPECT_EQ(staging->num_free(), 8);
  EXPECT_EQ(staging->layout().num_blocks, 8);
  EXPECT_EQ(staging->layout().block_bytes(), device.block_bytes());
  EXPECT_EQ(staging->bytes(), size_t{8} * device.n_layers * device.block_bytes());
  EXPECT_EQ(copier.staging_allocations(), 1);
  EXPECT_EQ(copier.staging_bytes(), staging->bytes());
  EXPECT_THAT(KvStaging::SlotIds(StagingRun{3, 4}), ElementsAre(3, 4, 5, 6));
  EXPECT_TRUE(KvStaging::SlotIds(StagingRun{}).empty());
}

TEST(KvStaging, HandsOutContiguousRunsLowestFirst) {
  HostKvCopier copier;
  std::unique_ptr<KvStaging> staging = MakeStaging(copier, 10);
  ASSERT_OK_AND_ASSIGN(StagingRun a, staging->Allocate(3));
  ASSERT_OK_AND_ASSIGN(StagingRun b, staging->Allocate(4));
  ASSERT_OK_AND_ASSIGN(StagingRun c, staging->Allocate(3));
  EXPECT_EQ(a.first, 0);
  EXPECT_EQ(b.first, 3);
  EXPECT_EQ(c.first, 7);
  EXPECT_EQ(staging->num_free(), 0);
  EXPECT_THAT(staging->Allocate(1),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("0 of 10 free")));

  // Three free slots, but not three in a row: a run must be contiguous.
  staging->Free(a);
  EXPECT_TRUE(a.empty());
  ASSERT_OK_AND_ASSIGN(StagingRun one, staging->Allocate(1));
  EXPECT_EQ(one.first, 0);
  staging->Free(c);
  EXPECT_EQ(staging->num_free(), 5);
  EXPECT_THAT(staging->Allocate(4),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("the longest run 3")));
  // Freeing the middle run merges all three free runs into one.
  staging->Free(b);
  ASSERT_OK_AND_ASSIGN(StagingRun nine, staging->Allocate(9));
  EXPECT_EQ(nine.first, 1);
  staging->Free(one);
  staging->Free(nine);
  EXPECT_EQ(staging->num_free(), 10);
  ASSERT_OK_AND_ASSIGN(StagingRun all, staging->Allocate(10));
  EXPECT_EQ(all.first, 0);
}

TEST(KvStaging, RejectsImpossibleRequests) {
  HostKvCopier copier;
  EXPECT_THAT(KvStaging::Create(copier, DeviceLayout(), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least one slot")));
  std::unique_ptr<KvStaging> staging = MakeStaging(copier, 4);
  EXPECT_THAT(staging->Allocate(0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(staging->Allocate(5),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds 1 to 4")));
  StagingRun none;
  staging->Free(none);  // Nothing held: nothing happens.
  EXPECT_EQ(staging->num_free(), 4);
}

TEST(KvStagingDeathTest, FreeingSlotsTwiceIsABrokenInvariant) {
  HostKvCopier copier;
  std::unique_ptr<KvStaging> staging = MakeStaging(copier, 4);
  ASSERT_OK_AND_ASSIGN(StagingRun run, staging->Allocate(2));
  StagingRun copy = run;
  staging->Free(run);
  EXPECT_DEATH(staging->Free(copy), "freed twice");
}

// Layer l of device blocks {5, 6, 9} to slots {2, 3, 4}: blocks 5 and 6 are
// adjacent on both sides and merge; 9 is a copy of its own.
TEST(KvStaging, CopyRangesMapBlocksToSlotsAndMergeAdjacentBlocks) {
  HostKvCopier copier;
  std::unique_ptr<KvStaging> staging = MakeStaging(copier, 8);
  const KvLayout device = DeviceLayout();
  const KvLayout& host = staging->layout();
  const size_t e = device.element_bytes();
  const size_t block = device.block_bytes();
  const std::vector<int32_t> blocks = {5, 6, 9};
  const StagingRun run{2, 3};
  std::vector<CopyRange> ranges;
  staging->AppendToHost(1, blocks, run, ranges);
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0].src_offset, device.BlockOffset(1, 5) * e);
  EXPECT_EQ(ranges[0].dst_offset, host.BlockOffset(1, 2) * e);
  EXPECT_EQ(ranges[0].bytes, 2 * block);
  EXPECT_EQ(ranges[1].src_offset, device.BlockOffset(1, 9) * e);
  EXPECT_EQ(ranges[1].dst_offset, host.BlockOffset(1, 4) * e);
  EXPECT_EQ(ranges[1].bytes, block);

  ranges.clear();
  staging->AppendToDevice(2, run, blocks, ranges);
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0].src_offset, host.BlockOffset(2, 2) * e);
  EXPECT_EQ(ranges[0].dst_offset, device.BlockOffset(2, 5) * e);
  EXPECT_EQ(ranges[0].bytes, 2 * block);
  EXPECT_EQ(ranges[1].src_offset, host.BlockOffset(2, 4) * e);
  EXPECT_EQ(ranges[1].dst_offset, device.BlockOffset(2, 9) * e);

  // The run's slots of one layer are one contiguous host range.
  EXPECT_EQ(host.BlockOffset(0, run.first + run.count) - host.BlockOffset(0, run.first),
            static_cast<size_t>(run.count) * device.block_elements());
}

// Device cache -> staging -> another device cache, through the copier:
// every byte of every layer of the sequence arrives, nothing else moves.
TEST(KvStaging, RoundTripThroughTheCopierMovesExactlyTheSequencesBytes) {
  HostKvCopier copier;
  std::unique_ptr<KvStaging> staging = MakeStaging(copier, 6);
  const KvLayout device = DeviceLayout();
  std::vector<std::byte> source(device.total_bytes());
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 7 + 3);
  std::vector<std::byte> destination(device.total_bytes(), std::byte{0});
  const std::vector<int32_t> from = {11, 12, 13, 2};
  const std::vector<int32_t> to = {0, 7, 8, 19};
  ASSERT_OK_AND_ASSIGN(StagingRun run, staging->Allocate(4));

  std::vector<CopyRange> out;
  std::vector<CopyRange> in;
  for (int l = 0; l < device.n_layers; ++l) {
    staging->AppendToHost(l, from, run, out);
    staging->AppendToDevice(l, run, to, in);
  }
  ASSERT_OK_AND_ASSIGN(uint64_t t1, copier.ToHost(source.data(), staging->data(), out));
  ASSERT_OK_AND_ASSIGN(uint64_t t2, copier.ToDevice(staging->data(), destination.data(), in));
  EXPECT_THAT(copier.Finished(t1), IsOkAndHolds(false));
  copier.CompleteAll();
  EXPECT_THAT(copier.Finished(t1), IsOkAndHolds(true));
  EXPECT_THAT(copier.Finished(t2), IsOkAndHolds(true));
  EXPECT_THAT(copier.Finished(t2 + 1), StatusIs(absl::StatusCode::kNotFound));

  const size_t e = device.element_bytes();
  const size_t block = device.block_bytes();
  size_t moved = 0;
  for (int l = 0; l < device.n_layers; ++l) {
    for (size_t i = 0; i < from.size(); ++i) {
      EXPECT_EQ(std::memcmp(destination.data() + device.BlockOffset(l, to[i]) * e,
                            source.data() + device.BlockOffset(l, from[i]) * e, block),
                0)
          << "layer " << l << " block " << i;
      moved += block;
    }
  }
  EXPECT_EQ(copier.to_host_bytes(), moved);
  EXPECT_EQ(copier.to_device_bytes(), moved);
  size_t nonzero = 0;
  for (std::byte b : destination) nonzero += b != std::byte{0};
  EXPECT_LE(nonzero, moved);  // Nothing outside the destination blocks.
}

TEST(KvStaging, SizingKeepsTheLongestPromptAndTheDefaultWithinThePool) {
  KvLayout layout = DeviceLayout();  // 20 blocks of 4 tokens.
  // A 32-token context: prompts of at most 31 tokens, 8 blocks.
  EXPECT_EQ(MinStagingSlots(layout, 32), 8);
  EXPECT_EQ(DefaultStagingSlots(layout, 32), 20);  // 4 x 8, bounded by the pool.
  layout.num_blocks = 100;
  EXPECT_EQ(DefaultStagingSlots(layout, 32), 32);
  layout.num_blocks = 5;
  EXPECT_EQ(MinStagingSlots(layout, 32), 5);
}

TEST(KvStaging, ForEngineStagesOnlyForABackendWithACopier) {
  const ModelConfig shape{.dim = 32,
                          .hidden_dim = 48,
                          .n_layers = 2,
                          .n_heads = 4,
                          .n_kv_heads = 2,
                          .vocab_size = 50,
                          .seq_len = 64};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ModelWeights> weights, MakeSyntheticModel(shape, 3));
  const EngineOptions options{.block_size = 16, .num_blocks = 40, .max_batch_tokens = 64};
  auto engine_on = [&](bool copier) {
    std::unique_ptr<Backend> backend = CpuBackend::Create(CpuBackendOptions{1}).value();
    if (copier) {
      backend =
          std::make_unique<CopierBackend>(std::move(backend), std::make_unique<HostKvCopier>());
    }
    return Engine::Create(*weights, std::move(backend), options).value();
  };

  std::unique_ptr<Engine> host = engine_on(false);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvStaging> none, KvStaging::ForEngine(*host, 0));
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(KvPathDescription(none.get(), "ucx", false), "direct host");
  EXPECT_THAT(KvStaging::ForEngine(*host, 8),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("leave kv_staging_blocks")));

  std::unique_ptr<Engine> device = engine_on(true);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvStaging> staging, KvStaging::ForEngine(*device, 0));
  ASSERT_NE(staging, nullptr);
  EXPECT_EQ(staging->capacity(), 16);  // 4 sequences of 64 tokens.
  EXPECT_EQ(KvPathDescription(staging.get(), "ucx", false),
            "device via host staging (ucx has no CUDA memory support)");
  EXPECT_THAT(KvPathDescription(staging.get(), "ucx", true), HasSubstr("could register"));
  ASSERT_OK_AND_ASSIGN(staging, KvStaging::ForEngine(*device, 4));
  EXPECT_EQ(staging->capacity(), 4);  // 63 prompt tokens at most: 4 blocks.
  EXPECT_THAT(KvStaging::ForEngine(*device, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("from 4")));
  EXPECT_THAT(KvStaging::ForEngine(*device, 41),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("to 40")));
}

// A device backend whose copier could not be made: it hands out none, and
// says why in its status.
class CopierlessBackend final : public ::tandem::testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  absl::Status status() const override { return status_; }
  KvCopier* kv_copier() override {
    status_ = absl::InternalError("creating the copy stream failed");
    return nullptr;
  }

 private:
  absl::Status status_;
};

// Regression: a backend whose copier failed must not be taken for one in
// host memory (the transport would be handed device memory as host).
TEST(KvStaging, ForEngineFailsWhenTheBackendCouldNotMakeItsCopier) {
  const ModelConfig shape{.dim = 32,
                          .hidden_dim = 48,
                          .n_layers = 2,
                          .n_heads = 4,
                          .n_kv_heads = 2,
                          .vocab_size = 50,
                          .seq_len = 64};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ModelWeights> weights, MakeSyntheticModel(shape, 3));
  auto backend =
      std::make_unique<CopierlessBackend>(CpuBackend::Create(CpuBackendOptions{1}).value());
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Engine> engine,
      Engine::Create(*weights, std::move(backend),
                     EngineOptions{.block_size = 16, .num_blocks = 8, .max_batch_tokens = 64}));
  EXPECT_THAT(KvStaging::ForEngine(*engine, 0),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("copy stream")));
}

}  // namespace
}  // namespace tandem
