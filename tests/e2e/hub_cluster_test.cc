// A cluster serving a Hugging Face folder: stories260K converted to bf16
// safetensors and tokenizer.json (and synthetic Qwen3, mixture-of-experts and DeepSeek folders),
// loaded by every worker and by the
// router (its tokenizer) from the folder alone. Tokens through the cluster equal the single-process
// engine's on the same folder, the KV cache travels as bf16 (half the bytes of f32), and the
// workers report one identity.
#include <cmath>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/model/synthetic.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/e2e/cluster_harness.h"
#include "tests/e2e/hub_folder.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem::testing {
namespace {

// The engine's greedy tokens for text `prompt`, BOS first.
std::vector<int32_t> LocalGreedy(const std::string& dir, const std::string& prompt, int max_tokens,
                                 std::optional<DType> kv_dtype = std::nullopt) {
  auto tokenizer = LoadTokenizer(dir);
  CHECK_OK(tokenizer.status());
  auto ids = (*tokenizer)->Encode(prompt, /*add_bos=*/true);
  CHECK_OK(ids.status());
  return LocalGreedyTokens(dir, *ids, max_tokens, kv_dtype);
}

// The sum of the series of `family` whose labels contain `label` (e.g.
// layer="1") on the /metrics endpoint whose port `port_file` holds; -1 if
// it cannot be read.
double SumOfSeries(const std::string& port_file, const std::string& family,
                   const std::string& label) {
  std::ifstream in(port_file);
  std::stringstream text;
  text << in.rdbuf();
  int port = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text.str()), &port)) return -1;
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result result = client.Get("/metrics");
  if (!result || result->status != 200) return -1;
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(result->body, '\n')) {
    if (!absl::ConsumePrefix(&line, family + "{") || !absl::StrContains(line, label)) continue;
    double value = 0;
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) return -1;
    sum += value;
  }
  return sum;
}

constexpr char kLongPrompt[] =
    "One day, a girl named Sue found a shiny red ball in the garden. She wanted to show it to "
    "her mom, so she ran inside and";
// Shares no block with kLongPrompt, so that nothing of it is cached.
constexpr char kOtherLongPrompt[] =
    "Tim had a big blue kite. On a windy morning he took it to the hill with his dad, and the "
    "kite flew up so high that";

TEST(HubClusterTest, Bf16FolderServesTheSameTokensAndShipsBf16Kv) {
  TANDEM_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  const std::string dir = WriteStoriesHubFolder("stories260K-bf16", DType::kBF16);
  auto cluster = Cluster::Start({.prefill = 1, .decode = 1, .model = dir, .tokenizer = dir});
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  for (const char* prompt : {"Once upon a time", kLongPrompt}) {
    const std::vector<int32_t> want = LocalGreedy(dir, prompt, 48);
    const Completion got = RunGenerate((*cluster)->router(), TextRequest(prompt, 48));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << (*cluster)->Logs();
    EXPECT_EQ(got.tokens, want) << prompt;
  }

  // A new long prompt goes through the prefill worker; its KV crosses as
  // bf16: 5 layers x blocks x (K and V of 16 slots x 32 dims x 2 bytes),
  // half of what f32 would ship.
  ASSERT_OK_AND_ASSIGN(v1::WorkerStats before, (*cluster)->Stats((*cluster)->prefill(0)));
  const Completion c = RunGenerate((*cluster)->router(), TextRequest(kOtherLongPrompt, 4));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  ASSERT_TRUE(c.finished.disaggregated()) << (*cluster)->Logs();
  ASSERT_OK_AND_ASSIGN(v1::WorkerStats prefill, (*cluster)->Stats((*cluster)->prefill(0)));
  ASSERT_OK_AND_ASSIGN(v1::WorkerStats decode, (*cluster)->Stats((*cluster)->decode(0)));
  EXPECT_EQ(prefill.kv_dtype(), "bf16");
  EXPECT_EQ(decode.kv_dtype(), "bf16");
  EXPECT_EQ(prefill.model(), "stories260K-bf16");
  EXPECT_EQ(prefill.weights_fingerprint(), decode.weights_fingerprint());
  EXPECT_FALSE(prefill.weights_fingerprint().empty());
  const int64_t blocks = (c.finished.usage().prompt_tokens() + 15) / 16;
  EXPECT_EQ(static_cast<int64_t>(prefill.kv_transfer_bytes() - before.kv_transfer_bytes()),
            5 * blocks * (2 * 16 * 32 * 2));
  EXPECT_OK((*cluster)->WaitUntilIdle(absl::Seconds(30)));
}

// Workers started with --kv_dtype=int8 serve the tokens of an in-process
// engine with an int8 cache, and a prompt's KV crosses as bytes plus an f32
// scale per token and head: stories260K's heads have 8 dims, so a token's
// head is 2 x 8 bytes and 2 x 4 bytes of scales, 24 bytes against bf16's 32
// (at the 64-dim heads of Llama-3.2-1B it is 136 against 256).
TEST(HubClusterTest, Int8KvServesTheInProcessTokensAndShipsBytesWithScales) {
  TANDEM_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  const std::string dir = WriteStoriesHubFolder("stories260K-f32", DType::kF32);
  auto cluster = Cluster::Start({.prefill = 1,
                                 .decode = 1,
                                 .model = dir,
                                 .tokenizer = dir,
                                 .prefill_flags = {"--kv_dtype=int8"},
                                 .decode_flags = {"--kv_dtype=int8"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  int different = 0;
  for (const char* prompt : {kLongPrompt, kOtherLongPrompt}) {
    const std::vector<int32_t> want = LocalGreedy(dir, prompt, 48, DType::kI8);
    different += want != LocalGreedy(dir, prompt, 48, DType::kF32);
    ASSERT_OK_AND_ASSIGN(v1::WorkerStats before, (*cluster)->Stats((*cluster)->prefill(0)));
    const Completion got = RunGenerate((*cluster)->router(), TextRequest(prompt, 48));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << (*cluster)->Logs();
    ASSERT_TRUE(got.finished.disaggregated()) << (*cluster)->Logs();
    EXPECT_EQ(got.tokens, want) << prompt;
    ASSERT_OK_AND_ASSIGN(v1::WorkerStats after, (*cluster)->Stats((*cluster)->prefill(0)));
    ASSERT_OK_AND_ASSIGN(v1::WorkerStats decode, (*cluster)->Stats((*cluster)->decode(0)));
    const int64_t blocks = (got.finished.usage().prompt_tokens() + 15) / 16;
    EXPECT_EQ(static_cast<int64_t>(after.kv_transfer_bytes() - before.kv_transfer_bytes()),
              5 * blocks * (2 * 16 * 32 + 2 * 4 * 16 * 4));
  }
  // The int8 cache is not the f32 one in disguise: over 96 tokens some
  // greedy pick moves.
  EXPECT_GT(different, 0) << "int8 KV gave f32's tokens for both prompts";
  ASSERT_OK_AND_ASSIGN(v1::WorkerStats decode, (*cluster)->Stats((*cluster)->decode(0)));
  EXPECT_EQ(decode.kv_dtype(), "int8");
  EXPECT_OK((*cluster)->WaitUntilIdle(absl::Seconds(30)));
}

// A Qwen3 folder (per-head q/k norms, head_dim 32 beside a width of 64)
// on both pools: a disaggregated run and a colocated one give the
// single-process engine's tokens, the KV that crosses is 2 layers x blocks
// x (K and V of 16 slots x 2 KV heads x 32 dims x 2 bytes), and the
// workers agree on one identity.
TEST(HubClusterTest, Qwen3FolderGivesTheSameTokensDisaggregatedAndColocated) {
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  const std::string dir =
      WriteSyntheticHubFolder("qwen3-small-bf16", Qwen3SmallShape(), DType::kBF16);
  for (int prefill : {1, 0}) {
    SCOPED_TRACE(prefill == 1 ? "disaggregated" : "colocated");
    auto cluster =
        Cluster::Start({.prefill = prefill, .decode = 1, .model = dir, .tokenizer = dir});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    for (const char* prompt : {kLongPrompt, kOtherLongPrompt}) {
      const std::vector<int32_t> want = LocalGreedy(dir, prompt, 40);
      std::optional<v1::WorkerStats> before;
      if (prefill > 0) {
        ASSERT_OK_AND_ASSIGN(before, (*cluster)->Stats((*cluster)->prefill(0)));
      }
      const Completion got = RunGenerate((*cluster)->router(), TextRequest(prompt, 40));
      ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << (*cluster)->Logs();
      EXPECT_EQ(got.tokens, want) << prompt;
      EXPECT_EQ(got.finished.disaggregated(), prefill > 0) << (*cluster)->Logs();
      if (prefill == 0) continue;
      ASSERT_OK_AND_ASSIGN(v1::WorkerStats after, (*cluster)->Stats((*cluster)->prefill(0)));
      ASSERT_OK_AND_ASSIGN(v1::WorkerStats decode, (*cluster)->Stats((*cluster)->decode(0)));
      EXPECT_EQ(after.weights_fingerprint(), decode.weights_fingerprint());
      const int64_t blocks = (got.finished.usage().prompt_tokens() + 15) / 16;
      EXPECT_EQ(static_cast<int64_t>(after.kv_transfer_bytes() - before->kv_transfer_bytes()),
                2 * blocks * (2 * 16 * 64 * 2));
    }
    EXPECT_OK((*cluster)->WaitUntilIdle(absl::Seconds(30)));
  }
}

// Every mixture-of-experts architecture on a prefill + decode pair: the
// disaggregated tokens are the single-process engine's, and the KV that
// crosses is exactly layers x blocks x (K and V of 16 slots x kv_dim x 2
// bytes of bf16): experts change nothing of what the pools ship.
TEST(HubClusterTest, MixtureOfExpertsFoldersGiveTheSameTokensDisaggregated) {
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  for (const auto& [name, config] : SmallMoeShapes()) {
    SCOPED_TRACE(name);
    const std::string dir = WriteSyntheticHubFolder(name + "-bf16", config, DType::kBF16);
    const std::string ports = TempDir();
    auto metrics = [&](const char* who) {
      return std::vector<std::string>{"--metrics_listen=127.0.0.1:0",
                                      absl::StrCat("--metrics_port_file=", ports, "/", who)};
    };
    auto cluster = Cluster::Start({.prefill = 1,
                                   .decode = 1,
                                   .model = dir,
                                   .tokenizer = dir,
                                   .prefill_flags = metrics("prefill"),
                                   .decode_flags = metrics("decode")});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    const std::vector<int32_t> want = LocalGreedy(dir, kLongPrompt, 32);
    ASSERT_OK_AND_ASSIGN(v1::WorkerStats before, (*cluster)->Stats((*cluster)->prefill(0)));
    const Completion got = RunGenerate((*cluster)->router(), TextRequest(kLongPrompt, 32));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << (*cluster)->Logs();
    EXPECT_TRUE(got.finished.disaggregated()) << (*cluster)->Logs();
    EXPECT_EQ(got.tokens, want);
    ASSERT_OK_AND_ASSIGN(v1::WorkerStats after, (*cluster)->Stats((*cluster)->prefill(0)));
    ASSERT_OK_AND_ASSIGN(v1::WorkerStats decode, (*cluster)->Stats((*cluster)->decode(0)));
    // Both pools report the architecture the router compares word by word.
    EXPECT_EQ(after.model_shape(), config.ShapeString());
    EXPECT_EQ(decode.model_shape(), config.ShapeString());
    const int64_t blocks = (got.finished.usage().prompt_tokens() + 15) / 16;
    EXPECT_EQ(static_cast<int64_t>(after.kv_transfer_bytes() - before.kv_transfer_bytes()),
              int64_t{config.n_layers} * blocks * (2 * 16 * config.kv_dim() * 2));
    EXPECT_OK((*cluster)->WaitUntilIdle(absl::Seconds(30)));
    // Each prompt token chose top_k experts of a sparse layer on the
    // prefill worker; the decode worker's steps routed theirs too.
    int sparse = 0;
    while (!config.IsMoeLayer(sparse)) ++sparse;
    const std::string layer = absl::StrCat("layer=\"", sparse, "\"");
    const double top_k = config.moe.top_k;
    EXPECT_EQ(SumOfSeries(ports + "/prefill", "tandem_prefill_moe_expert_tokens_total", layer),
              top_k * got.finished.usage().prompt_tokens());
    double decoded = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    // The decode loop publishes after its step: poll, with a deadline.
    while (decoded <= 0 && absl::Now() < deadline) {
      decoded = SumOfSeries(ports + "/decode", "tandem_decode_moe_expert_tokens_total", layer);
      if (decoded <= 0) absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_GT(decoded, 0);
    EXPECT_EQ(std::fmod(decoded, top_k), 0);
  }
}

// DeepSeek's latent attention on a prefill + decode pair (V2-Lite-like
// without a q rank, and V3-like with sigmoid routing and YaRN): the
// disaggregated tokens are the single-process engine's, and what crosses is
// exactly layers x blocks x 16 slots x (kv_lora_rank + qk_rope_head_dim) x
// 2 bytes of bf16: the latent and rope key alone, no values.
TEST(HubClusterTest, LatentAttentionFoldersShipTheLatentAlone) {
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  for (const auto& [name, config] : SmallDeepSeekShapes()) {
    if (name == "deepseek-v2-small") continue;  // its parts are in the other two
    SCOPED_TRACE(name);
    const std::string dir = WriteSyntheticHubFolder(name + "-bf16", config, DType::kBF16);
    auto cluster = Cluster::Start({.prefill = 1, .decode = 1, .model = dir, .tokenizer = dir});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    const std::vector<int32_t> want = LocalGreedy(dir, kLongPrompt, 32);
    ASSERT_OK_AND_ASSIGN(v1::WorkerStats before, (*cluster)->Stats((*cluster)->prefill(0)));
    const Completion got = RunGenerate((*cluster)->router(), TextRequest(kLongPrompt, 32));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << (*cluster)->Logs();
    EXPECT_TRUE(got.finished.disaggregated()) << (*cluster)->Logs();
    EXPECT_EQ(got.tokens, want);
    ASSERT_OK_AND_ASSIGN(v1::WorkerStats after, (*cluster)->Stats((*cluster)->prefill(0)));
    const int64_t blocks = (got.finished.usage().prompt_tokens() + 15) / 16;
    const int64_t latent = config.mla.kv_lora_rank + config.mla.qk_rope_head_dim;
    EXPECT_EQ(static_cast<int64_t>(after.kv_transfer_bytes() - before.kv_transfer_bytes()),
              int64_t{config.n_layers} * blocks * 16 * latent * 2);
    EXPECT_OK((*cluster)->WaitUntilIdle(absl::Seconds(30)));
  }
}

}  // namespace
}  // namespace tandem::testing
