#include "common/tokenizer/llama2c_tokenizer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/symbols.h"

namespace tandem {
namespace {

constexpr int32_t kNumSpecial = 3;
constexpr int32_t kFirstNormalId = kNumSpecial + 256;
constexpr size_t kRecordHeaderBytes = sizeof(float) + sizeof(int32_t);
constexpr size_t kNone = std::numeric_limits<size_t>::max();

// A run of the normalized text that is currently one token candidate; the
// symbols form a doubly linked list in text order.
struct Symbol {
  size_t begin;
  size_t size;  // 0 once merged into the symbol on its left.
  size_t prev;
  size_t next;
};

// A possible merge of symbol `left` with its right neighbour into a piece of
// `size` bytes. Queued lazily: it is stale once either side has changed,
// which shows as a different combined size.
struct Merge {
  float score;
  size_t left;
  size_t size;
};

// Highest score first; on ties the leftmost pair, as in SentencePiece.
struct MergeOrder {
  bool operator()(const Merge& a, const Merge& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> Llama2cTokenizer::FromBytes(
    std::span<const uint8_t> bytes, const std::string& path) {
  const auto error = [&path](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer file '", path, "' is not a valid llama2.c tokenizer.bin: ", parts...));
  };
  const size_t size = bytes.size();
  if (size < sizeof(int32_t)) {
    return error("it is ", size, " bytes, shorter than the 4-byte max_token_length header");
  }
  int32_t max_token_length;
  std::memcpy(&max_token_length, bytes.data(), sizeof(int32_t));
  if (max_token_length <= 0) {
    return error("max_token_length is ", max_token_length, "; it must be positive");
  }

  auto tok = std::unique_ptr<Llama2cTokenizer>(new Llama2cTokenizer());
  size_t offset = sizeof(int32_t);
  while (offset < size) {
    const size_t index = tok->pieces_.size();
    const size_t left = size - offset;
    if (left < kRecordHeaderBytes) {
      return error("the file is truncated: token ", index, " at byte ", offset,
                   " needs 8 bytes for its score and length but only ", left, " remain");
    }
    float score;
    int32_t length;
    std::memcpy(&score, bytes.data() + offset, sizeof(float));
    std::memcpy(&length, bytes.data() + offset + sizeof(float), sizeof(int32_t));
    if (std::isnan(score)) return error("token ", index, " at byte ", offset, " has a NaN score");
    if (length < 0) {
      return error("token ", index, " at byte ", offset, " has negative length ", length);
    }
    if (length > max_token_length) {
      return error("token ", index, " at byte ", offset, " has length ", length,
                   ", above the header's max_token_length ", max_token_length);
    }
    if (static_cast<size_t>(length) > left - kRecordHeaderBytes) {
      return error("the file is truncated: token ", index, " at byte ", offset, " has length ",
                   length, " but only ", left - kRecordHeaderBytes, " bytes remain");
    }
    offset += kRecordHeaderBytes;
    tok->pieces_.emplace_back(reinterpret_cast<const char*>(bytes.data() + offset), length);
    tok->scores_.push_back(score);
    offset += length;
  }

  const size_t n = tok->pieces_.size();
  if (n == 0) return error("it holds no tokens");
  if (n < kFirstNormalId) {
    return error("it holds ", n, " tokens; a Llama vocabulary starts with ", kFirstNormalId,
                 " (<unk>, <s>, </s> and the byte tokens <0x00>..<0xFF>)");
  }
  // Byte fallback relies on id = byte + 3, so check it rather than emit
  // wrong ids for an unusual vocabulary.
  for (int b = 0; b < 256; ++b) {
    std::string& piece = tok->pieces_[kFirstByteId + b];
    const std::string expected = absl::StrFormat("<0x%02X>", b);
    if (piece != expected) {
      return error("token ", kFirstByteId + b, " is '", absl::CHexEscape(piece),
                   "' where the byte token ", expected, " belongs");
    }
    piece = std::string(1, static_cast<char>(b));
  }
  tok->pieces_[kUnkId] = std::string(kUnknownSurface);
  tok->control_tokens_ = SpecialTokenMatcher({{"<s>", kBosId}, {"</s>", kEosId}});
  tok->pieces_[kBosId].clear();
  tok->pieces_[kEosId].clear();

  tok->piece_ids_.reserve(n - kFirstNormalId);
  tok->split_at_word_starts_ = true;
  for (size_t id = kFirstNormalId; id < n; ++id) {
    const std::string& piece = tok->pieces_[id];
    for (size_t i = 1; i < piece.size(); ++i) {
      if (piece[i] == ' ' && piece[i - 1] != ' ') tok->split_at_word_starts_ = false;
    }
    // A duplicate keeps its first id, the one SentencePiece would have kept.
    tok->piece_ids_.try_emplace(tok->pieces_[id], static_cast<int32_t>(id));
  }
  return tok;
}

int32_t Llama2cTokenizer::FindPiece(std::string_view text) const {
  // Debian's absl::string_view is not std::string_view.
  const auto it = piece_ids_.find(absl::string_view(text.data(), text.size()));
  return it == piece_ids_.end() ? -1 : it->second;
}

absl::StatusOr<std::vector<int32_t>> Llama2cTokenizer::Encode(std::string_view text,
                                                              const EncodeOptions& options) const {
  std::vector<int32_t> ids;
  if (options.add_bos) ids.push_back(kBosId);
  if (!options.parse_special) {
    EncodePlain(text, &ids);
    return ids;
  }
  for (size_t pos = 0;;) {
    const std::optional<SpecialTokenMatcher::Match> m = control_tokens_.Find(text, pos);
    EncodePlain(text.substr(pos, (m.has_value() ? m->begin : text.size()) - pos), &ids);
    if (!m.has_value()) return ids;
    ids.push_back(m->id);
    pos = m->end;
  }
}

SpmVocabulary Llama2cTokenizer::vocabulary() const {
  SpmVocabulary vocab;
  vocab.unk_id = kUnkId;
  vocab.bos_id = kBosId;
  vocab.eos_id = kEosId;
  vocab.pieces.resize(pieces_.size());
  for (size_t id = 0; id < pieces_.size(); ++id) {
    SpmVocabulary::Piece& piece = vocab.pieces[id];
    piece.score = scores_[id];
    if (id < kNumSpecial) {
      piece.text = id == kUnkId ? "<unk>" : id == kBosId ? "<s>" : "</s>";
      piece.type = id == kUnkId ? SpmVocabulary::Type::kUnknown : SpmVocabulary::Type::kControl;
    } else if (id < kFirstNormalId) {
      piece.text = absl::StrFormat("<0x%02X>", id - kFirstByteId);
      piece.type = SpmVocabulary::Type::kByte;
    } else {
      for (const char c : pieces_[id]) {
        if (c == ' ') {
          piece.text.append(kSpaceSymbol);
        } else {
          piece.text.push_back(c);
        }
      }
    }
  }
  return vocab;
}

void Llama2cTokenizer::EncodePlain(std::string_view text, std::vector<int32_t>* out) const {
  std::vector<int32_t>& ids = *out;
  if (text.empty()) return;

  // The dummy prefix, then the text with malformed bytes replaced and U+2581
  // turned into the ' ' it stands for in the pieces: SentencePiece writes
  // spaces as U+2581, so it cannot tell a typed U+2581 from a space either.
  std::string normalized = " ";
  normalized.reserve(text.size() + 1);
  std::vector<Symbol> symbols;
  symbols.reserve(text.size() + 1);
  symbols.push_back({0, 1, kNone, kNone});
  for (size_t i = 0; i < text.size();) {
    const int len = Utf8CharLength(text.substr(i));
    const size_t begin = normalized.size();
    if (len == 0) {
      normalized.append(kReplacementChar);
      ++i;
    } else if (text.substr(i, len) == kSpaceSymbol) {
      normalized.push_back(' ');
      i += len;
    } else {
      normalized.append(text.substr(i, len));
      i += len;
    }
    symbols.back().next = symbols.size();
    symbols.push_back({begin, normalized.size() - begin, symbols.size() - 1, kNone});
  }

  std::priority_queue<Merge, std::vector<Merge>, MergeOrder> queue;
  const auto consider = [&](size_t left) {
    if (left == kNone || symbols[left].next == kNone) return;
    const Symbol& l = symbols[left];
    const size_t merged_size = l.size + symbols[l.next].size;
    const int32_t id = FindPiece(std::string_view(normalized).substr(l.begin, merged_size));
    if (id >= 0) queue.push({scores_[id], left, merged_size});
  };
  // When no piece spans a word start, the words are merged one at a time:
  // the result is the same (merges across the boundary never match and the
  // order within a word is kept), but the queue stays small.
  const auto starts_word = [&](size_t i) {
    const size_t b = symbols[i].begin;
    return split_at_word_starts_ && normalized[b] == ' ' && normalized[b - 1] != ' ';
  };
  size_t segment_begin = 0;
  for (size_t end = 1; end <= symbols.size(); ++end) {
    if (end < symbols.size() && !starts_word(end)) continue;
    for (size_t i = segment_begin; i + 1 < end; ++i) consider(i);
    segment_begin = end;
    while (!queue.empty()) {
      const Merge top = queue.top();
      queue.pop();
      Symbol& l = symbols[top.left];
      if (l.size == 0 || l.next == kNone || l.size + symbols[l.next].size != top.size) continue;
      Symbol& r = symbols[l.next];
      l.size = top.size;
      l.next = r.next;
      if (r.next != kNone) symbols[r.next].prev = top.left;
      r.size = 0;
      consider(l.prev);
      consider(top.left);
    }
  }

  for (size_t i = 0; i != kNone; i = symbols[i].next) {
    const std::string_view piece =
        std::string_view(normalized).substr(symbols[i].begin, symbols[i].size);
    const int32_t id = FindPiece(piece);
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    for (const char c : piece) ids.push_back(kFirstByteId + static_cast<uint8_t>(c));
  }
}

absl::StatusOr<std::string> Llama2cTokenizer::Decode(int32_t prev, int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " is out of range [0, ", vocab_size(), ")"));
  }
  const std::string& piece = pieces_[id];
  if (prev == kBosId && id >= kFirstNormalId && !piece.empty() && piece[0] == ' ') {
    return piece.substr(1);
  }
  return piece;
}

}  // namespace tandem
