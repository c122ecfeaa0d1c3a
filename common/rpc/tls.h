// TLS for tandem's gRPC listeners and channels, from PEM files named by
// flags. Files are read and checked once, at start-up: an unreadable file, a
// file with no PEM certificate or key in it, or a key that does not belong
// to its certificate is an error naming the flag and the file, instead of a
// listener that fails every handshake later.
//
// A server with `ca_file` set verifies client certificates against it
// (mutual TLS); with `require_client_cert` a client without one is refused
// during the handshake. A client with `ca_file` verifies the server's
// certificate against it (else against the system's roots), and presents
// `cert_file` when set.
#ifndef TANDEM_COMMON_RPC_TLS_H_
#define TANDEM_COMMON_RPC_TLS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tandem::rpc {

// The flags a TlsConfig's files came from, named in error messages.
struct TlsFlagNames {
  std::string cert = "--tls_cert";
  std::string key = "--tls_key";
  std::string ca = "--tls_client_ca";
};

struct TlsConfig {
  // PEM certificate chain this side presents (a server's, or a client's for
  // mutual TLS), and its PEM private key. Both or neither.
  std::string cert_file;
  std::string key_file;
  // PEM CA certificates: for a server, the CA client certificates must chain
  // to; for a client, the CA the server's certificate must chain to (empty:
  // the system's roots).
  std::string ca_file;
  // Servers: refuse clients that present no certificate signed by ca_file.
  bool require_client_cert = false;
  // Clients: the name the server's certificate must carry, instead of the
  // target's host (tests whose certificates name "localhost"). Empty: none.
  std::string target_name_override;
  TlsFlagNames flags;

  // Whether any file is named: a server or client without files is plain
  // (insecure) gRPC.
  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// Names of the router's flags for its channels to the workers.
TlsFlagNames WorkerClientTlsFlags();

// The credentials a listener runs with: insecure when !config.enabled().
// INVALID_ARGUMENT when a cert comes without its key (or the reverse), when
// a client CA is named without a server certificate, when
// require_client_cert has no CA to check against, or when a file holds no
// valid PEM certificate / key or the key does not match the certificate;
// NOT_FOUND when a file cannot be read. Messages name the flag and the file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsConfig& config);

// What a client channel is made with.
struct ChannelSecurity {
  // Null: insecure.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Whether `credentials` are TLS.
  bool tls = false;
  std::string target_name_override;
};

// Channel credentials for `config`: insecure when !config.enabled(); the
// same errors as MakeServerCredentials for its files.
absl::StatusOr<ChannelSecurity> MakeChannelSecurity(const TlsConfig& config);

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_RPC_TLS_H_
