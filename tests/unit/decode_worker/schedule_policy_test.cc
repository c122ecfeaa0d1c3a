// The schedule policies alone: plans respect the budget, each policy fills
// a step as it says, and a simulated stream of requests never starves.
#include "decode_worker/schedule_policy.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem::decode {
namespace {

using ::tandem::testing::StatusIs;

constexpr SchedulePolicyKind kAll[] = {SchedulePolicyKind::kDecodePriority,
                                       SchedulePolicyKind::kChunked,
                                       SchedulePolicyKind::kPrefillFirst};

ScheduleEntry Decoding(int decodes) { return ScheduleEntry{.decodes = decodes}; }
ScheduleEntry Prompt(int left, bool rows = false) {
  return ScheduleEntry{.prompt_left = left, .prompt_rows = rows};
}

struct Totals {
  int tokens = 0;
  int rows = 0;
  int decodes = 0;
  int prompt = 0;
};

Totals Sum(const std::vector<ScheduleEntry>& entries, const std::vector<ScheduledWork>& plan) {
  Totals t;
  for (const ScheduledWork& w : plan) {
    const ScheduleEntry& e = entries[w.entry];
    if (w.decode) {
      t.tokens += e.decodes;
      t.rows += e.decodes;
      t.decodes += e.decodes;
    }
    t.tokens += w.prompt_tokens;
    t.prompt += w.prompt_tokens;
    if (w.prompt_tokens > 0) {
      t.rows += e.prompt_rows ? w.prompt_tokens : (w.prompt_tokens == e.prompt_left ? 1 : 0);
    }
  }
  return t;
}

TEST(SchedulePolicy, NamesRoundTripAndUnknownIsRefused) {
  for (SchedulePolicyKind kind : kAll) {
    ASSERT_OK_AND_ASSIGN(SchedulePolicyKind parsed, ParseSchedulePolicy(SchedulePolicyName(kind)));
    EXPECT_EQ(parsed, kind);
    EXPECT_EQ(MakeSchedulePolicy(kind, 32)->name(), SchedulePolicyName(kind));
  }
  EXPECT_THAT(ParseSchedulePolicy("fifo"),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("prefill_first")));
}

TEST(SchedulePolicy, DecodePriorityDecodesAllThenFillsTheBudgetOldestFirst) {
  const std::vector<ScheduleEntry> entries = {Prompt(100), Decoding(3), Prompt(50), Decoding(1)};
  const auto plan = MakeSchedulePolicy(SchedulePolicyKind::kDecodePriority, 0)
                        ->Plan(entries, ScheduleBudget{.max_tokens = 64, .max_rows = 8});
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_TRUE(plan[0].decode && plan[0].entry == 1);
  EXPECT_TRUE(plan[1].decode && plan[1].entry == 3);
  EXPECT_EQ(plan[2].entry, 0u);
  EXPECT_EQ(plan[2].prompt_tokens, 60);  // 64 less 4 decodes; the younger prompt waits.
}

TEST(SchedulePolicy, ChunkedSharesItsFixedBudgetBetweenDecodesAndChunks) {
  const std::vector<ScheduleEntry> entries = {Decoding(3), Prompt(100), Prompt(5)};
  const auto policy = MakeSchedulePolicy(SchedulePolicyKind::kChunked, 16);
  const auto plan = policy->Plan(entries, ScheduleBudget{.max_tokens = 2048, .max_rows = 8});
  const Totals t = Sum(entries, plan);
  EXPECT_EQ(t.decodes, 3);
  EXPECT_EQ(t.tokens, 16);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[1].entry, 1u);
  EXPECT_EQ(plan[1].prompt_tokens, 13);
  // A prompt's last chunk takes a row; one whose logprobs are wanted takes
  // one per token.
  const std::vector<ScheduleEntry> rows = {Decoding(6), Prompt(12, /*rows=*/true)};
  const auto rows_plan = policy->Plan(rows, ScheduleBudget{.max_tokens = 2048, .max_rows = 8});
  EXPECT_EQ(Sum(rows, rows_plan).rows, 8);
  EXPECT_EQ(Sum(rows, rows_plan).prompt, 2);
}

TEST(SchedulePolicy, PrefillFirstComputesWholePromptsBeforeDecodes) {
  const auto policy = MakeSchedulePolicy(SchedulePolicyKind::kPrefillFirst, 0);
  const ScheduleBudget budget{.max_tokens = 256, .max_rows = 8};
  // Whole prompts, oldest first, as many as fit; no decode.
  const std::vector<ScheduleEntry> two = {Decoding(3), Prompt(100), Prompt(120), Prompt(90)};
  const auto plan = policy->Plan(two, budget);
  // The third does not fit whole beside them (36 tokens left): it waits.
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].entry, 1u);
  EXPECT_EQ(plan[0].prompt_tokens, 100);
  EXPECT_EQ(plan[1].entry, 2u);
  EXPECT_EQ(plan[1].prompt_tokens, 120);
}

TEST(SchedulePolicy, PrefillFirstSkipsPromptsThatDoNotFitWholeAndChunksOnlyAnOversizedOne) {
  const auto policy = MakeSchedulePolicy(SchedulePolicyKind::kPrefillFirst, 0);
  const ScheduleBudget budget{.max_tokens = 256, .max_rows = 8};
  const std::vector<ScheduleEntry> entries = {Decoding(3), Prompt(200), Prompt(100), Prompt(50)};
  const auto plan = policy->Plan(entries, budget);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].prompt_tokens, 200);
  EXPECT_EQ(plan[1].entry, 3u);  // 100 does not fit beside 200; 50 does.
  EXPECT_EQ(plan[1].prompt_tokens, 50);
  EXPECT_EQ(Sum(entries, plan).decodes, 0);
  // Longer than a step: chunked, alone.
  const std::vector<ScheduleEntry> big = {Decoding(3), Prompt(1000), Prompt(10)};
  const auto big_plan = policy->Plan(big, budget);
  ASSERT_EQ(big_plan.size(), 1u);
  EXPECT_EQ(big_plan[0].entry, 1u);
  EXPECT_EQ(big_plan[0].prompt_tokens, 256);
  // No prompt left: every running sequence decodes.
  const std::vector<ScheduleEntry> none = {Decoding(3), Decoding(2)};
  EXPECT_EQ(Sum(none, policy->Plan(none, budget)).decodes, 5);
}

// Random states: no plan exceeds the budget or an entry's prompt, names an
// entry twice, or decodes an entry that has nothing running.
TEST(SchedulePolicy, PlansRespectTheBudget) {
  std::mt19937_64 rng(11);
  for (SchedulePolicyKind kind : kAll) {
    const int chunk = 24;
    const auto policy = MakeSchedulePolicy(kind, chunk);
    for (int trial = 0; trial < 2000; ++trial) {
      const int max_rows = 1 + static_cast<int>(rng() % 16);  // max_sequences
      const int max_tokens = max_rows + static_cast<int>(rng() % 300);
      std::vector<ScheduleEntry> entries;
      int held = 0;
      while (held < max_rows && rng() % 4 != 0) {
        const int n = 1 + static_cast<int>(rng() % std::min(3, max_rows - held));
        if (rng() % 2 == 0) {
          entries.push_back(Decoding(n));
        } else {
          entries.push_back(Prompt(1 + static_cast<int>(rng() % 400), rng() % 5 == 0));
        }
        held += n;
      }
      const auto plan = policy->Plan(entries, ScheduleBudget{max_tokens, max_rows});
      const Totals t = Sum(entries, plan);
      const int cap =
          kind == SchedulePolicyKind::kChunked ? std::min(chunk, max_tokens) : max_tokens;
      EXPECT_LE(t.tokens, std::max(cap, t.decodes)) << SchedulePolicyName(kind);
      EXPECT_LE(t.tokens, max_tokens) << SchedulePolicyName(kind);
      EXPECT_LE(t.rows, max_rows) << SchedulePolicyName(kind);
      std::vector<bool> seen(entries.size(), false);
      for (const ScheduledWork& w : plan) {
        ASSERT_LT(w.entry, entries.size());
        EXPECT_FALSE(seen[w.entry]);
        seen[w.entry] = true;
        EXPECT_LE(w.prompt_tokens, entries[w.entry].prompt_left);
        EXPECT_GE(w.prompt_tokens, 0);
        if (w.decode) {
          EXPECT_GT(entries[w.entry].decodes, 0);
        }
      }
      const bool work = std::any_of(entries.begin(), entries.end(), [](const ScheduleEntry& e) {
        return e.decodes > 0 || e.prompt_left > 0;
      });
      if (work) {
        EXPECT_GT(t.tokens, 0) << SchedulePolicyName(kind) << " planned an empty step";
      }
    }
  }
}

// A simulated worker of 8 sequences, refilled with a new request whenever
// one ends: every held request gains a token (a prompt chunk or a decode)
// at least every kBound steps, and hundreds complete, under every policy.
TEST(SchedulePolicy, NoRequestStarves) {
  constexpr int kSequences = 8;
  constexpr int kBound = 64;
  for (SchedulePolicyKind kind : kAll) {
    const auto policy = MakeSchedulePolicy(kind, 16);
    const ScheduleBudget budget{.max_tokens = 64, .max_rows = kSequences};
    std::mt19937_64 rng(5);
    struct Held {
      ScheduleEntry entry;
      int to_generate;
      int idle_steps = 0;
    };
    std::vector<Held> held;
    int completed = 0, worst = 0;
    for (int step = 0; step < 5000; ++step) {
      while (static_cast<int>(held.size()) < kSequences) {
        held.push_back(Held{Prompt(1 + static_cast<int>(rng() % 150), rng() % 8 == 0),
                            1 + static_cast<int>(rng() % 20)});
      }
      std::vector<ScheduleEntry> entries;
      for (const Held& h : held) entries.push_back(h.entry);
      const auto plan = policy->Plan(entries, budget);
      for (Held& h : held) ++h.idle_steps;
      for (const ScheduledWork& w : plan) {
        Held& h = held[w.entry];
        if (!w.decode && w.prompt_tokens == 0) continue;
        h.idle_steps = 0;
        if (w.decode) --h.to_generate;
        h.entry.prompt_left -= w.prompt_tokens;
        if (w.prompt_tokens > 0 && h.entry.prompt_left == 0) {
          h.entry.decodes = 1;  // The first token came with the last chunk.
          --h.to_generate;
        }
      }
      for (const Held& h : held) worst = std::max(worst, h.idle_steps);
      const size_t before = held.size();
      std::erase_if(held, [](const Held& h) { return h.to_generate <= 0; });
      completed += static_cast<int>(before - held.size());
    }
    RecordProperty(absl::StrCat(std::string(SchedulePolicyName(kind)), "_worst_idle_steps"), worst);
    RecordProperty(absl::StrCat(std::string(SchedulePolicyName(kind)), "_completed"), completed);
    EXPECT_LE(worst, kBound) << SchedulePolicyName(kind);
    EXPECT_GT(completed, 500) << SchedulePolicyName(kind);
  }
}

}  // namespace
}  // namespace tandem::decode
