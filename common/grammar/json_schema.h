// JSON Schema to a byte Grammar whose sentences are the JSON texts the
// schema accepts: the subset OpenAI's structured outputs accept in strict
// mode, and a little more.
//
// Served: type (one or a list), properties with required (properties in
// the order declared; those not required may be left out), additionalProperties
// (false, or anything else: only declared properties are written; an object
// with no properties and additional ones allowed is any object), items,
// minItems/maxItems (up to kMaxUnrolled), minLength/maxLength (the same),
// pattern (regex.h's syntax; matched anywhere unless anchored, as JSON
// Schema says), format (date, time, date-time, uuid, email, ipv4),
// enum, const, anyOf, $ref to "#" or "#/$defs/...", "#/definitions/..."
// (recursion included), integer minimum 0, and the annotations (title,
// description, default, examples, $schema, $id, $comment, deprecated,
// readOnly, writeOnly), which constrain nothing. Any other keyword is
// INVALID_ARGUMENT naming it and where it is: a constraint is never dropped.
//
// The JSON written: no whitespace at the start or end; between tokens
// nothing, a space, or a line break and up to kMaxIndent spaces or tabs
// (so a model cannot pad its output with blank lines); strings of valid
// UTF-8 with JSON's escapes, integers of at most 16 digits, fractions of at
// most 16, exponents of at most 3 (so a model cannot write digits forever).
#ifndef TANDEM_COMMON_GRAMMAR_JSON_SCHEMA_H_
#define TANDEM_COMMON_GRAMMAR_JSON_SCHEMA_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "common/grammar/grammar.h"

namespace tandem::grammar {

inline constexpr int kMaxIndent = 20;
inline constexpr int kMaxUnrolled = 1024;
// How deep a schema may nest (subschemas inside subschemas).
inline constexpr int kMaxSchemaDepth = 64;

// `schema_json` is the schema's JSON text (parsed keeping the order of its
// properties, which is the order they are written in).
absl::StatusOr<Grammar> CompileJsonSchema(std::string_view schema_json);

// Any JSON object (OpenAI's response_format {"type": "json_object"}).
Grammar JsonObjectGrammar();

}  // namespace tandem::grammar

#endif  // TANDEM_COMMON_GRAMMAR_JSON_SCHEMA_H_
