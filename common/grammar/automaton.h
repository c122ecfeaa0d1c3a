// The pushdown automaton a Grammar runs as, determinised lazily: a state is
// the set of parse stacks the bytes so far leave (positions of the next
// element to match, innermost last), interned once and numbered; the
// transition on a byte is computed the first time it is asked for and then
// read from a table. Grammars of JSON schemas visit few states (a string's
// body is one state whatever its length), so after warm-up a byte costs a
// table lookup.
//
// Bounded: a stack deeper than kMaxStackDepth or a state set beyond
// kMaxStates is not entered (the byte is refused), so a client's grammar
// cannot make a worker hold unbounded memory.
//
// Not thread-safe: CompiledGrammar guards it.
#ifndef TANDEM_COMMON_GRAMMAR_AUTOMATON_H_
#define TANDEM_COMMON_GRAMMAR_AUTOMATON_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/grammar/grammar.h"

namespace tandem::grammar {

inline constexpr int kMaxStackDepth = 128;
inline constexpr int kMaxStates = 16384;
inline constexpr int32_t kDeadState = -1;

class Automaton {
 public:
  // `grammar` must be valid (Grammar::Validate).
  explicit Automaton(std::shared_ptr<const Grammar> grammar);

  // The state before any byte.
  int32_t start() const { return 0; }
  // The state after `byte`, or kDeadState when the grammar refuses it.
  int32_t Step(int32_t state, uint8_t byte);
  // Whether the bytes so far are a whole sentence of the grammar.
  bool accepting(int32_t state) const { return states_[state].accepting; }
  // Whether no byte can follow (the sentence is complete and final).
  bool final(int32_t state) const { return states_[state].stacks.size() == 1 && accepting(state); }
  int state_count() const { return static_cast<int>(states_.size()); }

 private:
  using Stack = std::vector<int32_t>;
  using StackSet = std::vector<Stack>;
  struct State {
    StackSet stacks;  // sorted, unique
    bool accepting = false;
    std::array<int32_t, 256> next;  // kUnknown until computed
  };
  static constexpr int32_t kUnknown = -2;

  // Pushes the stacks `s` stands for once every rule reference on top is
  // expanded into its alternatives (a completed alternative pops).
  void Expand(Stack s, StackSet& out, int depth) const;
  // The id of `set` (sorted, unique), interning it; kDeadState when empty
  // or when kMaxStates are held.
  int32_t Intern(StackSet set);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<State> states_;
  absl::flat_hash_map<std::string, int32_t> index_;
};

}  // namespace tandem::grammar

#endif  // TANDEM_COMMON_GRAMMAR_AUTOMATON_H_
