#include "tests/unit/engine/numpy_reference.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tests/testing/child_process.h"

namespace tandem::testing {

absl::StatusOr<std::vector<std::vector<double>>> NumpyReferenceLogits(
    const std::string& dir, const std::vector<int32_t>& tokens) {
  const std::string out = dir + "/numpy_logits.json";
  Child child(
      {"/usr/bin/python3", TANDEM_HF_REFERENCE_SCRIPT, dir, out, absl::StrJoin(tokens, ",")},
      dir + "/python.log");
  const int rc = child.Wait(absl::Minutes(2));
  if (rc != 0) {
    std::ifstream log(dir + "/python.log");
    std::stringstream text;
    text << log.rdbuf();
    return absl::InternalError(absl::StrCat(
        "hf_reference.py exited with ", rc,
        " (Debian's python3-numpy is installed by scripts/install-deps.sh): ", text.str()));
  }
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return absl::InternalError("hf_reference.py wrote no logits");
  return j.get<std::vector<std::vector<double>>>();
}

}  // namespace tandem::testing
