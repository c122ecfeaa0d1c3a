// Routing decisions: pure functions over worker snapshots. They read no
// clock, no network and no global state, so they are unit tested with
// made-up snapshots and can run unchanged inside a capacity simulator.
#ifndef TANDEM_ROUTER_ROUTING_POLICY_H_
#define TANDEM_ROUTER_ROUTING_POLICY_H_

#include <optional>
#include <string>
#include <vector>

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

struct PrefillDecision {
  // Prefill on the decode worker instead of a prefill worker.
  bool local = false;
  std::string reason;
};

// Local prefill when no prefill worker is routable (colocated mode, or the
// whole prefill pool is down or draining), or when the prompt is at most
// `local_prefill_tokens` long (conditional disaggregation: shipping the KV
// of a short prompt costs more than computing it beside the decode batch).
PrefillDecision DecidePrefill(const std::vector<WorkerSnapshot>& prefill, int prompt_len,
                              int local_prefill_tokens);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROUTING_POLICY_H_
