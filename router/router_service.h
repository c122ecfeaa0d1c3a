// RouterService: tandem.v1.Router on gRPC's callback API, a thin adapter
// over the RequestCore: GenerateRequest in, GenerateResponse messages out
// through an rpc::StreamWriter. A client cancel reaches the request's
// handle, which cancels every worker call of the request.
//
// Thread-safe. The core must outlive the service; destroy the service
// after the gRPC server has shut down.
#ifndef TANDEM_ROUTER_ROUTER_SERVICE_H_
#define TANDEM_ROUTER_ROUTER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "router/request_core.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::router {

// Decides whether a call may proceed (API keys): OK, or the status to end
// it with (UNAUTHENTICATED).
using Authorizer = std::function<absl::Status(const grpc::CallbackServerContext&)>;

// The plain request of a GenerateRequest, with the call's deadline.
// INVALID_ARGUMENT for what cannot be mapped (a call's arguments that are
// not a JSON object, an unknown tool_choice); the core's validation checks
// the rest (CheckToolFunctions: the tools' count and names).
absl::StatusOr<GenerateParams> ParamsFromProto(const v1::GenerateRequest& request,
                                               absl::Time deadline);
// The GenerateResponse message of a core event.
v1::GenerateResponse EventToProto(GenerateEvent event);

class RouterService final : public v1::Router::CallbackService {
 public:
  // `authorize` may be empty: every call proceeds.
  // `clock` is the core's: the call's deadline is handed to it as the same
  // time left on that clock.
  explicit RouterService(RequestCore* core, Authorizer authorize = nullptr,
                         const Clock* clock = &Clock::Real());

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;

 private:
  RequestCore* const core_;
  const Authorizer authorize_;
  const Clock* const clock_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROUTER_SERVICE_H_
