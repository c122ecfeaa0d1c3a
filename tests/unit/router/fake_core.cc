#include "tests/unit/router/fake_core.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::router::testing {

void FakeHandle::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

bool FakeHandle::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool FakeHandle::WaitCancelled(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&cancelled_), timeout);
}

FakeCore::FakeCore() = default;

FakeCore::~FakeCore() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void FakeCore::SetScript(Script script) {
  absl::MutexLock lock(&mu_);
  script_ = std::move(script);
}

std::shared_ptr<FakeCore::Call> FakeCore::NextCall(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto some = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !pending_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&some), timeout)) return nullptr;
  std::shared_ptr<Call> call = pending_.front();
  pending_.erase(pending_.begin());
  return call;
}

std::vector<GenerateParams> FakeCore::submitted() const {
  absl::MutexLock lock(&mu_);
  return submitted_;
}

void FakeCore::set_serving(bool serving) {
  absl::MutexLock lock(&mu_);
  serving_ = serving;
}

std::shared_ptr<RequestHandle> FakeCore::Submit(GenerateParams params,
                                                std::shared_ptr<ResponseSink> sink) {
  auto call = std::make_shared<Call>();
  call->params = std::move(params);
  call->sink = std::move(sink);
  call->handle = std::make_shared<FakeHandle>();
  absl::MutexLock lock(&mu_);
  submitted_.push_back(call->params);
  if (script_) {
    threads_.emplace_back([call, script = script_] { script(call->params, *call->sink); });
  } else {
    pending_.push_back(call);
  }
  return call->handle;
}

ServedModelInfo FakeCore::ModelInfo() const {
  return {.id = "fake-model", .created_unix = 1700000000, .max_context = 128, .vocab_size = 257};
}

absl::StatusOr<std::vector<int32_t>> FakeCore::Tokenize(const std::string& text,
                                                        bool add_special_tokens) const {
  std::vector<int32_t> ids;
  if (add_special_tokens) ids.push_back(kFakeBos);
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

absl::StatusOr<std::vector<int32_t>> FakeCore::TokenizeChat(const std::vector<ChatTurn>& messages,
                                                            bool add_generation_prompt) const {
  std::string text;
  for (const ChatTurn& t : messages) absl::StrAppend(&text, t.role, ": ", t.content, "\n");
  if (add_generation_prompt) text += "assistant: ";
  return Tokenize(text, /*add_special_tokens=*/false);
}

absl::StatusOr<std::string> FakeCore::Detokenize(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id < 0 || id > kFakeBos) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not in the vocabulary"));
    }
    if (id != kFakeBos) text += static_cast<char>(id);
  }
  return text;
}

bool FakeCore::Serving() const {
  absl::MutexLock lock(&mu_);
  return serving_;
}

GenerateEvent TokensEvent(int index, std::string text, std::vector<TokenLogprob> logprobs) {
  GenerateEvent e;
  e.kind = GenerateEvent::Kind::kTokens;
  e.index = index;
  for (char c : text) e.token_ids.push_back(static_cast<unsigned char>(c));
  e.text = std::move(text);
  e.logprobs = std::move(logprobs);
  return e;
}

GenerateEvent FinishedEvent(int index, FinishReason reason, int prompt_tokens,
                            int completion_tokens) {
  GenerateEvent e;
  e.kind = GenerateEvent::Kind::kFinished;
  e.index = index;
  e.finish_reason = reason;
  e.prompt_tokens = prompt_tokens;
  e.completion_tokens = completion_tokens;
  return e;
}

}  // namespace tandem::router::testing
