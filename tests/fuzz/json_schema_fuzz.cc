// The JSON Schema compiler of structured outputs (a client's schema, sent
// in response_format): whatever the bytes, it compiles or refuses; a
// compiled grammar runs over the same bytes as a candidate output without
// crashing, and what it accepts is JSON.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "common/grammar/automaton.h"
#include "common/grammar/json_schema.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_check.h"

namespace grammar = tandem::grammar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<grammar::Grammar> g = grammar::CompileJsonSchema(text);
  if (!g.ok()) {
    FUZZ_CHECK(g.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(g->Validate().ok());
  grammar::Automaton automaton(std::make_shared<const grammar::Grammar>(*std::move(g)));
  int32_t state = automaton.start();
  // The schema's own text as an output: a schema often accepts itself.
  for (size_t i = 0; i < size && state != grammar::kDeadState; ++i) {
    state = automaton.Step(state, data[i]);
  }
  if (state != grammar::kDeadState && automaton.accepting(state)) {
    FUZZ_CHECK(!nlohmann::json::parse(text, nullptr, false).is_discarded());
  }
  return 0;
}
