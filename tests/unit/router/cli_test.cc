// tandem-cli (the real binary) against an in-process router over fake
// workers: what reaches stdout and stderr, and the exit codes.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/unit/router/router_harness.h"

namespace tandem::router::testing {
namespace {

using ::testing::HasSubstr;

struct CliRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs tandem-cli with `args`, bounded by 30 s.
CliRun RunCli(const std::string& args) {
  const std::string dir = ::tandem::testing::TempDir();
  const std::string out = dir + "/cli.out", err = dir + "/cli.err";
  const std::string command =
      absl::StrCat("timeout 30 ", TANDEM_CLI_BIN, " ", args, " >", out, " 2>", err);
  const int status = std::system(command.c_str());
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    harness_ = std::make_unique<RouterHarness>(HarnessOptions{.prefill = 1, .decode = 1});
    ASSERT_TRUE(harness_->Start().ok());
  }
  std::string Router() const { return absl::StrCat("--router 127.0.0.1:", harness_->port()); }

  std::unique_ptr<RouterHarness> harness_;
};

TEST_F(CliTest, StreamsOnlyTheContinuationToStdoutAndASummaryToStderr) {
  const CliRun r = RunCli(absl::StrCat("generate ", Router(), " --prompt 'w5 w6' --max-tokens 3"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, " w40 w20 w21");
  EXPECT_THAT(r.err, HasSubstr("finish LENGTH"));
  EXPECT_THAT(r.err, HasSubstr("prompt 3 tokens, completion 3"));
  EXPECT_THAT(r.err, HasSubstr("TTFT"));
  EXPECT_THAT(r.err, HasSubstr("tok/s"));
  EXPECT_THAT(r.err, HasSubstr(harness_->prefill_address(0)));
  EXPECT_THAT(r.err, HasSubstr(harness_->decode_address(0)));
  // Sampling flags and the stop string reach the router.
  const CliRun stop = RunCli(absl::StrCat("generate ", Router(),
                                          " --prompt w5 --max-tokens 10 --temperature 0.5 "
                                          "--top-k 3 --top-p 0.9 --seed 7 --stop ' w21'"));
  EXPECT_EQ(stop.exit_code, 0) << stop.err;
  EXPECT_EQ(stop.out, " w40 w20");
  EXPECT_THAT(stop.err, HasSubstr("finish STOP"));
  const v1::DecodeRequest last = harness_->decode(0).requests().back();
  EXPECT_FLOAT_EQ(last.sampling().temperature(), 0.5f);
  EXPECT_EQ(last.sampling().top_k(), 3);
  EXPECT_FLOAT_EQ(last.sampling().top_p(), 0.9f);
  EXPECT_EQ(last.sampling().seed(), 7u);
}

TEST_F(CliTest, AnErrorStatusGoesToStderrWithExitCodeOne) {
  const CliRun r = RunCli(absl::StrCat("generate ", Router(), " --prompt w5 --max-tokens -1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("max_tokens"));
}

TEST(CliUsageTest, UnknownOrMissingSubcommandIsUsageWithExitCodeTwo) {
  CliRun r = RunCli("frobnicate --prompt x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("Usage: tandem-cli generate"));
  EXPECT_THAT(r.err, HasSubstr("frobnicate"));
  r = RunCli("");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("Usage"));
}

TEST(CliUsageTest, AnUnreachableRouterIsAnError) {
  const CliRun r = RunCli("generate --router 127.0.0.1:1 --prompt hi --max-tokens 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
}

}  // namespace
}  // namespace tandem::router::testing
