#include "common/tokenizer/incremental_detokenizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::IsOkAndHolds;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kReplacement[] = "\xEF\xBF\xBD";

// Whether `s` is whole UTF-8 characters: no stray or missing bytes.
bool IsWholeUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

int32_t ByteToken(uint8_t b) { return 3 + b; }

// The Llama layout without a file: <unk>, <s>, </s>, the 256 byte tokens,
// then the single piece " Once".
class FakeTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kOnce = 259;

  int vocab_size() const override { return 260; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view,
                                              const EncodeOptions&) const override {
    return absl::UnimplementedError("not needed");
  }
  absl::StatusOr<std::string> Decode(int32_t prev, int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return absl::InvalidArgumentError("id out of range");
    if (id == kOnce) return prev == bos_id() ? "Once" : " Once";
    if (id >= 3) return std::string(1, static_cast<char>(id - 3));
    return "";
  }
};

// Streams `ids` (which follow BOS) through `tok`, checking that every chunk
// is whole characters; returns all chunks and the flushed rest.
std::string Stream(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  IncrementalDetokenizer detok(tok);
  std::string text;
  for (int32_t id : ids) {
    auto chunk = detok.Push(id);
    EXPECT_TRUE(chunk.ok()) << chunk.status();
    if (!chunk.ok()) continue;
    EXPECT_TRUE(IsWholeUtf8(*chunk))
        << "token " << id << " gave \"" << absl::CHexEscape(*chunk) << "\"";
    text += *chunk;
  }
  return text + detok.Flush();
}

TEST(IncrementalDetokenizer, HoldsBytesUntilTheCharacterIsComplete) {
  FakeTokenizer tok;
  IncrementalDetokenizer detok(tok);
  EXPECT_THAT(detok.Push(ByteToken(0xE2)), IsOkAndHolds(""));
  EXPECT_THAT(detok.Push(ByteToken(0x82)), IsOkAndHolds(""));
  EXPECT_THAT(detok.Push(ByteToken(0xAC)), IsOkAndHolds("\xE2\x82\xAC"));  // €
  EXPECT_EQ(detok.Flush(), "");
}

TEST(IncrementalDetokenizer, FlushReplacesACutOffCharacter) {
  FakeTokenizer tok;
  IncrementalDetokenizer detok(tok);
  EXPECT_THAT(detok.Push(ByteToken(0xE4)), IsOkAndHolds(""));
  EXPECT_THAT(detok.Push(ByteToken(0xB8)), IsOkAndHolds(""));
  EXPECT_EQ(detok.Flush(), kReplacement);
  EXPECT_EQ(detok.Flush(), "");
  EXPECT_THAT(detok.Push(ByteToken('a')), IsOkAndHolds("a"));
}

TEST(IncrementalDetokenizer, ReplacesEachIllFormedSubpart) {
  FakeTokenizer tok;
  IncrementalDetokenizer detok(tok);
  EXPECT_THAT(detok.Push(ByteToken(0xFF)), IsOkAndHolds(kReplacement));
  EXPECT_THAT(detok.Push(ByteToken(0xE4)), IsOkAndHolds(""));
  EXPECT_THAT(detok.Push(ByteToken(0xB8)), IsOkAndHolds(""));
  // 'A' cannot continue E4 B8: both bytes become one U+FFFD.
  EXPECT_THAT(detok.Push(ByteToken('A')), IsOkAndHolds(std::string(kReplacement) + "A"));
  // An overlong form and a surrogate: every byte is its own subpart.
  EXPECT_THAT(detok.Push(ByteToken(0xC0)), IsOkAndHolds(kReplacement));
  EXPECT_THAT(detok.Push(ByteToken(0xAF)), IsOkAndHolds(kReplacement));
  EXPECT_THAT(detok.Push(ByteToken(0xED)), IsOkAndHolds(""));
  EXPECT_THAT(detok.Push(ByteToken(0xA0)), IsOkAndHolds(std::string(kReplacement) + kReplacement));
  EXPECT_THAT(detok.Push(ByteToken(0x80)), IsOkAndHolds(kReplacement));
  // Past U+10FFFF.
  EXPECT_THAT(detok.Push(ByteToken(0xF4)), IsOkAndHolds(""));
  EXPECT_THAT(detok.Push(ByteToken(0x90)), IsOkAndHolds(std::string(kReplacement) + kReplacement));
  EXPECT_EQ(detok.Flush(), "");
}

TEST(IncrementalDetokenizer, LeadingSpaceDependsOnPrev) {
  FakeTokenizer tok;
  IncrementalDetokenizer after_bos(tok);
  EXPECT_THAT(after_bos.Push(FakeTokenizer::kOnce), IsOkAndHolds("Once"));
  EXPECT_THAT(after_bos.Push(FakeTokenizer::kOnce), IsOkAndHolds(" Once"));
  IncrementalDetokenizer mid_sequence(tok, /*prev=*/-1);
  EXPECT_THAT(mid_sequence.Push(FakeTokenizer::kOnce), IsOkAndHolds(" Once"));
}

TEST(IncrementalDetokenizer, BadIdChangesNothing) {
  FakeTokenizer tok;
  IncrementalDetokenizer detok(tok);
  EXPECT_THAT(detok.Push(ByteToken(0xE4)), IsOkAndHolds(""));
  EXPECT_THAT(detok.Push(260), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("range")));
  EXPECT_THAT(detok.Push(ByteToken(0xB8)), IsOkAndHolds(""));
  EXPECT_THAT(detok.Push(ByteToken(0xAD)), IsOkAndHolds("\xE4\xB8\xAD"));  // 中
}

TEST(IncrementalDetokenizer, ConcatenationIsTheWholeDecode) {
  FakeTokenizer tok;
  const std::string text =
      "a\xF0\x9F\x90\x89"
      "b\xE4\xB8\xAD\xC3\xA9";  // a🐉b中é
  std::vector<int32_t> ids = {FakeTokenizer::kOnce};
  for (char c : text) ids.push_back(ByteToken(static_cast<uint8_t>(c)));
  EXPECT_EQ(Stream(tok, ids), "Once" + text);
}

// tok512 has no CJK or emoji pieces, so those characters come as bytes.
TEST(IncrementalDetokenizerTok512, NeverEmitsHalfACharacter) {
  TANDEM_MODEL_FILE_OR_SKIP(path, "tok512.bin");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(path));
  const std::string text = "Lily said 你好，世界! She saw a 🐉 and 😀😀. Ünïcödé.";
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, tok->Encode(text, /*add_bos=*/true));
  int byte_tokens = 0;
  for (int32_t id : ids) byte_tokens += (id >= 3 && id < 259);
  ASSERT_GE(byte_tokens, 20) << "tok512 should spell the CJK and emoji out in bytes";

  std::string full;
  for (size_t i = 1; i < ids.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(std::string piece, tok->Decode(ids[i - 1], ids[i]));
    full += piece;
  }
  EXPECT_EQ(full, text);
  EXPECT_EQ(Stream(*tok, std::vector<int32_t>(ids.begin() + 1, ids.end())), full);
}

// The 32k vocabularies round-trip text through Encode and streaming decode.
TEST(IncrementalDetokenizerLlama, RoundTripsTextThroughBothFormats) {
  for (const char* name : {"tokenizer.model", "tokenizer.bin"}) {
    TANDEM_MODEL_FILE_OR_SKIP(path, name);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(path));
    for (const std::string text :
         {"Hello world", " Hello World!", "   Hello\n    Hello", "\t\n",
          "🚀 (normal) 😶‍🌫️", "Việt 3...3 ------======= нещо на Български",
          "I've been 'told he's there"}) {
      ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, tok->Encode(text, /*add_bos=*/true));
      EXPECT_EQ(Stream(*tok, std::vector<int32_t>(ids.begin() + 1, ids.end())), text) << name;
    }
  }
}

}  // namespace
}  // namespace tandem
