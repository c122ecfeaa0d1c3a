// Scaling the pools' Deployments through the Kubernetes API: the planner's
// apply mode in a cluster. Only the scale subresource of the named
// Deployments is read (GET) and changed (PATCH spec.replicas), which is all
// the chart's Role grants (deploy/helm/tandem/templates/planner.yaml).
#ifndef TANDEM_PLANNER_KUBE_SCALE_H_
#define TANDEM_PLANNER_KUBE_SCALE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tandem::planner {

// An API server's address, parsed: cpp-httplib's own URL parsing takes
// neither hex IPv6 addresses nor a trailing slash.
struct ServerUrl {
  bool tls = false;
  std::string host;  // an IPv6 address without its brackets
  int port = 0;
};
// https://HOST[:PORT] (443) or http://HOST[:PORT] (80), an IPv6 HOST in
// brackets, at most a trailing '/'. INVALID_ARGUMENT saying the form.
absl::StatusOr<ServerUrl> ParseServerUrl(absl::string_view url);

struct KubeApi {
  // https://HOST:PORT of the API server (http:// only for tests).
  std::string server = "";
  std::string kube_namespace = "";
  // The ServiceAccount token, read again for every call: projected tokens
  // are rotated while the pod runs. Empty: no Authorization header.
  std::string token_file = "";
  // The CA that signed the API server's certificate; empty: the system's.
  std::string ca_file = "";
  absl::Duration timeout = absl::Seconds(10);
};

// The API as a pod sees it: KUBERNETES_SERVICE_HOST and _PORT, and the
// ServiceAccount's token, ca.crt and namespace under
// /var/run/secrets/kubernetes.io/serviceaccount. FAILED_PRECONDITION saying
// what is missing outside a pod (or with automountServiceAccountToken off).
absl::StatusOr<KubeApi> InClusterApi(
    const std::string& account_dir = "/var/run/secrets/kubernetes.io/serviceaccount");

// Thread-compatible: the planner's loop owns it; its calls block on the
// Kubernetes API, within the KubeApi's timeout.
class DeploymentScaler {
 public:
  explicit DeploymentScaler(KubeApi api) : api_(std::move(api)) {}

  // The Deployment's spec.replicas.
  absl::StatusOr<int> Replicas(const std::string& deployment) const;
  // Sets the Deployment's spec.replicas (a merge patch of its scale).
  absl::Status Scale(const std::string& deployment, int replicas) const;

 private:
  KubeApi api_;
};

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_KUBE_SCALE_H_
