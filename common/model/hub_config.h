// Reading a Hugging Face folder's config.json (ReadHubConfig in
// hub_model.h): the architectures of the Llama family, their experts, and
// the quantization config, each field acted on or refused.
#ifndef TANDEM_COMMON_MODEL_HUB_CONFIG_H_
#define TANDEM_COMMON_MODEL_HUB_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/model/hub_fp8.h"
#include "common/model/model_config.h"

namespace tandem {

struct HubConfigFile {
  ModelConfig config;
  HubQuantization quantization;
  // DeepSeek V3's multi-token-prediction layers, stored after the model's
  // own (model.layers.<n_layers>...): not part of the model, skipped.
  int mtp_layers = 0;
};

// `dir`/config.json read as ReadHubConfig says, with its quantization.
absl::StatusOr<HubConfigFile> ReadHubConfigFile(const std::string& dir);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_HUB_CONFIG_H_
