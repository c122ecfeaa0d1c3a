#include "common/compute/graph_buckets.h"

#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Optional;

// A decode step: one row per sequence, each over its own block table.
class Step {
 public:
  // Adds a row of `token` at `position` over `blocks`.
  Step& Row(int32_t token, int32_t position, std::vector<int32_t> blocks) {
    tokens_.push_back(token);
    positions_.push_back(position);
    tables_.push_back(std::move(blocks));
    return *this;
  }
  // `n` rows at position 0, each over its own one-block table.
  static Step Rows(int n) {
    Step step;
    for (int i = 0; i < n; ++i) step.Row(i, 0, {i});
    return step;
  }
  // `n` rows whose longest needs `blocks` blocks (block size 16).
  static Step Shape(int n, int blocks) {
    Step step;
    for (int i = 0; i < n; ++i) {
      std::vector<int32_t> table(blocks);
      for (int b = 0; b < blocks; ++b) table[b] = i * 1000 + b;
      step.Row(i, i == 0 ? (blocks - 1) * 16 : 0, std::move(table));
    }
    return step;
  }

  std::span<const int32_t> tokens() const { return tokens_; }
  std::span<const AttentionRow> rows() {
    rows_.clear();
    for (size_t i = 0; i < tables_.size(); ++i) rows_.push_back({positions_[i], tables_[i]});
    return rows_;
  }

 private:
  std::vector<int32_t> tokens_, positions_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<AttentionRow> rows_;
};

DecodeGraphOptions Options() {
  DecodeGraphOptions options;
  options.batch_buckets = {1, 2, 4, 8, 16, 24, 32};
  options.kv_buckets = {1, 2, 4, 8, 16, 32, 64};
  options.block_size = 16;
  options.max_graphs = 8;
  options.scratch_block = 0;
  return options;
}

DecodeGraphPlan MakePlan(const DecodeGraphOptions& options) {
  absl::StatusOr<DecodeGraphPlan> plan = DecodeGraphPlan::Create(options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

GraphDecision MustPlan(DecodeGraphPlan& plan, Step step) {
  absl::StatusOr<GraphDecision> decision = plan.Plan(step.tokens(), step.rows());
  EXPECT_TRUE(decision.ok()) << decision.status();
  return decision.ok() ? *std::move(decision) : GraphDecision{};
}

// Plans a step of `bucket`'s shape and completes its capture.
void Capture(DecodeGraphPlan& plan, GraphBucket bucket, size_t bytes = 1) {
  const GraphDecision d = MustPlan(plan, Step::Shape(bucket.batch, bucket.kv_blocks));
  ASSERT_EQ(d.action, GraphAction::kCapture);
  ASSERT_THAT(d.bucket, Optional(bucket));
  ASSERT_OK(plan.CaptureDone(bucket, bytes));
}

TEST(GraphBucketsTest, DefaultBuckets) {
  EXPECT_THAT(DefaultBatchBuckets(32), ElementsAre(1, 2, 4, 8, 16, 24, 32));
  EXPECT_THAT(DefaultBatchBuckets(30), ElementsAre(1, 2, 4, 8, 16, 24, 30));
  EXPECT_THAT(DefaultBatchBuckets(3), ElementsAre(1, 2, 3));
  EXPECT_THAT(DefaultBatchBuckets(1), ElementsAre(1));
  EXPECT_THAT(DefaultBatchBuckets(0), ElementsAre(1));
  EXPECT_EQ(DefaultBatchBuckets(std::numeric_limits<int>::max()).back(), kMaxGraphBatchRows);
  EXPECT_THAT(DefaultKvBuckets(64), ElementsAre(1, 2, 4, 8, 16, 32, 64));
  EXPECT_THAT(DefaultKvBuckets(100), ElementsAre(1, 2, 4, 8, 16, 32, 64, 100));
  EXPECT_THAT(DefaultKvBuckets(1), ElementsAre(1));
  const std::vector<int> huge = DefaultKvBuckets(std::numeric_limits<int>::max());
  EXPECT_EQ(huge.size(), 32u);
  EXPECT_EQ(huge.back(), std::numeric_limits<int>::max());
  // The defaults make a valid plan.
  DecodeGraphOptions options;
  options.batch_buckets = DefaultBatchBuckets(256);
  options.kv_buckets = DefaultKvBuckets(256);
  EXPECT_OK(DecodeGraphPlan::Create(options).status());
}

TEST(GraphBucketsTest, ChoosesTheSmallestBucketAtEveryBoundary) {
  const DecodeGraphPlan plan = MakePlan(Options());
  const std::vector<int> batch = {1, 2, 4, 8, 16, 24, 32};
  for (int rows = 1; rows <= 32; ++rows) {
    int want = 0;
    for (int b : batch) {
      if (b >= rows) {
        want = b;
        break;
      }
    }
    const DecodeGraphPlan::Choice c = plan.Choose(rows, 1);
    EXPECT_THAT(c.bucket, Optional(GraphBucket{want, 1})) << rows << " rows";
    EXPECT_EQ(c.reason, EagerReason::kNone);
  }
  for (int blocks = 1; blocks <= 64; ++blocks) {
    int want = 1;
    while (want < blocks) want *= 2;
    EXPECT_THAT(plan.Choose(1, blocks).bucket, Optional(GraphBucket{1, want})) << blocks;
  }
  EXPECT_EQ(plan.Choose(33, 1).reason, EagerReason::kTooManyRows);
  EXPECT_EQ(plan.Choose(std::numeric_limits<int64_t>::max(), 1).reason, EagerReason::kTooManyRows);
  EXPECT_EQ(plan.Choose(1, 65).reason, EagerReason::kTooLong);
  EXPECT_EQ(plan.Choose(32, std::numeric_limits<int64_t>::max()).reason, EagerReason::kTooLong);
  EXPECT_FALSE(plan.Choose(1, 65).bucket.has_value());
}

TEST(GraphBucketsTest, PlanBucketsByRowsAndLongestRow) {
  DecodeGraphPlan plan = MakePlan(Options());
  // 3 rows, the longest at position 40 of block size 16: 3 blocks.
  Step step;
  step.Row(5, 40, {7, 8, 9}).Row(6, 0, {10}).Row(7, 16, {11, 12});
  const GraphDecision d = MustPlan(plan, std::move(step));
  EXPECT_EQ(d.action, GraphAction::kCapture);
  EXPECT_THAT(d.bucket, Optional(GraphBucket{4, 4}));
  EXPECT_EQ(d.real_rows, 3);
  EXPECT_TRUE(d.evict.empty());
  ASSERT_OK(plan.CaptureDone({4, 4}, 100));
  // Two rows, the longer at position 47 (3 blocks), 48 and 63 (4): one
  // bucket; 64 needs 5 blocks, the next KV bucket.
  const auto two_rows = [](int position) {
    Step s;
    s.Row(1, position, std::vector<int32_t>(5, 3)).Row(2, 0, {4});
    return s;
  };
  GraphDecision r = MustPlan(plan, two_rows(47));
  EXPECT_EQ(r.action, GraphAction::kCapture);
  EXPECT_THAT(r.bucket, Optional(GraphBucket{2, 4}));
  ASSERT_OK(plan.CaptureDone({2, 4}, 1));
  for (int position : {48, 63}) {
    r = MustPlan(plan, two_rows(position));
    EXPECT_EQ(r.action, GraphAction::kReplay) << position;
    EXPECT_THAT(r.bucket, Optional(GraphBucket{2, 4}));
  }
  r = MustPlan(plan, two_rows(64));
  EXPECT_EQ(r.action, GraphAction::kCapture);
  EXPECT_THAT(r.bucket, Optional(GraphBucket{2, 8}));
}

TEST(GraphBucketsTest, CaptureThenReplay) {
  DecodeGraphPlan plan = MakePlan(Options());
  GraphDecision d = MustPlan(plan, Step::Shape(3, 5));
  ASSERT_EQ(d.action, GraphAction::kCapture);
  ASSERT_THAT(d.bucket, Optional(GraphBucket{4, 8}));
  EXPECT_EQ(plan.graphs_held(), 1);  // pending counts
  EXPECT_FALSE(plan.IsHeld({4, 8}));
  ASSERT_OK(plan.CaptureDone({4, 8}, 4096));
  EXPECT_TRUE(plan.IsHeld({4, 8}));
  EXPECT_EQ(plan.graph_bytes_held(), 4096u);
  for (int rows = 3; rows <= 4; ++rows) {
    for (int blocks = 5; blocks <= 8; ++blocks) {
      d = MustPlan(plan, Step::Shape(rows, blocks));
      EXPECT_EQ(d.action, GraphAction::kReplay);
      EXPECT_THAT(d.bucket, Optional(GraphBucket{4, 8}));
      EXPECT_EQ(d.real_rows, rows);
    }
  }
  EXPECT_EQ(plan.stats().captures, 1);
  EXPECT_EQ(plan.stats().replays, 8);
  EXPECT_EQ(plan.stats().hits(), 8);
  EXPECT_EQ(plan.stats().misses(), 1);
  EXPECT_EQ(plan.stats().eager_steps(), 0);
}

TEST(GraphBucketsTest, EagerWhenDisabled) {
  DecodeGraphOptions options = Options();
  options.enabled = false;
  DecodeGraphPlan plan = MakePlan(options);
  const GraphDecision d = MustPlan(plan, Step::Rows(1));
  EXPECT_EQ(d.action, GraphAction::kEager);
  EXPECT_EQ(d.reason, EagerReason::kDisabled);
  EXPECT_EQ(d.real_rows, 1);
  EXPECT_EQ(plan.stats().eager[static_cast<int>(EagerReason::kDisabled)], 1);
  EXPECT_EQ(plan.graphs_held(), 0);
}

TEST(GraphBucketsTest, EagerForAPrefillOrMixedStep) {
  DecodeGraphPlan plan = MakePlan(Options());
  // A prefill chunk: three rows of one sequence over one table.
  std::vector<int32_t> table = {3, 4};
  std::vector<AttentionRow> rows = {{0, table}, {1, table}, {2, table}};
  std::vector<int32_t> tokens = {1, 2, 3};
  absl::StatusOr<GraphDecision> d = plan.Plan(tokens, rows);
  ASSERT_OK(d.status());
  EXPECT_EQ(d->action, GraphAction::kEager);
  EXPECT_EQ(d->reason, EagerReason::kNotDecode);
  // Mixed: a decode row, then a two-row chunk.
  std::vector<int32_t> other = {9};
  rows = {{5, other}, {0, table}, {1, table}};
  d = plan.Plan(tokens, rows);
  ASSERT_OK(d.status());
  EXPECT_EQ(d->reason, EagerReason::kNotDecode);
  EXPECT_EQ(plan.stats().eager[static_cast<int>(EagerReason::kNotDecode)], 2);
  EXPECT_EQ(plan.graphs_held(), 0);
}

TEST(GraphBucketsTest, EagerForTooManyRowsOrTooLong) {
  DecodeGraphPlan plan = MakePlan(Options());
  GraphDecision d = MustPlan(plan, Step::Rows(33));
  EXPECT_EQ(d.reason, EagerReason::kTooManyRows);
  EXPECT_EQ(d.real_rows, 33);
  EXPECT_FALSE(d.bucket.has_value());
  d = MustPlan(plan, Step::Shape(1, 65));
  EXPECT_EQ(d.reason, EagerReason::kTooLong);
  d = MustPlan(plan, Step::Shape(32, 64));
  EXPECT_EQ(d.action, GraphAction::kCapture);
  EXPECT_THAT(d.bucket, Optional(GraphBucket{32, 64}));
}

TEST(GraphBucketsTest, EagerAfterAFailedCapture) {
  DecodeGraphPlan plan = MakePlan(Options());
  ASSERT_EQ(MustPlan(plan, Step::Rows(2)).action, GraphAction::kCapture);
  ASSERT_OK(plan.CaptureFailed({2, 1}));
  EXPECT_EQ(plan.graphs_held(), 0);
  for (int i = 0; i < 3; ++i) {
    const GraphDecision d = MustPlan(plan, Step::Rows(2));
    EXPECT_EQ(d.action, GraphAction::kEager);
    EXPECT_EQ(d.reason, EagerReason::kCaptureFailed);
    EXPECT_THAT(d.bucket, Optional(GraphBucket{2, 1}));
  }
  // Other buckets still capture.
  EXPECT_EQ(MustPlan(plan, Step::Rows(1)).action, GraphAction::kCapture);
  EXPECT_EQ(plan.stats().capture_failures, 1);
  EXPECT_EQ(plan.stats().misses(), 2 + 3);
}

TEST(GraphBucketsTest, EagerWhenTheGraphCountIsUsedWithoutEviction) {
  DecodeGraphOptions options = Options();
  options.max_graphs = 1;
  options.evict_lru = false;
  DecodeGraphPlan plan = MakePlan(options);
  Capture(plan, {1, 1});
  GraphDecision d = MustPlan(plan, Step::Rows(2));
  EXPECT_EQ(d.action, GraphAction::kEager);
  EXPECT_EQ(d.reason, EagerReason::kNoGraphRoom);
  EXPECT_THAT(d.bucket, Optional(GraphBucket{2, 1}));
  // The held graph still replays.
  EXPECT_EQ(MustPlan(plan, Step::Rows(1)).action, GraphAction::kReplay);
  EXPECT_TRUE(plan.IsHeld({1, 1}));
  EXPECT_EQ(plan.stats().evictions, 0);
}

TEST(GraphBucketsTest, ByteBudget) {
  DecodeGraphOptions options = Options();
  options.max_graph_bytes = 1000;
  options.evict_lru = false;
  DecodeGraphPlan plan = MakePlan(options);
  Capture(plan, {1, 1}, 600);
  Capture(plan, {2, 1}, 600);  // 600 < 1000: room for one more
  EXPECT_EQ(plan.graph_bytes_held(), 1200u);
  EXPECT_EQ(MustPlan(plan, Step::Rows(4)).reason, EagerReason::kNoGraphRoom);

  options.evict_lru = true;
  plan = MakePlan(options);
  Capture(plan, {1, 1}, 600);
  Capture(plan, {2, 1}, 600);
  const GraphDecision d = MustPlan(plan, Step::Rows(4));
  ASSERT_EQ(d.action, GraphAction::kCapture);
  // Evicting {1, 1} leaves 600 < 1000.
  EXPECT_THAT(d.evict, ElementsAre(GraphBucket{1, 1}));
  EXPECT_EQ(plan.graph_bytes_held(), 600u);
  ASSERT_OK(plan.CaptureDone({4, 1}, 2000));
  // Over budget: the next new bucket evicts both of the others.
  const GraphDecision e = MustPlan(plan, Step::Rows(8));
  EXPECT_THAT(e.evict, ElementsAre(GraphBucket{2, 1}, GraphBucket{4, 1}));
  EXPECT_EQ(plan.graph_bytes_held(), 0u);
  EXPECT_EQ(plan.stats().evictions, 3);
}

TEST(GraphBucketsTest, EvictsTheLeastRecentlyUsedGraph) {
  DecodeGraphOptions options = Options();
  options.max_graphs = 2;
  DecodeGraphPlan plan = MakePlan(options);
  Capture(plan, {1, 1});
  Capture(plan, {2, 1});
  // {1, 1} replayed: {2, 1} is now the least recently used.
  ASSERT_EQ(MustPlan(plan, Step::Rows(1)).action, GraphAction::kReplay);
  GraphDecision d = MustPlan(plan, Step::Rows(3));
  ASSERT_EQ(d.action, GraphAction::kCapture);
  EXPECT_THAT(d.evict, ElementsAre(GraphBucket{2, 1}));
  ASSERT_OK(plan.CaptureDone({4, 1}, 1));
  EXPECT_TRUE(plan.IsHeld({1, 1}));
  EXPECT_FALSE(plan.IsHeld({2, 1}));
  EXPECT_TRUE(plan.IsHeld({4, 1}));
  EXPECT_EQ(plan.graphs_held(), 2);
  // {2, 1} comes back: it is captured again, evicting {1, 1}.
  d = MustPlan(plan, Step::Rows(2));
  ASSERT_EQ(d.action, GraphAction::kCapture);
  EXPECT_THAT(d.evict, ElementsAre(GraphBucket{1, 1}));
  ASSERT_OK(plan.CaptureDone({2, 1}, 1));
  EXPECT_EQ(plan.stats().evictions, 2);
  EXPECT_EQ(plan.stats().captures, 4);
  EXPECT_EQ(plan.graphs_held(), 2);
}

TEST(GraphBucketsTest, PendingCaptureMustBeReported) {
  DecodeGraphPlan plan = MakePlan(Options());
  ASSERT_EQ(MustPlan(plan, Step::Rows(1)).action, GraphAction::kCapture);
  Step step = Step::Rows(1);
  EXPECT_THAT(plan.Plan(step.tokens(), step.rows()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("CaptureDone")));
  EXPECT_THAT(plan.CaptureDone({2, 1}, 1), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(plan.CaptureFailed({3, 1}), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(plan.CaptureDone({1, 1}, 1));
  EXPECT_THAT(plan.CaptureDone({1, 1}, 1), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(MustPlan(plan, Step::Rows(1)).action, GraphAction::kReplay);
}

TEST(GraphBucketsTest, RefusesMalformedSteps) {
  DecodeGraphPlan plan = MakePlan(Options());
  const std::vector<int32_t> table = {1};
  const std::vector<int32_t> two_tokens = {1, 2};
  const std::vector<AttentionRow> one_row = {{0, table}};
  EXPECT_THAT(plan.Plan({}, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(plan.Plan(two_tokens, one_row), StatusIs(absl::StatusCode::kInvalidArgument));
  const std::vector<int32_t> token = {1};
  std::vector<AttentionRow> bad = {{-1, table}};
  EXPECT_THAT(plan.Plan(token, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("position -1")));
  bad = {{16, table}};  // position 16 needs a second block
  EXPECT_THAT(plan.Plan(token, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs 2 blocks")));
  bad = {{std::numeric_limits<int32_t>::max(), table}};
  EXPECT_THAT(plan.Plan(token, bad), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(plan.stats().eager_steps() + plan.stats().captures, 0);
}

TEST(GraphBucketsTest, FillsPaddedReplayInputsExactly) {
  // Block size 4; bucket of 4 rows x 4 blocks; scratch block 99, pad token 7.
  Step step;
  step.Row(11, 0, {5})
      .Row(12, 9, {1, 2, 3, 8})  // position 9 needs 3 blocks: 8 is reserved ahead, unread
      .Row(13, 4, {6, 7});
  const GraphBucket bucket{4, 4};
  const ReplayLayout layout = ReplayLayout::For(bucket);
  EXPECT_EQ(layout.token_ids, 0);
  EXPECT_EQ(layout.positions, 4);
  EXPECT_EQ(layout.context_lengths, 8);
  EXPECT_EQ(layout.row_meta, 12);
  EXPECT_EQ(layout.block_table, 20);
  EXPECT_EQ(layout.row_ids, 36);
  EXPECT_EQ(layout.total, 40);
  std::vector<int32_t> staging(layout.total + 2, -5);
  ASSERT_OK(FillReplayInputs(bucket, /*block_size=*/4, /*scratch_block=*/99, /*pad_token=*/7,
                             step.tokens(), step.rows(), staging));
  const std::vector<int32_t> want = {
      // token ids, the padding row's is the pad token
      11, 12, 13, 7,
      // positions
      0, 9, 4, 0,
      // context lengths
      1, 10, 5, 1,
      // row meta: (position, offset of the row's table from the meta)
      0, 8, 9, 12, 4, 16, 0, 20,
      // block table [4 x 4]: the blocks each row needs, then the scratch block
      5, 99, 99, 99,   //
      1, 2, 3, 99,     //
      6, 7, 99, 99,    //
      99, 99, 99, 99,  //
      // row ids
      0, 1, 2, 3,
      // untouched past the layout
      -5, -5};
  EXPECT_THAT(staging, ElementsAreArray(want));
  // The meta offsets lead to each row's table, as the attention kernels read
  // them (meta + meta[2r + 1]).
  const int32_t* meta = staging.data() + layout.row_meta;
  EXPECT_EQ(meta[meta[2 * 1 + 1] + 2], 3);

  // Through a plan: its block size, scratch block and pad token.
  DecodeGraphOptions options = Options();
  options.block_size = 4;
  options.scratch_block = 99;
  options.pad_token = 7;
  const DecodeGraphPlan plan = MakePlan(options);
  std::vector<int32_t> again(layout.total + 2, -5);
  ASSERT_OK(plan.FillReplay(bucket, step.tokens(), step.rows(), again));
  EXPECT_EQ(again, staging);
  EXPECT_EQ(plan.max_staging_ints(), ReplayLayout::For({32, 64}).total);
}

TEST(GraphBucketsTest, FillRefusesStepsThatDoNotFit) {
  Step step;
  step.Row(1, 20, {1, 2});  // 2 blocks at block size 16
  std::vector<int32_t> staging(1000);
  const auto fill = [&](GraphBucket bucket, std::span<int32_t> out, int block_size = 16) {
    return FillReplayInputs(bucket, block_size, 0, 0, step.tokens(), step.rows(), out);
  };
  EXPECT_OK(fill({1, 2}, staging));
  EXPECT_THAT(fill({1, 1}, staging),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs 2 blocks")));
  EXPECT_THAT(fill({1, 2}, std::span<int32_t>(staging).first(ReplayLayout::For({1, 2}).total - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("staging")));
  EXPECT_THAT(fill({1, 2}, staging, /*block_size=*/8),  // 3 blocks at block size 8
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(fill({0, 2}, staging), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(fill({1, 2}, staging, /*block_size=*/0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  step.Row(2, 0, {3});
  EXPECT_THAT(fill({1, 2}, staging), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(fill({2, 2}, staging));
  const std::vector<int32_t> one_token = {1};
  EXPECT_THAT(FillReplayInputs({2, 2}, 16, 0, 0, one_token, step.rows(), staging),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // A bucket whose staging is past the bound is refused before any write.
  std::vector<int32_t> small(4, -1);
  EXPECT_THAT(FillReplayInputs({1 << 16, 1 << 20}, 16, 0, 0, step.tokens(), step.rows(), small),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(small, ElementsAre(-1, -1, -1, -1));
}

TEST(GraphBucketsTest, RefusesBadConfigurationSayingWhatToChange) {
  struct Case {
    void (*edit)(DecodeGraphOptions&);
    const char* says;
  };
  const std::vector<Case> cases = {
      {[](DecodeGraphOptions& o) { o.batch_buckets = {}; }, "give at least one bucket"},
      {[](DecodeGraphOptions& o) {
         o.batch_buckets = {1, 4, 2};
       },
       "smallest first"},
      {[](DecodeGraphOptions& o) {
         o.batch_buckets = {1, 2, 2};
       },
       "strictly increasing"},
      {[](DecodeGraphOptions& o) {
         o.batch_buckets = {0, 2};
       },
       "must be in [1, 65536]"},
      {[](DecodeGraphOptions& o) { o.batch_buckets = {-4}; }, "batch_buckets holds -4"},
      {[](DecodeGraphOptions& o) { o.batch_buckets = {kMaxGraphBatchRows + 1}; }, "[1, 65536]"},
      {[](DecodeGraphOptions& o) { o.kv_buckets = {}; }, "kv_buckets is empty"},
      {[](DecodeGraphOptions& o) {
         o.kv_buckets = {2, 1};
       },
       "kv_buckets [2, 1] is not"},
      {[](DecodeGraphOptions& o) { o.kv_buckets = {0}; }, "kv_buckets holds 0"},
      {[](DecodeGraphOptions& o) { o.kv_buckets = DefaultBatchBuckets(8000); }, "at most 512"},
      {[](DecodeGraphOptions& o) { o.block_size = 0; }, "block size"},
      {[](DecodeGraphOptions& o) { o.max_graphs = 0; }, "allow at least 1 graph"},
      {[](DecodeGraphOptions& o) { o.max_graphs = -1; }, "max_graphs is -1"},
      {[](DecodeGraphOptions& o) { o.max_graph_bytes = 0; }, "leave it unset"},
      {[](DecodeGraphOptions& o) { o.scratch_block = -1; }, "scratch_block -1"},
      {[](DecodeGraphOptions& o) { o.pad_token = -1; }, "pad_token -1"},
      {[](DecodeGraphOptions& o) {
         o.batch_buckets = {kMaxGraphBatchRows};
         o.kv_buckets = {1 << 20};
       },
       "lower the largest batch or KV bucket"},
  };
  for (const Case& c : cases) {
    DecodeGraphOptions options = Options();
    c.edit(options);
    EXPECT_THAT(DecodeGraphPlan::Create(options).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.says)))
        << c.says;
  }
}

TEST(GraphBucketsTest, SizesStayBoundedForHugeStepsAndLengths) {
  // The layout of the largest expressible bucket is exact in 64 bits.
  const int32_t most = std::numeric_limits<int32_t>::max();
  const ReplayLayout huge = ReplayLayout::For({most, most});
  EXPECT_EQ(huge.total, int64_t{most} * most + int64_t{6} * most);
  EXPECT_EQ(ReplayLayout::For({-3, 5}).total, 0);

  DecodeGraphOptions options = Options();
  options.block_size = 1 << 20;
  DecodeGraphPlan plan = MakePlan(options);
  // The last position before the int32 limit needs 2048 blocks of 2^20.
  Step longest;
  longest.Row(1, most - 1, std::vector<int32_t>(2048, 1));
  EXPECT_EQ(MustPlan(plan, std::move(longest)).reason, EagerReason::kTooLong);
  // 100000 rows, each over its own one-block table.
  std::vector<int32_t> blocks(100000, 0), tokens(100000, 1);
  std::vector<AttentionRow> rows;
  for (size_t i = 0; i < blocks.size(); ++i) {
    rows.push_back({0, std::span<const int32_t>(blocks).subspan(i, 1)});
  }
  absl::StatusOr<GraphDecision> d = plan.Plan(tokens, rows);
  ASSERT_OK(d.status());
  EXPECT_EQ(d->reason, EagerReason::kTooManyRows);
  EXPECT_EQ(d->real_rows, 100000);

  // Graph bytes saturate instead of wrapping.
  options = Options();
  plan = MakePlan(options);
  Capture(plan, {1, 1}, std::numeric_limits<size_t>::max());
  Capture(plan, {2, 1}, 10);
  EXPECT_EQ(plan.graph_bytes_held(), std::numeric_limits<size_t>::max());
}

TEST(GraphBucketsTest, EagerReasonNamesAreMetricLabels) {
  EXPECT_EQ(EagerReasonName(EagerReason::kNone), "none");
  EXPECT_EQ(EagerReasonName(EagerReason::kDisabled), "disabled");
  EXPECT_EQ(EagerReasonName(EagerReason::kNotDecode), "not_decode");
  EXPECT_EQ(EagerReasonName(EagerReason::kTooManyRows), "too_many_rows");
  EXPECT_EQ(EagerReasonName(EagerReason::kTooLong), "too_long");
  EXPECT_EQ(EagerReasonName(EagerReason::kCaptureFailed), "capture_failed");
  EXPECT_EQ(EagerReasonName(EagerReason::kNoGraphRoom), "no_graph_room");
  EXPECT_EQ(static_cast<int>(EagerReason::kNoGraphRoom) + 1, kEagerReasonCount);
}

}  // namespace
}  // namespace tandem
