// FP8 weights of Hugging Face folders in the "compressed-tensors" layout
// (llm-compressor's output: RedHatAI / neuralmagic "-FP8" and
// "-FP8-dynamic" models). Internal to the hub loader (hub_model.cc).
//
// Such a folder says in config.json
//   "quantization_config": {"quant_method": "compressed-tensors",
//     "format": "float-quantized",
//     "config_groups": {"group_0": {"targets": ["Linear"],
//       "weights": {"num_bits": 8, "type": "float", "strategy": "channel", ..},
//       "input_activations": {..} or null}},
//     "ignore": ["lm_head"], ..}
// and stores each quantized Linear weight as F8_E4M3 codes `X.weight` with
// a `X.weight_scale` beside it (one scale per output row, [rows, 1], for
// strategy "channel"; one, [] or [1], for "tensor"), plus `X.input_scale`
// when activations were calibrated statically. Modules on the ignore list
// (usually lm_head) stay in the model's 16-bit type.
//
// The loader widens every FP8 weight at load time to code * scale in the
// type of the model's unquantized matrices, so every backend runs it like a
// 16-bit model (and it takes that much memory).
#ifndef TANDEM_COMMON_MODEL_HUB_FP8_H_
#define TANDEM_COMMON_MODEL_HUB_FP8_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/model/safetensors.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem {

// What config.json's quantization_config says about the weights.
struct HubQuantization {
  // compressed-tensors with FP8 E4M3 weights, per tensor or per channel.
  bool fp8_weights = false;
};

// Reads the "quantization_config" (or the older name "compression_config")
// of `config`, the parsed config.json at `file`. No config (absent or null)
// means unquantized weights. Only compressed-tensors with 8-bit float
// weights and strategy "tensor" or "channel" is accepted; anything else
// (int schemes, group or block strategies, packed or sparse formats, an FP8
// KV cache scheme, other quant_methods such as DeepSeek's block-scaled
// "fp8") is INVALID_ARGUMENT naming the field and saying what is supported.
absl::StatusOr<HubQuantization> ReadHubQuantization(const nlohmann::json& config,
                                                    const std::string& file);

// The companion tensors of FP8 weight `weight_name` ("X.weight"):
// "X.weight_scale" (required) and "X.input_scale" (optional, not used).
std::string Fp8WeightScaleName(const std::string& weight_name);
// "[a, b, ...]": a tensor's shape in messages.
std::string ShapeText(const std::vector<int64_t>& shape);
std::string Fp8InputScaleName(const std::string& weight_name);

// The values Fp8E4M3ToFloat(code) * scale (an f32 product) of the 2-D
// F8_E4M3 tensor `weight`, rounded to `target` (f32, f16 or bf16) as
// Fp32ToBf16 / Fp32ToFp16 round, in owned 8-byte-aligned storage.
// `scale` (nullptr when the folder has none) must be F32, F16 or BF16 of
// shape [rows, 1], [rows], [1] or [], with finite positive values. A NaN
// code, or a product that is not finite in `target`, is refused too. Errors
// are INVALID_ARGUMENT naming `dir` and the tensor.
absl::StatusOr<std::vector<uint64_t>> WidenFp8Weight(const TensorInfo& weight,
                                                     const TensorInfo* scale, DType target,
                                                     const std::string& dir);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_HUB_FP8_H_
