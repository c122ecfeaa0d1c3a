// tokenizer_config.json as the chat template reads it (the special tokens
// and the "chat_template" field, a string or a list of named templates),
// then a render of what it gives.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/base/clock.h"
#include "common/chat/chat_template.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tandem::FakeClock clock;
  tandem::ChatTemplate::Options options;
  options.clock = &clock;
  options.time_zone = absl::UTCTimeZone();
  options.limits.max_output_bytes = 16 << 10;
  options.limits.max_steps = 2'000;
  absl::StatusOr<tandem::ChatTemplate> chat =
      tandem::ChatTemplate::FromConfig(std::string(tandem::fuzz::AsText(data, size)), std::nullopt,
                                       "tokenizer_config.json", "chat_template.jinja", options);
  if (!chat.ok()) return 0;
  FUZZ_CHECK(chat->special_tokens().is_object());
  (void)chat->Render({{"system", "s"}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}},
                     /*add_generation_prompt=*/true);
  return 0;
}
