// safetensors files: the length-prefixed JSON header and its tensor table
// checked against the data section (SafetensorsFile::Parse).
#include <cstddef>
#include <cstdint>
#include <span>

#include "common/model/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<tandem::SafetensorsFile> file =
      tandem::SafetensorsFile::Parse(nullptr, std::span(data, size), "fuzz.safetensors");
  if (!file.ok()) return 0;
  for (const tandem::TensorInfo& t : file->tensors()) {
    FUZZ_CHECK(file->Find(t.name) == &t);
    FUZZ_CHECK(t.bytes.size() ==
               static_cast<uint64_t>(t.num_elements) * tandem::SafetensorsDTypeSize(t.dtype));
    FUZZ_CHECK(t.bytes.data() >= data && t.bytes.data() + t.bytes.size() <= data + size);
  }
  (void)file->tensor_names();
  return 0;
}
