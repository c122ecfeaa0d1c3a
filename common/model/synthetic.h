// Models with deterministic random weights, for tests and benchmarks of any
// shape. Weights are scaled (uniform, variance 1/fan_in; norms near 1) so
// that activations stay in a sane range through many layers.
#ifndef TANDEM_COMMON_MODEL_SYNTHETIC_H_
#define TANDEM_COMMON_MODEL_SYNTHETIC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"

namespace tandem {

// Same config and seed give the same weights on every machine. Matrices are
// held in `dtype` (the same draws, rounded), norms and biases in f32.
absl::StatusOr<std::unique_ptr<ModelWeights>> MakeSyntheticModel(const ModelConfig& config,
                                                                 uint64_t seed,
                                                                 DType dtype = DType::kF32);

// A llama2.c tokenizer.bin for `vocab_size` ids: <unk>, <s>, </s>, the 256
// byte tokens, then made-up word pieces (" e", "th", ...) scored so that
// longer pieces merge first. Lets a synthetic model stand in for a real one
// end to end (text in, text out) when no real tokenizer is at hand.
// INVALID_ARGUMENT for a vocab_size below 260.
absl::StatusOr<std::string> SyntheticTokenizerBytes(int vocab_size);

// Shapes of the TinyStories checkpoints, used by benchmarks.
ModelConfig Stories15MShape();
ModelConfig Stories110MShape();
// Llama-3.2-1B's shape (tied classifier, llama3 RoPE scaling, half-split
// RoPE as in Hugging Face checkpoints), with the context cut to 8192.
ModelConfig Llama32_1BShape();
// Llama-3-8B's shape (GQA, untied classifier, 128256-token vocabulary), for
// GPU benchmarks.
ModelConfig Llama3_8BShape();
// Llama-3-70B's shape, for the simulator's planning (80 layers, GQA 64/8).
ModelConfig Llama3_70BShape();
// Qwen3-0.6B's shape: per-head q/k norms, head_dim 128 beside a width of
// 1024, tied classifier, 151936-token vocabulary; context 40960.
ModelConfig Qwen3_0_6BShape();
// A tiny Qwen3 for tests: q_dim (128) above the width (64), GQA 4/2,
// untied, 512 tokens.
ModelConfig Qwen3SmallShape();

// Mixture-of-experts shapes: Qwen3-30B-A3B (128 experts, top 8, experts
// 768 wide, q/k norms), Mixtral-8x7B (8 experts, top 2) and OLMoE-1B-7B (64
// experts, top 8, q/k norms over the whole projections), untied.
ModelConfig Qwen3_30B_A3BShape();
ModelConfig Mixtral8x7BShape();
ModelConfig Olmoe1B7BShape();
// Latent-attention shapes as their config.json say: DeepSeek-V2-Lite (no q
// rank, 64 experts, top 6, two shared, softmax greedy routing), DeepSeek-V3
// (q rank 1536, 256 experts in 8 groups, top 8, sigmoid scores with a bias,
// three dense layers) and Kimi K2 (V3's architecture, 384 experts, 64
// heads, one dense layer).
ModelConfig DeepSeekV2LiteShape();
ModelConfig DeepSeekV3Shape();
ModelConfig KimiK2Shape();
// Tiny ones of each mixture-of-experts architecture for tests, by name
// (mixtral-small, qwen2-moe-small with a shared expert and sparse step 2,
// qwen3-moe-small with a dense layer, olmoe-small), vocabulary 512.
std::vector<std::pair<std::string, ModelConfig>> SmallMoeShapes();
// Tiny latent-attention ones for tests: deepseek-v2-lite-small (no q rank,
// softmax greedy routing, two shared experts, a dense first layer),
// deepseek-v2-small (q rank, group-limited softmax routing scaled by 1.5)
// and deepseek-v3-small (q rank, sigmoid scores with a bias, groups scored
// by their best two, renormalised and scaled, YaRN), vocabulary 512.
std::vector<std::pair<std::string, ModelConfig>> SmallDeepSeekShapes();

// The shapes above by name ("stories15M", "llama3-8b", "qwen3-0.6b", ...);
// INVALID_ARGUMENT listing the names for another.
absl::StatusOr<ModelConfig> NamedShape(std::string_view name);
// The names NamedShape knows, comma-separated, for help texts.
std::string NamedShapeList();

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_SYNTHETIC_H_
