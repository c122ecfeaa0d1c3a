// Typed access to the fields of an OpenAI API request body, each error an
// INVALID_ARGUMENT that names the field and says what it must be.
#ifndef TANDEM_ROUTER_OPENAI_FIELDS_H_
#define TANDEM_ROUTER_OPENAI_FIELDS_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tandem::router::openai_api {

// The field's value, or null when absent or JSON null.
const nlohmann::json* Field(const nlohmann::json& object, const char* name);
absl::Status WrongType(absl::string_view field, const char* expected, const nlohmann::json& value);
// INVALID_ARGUMENT naming the first key of `object` not in `known`.
absl::Status OnlyKnownFields(const nlohmann::json& object,
                             std::initializer_list<absl::string_view> known,
                             absl::string_view where);
absl::StatusOr<int64_t> IntField(absl::string_view field, const nlohmann::json& value, int64_t lo,
                                 int64_t hi);
absl::StatusOr<float> FloatField(absl::string_view field, const nlohmann::json& value);
absl::StatusOr<bool> BoolField(absl::string_view field, const nlohmann::json& value);
// A seed: any integer from -2^63 to 2^64 - 1 (a negative one modulo 2^64).
absl::StatusOr<uint64_t> SeedField(absl::string_view field, const nlohmann::json& value);
absl::StatusOr<std::string> StringField(absl::string_view field, const nlohmann::json& value);

}  // namespace tandem::router::openai_api

#endif  // TANDEM_ROUTER_OPENAI_FIELDS_H_
