// Starting a gRPC server the way every tandem service runs one: the
// standard health service (grpc.health.v1) and server reflection enabled,
// plain or TLS (common/rpc/tls.h), the port reported back (so that port 0
// picks a free one), and a graceful drain on SIGTERM.
#ifndef TANDEM_COMMON_RPC_SERVER_H_
#define TANDEM_COMMON_RPC_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/tls.h"

namespace tandem::rpc {

struct ServerOptions {
  // host:port; port 0 picks a free port.
  std::string address = "127.0.0.1:0";
  // Largest message accepted, in bytes.
  int max_message_bytes = 64 << 20;
  // TLS for the listener (mutual TLS with tls.require_client_cert); plain
  // gRPC when it names no file.
  TlsConfig tls = {};
};

class ReflectionV1Service;

// A started server. SetServing may be called from any thread.
struct RunningServer {
  // grpc.reflection.v1 (v1alpha comes from gRPC's library); declared before
  // the server, which must go first.
  std::shared_ptr<ReflectionV1Service> reflection_v1;
  std::unique_ptr<grpc::Server> server;
  // The port actually bound.
  int port = 0;
  // The full names of the services registered ("tandem.v1.DecodeWorker"),
  // which grpc.health.v1 reports SERVING once the server has started.
  std::vector<std::string> services;

  // The health of the server ("" service) and of every service it reports
  // (draining: false).
  void SetServing(bool serving);
  // The health grpc.health.v1 reports for `service` alone, e.g. the router
  // NOT_SERVING while it has no routable decode worker.
  void SetServing(const std::string& service, bool serving);
};

// Builds and starts a server for `services` (which must outlive it); the
// server and each of its services report SERVING. UNAVAILABLE naming the
// address when it cannot be bound; the errors of MakeServerCredentials for
// options.tls.
absl::StatusOr<RunningServer> StartServer(const ServerOptions& options,
                                          const std::vector<grpc::Service*>& services);

// A channel to `target` (host:port or a DNS name:port) with tandem's
// message limits and keepalive settings: plain gRPC, or as `security` says
// (see MakeChannelSecurity).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target);
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ChannelSecurity& security);

// Blocks SIGTERM and SIGINT in the calling thread and every thread it
// creates afterwards (call it first in main), so that WaitForSignal can
// take them synchronously.
void BlockTerminationSignals();
// Waits up to `timeout` for SIGTERM or SIGINT; returns the signal number,
// or 0 on timeout.
int WaitForSignal(absl::Duration timeout);
// Waits for SIGTERM or SIGINT, however long it takes (a server's main thread
// has nothing else to do); returns the signal number.
int WaitForTerminationSignal();

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_RPC_SERVER_H_
