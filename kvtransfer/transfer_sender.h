// TransferSender: the prefill side of the per-request KV transfer protocol.
//
// Start() takes the receiver's descriptor (a serialised TransferLease) and
// the source bytes of every layer; MarkLayerReady() posts that layer's
// chunks at once, so transfers overlap the computation of later layers.
// Chunks go round-robin over `lanes` connections to the receiver (striping,
// for long high-latency links); connections are pooled per receiver address
// and reused by later transfers. A pooled connection is closed and dropped
// when its peer fails, or when no transfer has used its receiver for
// SenderOptions::idle_timeout (receivers come and go as decode workers are
// added and removed); the next transfer there connects again. Every
// message carries the lease's request id and generation, its layer, lane,
// byte range and, when the lease asks, an XXH3-64 checksum of its bytes.
//
// A transfer succeeds only when every send has completed and the receiver
// has confirmed the whole transfer (kComplete). It fails on its deadline
// (the earlier of the lease's and the caller's), a failed send or
// connection, a receiver abort, or Cancel(); a failure cancels what is still
// in flight and sends kAbort to the receiver.
//
// Every started transfer ends exactly once: `done` runs from Poll(), after
// every send of it has completed or been cancelled, so the source memory
// can be reused as soon as `done` runs (not before).
//
// Thread-compatible: one thread drives the sender, and the sender is the
// only consumer of its transport's events.
#ifndef TANDEM_KVTRANSFER_TRANSFER_SENDER_H_
#define TANDEM_KVTRANSFER_TRANSFER_SENDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/slices.h"
#include "kvtransfer/wire_format.h"

namespace tandem::kvtransfer {

struct SenderOptions {
  // Connections per receiver that one transfer stripes its chunks over.
  int lanes = 1;
  // How long the connections to a receiver stay pooled after its last
  // transfer ended (on the sender's clock, checked in Poll()). Must be
  // positive; absl::InfiniteDuration() keeps them until their peer fails.
  absl::Duration idle_timeout = absl::Seconds(60);
};

struct SenderStats {
  uint64_t started = 0;
  uint64_t completed = 0;
  uint64_t failed = 0;  // Every non-OK end, cancellations included.
  uint64_t messages_sent = 0;
  uint64_t bytes_sent = 0;
  uint64_t connections = 0;         // Connections opened.
  uint64_t pooled_connections = 0;  // Connections in the pool now.
  uint64_t idle_closed = 0;         // Connections closed for idling.
  // Connections closed because a transfer's sends were still unfinished
  // at its deadline (a receiver gone without the connection failing).
  uint64_t stuck_closed = 0;
  // Incoming messages that named no transfer of ours (late or foreign).
  uint64_t dropped = 0;
};

using SendDoneFn = absl::AnyInvocable<void(uint64_t request_id, const absl::Status& status)>;

struct SendRequest {
  // The receiver's TransferLease, serialised.
  std::string descriptor;
  // Source bytes of each layer, in order; each must hold exactly the bytes
  // the lease expects. Registered through this sender when the lease asks
  // for checksums, else through its transport.
  std::vector<std::vector<Slice>> layers;
  // The sender's own deadline; the lease's applies too.
  absl::Time deadline = absl::InfiniteFuture();
  SendDoneFn done;
};

class TransferSender {
 public:
  // `transport` and `clock` must outlive the sender. Dies on invalid
  // options (see SenderOptions).
  TransferSender(KvTransport* transport, const Clock* clock, SenderOptions options = {});
  // Ends every transfer still open with CANCELLED without touching the
  // transport: destroy it when idle(), or after the transport is gone.
  ~TransferSender();

  TransferSender(const TransferSender&) = delete;
  TransferSender& operator=(const TransferSender&) = delete;

  absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind);
  absl::Status DeregisterMemory(RegionId region);

  // Parses the descriptor, checks the layers against it and connects to the
  // receiver. Returns the request id. INVALID_ARGUMENT for a bad descriptor
  // or layers that do not match it, ALREADY_EXISTS if the request is being
  // sent, DEADLINE_EXCEEDED if it is already too late, UNAVAILABLE if the
  // receiver cannot be reached. On error `done` is never called.
  absl::StatusOr<uint64_t> Start(SendRequest request);

  // Posts the chunks of `layer`. Marking a layer twice is a no-op. Fails
  // (and fails the transfer) when a send cannot be posted;
  // FAILED_PRECONDITION when the transfer is already ending.
  absl::Status MarkLayerReady(uint64_t request_id, uint32_t layer);

  // Fails the transfer with CANCELLED and tells the receiver.
  absl::Status Cancel(uint64_t request_id);

  // Handles transport events and deadlines; runs `done` callbacks. Never blocks.
  void Poll();
  // Waits for transport activity until `deadline` or the earliest transfer
  // deadline, whichever is first.
  void WaitForActivity(absl::Time deadline);

  size_t pending() const { return transfers_.size(); }
  bool idle() const { return transfers_.empty(); }
  const SenderStats& stats() const { return stats_; }

 private:
  struct Transfer;
  // The connections to one receiver.
  struct Pooled {
    std::vector<PeerId> lanes;
    int transfers = 0;                            // Transfers to the receiver not yet ended.
    absl::Time last_used = absl::InfinitePast();  // When the last one ended.
  };

  absl::StatusOr<std::vector<PeerId>> Lanes(const std::string& address);
  // Closes the connections of receivers idle longer than the idle timeout.
  void CloseIdleConnections(absl::Time now);
  void UpdatePoolStats();
  void Fail(Transfer& t, absl::Status status, bool notify_receiver);
  void HandleIncoming(const TransportEvent& event);
  void HandleSendDone(const TransportEvent& event);
  void HandlePeerFailed(PeerId peer);
  // Takes `t`'s connections out of the pool and closes them.
  void DropLanes(Transfer& t);

  // Constant after construction.
  KvTransport* const transport_;
  const Clock* const clock_;
  const SenderOptions options_;

  RegionMap regions_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Transfer>> transfers_;  // By request id.
  absl::flat_hash_map<SendId, uint64_t> sends_;    // Data sends in flight -> request id.
  absl::flat_hash_map<std::string, Pooled> pool_;  // By receiver address.
  SenderStats stats_;
  uint64_t polls_ = 0;  // Poll() calls so far.
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_TRANSFER_SENDER_H_
