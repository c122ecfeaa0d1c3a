// FaultyTransport: wraps a KvTransport and injects faults into the messages
// posted through it, for tests of everything built on a transport.
//
// Faults apply to sends, by message index (the n-th PostSend through this
// wrapper, counting from 0) or at random with a seed:
//   kDrop       the message never leaves; the send still reports success
//   kDelayPolls held back for `polls` Poll() calls, then posted
//   kDelayTime  held back until the clock has advanced by `delay`
//   kDuplicate  posted twice
//   kReorder    posted after the next message to the same peer
//   kTruncate   `bytes` fewer payload bytes than the header promises
//   kCorrupt    `bytes` payload bytes flipped (sent from a private copy; the
//               caller's memory is never written)
//   kKill       the connection is closed: this and every later send to the
//               peer fail, kPeerFailed is reported on both sides
// Each send still reports exactly one kSendDone. Everything else (receives,
// events of the inner transport) passes through unchanged.
//
// Thread-compatible, like the transports it wraps.
#ifndef TANDEM_KVTRANSFER_FAULTY_TRANSPORT_H_
#define TANDEM_KVTRANSFER_FAULTY_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/slices.h"

namespace tandem::kvtransfer {

struct Fault {
  enum class Kind {
    kNone,
    kDrop,
    kDelayPolls,
    kDelayTime,
    kDuplicate,
    kReorder,
    kTruncate,
    kCorrupt,
    kKill,
  };
  static constexpr int kKinds = 9;

  Kind kind = Kind::kNone;
  int polls = 1;                            // kDelayPolls
  absl::Duration delay = absl::Seconds(1);  // kDelayTime
  uint64_t bytes = 1;                       // kTruncate, kCorrupt
};

struct FaultPlan {
  // Faults at chosen message indexes.
  absl::flat_hash_map<uint64_t, Fault> at_message;
  // Every other message suffers one of `random_faults` (picked uniformly)
  // with probability `random_probability`, from a generator seeded by `seed`.
  double random_probability = 0;
  std::vector<Fault> random_faults;
  uint64_t seed = 1;
};

class FaultyTransport final : public KvTransport {
 public:
  // `clock` (for kDelayTime) must outlive the transport.
  FaultyTransport(std::unique_ptr<KvTransport> inner, FaultPlan plan, const Clock* clock);

  // How many faults of `kind` were injected so far.
  uint64_t injected(Fault::Kind kind) const { return injected_[static_cast<int>(kind)]; }
  KvTransport& inner() { return *inner_; }

  std::string_view name() const override { return "faulty"; }
  absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind) override;
  absl::Status DeregisterMemory(RegionId region) override;
  std::string LocalAddress() const override { return inner_->LocalAddress(); }
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
  struct Send {
    PeerId peer = 0;
    std::string header;
    std::vector<Slice> payload;
    Fault fault;
    bool held = false;  // Waiting for its delay or its reorder partner.
    int polls_left = 0;
    absl::Time release_at;
    std::vector<SendId> inner_ids;
    int inner_left = 0;  // Inner sends not yet done.
    absl::Status status;
    std::vector<std::byte> scratch;  // The corrupted copy, kCorrupt only.
    RegionId scratch_region = 0;
  };

  Fault PickFault(uint64_t index);
  // Posts `s` to the inner transport (twice for kDuplicate).
  absl::Status Release(Send& s, SendId id);
  void Complete(SendId id, absl::Status status);

  // Constant after construction.
  const FaultPlan plan_;
  const Clock* const clock_;

  std::mt19937_64 rng_;
  RegionMap regions_;
  uint64_t next_index_ = 0;
  SendId next_send_ = 1;
  absl::flat_hash_map<SendId, Send> sends_;
  absl::flat_hash_map<SendId, SendId> inner_to_outer_;
  absl::flat_hash_set<PeerId> killed_;
  std::vector<TransportEvent> pending_;  // Events the wrapper itself produced.
  uint64_t injected_[Fault::kKinds] = {};
  // Declared last so that it is destroyed first, while the scratch copies
  // it may still point into are alive. Constant after construction.
  const std::unique_ptr<KvTransport> inner_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_FAULTY_TRANSPORT_H_
