// Locating the real model fixtures of ../shared/models (see its README).
#ifndef TANDEM_TESTS_TESTING_MODEL_FILES_H_
#define TANDEM_TESTS_TESTING_MODEL_FILES_H_

#include <string>

#include "gtest/gtest.h"

namespace tandem::testing {

// The fixture folder: $TANDEM_MODELS if set, else ../shared/models beside the
// source tree. Empty when neither exists.
std::string ModelsDir();

// Full path of fixture `name`, or empty when it is not there.
std::string ModelFile(const std::string& name);

// True when TANDEM_REQUIRE_MODELS=1: missing fixtures fail tests instead of
// skipping them (CI sets it).
bool ModelsRequired();

// A temporary folder unique to the running test, removed at exit.
std::string TempDir();

}  // namespace tandem::testing

// Declares `std::string var` holding the fixture's path, or ends the test:
// skipped with a message, or failed under TANDEM_REQUIRE_MODELS=1.
#define TANDEM_MODEL_FILE_OR_SKIP(var, name)                                               \
  const std::string var = ::tandem::testing::ModelFile(name);                              \
  if (var.empty()) {                                                                       \
    if (::tandem::testing::ModelsRequired()) {                                             \
      FAIL() << "fixture " << (name) << " missing from ../shared/models or $TANDEM_MODELS" \
             << " and TANDEM_REQUIRE_MODELS=1";                                            \
    }                                                                                      \
    GTEST_SKIP() << "fixture " << (name) << " not found; set TANDEM_MODELS";               \
  }

#endif  // TANDEM_TESTS_TESTING_MODEL_FILES_H_
