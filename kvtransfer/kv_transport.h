// KvTransport: moves bytes of registered memory between processes, as
// messages of a small header plus a payload gathered from local memory and
// scattered into memory the receiver chooses.
//
// The receiver places every payload itself: an incoming message is reported
// with its header first (TransportEvent::kIncoming) and its bytes land only
// after Accept() names where they go, or never (Discard()). That is what lets
// the transfer protocol drop late, duplicate or foreign messages before a
// byte of them can reach a reused KV slot.
//
// Polled, not callback-driven: nothing happens outside Poll(), so an
// in-process implementation is deterministic in tests. Thread-compatible:
// one thread drives a transport.
//
// Addresses are opaque bytes (LocalAddress() on one side, Connect() on the
// other), so the control plane carries them without knowing the transport.
#ifndef TANDEM_KVTRANSFER_KV_TRANSPORT_H_
#define TANDEM_KVTRANSFER_KV_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer {

// Where registered memory lives. Only kHost is implemented by the transports
// here; kCuda is reserved for GPU-direct transports (UCX built with CUDA).
enum class MemoryKind { kHost, kCuda };

using RegionId = uint32_t;
using PeerId = uint32_t;
using SendId = uint64_t;
using IncomingId = uint64_t;

// A byte range of a registered region.
struct Slice {
  RegionId region;
  uint64_t offset;
  uint64_t length;
};

struct TransportEvent {
  enum class Kind {
    kSendDone,     // id = SendId; status says whether every byte left
    kIncoming,     // id = IncomingId; header and payload_bytes are set; the
                   // receiver may reply on `peer` (connections are two-way)
    kReceiveDone,  // id = IncomingId after Accept; status says whether every byte landed
    kPeerFailed,   // peer's connection broke; its sends and receives also fail
  };
  Kind kind;
  uint64_t id = 0;
  PeerId peer = 0;
  absl::Status status = absl::OkStatus();
  std::string header = "";
  uint64_t payload_bytes = 0;
};

class KvTransport {
 public:
  // Largest header a message may carry.
  static constexpr size_t kMaxHeaderBytes = 1024;

  virtual ~KvTransport() = default;

  virtual std::string_view name() const = 0;

  // Registers [base, base + length) for sending from or receiving into. The
  // memory must stay valid until DeregisterMemory.
  virtual absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind) = 0;
  virtual absl::Status DeregisterMemory(RegionId region) = 0;

  // Opaque bytes another transport of the same kind passes to Connect().
  virtual std::string LocalAddress() const = 0;

  // A connection to the transport at `address`. Messages from a peer arrive
  // in the order they were posted.
  virtual absl::StatusOr<PeerId> Connect(std::string_view address) = 0;
  virtual void Disconnect(PeerId peer) = 0;

  // Sends `header` (at most kMaxHeaderBytes) and the payload gathered from
  // `payload` in order. The slices must stay untouched until kSendDone.
  virtual absl::StatusOr<SendId> PostSend(PeerId peer, std::string_view header,
                                          std::span<const Slice> payload) = 0;

  // Places the payload of a kIncoming message into `destination` (total
  // length must equal payload_bytes); exactly one kReceiveDone follows, also
  // when the peer fails, and only after it may the destination be reused.
  // On an error return nothing was accepted and no kReceiveDone follows.
  virtual absl::Status Accept(IncomingId incoming, std::span<const Slice> destination) = 0;
  // Drops a kIncoming message's payload unread.
  virtual void Discard(IncomingId incoming) = 0;

  // Abandons a send; its kSendDone (which still follows, promptly) reports
  // CANCELLED unless it had already completed.
  virtual void Cancel(SendId send) = 0;

  // Makes progress and appends what happened to `events`; never blocks.
  virtual void Poll(std::vector<TransportEvent>& events) = 0;

  // Sleeps until there may be events to poll, or until `deadline`.
  virtual void WaitForActivity(absl::Time deadline) = 0;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_KV_TRANSPORT_H_
