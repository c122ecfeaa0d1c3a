// A tool's command line (common/base/flags.h): dashes in a flag's name read
// as underscores, while a value that holds spaces (another binary's flags,
// as tandem-sim's --decode_args takes them) is kept as it was written.
#include "common/base/flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, flags_test_count, 0, "A number");
ABSL_FLAG(std::string, flags_test_args, "", "Flags of another binary");

namespace tandem {
namespace {

TEST(ParseToolFlagsTest, NamesTakeDashesAndValuesWithSpacesStayWhole) {
  std::vector<std::string> words = {"tool", "--flags-test-count=3", "--flags-test-args",
                                    "--schedule-policy chunked --prefill_chunk_tokens 128"};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  ParseToolFlags(static_cast<int>(words.size()), argv.data(), "usage");
  EXPECT_EQ(absl::GetFlag(FLAGS_flags_test_count), 3);
  EXPECT_EQ(absl::GetFlag(FLAGS_flags_test_args),
            "--schedule-policy chunked --prefill_chunk_tokens 128");
}

}  // namespace
}  // namespace tandem
