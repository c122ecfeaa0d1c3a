// The KV pool sized from a device's memory (EngineOptions::
// gpu_memory_fraction), over the CPU backend posing as a device of a given
// size.
#include <cmath>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/device_memory_backend.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::DeviceMemoryBackend;
using ::tandem::testing::IsOkAndHolds;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr size_t kMiB = size_t{1} << 20;

ModelConfig MemoryShape() {
  return ModelConfig{.dim = 64,
                     .hidden_dim = 96,
                     .n_layers = 3,
                     .n_heads = 8,
                     .n_kv_heads = 2,
                     .vocab_size = 101,
                     .seq_len = 128};
}

class EngineMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_OK_AND_ASSIGN(weights_, MakeSyntheticModel(MemoryShape(), 7)); }

  // An engine on a "device" of `total` bytes; `device` points at its backend.
  absl::StatusOr<std::unique_ptr<Engine>> Create(size_t total, EngineOptions options,
                                                 DeviceMemoryBackend** device = nullptr) {
    absl::StatusOr<std::unique_ptr<CpuBackend>> cpu = CpuBackend::Create({1});
    if (!cpu.ok()) return cpu.status();
    auto backend = std::make_unique<DeviceMemoryBackend>(std::move(cpu).value(), total);
    if (device != nullptr) *device = backend.get();
    return Engine::Create(*weights_, std::move(backend), options);
  }

  std::unique_ptr<ModelWeights> weights_;
};

// The pool takes what the fraction leaves beside everything else the engine
// allocated (weights, activation buffers).
TEST_F(EngineMemoryTest, PoolFillsTheFractionBesideWeightsAndActivations) {
  for (const double fraction : {0.5, 0.9, 1.0}) {
    SCOPED_TRACE(fraction);
    DeviceMemoryBackend* device = nullptr;
    const EngineOptions options{.num_blocks = 4, .gpu_memory_fraction = fraction};
    ASSERT_OK_AND_ASSIGN(auto engine, Create(16 * kMiB, options, &device));
    const KvLayout& layout = engine->kv_layout();
    const size_t block_bytes = layout.block_bytes() * layout.n_layers;
    const size_t others = device->allocated() - engine->kv_cache_bytes();
    const int want = static_cast<int>(std::floor((fraction * 16 * kMiB - others) / block_bytes));
    EXPECT_GT(want, 4);
    EXPECT_EQ(engine->block_pool().num_blocks(), want);
    EXPECT_EQ(layout.num_blocks, want);
    EXPECT_EQ(engine->kv_cache_bytes(), size_t(want) * block_bytes);
    EXPECT_EQ(engine->device_memory_bytes(), 16 * kMiB);
    EXPECT_LE(device->allocated(), fraction * 16 * kMiB);

    // The whole pool is usable.
    BlockTable table = engine->NewSequence();
    EXPECT_OK(table.Reserve(want * layout.block_size, engine->block_pool()));
    engine->Release(table);
  }
}

TEST_F(EngineMemoryTest, WithoutAFractionTheDevicePoolTakesNumBlocks) {
  ASSERT_OK_AND_ASSIGN(auto engine, Create(16 * kMiB, EngineOptions{.num_blocks = 12}));
  EXPECT_EQ(engine->block_pool().num_blocks(), 12);
  EXPECT_EQ(engine->device_memory_bytes(), 16 * kMiB);
}

TEST_F(EngineMemoryTest, HostBackendIgnoresTheFraction) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuBackend> cpu, CpuBackend::Create({1}));
  ASSERT_OK_AND_ASSIGN(auto engine,
                       Engine::Create(*weights_, std::move(cpu),
                                      EngineOptions{.num_blocks = 12, .gpu_memory_fraction = 0.9}));
  EXPECT_EQ(engine->block_pool().num_blocks(), 12);
  EXPECT_EQ(engine->device_memory_bytes(), 0u);
}

TEST_F(EngineMemoryTest, FractionThatLeavesNoRoomIsRefused) {
  // The weights and activations take about 2 MiB, more than a third of 4.
  EXPECT_THAT(Create(4 * kMiB, EngineOptions{.gpu_memory_fraction = 0.3}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("no room for one KV block"),
                             HasSubstr("raise --gpu_memory_fraction"))));
  EXPECT_OK(Create(4 * kMiB, EngineOptions{.gpu_memory_fraction = 0.9}).status());
}

TEST_F(EngineMemoryTest, FractionOutsideZeroToOneIsRefusedOnAnyBackend) {
  for (const double fraction : {0.0, -0.5, 1.5}) {
    EXPECT_THAT(Create(16 * kMiB, EngineOptions{.gpu_memory_fraction = fraction}).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("in (0, 1]")));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuBackend> cpu, CpuBackend::Create({1}));
    EXPECT_THAT(
        Engine::Create(*weights_, std::move(cpu), EngineOptions{.gpu_memory_fraction = fraction})
            .status(),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gpu_memory_fraction")));
  }
}

TEST(KvBlocksForDeviceMemory, CountsWholeBlocksAndCapsAtTheMostAPoolHolds) {
  EXPECT_THAT(KvBlocksForDeviceMemory(1000, 100, 0.5, 100), IsOkAndHolds(4));
  EXPECT_THAT(KvBlocksForDeviceMemory(1000, 100, 0.5, 99), IsOkAndHolds(4));
  EXPECT_THAT(KvBlocksForDeviceMemory(1000, 100, 1.0, 300), IsOkAndHolds(3));
  EXPECT_THAT(KvBlocksForDeviceMemory(size_t{1} << 50, 0, 1.0, 1024), IsOkAndHolds(kMaxKvBlocks));
  EXPECT_THAT(KvBlocksForDeviceMemory(1000, 450, 0.5, 100),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(KvBlocksForDeviceMemory(1000, 0, 0.0, 100),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tandem
