// Test inputs shared by the tokenizer conformance tests: the llama.cpp
// vocab test vectors and a seeded multilingual corpus.
#ifndef TANDEM_TESTS_UNIT_MODEL_TOKENIZER_CORPUS_H_
#define TANDEM_TESTS_UNIT_MODEL_TOKENIZER_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::testing {

struct VocabTest {
  std::string input;
  std::vector<int32_t> ids;
};

// llama.cpp's test-tokenizer-0 vectors: each input is the text before a
// "__ggml_vocab_test__" line, less the newline that ends it; line i of the
// .out file holds the ids of input i (no BOS). Empty when the files are
// unreadable or disagree on the count.
std::vector<VocabTest> ReadVocabTests(const std::string& inp_path, const std::string& out_path);

// `count` strings from a fixed seed: Latin, Cyrillic, Greek, Arabic, Hebrew,
// Devanagari, Thai, CJK and Hangul text, emoji (ZWJ sequences, flags,
// skin tones), code, digit runs, runs of spaces/tabs/newlines, contractions
// in mixed case and special-token look-alikes ("<|eot_id|>", "<s>").
// Characters on which regex engines disagree (U+0085, U+FEFF, U+017F) are
// left out.
std::vector<std::string> TokenizerCorpus(int count);

// About `min_bytes` of English prose with punctuation, for timing.
std::string EnglishProse(size_t min_bytes);

std::string ReadFileOrEmpty(const std::string& path);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UNIT_MODEL_TOKENIZER_CORPUS_H_
