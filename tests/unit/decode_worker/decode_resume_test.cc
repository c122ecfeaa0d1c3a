// A migrated request (Request::resume): a decode worker given the tokens
// each choice already generated elsewhere computes them, replays them
// through each choice's sampler and sends exactly the tokens that a run
// without the migration would have sent after them, greedy or sampled with
// penalties, with the prefix cache on or off; a choice given as finished
// gets nothing. Malformed resumes are refused, saying what to change.
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"

namespace tandem::decode::testing {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

// Parameters: the prefix cache on or off; greedy or sampled decoding.
class DecodeResume : public ::testing::TestWithParam<std::tuple<bool, bool>> {
 protected:
  Request Make(const std::string& id) const {
    Request r = LocalRequest(id, RandomTokens(21, kVocab, 5), 40);
    r.sampling.min_tokens = 30;
    if (std::get<1>(GetParam())) {
      r.sampling = SamplingParams{.temperature = 0.9f,
                                  .top_p = 0.95f,
                                  .seed = 31,
                                  .presence_penalty = 0.3f,
                                  .frequency_penalty = 0.4f,
                                  .min_tokens = 30};
    }
    r.stop_token_ids = {7};
    r.n = 2;
    return r;
  }
};

std::vector<int32_t> ExpectedChoice(DecodeHarness& h, Request r, int c) {
  r.sampling.seed = ChoiceSeed(r.sampling.seed, c);
  r.n = 1;
  return h.Expected(r);
}

TEST_P(DecodeResume, ResumedChoicesContinueWithTheTokensOfAnUnmigratedRun) {
  DecodeLoopOptions options;
  options.prefix_cache = std::get<0>(GetParam());
  DecodeHarness h(options);
  const Request base = Make("base");
  const std::vector<int32_t> want0 = ExpectedChoice(h, base, 0);
  const std::vector<int32_t> want1 = ExpectedChoice(h, base, 1);
  ASSERT_GE(want0.size(), 20u);
  ASSERT_GE(want1.size(), 20u);

  // Choice 0 lost after 1, 16 (a block's worth) and 19 tokens; choice 1
  // after 5, or already over.
  for (const size_t k0 : {size_t{1}, size_t{16}, size_t{19}}) {
    for (const bool second_finished : {false, true}) {
      Request r = Make(absl::StrCat("resume-", k0, second_finished ? "-f" : ""));
      r.resume = {{.tokens = {want0.begin(), want0.begin() + k0}},
                  {.tokens = {want1.begin(), want1.begin() + 5}, .finished = second_finished}};
      auto sink = NewSink();
      ASSERT_OK(h.loop().Submit(r, sink).status());
      ASSERT_TRUE(sink->WaitEnded());
      ASSERT_OK(sink->status());
      EXPECT_EQ(sink->tokens(0), std::vector<int32_t>(want0.begin() + k0, want0.end()))
          << "after " << k0;
      ASSERT_TRUE(sink->finished(0).has_value());
      EXPECT_EQ(sink->finished(0)->completion_tokens, static_cast<int>(want0.size()));
      if (second_finished) {
        EXPECT_TRUE(sink->tokens(1).empty());
        EXPECT_FALSE(sink->finished(1).has_value());
        EXPECT_EQ(sink->finished_count(), 1);
      } else {
        EXPECT_EQ(sink->tokens(1), std::vector<int32_t>(want1.begin() + 5, want1.end()));
      }
    }
  }
  EXPECT_TRUE(h.AllBlocksFree());
}

// Without local_prefill the K/V of the prompt and of the tokens but the
// last arrives over a lease (from a prefill worker, or the worker the
// stream leaves), and the Start names the last token: the stream goes on
// exactly as a run without the move.
TEST_P(DecodeResume, ARemoteResumeReceivesTheKvOfItsTokensAndContinuesAsAnUnmovedRun) {
  DecodeLoopOptions options;
  options.prefix_cache = std::get<0>(GetParam());
  DecodeHarness h(options);
  Request base = Make("base");
  base.n = 1;
  const std::vector<int32_t> want = ExpectedChoice(h, base, 0);
  ASSERT_GE(want.size(), 20u);
  for (const size_t k : {size_t{1}, size_t{16}, size_t{19}}) {
    Request r = base;
    r.request_id = absl::StrCat("remote-", k);
    r.local_prefill = false;
    r.resume = {{.tokens = {want.begin(), want.begin() + k}}};
    auto sink = NewSink();
    ASSERT_OK(h.loop().Submit(r, sink).status());
    ASSERT_TRUE(sink->WaitReserved()) << sink->status();
    // The earlier runs left these tokens' first blocks cached: not shipped.
    if (std::get<0>(GetParam()) && k > 1) {
      EXPECT_GT(sink->cached_tokens(), 0) << "after " << k;
    }
    std::vector<int32_t> kv = r.prompt;
    kv.insert(kv.end(), want.begin(), want.begin() + k - 1);
    ASSERT_OK(h.prefill().Prefill(kv, sink->descriptor()).status());
    // The token the stream had last is the one to name.
    StartResult wrong;
    h.loop().Start(r.request_id, sink->generation(), (want[k - 1] + 1) % kVocab, wrong.Callback());
    EXPECT_THAT(wrong.Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("last resumed token")));
    StartResult start;
    h.loop().Start(r.request_id, sink->generation(), want[k - 1], start.Callback());
    ASSERT_OK(start.Wait());
    ASSERT_TRUE(sink->WaitEnded());
    ASSERT_OK(sink->status());
    EXPECT_EQ(sink->tokens(0), std::vector<int32_t>(want.begin() + k, want.end())) << "after " << k;
    ASSERT_TRUE(sink->finished(0).has_value());
    EXPECT_EQ(sink->finished(0)->completion_tokens, static_cast<int>(want.size()));
  }
  EXPECT_TRUE(h.AllBlocksFree());
}

INSTANTIATE_TEST_SUITE_P(CacheAndSampling, DecodeResume,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<bool, bool>>& info) {
                           return absl::StrCat(std::get<0>(info.param) ? "Cached" : "Uncached",
                                               std::get<1>(info.param) ? "Sampled" : "Greedy");
                         });

TEST(DecodeResumeRefusals, MalformedResumesSayWhatToChange) {
  DecodeHarness h;
  const Request base = LocalRequest("r", RandomTokens(10, kVocab, 1), 20);
  struct Case {
    std::function<void(Request&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {[](Request& r) {
         r.local_prefill = false;
         r.n = 2;
         r.resume = {{.tokens = {1}}, {.tokens = {1}}};
       },
       "takes one unfinished choice"},
      {[](Request& r) {
         r.resume = {{.tokens = {1}}, {.tokens = {1}}};
       },
       "one per choice"},
      {[](Request& r) { r.resume = {{.tokens = {}}}; }, "1 to max_tokens - 1"},
      {[](Request& r) { r.resume = {{.tokens = std::vector<int32_t>(20, 3)}}; },
       "1 to max_tokens - 1"},
      {[](Request& r) { r.resume = {{.tokens = {kVocab}}}; }, "token ids must be in"},
      {[](Request& r) { r.resume = {{.finished = true}}; }, "no unfinished choice"},
  };
  for (const Case& c : cases) {
    Request r = base;
    c.change(r);
    auto sink = NewSink();
    absl::Status submitted = h.loop().Submit(r, sink).status();
    if (submitted.ok()) {
      ASSERT_TRUE(sink->WaitEnded());
      submitted = sink->status();
    }
    EXPECT_THAT(submitted, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
  EXPECT_TRUE(h.AllBlocksFree());
}

}  // namespace
}  // namespace tandem::decode::testing
