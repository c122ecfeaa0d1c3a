// The text stages of a Hugging Face tokenizer before its model: the
// normalizer (Prepend, Replace, ...) and the pre-tokenizer that cuts text into
// words (regex Split, ByteLevel, Metaspace, Digits), read from the
// `normalizer` and `pre_tokenizer` objects of tokenizer.json.
#ifndef TANDEM_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem {

// A PCRE2 pattern compiled once (UTF, Unicode properties, JIT when the
// library has it). Safe to use from many threads.
class Regex {
 public:
  // INVALID_ARGUMENT with PCRE2's reason and offset when it does not
  // compile. `literal` matches `pattern` as plain text.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal);
  ~Regex();

  // Appends the non-empty matches in `text` (valid UTF-8), left to right, as
  // byte ranges; the pattern sees only `text` (lookarounds stop at its ends).
  void FindAll(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>* matches) const;

 private:
  explicit Regex(void* code) : code_(code) {}
  void* code_;  // pcre2_code_8*, owned.
};

// Words as byte ranges of one text buffer.
struct Words {
  std::string text;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
};

// Immutable after parsing; safe to use from many threads.
class Normalizer {
 public:
  // `json` is tokenizer.json's `normalizer` (null for none); `field` names it
  // in errors. Supported: Sequence, Prepend, Replace with a String pattern,
  // NFC (taken as the identity: input is expected to be NFC already).
  static absl::StatusOr<Normalizer> Parse(const nlohmann::json& json, const std::string& field);

  bool empty() const { return steps_.empty(); }
  // Normalizes a non-empty `text` in place.
  void Apply(std::string* text) const;

 private:
  struct Step {
    enum class Kind { kPrepend, kReplace } kind;
    std::string from;  // kReplace only.
    std::string to;    // The prepended text for kPrepend.
  };
  absl::Status ParseInto(const nlohmann::json& json, const std::string& field);

  std::vector<Step> steps_;
};

// Immutable after parsing; safe to use from many threads.
class PreTokenizer {
 public:
  // `json` is tokenizer.json's `pre_tokenizer` (null for none: the text is
  // one word); `field` names it in errors. Supported: Sequence, Split
  // (String or Regex pattern, every behavior, invert), ByteLevel
  // (add_prefix_space, use_regex with GPT-2's pattern), Metaspace
  // (replacement, prepend_scheme or add_prefix_space, split), Digits.
  static absl::StatusOr<PreTokenizer> Parse(const nlohmann::json& json, const std::string& field);

  PreTokenizer() = default;
  PreTokenizer(PreTokenizer&&) = default;
  PreTokenizer& operator=(PreTokenizer&&) = default;
  ~PreTokenizer();

  // Whether a ByteLevel step is present (the model then works on bytes).
  bool byte_level() const { return byte_level_; }

  // Cuts `text` into `words` (replacing its contents). `at_text_start` says
  // whether `text` begins the caller's input (Metaspace's "first" scheme).
  void Split(std::string_view text, bool at_text_start, Words* words) const;

 private:
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    enum class Kind { kSplit, kPrefixSpace, kMetaspace };
    explicit Step(Kind k) : kind(k) {}
    Kind kind;
    std::unique_ptr<Regex> regex;  // kSplit.
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    std::string replacement;  // kMetaspace.
    enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
    bool split = true;
  };
  absl::Status ParseInto(const nlohmann::json& json, const std::string& field);
  static void ApplySplit(const Step& step, Words* words);
  static void ApplyPrefixSpace(Words* words);
  static void ApplyMetaspace(const Step& step, bool at_text_start, Words* words);

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_PRE_TOKENIZER_H_
