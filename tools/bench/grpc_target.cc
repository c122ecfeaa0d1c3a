// tandem.v1.Router/Generate with the synchronous streaming client: each
// call blocks its (caller's) thread, which keeps per-token timing simple.
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "tools/bench/target.h"

namespace tandem::bench {
namespace {

class GrpcTarget : public Target {
 public:
  GrpcTarget(const std::string& address, const TargetOptions& options)
      : options_(options), stub_(v1::Router::NewStub(rpc::MakeChannel(address))) {}

  bool WantsTokenIds() const override { return true; }

  RequestRecord Send(const BenchRequest& request) override {
    v1::GenerateRequest req;
    if (request.token_ids.empty()) {
      req.set_text(request.prompt);
    } else {
      req.mutable_token_ids()->mutable_ids()->Assign(request.token_ids.begin(),
                                                     request.token_ids.end());
    }
    req.set_max_tokens(request.max_tokens);
    req.set_ignore_eos(options_.ignore_eos);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1e3)));
    StreamTimer timer;
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse response;
    v1::Finished finished;
    bool has_finished = false;
    while (reader->Read(&response)) {
      timer.OnTokens(response.token_ids_size());
      if (response.has_finished()) {
        finished = response.finished();
        has_finished = true;
      }
    }
    const grpc::Status status = reader->Finish();
    RequestRecord r;
    timer.Finish(r);
    r.prompt_tokens =
        request.token_ids.empty() ? request.prompt_len : static_cast<int>(request.token_ids.size());
    if (has_finished && finished.usage().prompt_tokens() > 0) {
      r.prompt_tokens = finished.usage().prompt_tokens();
    }
    if (!status.ok()) {
      r.error = absl::StrCat(absl::StatusCodeToString(rpc::FromGrpc(status).code()), ": ",
                             status.error_message());
    } else if (timer.tokens() == 0) {
      // vLLM counts a stream without tokens as failed (no TTFT to measure).
      r.error = absl::StrCat("the stream ended without tokens (finish ",
                             v1::FinishReason_Name(finished.reason()), ")");
    } else {
      r.success = true;
    }
    return r;
  }

 private:
  TargetOptions options_;
  std::unique_ptr<v1::Router::Stub> stub_;
};

}  // namespace

std::unique_ptr<Target> MakeGrpcTarget(const std::string& address, const TargetOptions& options) {
  return std::make_unique<GrpcTarget>(address, options);
}

}  // namespace tandem::bench
