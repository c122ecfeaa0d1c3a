#include "common/rpc/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain to serve gRPC with over TLS (with --tls_key); empty = plain "
          "gRPC");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert (unencrypted)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificate(s): clients must present a certificate signed by it (mutual "
          "TLS); needs --tls_cert and --tls_key");

namespace tandem::rpc {

TlsConfig ServerTlsFromFlags() {
  TlsConfig config;
  config.cert_file = absl::GetFlag(FLAGS_tls_cert);
  config.key_file = absl::GetFlag(FLAGS_tls_key);
  config.ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  config.require_client_cert = !config.ca_file.empty();
  return config;
}

}  // namespace tandem::rpc
