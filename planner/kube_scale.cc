#include "planner/kube_scale.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/base/status_macros.h"
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

// A client for the API server's URL: TLS (verifying the server against
// the CA) for https, plain for http.
absl::StatusOr<std::unique_ptr<httplib::ClientImpl>> Connect(const KubeApi& api) {
  ASSIGN_OR_RETURN(const ServerUrl url, ParseServerUrl(api.server));
  std::unique_ptr<httplib::ClientImpl> client;
  if (url.tls) {
    auto tls = std::make_unique<httplib::SSLClient>(url.host, url.port);
    tls->enable_server_certificate_verification(true);
    if (!api.ca_file.empty()) tls->set_ca_cert_path(api.ca_file.c_str());
    client = std::move(tls);
  } else {
    client = std::make_unique<httplib::ClientImpl>(url.host, url.port);
  }
  const int64_t ms = absl::ToInt64Milliseconds(api.timeout);
  client->set_connection_timeout(std::chrono::milliseconds(ms));
  client->set_read_timeout(std::chrono::milliseconds(ms));
  client->set_write_timeout(std::chrono::milliseconds(ms));
  return client;
}

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

absl::StatusOr<ServerUrl> ParseServerUrl(absl::string_view url) {
  const absl::Status bad = absl::InvalidArgumentError(absl::StrCat(
      "the API server's URL '", url,
      "' is not https://HOST[:PORT] or http://HOST[:PORT] (an IPv6 HOST in brackets; no path)"));
  ServerUrl out;
  absl::string_view rest = url;
  if (absl::ConsumePrefix(&rest, "https://")) {
    out.tls = true;
    out.port = 443;
  } else if (absl::ConsumePrefix(&rest, "http://")) {
    out.port = 80;
  } else {
    return bad;
  }
  absl::ConsumeSuffix(&rest, "/");
  absl::string_view port;
  if (absl::ConsumePrefix(&rest, "[")) {
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos || close == 0) return bad;
    out.host = std::string(rest.substr(0, close));
    rest.remove_prefix(close + 1);
    if (!rest.empty() && !absl::ConsumePrefix(&rest, ":")) return bad;
    port = rest;
  } else {
    const size_t colon = rest.find(':');
    out.host = std::string(rest.substr(0, colon));
    if (colon != absl::string_view::npos) port = rest.substr(colon + 1);
  }
  if (out.host.empty() || out.host.find('/') != std::string::npos) return bad;
  if (!port.empty() && (!absl::SimpleAtoi(port, &out.port) || out.port <= 0 || out.port > 65535)) {
    return bad;
  }
  return out;
}

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
  ASSIGN_OR_RETURN(const std::unique_ptr<httplib::ClientImpl> client, Connect(api_));
  const httplib::Result r = client->Get(ScalePath(api_, deployment).c_str(), *headers);
  if (!r || r->status != 200) return HttpError(api_, deployment, "get", r);
  return ReplicasOf(r->body);
}

absl::Status DeploymentScaler::Scale(const std::string& deployment, int replicas) const {
  if (replicas < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot scale to ", replicas, " replicas"));
  }
  absl::StatusOr<httplib::Headers> headers = AuthHeaders(api_);
  if (!headers.ok()) return headers.status();
  ASSIGN_OR_RETURN(const std::unique_ptr<httplib::ClientImpl> client, Connect(api_));
  const std::string patch = nlohmann::json{{"spec", {{"replicas", replicas}}}}.dump();
  const httplib::Result r = client->Patch(ScalePath(api_, deployment).c_str(), *headers, patch,
                                          "application/merge-patch+json");
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
