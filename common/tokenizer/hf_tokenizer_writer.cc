#include "common/tokenizer/hf_tokenizer_writer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/llama2c_tokenizer.h"
#include "common/tokenizer/sentencepiece_tokenizer.h"
#include "common/tokenizer/symbols.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using OrderedJson = nlohmann::ordered_json;
using Type = SpmVocabulary::Type;

bool IsSpecial(Type type) { return type == Type::kControl || type == Type::kUnknown; }

// Whether SentencePiece's BPE can produce `type` by merging.
bool IsMergeable(Type type) { return type == Type::kNormal || type == Type::kUserDefined; }

// Byte offsets of the character boundaries inside `s` (valid UTF-8).
std::vector<size_t> CharBoundaries(std::string_view s) {
  std::vector<size_t> cuts;
  for (size_t i = 0; i < s.size();) {
    const int len = Utf8CharLength(s.substr(i));
    i += len > 0 ? len : 1;
    if (i < s.size()) cuts.push_back(i);
  }
  return cuts;
}

// SpmConverter's merges: for each piece in id order, its splits into two
// pieces sorted by (left id, right id); then a stable sort by the piece's
// score, highest first.
std::vector<std::pair<std::string, std::string>> DeriveMerges(const SpmVocabulary& vocab) {
  absl::flat_hash_map<std::string, int32_t> ids;
  for (size_t id = 0; id < vocab.pieces.size(); ++id) {
    ids.try_emplace(vocab.pieces[id].text, static_cast<int32_t>(id));
  }
  struct Merge {
    float score;
    int32_t left;
    int32_t right;
  };
  std::vector<Merge> merges;
  for (size_t id = 0; id < vocab.pieces.size(); ++id) {
    const SpmVocabulary::Piece& piece = vocab.pieces[id];
    if (!IsMergeable(piece.type) || ids.at(piece.text) != static_cast<int32_t>(id)) continue;
    const size_t first = merges.size();
    for (const size_t cut : CharBoundaries(piece.text)) {
      const auto l = ids.find(piece.text.substr(0, cut));
      const auto r = ids.find(piece.text.substr(cut));
      if (l == ids.end() || r == ids.end()) continue;
      if (!IsMergeable(vocab.pieces[l->second].type) ||
          !IsMergeable(vocab.pieces[r->second].type)) {
        continue;
      }
      merges.push_back({piece.score, l->second, r->second});
    }
    std::sort(merges.begin() + first, merges.end(), [](const Merge& a, const Merge& b) {
      return std::tie(a.left, a.right) < std::tie(b.left, b.right);
    });
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [](const Merge& a, const Merge& b) { return a.score > b.score; });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const Merge& m : merges)
    out.emplace_back(vocab.pieces[m.left].text, vocab.pieces[m.right].text);
  return out;
}

OrderedJson AddedToken(int32_t id, const std::string& content, bool special) {
  return OrderedJson{{"id", id},          {"content", content}, {"single_word", false},
                     {"lstrip", false},   {"rstrip", false},    {"normalized", false},
                     {"special", special}};
}

OrderedJson StringPattern(std::string_view s) { return OrderedJson{{"String", s}}; }

const std::string* PieceText(const SpmVocabulary& vocab, int32_t id) {
  return id >= 0 && id < static_cast<int32_t>(vocab.pieces.size()) ? &vocab.pieces[id].text
                                                                   : nullptr;
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SpmVocabulary> SpmVocabularyOf(const Tokenizer& tokenizer) {
  if (const auto* sp = dynamic_cast<const SentencePieceTokenizer*>(&tokenizer)) {
    return sp->vocabulary();
  }
  if (const auto* bin = dynamic_cast<const Llama2cTokenizer*>(&tokenizer)) {
    return bin->vocabulary();
  }
  return absl::InvalidArgumentError(
      "only SentencePiece (.model) and llama2.c (tokenizer.bin) tokenizers have a SentencePiece "
      "vocabulary to write");
}

absl::StatusOr<std::string> HfTokenizerJson(const SpmVocabulary& vocab) {
  if (vocab.pieces.empty()) return absl::InvalidArgumentError("the vocabulary has no pieces");
  for (size_t id = 0; id < vocab.pieces.size(); ++id) {
    if (!IsValidUtf8(vocab.pieces[id].text)) {
      return absl::InvalidArgumentError(absl::StrCat("piece ", id, " is not valid UTF-8"));
    }
  }
  bool byte_fallback = false;
  bool spaces_in_pieces = false;
  OrderedJson added = OrderedJson::array();
  OrderedJson model_vocab = OrderedJson::object();
  for (size_t id = 0; id < vocab.pieces.size(); ++id) {
    const SpmVocabulary::Piece& piece = vocab.pieces[id];
    byte_fallback = byte_fallback || piece.type == Type::kByte;
    spaces_in_pieces = spaces_in_pieces || piece.text.find(' ') != std::string::npos;
    if (IsSpecial(piece.type)) added.push_back(AddedToken(id, piece.text, true));
    if (!model_vocab.contains(piece.text)) model_vocab[piece.text] = id;
  }
  OrderedJson merges = OrderedJson::array();
  for (auto& [left, right] : DeriveMerges(vocab)) {
    // The "a b" form older readers expect, unless a piece has a space.
    if (spaces_in_pieces) {
      merges.push_back(OrderedJson::array({std::move(left), std::move(right)}));
    } else {
      merges.push_back(absl::StrCat(left, " ", right));
    }
  }

  OrderedJson post_processor = nullptr;
  if (const std::string* bos = PieceText(vocab, vocab.bos_id)) {
    const OrderedJson bos_item = {{"SpecialToken", {{"id", *bos}, {"type_id", 0}}}};
    post_processor = {
        {"type", "TemplateProcessing"},
        {"single", {bos_item, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {bos_item,
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"SpecialToken", {{"id", *bos}, {"type_id", 1}}}},
          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{*bos, {{"id", *bos}, {"ids", {vocab.bos_id}}, {"tokens", {*bos}}}}}}};
  }
  const std::string* unk = PieceText(vocab, vocab.unk_id);
  OrderedJson root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", std::move(added)},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", kSpaceSymbol}},
          {{"type", "Replace"}, {"pattern", StringPattern(" ")}, {"content", kSpaceSymbol}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", std::move(post_processor)},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", StringPattern(kSpaceSymbol)}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", unk != nullptr ? OrderedJson(*unk) : OrderedJson(nullptr)},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", byte_fallback},
        {"ignore_merges", false},
        {"vocab", std::move(model_vocab)},
        {"merges", std::move(merges)}}}};
  return root.dump(1);
}

std::string HfTokenizerConfigJson(const SpmVocabulary& vocab) {
  const auto token = [&](int32_t id) {
    const std::string* text = PieceText(vocab, id);
    return text != nullptr ? OrderedJson(*text) : OrderedJson(nullptr);
  };
  OrderedJson added_decoder = OrderedJson::object();
  for (size_t id = 0; id < vocab.pieces.size(); ++id) {
    const SpmVocabulary::Piece& piece = vocab.pieces[id];
    if (!IsSpecial(piece.type)) continue;
    OrderedJson entry = AddedToken(static_cast<int32_t>(id), piece.text, true);
    entry.erase("id");
    added_decoder[std::to_string(id)] = std::move(entry);
  }
  const OrderedJson config = {{"add_bos_token", vocab.bos_id >= 0},
                              {"add_eos_token", false},
                              {"added_tokens_decoder", std::move(added_decoder)},
                              {"bos_token", token(vocab.bos_id)},
                              {"clean_up_tokenization_spaces", false},
                              {"eos_token", token(vocab.eos_id)},
                              {"legacy", true},
                              {"pad_token", nullptr},
                              {"padding_side", "right"},
                              {"sp_model_kwargs", OrderedJson::object()},
                              {"tokenizer_class", "LlamaTokenizer"},
                              {"unk_token", token(vocab.unk_id)},
                              {"use_default_system_prompt", false}};
  return config.dump(2) + "\n";
}

absl::Status WriteHfTokenizer(const SpmVocabulary& vocab, const std::string& dir) {
  ASSIGN_OR_RETURN(const std::string json, HfTokenizerJson(vocab));
  const std::filesystem::path folder(dir);
  RETURN_IF_ERROR(WriteText((folder / "tokenizer.json").string(), json));
  return WriteText((folder / "tokenizer_config.json").string(), HfTokenizerConfigJson(vocab));
}

}  // namespace tandem
