#include "common/model/hub_fp8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/float16.h"
#include "common/base/fp8.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}
namespace {

using Json = nlohmann::json;

constexpr char kSupported[] =
    "supported: quant_method \"compressed-tensors\" with FP8 E4M3 weights (num_bits 8, type "
    "\"float\", format \"float-quantized\") and strategy \"tensor\" or \"channel\", and "
    "quant_method \"fp8\" with fmt \"e4m3\" and weight_block_size [rows, columns] (each 1 to "
    "65536) or none";

// Field `path` of quantization_config holds what `value` says (JSON text or
// "missing"), which is not supported.
absl::Status Unsupported(const std::string& file, const std::string& key, const std::string& path,
                         const std::string& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("'", file, "': field '", key, ".", path, "' is ", value, "; ", kSupported));
}

// Field `field` of `j` as JSON text, or "missing".
std::string ValueText(const Json& j, const char* field) {
  return j.contains(field) ? j[field].dump() : "missing";
}

bool AbsentOrNull(const Json& j, const char* key) { return !j.contains(key) || j[key].is_null(); }

// One entry of config_groups: its weights must be FP8, per tensor or per
// channel. Activation schemes are not checked: activations are computed in
// 16 or 32 bits whatever the checkpoint was calibrated for.
absl::Status CheckGroup(const Json& group, const std::string& file, const std::string& key,
                        const std::string& path) {
  if (!group.is_object()) return Unsupported(file, key, path, group.dump());
  const std::string at = path + ".weights";
  if (AbsentOrNull(group, "weights")) {
    return Unsupported(file, key, at, ValueText(group, "weights"));
  }
  const Json& w = group["weights"];
  if (!w.is_object()) return Unsupported(file, key, at, w.dump());
  if (!w.contains("num_bits") || !w["num_bits"].is_number_integer() || w["num_bits"] != 8) {
    return Unsupported(file, key, at + ".num_bits", ValueText(w, "num_bits"));
  }
  if (!w.contains("type") || w["type"] != "float") {
    return Unsupported(file, key, at + ".type", ValueText(w, "type"));
  }
  if (!w.contains("strategy") || (w["strategy"] != "tensor" && w["strategy"] != "channel")) {
    return Unsupported(file, key, at + ".strategy", ValueText(w, "strategy"));
  }
  // A group size or block structure would come with scales of another shape.
  for (const char* field : {"group_size", "block_structure"}) {
    if (!AbsentOrNull(w, field)) return Unsupported(file, key, at + "." + field, w[field].dump());
  }
  // Asymmetric weights would carry zero points; dynamic weights have no
  // stored scales.
  if (!AbsentOrNull(w, "symmetric") && w["symmetric"] != true) {
    return Unsupported(file, key, at + ".symmetric", w["symmetric"].dump());
  }
  if (!AbsentOrNull(w, "dynamic") && w["dynamic"] != false) {
    return Unsupported(file, key, at + ".dynamic", w["dynamic"].dump());
  }
  return absl::OkStatus();
}

// quant_method "fp8" (DeepSeek-V3, Qwen3 -FP8): E4M3 codes, scales per
// block or, without weight_block_size, per tensor. The activation scheme
// is not checked, as for compressed-tensors; modules_to_not_convert and
// ignored_layers need nothing, as FP8 is read from each tensor's type.
absl::Status ReadBlockFp8(const Json& qc, const std::string& file, const std::string& key,
                          HubQuantization& q) {
  if (!AbsentOrNull(qc, "fmt") && qc["fmt"] != "e4m3") {
    return Unsupported(file, key, "fmt", qc["fmt"].dump());
  }
  if (!AbsentOrNull(qc, "kv_cache_scheme")) {
    return Unsupported(file, key, "kv_cache_scheme", qc["kv_cache_scheme"].dump());
  }
  if (AbsentOrNull(qc, "weight_block_size")) return absl::OkStatus();
  const Json& b = qc["weight_block_size"];
  constexpr int64_t kMaxBlock = 65536;
  auto valid = [&](const Json& v) {
    return v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= kMaxBlock;
  };
  if (!b.is_array() || b.size() != 2 || !valid(b[0]) || !valid(b[1])) {
    return Unsupported(file, key, "weight_block_size", b.dump());
  }
  q.block_rows = b[0].get<int>();
  q.block_cols = b[1].get<int>();
  return absl::OkStatus();
}

// The scales of an FP8 weight: each covers block_rows x block_cols
// elements, the blocks tiling the matrix row-major (a block per tensor is
// rows x cols, per channel 1 x cols).
struct ScaleGrid {
  std::vector<float> values;
  int64_t block_rows = 1;
  int64_t block_cols = 1;
};

// Scale `i` of `scale` (F32, F16 or BF16), read without alignment needs.
float ScaleAt(const TensorInfo& scale, int64_t i) {
  if (scale.dtype == SafetensorsDType::kF32) {
    float f;
    std::memcpy(&f, scale.bytes.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, scale.bytes.data() + 2 * i, 2);
  return scale.dtype == SafetensorsDType::kBF16 ? Bf16ToFp32(h) : Fp16ToFp32(h);
}

absl::StatusOr<ScaleGrid> ReadScales(const TensorInfo* scale, const HubQuantization& q,
                                     const TensorInfo& weight, const std::string& dir) {
  const int64_t rows = weight.shape[0], cols = weight.shape[1];
  const std::string name = Fp8WeightScaleName(weight.name, q);
  auto invalid = [&](const std::string& problem) {
    return absl::InvalidArgumentError(absl::StrCat("'", dir, "': ", problem));
  };
  if (scale == nullptr) {
    return invalid(absl::StrCat("FP8 tensor '", weight.name, "' has no '", name,
                                "' beside it (its quantization_config stores one per FP8 weight)"));
  }
  const std::vector<int64_t>& s = scale->shape;
  ScaleGrid grid;
  if (q.block_rows > 0) {
    const std::vector<int64_t> want = {(rows + q.block_rows - 1) / q.block_rows,
                                       (cols + q.block_cols - 1) / q.block_cols};
    if (s != want) {
      return invalid(absl::StrCat("tensor '", name, "' has shape ", ShapeText(s), "; FP8 tensor '",
                                  weight.name, "' ", ShapeText(weight.shape), " in ", q.block_rows,
                                  " x ", q.block_cols, " blocks needs ", ShapeText(want)));
    }
    grid.block_rows = q.block_rows;
    grid.block_cols = q.block_cols;
  } else {
    const bool per_tensor = s.empty() || s == std::vector<int64_t>{1};
    const bool per_row = s == std::vector<int64_t>{rows} || s == std::vector<int64_t>{rows, 1};
    if (!per_tensor && !per_row) {
      return invalid(absl::StrCat("tensor '", name, "' has shape ", ShapeText(s), "; FP8 tensor '",
                                  weight.name, "' needs [", rows, ", 1] or [", rows,
                                  "] (per channel), or [1] or [] (per tensor)"));
    }
    grid.block_rows = per_tensor ? std::max<int64_t>(rows, 1) : 1;
    grid.block_cols = std::max<int64_t>(cols, 1);
  }
  if (scale->dtype != SafetensorsDType::kF32 && scale->dtype != SafetensorsDType::kF16 &&
      scale->dtype != SafetensorsDType::kBF16) {
    return invalid(absl::StrCat("tensor '", name, "' is ",
                                std::string(SafetensorsDTypeName(scale->dtype)),
                                "; scales must be F32, F16 or BF16"));
  }
  // The shape checks bound the count by the weight's elements (safetensors
  // checked that the bytes match the shape).
  grid.values.resize(static_cast<size_t>(scale->num_elements));
  for (size_t i = 0; i < grid.values.size(); ++i) {
    const float v = ScaleAt(*scale, static_cast<int64_t>(i));
    if (!std::isfinite(v) || !(v > 0.0f)) {
      return invalid(absl::StrCat("tensor '", name, "' holds ", v, " at index ", i,
                                  "; scales must be finite and positive"));
    }
    grid.values[i] = v;
  }
  return grid;
}

// `value` rounded to `target`, as the bits stored (low 16 bits for f16 and
// bf16), and whether the rounded value is finite.
uint32_t RoundTo(float value, DType target, bool* finite) {
  if (target == DType::kF32) {
    *finite = std::isfinite(value);
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    return bits;
  }
  const uint16_t h = target == DType::kBF16 ? Fp32ToBf16(value) : Fp32ToFp16(value);
  *finite = std::isfinite(target == DType::kBF16 ? Bf16ToFp32(h) : Fp16ToFp32(h));
  return h;
}

}  // namespace

absl::StatusOr<HubQuantization> ReadHubQuantization(const Json& j, const std::string& file) {
  // Early compressed-tensors checkpoints said "compression_config".
  const std::string key =
      j.contains("quantization_config") ? "quantization_config" : "compression_config";
  HubQuantization q;
  if (AbsentOrNull(j, key.c_str())) return q;
  const Json& qc = j[key];
  if (!qc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", file, "': field '", key, "' must be an object or null"));
  }
  if (qc.contains("quant_method") && qc["quant_method"] == "fp8") {
    RETURN_IF_ERROR(ReadBlockFp8(qc, file, key, q));
    q.fp8_weights = true;
    return q;
  }
  if (!qc.contains("quant_method") || qc["quant_method"] != "compressed-tensors") {
    return Unsupported(file, key, "quant_method", ValueText(qc, "quant_method"));
  }
  // "naive-quantized" is the older name of the same layout.
  if (!AbsentOrNull(qc, "format") && qc["format"] != "float-quantized" &&
      qc["format"] != "naive-quantized") {
    return Unsupported(file, key, "format", qc["format"].dump());
  }
  if (!AbsentOrNull(qc, "sparsity_config") && !qc["sparsity_config"].empty()) {
    return Unsupported(file, key, "sparsity_config", qc["sparsity_config"].dump());
  }
  // An FP8 KV cache comes with k_scale / v_scale tensors; the KV cache here
  // has its own types (--kv_dtype).
  if (!AbsentOrNull(qc, "kv_cache_scheme")) {
    return Unsupported(file, key, "kv_cache_scheme", qc["kv_cache_scheme"].dump());
  }
  if (!qc.contains("config_groups") || !qc["config_groups"].is_object() ||
      qc["config_groups"].empty()) {
    return Unsupported(file, key, "config_groups", ValueText(qc, "config_groups"));
  }
  for (const auto& [name, group] : qc["config_groups"].items()) {
    RETURN_IF_ERROR(CheckGroup(group, file, key, "config_groups." + name));
  }
  q.fp8_weights = true;
  return q;
}

std::string Fp8WeightScaleName(const std::string& weight_name, const HubQuantization& q) {
  return weight_name + (q.block_rows > 0 ? "_scale_inv" : "_scale");
}

std::string Fp8InputScaleName(const std::string& weight_name) {
  constexpr std::string_view kSuffix = "weight";
  std::string stem = weight_name;
  if (stem.ends_with(kSuffix)) stem.resize(stem.size() - kSuffix.size());
  return stem + "input_scale";
}

absl::StatusOr<std::vector<uint64_t>> WidenFp8Weight(const TensorInfo& weight,
                                                     const TensorInfo* scale,
                                                     const HubQuantization& q, DType target,
                                                     const std::string& dir) {
  auto invalid = [&](const std::string& problem) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", dir, "': tensor '", weight.name, "' ", problem));
  };
  if (weight.dtype != SafetensorsDType::kF8E4M3 || weight.shape.size() != 2) {
    return invalid(absl::StrCat("is ", std::string(SafetensorsDTypeName(weight.dtype)), " ",
                                ShapeText(weight.shape),
                                "; FP8 (F8_E4M3) is supported for weight matrices only, norms and "
                                "biases must be F32, F16 or BF16"));
  }
  if (target != DType::kF32 && target != DType::kF16 && target != DType::kBF16) {
    return invalid(absl::StrCat("cannot be widened to ", std::string(DTypeName(target))));
  }
  const int64_t rows = weight.shape[0], cols = weight.shape[1];
  ASSIGN_OR_RETURN(ScaleGrid grid, ReadScales(scale, q, weight, dir));

  // A block has at most 256 distinct values: round them once per block.
  const size_t out_size = DTypeSize(target);
  std::vector<uint64_t> storage((static_cast<size_t>(weight.num_elements) * out_size + 7) / 8);
  uint8_t* out = reinterpret_cast<uint8_t*>(storage.data());
  const uint8_t* codes = weight.bytes.data();
  std::array<uint32_t, 256> table;
  std::array<bool, 256> finite;
  const int64_t grid_cols = (cols + grid.block_cols - 1) / grid.block_cols;
  for (size_t b = 0; b < grid.values.size(); ++b) {
    const float s = grid.values[b];
    for (int c = 0; c < 256; ++c) {
      table[c] = RoundTo(Fp8E4M3ToFloat(static_cast<uint8_t>(c)) * s, target, &finite[c]);
    }
    const int64_t r0 = static_cast<int64_t>(b) / grid_cols * grid.block_rows;
    const int64_t c0 = static_cast<int64_t>(b) % grid_cols * grid.block_cols;
    for (int64_t r = r0; r < std::min(rows, r0 + grid.block_rows); ++r) {
      for (int64_t c = c0; c < std::min(cols, c0 + grid.block_cols); ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        const uint8_t code = codes[i];
        if (!finite[code]) {
          return invalid(absl::StrCat("has code 0x", absl::Hex(code), " at [", r, ", ", c,
                                      "], which times its scale ", s, " is not a finite ",
                                      std::string(DTypeName(target)), " value"));
        }
        if (out_size == 4) {
          std::memcpy(out + 4 * i, &table[code], 4);
        } else {
          const uint16_t h = static_cast<uint16_t>(table[code]);
          std::memcpy(out + 2 * i, &h, 2);
        }
      }
    }
  }
  return storage;
}

}  // namespace tandem
