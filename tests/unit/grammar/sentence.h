// Test helper: whether a text is a whole sentence of a grammar, by running
// a fresh automaton over its bytes.
#ifndef TANDEM_TESTS_UNIT_GRAMMAR_SENTENCE_H_
#define TANDEM_TESTS_UNIT_GRAMMAR_SENTENCE_H_

#include <memory>
#include <string_view>

#include "common/grammar/automaton.h"
#include "common/grammar/grammar.h"

namespace tandem::grammar {

inline bool IsSentence(const Grammar& g, std::string_view text) {
  Automaton a(std::make_shared<const Grammar>(g));
  int32_t state = a.start();
  for (const char c : text) {
    state = a.Step(state, static_cast<uint8_t>(c));
    if (state == kDeadState) return false;
  }
  return a.accepting(state);
}

}  // namespace tandem::grammar

#endif  // TANDEM_TESTS_UNIT_GRAMMAR_SENTENCE_H_
