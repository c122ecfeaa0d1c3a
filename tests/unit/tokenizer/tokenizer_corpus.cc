#include "tests/unit/tokenizer/tokenizer_corpus.h"

#include <fstream>
#include <random>
#include <sstream>
#include <string_view>

#include "common/tokenizer/byte_level.h"

namespace tandem::testing {
namespace {

std::vector<std::string> SplitOn(const std::string& s, char separator) {
  std::vector<std::string> parts;
  size_t pos = 0;
  for (size_t next; (next = s.find(separator, pos)) != std::string::npos; pos = next + 1) {
    parts.push_back(s.substr(pos, next - pos));
  }
  parts.push_back(s.substr(pos));
  return parts;
}

// Fragments by kind; every kind is drawn equally often.
const std::vector<std::vector<std::string>>& Fragments() {
  static const auto* const fragments = new std::vector<std::vector<std::string>>{
      {"Hello", "world", "The quick brown fox", "jumps over the lazy dog", "naïve", "café",
       "Straße", "ÉCOLE", "Ærøskøbing", "façade", "résumé", "HTTP", "JSON", "tokenizer",
       "camelCase", "snake_case", "ALLCAPS", "e-mail", "U.S.A."},
      {"Привет", "мир", "Съешь же ещё этих мягких французских булок", "Ёлка", "ПРОГРАММА"},
      {"Καλημέρα", "κόσμε", "ΑΒΓΔ", "φιλοσοφία"},
      {"مرحبا بالعالم", "السلام عليكم", "كتاب"},
      {"שלום עולם", "עברית"},
      {"नमस्ते दुनिया", "हिन्दी", "संस्कृतम्"},
      {"สวัสดีชาวโลก", "ภาษาไทย"},
      {"你好，世界", "日本語のテキスト", "漢字", "東京タワー", "中文分词测试"},
      {"안녕하세요 세계", "한국어", "대한민국"},
      {"😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸", "🇯🇵🇫🇷", "❤️",
       "🤖", "🧑🏾‍💻", "✨🎉"},
      {"int main() { return 0; }", "def f(x):\n    return x**2", "for (i = 0; i < n; ++i) {",
       "<div class=\"a\">", "SELECT * FROM t WHERE id=42;", "x+=1", "#include <stdio.h>",
       "fn main() -> Result<(), Box<dyn Error>> {", "console.log(`${a}`);", "a && b || !c",
       "    if x:\n\tpass", "https://example.com/a?b=c&d=e#f"},
      {"1234567890", "3.14159", "2024-06-11", "1,000,000", "0x7FFF", "٣٤٥", "१२३", "42",
       "9999999999999", "12:30"},
      {"\t", "\n", "\n\n", "   ", " \t \n", "\r\n", "\u3000", "\t\t", "\n \n", "        ",
       " \n\n\n"},
      {"'s", "'S", "'ll", "'LL",   "'Ll",   "'re",  "'RE", "'VE", "'ve",     "'d",
       "'D", "'M", "'t",  "don't", "WE'LL", "it'S", "'",   "I'm", "they'Re", "''"},
      {"<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>user<|end_header_id|>", "<s>", "</s>",
       "<|reserved_special_token_5|>", "<|im_end|>", "<|eot_id", "<unk>", "[INST]"},
      {"!!!", "...", "?!", "—", "«»", "“quoted”", "$%^&*", "@user", "#hashtag", "(paren)", "…",
       "::", "->", "§1"},
  };
  return *fragments;
}

// Code point ranges of long-assigned letters for random words.
struct Block {
  uint32_t first;
  uint32_t last;
};
constexpr Block kBlocks[] = {{0x41, 0x5A},   {0x61, 0x7A},     {0xC0, 0xFF},     {0x410, 0x44F},
                             {0x3B1, 0x3C9}, {0x5D0, 0x5EA},   {0x627, 0x64A},   {0x915, 0x939},
                             {0xE01, 0xE2E}, {0x4E00, 0x9FA5}, {0xAC00, 0xD7A3}, {0x3041, 0x3096}};
constexpr const char* kSeparators[] = {"",   " ",    " ",       " ",    "  ",     "\n",  "\t", ", ",
                                       ". ", " \n ", "   \n\n", "\r\n", "\n\n\n", " - ", ": "};

}  // namespace

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<VocabTest> ReadVocabTests(const std::string& inp_path, const std::string& out_path) {
  const std::string inp = ReadFileOrEmpty(inp_path);
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<VocabTest> tests;
  for (size_t pos = 0, next; (next = inp.find(separator, pos)) != std::string::npos;
       pos = next + separator.size()) {
    tests.push_back({inp.substr(pos, next - pos), {}});
  }
  std::vector<std::string> lines = SplitOn(ReadFileOrEmpty(out_path), '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.size() != tests.size()) return {};
  for (size_t i = 0; i < tests.size(); ++i) {
    for (const std::string& id : SplitOn(lines[i], ' ')) {
      if (!id.empty()) tests[i].ids.push_back(std::stoi(id));
    }
  }
  return tests;
}

std::vector<std::string> TokenizerCorpus(int count) {
  std::mt19937 rng(20240917);
  const auto& kinds = Fragments();
  std::vector<std::string> corpus;
  corpus.reserve(count);
  for (int i = 0; i < count; ++i) {
    std::string text;
    const int parts = 1 + static_cast<int>(rng() % 6);
    for (int p = 0; p < parts; ++p) {
      if (rng() % 5 == 0) {
        // A random word from one block.
        const Block& block = kBlocks[rng() % std::size(kBlocks)];
        const int len = 1 + static_cast<int>(rng() % 8);
        for (int c = 0; c < len; ++c)
          AppendUtf8(block.first + rng() % (block.last - block.first + 1), &text);
      } else {
        const std::vector<std::string>& kind = kinds[rng() % kinds.size()];
        text += kind[rng() % kind.size()];
      }
      text += kSeparators[rng() % std::size(kSeparators)];
    }
    corpus.push_back(std::move(text));
  }
  return corpus;
}

std::string EnglishProse(size_t min_bytes) {
  const std::vector<std::string> words = SplitOn(
      "the a little girl named Lily went to park and saw big red ball She was very happy played "
      "with her friend Tom under tree sky blue don't it's they'll we've 1984 3.14 42 e-mail "
      "U.S.A. tokenizer performance request router latency throughput isn't (quietly) \"yes\" "
      "HTTP JSON naïve café über résumé",
      ' ');
  static const char* const kProseSeparators[] = {" ",  " ",  " ",  " ",    ", ",  ". ", "! ",
                                                 "? ", "; ", "\n", "\n\n", " - ", ": "};
  std::mt19937 rng(7);
  std::string text;
  while (text.size() < min_bytes) {
    text += words[rng() % words.size()];
    text += kProseSeparators[rng() % std::size(kProseSeparators)];
  }
  return text;
}

}  // namespace tandem::testing
