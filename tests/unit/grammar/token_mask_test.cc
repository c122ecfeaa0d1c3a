#include "common/grammar/token_mask.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/engine/sampler.h"
#include "common/grammar/automaton.h"
#include "common/grammar/constraint.h"
#include "common/grammar/json_schema.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::grammar {
namespace {

// A small vocabulary like a real one: every byte, JSON fragments, words
// with and without a leading space, and two tokens without bytes (a stop
// token and a control token).
std::vector<std::string> SmallVocab() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  for (const char* piece : {"{\"",
                            "\":",
                            "\": ",
                            "\",",
                            "\", \"",
                            "\"}",
                            "}",
                            "},",
                            "[",
                            "[{",
                            "]}",
                            "true",
                            "false",
                            "null",
                            "nul",
                            "tr",
                            "name",
                            " name",
                            "age",
                            "\"age",
                            "12",
                            "00",
                            "-1",
                            ".5",
                            "e3",
                            "Ann",
                            " Ann",
                            "red",
                            "\"red\"",
                            "green",
                            "\\n",
                            "\\u00",
                            "\xc3\xa9",
                            "\xc3",
                            "  ",
                            "\n  ",
                            "ok",
                            "kids",
                            "v",
                            "1}",
                            "\":[",
                            "\":{",
                            "\xf0\x9f\x98\x80"}) {
    v.push_back(piece);
  }
  v.push_back("");  // stop
  v.push_back("");  // control
  return v;
}

std::shared_ptr<CompiledGrammar> Compile(const ConstraintSpec& spec,
                                         std::shared_ptr<const Vocabulary> vocab) {
  absl::StatusOr<std::shared_ptr<const Grammar>> g = CompileConstraint(spec);
  EXPECT_TRUE(g.ok()) << g.status();
  return std::make_shared<CompiledGrammar>(*g, std::move(vocab));
}

constexpr const char* kPerson = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0},
    "colour": {"enum": ["red", "green"]}, "tags": {"type": "array", "items": {"type": "string"},
    "maxItems": 2}}, "required": ["name", "age", "colour"], "additionalProperties": false})";

// Random walks that pick uniformly among the allowed tokens; at each state
// the mask must equal a brute-force check of every token through a fresh
// automaton, and every finished walk must be JSON of the schema.
TEST(TokenMaskTest, MasksMatchBruteForceAndWalksEndInValidJson) {
  auto vocab = std::make_shared<const Vocabulary>(SmallVocab());
  const int stop = vocab->size() - 2;
  for (const ConstraintSpec& spec : {ConstraintSpec{ConstraintSpec::Kind::kJsonSchema, kPerson},
                                     ConstraintSpec{ConstraintSpec::Kind::kJsonObject, ""}}) {
    auto compiled = Compile(spec, vocab);
    auto reference = std::make_shared<const Grammar>(**CompileConstraint(spec));
    Automaton brute(reference);
    std::mt19937_64 rng(7);
    int finished = 0;
    for (int walk = 0; walk < 40; ++walk) {
      int32_t state = compiled->start();
      int32_t brute_state = brute.start();
      std::string text;
      for (int step = 0; step < 60; ++step) {
        const std::shared_ptr<const TokenMask> mask = compiled->Mask(state);
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < vocab->size(); ++id) {
          int32_t s = brute_state;
          for (const char c : vocab->bytes(id)) s = brute.Step(s, static_cast<uint8_t>(c));
          const bool expect = !vocab->bytes(id).empty() && s != kDeadState;
          ASSERT_EQ(mask->Allows(id), expect) << "token " << id << " after " << text;
          if (expect) allowed.push_back(id);
        }
        ASSERT_EQ(mask->allowed, static_cast<int>(allowed.size()));
        EXPECT_EQ(mask->accepting, brute.accepting(brute_state));
        if (mask->accepting && (allowed.empty() || rng() % 4 == 0)) {
          const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
          ASSERT_FALSE(j.is_discarded()) << text;
          ASSERT_TRUE(j.is_object()) << text;
          if (spec.kind == ConstraintSpec::Kind::kJsonSchema) {
            EXPECT_TRUE(j["name"].is_string() && j["name"].get<std::string>().size() <= 16);
            EXPECT_TRUE(j["age"].is_number_unsigned()) << text;
            EXPECT_TRUE(j["colour"] == "red" || j["colour"] == "green") << text;
            EXPECT_LE(j.value("tags", nlohmann::json::array()).size(), 2u) << text;
          }
          ++finished;
          break;
        }
        ASSERT_FALSE(allowed.empty()) << "stuck after " << text;
        const int32_t token = allowed[rng() % allowed.size()];
        text += vocab->bytes(token);
        state = compiled->Advance(state, token);
        for (const char c : vocab->bytes(token)) {
          brute_state = brute.Step(brute_state, static_cast<uint8_t>(c));
        }
        ASSERT_NE(state, kDeadState);
      }
    }
    EXPECT_GT(finished, 0);
    EXPECT_EQ(compiled->Advance(compiled->start(), stop), compiled->start());
  }
}

TEST(TokenMaskTest, DeadStateAllowsNothingAndOutOfRangeTokensAreRefused) {
  auto vocab = std::make_shared<const Vocabulary>(SmallVocab());
  auto compiled = Compile({ConstraintSpec::Kind::kJsonObject, ""}, vocab);
  EXPECT_EQ(compiled->Advance(compiled->start(), 'x'), kDeadState);
  EXPECT_EQ(compiled->Mask(kDeadState)->allowed, 0);
  EXPECT_EQ(compiled->Advance(compiled->start(), -1), kDeadState);
  EXPECT_EQ(compiled->Advance(compiled->start(), vocab->size()), kDeadState);
  EXPECT_EQ(compiled->Mask(compiled->start()), compiled->Mask(compiled->start()));  // kept
}

TEST(TokenMaskTest, CacheReturnsTheSameGrammarForTheSameSpec) {
  auto vocab = std::make_shared<const Vocabulary>(SmallVocab());
  GrammarCache cache(vocab, 2);
  const ConstraintSpec a{ConstraintSpec::Kind::kJsonSchema, R"({"type": "integer"})"};
  const ConstraintSpec b{ConstraintSpec::Kind::kJsonObject, ""};
  const ConstraintSpec c{ConstraintSpec::Kind::kJsonSchema, R"({"type": "boolean"})"};
  auto first = *cache.Get(a);
  EXPECT_EQ(*cache.Get(a), first);
  ASSERT_TRUE(cache.Get(b).ok());
  ASSERT_TRUE(cache.Get(a).ok());  // a used last: b is the one dropped
  ASSERT_TRUE(cache.Get(c).ok());
  EXPECT_EQ(*cache.Get(a), first);
  absl::StatusOr<std::shared_ptr<CompiledGrammar>> bad =
      cache.Get({ConstraintSpec::Kind::kJsonSchema, R"({"type": "string", "oneOf": [{}]})"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// The sampler masks what the grammar refuses and lets the stop token
// through only once the output is a whole JSON value.
TEST(TokenMaskTest, SamplerFollowsTheGrammarAndStopsOnlyWhenComplete) {
  auto vocab = std::make_shared<const Vocabulary>(SmallVocab());
  const int32_t stop = vocab->size() - 2;
  SamplingParams params;
  params.grammar = Compile({ConstraintSpec::Kind::kJsonSchema, R"({"type": "boolean"})"}, vocab);
  const std::vector<int32_t> stops = {stop};
  Sampler sampler(params, {}, stops);
  std::vector<float> logits(vocab->size(), 0.0f);
  logits[stop] = 9.0f;  // the model wants to stop at once
  logits['{'] = 8.0f;   // or write an object
  logits['f'] = 1.0f;
  std::string text;
  for (int i = 0; i < 8; ++i) {
    const int32_t token = sampler.Sample(logits);
    sampler.Accept(token);
    if (token == stop) break;
    text += vocab->bytes(token);
    logits[token] = -1.0f;  // move on
  }
  EXPECT_EQ(text, "false");
  EXPECT_TRUE(params.grammar->Mask(sampler.grammar_state())->accepting);
}

// A forced control token (Mistral's [TOOL_CALLS], no bytes) comes first,
// whatever the model prefers, then the grammar; the cache refuses forced
// ids outside the vocabulary and keys on them.
TEST(TokenMaskTest, ForcedControlTokenComesFirst) {
  auto vocab = std::make_shared<const Vocabulary>(SmallVocab());
  const int32_t stop = vocab->size() - 2;
  const int32_t control = vocab->size() - 1;
  ConstraintSpec spec{ConstraintSpec::Kind::kJsonSchema, R"({"type": "boolean"})"};
  spec.forced_tokens = {control};
  GrammarCache cache(vocab);
  std::shared_ptr<CompiledGrammar> compiled = *cache.Get(spec);
  EXPECT_NE(*cache.Get({ConstraintSpec::Kind::kJsonSchema, R"({"type": "boolean"})"}), compiled);
  const std::shared_ptr<const TokenMask> first = compiled->Mask(compiled->start());
  EXPECT_EQ(first->allowed, 1);
  EXPECT_TRUE(first->Allows(control));
  EXPECT_FALSE(first->accepting);
  EXPECT_EQ(compiled->Advance(compiled->start(), 't'), kDeadState);
  EXPECT_EQ(compiled->Advance(compiled->Advance(compiled->start(), control), 't'),
            compiled->Advance(0, 't'));

  SamplingParams params;
  params.grammar = compiled;
  const std::vector<int32_t> stops = {stop};
  Sampler sampler(params, {}, stops);
  std::vector<float> logits(vocab->size(), 0.0f);
  logits[stop] = 9.0f;
  logits['t'] = 8.0f;
  std::vector<int32_t> out;
  for (int i = 0; i < 8 && (out.empty() || out.back() != stop); ++i) {
    out.push_back(sampler.Sample(logits));
    sampler.Accept(out.back());
    logits['t'] = out.back() == 't' ? -1.0f : logits['t'];
  }
  ASSERT_GE(out.size(), 3u);
  EXPECT_EQ(out.front(), control);
  std::string text;
  for (size_t k = 1; k + 1 < out.size(); ++k) text += vocab->bytes(out[k]);
  EXPECT_EQ(text, "true");
  EXPECT_EQ(out.back(), stop);

  spec.forced_tokens = {vocab->size()};
  EXPECT_EQ(cache.Get(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.forced_tokens.assign(CompiledGrammar::kMaxForcedTokens + 1, control);
  EXPECT_EQ(cache.Get(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::grammar
