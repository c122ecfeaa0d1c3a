#include "router/openai_fields.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem::router::openai_api {

using nlohmann::json;

const json* Field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status WrongType(absl::string_view field, const char* expected, const json& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("`", field, "` must be ", expected, ", not ", value.type_name()));
}

absl::Status OnlyKnownFields(const json& object, std::initializer_list<absl::string_view> known,
                             absl::string_view where) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool found = false;
    for (absl::string_view k : known) found = found || it.key() == k;
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", it.key(), "` is not supported by ", where, "; leave it out"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> IntField(absl::string_view field, const json& value, int64_t lo,
                                 int64_t hi) {
  if (value.is_number_float()) {
    // A fraction, or an integer too large for 64 bits (JSON parsers keep
    // those as floating point).
    return absl::InvalidArgumentError(absl::StrCat(
        "`", field, "` is ", value.dump(), "; it must be an integer in [", lo, ", ", hi, "]"));
  }
  if (!value.is_number_integer()) return WrongType(field, "an integer", value);
  const bool too_large =
      value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(hi);
  const int64_t v = too_large ? hi : value.get<int64_t>();
  if (too_large || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("`", field, "` is ", value.dump(), "; it must be in [", lo, ", ", hi, "]"));
  }
  return v;
}

absl::StatusOr<float> FloatField(absl::string_view field, const json& value) {
  if (!value.is_number()) return WrongType(field, "a number", value);
  const double d = value.get<double>();
  if (!std::isfinite(static_cast<float>(d))) {
    return absl::InvalidArgumentError(
        absl::StrCat("`", field, "` is ", value.dump(),
                     ", beyond a 32-bit float; it must be within -3.4e38 to 3.4e38"));
  }
  return static_cast<float>(d);
}

absl::StatusOr<bool> BoolField(absl::string_view field, const json& value) {
  if (!value.is_boolean()) return WrongType(field, "a boolean", value);
  return value.get<bool>();
}

absl::StatusOr<uint64_t> SeedField(absl::string_view field, const json& value) {
  constexpr absl::string_view kRange = "[-9223372036854775808, 18446744073709551615]";
  if (value.is_number_float()) {
    return absl::InvalidArgumentError(
        absl::StrCat("`", field, "` is ", value.dump(), "; it must be an integer in ", kRange));
  }
  if (!value.is_number_integer()) return WrongType(field, "an integer", value);
  // A negative seed is taken modulo 2^64.
  return value.is_number_unsigned() ? value.get<uint64_t>()
                                    : static_cast<uint64_t>(value.get<int64_t>());
}

absl::StatusOr<std::string> StringField(absl::string_view field, const json& value) {
  if (!value.is_string()) return WrongType(field, "a string", value);
  return value.get<std::string>();
}

}  // namespace tandem::router::openai_api
