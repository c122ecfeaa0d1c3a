// Fixtures of the end-to-end tests that serve a Hugging Face folder:
// stories260K converted into one, and the single-process engine's greedy
// tokens on it (what a cluster must reproduce).
#ifndef TANDEM_TESTS_E2E_HUB_FOLDER_H_
#define TANDEM_TESTS_E2E_HUB_FOLDER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/model/hub_model.h"

namespace tandem::testing {

// stories260K (with tok512.bin) as a hub folder of `dtype` named `name`
// under TempDir(): weights, config, generation config, tokenizer.json and
// tokenizer_config.json. Returns the folder. Dies when the fixtures are
// missing (check with TANDEM_MODEL_FILE_OR_SKIP first).
std::string WriteStoriesHubFolder(const std::string& name, DType dtype);

// Synthetic weights of `config` (seed 3; its vocabulary must be 512) with
// tok512.bin's tokenizer as a hub folder of `dtype` named `name` under
// TempDir(), for architectures no real fixture has. Dies when the
// tokenizer fixture is missing.
std::string WriteSyntheticHubFolder(const std::string& name, const ModelConfig& config,
                                    DType dtype);

// The single-process engine's greedy continuation of `prompt` (token ids,
// used as given) on the folder `dir`, ending at its EOS ids, with a KV
// cache of `kv_dtype` (unset: the weights' type).
std::vector<int32_t> LocalGreedyTokens(const std::string& dir, const std::vector<int32_t>& prompt,
                                       int max_tokens,
                                       std::optional<DType> kv_dtype = std::nullopt);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_E2E_HUB_FOLDER_H_
