// TransferReceiver: the decode side of the per-request KV transfer protocol.
//
// For each request the owner reserves destination KV blocks and calls
// Expect() with the destination bytes of every layer; the receiver issues a
// lease (TransferLease, serialised as the opaque descriptor the sender gets)
// and then, inside Poll():
//   - accepts a data message only if its (request id, generation) names a
//     live lease, its chunk lies inside the lease and has not arrived yet;
//     everything else (late, duplicate, foreign, stale generation, malformed)
//     is Discard()ed before a byte of it lands, and counted;
//   - verifies the XXH3-64 checksum of each chunk when the lease asks for
//     checksums (a mismatch fails the transfer with DATA_LOSS), inline or on
//     verifier threads while the next chunks land (ReceiverOptions);
//   - completes the transfer only when every chunk of every layer has
//     landed, and then tells the sender (kComplete);
//   - fails it on a sender abort, a local Cancel(), a broken sender
//     connection, a bad message for the lease, or the deadline
//     (DEADLINE_EXCEEDED naming the request), and tells the sender (kAbort).
//
// Every lease ends exactly once: its `done` callback runs from Poll() with
// OK (the destination holds every byte: commit it) or an error (free it).
// It runs only after every receive accepted into the destination has
// finished and every check of it has been read, so the destination is never
// written or read after `done`.
//
// Thread-compatible: one thread drives the receiver, and the receiver is
// the only consumer of its transport's events. Checks run on the verifier
// threads (or executor) only, and report back through Poll.
#ifndef TANDEM_KVTRANSFER_TRANSFER_RECEIVER_H_
#define TANDEM_KVTRANSFER_TRANSFER_RECEIVER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/executor.h"
#include "kvtransfer/chunk_verifier.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/slices.h"
#include "kvtransfer/wire_format.h"

namespace tandem::kvtransfer {

struct ReceiverOptions {
  // Bytes per data message (the lease's chunk_bytes); 0: one message per
  // layer. Smaller chunks stripe a layer over several lanes.
  uint64_t chunk_bytes = 0;
  // Ask senders for a per-chunk XXH3-64 checksum and verify it on receipt
  // (on by default: KV that arrives wrong is refused, never served).
  bool checksums = true;
  // Threads of the receiver's own that verify checksums, so that a chunk's
  // check overlaps the next chunks' landing instead of delaying them (with a
  // core to spare the check then costs the transfer almost nothing); 0:
  // each chunk is checked inline, in the Poll that sees it land.
  int verify_threads = 0;
  // Where the checks run instead of verify_threads' own (tests: a
  // ManualExecutor). It must run every check posted before the destination
  // memory is freed.
  Executor* verify_executor = nullptr;
  // Chunks smaller than this are checked inline all the same: they are read
  // back from the caches in microseconds, less than waking a thread costs
  // (docs/architecture.md, KV transfer, has the figures).
  uint64_t verify_offload_bytes = 256 << 10;
  // How many ended leases are remembered to tell late messages from foreign
  // ones (for the statistics only; both are dropped).
  size_t remembered_leases = 4096;
};

struct ReceiverStats {
  uint64_t leases = 0;
  uint64_t accepted_messages = 0;
  uint64_t accepted_bytes = 0;
  uint64_t completed = 0;
  uint64_t failed = 0;  // Every non-OK end, cancellations included.
  uint64_t cancelled = 0;
  uint64_t deadline_exceeded = 0;
  // Messages discarded unread, by reason.
  uint64_t dropped_malformed = 0;  // Not a header, or a chunk the lease does not have.
  uint64_t dropped_foreign = 0;    // No lease of ours ever had this generation.
  uint64_t dropped_stale = 0;      // An older generation of a request that holds a new lease.
  uint64_t dropped_late = 0;       // The lease had already ended.
  uint64_t dropped_duplicate = 0;  // The chunk had already arrived.

  uint64_t dropped() const {
    return dropped_malformed + dropped_foreign + dropped_stale + dropped_late + dropped_duplicate;
  }
};

// The end of one lease: OK, or why it failed.
using ReceiveDoneFn =
    absl::AnyInvocable<void(uint64_t request_id, uint64_t generation, const absl::Status& status)>;

struct ReceiveRequest {
  uint64_t request_id = 0;
  // Destination of each layer, in order: registered through this receiver
  // when checksums are on, else through its transport.
  std::vector<std::vector<Slice>> layers;
  absl::Time deadline = absl::InfinitePast();
  ReceiveDoneFn done;
  // Goes into the lease: `layers` are the sequence's KV blocks from this one
  // on (the ones before are held already).
  uint32_t first_block = 0;
};

class TransferReceiver {
 public:
  // `transport` and `clock` must outlive the receiver.
  TransferReceiver(KvTransport* transport, const Clock* clock, ReceiverOptions options = {});
  // Ends every lease still open with CANCELLED without touching the
  // transport, once its own verifier threads have finished what they were
  // checking: destroy it when idle(), or after the transport can no longer
  // write into the destinations.
  ~TransferReceiver();

  TransferReceiver(const TransferReceiver&) = delete;
  TransferReceiver& operator=(const TransferReceiver&) = delete;

  // Registers destination memory with the transport and remembers where it
  // lies, so that checksums can be verified.
  absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind);
  absl::Status DeregisterMemory(RegionId region);

  // Opens a lease for `request`; give lease.Serialize() to the sender.
  // ALREADY_EXISTS if the request holds a lease (Cancel it first: its
  // replacement gets a new generation), INVALID_ARGUMENT for no layers or an
  // expired deadline. On error `done` is never called.
  absl::StatusOr<TransferLease> Expect(ReceiveRequest request);

  // Ends the request's lease with CANCELLED (its `done` runs from Poll) and
  // tells the sender. NOT_FOUND if it holds none.
  absl::Status Cancel(uint64_t request_id);

  // Handles transport events and deadlines; runs `done` callbacks. Never blocks.
  void Poll();
  // Waits for transport activity until `deadline` or the earliest lease
  // deadline, whichever is first; while checks run it only progresses the
  // transport (a verdict does not wake the transport's wait).
  void WaitForActivity(absl::Time deadline);

  // Leases whose `done` has not run yet.
  size_t pending() const { return transfers_.size(); }
  bool idle() const { return transfers_.empty(); }
  const ReceiverStats& stats() const { return stats_; }

 private:
  struct Transfer;
  struct Receive {
    uint64_t generation;
    uint32_t layer;
    uint64_t chunk;
    bool has_checksum;
    uint64_t checksum;
    std::vector<Slice> destination;
  };

  void HandleIncoming(const TransportEvent& event);
  void HandleReceiveDone(const TransportEvent& event);
  void HandlePeerFailed(PeerId peer);
  // Counts the chunk `r` names as landed (it arrived on `peer`), completing
  // its transfer with its last chunk.
  void Land(Transfer& t, const Receive& r, PeerId peer);
  // Lands or fails the chunks whose checks have ended.
  void HandleVerdicts();
  // Starts ending `t` with `status`; `notify_sender` sends kAbort to the
  // peers it heard from.
  void Fail(Transfer& t, absl::Status status, bool notify_sender);
  // Sends kComplete (code kOk) or kAbort (code: why) for `t` on `peer`.
  void SendControl(PeerId peer, absl::StatusCode code, const Transfer& t);
  void RememberEnded(uint64_t generation);

  // Constant after construction.
  KvTransport* const transport_;
  const Clock* const clock_;
  const ReceiverOptions options_;

  RegionMap regions_;
  uint64_t next_generation_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Transfer>> transfers_;  // By generation.
  absl::flat_hash_map<uint64_t, uint64_t> live_by_request_;             // Request -> generation.
  absl::flat_hash_map<IncomingId, Receive> receives_;                   // Accepted, not done.
  std::deque<uint64_t> ended_order_;
  absl::flat_hash_set<uint64_t> ended_;
  ReceiverStats stats_;
  // Null without verify_threads; joined first thing in the destructor.
  std::unique_ptr<ThreadPoolExecutor> verify_pool_;
  ChunkVerifier verifier_;
  struct Check {
    Receive receive;
    PeerId peer;
  };
  absl::flat_hash_map<uint64_t, Check> checks_;  // By verifier tag.
  uint64_t next_check_ = 1;
  std::vector<ChunkVerifier::Verdict> verdicts_;  // Reused by HandleVerdicts.
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_TRANSFER_RECEIVER_H_
