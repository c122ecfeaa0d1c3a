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
// DeepSeek-V3, Kimi K2 and the Qwen3 "-FP8" folders say instead
//   "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
//     "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
// and store beside each F8_E4M3 `X.weight` an `X.weight_scale_inv`: one
// scale per 128 x 128 block, [ceil(rows / 128), ceil(cols / 128)], by
// which the codes are multiplied (the name notwithstanding). Without
// weight_block_size the scale is `X.weight_scale`, per tensor or channel.
// Which matrices are FP8 is read from each tensor's type (the router, the
// embedding, lm_head and the norms stay 16-bit in those folders).
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
  // FP8 E4M3 weights: compressed-tensors per tensor or per channel, or
  // quant_method "fp8".
  bool fp8_weights = false;
  // quant_method "fp8" with weight_block_size: the block's rows and columns
  // (the scales are then X.weight_scale_inv). 0 for scales per tensor or
  // per channel (X.weight_scale).
  int block_rows = 0;
  int block_cols = 0;
};

// Reads the "quantization_config" (or the older name "compression_config")
// of `config`, the parsed config.json at `file`. No config (absent or null)
// means unquantized weights. Accepted: compressed-tensors with 8-bit float
// weights and strategy "tensor" or "channel", and quant_method "fp8" with
// E4M3 codes (fmt "e4m3"), blocks of 1 to 65536 rows and columns or none.
// Anything else (int schemes, group or block strategies of
// compressed-tensors, packed or sparse formats, an FP8 KV cache scheme,
// E5M2, other quant_methods) is INVALID_ARGUMENT naming the field and
// saying what is supported.
absl::StatusOr<HubQuantization> ReadHubQuantization(const nlohmann::json& config,
                                                    const std::string& file);

// The companion tensors of FP8 weight `weight_name` ("X.weight"):
// "X.weight_scale", or "X.weight_scale_inv" for block scales (required), and
// "X.input_scale" (optional, not used).
std::string Fp8WeightScaleName(const std::string& weight_name, const HubQuantization& q);
// "[a, b, ...]": a tensor's shape in messages.
std::string ShapeText(const std::vector<int64_t>& shape);
std::string Fp8InputScaleName(const std::string& weight_name);

// The values Fp8E4M3ToFloat(code) * scale (an f32 product) of the 2-D
// F8_E4M3 tensor `weight`, rounded to `target` (f32, f16 or bf16) as
// Fp32ToBf16 / Fp32ToFp16 round, in owned 8-byte-aligned storage.
// `scale` (nullptr when the folder has none) must be F32, F16 or BF16 with
// finite positive values, of shape [rows, 1], [rows], [1] or [], or with
// block scales in `q` exactly [ceil(rows / block_rows), ceil(cols /
// block_cols)]. A NaN code, or a product that is not finite in `target`, is
// refused too. Errors are INVALID_ARGUMENT naming `dir` and the tensor.
absl::StatusOr<std::vector<uint64_t>> WidenFp8Weight(const TensorInfo& weight,
                                                     const TensorInfo* scale,
                                                     const HubQuantization& q, DType target,
                                                     const std::string& dir);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_HUB_FP8_H_
