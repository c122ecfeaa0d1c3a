// Folder and file helpers shared by the Hugging Face folder loader tests:
// hub_config_test.cc (ReadHubConfig), hub_model_test.cc (LoadHubModel and
// round trips) and hub_fp8_test.cc (FP8 checkpoints).
#ifndef TANDEM_TESTS_UNIT_MODEL_HUB_MODEL_TESTING_H_
#define TANDEM_TESTS_UNIT_MODEL_HUB_MODEL_TESTING_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/model/hub_model.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/model/synthetic.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

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

// A small GQA model: dim 64, 4 heads of 16, 2 KV heads.
inline ModelConfig SmallConfig() {
  ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 96;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 256;
  c.seq_len = 128;
  c.rope_theta = 500000.0f;
  c.norm_eps = 1e-5f;
  c.shared_classifier = false;
  c.rope_layout = RopeLayout::kHalfSplit;
  return c;
}

// Writes a synthetic model of `config` as a hub folder.
inline std::string WriteModelDir(const std::string& name, const ModelConfig& config, DType dtype,
                                 uint64_t max_shard_bytes = 0) {
  const std::string dir = NewDir(name);
  auto model = MakeSyntheticModel(config, 7, dtype);
  EXPECT_OK(model.status());
  if (!model.ok()) return dir;
  HubWriteOptions options;
  options.dtype = dtype;
  options.max_shard_bytes = max_shard_bytes;
  EXPECT_OK(WriteHubModel(**model, dir, options));
  return dir;
}

// The tensors of `dir`/model.safetensors, to edit and write back.
struct TensorData {
  SafetensorsDType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
inline std::map<std::string, TensorData> ReadTensors(const std::string& dir) {
  std::map<std::string, TensorData> tensors;
  auto file = SafetensorsFile::Open(dir + "/" + kSafetensorsSingleFile);
  EXPECT_OK(file.status());
  if (!file.ok()) return tensors;
  for (const TensorInfo& t : file->tensors()) {
    tensors[t.name] = {t.dtype, t.shape, std::vector<uint8_t>(t.bytes.begin(), t.bytes.end())};
  }
  return tensors;
}
inline void WriteTensors(const std::string& dir, const std::map<std::string, TensorData>& tensors) {
  SafetensorsWriter writer;
  for (const auto& [name, t] : tensors) ASSERT_OK(writer.Add(name, t.dtype, t.shape, t.bytes));
  ASSERT_OK(writer.WriteFile(dir + "/" + kSafetensorsSingleFile));
}

inline void EditConfig(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json config = ReadJsonFile(dir + "/config.json");
  edit(config);
  WriteText(dir + "/config.json", config.dump(2));
}

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_MODEL_HUB_MODEL_TESTING_H_
