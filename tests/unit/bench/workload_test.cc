// Arrivals, datasets and SSE parsing.
#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/bench/arrivals.h"
#include "tools/bench/dataset.h"
#include "tools/bench/sse.h"

namespace tandem::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Moments {
  double mean, var;
};

Moments Sample(double rate, double burstiness, uint64_t seed, int n = 200000) {
  ArrivalGenerator gen(rate, burstiness, seed);
  std::vector<double> gaps(n);
  double sum = 0;
  for (double& g : gaps) sum += (g = gen.NextGap());
  const double mean = sum / n;
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  return {mean, var / n};
}

TEST(ArrivalTest, PoissonHasTheRequestedRate) {
  const Moments m = Sample(10, 1, 42);
  EXPECT_NEAR(1 / m.mean, 10, 0.1);
  EXPECT_NEAR(m.var, 0.01, 0.0005);  // exponential: variance = mean^2
}

TEST(ArrivalTest, BurstinessChangesVarianceNotRate) {
  const Moments bursty = Sample(10, 0.25, 42);
  const Moments smooth = Sample(10, 4, 42);
  EXPECT_NEAR(1 / bursty.mean, 10, 0.2);
  EXPECT_NEAR(1 / smooth.mean, 10, 0.1);
  EXPECT_NEAR(bursty.var, 0.04, 0.003);  // mean^2 / shape
  EXPECT_NEAR(smooth.var, 0.0025, 0.0002);
}

TEST(ArrivalTest, SameSeedSameSchedule) {
  ArrivalGenerator a(5, 1, 7), b(5, 1, 7), c(5, 1, 8);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const double x = a.NextGap();
    EXPECT_EQ(x, b.NextGap());
    differs |= x != c.NextGap();
  }
  EXPECT_TRUE(differs);
}

TEST(ArrivalTest, InfiniteRateSendsAtOnce) {
  ArrivalGenerator gen(INFINITY, 1, 1), zero(0, 1, 1);
  EXPECT_EQ(gen.NextGap(), 0);
  EXPECT_EQ(zero.NextGap(), 0);
}

TEST(JsonlTest, ParsesPromptsAndDefaults) {
  auto list = ParseJsonl(
      "{\"prompt\": \"one two three\", \"max_tokens\": 5}\n\n"
      "{\"prompt\": \"x\"}\r\n",
      16);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].prompt, "one two three");
  EXPECT_EQ((*list)[0].max_tokens, 5);
  EXPECT_EQ((*list)[0].prompt_len, 3);
  EXPECT_EQ((*list)[1].max_tokens, 16);
}

TEST(JsonlTest, BadLinesNameTheLine) {
  auto not_json = ParseJsonl("{\"prompt\": \"a\"}\nnot json\n", 4);
  ASSERT_FALSE(not_json.ok());
  EXPECT_THAT(not_json.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(ParseJsonl("{\"text\": \"a\"}", 4).status().message(), HasSubstr("\"prompt\""));
  EXPECT_THAT(ParseJsonl("{\"prompt\": \"a\", \"max_tokens\": 0}", 4).status().message(),
              HasSubstr("max_tokens"));
  EXPECT_THAT(ParseJsonl("[1]", 4).status().message(), HasSubstr("line 1"));
  EXPECT_FALSE(ParseJsonl("\n\n", 4).ok());
}

// The router's request log, replayed: the requests that ended ok, in
// arrival order from the first, with their lengths (completion tokens per
// choice) and the seconds between them.
TEST(RequestLogTest, ReplaysTheOkRequestsAtTheirTimes) {
  DatasetOptions o{.token_ids = true, .vocab_size = 100, .seed = 5};
  const std::string log =
      R"({"status":"ok","arrival_unix_us":3500000,"prompt_tokens":7,"completion_tokens":8,"n":2})"
      "\n"
      R"({"status":"invalid_argument","arrival_unix_us":1000000,"prompt_tokens":1,"n":1})"
      "\n\n"
      R"({"status":"ok","arrival_unix_us":2000000,"prompt_tokens":3,"completion_tokens":0,"n":1})"
      "\n";
  int skipped = 0;
  auto list = ParseRequestLog(log, o, &skipped);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(skipped, 1);
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].arrival_s, 0.0);
  EXPECT_EQ((*list)[0].token_ids.size(), 3u);
  EXPECT_EQ((*list)[0].max_tokens, 1);  // none generated: still one to ask for
  EXPECT_EQ((*list)[1].arrival_s, 1.5);
  EXPECT_EQ((*list)[1].prompt_len, 7);
  EXPECT_EQ((*list)[1].max_tokens, 4);
  for (const BenchRequest& r : *list) {
    for (int32_t id : r.token_ids) EXPECT_TRUE(id >= 3 && id < 100) << id;
  }
  // Text targets cannot replay counts; bad lines are named.
  o.token_ids = false;
  EXPECT_THAT(ParseRequestLog(log, o).status().message(), HasSubstr("token ids"));
  o.token_ids = true;
  EXPECT_THAT(ParseRequestLog("{\"status\":\"ok\",\"prompt_tokens\":3}", o).status().message(),
              HasSubstr("line 1: needs an integer \"arrival_unix_us\""));
  EXPECT_THAT(ParseRequestLog("{\"status\":\"cancelled\"}", o).status().message(),
              HasSubstr("no request that ended ok"));
}

TEST(DatasetTest, MissingJsonlFileIsAnError) {
  DatasetOptions o;
  o.kind = "jsonl";
  o.path = "/nonexistent/x.jsonl";
  EXPECT_FALSE(MakeDataset(o).ok());
  o.kind = "nope";
  EXPECT_FALSE(MakeDataset(o).ok());
}

TEST(DatasetTest, SyntheticLengthsAndDeterminism) {
  auto d = MakeDataset({.kind = "synthetic",
                        .path = "",
                        .input_len = 100,
                        .output_len = 20,
                        .range_ratio = 0.5,
                        .token_ids = true,
                        .vocab_size = 64,
                        .seed = 3});
  ASSERT_TRUE(d.ok()) << d.status();
  bool varied = false;
  for (size_t i = 0; i < 200; ++i) {
    const BenchRequest r = (*d)->Get(i);
    EXPECT_GE(r.prompt_len, 50);
    EXPECT_LE(r.prompt_len, 150);
    EXPECT_EQ(static_cast<int>(r.token_ids.size()), r.prompt_len);
    EXPECT_GE(r.max_tokens, 10);
    EXPECT_LE(r.max_tokens, 30);
    for (int32_t id : r.token_ids) {
      EXPECT_GE(id, 3);
      EXPECT_LT(id, 64);
    }
    varied |= r.prompt_len != (*d)->Get(0).prompt_len;
  }
  EXPECT_TRUE(varied);
  EXPECT_EQ((*d)->Get(5).token_ids, (*d)->Get(5).token_ids);
  auto text = MakeDataset({.kind = "synthetic", .path = "", .input_len = 10, .output_len = 4});
  ASSERT_TRUE(text.ok());
  const BenchRequest t = (*text)->Get(0);
  EXPECT_TRUE(t.token_ids.empty());
  EXPECT_EQ(std::count(t.prompt.begin(), t.prompt.end(), ' '), 9);  // 10 words
  EXPECT_EQ(t.max_tokens, 4);
}

TEST(DatasetTest, SharedPrefixRequestsShareOneOfKPrefixes) {
  auto d = MakeDataset({.kind = "shared_prefix",
                        .path = "",
                        .input_len = 8,
                        .output_len = 4,
                        .num_prefixes = 3,
                        .prefix_len = 32,
                        .token_ids = true});
  ASSERT_TRUE(d.ok());
  auto prefix = [&](size_t i) {
    const auto ids = (*d)->Get(i).token_ids;
    return std::vector<int32_t>(ids.begin(), ids.begin() + 32);
  };
  EXPECT_EQ((*d)->Get(0).token_ids.size(), 40u);
  EXPECT_EQ((*d)->Get(0).prompt_len, 40);
  EXPECT_EQ(prefix(0), prefix(3));
  EXPECT_EQ(prefix(1), prefix(4));
  EXPECT_NE(prefix(0), prefix(1));
  EXPECT_NE((*d)->Get(0).token_ids, (*d)->Get(3).token_ids);  // own suffixes
}

// Turn t of a conversation is sent a think time after turn t - 1 ended,
// and its prompt is turn t - 1's, a stand-in for that turn's reply (its
// max_tokens long) and a new user message.
TEST(DatasetTest, MultiTurnPromptsCarryTheConversationSoFar) {
  const DatasetOptions options{.kind = "multi_turn",
                               .input_len = 8,
                               .output_len = 4,
                               .range_ratio = 0.5,
                               .turns = 3,
                               .think_time_s = 1.5,
                               .token_ids = true,
                               .seed = 2};
  auto d = MakeDataset(options);
  ASSERT_TRUE(d.ok()) << d.status();
  for (size_t c = 0; c < 2; ++c) {
    const BenchRequest first = (*d)->Get(3 * c);
    EXPECT_EQ(first.follows, -1);
    EXPECT_GE(first.prompt_len, 4);
    EXPECT_LE(first.prompt_len, 12);
    for (size_t t = 1; t < 3; ++t) {
      const BenchRequest prev = (*d)->Get(3 * c + t - 1);
      const BenchRequest r = (*d)->Get(3 * c + t);
      EXPECT_EQ(r.follows, static_cast<int64_t>(3 * c + t - 1));
      EXPECT_EQ(r.think_s, 1.5);
      ASSERT_GT(r.token_ids.size(), prev.token_ids.size() + prev.max_tokens);
      EXPECT_TRUE(std::equal(prev.token_ids.begin(), prev.token_ids.end(), r.token_ids.begin()));
      const int user = r.prompt_len - prev.prompt_len - prev.max_tokens;
      EXPECT_GE(user, 4);
      EXPECT_LE(user, 12);
      EXPECT_EQ(r.prompt_len, static_cast<int>(r.token_ids.size()));
    }
  }
  // Conversations differ, and the same options give the same requests.
  EXPECT_NE((*d)->Get(0).token_ids, (*d)->Get(3).token_ids);
  auto again = MakeDataset(options);
  EXPECT_EQ((*again)->Get(5).token_ids, (*d)->Get(5).token_ids);
  EXPECT_FALSE(MakeDataset({.kind = "multi_turn", .turns = 0}).ok());
  EXPECT_FALSE(MakeDataset({.kind = "multi_turn", .turns = 65}).ok());
  EXPECT_FALSE(MakeDataset({.kind = "multi_turn", .think_time_s = -1}).ok());
}

TEST(SseTest, SplitsDataLinesAcrossChunks) {
  std::vector<std::string> got;
  SseParser parser([&](std::string_view d) { got.emplace_back(d); });
  parser.Feed("data: {\"a\":1}\n\nda");
  parser.Feed("ta: [DONE]\r\n\r\n: a comment\nevent: x\ndata:{\"b\"");
  EXPECT_THAT(got, ElementsAre("{\"a\":1}", "[DONE]"));
  parser.Feed(":2}\n");
  EXPECT_THAT(got, ElementsAre("{\"a\":1}", "[DONE]", "{\"b\":2}"));
}

}  // namespace
}  // namespace tandem::bench
