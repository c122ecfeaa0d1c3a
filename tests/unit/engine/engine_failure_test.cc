// The engine over a backend that fails part way through a step (a fake of a
// CUDA error): the step returns the error and no logits, the sequences are
// not advanced and give every block back, and later steps refuse.
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "common/base/logging.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/model/synthetic.h"
#include "common/worker/worker_health.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/failing_backend.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::FailingBackend;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

ModelConfig FailureShape() {
  return ModelConfig{.dim = 64,
                     .hidden_dim = 96,
                     .n_layers = 3,
                     .n_heads = 8,
                     .n_kv_heads = 2,
                     .vocab_size = 101,
                     .seq_len = 128};
}

std::vector<int32_t> RandomTokens(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& id : t) id = static_cast<int32_t>(rng() % FailureShape().vocab_size);
  return t;
}

class EngineFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(weights_, MakeSyntheticModel(FailureShape(), 7));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuBackend> cpu, CpuBackend::Create({1}));
    auto backend = std::make_unique<FailingBackend>(std::move(cpu));
    backend_ = backend.get();
    ASSERT_OK_AND_ASSIGN(
        engine_, Engine::Create(*weights_, std::move(backend), EngineOptions{.num_blocks = 32}));
  }

  // Operations one step of `tokens` tokens with logits runs.
  int64_t OperationsPerStep() {
    BlockTable table = engine_->NewSequence();
    const std::vector<int32_t> tokens = RandomTokens(5, 99);
    const BatchItem item{&table, tokens, true};
    const int64_t before = backend_->operations();
    CHECK_OK(engine_->Step({&item, 1}).status());
    engine_->Release(table);
    return backend_->operations() - before;
  }

  static auto EngineError() {
    return StatusIs(absl::StatusCode::kInternal,
                    AllOf(HasSubstr("the cpu backend failed"), HasSubstr("injected device failure"),
                          HasSubstr("can compute no more")));
  }

  std::unique_ptr<ModelWeights> weights_;
  FailingBackend* backend_ = nullptr;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineFailureTest, FailedStepReturnsTheErrorAndLeavesTheSequencesAsTheyWere) {
  const int64_t per_step = OperationsPerStep();
  BlockTable a = engine_->NewSequence(), b = engine_->NewSequence();
  const std::vector<int32_t> prompt_a = RandomTokens(20, 1), prompt_b = RandomTokens(7, 2);
  {
    const BatchItem items[] = {{&a, prompt_a, true}, {&b, prompt_b, true}};
    ASSERT_OK(engine_->Step(items).status());
  }
  ASSERT_EQ(a.num_tokens(), 20);
  ASSERT_EQ(b.num_tokens(), 7);
  ASSERT_OK(engine_->status());

  std::vector<absl::Status> heard;
  engine_->SetFailureListener([&](const absl::Status& s) { heard.push_back(s); });
  // Part way through the next step; a.num_tokens() 20 -> 36 takes a third
  // block, so the step reserves one.
  backend_->FailAfter(per_step / 2);
  const int free_before = engine_->block_pool().num_free();
  std::vector<int> layers_handed_on;
  const std::vector<int32_t> more_a = RandomTokens(16, 3), more_b = RandomTokens(1, 4);
  const BatchItem items[] = {{&a, more_a, true}, {&b, more_b, true}};
  absl::StatusOr<std::vector<float>> logits = engine_->Step(items, [&](int layer) {
    EXPECT_OK(backend_->status()) << "layer " << layer << " handed on after the failure";
    layers_handed_on.push_back(layer);
  });
  EXPECT_THAT(logits.status(), EngineError());
  EXPECT_LT(layers_handed_on.size(), static_cast<size_t>(FailureShape().n_layers));
  // Not advanced; the block reserved for a's new tokens stays with it.
  EXPECT_EQ(a.num_tokens(), 20);
  EXPECT_EQ(b.num_tokens(), 7);
  EXPECT_EQ(a.blocks().size(), 3u);
  EXPECT_EQ(engine_->block_pool().num_free(), free_before - 1);

  EXPECT_THAT(engine_->status(), EngineError());
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_EQ(heard[0], engine_->status());
  EXPECT_EQ(EngineRefusal(*engine_, "test worker").code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(EngineRefusal(*engine_, "test worker").message(),
              HasSubstr("test worker cannot compute: the cpu backend failed"));

  // Later steps refuse without computing, and copies too.
  const int64_t ops = backend_->operations();
  EXPECT_THAT(engine_->Step({&items[1], 1}).status(), EngineError());
  BlockTable copy = engine_->NewSequence();
  EXPECT_THAT(engine_->CopySequence(a, 16, copy), EngineError());
  EXPECT_EQ(backend_->operations(), ops);
  EXPECT_EQ(b.num_tokens(), 7);
  EXPECT_EQ(heard.size(), 1u);

  // Releasing the sequences gives every block back.
  engine_->Release(a);
  engine_->Release(b);
  engine_->Release(copy);
  EXPECT_EQ(engine_->block_pool().num_free(), engine_->block_pool().num_blocks());
}

// A step without logits still waits for its pass (a GPU backend's errors
// show when it is waited for), so a failure in its last operation is that
// step's error, not the next one's.
TEST_F(EngineFailureTest, StepWithoutLogitsReportsAFailureInItsLastOperation) {
  BlockTable table = engine_->NewSequence();
  const std::vector<int32_t> tokens = RandomTokens(10, 5);
  const BatchItem item{&table, tokens, /*want_logits=*/false};
  const int64_t before = backend_->operations();
  ASSERT_OK_AND_ASSIGN(std::vector<float> none, engine_->Step({&item, 1}));
  EXPECT_TRUE(none.empty());
  const int64_t per_step = backend_->operations() - before;

  backend_->FailAfter(per_step - 1);
  const BatchItem next{&table, std::span<const int32_t>(tokens).first(3), false};
  EXPECT_THAT(engine_->Step({&next, 1}).status(), EngineError());
  EXPECT_EQ(table.num_tokens(), 10);
  engine_->Release(table);
}

TEST_F(EngineFailureTest, ListenerSetAfterTheFailureHearsOfItAtOnceAndAReplacedOneNever) {
  std::vector<absl::Status> first, second;
  engine_->SetFailureListener([&](const absl::Status& s) { first.push_back(s); });
  engine_->SetFailureListener([&](const absl::Status& s) { second.push_back(s); });
  backend_->FailAfter(0);
  BlockTable table = engine_->NewSequence();
  const std::vector<int32_t> tokens = RandomTokens(4, 6);
  const BatchItem item{&table, tokens, true};
  EXPECT_THAT(engine_->Step({&item, 1}).status(), EngineError());
  EXPECT_TRUE(first.empty());
  EXPECT_EQ(second.size(), 1u);

  std::vector<absl::Status> late;
  engine_->SetFailureListener([&](const absl::Status& s) { late.push_back(s); });
  ASSERT_EQ(late.size(), 1u);
  EXPECT_THAT(late[0], EngineError());
  engine_->SetFailureListener(nullptr);
  engine_->Release(table);
}

TEST(EngineFailure, CreateReportsABackendThatFailedWhileLoading) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(FailureShape(), 7));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuBackend> cpu, CpuBackend::Create({1}));
  auto backend = std::make_unique<FailingBackend>(std::move(cpu));
  backend->FailAfter(3);  // A weight upload.
  EXPECT_THAT(Engine::Create(*weights, std::move(backend), EngineOptions{.num_blocks = 8}).status(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("injected device failure")));
}

}  // namespace
}  // namespace tandem
