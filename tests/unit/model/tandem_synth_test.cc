// Runs the tandem-synth binary (its path comes from the build) and reads
// back what it writes.
#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/gguf.h"
#include "common/model/model_weights.h"
#include "common/model/synthetic.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/model/weights_testing.h"

namespace tandem {
namespace {

int RunSynth(const std::string& args) {
  const std::string command = absl::StrCat(TANDEM_SYNTH_BIN, " ", args, " >/dev/null 2>&1");
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

ModelConfig GqaShape() {
  return ModelConfig{.dim = 64,
                     .hidden_dim = 96,
                     .n_layers = 2,
                     .n_heads = 8,
                     .n_kv_heads = 2,
                     .vocab_size = 50,
                     .seq_len = 32,
                     .shared_classifier = false};
}

constexpr char kGqaFlags[] =
    "--shape custom --dim 64 --hidden_dim 96 --n_layers 2 --n_heads 8 --n_kv_heads 2 "
    "--vocab_size 50 --seq_len 32 --untied --seed 9";

TEST(TandemSynthTest, WritesTheSyntheticModelInBothFormats) {
  ASSERT_OK_AND_ASSIGN(auto want, MakeSyntheticModel(GqaShape(), 9));
  const std::string bin = ::tandem::testing::TempDir() + "/gqa.bin";
  ASSERT_EQ(RunSynth(absl::StrCat(kGqaFlags, " --output ", bin)), 0);
  ASSERT_OK_AND_ASSIGN(auto from_bin, LoadModel(bin));
  ::tandem::testing::ExpectSameWeights(*want, *from_bin);

  const std::string gguf = ::tandem::testing::TempDir() + "/gqa.gguf";
  ASSERT_EQ(RunSynth(absl::StrCat(kGqaFlags, " --format gguf --gguf_type f16 --output ", gguf)), 0);
  ASSERT_OK_AND_ASSIGN(auto from_gguf, LoadModel(gguf));
  ::tandem::testing::ExpectWeightsMap(*want, *from_gguf, [](const std::string& name, float v) {
    return name.ends_with("norm") ? v : Fp16ToFp32(Fp32ToFp16(v));
  });
}

TEST(TandemSynthTest, BadFlagsExitWithStatus2) {
  const std::string out = " --output " + ::tandem::testing::TempDir() + "/x";
  EXPECT_EQ(RunSynth("--shape custom --dim 64" + out), 2);
  EXPECT_EQ(RunSynth("--format safetensors" + out), 2);
  EXPECT_EQ(RunSynth("--gguf_type f16" + out), 2);
  EXPECT_EQ(RunSynth("--dim 100 --n_heads 3" + out), 2);
  EXPECT_EQ(RunSynth("--n_heads 6 --n_kv_heads 4" + out), 2);
  EXPECT_EQ(RunSynth("--dim -5" + out), 2);
  EXPECT_EQ(RunSynth("--shape stories15M"), 2);
  EXPECT_EQ(RunSynth("stray" + out), 2);
}

}  // namespace
}  // namespace tandem
