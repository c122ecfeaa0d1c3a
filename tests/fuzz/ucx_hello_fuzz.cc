// What the UCX transport reads from a peer before UCX itself does: the
// prefix of every active-message header (the hello's, which also carries
// the peer's address after it) and the framing of a transport address.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvtransfer/ucx/ucx_wire.h"
#include "tests/fuzz/fuzz_check.h"

namespace ucx = tandem::kvtransfer::ucx_internal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes = tandem::fuzz::AsText(data, size);
  absl::StatusOr<ucx::MessagePrefix> prefix = ucx::DecodePrefix(bytes);
  if (prefix.ok()) {
    FUZZ_CHECK(bytes.size() >= ucx::MessagePrefix::kEncodedBytes);
    const std::string again = ucx::EncodePrefix(*prefix);
    absl::StatusOr<ucx::MessagePrefix> reparsed = ucx::DecodePrefix(again);
    FUZZ_CHECK(reparsed.ok() && reparsed->key == prefix->key &&
               reparsed->from_initiator == prefix->from_initiator);
  }
  absl::StatusOr<std::string_view> address = ucx::DecodeAddress(bytes);
  if (address.ok()) FUZZ_CHECK(ucx::EncodeAddress(*address) == bytes);
  return 0;
}
