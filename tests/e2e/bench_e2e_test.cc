// tandem-bench, the real binary, against a real cluster for a few seconds:
// the JSON result has the fields and plausible values, the report its charts.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "common/base/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_harness.h"
#include "tests/testing/model_files.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class BenchE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Small and random: fast enough that a few requests a second stay easy.
    const ModelConfig shape{.dim = 64,
                            .hidden_dim = 172,
                            .n_layers = 2,
                            .n_heads = 4,
                            .n_kv_heads = 4,
                            .vocab_size = 512,
                            .seq_len = 512};
    auto files = WriteSyntheticModel(shape, 11, "bench");
    CHECK_OK(files.status());
    model_ = files->model;
    tokenizer_ = files->tokenizer;
  }
  static std::string model_, tokenizer_;
};

std::string BenchE2eTest::model_;
std::string BenchE2eTest::tokenizer_;

TEST_F(BenchE2eTest, ShortRunWritesResultAndReport) {
  auto cluster =
      Cluster::Start({.prefill = 1, .decode = 1, .model = model_, .tokenizer = tokenizer_});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string json_path = TempDir() + "/bench-result.json";
  const std::string html_path = TempDir() + "/bench-report.html";
  const std::string log = TempDir() + "/bench.log";
  std::remove(json_path.c_str());
  std::remove(html_path.c_str());
  Child bench({TANDEM_BENCH_BIN,
               "--target",
               "grpc://" + (*cluster)->router_member().address,
               "--request_rate",
               "4",
               "--num_requests",
               "12",
               "--input_len",
               "24",
               "--output_len",
               "12",
               "--seed",
               "2",
               "--slo",
               "ttft=10000,tpot=10000",
               "--progress=false",
               "--result_json",
               json_path,
               "--report_html",
               html_path},
              log);
  const int rc = bench.Wait(absl::Seconds(60));
  ASSERT_EQ(rc, 0) << ReadAll(log) << (*cluster)->Logs();

  const nlohmann::json j = nlohmann::json::parse(ReadAll(json_path), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << ReadAll(json_path);
  for (const char* key : {"completed", "failed", "duration", "request_throughput",
                          "output_throughput", "total_token_throughput", "request_goodput",
                          "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "config", "runs"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  const int sent = j["num_requests"].get<int>();
  // Greedy decoding of fixed prompts: the same tokens every run, and seed 2
  // gives no stream that ends in EOS before its first token (vLLM would
  // count such a stream as failed).
  EXPECT_EQ(sent, 12);
  EXPECT_EQ(j["completed"].get<int>(), sent) << j["errors"];
  EXPECT_EQ(j["failed"].get<int>(), 0);
  EXPECT_GT(j["ttft_ms"]["mean"].get<double>(), 0);
  EXPECT_GT(j["tpot_ms"]["mean"].get<double>(), 0);
  EXPECT_GE(j["ttft_ms"]["p99"].get<double>(), j["ttft_ms"]["median"].get<double>());
  const double duration = j["duration"].get<double>();
  EXPECT_GT(duration, 1.0);
  EXPECT_LT(duration, 40.0);
  EXPECT_NEAR(j["request_throughput"].get<double>(), sent / duration, 1e-6);
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), j["request_throughput"].get<double>());
  const long out = j["total_output_tokens"].get<long>();
  EXPECT_GT(out, 0);
  EXPECT_LE(out, 12L * sent);
  ASSERT_EQ(j["runs"][0]["requests"].size(), static_cast<size_t>(sent));
  for (const auto& r : j["runs"][0]["requests"]) {
    EXPECT_TRUE(r["success"].get<bool>()) << r["error"];
    EXPECT_LE(r["ttft"].get<double>(), r["e2e"].get<double>());
    EXPECT_LE(r["itls"].size() + 1, r["output_tokens"].get<size_t>());
  }

  const std::string html = ReadAll(html_path);
  EXPECT_THAT(html, HasSubstr("<svg"));
  EXPECT_THAT(html, HasSubstr("TTFT CDF"));
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(ReadAll(log), HasSubstr("Serving Benchmark Result"));
}

}  // namespace
}  // namespace tandem::testing
