#include "common/base/flags.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace tandem {

void ParseToolFlags(int argc, char** argv, std::string_view usage) {
  absl::SetProgramUsageMessage(absl::string_view(usage.data(), usage.size()));
  // --help lists the flags defined in a tool's main file and in the
  // libraries under the tree (absl's default looks only for a file named
  // after the binary).
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view path) {
    return absl::StrContains(path, "tools/") || absl::StrContains(path, "_main.cc") ||
           absl::EndsWith(path, "/main.cc");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-' || a[1] != '-') continue;
    const size_t end = a.find('=');
    // A space before any '=': not a flag but a value (tandem-sim
    // --decode_args "--schedule-policy chunked"), kept as it is.
    if (a.find(' ') < end) continue;
    for (size_t j = 2; j < std::min(end, a.size()); ++j) {
      if (a[j] == '-') a[j] = '_';
    }
  }
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  const std::vector<char*> rest = absl::ParseCommandLine(argc, ptrs.data());
  if (rest.size() > 1) {
    std::fprintf(stderr, "unexpected argument '%s'; every option is a --flag (see --help)\n",
                 rest[1]);
    std::exit(2);
  }
}

}  // namespace tandem
