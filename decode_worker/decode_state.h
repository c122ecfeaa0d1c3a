// What the parts of the decode core share: the engine and its KV pool, the
// KV receiver, the requests held and the counters the stats report. Private
// to decode_worker/; touched only by the thread that drives the core.
#ifndef TANDEM_DECODE_WORKER_DECODE_STATE_H_
#define TANDEM_DECODE_WORKER_DECODE_STATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/base/clock.h"
#include "common/engine/engine.h"
#include "common/engine/kv_staging.h"
#include "common/engine/step_executor.h"
#include "common/kvcache/block_hash.h"
#include "decode_worker/decode_options.h"
#include "decode_worker/decode_types.h"
#include "decode_worker/sequence.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/transfer_receiver.h"
#include "kvtransfer/transfer_sender.h"

namespace tandem::decode {

struct DecodeState {
  // Takes the engine (and the staging, when its backend has a KvCopier);
  // makes the receiver over `transport` and, with options.make_executor,
  // the step executor.
  DecodeState(std::unique_ptr<Engine> engine, std::unique_ptr<KvStaging> staging,
              kvtransfer::KvTransport* transport, DecodeLoopOptions options);

  int block_size() const { return engine->kv_layout().block_size; }
  BlockPool& pool() { return engine->block_pool(); }
  // Free blocks a waiting request may take now: the watermark is kept
  // unless no other request holds blocks (decode_admission.cc).
  int AdmissionRoom() const;
  // The held request `ticket` names, or null.
  Sequence* Find(Ticket ticket) {
    auto it = sequences.find(ticket);
    return it == sequences.end() ? nullptr : it->second.get();
  }

  const DecodeLoopOptions options;
  const Clock* const clock;
  const ModelConfig config;
  // Salt of the prefix cache's block hashes.
  const BlockHash salt;
  std::unique_ptr<Engine> engine;
  // What options.make_executor made; null: the engine runs the steps.
  std::unique_ptr<StepExecutor> executor;
  // Null without staging; the copier belongs to the engine's backend.
  std::unique_ptr<KvStaging> staging;
  KvCopier* const copier;
  kvtransfer::KvTransport* const transport;
  // Destroyed first (DecodeCore's destructor), while the requests its done
  // callbacks name still exist.
  std::unique_ptr<kvtransfer::TransferReceiver> receiver;
  // The KV cache's registration with the transport, or the staging's.
  kvtransfer::RegionId kv_region = 0;
  // Ships handed-off streams' K/V (options.handoff_transport, host KV
  // only); null: none. Destroyed before the receiver.
  std::unique_ptr<kvtransfer::TransferSender> sender;
  kvtransfer::RegionId send_region = 0;

  std::map<Ticket, std::unique_ptr<Sequence>> sequences;   // Admission order.
  absl::flat_hash_map<std::string, Ticket> by_request_id;  // Live requests.

  uint64_t failed = 0;  // Requests ended with an error (not a cancellation).
  uint64_t cache_queried_tokens = 0;
  uint64_t cache_hit_tokens = 0;
  uint64_t preemptions = 0;
  // DecodeCore::Drain was called: movable requests are offered to move.
  bool draining = false;

  // Runs with a request's choice count once the core no longer holds it
  // (ended and its blocks given back, or refused at enqueue).
  std::function<void(int n)> on_released;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_STATE_H_
