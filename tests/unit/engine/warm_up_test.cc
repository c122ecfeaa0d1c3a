// A worker's engine is warmed up before it serves (WarmUpEngine,
// CreateWorkerEngine's warm_up_tokens): a prompt and a decode step run
// through the backend, and the KV pool ends as it began.
#include <memory>

#include "common/base/status_macros.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/model/synthetic.h"
#include "common/worker/worker_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/failing_backend.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::FailingBackend;
using ::tandem::testing::StatusIs;

ModelConfig WarmUpShape() {
  return ModelConfig{.dim = 64,
                     .hidden_dim = 96,
                     .n_layers = 3,
                     .n_heads = 8,
                     .n_kv_heads = 2,
                     .vocab_size = 101,
                     .seq_len = 128};
}

struct Built {
  FailingBackend* backend;
  WorkerEngine worker;
};

absl::StatusOr<Built> Build(const ModelWeights& weights, int warm_up_tokens, int kv_blocks = 16) {
  ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> cpu, CpuBackend::Create({1}));
  auto backend = std::make_unique<FailingBackend>(std::move(cpu));
  FailingBackend* raw = backend.get();
  ASSIGN_OR_RETURN(WorkerEngine worker, CreateWorkerEngine(weights, std::move(backend),
                                                           {.role = "test",
                                                            .kv_blocks = kv_blocks,
                                                            .max_batch_tokens = 64,
                                                            .max_logit_rows = 8,
                                                            .warm_up_tokens = warm_up_tokens}));
  return Built{raw, std::move(worker)};
}

TEST(WarmUp, RunsAPromptAndADecodeStepAndFreesTheirBlocks) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(WarmUpShape(), 3));
  ASSERT_OK_AND_ASSIGN(Built cold, Build(*weights, 0));
  ASSERT_OK_AND_ASSIGN(Built warm, Build(*weights, 32));
  // What the warm engine ran beyond creation is what a 32-token prompt and
  // a one-token greedy step cost the cold one.
  const int64_t created = cold.backend->operations();
  const int64_t warm_ops = warm.backend->operations() - created;
  EXPECT_GT(warm_ops, 0);
  BlockTable table = cold.worker.engine->NewSequence();
  const std::vector<int32_t> prompt(32, 5);
  const BatchItem first{.table = &table, .tokens = prompt};
  ASSERT_OK(cold.worker.engine->Step({&first, 1}).status());
  const int32_t next = 7;
  std::vector<int32_t> picks;
  const BatchItem decode{.table = &table, .tokens = {&next, 1}, .pick_greedy = true};
  ASSERT_OK(cold.worker.engine->Step({&decode, 1}, nullptr, &picks).status());
  cold.worker.engine->Release(table);
  EXPECT_EQ(warm_ops, cold.backend->operations() - created);
  const BlockPool& pool = warm.worker.engine->block_pool();
  EXPECT_EQ(pool.num_used(), 0);
  EXPECT_EQ(pool.num_free(), pool.num_blocks());
  EXPECT_EQ(pool.events().last(), 0u);  // nothing entered the prefix cache
}

TEST(WarmUp, IsCappedByTheStepAndSkippedWithoutRoom) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(WarmUpShape(), 3));
  ASSERT_OK_AND_ASSIGN(Built cold, Build(*weights, 0));
  // 1000 tokens: capped at the step's 64, not refused.
  ASSERT_OK_AND_ASSIGN(Built capped, Build(*weights, 1000));
  EXPECT_GT(capped.backend->operations(), cold.backend->operations());
  // A pool of 2 blocks of 16 cannot hold 64 + 1 tokens: nothing runs.
  ASSERT_OK_AND_ASSIGN(Built small, Build(*weights, 1000, 2));
  EXPECT_EQ(small.backend->operations(), cold.backend->operations());
  EXPECT_THAT(WarmUpEngine(*small.worker.engine, 1000), ::tandem::testing::IsOkAndHolds(0));
  EXPECT_THAT(WarmUpEngine(*cold.worker.engine, 1000), ::tandem::testing::IsOkAndHolds(64));
}

TEST(WarmUp, ABackendThatFailsFailsTheWorkersStart) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(WarmUpShape(), 3));
  ASSERT_OK_AND_ASSIGN(Built built, Build(*weights, 0));
  built.backend->FailAfter(3);
  EXPECT_THAT(WarmUpEngine(*built.worker.engine, 8),
              StatusIs(absl::StatusCode::kInternal, ::testing::HasSubstr("injected")));
  EXPECT_EQ(built.worker.engine->block_pool().num_used(), 0);
}

}  // namespace
}  // namespace tandem
