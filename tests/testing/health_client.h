// A client of grpc.health.v1.Health/Check for tests (gRPC's generated health
// code is not installed: the two messages are encoded by hand).
#ifndef TANDEM_TESTS_TESTING_HEALTH_CLIENT_H_
#define TANDEM_TESTS_TESTING_HEALTH_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::testing {

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// The status the server reports for `service` ("" = the server as a whole);
// the call's error otherwise (NOT_FOUND for a service it does not know).
absl::StatusOr<ServingStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                          const std::string& service,
                                          absl::Duration timeout = absl::Seconds(10));

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TESTING_HEALTH_CLIENT_H_
