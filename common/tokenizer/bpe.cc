#include "common/tokenizer/bpe.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level.h"

namespace tandem {
namespace {

using Candidate = BpeModel::Scratch::Candidate;

// The heap's top is the lowest rank, leftmost on ties, as in the tokenizers
// library (ranks are unique per pair, so this fixes the order completely).
bool LaterThan(const Candidate& a, const Candidate& b) {
  return a.rank > b.rank || (a.rank == b.rank && a.pos > b.pos);
}

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

BpeModel::BpeModel(const Options& options, absl::flat_hash_map<std::string, int32_t> vocab)
    : options_(options), vocab_(std::move(vocab)) {
  byte_ids_.fill(-1);
  byte_fallback_ids_.fill(-1);
  if (options_.byte_level) {
    for (int b = 0; b < 256; ++b) byte_ids_[b] = Find(std::string(1, static_cast<char>(b)));
  }
}

int32_t BpeModel::Find(std::string_view token) const {
  const auto it = vocab_.find(AbslView(token));
  return it == vocab_.end() ? -1 : it->second;
}

absl::Status BpeModel::AddMerge(std::string_view left, std::string_view right, int32_t rank) {
  const int32_t l = Find(left);
  const int32_t r = Find(right);
  const std::string merged = absl::StrCat(AbslView(left), AbslView(right));
  const int32_t m = Find(merged);
  for (const auto& [id, text] :
       {std::pair(l, std::string_view(left)), std::pair(r, std::string_view(right)),
        std::pair(m, std::string_view(merged))}) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("token '", absl::CHexEscape(AbslView(text)), "' is not in the vocab"));
    }
  }
  // A repeated pair keeps its first (lowest) rank, as the library does.
  merges_.try_emplace(PairKey(l, r), MergeResult{rank, m});
  return absl::OkStatus();
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<Scratch::Symbol>* symbols) const {
  const auto push = [symbols](int32_t id) {
    const int32_t n = static_cast<int32_t>(symbols->size());
    symbols->push_back({id, n - 1, n + 1});
  };
  if (options_.byte_level) {
    for (const char c : word) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) push(id);
    }
    return;
  }
  bool last_was_unk = false;
  for (size_t i = 0; i < word.size();) {
    int len = Utf8CharLength(word.substr(i));
    if (len == 0) len = 1;  // Callers pass valid UTF-8; keep going regardless.
    const std::string_view ch = word.substr(i, len);
    i += len;
    const int32_t id = Find(ch);
    if (id >= 0) {
      push(id);
      last_was_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      bool all_bytes = true;
      for (const char c : ch)
        all_bytes = all_bytes && byte_fallback_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        for (const char c : ch) push(byte_fallback_ids_[static_cast<uint8_t>(c)]);
        last_was_unk = false;
        continue;
      }
    }
    if (options_.unk_id < 0) continue;
    if (options_.fuse_unk && last_was_unk) continue;
    push(options_.unk_id);
    last_was_unk = true;
  }
}

void BpeModel::EncodeWord(std::string_view word, Scratch* scratch,
                          std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    const int32_t whole = Find(word);
    if (whole >= 0) {
      ids->push_back(whole);
      return;
    }
  }
  std::vector<Scratch::Symbol>& symbols = scratch->symbols;
  symbols.clear();
  InitialSymbols(word, &symbols);
  if (symbols.empty()) return;
  symbols.back().next = -1;
  const int32_t n = static_cast<int32_t>(symbols.size());

  std::vector<Candidate>& heap = scratch->heap;
  heap.clear();
  const auto consider = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    const auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, it->second.merged_id});
    std::push_heap(heap.begin(), heap.end(), LaterThan);
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), LaterThan);
    const Candidate top = heap.back();
    heap.pop_back();
    Scratch::Symbol& left = symbols[top.pos];
    // Stale when either side has changed since the candidate was queued.
    if (left.id < 0 || left.next < 0) continue;
    Scratch::Symbol& right = symbols[left.next];
    const auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.merged_id != top.merged_id) continue;
    left.id = top.merged_id;
    right.id = -1;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace tandem
