// A router (WorkerRegistry + RouterService on a real gRPC server) in front
// of fake prefill and decode workers, all in one process on 127.0.0.1.
#ifndef TANDEM_TESTS_UNIT_ROUTER_ROUTER_HARNESS_H_
#define TANDEM_TESTS_UNIT_ROUTER_ROUTER_HARNESS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/chat/chat_template.h"
#include "common/rpc/server.h"
#include "common/tokenizer/tokenizer.h"
#include "router/router_core.h"
#include "router/router_service.h"
#include "router/worker_registry.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "tests/unit/router/fake_workers.h"

namespace tandem::router::testing {

struct HarnessOptions {
  int prefill = 2;
  int decode = 1;
  RouterCoreOptions router = {};
  // Checks every Generate call (API keys); empty = none.
  Authorizer authorize = nullptr;
  // The router's chat template; null = the plain default one, unless
  // no_chat_template.
  const ChatTemplate* chat_template = nullptr;
  bool no_chat_template = false;
  // Null: the harness's FakeTokenizer. Set `no_tokenizer` for none.
  const Tokenizer* tokenizer = nullptr;
  bool no_tokenizer = false;
  // The vocabulary the fake workers report.
  int vocab_size = kFakeVocab;
};

// What one Generate stream returned.
struct Result {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<v1::GenerateResponse> messages;
  v1::Finished finished;
};

class RouterHarness {
 public:
  explicit RouterHarness(HarnessOptions options);
  ~RouterHarness();

  // Starts everything and waits (bounded) until every worker is routable.
  absl::Status Start();

  FakePrefillWorker& prefill(int i) { return *prefill_[i]; }
  FakeDecodeWorker& decode(int i) { return *decode_[i]; }
  const std::string& prefill_address(int i) const { return prefill_addresses_[i]; }
  const std::string& decode_address(int i) const { return decode_addresses_[i]; }
  // Index of the prefill (decode) worker the policy tries first when all
  // are equally loaded: the lowest address.
  int FirstPrefill() const;
  int FirstDecode() const;
  void StopDecodeServer(int i);

  WorkerRegistry& registry() { return *registry_; }
  RouterCore& core() { return *core_; }
  v1::Router::Stub& stub() { return *stub_; }
  // The router's port on 127.0.0.1.
  int port() const { return router_server_.port; }

  // Runs one Generate stream to its end (bounded by `timeout`).
  Result Run(const v1::GenerateRequest& request, absl::Duration timeout = absl::Seconds(20));

 private:
  HarnessOptions options_;
  FakeTokenizer fake_tokenizer_;
  ChatTemplate chat_template_;
  std::vector<std::unique_ptr<FakePrefillWorker>> prefill_;
  std::vector<std::unique_ptr<FakeDecodeWorker>> decode_;
  std::vector<rpc::RunningServer> prefill_servers_;
  std::vector<rpc::RunningServer> decode_servers_;
  std::vector<std::string> prefill_addresses_;
  std::vector<std::string> decode_addresses_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<RouterCore> core_;
  std::unique_ptr<RouterService> service_;
  rpc::RunningServer router_server_;
  std::unique_ptr<v1::Router::Stub> stub_;
};

// A request for `ids` (token-id prompt).
v1::GenerateRequest TokenRequest(std::vector<int32_t> ids, int max_tokens);

}  // namespace tandem::router::testing

#endif  // TANDEM_TESTS_UNIT_ROUTER_ROUTER_HARNESS_H_
