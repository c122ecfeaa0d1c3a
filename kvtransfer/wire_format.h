// The bytes the transfer protocol puts on the wire: the header of every
// message and the lease descriptor a receiver hands out.
//
// Both are hand-written fixed layouts, little-endian, with a magic number and
// a version first, so that a parser rejects garbage, truncation and
// messages from a newer protocol with a clear status instead of misreading
// them. They never carry pointers or region ids: only what the other process
// can check against its own state.
#ifndef TANDEM_KVTRANSFER_WIRE_FORMAT_H_
#define TANDEM_KVTRANSFER_WIRE_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer {

inline constexpr uint16_t kWireVersion = 2;

enum class MessageType : uint8_t {
  // Sender -> receiver: `length` bytes of `layer` starting at `offset`.
  kData = 1,
  // Either direction: the transfer of (request_id, generation) is abandoned.
  kAbort = 2,
  // Receiver -> sender: every byte arrived (and verified); the receiver
  // committed the transfer. The sender reports success only after this.
  kComplete = 3,
};

// The header of one message. Layout (56 bytes, little-endian):
//   0 magic u32 | 4 version u16 | 6 type u8 | 7 flags u8 (bit 0: checksum)
//   8 request_id u64 | 16 generation u64 | 24 layer u32 | 28 lane u16
//   30 code u16 | 32 offset u64 | 40 length u64 | 48 checksum u64
struct MessageHeader {
  static constexpr size_t kEncodedBytes = 56;

  MessageType type = MessageType::kData;
  uint64_t request_id = 0;
  uint64_t generation = 0;
  uint32_t layer = 0;
  uint16_t lane = 0;
  uint64_t offset = 0;  // Bytes from the start of the layer.
  uint64_t length = 0;  // Payload bytes the message carries.
  bool has_checksum = false;
  uint64_t checksum = 0;  // XXH3-64 of the payload when has_checksum.
  // kAbort only: why, as an absl::StatusCode, so that both sides report the
  // same kind of failure (a deadline is a deadline on both ends).
  absl::StatusCode code = absl::StatusCode::kOk;

  std::string Encode() const;
  static absl::StatusOr<MessageHeader> Parse(std::string_view bytes);
};

// What a receiver promises to accept for one request: handed to the sender
// as opaque bytes (through the control plane), and checked against every
// message that arrives. Layout (little-endian):
//   0 magic u32 | 4 version u16 | 6 flags u16 (bit 0: checksums)
//   8 request_id u64 | 16 generation u64 | 24 deadline i64 (unix ns)
//   32 chunk_bytes u64 | 40 num_layers u32 | 44 address_bytes u32
//   48 layer_bytes u64 x num_layers | receiver_address
struct TransferLease {
  static constexpr uint32_t kMaxLayers = 4096;
  static constexpr uint32_t kMaxAddressBytes = 4096;
  static constexpr uint32_t kMaxFirstBlock = 1 << 24;

  uint64_t request_id = 0;
  // Unique and increasing per receiver: a destination that is re-leased gets
  // a new generation, so messages written for the old lease are recognised.
  uint64_t generation = 0;
  absl::Time deadline = absl::InfinitePast();
  // Bytes of each layer the receiver expects, in layer order.
  std::vector<uint64_t> layer_bytes;
  // Every data message carries exactly one chunk: bytes [k * chunk_bytes,
  // min((k + 1) * chunk_bytes, layer_bytes)) of a layer. Fixing the chunking
  // in the lease lets the receiver detect duplicates and overlaps exactly.
  uint64_t chunk_bytes = 0;
  bool checksums = false;
  std::string receiver_address;
  // The lease covers the sender's sequence from this KV block on: the
  // receiver already holds the blocks before it (its prefix cache), so the
  // sender ships only the rest.
  uint32_t first_block = 0;

  uint64_t total_bytes() const;
  // Chunks of `layer` (at least one, even for an empty layer, so that every
  // layer is confirmed by a message).
  uint64_t chunks_in_layer(uint32_t layer) const;
  uint64_t chunk_length(uint32_t layer, uint64_t chunk) const;

  std::string Serialize() const;
  static absl::StatusOr<TransferLease> Parse(std::string_view bytes);
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_WIRE_FORMAT_H_
