#include "common/grammar/json_schema.h"

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/grammar/regex.h"
#include "nlohmann/json.hpp"

namespace tandem::grammar {
namespace {

using json = nlohmann::ordered_json;
using Sequence = Grammar::Sequence;
using Element = Grammar::Element;

const absl::flat_hash_set<std::string>& Annotations() {
  static const auto* const kSet = new absl::flat_hash_set<std::string>{
      "title", "description", "default",    "examples", "$schema",
      "$id",   "$comment",    "deprecated", "readOnly", "writeOnly"};
  return *kSet;
}

const absl::flat_hash_set<std::string>& Served() {
  static const auto* const kSet = new absl::flat_hash_set<std::string>{
      "type",      "properties", "required",    "additionalProperties",
      "items",     "minItems",   "maxItems",    "minLength",
      "maxLength", "enum",       "const",       "anyOf",
      "$ref",      "$defs",      "definitions", "minimum",
      "pattern",   "format"};
  return *kSet;
}

// Whether `value` is an instance of JSON Schema type `type`.
bool OfType(const json& value, const std::string& type) {
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "integer") return value.is_number_integer() || value.is_number_unsigned();
  if (type == "number") return value.is_number();
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  return false;
}

class Compiler {
 public:
  explicit Compiler(const json* root) : root_(root) {
    // Between tokens: nothing, one space, or one line break and an indent
    // of up to kMaxIndent spaces or tabs (compact and pretty-printed JSON,
    // but no runs of blank lines).
    ByteSet blank;
    blank.set(' ');
    blank.set('\t');
    const Element indent_char = g_.Bytes(blank);
    int32_t indent = g_.Choice({{}});
    for (int k = 0; k < kMaxIndent; ++k) {
      indent = g_.Choice({{indent_char, Grammar::Ref(indent)}, {}});
    }
    ws_ = Grammar::Ref(g_.Choice({{}, {g_.Byte(' ')}, {g_.Byte('\n'), Grammar::Ref(indent)}}));
  }

  absl::StatusOr<Grammar> Run() {
    ASSIGN_OR_RETURN(const int32_t root, Schema(*root_, "#", 0));
    g_.set_root(root);
    RETURN_IF_ERROR(g_.Validate());
    return std::move(g_);
  }

  Grammar AnyObjectGrammar() {
    g_.set_root(AnyObject());
    return std::move(g_);
  }

 private:
  absl::StatusOr<int32_t> Schema(const json& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) {
      return absl::InvalidArgumentError(absl::StrCat("the schema nests deeper than ",
                                                     kMaxSchemaDepth, " levels at `", path, "`"));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return AnyValue();
      return absl::InvalidArgumentError(
          absl::StrCat("`", path, "` is the schema false, which no output can match"));
    }
    if (!s.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", path, "` is not a schema: a schema is an object or a boolean"));
    }
    int constraints = 0;
    for (const auto& [key, value] : s.items()) {
      if (Annotations().contains(key)) continue;
      if (!Served().contains(key)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "`", path, "`: the keyword `", key,
            "` is not supported in a response schema; remove it (served: type, properties, "
            "required, additionalProperties, items, minItems, maxItems, minLength, maxLength, "
            "pattern, format, enum, const, anyOf, $ref, $defs, integer minimum 0)"));
      }
      if (key != "$defs" && key != "definitions") ++constraints;
    }
    auto alone = [&](const char* keyword) -> absl::Status {
      if (constraints > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "`", path, "`: `", keyword,
            "` beside other constraints is not supported; move them into the referenced or "
            "listed schemas"));
      }
      return absl::OkStatus();
    };
    if (const auto it = s.find("$ref"); it != s.end()) {
      RETURN_IF_ERROR(alone("$ref"));
      return Ref(*it, path);
    }
    if (const auto it = s.find("anyOf"); it != s.end()) {
      RETURN_IF_ERROR(alone("anyOf"));
      if (!it->is_array() || it->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", path, "/anyOf` must be a non-empty array of schemas"));
      }
      const int32_t rule = g_.NewRule();
      for (size_t i = 0; i < it->size(); ++i) {
        ASSIGN_OR_RETURN(const int32_t alt,
                         Schema((*it)[i], absl::StrCat(path, "/anyOf/", i), depth + 1));
        g_.AddAlternative(rule, {Grammar::Ref(alt)});
      }
      return rule;
    }
    std::vector<std::string> types;
    if (const auto it = s.find("type"); it != s.end()) {
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array() && !it->empty()) {
        for (const json& t : *it) {
          if (!t.is_string()) break;
          types.push_back(t.get<std::string>());
        }
      }
      if (types.empty() || (it->is_array() && types.size() != it->size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", path, "/type` must be a type name or a non-empty array of them"));
      }
    }
    if (s.contains("enum") || s.contains("const")) return Literals(s, types, path);
    if (types.empty()) types.push_back(Implied(s));
    if (types.size() == 1) return Typed(s, types[0], path, depth);
    const int32_t rule = g_.NewRule();
    for (const std::string& type : types) {
      ASSIGN_OR_RETURN(const int32_t alt, Typed(s, type, path, depth));
      g_.AddAlternative(rule, {Grammar::Ref(alt)});
    }
    return rule;
  }

  // The type a schema without `type` describes by its keywords.
  static std::string Implied(const json& s) {
    for (const char* k : {"properties", "required", "additionalProperties"}) {
      if (s.contains(k)) return "object";
    }
    for (const char* k : {"items", "minItems", "maxItems"}) {
      if (s.contains(k)) return "array";
    }
    for (const char* k : {"minLength", "maxLength", "pattern", "format"}) {
      if (s.contains(k)) return "string";
    }
    if (s.contains("minimum")) return "number";
    return "any";
  }

  absl::StatusOr<int32_t> Typed(const json& s, const std::string& type, const std::string& path,
                                int depth) {
    if (type == "object") return Object(s, path, depth);
    if (type == "array") return Array(s, path, depth);
    if (type == "string") return String(s, path);
    if (type == "integer" || type == "number") {
      bool non_negative = false;
      if (const auto it = s.find("minimum"); it != s.end()) {
        if (!it->is_number() || it->get<double>() != 0.0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "`", path, "/minimum`: only a minimum of 0 is supported; remove it or use 0"));
        }
        non_negative = true;
      }
      return Number(type == "integer", non_negative);
    }
    if (type == "boolean") return g_.Choice({g_.Literal("true"), g_.Literal("false")});
    if (type == "null") return g_.Choice({g_.Literal("null")});
    if (type == "any") return AnyValue();
    return absl::InvalidArgumentError(
        absl::StrCat("`", path, "/type`: `", type,
                     "` is not a JSON Schema type (object, array, string, integer, number, "
                     "boolean, null)"));
  }

  absl::StatusOr<int32_t> Literals(const json& s, const std::vector<std::string>& types,
                                   const std::string& path) {
    std::vector<json> values;
    if (const auto it = s.find("const"); it != s.end()) values.push_back(*it);
    if (const auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", path, "/enum` must be a non-empty array"));
      }
      if (s.contains("const")) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", path, "`: give `enum` or `const`, not both"));
      }
      values.assign(it->begin(), it->end());
    }
    const int32_t rule = g_.NewRule();
    int kept = 0;
    for (const json& v : values) {
      bool typed = types.empty();
      for (const std::string& t : types) typed = typed || OfType(v, t);
      if (!typed) continue;
      g_.AddAlternative(rule, g_.Literal(v.dump()));
      ++kept;
    }
    if (kept == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", path,
                       "`: no value of `enum`/`const` is of the schema's `type`, so nothing can "
                       "match"));
    }
    return rule;
  }

  absl::StatusOr<int32_t> Ref(const json& ref, const std::string& path) {
    if (!ref.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("`", path, "/$ref` must be a string"));
    }
    const std::string target = ref.get<std::string>();
    if (const auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#') {
      return absl::InvalidArgumentError(
          absl::StrCat("`", path, "/$ref` is \"", target,
                       "\"; only references inside the schema (\"#\", \"#/$defs/...\") are "
                       "supported"));
    }
    const json* schema = root_;
    if (target.size() > 1) {
      json::json_pointer pointer;
      try {
        pointer = json::json_pointer(target.substr(1));
      } catch (const json::exception&) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", path, "/$ref` \"", target, "\" is not a JSON pointer"));
      }
      if (!root_->contains(pointer)) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", path, "/$ref` \"", target, "\" names nothing in the schema"));
      }
      schema = &(*root_)[pointer];
    }
    const int32_t rule = g_.NewRule();
    g_.set_label(rule, target);
    refs_.emplace(target, rule);
    ASSIGN_OR_RETURN(const int32_t body, Schema(*schema, target, 0));
    g_.AddAlternative(rule, {Grammar::Ref(body)});
    return rule;
  }

  absl::StatusOr<int32_t> Object(const json& s, const std::string& path, int depth) {
    const json empty = json::object();
    const auto props_it = s.find("properties");
    const json& props = props_it == s.end() ? empty : *props_it;
    if (!props.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("`", path, "/properties` must be an object"));
    }
    absl::flat_hash_set<std::string> required;
    if (const auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", path, "/required` must be an array of property names"));
      }
      for (const json& name : *it) {
        if (!name.is_string() || !props.contains(name.get<std::string>())) {
          return absl::InvalidArgumentError(
              absl::StrCat("`", path, "/required` names ", name.dump(),
                           ", which `properties` does not define; define it there"));
        }
        required.insert(name.get<std::string>());
      }
    }
    const auto extra = s.find("additionalProperties");
    const bool closed = extra != s.end() && extra->is_boolean() && !extra->get<bool>();
    if (props.empty()) {
      if (!closed) return AnyObject();
      return g_.Choice({{g_.Byte('{'), ws_, g_.Byte('}')}});
    }
    // members[i][c]: the properties from i on, c = whether one was written
    // (so the next needs a comma).
    const size_t n = props.size();
    std::vector<std::array<int32_t, 2>> members(n + 1);
    members[n] = {g_.Choice({{}}), g_.Choice({{}})};
    std::vector<std::pair<std::string, const json*>> list;
    for (const auto& [name, sub] : props.items()) list.emplace_back(name, &sub);
    for (size_t i = n; i-- > 0;) {
      const auto& [name, sub] = list[i];
      ASSIGN_OR_RETURN(const int32_t value,
                       Schema(*sub, absl::StrCat(path, "/properties/", name), depth + 1));
      for (int c = 0; c < 2; ++c) {
        const int32_t rule = g_.NewRule();
        Sequence item;
        if (c == 1) item = {ws_, g_.Byte(','), ws_};
        g_.AppendLiteral(json(name).dump(), item);
        item.insert(item.end(),
                    {ws_, g_.Byte(':'), ws_, Grammar::Ref(value), Grammar::Ref(members[i + 1][1])});
        g_.AddAlternative(rule, item);
        if (!required.contains(name)) g_.AddAlternative(rule, {Grammar::Ref(members[i + 1][c])});
        members[i][c] = rule;
      }
    }
    return g_.Choice({{g_.Byte('{'), ws_, Grammar::Ref(members[0][0]), ws_, g_.Byte('}')}});
  }

  absl::StatusOr<int> Count(const json& s, const char* key, const std::string& path, int dflt) {
    const auto it = s.find(key);
    if (it == s.end()) return dflt;
    if (!it->is_number_integer() && !it->is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", path, "/", key, "` must be a non-negative integer"));
    }
    const int64_t v = it->get<int64_t>();
    if (v < 0 || v > kMaxUnrolled) {
      return absl::InvalidArgumentError(absl::StrCat(
          "`", path, "/", key, "` is ", v, "; values from 0 to ", kMaxUnrolled, " are supported"));
    }
    return static_cast<int>(v);
  }

  absl::StatusOr<int32_t> Array(const json& s, const std::string& path, int depth) {
    ASSIGN_OR_RETURN(const int min, Count(s, "minItems", path, 0));
    ASSIGN_OR_RETURN(const int max, Count(s, "maxItems", path, -1));
    if (max >= 0 && max < min) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", path, "`: maxItems ", max, " is below minItems ", min));
    }
    int32_t item;
    if (const auto it = s.find("items"); it != s.end()) {
      ASSIGN_OR_RETURN(item, Schema(*it, path + "/items", depth + 1));
    } else {
      item = AnyValue();
    }
    Sequence out = {g_.Byte('['), ws_};
    const Sequence list = Repeat(g_, {Grammar::Ref(item)}, {ws_, g_.Byte(','), ws_}, min, max);
    out.insert(out.end(), list.begin(), list.end());
    out.insert(out.end(), {ws_, g_.Byte(']')});
    return g_.Choice({out});
  }

  absl::StatusOr<int32_t> String(const json& s, const std::string& path) {
    ASSIGN_OR_RETURN(const int min, Count(s, "minLength", path, 0));
    ASSIGN_OR_RETURN(const int max, Count(s, "maxLength", path, -1));
    if (max >= 0 && max < min) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", path, "`: maxLength ", max, " is below minLength ", min));
    }
    const auto pattern = s.find("pattern");
    const auto format = s.find("format");
    if (pattern != s.end() || format != s.end()) {
      if (pattern != s.end() && format != s.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", path, "`: `pattern` with `format` is not supported; keep one"));
      }
      if (s.contains("minLength") || s.contains("maxLength")) {
        return absl::InvalidArgumentError(absl::StrCat(
            "`", path,
            "`: minLength or maxLength with a pattern or format is not supported; put the "
            "length in the pattern (e.g. {1,20})"));
      }
      std::string regex;
      if (pattern != s.end()) {
        if (!pattern->is_string()) {
          return absl::InvalidArgumentError(absl::StrCat("`", path, "/pattern` must be a string"));
        }
        regex = pattern->get<std::string>();
      } else {
        const char* known = format->is_string() ? FormatRegex(format->get<std::string>()) : nullptr;
        if (known == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("`", path, "/format` ", format->dump(),
                           " is not supported; served: date, time, date-time, uuid, email, ipv4"));
        }
        regex = known;
      }
      absl::StatusOr<int32_t> body =
          AddRegex(g_, regex, {.output = RegexOutput::kJsonString, .search = true});
      if (!body.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("`", path, "`: ", body.status().message()));
      }
      return g_.Choice({{g_.Byte('"'), Grammar::Ref(*body), g_.Byte('"')}});
    }
    if (min == 0 && max < 0) return AnyString();
    Sequence out = {g_.Byte('"')};
    const Sequence body = Repeat(g_, {Grammar::Ref(StringChar())}, {}, min, max);
    out.insert(out.end(), body.begin(), body.end());
    out.push_back(g_.Byte('"'));
    return g_.Choice({out});
  }

  // One character of a JSON string: printable ASCII but `"` and `\`, an
  // escape, or a UTF-8 sequence of 2 to 4 bytes.
  int32_t StringChar() {
    if (string_char_ >= 0) return string_char_;
    ByteSet plain = ByteRange(0x20, 0x7f);
    plain.reset('"');
    plain.reset('\\');
    ByteSet escaped;
    for (char c : std::string("\"\\/bfnrt")) escaped.set(static_cast<uint8_t>(c));
    const Element h = g_.Bytes(ByteRange('0', '9') | ByteRange('a', 'f') | ByteRange('A', 'F'));
    const Element d = g_.Bytes(ByteRange('d', 'd') | ByteRange('D', 'D'));
    auto b = [&](int lo, int hi) { return g_.Bytes(ByteRange(lo, hi)); };
    const Element u = g_.Byte('u');
    const Element slash = g_.Byte('\\');
    // \uXXXX outside the surrogates, or a high surrogate then a low one.
    const Element not_d = g_.Bytes(ByteRange('0', '9') | ByteRange('a', 'c') | ByteRange('A', 'C') |
                                   ByteRange('e', 'f') | ByteRange('E', 'F'));
    const Element high = g_.Bytes(ByteRange('8', '9') | ByteRange('a', 'b') | ByteRange('A', 'B'));
    const Element low = g_.Bytes(ByteRange('c', 'f') | ByteRange('C', 'F'));
    string_char_ = g_.Choice({{g_.Bytes(plain)},
                              {slash, g_.Bytes(escaped)},
                              {slash, u, not_d, h, h, h},
                              {slash, u, d, b('0', '7'), h, h},
                              {slash, u, d, high, h, h, slash, u, d, low, h, h},
                              {Grammar::Ref(Utf8MultiByte(g_))}});
    return string_char_;
  }

  int32_t AnyString() {
    if (any_string_ < 0) {
      any_string_ = g_.Choice(
          {{g_.Byte('"'), Grammar::Ref(g_.Star({Grammar::Ref(StringChar())})), g_.Byte('"')}});
    }
    return any_string_;
  }

  // Up to `count` digits.
  int32_t Digits(int count) {
    const Element digit = g_.Bytes(ByteRange('0', '9'));
    int32_t rule = g_.Choice({{}});
    for (int k = 0; k < count; ++k) rule = g_.Choice({{digit, Grammar::Ref(rule)}, {}});
    return rule;
  }

  int32_t Number(bool integer, bool non_negative) {
    int32_t& cached = number_[integer][non_negative];
    if (cached >= 0) return cached;
    const int32_t whole =
        g_.Choice({{g_.Byte('0')}, {g_.Bytes(ByteRange('1', '9')), Grammar::Ref(Digits(15))}});
    Sequence out;
    if (!non_negative) out.push_back(Grammar::Ref(g_.Optional({g_.Byte('-')})));
    out.push_back(Grammar::Ref(whole));
    if (!integer) {
      const Element digit = g_.Bytes(ByteRange('0', '9'));
      ByteSet e;
      e.set('e');
      e.set('E');
      ByteSet sign;
      sign.set('+');
      sign.set('-');
      out.push_back(Grammar::Ref(g_.Optional({g_.Byte('.'), digit, Grammar::Ref(Digits(15))})));
      out.push_back(
          Grammar::Ref(g_.Optional({g_.Bytes(e), Grammar::Ref(g_.Optional({g_.Bytes(sign)})), digit,
                                    Grammar::Ref(Digits(2))})));
    }
    cached = g_.Choice({out});
    return cached;
  }

  int32_t AnyValue() {
    if (any_value_ >= 0) return any_value_;
    any_value_ = g_.NewRule();
    const int32_t array = g_.NewRule();
    for (const Sequence& s :
         {Sequence{Grammar::Ref(AnyObject())}, Sequence{Grammar::Ref(array)},
          Sequence{Grammar::Ref(AnyString())}, Sequence{Grammar::Ref(Number(false, false))},
          g_.Literal("true"), g_.Literal("false"), g_.Literal("null")}) {
      g_.AddAlternative(any_value_, s);
    }
    const Sequence items = Repeat(g_, {Grammar::Ref(any_value_)}, {ws_, g_.Byte(','), ws_}, 0, -1);
    Sequence a = {g_.Byte('['), ws_};
    a.insert(a.end(), items.begin(), items.end());
    a.insert(a.end(), {ws_, g_.Byte(']')});
    g_.AddAlternative(array, a);
    return any_value_;
  }

  int32_t AnyObject() {
    if (any_object_ >= 0) return any_object_;
    any_object_ = g_.NewRule();
    const int32_t value = AnyValue();
    const Sequence member = {Grammar::Ref(AnyString()), ws_, g_.Byte(':'), ws_,
                             Grammar::Ref(value)};
    const Sequence members = Repeat(g_, member, {ws_, g_.Byte(','), ws_}, 0, -1);
    Sequence o = {g_.Byte('{'), ws_};
    o.insert(o.end(), members.begin(), members.end());
    o.insert(o.end(), {ws_, g_.Byte('}')});
    g_.AddAlternative(any_object_, o);
    return any_object_;
  }

  const json* root_;
  Grammar g_;
  Element ws_;
  absl::flat_hash_map<std::string, int32_t> refs_;
  int32_t string_char_ = -1;
  int32_t any_string_ = -1;
  int32_t any_value_ = -1;
  int32_t any_object_ = -1;
  int32_t number_[2][2] = {{-1, -1}, {-1, -1}};
};

}  // namespace

absl::StatusOr<Grammar> CompileJsonSchema(std::string_view schema_json) {
  // Ordered: properties are written in the order the schema declares them.
  const json schema = json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) {
    return absl::InvalidArgumentError("the JSON schema is not valid JSON");
  }
  return Compiler(&schema).Run();
}

Grammar JsonObjectGrammar() {
  const json none;
  return Compiler(&none).AnyObjectGrammar();
}

}  // namespace tandem::grammar
