#include "kvtransfer/ucx/ucx_wire.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::ucx_internal {
namespace {

// 2: a connection is introduced through the door (hello, welcome).
constexpr uint8_t kPrefixVersion = 2;
constexpr uint32_t kAddressMagic = 0x58435554;  // "TUCX" read little-endian
constexpr uint32_t kAddressVersion = 2;         // 2: the address of a door
constexpr size_t kAddressHeaderBytes = 12;      // magic u32 | version u32 | length u32

template <typename T>
void Put(std::string& out, T value) {
  char bytes[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) bytes[i] = static_cast<char>(value >> (8 * i));
  out.append(bytes, sizeof(T));
}

template <typename T>
T Get(std::string_view in, size_t at) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<T>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  }
  return value;
}

}  // namespace

std::string EncodePrefix(const MessagePrefix& prefix) {
  std::string out;
  out.reserve(MessagePrefix::kEncodedBytes);
  Put<uint64_t>(out, prefix.key.initiator_nonce);
  Put<uint32_t>(out, prefix.key.initiator_peer);
  Put<uint8_t>(out, prefix.from_initiator ? 1 : 0);
  Put<uint8_t>(out, kPrefixVersion);
  Put<uint16_t>(out, 0);
  return out;
}

absl::StatusOr<MessagePrefix> DecodePrefix(std::string_view header) {
  if (header.size() < MessagePrefix::kEncodedBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX message header of ", header.size(), " bytes is shorter than its prefix"));
  }
  if (Get<uint8_t>(header, 13) != kPrefixVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX message prefix version ", Get<uint8_t>(header, 13), " is not ", kPrefixVersion));
  }
  MessagePrefix prefix;
  prefix.key.initiator_nonce = Get<uint64_t>(header, 0);
  prefix.key.initiator_peer = Get<uint32_t>(header, 8);
  prefix.from_initiator = Get<uint8_t>(header, 12) != 0;
  return prefix;
}

std::string EncodeAddress(std::string_view worker_address) {
  std::string out;
  out.reserve(kAddressHeaderBytes + worker_address.size());
  Put<uint32_t>(out, kAddressMagic);
  Put<uint32_t>(out, kAddressVersion);
  Put<uint32_t>(out, static_cast<uint32_t>(worker_address.size()));
  out.append(worker_address);
  return out;
}

absl::StatusOr<std::string_view> DecodeAddress(std::string_view address) {
  if (address.size() < kAddressHeaderBytes || Get<uint32_t>(address, 0) != kAddressMagic) {
    return absl::InvalidArgumentError(
        "not a UCX transport address (expected the bytes of UcxTransport::LocalAddress())");
  }
  if (Get<uint32_t>(address, 4) != kAddressVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX transport address version ", Get<uint32_t>(address, 4), " is not ", kAddressVersion));
  }
  const uint32_t length = Get<uint32_t>(address, 8);
  if (address.size() - kAddressHeaderBytes != length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX transport address is truncated or padded: ", address.size() - kAddressHeaderBytes,
        " bytes of worker address, ", length, " expected"));
  }
  return address.substr(kAddressHeaderBytes);
}

}  // namespace tandem::kvtransfer::ucx_internal
