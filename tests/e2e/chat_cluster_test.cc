// Chat through a cluster: a stories260K hub folder with a chat_template.jinja
// that writes BOS, EOS and refuses roles out of turn. The router renders a
// GenerateRequest's messages with that template and encodes the special
// tokens; the tokens through the cluster equal the single-process engine's
// on the same rendered prompt, and the template's refusal reaches the client
// as INVALID_ARGUMENT with its message.
#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/base/logging.h"
#include "common/chat/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster_harness.h"
#include "tests/e2e/hub_folder.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

// BOS, "<role>: <content>" lines, EOS after each assistant turn, and
// "assistant:" to generate; user and assistant must alternate after an
// optional system message.
constexpr char kTemplate[] =
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if not loop.first and m['role'] == messages[loop.index0 - 1]['role'] %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{{ m['role'] ~ ': ' ~ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

v1::GenerateRequest ChatRequest(const std::vector<ChatMessage>& messages, int max_tokens) {
  v1::GenerateRequest r;
  for (const ChatMessage& m : messages) {
    v1::ChatMessage* out = r.mutable_messages()->add_messages();
    out->set_role(m.role);
    out->set_content(m.content);
  }
  r.set_max_tokens(max_tokens);
  return r;
}

TEST(ChatClusterTest, ChatGivesTheEnginesTokensOnTheRenderedPrompt) {
  TANDEM_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  const std::string dir = WriteStoriesHubFolder("stories260K-chat", DType::kF32);
  {
    std::ofstream out(dir + "/chat_template.jinja");
    out << kTemplate;
    ASSERT_TRUE(out.good());
  }
  // The router gets only --model: its tokenizer and template come from there.
  auto cluster =
      Cluster::Start({.prefill = 1, .decode = 1, .model = dir, .router_flags = {"--model=" + dir}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  // What the router must do, in process.
  ASSERT_OK_AND_ASSIGN(ChatTemplate chat_template, ChatTemplate::FromModelDir(dir));
  ASSERT_FALSE(chat_template.is_default());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(dir));
  const std::vector<ChatMessage> chat = {{"system", "You tell short stories."},
                                         {"user", "Tell me about a cat."},
                                         {"assistant", "Once upon a time there was a cat."},
                                         {"user", "What did the cat do next?"}};
  ASSERT_OK_AND_ASSIGN(const std::string text,
                       chat_template.Render(chat, /*add_generation_prompt=*/true));
  ASSERT_OK_AND_ASSIGN(
      const std::vector<int32_t> prompt,
      tokenizer->Encode(text, EncodeOptions{.add_bos = false, .parse_special = true}));
  // The template's <s> and </s> became BOS and EOS ids, not text.
  ASSERT_EQ(prompt.front(), tokenizer->bos_id());
  ASSERT_EQ(std::count(prompt.begin(), prompt.end(), tokenizer->bos_id()), 1);
  ASSERT_EQ(std::count(prompt.begin(), prompt.end(), tokenizer->eos_id()), 1);
  const std::vector<int32_t> want = LocalGreedyTokens(dir, prompt, 40);
  ASSERT_FALSE(want.empty());

  const Completion got = RunGenerate((*cluster)->router(), ChatRequest(chat, 40));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << (*cluster)->Logs();
  EXPECT_EQ(got.tokens, want);
  EXPECT_EQ(got.finished.usage().prompt_tokens(), static_cast<int>(prompt.size()));

  // The template refuses two user turns in a row: INVALID_ARGUMENT with its
  // message, before any worker is involved.
  const Completion refused = RunGenerate(
      (*cluster)->router(), ChatRequest({{"user", "Hello"}, {"user", "Hello again"}}, 4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("roles must alternate"));
  EXPECT_OK((*cluster)->WaitUntilIdle(absl::Seconds(30)));
}

}  // namespace
}  // namespace tandem::testing
