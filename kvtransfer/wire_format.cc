#include "kvtransfer/wire_format.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer {
namespace {

constexpr uint32_t kHeaderMagic = 0x484b5654;  // "TVKH" read little-endian.
constexpr uint32_t kLeaseMagic = 0x4c4b5654;   // "TVKL" read little-endian.
constexpr size_t kLeaseFixedBytes = 56;

// Little-endian writers and readers, byte by byte so that host order and
// alignment never matter.
void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLe(std::string_view in, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[pos + i])) << (8 * i);
  }
  return v;
}

std::string Preview(std::string_view bytes) {
  const std::string_view head = bytes.substr(0, 8);
  return absl::BytesToHexString(absl::string_view(head.data(), head.size()));
}

int64_t DeadlineToNanos(absl::Time t) {
  if (t == absl::InfiniteFuture()) return std::numeric_limits<int64_t>::max();
  if (t == absl::InfinitePast()) return std::numeric_limits<int64_t>::min();
  return absl::ToUnixNanos(t);
}
absl::Time NanosToDeadline(int64_t ns) {
  if (ns == std::numeric_limits<int64_t>::max()) return absl::InfiniteFuture();
  if (ns == std::numeric_limits<int64_t>::min()) return absl::InfinitePast();
  return absl::FromUnixNanos(ns);
}

}  // namespace

std::string MessageHeader::Encode() const {
  std::string out;
  out.reserve(kEncodedBytes);
  PutLe(out, kHeaderMagic, 4);
  PutLe(out, kWireVersion, 2);
  PutLe(out, static_cast<uint8_t>(type), 1);
  PutLe(out, has_checksum ? 1 : 0, 1);
  PutLe(out, request_id, 8);
  PutLe(out, generation, 8);
  PutLe(out, layer, 4);
  PutLe(out, lane, 2);
  PutLe(out, static_cast<uint64_t>(code), 2);
  PutLe(out, offset, 8);
  PutLe(out, length, 8);
  PutLe(out, checksum, 8);
  return out;
}

absl::StatusOr<MessageHeader> MessageHeader::Parse(std::string_view bytes) {
  if (bytes.size() != kEncodedBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvtransfer header: ", bytes.size(), " bytes, expected ", kEncodedBytes));
  }
  if (GetLe(bytes, 0, 4) != kHeaderMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvtransfer header: bad magic (starts ", Preview(bytes), ")"));
  }
  const uint64_t version = GetLe(bytes, 4, 2);
  if (version != kWireVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvtransfer header: version ", version, ", this build speaks ", kWireVersion));
  }
  MessageHeader h;
  const uint64_t type = GetLe(bytes, 6, 1);
  if (type < static_cast<uint8_t>(MessageType::kData) ||
      type > static_cast<uint8_t>(MessageType::kComplete)) {
    return absl::InvalidArgumentError(absl::StrCat("kvtransfer header: unknown type ", type));
  }
  h.type = static_cast<MessageType>(type);
  const uint64_t flags = GetLe(bytes, 7, 1);
  if ((flags & ~uint64_t{1}) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("kvtransfer header: unknown flags ", flags));
  }
  const uint64_t code = GetLe(bytes, 30, 2);
  if (code > static_cast<uint64_t>(absl::StatusCode::kUnauthenticated) ||
      (code != 0) != (h.type == MessageType::kAbort)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvtransfer header: status code ", code, " on a message of type ", type));
  }
  h.code = static_cast<absl::StatusCode>(code);
  h.has_checksum = (flags & 1) != 0;
  h.request_id = GetLe(bytes, 8, 8);
  h.generation = GetLe(bytes, 16, 8);
  h.layer = static_cast<uint32_t>(GetLe(bytes, 24, 4));
  h.lane = static_cast<uint16_t>(GetLe(bytes, 28, 2));
  h.offset = GetLe(bytes, 32, 8);
  h.length = GetLe(bytes, 40, 8);
  h.checksum = GetLe(bytes, 48, 8);
  if (h.type != MessageType::kData && (h.length != 0 || h.offset != 0)) {
    return absl::InvalidArgumentError("kvtransfer header: control message with a payload range");
  }
  return h;
}

uint64_t TransferLease::total_bytes() const {
  uint64_t total = 0;
  for (uint64_t b : layer_bytes) total += b;
  return total;
}

uint64_t TransferLease::chunks_in_layer(uint32_t layer) const {
  const uint64_t bytes = layer_bytes[layer];
  // Not (bytes + chunk_bytes - 1) / chunk_bytes: a lease comes from another
  // process, and a huge chunk_bytes would wrap that sum to zero chunks.
  return bytes == 0 ? 1 : bytes / chunk_bytes + (bytes % chunk_bytes != 0 ? 1 : 0);
}

uint64_t TransferLease::chunk_length(uint32_t layer, uint64_t chunk) const {
  const uint64_t start = chunk * chunk_bytes;
  return std::min(chunk_bytes, layer_bytes[layer] - std::min(start, layer_bytes[layer]));
}

std::string TransferLease::Serialize() const {
  std::string out;
  out.reserve(kLeaseFixedBytes + 8 * layer_bytes.size() + receiver_address.size());
  PutLe(out, kLeaseMagic, 4);
  PutLe(out, kWireVersion, 2);
  PutLe(out, checksums ? 1 : 0, 2);
  PutLe(out, request_id, 8);
  PutLe(out, generation, 8);
  PutLe(out, static_cast<uint64_t>(DeadlineToNanos(deadline)), 8);
  PutLe(out, chunk_bytes, 8);
  PutLe(out, layer_bytes.size(), 4);
  PutLe(out, receiver_address.size(), 4);
  PutLe(out, first_block, 4);
  PutLe(out, 0, 4);  // Reserved.
  for (uint64_t b : layer_bytes) PutLe(out, b, 8);
  out.append(receiver_address);
  return out;
}

absl::StatusOr<TransferLease> TransferLease::Parse(std::string_view bytes) {
  if (bytes.size() < kLeaseFixedBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvtransfer lease: ", bytes.size(), " bytes, shorter than its fixed part"));
  }
  if (GetLe(bytes, 0, 4) != kLeaseMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvtransfer lease: bad magic (starts ", Preview(bytes), ")"));
  }
  const uint64_t version = GetLe(bytes, 4, 2);
  if (version != kWireVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvtransfer lease: version ", version, ", this build speaks ", kWireVersion));
  }
  const uint64_t flags = GetLe(bytes, 6, 2);
  if ((flags & ~uint64_t{1}) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("kvtransfer lease: unknown flags ", flags));
  }
  TransferLease lease;
  lease.checksums = (flags & 1) != 0;
  lease.request_id = GetLe(bytes, 8, 8);
  lease.generation = GetLe(bytes, 16, 8);
  lease.deadline = NanosToDeadline(static_cast<int64_t>(GetLe(bytes, 24, 8)));
  lease.chunk_bytes = GetLe(bytes, 32, 8);
  const uint64_t layers = GetLe(bytes, 40, 4);
  const uint64_t address_bytes = GetLe(bytes, 44, 4);
  lease.first_block = static_cast<uint32_t>(GetLe(bytes, 48, 4));
  if (GetLe(bytes, 52, 4) != 0) {
    return absl::InvalidArgumentError("kvtransfer lease: reserved bytes are not zero");
  }
  if (lease.first_block > kMaxFirstBlock) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvtransfer lease: first block ", lease.first_block, " out of range"));
  }
  if (lease.chunk_bytes == 0) return absl::InvalidArgumentError("kvtransfer lease: chunk_bytes 0");
  if (layers == 0 || layers > kMaxLayers || address_bytes == 0 ||
      address_bytes > kMaxAddressBytes) {
    return absl::InvalidArgumentError(absl::StrCat("kvtransfer lease: ", layers, " layers and ",
                                                   address_bytes, " address bytes out of range"));
  }
  if (bytes.size() != kLeaseFixedBytes + 8 * layers + address_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("kvtransfer lease: ", bytes.size(),
                                                   " bytes, its fields need ",
                                                   kLeaseFixedBytes + 8 * layers + address_bytes));
  }
  lease.layer_bytes.resize(layers);
  for (uint64_t i = 0; i < layers; ++i) {
    lease.layer_bytes[i] = GetLe(bytes, kLeaseFixedBytes + 8 * i, 8);
  }
  lease.receiver_address = std::string(bytes.substr(kLeaseFixedBytes + 8 * layers));
  return lease;
}

}  // namespace tandem::kvtransfer
