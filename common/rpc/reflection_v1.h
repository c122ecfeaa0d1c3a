// grpc.reflection.v1.ServerReflection over the process's generated
// descriptor pool: what grpcurl, grpcui and Postman ask a server first.
// gRPC 1.51's reflection library serves only v1alpha (which every server
// keeps too); the answers here are the same, under the v1 names.
//
// Each call answers its requests one at a time, in order, on gRPC's
// callback threads: a lookup in the descriptor pool, never a wait.
#ifndef TANDEM_COMMON_RPC_REFLECTION_V1_H_
#define TANDEM_COMMON_RPC_REFLECTION_V1_H_

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace tandem::rpc {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  // The full names list_services answers: complete before the first call
  // (StartServer fills them in as the server starts).
  std::vector<std::string>* mutable_services() { return &services_; }

  grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest,
                          grpc::reflection::v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

  // The answer to one request.
  grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request) const;

 private:
  std::vector<std::string> services_;
};

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_RPC_REFLECTION_V1_H_
