// Structured outputs through the cluster over gRPC: JSON that a schema
// accepts from real router, prefill and decode processes, prefilled on a
// prefill worker (first token masked there) or on the decode worker, and
// through preemptions on a decode worker whose KV pool is too small for
// everything it admits. A worker without a tokenizer refuses, saying how to
// give it one.
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_harness.h"
#include "tests/testing/model_files.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

constexpr const char* kSchema = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "friends": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 6},
    "age": {"type": "integer", "minimum": 0},
    "mood": {"enum": ["happy", "sad"]}},
    "required": ["name", "friends", "age", "mood"], "additionalProperties": false})";

// What kSchema accepts, checked by hand on the parsed value.
void ExpectMatchesSchema(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "not JSON: " << text;
  ASSERT_TRUE(j.is_object()) << text;
  EXPECT_EQ(j.size(), 4u) << text;
  ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
  EXPECT_LE(j["name"].get<std::string>().size(), 16u * 4) << text;
  ASSERT_TRUE(j.contains("friends") && j["friends"].is_array()) << text;
  EXPECT_LE(j["friends"].size(), 6u) << text;
  for (const auto& f : j["friends"]) EXPECT_TRUE(f.is_string()) << text;
  ASSERT_TRUE(j.contains("age") && j["age"].is_number_unsigned()) << text;
  EXPECT_TRUE(j["mood"] == "happy" || j["mood"] == "sad") << text;
}

v1::GenerateRequest SchemaRequest(const std::string& prompt, float temperature, uint64_t seed) {
  v1::GenerateRequest r = TextRequest(prompt, 400);
  r.mutable_sampling()->mutable_constraint()->set_json_schema(kSchema);
  r.mutable_sampling()->set_temperature(temperature);
  r.mutable_sampling()->set_seed(seed);
  return r;
}

class StructuredClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = ModelFile("stories260K.bin");
    tokenizer_ = ModelFile("tok512.bin");
  }
  void Start(ClusterOptions options, bool worker_tokenizers = true) {
    options.model = model_;
    options.tokenizer = tokenizer_;
    if (worker_tokenizers) {
      options.prefill_flags.push_back("--tokenizer=" + tokenizer_);
      options.decode_flags.push_back("--tokenizer=" + tokenizer_);
    }
    auto cluster = Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
  }

  std::string model_, tokenizer_;
  std::unique_ptr<Cluster> cluster_;
};

#define REQUIRE_FIXTURES()                                  \
  TANDEM_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin"); \
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");  \
  (void)model_path;                                         \
  (void)tokenizer_path

// Twelve streams at once on a decode worker of 40 KV blocks (16 tokens
// each): they are admitted by their prompts and preempted as they grow, and
// each resumes with its grammar state where it was.
TEST_F(StructuredClusterTest, DisaggregatedSampledAndPreemptedOutputsMatchTheSchema) {
  REQUIRE_FIXTURES();
  Start({.prefill = 1, .decode = 1, .decode_flags = {"--kv_blocks=40"}});
  constexpr int kStreams = 12;
  std::vector<Completion> got(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      got[i] = RunGenerate(
          cluster_->router(),
          SchemaRequest(absl::StrCat("Tom had ", i, " friends. Their names were"), i % 2, 100 + i),
          absl::Seconds(120));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message() << "\n"
                                    << cluster_->Logs();
    EXPECT_EQ(got[i].finished.reason(), v1::FINISH_REASON_EOS) << got[i].text;
    EXPECT_TRUE(got[i].finished.disaggregated());
    ExpectMatchesSchema(got[i].text);
  }
  absl::StatusOr<v1::WorkerStats> stats = cluster_->Stats(cluster_->decode(0));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->preemptions(), 0u) << "no preemption: the test did not test it";
  EXPECT_TRUE(cluster_->WaitUntilIdle(absl::Seconds(10)).ok());
}

TEST_F(StructuredClusterTest, PrefilledOnTheDecodeWorkerToo) {
  REQUIRE_FIXTURES();
  Start({.prefill = 1, .decode = 1, .router_flags = {"--local_prefill_tokens=4096"}});
  for (int i = 0; i < 3; ++i) {
    const Completion got =
        RunGenerate(cluster_->router(), SchemaRequest("Lily met a cat", i == 0 ? 0 : 1, i));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << cluster_->Logs();
    EXPECT_FALSE(got.finished.disaggregated());
    ExpectMatchesSchema(got.text);
  }
  v1::GenerateRequest code = TextRequest("The code is", 40);
  code.mutable_sampling()->mutable_constraint()->set_regex(R"( [A-Z]{3}-\d{2,4}\.)");
  const Completion matched = RunGenerate(cluster_->router(), code);
  ASSERT_TRUE(matched.status.ok()) << matched.status.error_message();
  EXPECT_TRUE(std::regex_match(matched.text, std::regex(R"( [A-Z]{3}-\d{2,4}\.)"))) << matched.text;
  EXPECT_EQ(matched.finished.reason(), v1::FINISH_REASON_EOS);
  v1::GenerateRequest any = TextRequest("Once upon a time", 300);
  any.mutable_sampling()->mutable_constraint()->set_json_object(true);
  const Completion object = RunGenerate(cluster_->router(), any);
  ASSERT_TRUE(object.status.ok()) << object.status.error_message();
  // Any object may hold a string longer than max_tokens: cut, it is still
  // an object's start.
  if (object.finished.reason() == v1::FINISH_REASON_EOS) {
    EXPECT_TRUE(nlohmann::json::parse(object.text, nullptr, false).is_object()) << object.text;
  } else {
    EXPECT_EQ(object.text.substr(0, 1), "{") << object.text;
  }
}

TEST_F(StructuredClusterTest, WorkersWithoutATokenizerRefuseSayingHow) {
  REQUIRE_FIXTURES();
  Start({.prefill = 1, .decode = 1}, /*worker_tokenizers=*/false);
  const Completion got = RunGenerate(cluster_->router(), SchemaRequest("Tim", 0, 1));
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << got.status.error_message();
  EXPECT_THAT(got.status.error_message(), HasSubstr("--tokenizer"));
  // A schema the workers could not enforce never reaches them.
  v1::GenerateRequest bad = SchemaRequest("Tim", 0, 1);
  bad.mutable_sampling()->mutable_constraint()->set_json_schema(
      R"({"type": "string", "pattern": "(a)\\1"})");
  const Completion refused = RunGenerate(cluster_->router(), bad);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("`\\1`"));
  EXPECT_TRUE(cluster_->WaitUntilIdle(absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace tandem::testing
