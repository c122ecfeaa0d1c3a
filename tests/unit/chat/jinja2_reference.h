// Runs Python's Jinja2 (render_reference.py) on a batch of templates, as the
// reference the C++ renderer must match.
#ifndef TANDEM_TESTS_UNIT_JINJA_JINJA2_REFERENCE_H_
#define TANDEM_TESTS_UNIT_JINJA_JINJA2_REFERENCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::testing {

struct Jinja2Job {
  std::string source;
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  int64_t now_unix_seconds = 0;  // what strftime_now formats (UTC)
};

struct Jinja2Result {
  bool ok = false;
  std::string output;  // when ok
  std::string error;   // when not: "ExceptionType: message"
};

// Renders every job with python3 + jinja2 in one child process. UNAVAILABLE
// when python3 or its jinja2 module is missing.
absl::StatusOr<std::vector<Jinja2Result>> RenderWithJinja2(const std::vector<Jinja2Job>& jobs);

}  // namespace tandem::testing

// Ends the test when Jinja2 cannot run: skipped, or failed under
// TANDEM_REQUIRE_MODELS=1 (CI), like a missing fixture.
#define TANDEM_JINJA2_OR_SKIP(status)                                    \
  if (!(status).ok()) {                                                  \
    if (::tandem::testing::ModelsRequired()) FAIL() << (status);         \
    GTEST_SKIP() << "Python Jinja2 reference unavailable: " << (status); \
  }

#endif  // TANDEM_TESTS_UNIT_JINJA_JINJA2_REFERENCE_H_
