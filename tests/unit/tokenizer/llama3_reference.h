// The Llama 3 reference of the npm package llama3-tokenizer-js, installed at
// test time into the build tree and driven through llama3_reference.mjs.
#ifndef TANDEM_TESTS_UNIT_MODEL_LLAMA3_REFERENCE_H_
#define TANDEM_TESTS_UNIT_MODEL_LLAMA3_REFERENCE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::testing {

class Llama3Reference {
 public:
  // Installs the package (once per build tree) and writes the Llama 3
  // tokenizer.json folder; the error says what is missing (node, npm, the
  // registry) when that fails.
  static absl::StatusOr<const Llama3Reference*> Get();
  // Use Get(); public for the set-up code.
  static Llama3Reference Make(std::string modules_dir, std::string tokenizer_dir);

  // A folder with tokenizer.json and tokenizer_config.json.
  const std::string& tokenizer_dir() const { return tokenizer_dir_; }

  // The package encoder's ids for each text (no BOS/EOS); special tokens are
  // recognised only when `special`.
  absl::StatusOr<std::vector<std::vector<int32_t>>> Encode(const std::vector<std::string>& texts,
                                                           bool special) const;

 private:
  std::string modules_dir_;
  std::string tokenizer_dir_;
};

}  // namespace tandem::testing

// Declares `const Llama3Reference* var`, or ends the test: skipped, or failed
// under TANDEM_REQUIRE_MODELS=1, when node/npm or the package is unavailable.
#define TANDEM_LLAMA3_REFERENCE_OR_SKIP(var)                                          \
  const auto var##_or = ::tandem::testing::Llama3Reference::Get();                    \
  if (!var##_or.ok()) {                                                               \
    if (::tandem::testing::ModelsRequired()) {                                        \
      FAIL() << "Llama 3 reference unavailable and TANDEM_REQUIRE_MODELS=1: "         \
             << var##_or.status().message();                                          \
    }                                                                                 \
    GTEST_SKIP() << "Llama 3 reference unavailable: " << var##_or.status().message(); \
  }                                                                                   \
  const ::tandem::testing::Llama3Reference* var = *var##_or

#endif  // TANDEM_TESTS_UNIT_MODEL_LLAMA3_REFERENCE_H_
