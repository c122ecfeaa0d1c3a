#include "router/routing_policy.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace tandem::router {

namespace {

// Snapshot fields come from worker stats and from sums of the router's own
// reservations: each fits in 32 bits, their sums and differences may not.
int64_t FreeBlocks(const WorkerSnapshot& w) {
  return int64_t{w.kv_blocks_free} - w.reserved_blocks;
}

int64_t DecodeLoad(const WorkerSnapshot& w) {
  return std::max(int64_t{w.running} + w.waiting, int64_t{w.inflight});
}

int64_t PrefillQueue(const WorkerSnapshot& w) { return int64_t{w.waiting} + w.inflight; }

// The tokens of a prompt plus its completion, saturated at INT32_MAX (more
// KV blocks than any worker has).
int SequenceTokens(int prompt_len, int max_tokens) {
  return static_cast<int>(
      std::min<int64_t>(int64_t{prompt_len} + max_tokens, std::numeric_limits<int32_t>::max()));
}

// Smaller is better. Workers with room: least load, then most free blocks;
// workers without: most free blocks (the likeliest to admit), then load.
std::tuple<bool, int64_t, int64_t, std::string_view> DecodeKey(const WorkerSnapshot& w, bool fits) {
  if (fits) return {false, DecodeLoad(w), -FreeBlocks(w), w.address};
  return {true, -FreeBlocks(w), DecodeLoad(w), w.address};
}

int CachedTokens(const PrefixAffinity& a, const std::string& address, int prompt_len) {
  auto it = a.cached_tokens.find(address);
  if (it == a.cached_tokens.end()) return 0;
  return std::clamp(it->second, 0, std::max(prompt_len, 0));
}

int64_t IndexedBlocks(const PrefixAffinity& a, const std::string& address) {
  auto it = a.indexed_blocks.find(address);
  return it == a.indexed_blocks.end() ? 0 : it->second;
}

// Estimated cost in tokens: those the worker must compute (or receive) plus
// the tokens-equivalent of the requests ahead of this one.
int64_t PrefixCost(int prompt_len, int cached, int64_t load, int load_tokens) {
  return int64_t{prompt_len} - cached + int64_t{std::max(load_tokens, 0)} * load;
}

std::string CostText(int prompt_len, int cached, int64_t load, int load_tokens) {
  return absl::StrCat(cached, " of ", prompt_len,
                      " prompt tokens cached per the prefix index, cost ",
                      PrefixCost(prompt_len, cached, load, load_tokens), " = ", prompt_len - cached,
                      " uncached + ", load, " x ", load_tokens);
}

}  // namespace

std::optional<Pick> PickPrefillWorkerByPrefix(const std::vector<WorkerSnapshot>& prefill,
                                              int prompt_len, const PrefixAffinity& affinity,
                                              const absl::flat_hash_set<std::string>& exclude) {
  using Key = std::tuple<int64_t, int64_t, int32_t, int64_t, std::string_view>;
  const WorkerSnapshot* best = nullptr;
  Key best_key;
  int candidates = 0;
  for (const WorkerSnapshot& w : prefill) {
    if (!w.routable() || exclude.contains(w.address)) continue;
    ++candidates;
    const Key key{PrefixCost(prompt_len, CachedTokens(affinity, w.address, prompt_len),
                             PrefillQueue(w), affinity.load_tokens),
                  PrefillQueue(w), w.running, IndexedBlocks(affinity, w.address), w.address};
    if (best == nullptr || key < best_key) {
      best = &w;
      best_key = key;
    }
  }
  if (best == nullptr) return std::nullopt;
  return Pick{
      best->address,
      absl::StrCat("prefill ", best->address, ": ",
                   CostText(prompt_len, CachedTokens(affinity, best->address, prompt_len),
                            PrefillQueue(*best), affinity.load_tokens),
                   " (queue), best of ", candidates, exclude.empty() ? "" : " not yet tried")};
}

std::optional<Pick> PickDecodeWorkerByPrefix(const std::vector<WorkerSnapshot>& decode,
                                             int prompt_len, int max_tokens,
                                             const PrefixAffinity& affinity,
                                             const absl::flat_hash_set<std::string>& exclude) {
  // Workers with room: least cost, load, most free blocks; without: most
  // free blocks, then load (as PickDecodeWorker).
  using Key = std::tuple<bool, int64_t, int64_t, int64_t, int64_t, std::string_view>;
  const int tokens = SequenceTokens(prompt_len, max_tokens);
  auto key_of = [&](const WorkerSnapshot& w, bool fits) -> Key {
    if (!fits) return {true, -FreeBlocks(w), DecodeLoad(w), 0, 0, w.address};
    return {false,
            PrefixCost(prompt_len, CachedTokens(affinity, w.address, prompt_len), DecodeLoad(w),
                       affinity.load_tokens),
            DecodeLoad(w),
            -FreeBlocks(w),
            IndexedBlocks(affinity, w.address),
            w.address};
  };
  const WorkerSnapshot* best = nullptr;
  bool best_fits = false;
  Key best_key;
  int routable = 0;
  for (const WorkerSnapshot& w : decode) {
    if (!w.routable() || exclude.contains(w.address)) continue;
    ++routable;
    const bool fits = FreeBlocks(w) >= BlocksFor(tokens, w.block_size);
    const Key key = key_of(w, fits);
    if (best == nullptr || key < best_key) {
      best = &w;
      best_fits = fits;
      best_key = key;
    }
  }
  if (best == nullptr) return std::nullopt;
  const int needed = static_cast<int>(BlocksFor(tokens, best->block_size));
  return Pick{
      best->address,
      absl::StrCat("decode ", best->address, ": ",
                   CostText(prompt_len, CachedTokens(affinity, best->address, prompt_len),
                            DecodeLoad(*best), affinity.load_tokens),
                   " (load); ", FreeBlocks(*best), " free KV blocks (", needed, " wanted",
                   best_fits ? "" : ", no worker has room", "), best of ", routable, " routable")};
}

std::optional<Pick> PickDecodeWorker(const std::vector<WorkerSnapshot>& decode, int prompt_len,
                                     int max_tokens,
                                     const absl::flat_hash_set<std::string>& exclude) {
  const WorkerSnapshot* best = nullptr;
  bool best_fits = false;
  int routable = 0;
  const int tokens = SequenceTokens(prompt_len, max_tokens);
  for (const WorkerSnapshot& w : decode) {
    if (!w.routable() || exclude.contains(w.address)) continue;
    ++routable;
    const bool fits = FreeBlocks(w) >= BlocksFor(tokens, w.block_size);
    if (best == nullptr) {
      best = &w;
      best_fits = fits;
      continue;
    }
    if (DecodeKey(w, fits) < DecodeKey(*best, best_fits)) {
      best = &w;
      best_fits = fits;
    }
  }
  if (best == nullptr) return std::nullopt;
  const int needed = static_cast<int>(BlocksFor(tokens, best->block_size));
  return Pick{best->address,
              absl::StrCat("decode ", best->address, ": ", FreeBlocks(*best), " free KV blocks (",
                           needed, " wanted", best_fits ? "" : ", no worker has room", "), load ",
                           DecodeLoad(*best), ", best of ", routable, " routable")};
}

std::optional<Pick> PickPrefillWorker(const std::vector<WorkerSnapshot>& prefill,
                                      const absl::flat_hash_set<std::string>& exclude) {
  const WorkerSnapshot* best = nullptr;
  int candidates = 0;
  for (const WorkerSnapshot& w : prefill) {
    if (!w.routable() || exclude.contains(w.address)) continue;
    ++candidates;
    if (best == nullptr || std::make_tuple(PrefillQueue(w), w.running, w.address) <
                               std::make_tuple(PrefillQueue(*best), best->running, best->address)) {
      best = &w;
    }
  }
  if (best == nullptr) return std::nullopt;
  return Pick{best->address,
              absl::StrCat("prefill ", best->address, ": queue ", PrefillQueue(*best), ", best of ",
                           candidates, exclude.empty() ? "" : " not yet tried")};
}

PrefillDecision DecidePrefill(const std::vector<WorkerSnapshot>& prefill, int prompt_len,
                              int local_prefill_tokens, int burst_queue,
                              const std::vector<WorkerSnapshot>& decode) {
  if (prefill.empty()) {
    return {.local = true, .reason = "local prefill: no prefill workers (colocated mode)"};
  }
  const bool any_routable = std::any_of(prefill.begin(), prefill.end(),
                                        [](const WorkerSnapshot& w) { return w.routable(); });
  if (!any_routable) {
    return {.local = true,
            .reason = absl::StrCat("local prefill: none of the ", prefill.size(),
                                   " prefill workers is healthy and not draining")};
  }
  if (prompt_len <= local_prefill_tokens) {
    return {.local = true,
            .reason = absl::StrCat("local prefill: prompt of ", prompt_len,
                                   " tokens <= --local_prefill_tokens=", local_prefill_tokens)};
  }
  if (burst_queue > 0) {
    int64_t shortest = std::numeric_limits<int64_t>::max();
    for (const WorkerSnapshot& w : prefill) {
      if (w.routable()) shortest = std::min(shortest, PrefillQueue(w));
    }
    const auto spare = std::find_if(decode.begin(), decode.end(), [](const WorkerSnapshot& w) {
      return w.routable() && w.waiting == 0;
    });
    if (shortest >= burst_queue && spare != decode.end()) {
      return {.local = true,
              .burst = true,
              .reason = absl::StrCat("local prefill (burst): every prefill worker holds ", shortest,
                                     "+ prompts (--prefill_burst_queue=", burst_queue,
                                     ") and decode ", spare->address, " has none waiting")};
    }
  }
  return {.local = false,
          .reason = absl::StrCat("disaggregated: prompt of ", prompt_len, " tokens > ",
                                 "--local_prefill_tokens=", local_prefill_tokens)};
}

}  // namespace tandem::router
