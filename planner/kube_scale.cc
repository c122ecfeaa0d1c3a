#include "planner/kube_scale.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace tandem::planner {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::FailedPreconditionError(absl::StrCat("cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(s.str()));
}

std::string ScalePath(const KubeApi& api, const std::string& deployment) {
  return absl::StrCat("/apis/apps/v1/namespaces/", api.kube_namespace, "/deployments/", deployment,
                      "/scale");
}

// What a refusal means for the operator.
absl::Status HttpError(const KubeApi& api, const std::string& deployment, const char* verb,
                       const httplib::Result& r) {
  const std::string what =
      absl::StrCat(verb, " deployments/", deployment, "/scale in namespace ", api.kube_namespace);
  if (!r) {
    return absl::UnavailableError(absl::StrCat("cannot ", what, ": ", api.server,
                                               " did not answer (", httplib::to_string(r.error()),
                                               ")"));
  }
  std::string message = r->body;
  const nlohmann::json body = nlohmann::json::parse(r->body, nullptr, false);
  if (body.is_object() && body.contains("message") && body["message"].is_string()) {
    message = body["message"].get<std::string>();
  }
  switch (r->status) {
    case 401:
      return absl::UnauthenticatedError(absl::StrCat("cannot ", what,
                                                     ": the API server refused the token in ",
                                                     api.token_file, ": ", message));
    case 403:
      return absl::PermissionDeniedError(
          absl::StrCat("cannot ", what,
                       ": the planner's ServiceAccount lacks the right (the chart's planner "
                       "Role grants get and patch on the pools' deployments/scale): ",
                       message));
    case 404:
      return absl::NotFoundError(absl::StrCat(
          "cannot ", what, ": no such Deployment (check --kube_deployments): ", message));
    default:
      return absl::UnavailableError(
          absl::StrCat("cannot ", what, ": HTTP ", r->status, ": ", message));
  }
}

class Client {
 public:
  explicit Client(const KubeApi& api) : client_(api.server) {
    const int64_t ms = absl::ToInt64Milliseconds(api.timeout);
    client_.set_connection_timeout(std::chrono::milliseconds(ms));
    client_.set_read_timeout(std::chrono::milliseconds(ms));
    client_.set_write_timeout(std::chrono::milliseconds(ms));
    if (!api.ca_file.empty()) client_.set_ca_cert_path(api.ca_file.c_str());
  }
  httplib::Client* operator->() { return &client_; }

 private:
  httplib::Client client_;
};

absl::StatusOr<httplib::Headers> AuthHeaders(const KubeApi& api) {
  httplib::Headers headers = {{"Accept", "application/json"}};
  if (api.token_file.empty()) return headers;
  absl::StatusOr<std::string> token = ReadFile(api.token_file);
  if (!token.ok()) return token.status();
  headers.emplace("Authorization", absl::StrCat("Bearer ", *token));
  return headers;
}

absl::StatusOr<int> ReplicasOf(const std::string& body) {
  const nlohmann::json scale = nlohmann::json::parse(body, nullptr, false);
  if (!scale.is_object() || !scale.contains("spec") || !scale["spec"].is_object()) {
    return absl::InternalError(absl::StrCat("the API server's Scale is not one: ", body));
  }
  // A Deployment scaled to zero omits spec.replicas.
  const nlohmann::json& spec = scale["spec"];
  if (!spec.contains("replicas")) return 0;
  if (!spec["replicas"].is_number_integer()) {
    return absl::InternalError(absl::StrCat("the Scale's spec.replicas is not a number: ", body));
  }
  return spec["replicas"].get<int>();
}

}  // namespace

absl::StatusOr<KubeApi> InClusterApi(const std::string& account_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || port == nullptr) {
    return absl::FailedPreconditionError(
        "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: the Kubernetes apply "
        "mode runs in a pod (or give --kube_api)");
  }
  KubeApi api;
  const std::string h = host;
  api.server =
      absl::StrCat("https://", h.find(':') != std::string::npos ? "[" + h + "]" : h, ":", port);
  api.token_file = account_dir + "/token";
  api.ca_file = account_dir + "/ca.crt";
  absl::StatusOr<std::string> ns = ReadFile(account_dir + "/namespace");
  if (!ns.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        ns.status().message(),
        ": the pod has no ServiceAccount token (automountServiceAccountToken is off?)"));
  }
  api.kube_namespace = *ns;
  return api;
}

absl::StatusOr<int> DeploymentScaler::Replicas(const std::string& deployment) const {
  absl::StatusOr<httplib::Headers> headers = AuthHeaders(api_);
  if (!headers.ok()) return headers.status();
  Client client(api_);
  const httplib::Result r = client->Get(ScalePath(api_, deployment), *headers);
  if (!r || r->status != 200) return HttpError(api_, deployment, "get", r);
  return ReplicasOf(r->body);
}

absl::Status DeploymentScaler::Scale(const std::string& deployment, int replicas) const {
  if (replicas < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot scale to ", replicas, " replicas"));
  }
  absl::StatusOr<httplib::Headers> headers = AuthHeaders(api_);
  if (!headers.ok()) return headers.status();
  Client client(api_);
  const std::string patch = nlohmann::json{{"spec", {{"replicas", replicas}}}}.dump();
  const httplib::Result r =
      client->Patch(ScalePath(api_, deployment), *headers, patch, "application/merge-patch+json");
  if (!r || r->status != 200) return HttpError(api_, deployment, "patch", r);
  absl::StatusOr<int> now = ReplicasOf(r->body);
  if (!now.ok()) return now.status();
  if (*now != replicas) {
    return absl::InternalError(absl::StrCat("patched deployments/", deployment, " to ", replicas,
                                            " replicas but its Scale says ", *now));
  }
  return absl::OkStatus();
}

}  // namespace tandem::planner
