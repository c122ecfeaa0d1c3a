// Certificates for TLS tests, made at test time with the openssl CLI: a CA,
// a server certificate and a client certificate it signs, and a second,
// unknown CA with a client certificate of its own. EC P-256 keys, valid for
// two days.
#ifndef TANDEM_TESTS_TESTING_TLS_FILES_H_
#define TANDEM_TESTS_TESTING_TLS_FILES_H_

#include <string>

#include "absl/status/statusor.h"

namespace tandem::testing {

// Paths of PEM files.
struct TlsFiles {
  std::string ca_cert;
  // For "localhost" and 127.0.0.1, signed by ca_cert.
  std::string server_cert;
  std::string server_key;
  // A client's, signed by ca_cert.
  std::string client_cert;
  std::string client_key;
  // A CA nobody trusts, and a client certificate it signed.
  std::string unknown_ca_cert;
  std::string unknown_client_cert;
  std::string unknown_client_key;
};

// Writes the files into `dir` (created if missing). INTERNAL with openssl's
// output when a command fails.
absl::StatusOr<TlsFiles> MakeTlsFiles(const std::string& dir);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TESTING_TLS_FILES_H_
