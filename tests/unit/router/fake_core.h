// A RequestCore for front-end tests: records what was submitted and lets
// the test (or a script) play the request's events.
//
//   FakeCore core;
//   core.SetScript([](const GenerateParams& p, ResponseSink& sink) {...});
// or, driving by hand:
//   std::shared_ptr<FakeCore::Call> call = core.NextCall();
//   call->sink->OnEvent(...); call->sink->OnDone(absl::OkStatus());
//
// Tokenizer: one id per byte (the byte's value), BOS = 256 first when
// asked; a chat renders as "role: content\n" per turn, "assistant: " last
// with the generation prompt. Ids outside [0, 257) are INVALID_ARGUMENT.
#ifndef TANDEM_TESTS_UNIT_ROUTER_FAKE_CORE_H_
#define TANDEM_TESTS_UNIT_ROUTER_FAKE_CORE_H_

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/request_core.h"

namespace tandem::router::testing {

inline constexpr int32_t kFakeBos = 256;

class FakeHandle : public RequestHandle {
 public:
  void Cancel() override;
  bool cancelled() const;
  // True once Cancel was called, false if `timeout` passed first.
  bool WaitCancelled(absl::Duration timeout = absl::Seconds(30)) const;

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

class FakeCore : public RequestCore {
 public:
  struct Call {
    GenerateParams params;
    std::shared_ptr<ResponseSink> sink;
    std::shared_ptr<FakeHandle> handle;
  };
  // Runs on a thread of its own per request; it must end with OnDone.
  using Script = std::function<void(const GenerateParams&, ResponseSink&)>;

  FakeCore();
  ~FakeCore() override;  // joins the script threads

  void SetScript(Script script);
  // The next call submitted while no script is set (null after `timeout`).
  std::shared_ptr<Call> NextCall(absl::Duration timeout = absl::Seconds(30));
  // Every submitted request's parameters, in order.
  std::vector<GenerateParams> submitted() const;
  void set_serving(bool serving);

  std::shared_ptr<RequestHandle> Submit(GenerateParams params,
                                        std::shared_ptr<ResponseSink> sink) override;
  ServedModelInfo ModelInfo() const override;
  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                bool add_special_tokens) const override;
  absl::StatusOr<std::vector<int32_t>> TokenizeChat(const std::vector<ChatTurn>& messages,
                                                    bool add_generation_prompt) const override;
  absl::StatusOr<std::string> Detokenize(const std::vector<int32_t>& ids) const override;
  bool Serving() const override;

 private:
  mutable absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Call>> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<GenerateParams> submitted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  bool serving_ ABSL_GUARDED_BY(mu_) = true;
};

// Events for scripts.
GenerateEvent TokensEvent(int index, std::string text, std::vector<TokenLogprob> logprobs = {});
GenerateEvent FinishedEvent(int index, FinishReason reason, int prompt_tokens,
                            int completion_tokens);

}  // namespace tandem::router::testing

#endif  // TANDEM_TESTS_UNIT_ROUTER_FAKE_CORE_H_
