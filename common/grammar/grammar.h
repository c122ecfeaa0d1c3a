// A context-free grammar over bytes, the form every output constraint
// (JSON Schema, any JSON object) compiles to before it meets a vocabulary.
//
// A grammar is a list of rules; a rule is a list of alternatives; an
// alternative is a sequence of elements, each a set of bytes (one byte of
// the output from the set) or a reference to a rule. Repetition is written
// with right recursion (Star), which the automaton runs without growing its
// stack. Left recursion (a rule that can reach itself before consuming a
// byte) is refused by Validate: the automaton could not expand it.
#ifndef TANDEM_COMMON_GRAMMAR_GRAMMAR_H_
#define TANDEM_COMMON_GRAMMAR_GRAMMAR_H_

#include <array>
#include <bitset>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace tandem::grammar {

using ByteSet = std::bitset<256>;

// A grammar may hold at most this many elements (bytes and references over
// every alternative): what a client's schema can make the workers hold.
inline constexpr int kMaxElements = 1 << 18;

// The bytes lo to hi, both included.
ByteSet ByteRange(int lo, int hi);

// Thread-compatible: built on one thread; a built grammar is only read, and
// its const methods may then run on any number of threads at once.
class Grammar {
 public:
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  struct Element {
    Kind kind = Kind::kEnd;
    int32_t value = 0;  // kBytes: index into byte_sets(); kRule: the rule id
  };
  using Sequence = std::vector<Element>;

  // A new rule without alternatives yet; its id.
  int32_t NewRule();
  // Adds `sequence` (empty = the empty string) as an alternative of `rule`.
  void AddAlternative(int32_t rule, const Sequence& sequence);

  // Elements to build sequences from.
  Element Bytes(const ByteSet& set);
  Element Byte(uint8_t byte);
  static Element Ref(int32_t rule) { return {Kind::kRule, rule}; }
  // The bytes of `text`, appended to `out`.
  void AppendLiteral(std::string_view text, Sequence& out);
  Sequence Literal(std::string_view text);
  // Rules made of other sequences: one of them; `s` or nothing; `s` any
  // number of times (right recursive).
  int32_t Choice(std::initializer_list<Sequence> alternatives);
  int32_t Optional(const Sequence& s);
  int32_t Star(const Sequence& s);

  void set_root(int32_t rule) { root_ = rule; }
  int32_t root() const { return root_; }

  // INVALID_ARGUMENT when a rule has no alternative, a reference names no
  // rule, the grammar is larger than kMaxElements, or a rule is left
  // recursive (the message names the rule's label when set).
  absl::Status Validate() const;
  // A name for the rule in Validate's messages ("$defs/node", ...).
  void set_label(int32_t rule, std::string label);

  // The flat form the automaton walks: every alternative is a run of
  // elements ending with a kEnd element.
  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<int32_t>& alternatives(int32_t rule) const { return rules_[rule]; }
  const ByteSet& byte_set(int32_t index) const { return byte_sets_[index]; }
  int rule_count() const { return static_cast<int>(rules_.size()); }
  size_t element_count() const { return elements_.size(); }

 private:
  std::vector<Element> elements_;
  std::vector<std::vector<int32_t>> rules_;  // alternatives' first elements
  std::vector<std::string> labels_;
  std::vector<ByteSet> byte_sets_;
  absl::flat_hash_map<std::array<uint64_t, 4>, int32_t> byte_set_index_;
  int32_t root_ = -1;
};

}  // namespace tandem::grammar

#endif  // TANDEM_COMMON_GRAMMAR_GRAMMAR_H_
