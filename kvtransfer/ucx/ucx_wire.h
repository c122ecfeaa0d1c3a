// What UcxTransport adds to UCX on the wire: the framing of its address and
// the prefix of every active-message header. Internal to kvtransfer/ucx.
#ifndef TANDEM_KVTRANSFER_UCX_UCX_WIRE_H_
#define TANDEM_KVTRANSFER_UCX_UCX_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/hash/hash.h"
#include "absl/status/statusor.h"

namespace tandem::kvtransfer::ucx_internal {

// Active-message ids. A connection starts with a hello to the acceptor's
// door (the worker LocalAddress() names), carrying the address of the worker
// the initiator opened for this connection; the acceptor opens a worker of
// its own for it and answers with a welcome from there, carrying that
// worker's address, and from then on both sides send only between these two
// workers: every message the caller posts (data), and the last message of a
// connection closed on purpose (bye), so that the peer releases its end at
// once instead of waiting for UCX to notice. Probes are the door's own
// check that its message ring still moves (UcxTransport::Impl::ProbeDoor).
inline constexpr unsigned kHelloAmId = 1;
inline constexpr unsigned kDataAmId = 2;
inline constexpr unsigned kByeAmId = 3;
inline constexpr unsigned kWelcomeAmId = 4;
inline constexpr unsigned kProbeAmId = 5;

// Names one connection in both directions: the transport that called
// Connect() (a random nonce fixed at its creation) and the PeerId it gave
// the connection.
struct ConnectionKey {
  uint64_t initiator_nonce = 0;
  uint32_t initiator_peer = 0;

  bool operator==(const ConnectionKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const ConnectionKey& k) {
    return H::combine(std::move(h), k.initiator_nonce, k.initiator_peer);
  }
};

// The prefix of every active-message header. Layout (16 bytes,
// little-endian): 0 initiator_nonce u64 | 8 initiator_peer u32 |
// 12 from_initiator u8 | 13 version u8 | 14 reserved u16 (zero).
struct MessagePrefix {
  static constexpr size_t kEncodedBytes = 16;
  ConnectionKey key;
  bool from_initiator = false;
};

std::string EncodePrefix(const MessagePrefix& prefix);
// Parses the prefix at the start of `header`; the rest of `header` is the
// caller's header.
absl::StatusOr<MessagePrefix> DecodePrefix(std::string_view header);

// LocalAddress() bytes: a magic number, a version and the length of the UCX
// worker address that follows, so that Connect() rejects bytes that are not
// an address before UCX parses them.
std::string EncodeAddress(std::string_view worker_address);
absl::StatusOr<std::string_view> DecodeAddress(std::string_view address);

}  // namespace tandem::kvtransfer::ucx_internal

#endif  // TANDEM_KVTRANSFER_UCX_UCX_WIRE_H_
