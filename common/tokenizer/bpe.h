// Byte-pair encoding of one pre-tokenized word by merge rank, as the
// tokenizers library's BPE model does it.
#ifndef TANDEM_COMMON_TOKENIZER_BPE_H_
#define TANDEM_COMMON_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace tandem {

// Immutable once built (after the last AddMerge); then safe to use from many
// threads, each with its own Scratch. Building is single-threaded. It owns
// its vocabulary and merge table; callers own the ids and scratch they
// pass. Only AddMerge fails; EncodeWord cannot: a character missing from
// the vocabulary becomes unk_id, its <0xXX> byte tokens, or nothing, as
// Options say.
class BpeModel {
 public:
  struct Options {
    // Words are raw bytes and vocabulary keys the bytes their byte-level
    // characters stand for; each byte starts as its own symbol. Otherwise
    // each UTF-8 character starts as a symbol.
    bool byte_level = false;
    // A character missing from the vocabulary becomes its <0xXX> tokens.
    bool byte_fallback = false;
    // A word that is itself a token is taken whole (Llama 3).
    bool ignore_merges = false;
    // Consecutive unknown characters give one unk.
    bool fuse_unk = false;
    int32_t unk_id = -1;  // -1: unknown characters are dropped.
  };

  // Reusable buffers for EncodeWord.
  struct Scratch {
    struct Symbol {
      int32_t id;  // -1 once merged into the symbol on its left.
      int32_t prev;
      int32_t next;
    };
    struct Candidate {
      int32_t rank;
      int32_t pos;
      int32_t merged_id;
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // `vocab` maps each BPE token (raw bytes under byte_level) to its id.
  BpeModel(const Options& options, absl::flat_hash_map<std::string, int32_t> vocab);

  // Adds the merge of rank `rank` (lower merges first). INVALID_ARGUMENT,
  // naming the token, when a side or the merged token is not in the vocab.
  absl::Status AddMerge(std::string_view left, std::string_view right, int32_t rank);

  // Sets the byte tokens <0xXX> used by byte fallback.
  void SetByteFallbackId(uint8_t byte, int32_t id) { byte_fallback_ids_[byte] = id; }

  // Id of `token`, or -1.
  int32_t Find(std::string_view token) const;

  // Appends the ids of `word` to `ids`.
  void EncodeWord(std::string_view word, Scratch* scratch, std::vector<int32_t>* ids) const;

  const Options& options() const { return options_; }

 private:
  struct MergeResult {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }

  // Appends the initial symbols of `word` (before any merge).
  void InitialSymbols(std::string_view word, std::vector<Scratch::Symbol>* symbols) const;

  // Constant after construction (and the merges).
  Options options_;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, MergeResult> merges_;
  std::array<int32_t, 256> byte_ids_;           // Byte-level: the token of each byte, or -1.
  std::array<int32_t, 256> byte_fallback_ids_;  // <0xXX>, or -1.
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_BPE_H_
