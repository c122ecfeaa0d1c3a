// LinkModelTransport: wraps a KvTransport and holds each message back for
// the time a network link would take to carry it, read on a Clock, so that
// a simulated cluster (tools/sim) moves KV in the time the link model says
// rather than in none.
//
// The model: `lanes` links of `bandwidth` bytes per second each. A message
// takes the lane that frees first; from when it is posted (or its lane
// frees, if later) it occupies the lane for `per_message` plus its bytes
// (header and payload) over the bandwidth, and arrives `latency` after
// that. Messages to one peer still arrive in the order they were posted
// (a message never overtakes an earlier one to its peer). A held message
// is posted to the inner transport, where the peer can take it, by the
// first Poll() or ReleaseDue() at or after its arrival time;
// next_release() tells a discrete-event loop when that is. Everything else
// passes through unchanged.
//
// Two clocks: messages are stamped on `clock` when posted, and released
// when `release_clock` reaches their arrival. In a simulated cluster the
// first is the sending worker's (which runs ahead of the cluster while it
// computes a step) and the second the cluster's, so that no peer sees a
// message before the cluster's time has reached its arrival.
//
// Thread-compatible, like the transports it wraps.
#ifndef TANDEM_KVTRANSFER_LINK_MODEL_TRANSPORT_H_
#define TANDEM_KVTRANSFER_LINK_MODEL_TRANSPORT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "kvtransfer/kv_transport.h"

namespace tandem::kvtransfer {

struct LinkModel {
  double bandwidth = 10e9;  // bytes per second, per lane
  absl::Duration latency = absl::Microseconds(10);
  absl::Duration per_message = absl::ZeroDuration();
  int lanes = 1;
  // Bytes on the link per payload byte sent: a simulated worker's stand-in
  // model ships this much less KV than the model it stands in for.
  double byte_scale = 1.0;
  // INVALID_ARGUMENT, naming the field, for a model no link has.
  absl::Status Validate() const;
  // How long a message of `header` and `payload` bytes occupies one lane
  // (per_message included; latency not).
  absl::Duration Busy(uint64_t header, uint64_t payload) const;
  // The bytes such a message puts on the link.
  double OnLink(uint64_t header, uint64_t payload) const;
};

class LinkModelTransport final : public KvTransport {
 public:
  // `model` must be valid (LinkModel::Validate); the clocks must outlive
  // the transport. A null `release_clock` is `clock`.
  LinkModelTransport(std::unique_ptr<KvTransport> inner, LinkModel model, const Clock* clock,
                     const Clock* release_clock = nullptr);

  // Posts the held messages that have arrived by release_clock to the
  // inner transport (Poll does this too). Their events come from Poll.
  void ReleaseDue();

  // When the earliest held message arrives; InfiniteFuture when none is
  // held.
  absl::Time next_release() const;
  // Bytes carried so far (headers, and payloads at byte_scale), and the
  // time lanes were busy.
  uint64_t bytes_carried() const { return bytes_; }
  absl::Duration busy() const { return busy_; }

  std::string_view name() const override { return inner_->name(); }
  absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind) override {
    return inner_->RegisterMemory(base, length, kind);
  }
  absl::Status DeregisterMemory(RegionId region) override {
    return inner_->DeregisterMemory(region);
  }
  std::string LocalAddress() const override { return inner_->LocalAddress(); }
  absl::StatusOr<PeerId> Connect(std::string_view address) override {
    return inner_->Connect(address);
  }
  void Disconnect(PeerId peer) override;
  absl::StatusOr<SendId> PostSend(PeerId peer, std::string_view header,
                                  std::span<const Slice> payload) override;
  absl::Status Accept(IncomingId incoming, std::span<const Slice> destination) override {
    return inner_->Accept(incoming, destination);
  }
  void Discard(IncomingId incoming) override { inner_->Discard(incoming); }
  void Cancel(SendId send) override;
  void Poll(std::vector<TransportEvent>& events) override;
  // Returns at once while messages are held (their release is a time on a
  // Clock, which a real-time wait cannot watch): meant for loops driven
  // round by round on a fake clock, as tools/sim drives them.
  void WaitForActivity(absl::Time deadline) override;

 private:
  struct Held {
    PeerId peer = 0;
    std::string header;
    std::vector<Slice> payload;
  };

  // Ends a send that never reached the inner transport.
  void Complete(SendId id, absl::Status status);

  const LinkModel model_;
  const Clock* const clock_;
  const Clock* const release_clock_;
  const std::unique_ptr<KvTransport> inner_;
  // When each lane frees.
  std::vector<absl::Time> lane_free_;
  // When the last message posted to each peer arrives.
  absl::flat_hash_map<PeerId, absl::Time> peer_last_;
  // Held messages by (arrival, id): released in that order.
  std::map<std::pair<absl::Time, SendId>, Held> held_;
  absl::flat_hash_map<SendId, absl::Time> held_at_;
  absl::flat_hash_map<SendId, SendId> inner_to_outer_;
  absl::flat_hash_map<SendId, SendId> outer_to_inner_;
  std::vector<TransportEvent> pending_;  // Ends of sends the wrapper made.
  SendId next_send_ = 1;
  uint64_t bytes_ = 0;
  absl::Duration busy_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_LINK_MODEL_TRANSPORT_H_
