#include "common/tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::json;
using Range = std::pair<uint32_t, uint32_t>;

// GPT-2's pattern, which ByteLevel applies when use_regex is set.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::Status FieldError(const std::string& field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("field '", field, "': ", message));
}

// The string member `key` of `json`, or an error naming the field.
absl::StatusOr<std::string> StringField(const Json& json, const char* key,
                                        const std::string& field) {
  const auto it = json.find(key);
  if (it == json.end() || !it->is_string()) {
    return FieldError(absl::StrCat(field, ".", key), "missing or not a string");
  }
  return it->get<std::string>();
}

bool BoolField(const Json& json, const char* key, bool fallback) {
  const auto it = json.find(key);
  return it != json.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// A Split/Replace `pattern`: {"String": s} or {"Regex": r}. Sets `literal`.
absl::StatusOr<std::string> PatternField(const Json& json, const std::string& field,
                                         bool* literal) {
  const auto it = json.find("pattern");
  if (it != json.end() && it->is_object()) {
    if (it->contains("String") && (*it)["String"].is_string()) {
      *literal = true;
      return (*it)["String"].get<std::string>();
    }
    if (it->contains("Regex") && (*it)["Regex"].is_string()) {
      *literal = false;
      return (*it)["Regex"].get<std::string>();
    }
  }
  return FieldError(absl::StrCat(field, ".pattern"),
                    "missing; expected {\"String\": ...} or {\"Regex\": ...}");
}

pcre2_match_data* ThreadMatchData() {
  struct Holder {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(data); }
  };
  thread_local Holder holder;
  return holder.data;
}

// Rebuilds `words` with each range replaced by `transform(range text)`.
template <typename F>
void Rewrite(Words* words, F transform) {
  Words out;
  out.text.reserve(words->text.size() + words->ranges.size() * 3);
  out.ranges.reserve(words->ranges.size());
  for (const auto& [b, e] : words->ranges) {
    const uint32_t begin = static_cast<uint32_t>(out.text.size());
    transform(std::string_view(words->text).substr(b, e - b), out.ranges.size(), &out.text);
    out.ranges.emplace_back(begin, static_cast<uint32_t>(out.text.size()));
  }
  *words = std::move(out);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, bool literal) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  const uint32_t flags = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   flags, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(
        absl::StrCat("bad regex: ", reinterpret_cast<char*>(message), " at offset ", error_offset));
  }
  // Without JIT support (some architectures) matching falls back to the
  // interpreter; the result is the same.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(code));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::FindAll(std::string_view text, std::vector<Range>* matches) const {
  pcre2_code* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* data = ThreadMatchData();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    const int rc =
        pcre2_match(code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a resource limit: the rest is one gap.
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (end > begin) {
      matches->emplace_back(static_cast<uint32_t>(begin), static_cast<uint32_t>(end));
      offset = end;
      continue;
    }
    // An empty match: step over one character.
    if (end >= text.size()) break;
    const int len = Utf8CharLength(text.substr(end));
    offset = end + (len > 0 ? len : 1);
  }
}

absl::StatusOr<Normalizer> Normalizer::Parse(const Json& json, const std::string& field) {
  Normalizer n;
  if (!json.is_null()) RETURN_IF_ERROR(n.ParseInto(json, field));
  return n;
}

absl::Status Normalizer::ParseInto(const Json& json, const std::string& field) {
  if (!json.is_object()) return FieldError(field, "not an object");
  ASSIGN_OR_RETURN(const std::string type, StringField(json, "type", field));
  if (type == "Sequence") {
    const auto it = json.find("normalizers");
    if (it == json.end() || !it->is_array()) {
      return FieldError(absl::StrCat(field, ".normalizers"), "missing or not an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      RETURN_IF_ERROR(ParseInto((*it)[i], absl::StrCat(field, ".normalizers[", i, "]")));
    }
    return absl::OkStatus();
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string prepend, StringField(json, "prepend", field));
    steps_.push_back({Step::Kind::kPrepend, "", std::move(prepend)});
    return absl::OkStatus();
  }
  if (type == "Replace") {
    bool literal = false;
    ASSIGN_OR_RETURN(std::string from, PatternField(json, field, &literal));
    if (!literal || from.empty()) {
      return FieldError(absl::StrCat(field, ".pattern"),
                        "only a non-empty String pattern is supported in a Replace normalizer");
    }
    ASSIGN_OR_RETURN(std::string to, StringField(json, "content", field));
    steps_.push_back({Step::Kind::kReplace, std::move(from), std::move(to)});
    return absl::OkStatus();
  }
  if (type == "NFC") return absl::OkStatus();
  return FieldError(absl::StrCat(field, ".type"),
                    absl::StrCat("unsupported normalizer '", type,
                                 "' (supported: Sequence, Prepend, Replace, NFC)"));
}

void Normalizer::Apply(std::string* text) const {
  for (const Step& step : steps_) {
    if (step.kind == Step::Kind::kPrepend) {
      if (!text->empty()) text->insert(0, step.to);
      continue;
    }
    if (text->find(step.from) == std::string::npos) continue;
    std::string out;
    out.reserve(text->size() + text->size() / 4);
    size_t pos = 0;
    for (size_t hit; (hit = text->find(step.from, pos)) != std::string::npos;
         pos = hit + step.from.size()) {
      out.append(*text, pos, hit - pos);
      out.append(step.to);
    }
    out.append(*text, pos);
    *text = std::move(out);
  }
}

PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<PreTokenizer> PreTokenizer::Parse(const Json& json, const std::string& field) {
  PreTokenizer p;
  if (!json.is_null()) RETURN_IF_ERROR(p.ParseInto(json, field));
  return p;
}

absl::Status PreTokenizer::ParseInto(const Json& json, const std::string& field) {
  if (!json.is_object()) return FieldError(field, "not an object");
  ASSIGN_OR_RETURN(const std::string type, StringField(json, "type", field));
  const auto add_split = [&](std::string_view pattern, bool literal, Behavior behavior, bool invert,
                             const std::string& pattern_field) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Regex>> regex = Regex::Compile(pattern, literal);
    if (!regex.ok()) return FieldError(pattern_field, regex.status().message());
    Step step(Step::Kind::kSplit);
    step.regex = std::move(regex).value();
    step.behavior = behavior;
    step.invert = invert;
    steps_.push_back(std::move(step));
    return absl::OkStatus();
  };
  if (type == "Sequence") {
    const auto it = json.find("pretokenizers");
    if (it == json.end() || !it->is_array()) {
      return FieldError(absl::StrCat(field, ".pretokenizers"), "missing or not an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      RETURN_IF_ERROR(ParseInto((*it)[i], absl::StrCat(field, ".pretokenizers[", i, "]")));
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    bool literal = false;
    ASSIGN_OR_RETURN(const std::string pattern, PatternField(json, field, &literal));
    ASSIGN_OR_RETURN(const std::string behavior_name, StringField(json, "behavior", field));
    Behavior behavior;
    if (behavior_name == "Removed") {
      behavior = Behavior::kRemoved;
    } else if (behavior_name == "Isolated") {
      behavior = Behavior::kIsolated;
    } else if (behavior_name == "MergedWithPrevious") {
      behavior = Behavior::kMergedWithPrevious;
    } else if (behavior_name == "MergedWithNext") {
      behavior = Behavior::kMergedWithNext;
    } else if (behavior_name == "Contiguous") {
      behavior = Behavior::kContiguous;
    } else {
      return FieldError(absl::StrCat(field, ".behavior"),
                        absl::StrCat("unknown split behavior '", behavior_name, "'"));
    }
    return add_split(pattern, literal, behavior, BoolField(json, "invert", false),
                     absl::StrCat(field, ".pattern"));
  }
  if (type == "ByteLevel") {
    byte_level_ = true;
    if (BoolField(json, "add_prefix_space", false)) steps_.emplace_back(Step::Kind::kPrefixSpace);
    if (BoolField(json, "use_regex", true)) {
      return add_split(kGpt2Pattern, false, Behavior::kIsolated, false, field);
    }
    return absl::OkStatus();
  }
  if (type == "Digits") {
    const bool individual = BoolField(json, "individual_digits", false);
    return add_split(R"(\p{N})", false, individual ? Behavior::kIsolated : Behavior::kContiguous,
                     false, field);
  }
  if (type == "Metaspace") {
    Step step(Step::Kind::kMetaspace);
    ASSIGN_OR_RETURN(step.replacement, StringField(json, "replacement", field));
    if (step.replacement.empty()) {
      return FieldError(absl::StrCat(field, ".replacement"), "must not be empty");
    }
    step.prepend =
        BoolField(json, "add_prefix_space", true) ? Step::Prepend::kAlways : Step::Prepend::kNever;
    if (const auto it = json.find("prepend_scheme"); it != json.end() && it->is_string()) {
      const std::string scheme = it->get<std::string>();
      if (scheme == "always") {
        step.prepend = Step::Prepend::kAlways;
      } else if (scheme == "first") {
        step.prepend = Step::Prepend::kFirst;
      } else if (scheme == "never") {
        step.prepend = Step::Prepend::kNever;
      } else {
        return FieldError(absl::StrCat(field, ".prepend_scheme"),
                          absl::StrCat("unknown scheme '", scheme, "'"));
      }
    }
    step.split = BoolField(json, "split", true);
    ASSIGN_OR_RETURN(step.regex, Regex::Compile(step.replacement, /*literal=*/true));
    steps_.push_back(std::move(step));
    return absl::OkStatus();
  }
  return FieldError(absl::StrCat(field, ".type"),
                    absl::StrCat("unsupported pre-tokenizer '", type,
                                 "' (supported: Sequence, Split, ByteLevel, Metaspace, Digits)"));
}

void PreTokenizer::Split(std::string_view text, bool at_text_start, Words* words) const {
  words->text.assign(text.data(), text.size());
  words->ranges.assign(1, Range(0, static_cast<uint32_t>(text.size())));
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kSplit:
        ApplySplit(step, words);
        break;
      case Step::Kind::kPrefixSpace:
        ApplyPrefixSpace(words);
        break;
      case Step::Kind::kMetaspace:
        ApplyMetaspace(step, at_text_start, words);
        break;
    }
  }
}

void PreTokenizer::ApplySplit(const Step& step, Words* words) {
  struct Part {
    uint32_t begin;
    uint32_t end;
    bool is_match;
  };
  std::vector<Range> out;
  out.reserve(words->ranges.size() * 2);
  std::vector<Range> matches;
  std::vector<Part> parts;
  const std::string_view text = words->text;
  for (const auto& [rb, re] : words->ranges) {
    matches.clear();
    step.regex->FindAll(text.substr(rb, re - rb), &matches);
    if (matches.empty() && !step.invert) {  // One non-match: kept by every behavior.
      out.emplace_back(rb, re);
      continue;
    }
    parts.clear();
    uint32_t pos = rb;
    for (const auto& [mb, me] : matches) {
      if (rb + mb > pos) parts.push_back({pos, rb + mb, false});
      parts.push_back({rb + mb, rb + me, true});
      pos = rb + me;
    }
    if (pos < re) parts.push_back({pos, re, false});
    if (step.invert) {
      for (Part& p : parts) p.is_match = !p.is_match;
    }
    const size_t first = out.size();
    switch (step.behavior) {
      case Behavior::kRemoved:
        for (const Part& p : parts) {
          if (!p.is_match) out.emplace_back(p.begin, p.end);
        }
        break;
      case Behavior::kIsolated:
        for (const Part& p : parts) out.emplace_back(p.begin, p.end);
        break;
      case Behavior::kMergedWithPrevious: {
        bool previous_match = false;
        for (const Part& p : parts) {
          if (p.is_match && !previous_match && out.size() > first) {
            out.back().second = p.end;
          } else {
            out.emplace_back(p.begin, p.end);
          }
          previous_match = p.is_match;
        }
        break;
      }
      case Behavior::kMergedWithNext: {
        bool previous_match = false;
        std::vector<Range> reversed;
        for (size_t i = parts.size(); i-- > 0;) {
          const Part& p = parts[i];
          if (p.is_match && !previous_match && !reversed.empty()) {
            reversed.back().first = p.begin;
          } else {
            reversed.emplace_back(p.begin, p.end);
          }
          previous_match = p.is_match;
        }
        out.insert(out.end(), reversed.rbegin(), reversed.rend());
        break;
      }
      case Behavior::kContiguous: {
        bool previous_match = false;
        for (const Part& p : parts) {
          if (p.is_match && previous_match && out.size() > first) {
            out.back().second = p.end;
          } else {
            out.emplace_back(p.begin, p.end);
          }
          previous_match = p.is_match;
        }
        break;
      }
    }
  }
  words->ranges = std::move(out);
}

void PreTokenizer::ApplyPrefixSpace(Words* words) {
  Rewrite(words, [](std::string_view word, size_t, std::string* out) {
    if (word.empty() || word[0] != ' ') out->push_back(' ');
    out->append(word);
  });
}

void PreTokenizer::ApplyMetaspace(const Step& step, bool at_text_start, Words* words) {
  Rewrite(words, [&](std::string_view word, size_t index, std::string* out) {
    const size_t start = out->size();
    for (const char c : word) {
      if (c == ' ') {
        out->append(step.replacement);
      } else {
        out->push_back(c);
      }
    }
    const bool starts_with_replacement =
        std::string_view(*out).substr(start).substr(0, step.replacement.size()) == step.replacement;
    const bool prepend = step.prepend == Step::Prepend::kAlways ||
                         (step.prepend == Step::Prepend::kFirst && at_text_start && index == 0);
    if (prepend && !starts_with_replacement) out->insert(start, step.replacement);
  });
  if (!step.split) return;
  std::vector<Range> out;
  std::vector<Range> matches;
  const std::string_view text = words->text;
  for (const auto& [rb, re] : words->ranges) {
    matches.clear();
    step.regex->FindAll(text.substr(rb, re - rb), &matches);
    // MergedWithNext: each replacement starts a word.
    uint32_t begin = rb;
    for (const auto& [mb, me] : matches) {
      if (rb + mb > begin) out.emplace_back(begin, rb + mb);
      begin = rb + mb;
    }
    if (re > begin) out.emplace_back(begin, re);
  }
  words->ranges = std::move(out);
}

}  // namespace tandem
