// The gRPC WorkerChannel: calls to a worker on gRPC's callback client API,
// so that no thread waits on them. Each call owns its ClientContext,
// request and response until gRPC is done with them; callbacks run on
// gRPC's threads. Deadlines are on the router's clock, and given to gRPC
// as the same time left on the wall clock.
#ifndef TANDEM_ROUTER_GRPC_WORKER_CHANNEL_H_
#define TANDEM_ROUTER_GRPC_WORKER_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/rpc/tls.h"
#include "router/worker_channel.h"

namespace tandem::router {

// A channel to the worker at `address` ("ip:port"): plain gRPC unless
// `security` says otherwise. Over TLS the worker's certificate must name
// the host of `target` (the name the router was given, e.g. a headless
// Service's DNS name, not the resolved pod IP) unless `security` overrides
// the name.
std::unique_ptr<WorkerChannel> NewGrpcWorkerChannel(const std::string& address,
                                                    const std::string& target, WorkerRole role,
                                                    const rpc::ChannelSecurity& security,
                                                    const Clock* clock = &Clock::Real());

// The registry's factory of gRPC channels with `tls` (the router's
// --worker_tls_* flags): plain gRPC when it names no file; the errors of
// rpc::MakeChannelSecurity.
absl::StatusOr<WorkerChannelFactory> GrpcWorkerChannels(const rpc::TlsConfig& tls = {},
                                                        const Clock* clock = &Clock::Real());

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_GRPC_WORKER_CHANNEL_H_
