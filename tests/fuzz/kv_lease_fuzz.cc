// kvtransfer lease descriptors (handed to the sender through the control
// plane): a lease that parses serializes back to the same bytes, and its
// chunking covers every layer exactly.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvtransfer/wire_format.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes = tandem::fuzz::AsText(data, size);
  absl::StatusOr<tandem::kvtransfer::TransferLease> lease =
      tandem::kvtransfer::TransferLease::Parse(bytes);
  if (!lease.ok()) return 0;
  FUZZ_CHECK(lease->Serialize() == bytes);
  for (uint32_t layer = 0; layer < lease->layer_bytes.size(); ++layer) {
    const uint64_t layer_bytes = lease->layer_bytes[layer];
    const uint64_t chunks = lease->chunks_in_layer(layer);
    FUZZ_CHECK(chunks >= 1);
    // Every chunk but the last is full; the last one ends the layer.
    const uint64_t last = lease->chunk_length(layer, chunks - 1);
    FUZZ_CHECK(last <= lease->chunk_bytes);
    FUZZ_CHECK((chunks - 1) <= layer_bytes / lease->chunk_bytes);
    FUZZ_CHECK((chunks - 1) * lease->chunk_bytes + last == layer_bytes);
    FUZZ_CHECK(layer_bytes == 0 || last > 0);
  }
  (void)lease->total_bytes();
  return 0;
}
