// Routing decisions: pure functions over worker snapshots. They read no
// clock, no network and no global state, so they are unit tested with
// made-up snapshots and can run unchanged inside a capacity simulator.
#ifndef TANDEM_ROUTER_ROUTING_POLICY_H_
#define TANDEM_ROUTER_ROUTING_POLICY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/kvcache/kv_layout.h"
#include "router/worker_snapshot.h"

namespace tandem::router {

struct Pick {
  std::string address;
  // Why this worker, for the request's log line.
  std::string reason;
};

// The decode worker for a request of `prompt_len` + `max_tokens` tokens.
// Among routable workers, those whose free KV blocks (stats minus the blocks
// this router reserved there since) hold the whole sequence come first; then
// the lightest running load (running + waiting, or the router's in-flight
// count when larger, as stats lag); then the most free blocks; then the
// address, so that equal workers give the same answer. When none has room,
// the one with the most free blocks is still picked: the worker's admission
// decides (it may admit part of max_tokens, or refuse with
// RESOURCE_EXHAUSTED). Addresses in `exclude` (workers that already
// refused this request) are skipped. nullopt when no worker is left.
std::optional<Pick> PickDecodeWorker(const std::vector<WorkerSnapshot>& decode, int prompt_len,
                                     int max_tokens,
                                     const absl::flat_hash_set<std::string>& exclude = {});

// The prefill worker with the shortest queue (waiting in its stats plus the
// router's in-flight requests there), skipping the addresses in `exclude`
// (workers that already failed this request). nullopt when none is left.
std::optional<Pick> PickPrefillWorker(const std::vector<WorkerSnapshot>& prefill,
                                      const absl::flat_hash_set<std::string>& exclude = {});

// Prefix-aware routing (--routing_policy=prefix): what the router's prefix
// index (router/prefix_index.h) says the workers of one pool hold of a
// prompt, and how a queued request weighs against a cached token.
struct PrefixAffinity {
  // Tokens-equivalent cost of one request queued or running on a worker
  // (--prefix_routing_load_tokens): a worker holding C more prompt tokens
  // than another wins until it has more than C / load_tokens more requests.
  int load_tokens = 256;
  // Per worker address: the prompt's leading tokens it holds (absent: 0).
  absl::flat_hash_map<std::string, int> cached_tokens;
  // Per worker address: the blocks the index holds for it (absent: 0).
  // Ties of cost and load go to the fewer, spreading unrelated prompts
  // over the pool's caches.
  absl::flat_hash_map<std::string, int64_t> indexed_blocks;
};

// The prefill worker of least estimated cost: uncached prompt tokens +
// load_tokens x its queue (waiting in its stats plus the router's in-flight
// requests there). Ties go to the shorter queue, the fewer running, the
// fewer indexed blocks, then the address. Addresses in `exclude` are
// skipped. The reason tells the cached tokens the chosen worker had per the
// index.
std::optional<Pick> PickPrefillWorkerByPrefix(const std::vector<WorkerSnapshot>& prefill,
                                              int prompt_len, const PrefixAffinity& affinity,
                                              const absl::flat_hash_set<std::string>& exclude = {});

// The decode worker by the room rule of PickDecodeWorker (workers with room
// for the whole sequence come first; with none, the most free blocks), and
// among those with room, the least estimated cost: uncached prompt tokens +
// load_tokens x its load (running + waiting, or the router's in-flight
// count when larger); ties as PickDecodeWorker, then the fewer indexed
// blocks, then the address.
std::optional<Pick> PickDecodeWorkerByPrefix(const std::vector<WorkerSnapshot>& decode,
                                             int prompt_len, int max_tokens,
                                             const PrefixAffinity& affinity,
                                             const absl::flat_hash_set<std::string>& exclude = {});

struct PrefillDecision {
  // Prefill on the decode worker instead of a prefill worker.
  bool local = false;
  // Local because every prefill worker was full (burst_queue): the prefill
  // pool is short, which the router counts for the planner.
  bool burst = false;
  std::string reason;
};

// Local prefill when no prefill worker is routable (colocated mode, or the
// whole prefill pool is down or draining), or when the prompt is at most
// `local_prefill_tokens` long (conditional disaggregation: shipping the KV
// of a short prompt costs more than computing it beside the decode batch),
// or in a burst: `burst_queue` > 0 and every routable prefill worker holds
// at least that many prompts (queued or on their way), while some routable
// decode worker of `decode` has nothing waiting (it has room to prefill
// beside its batch; the prompt's decode worker is then picked as for any
// local prefill).
PrefillDecision DecidePrefill(const std::vector<WorkerSnapshot>& prefill, int prompt_len,
                              int local_prefill_tokens, int burst_queue = 0,
                              const std::vector<WorkerSnapshot>& decode = {});

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROUTING_POLICY_H_
