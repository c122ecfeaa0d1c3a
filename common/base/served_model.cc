#include "common/base/served_model.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem {

std::string ModelNameOfPath(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return std::filesystem::path(path).filename().string();
}

absl::StatusOr<std::string> ServedModelName(const std::string& served, const std::string& alias,
                                            const std::string& path) {
  if (!served.empty() && !alias.empty() && served != alias) {
    return absl::InvalidArgumentError(absl::StrCat("--served_model_name=", served,
                                                   " and its deprecated alias --model_name=", alias,
                                                   " disagree; pass only --served_model_name"));
  }
  if (!served.empty()) return served;
  if (!alias.empty()) return alias;
  return ModelNameOfPath(path);
}

absl::StatusOr<std::optional<DType>> ParseKvDTypeFlag(const std::string& value) {
  if (value.empty()) return std::optional<DType>();
  if (value == DTypeName(DType::kI8)) return std::optional<DType>(DType::kI8);
  absl::StatusOr<DType> dtype = ParseDType(value);
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_dtype=", value,
        " is not a KV cache type: pass f32, bf16, f16 or int8, or leave it empty for the weights' "
        "type"));
  }
  return std::optional<DType>(*dtype);
}

}  // namespace tandem
