// Request bodies of the router's OpenAI API: the first byte picks the
// endpoint (/v1/completions, /v1/chat/completions, /tokenize, /detokenize),
// the rest is the JSON body.
#include <cstddef>
#include <cstdint>

#include "router/openai_api.h"
#include "tests/fuzz/fuzz_check.h"

namespace api = tandem::router::openai_api;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      absl::StatusOr<api::ApiRequest> r = api::ParseCompletionRequest(body);
      if (r.ok()) FUZZ_CHECK(r->endpoint == api::Endpoint::kCompletions);
      break;
    }
    case 1: {
      absl::StatusOr<api::ApiRequest> r = api::ParseChatRequest(body);
      if (r.ok()) FUZZ_CHECK(r->endpoint == api::Endpoint::kChat);
      break;
    }
    case 2: {
      absl::StatusOr<api::TokenizeRequest> r = api::ParseTokenizeRequest(body);
      if (r.ok()) FUZZ_CHECK(r->prompt.has_value() != r->messages.has_value());
      break;
    }
    case 3:
      (void)api::ParseDetokenizeRequest(body);
      break;
  }
  return 0;
}
