// Chat templates (common/chat through ChatTemplate): parsing the template
// and rendering it with a small conversation, under render limits small
// enough that one input runs in milliseconds.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/base/clock.h"
#include "common/chat/chat_template.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using tandem::jinja::Json;

const Json& Messages() {
  static const Json* messages = new Json(Json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <b>there</b>"},
    {"role": "assistant", "content": [{"type": "text", "text": "Hello"}],
     "tool_calls": [{"type": "function",
                     "function": {"name": "f", "arguments": {"x": 1, "y": [true, null, 2.5]}}}]},
    {"role": "user", "content": "Again\n"}
  ])"));
  return *messages;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tandem::FakeClock clock;
  tandem::ChatTemplate::Options options;
  options.clock = &clock;
  options.time_zone = absl::UTCTimeZone();
  options.limits.max_output_bytes = 16 << 10;
  options.limits.max_steps = 2'000;
  absl::StatusOr<tandem::ChatTemplate> chat =
      tandem::ChatTemplate::FromString(absl::string_view(reinterpret_cast<const char*>(data), size),
                                       "<s>", "</s>", options, "fuzz template");
  if (!chat.ok()) return 0;
  absl::StatusOr<std::string> out =
      chat->RenderJson(Messages(), /*add_generation_prompt=*/true, Json{{"tools", Json::array()}});
  if (out.ok()) FUZZ_CHECK(out->size() <= options.limits.max_output_bytes);
  return 0;
}
