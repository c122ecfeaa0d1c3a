// InProcTransport: a KvTransport between transports of one process, for
// tests and for a deployment that runs prefill and decode in one process.
//
// Transports register with a shared InProcFabric; an address names a
// transport in its fabric. Deterministic: a send only queues its header at
// the receiver; the receiver reports it from Poll(), and its payload is
// copied (memcpy from the sender's memory into the accepted destination)
// during the receiver's next Poll() after Accept(). The sender learns of it
// (kSendDone) from its own Poll() after that.
//
// Connections are two-way: the receiver of a message may reply on the
// PeerId that kIncoming reports. Closing a connection (Disconnect or
// destroying a transport) fails the messages in flight on it in both
// directions and reports kPeerFailed to the other end.
//
// The fabric is thread-safe; each transport is thread-compatible (one thread
// drives it), and transports of one fabric may be driven by different
// threads. Payload copies run under the fabric's lock, which is fine for
// tests and a single host but serialises copies of unrelated transports.
#ifndef TANDEM_KVTRANSFER_INPROC_TRANSPORT_H_
#define TANDEM_KVTRANSFER_INPROC_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/slices.h"

namespace tandem::kvtransfer {

namespace inproc_internal {
struct Node;
}  // namespace inproc_internal

// The medium InProcTransports of one process share. Must outlive nothing in
// particular: transports hold it by shared_ptr.
class InProcFabric {
 public:
  static std::shared_ptr<InProcFabric> Create();

  InProcFabric(const InProcFabric&) = delete;
  InProcFabric& operator=(const InProcFabric&) = delete;

 private:
  friend class InProcTransport;
  explicit InProcFabric(uint64_t serial) : serial_(serial) {}

  const uint64_t serial_;  // Tells fabrics apart in addresses.
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, inproc_internal::Node*> nodes_ ABSL_GUARDED_BY(mu_);
  uint64_t next_node_ ABSL_GUARDED_BY(mu_) = 1;
};

class InProcTransport final : public KvTransport {
 public:
  static std::unique_ptr<InProcTransport> Create(std::shared_ptr<InProcFabric> fabric);
  // Closes every connection (peers see kPeerFailed).
  ~InProcTransport() override;

  std::string_view name() const override { return "inproc"; }
  absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind) override;
  absl::Status DeregisterMemory(RegionId region) override;
  std::string LocalAddress() const override { return address_; }
  absl::StatusOr<PeerId> Connect(std::string_view address) override;
  void Disconnect(PeerId peer) override;
  absl::StatusOr<SendId> PostSend(PeerId peer, std::string_view header,
                                  std::span<const Slice> payload) override;
  absl::Status Accept(IncomingId incoming, std::span<const Slice> destination) override;
  void Discard(IncomingId incoming) override;
  void Cancel(SendId send) override;
  void Poll(std::vector<TransportEvent>& events) override;
  void WaitForActivity(absl::Time deadline) override;

 private:
  InProcTransport(std::shared_ptr<InProcFabric> fabric,
                  std::unique_ptr<inproc_internal::Node> node);

  // Resolves `slices` of this transport's regions to host bytes.
  absl::StatusOr<std::vector<std::span<std::byte>>> Resolve(std::span<const Slice> slices) const;

  // Constant after construction.
  const std::shared_ptr<InProcFabric> fabric_;
  const std::unique_ptr<inproc_internal::Node> node_;
  std::string address_;

  RegionMap regions_;
  RegionId next_region_ = 1;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_INPROC_TRANSPORT_H_
