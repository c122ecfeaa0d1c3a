// A grammar vocabulary for a synthetic model: ids 0-94 are the printable
// ASCII characters (' ' + id: digits are 16-25), the ids after them have no
// bytes (stop tokens), up to `size`.
#ifndef TANDEM_TESTS_TESTING_PRINTABLE_VOCABULARY_H_
#define TANDEM_TESTS_TESTING_PRINTABLE_VOCABULARY_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/grammar/token_mask.h"

namespace tandem::testing {

inline std::shared_ptr<const grammar::Vocabulary> PrintableVocabulary(int size) {
  std::vector<std::string> bytes;
  for (int id = 0; id < size; ++id) {
    bytes.push_back(id < 95 ? std::string(1, static_cast<char>(' ' + id)) : "");
  }
  return std::make_shared<const grammar::Vocabulary>(std::move(bytes));
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TESTING_PRINTABLE_VOCABULARY_H_
