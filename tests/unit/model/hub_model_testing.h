// Folder and file helpers shared by the Hugging Face folder loader tests:
// hub_config_test.cc (ReadHubConfig) and hub_model_test.cc (LoadHubModel and
// round trips).
#ifndef TANDEM_TESTS_UNIT_MODEL_HUB_MODEL_TESTING_H_
#define TANDEM_TESTS_UNIT_MODEL_HUB_MODEL_TESTING_H_

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/model_files.h"

namespace tandem {

// A fresh folder `name` inside this test's temporary folder.
inline std::string NewDir(const std::string& name) {
  const std::string dir = ::tandem::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

inline nlohmann::json ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_MODEL_HUB_MODEL_TESTING_H_
