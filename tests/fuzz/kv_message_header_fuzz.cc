// kvtransfer message headers as they arrive off the wire: a header that
// parses encodes back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvtransfer/wire_format.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes = tandem::fuzz::AsText(data, size);
  absl::StatusOr<tandem::kvtransfer::MessageHeader> header =
      tandem::kvtransfer::MessageHeader::Parse(bytes);
  if (!header.ok()) return 0;
  FUZZ_CHECK(header->Encode() == bytes);
  return 0;
}
