#include "common/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/impl/server_initializer.h>
#include <signal.h>

#include <cerrno>
#include <ctime>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/rpc/reflection_v1.h"

namespace tandem::rpc {
namespace {

// Copies the names of the services a server was built with (gRPC offers
// them only to builder plugins): all of them into `all`, and into `ours`
// all but gRPC's own (health, reflection).
class ServiceNamesPlugin final : public grpc::ServerBuilderPlugin {
 public:
  ServiceNamesPlugin(std::vector<std::string>* ours, std::vector<std::string>* all)
      : ours_(ours), all_(all) {}
  std::string name() override { return "tandem_service_names"; }
  void InitServer(grpc::ServerInitializer*) override {}
  void Finish(grpc::ServerInitializer* si) override {
    for (const std::string& service : *si->GetServiceList()) {
      all_->push_back(service);
      if (!absl::StartsWith(service, "grpc.")) ours_->push_back(service);
    }
  }
  void ChangeArguments(const std::string&, void*) override {}

 private:
  std::vector<std::string>* ours_;
  std::vector<std::string>* all_;
};

class ServiceNamesOption final : public grpc::ServerBuilderOption {
 public:
  ServiceNamesOption(std::vector<std::string>* ours, std::vector<std::string>* all)
      : ours_(ours), all_(all) {}
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->push_back(std::make_unique<ServiceNamesPlugin>(ours_, all_));
  }

 private:
  std::vector<std::string>* ours_;
  std::vector<std::string>* all_;
};

}  // namespace

void RunningServer::SetServing(bool serving) {
  if (server == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(serving);
}

void RunningServer::SetServing(const std::string& service, bool serving) {
  if (server == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(service, serving);
}

absl::StatusOr<RunningServer> StartServer(const ServerOptions& options,
                                          const std::vector<grpc::Service*>& services) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeServerCredentials(options.tls));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  RunningServer running;
  builder.AddListeningPort(options.address, std::move(credentials), &running.port);
  running.reflection_v1 = std::make_shared<ReflectionV1Service>();
  builder.SetOption(std::make_unique<ServiceNamesOption>(
      &running.services, running.reflection_v1->mutable_services()));
  builder.RegisterService(running.reflection_v1.get());
  // gRPC sets SO_REUSEPORT by default: a second server on a taken port would
  // silently share it. A taken port must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (grpc::Service* service : services) builder.RegisterService(service);
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.address,
        ": the address is malformed or in use; pass another --listen address or port"));
  }
  running.SetServing(true);
  for (const std::string& service : running.services) running.SetServing(service, true);
  return running;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target) {
  return MakeChannel(target, ChannelSecurity{});
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ChannelSecurity& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  // Notice a dead peer within seconds even on an idle connection.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly after a worker restarts.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  if (!security.target_name_override.empty()) {
    args.SetSslTargetNameOverride(security.target_name_override);
  }
  return grpc::CreateCustomChannel(
      target,
      security.credentials != nullptr ? security.credentials : grpc::InsecureChannelCredentials(),
      args);
}

namespace {
sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}
}  // namespace

void BlockTerminationSignals() {
  sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForSignal(absl::Duration timeout) {
  sigset_t set = TerminationSignals();
  timespec ts = absl::ToTimespec(timeout);
  int sig = sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

int WaitForTerminationSignal() {
  int sig = 0;
  while (sig == 0) sig = WaitForSignal(absl::Seconds(1));
  return sig;
}

}  // namespace tandem::rpc
