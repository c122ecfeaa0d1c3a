#include "common/rpc/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::rpc {
namespace {

// PEM files are a few KiB; anything this large is not one.
constexpr size_t kMaxPemBytes = 1 << 20;

std::string Named(const std::string& flag, const std::string& path) {
  return absl::StrCat(flag, " file '", path, "'");
}

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    return absl::NotFoundError(
        absl::StrCat("cannot read ", Named(flag, path), ": ", std::strerror(err)));
  }
  std::string data;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0 && data.size() <= kMaxPemBytes) {
    data.append(buf, n);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) {
    return absl::NotFoundError(absl::StrCat("cannot read ", Named(flag, path)));
  }
  if (data.size() > kMaxPemBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(flag, path), " is over ", kMaxPemBytes, " bytes: it is not a PEM file"));
  }
  return data;
}

// OpenSSL's reason for the last failure, and its error queue cleared.
std::string OpenSslReason() {
  const unsigned long code = ERR_peek_last_error();
  ERR_clear_error();
  if (code == 0) return "no PEM block found";
  const char* reason = ERR_reason_error_string(code);
  return reason != nullptr ? reason : "unknown OpenSSL error";
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioDeleter>;
using Cert = std::unique_ptr<X509, X509Deleter>;
using Key = std::unique_ptr<EVP_PKEY, KeyDeleter>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of `pem`, after checking that every PEM block of it
// parses as one.
absl::StatusOr<Cert> ParseCertificates(const std::string& flag, const std::string& path,
                                       const std::string& pem) {
  ERR_clear_error();
  Bio bio = MemoryBio(pem);
  Cert first(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (first == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(flag, path), " holds no valid PEM certificate (", OpenSslReason(), ")"));
  }
  while (Cert next{PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)}) {
  }
  const unsigned long end = ERR_peek_last_error();
  if (end != 0 && ERR_GET_REASON(end) != PEM_R_NO_START_LINE) {
    return absl::InvalidArgumentError(absl::StrCat(
        Named(flag, path), " holds a malformed PEM certificate (", OpenSslReason(), ")"));
  }
  ERR_clear_error();
  return first;
}

// OpenSSL asks for a passphrase through this; there is none to give.
int NoPassphrase(char*, int, int, void*) { return -1; }

absl::StatusOr<Key> ParseKey(const std::string& flag, const std::string& path,
                             const std::string& pem) {
  ERR_clear_error();
  Bio bio = MemoryBio(pem);
  Key key(PEM_read_bio_PrivateKey(bio.get(), nullptr, &NoPassphrase, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        Named(flag, path), " holds no valid unencrypted PEM private key (", OpenSslReason(), ")"));
  }
  return key;
}

struct KeyCertPair {
  std::string cert_pem;
  std::string key_pem;
};

// The certificate and key files of `config`, checked to belong together;
// nullopt when neither is named.
absl::StatusOr<std::optional<KeyCertPair>> LoadKeyCertPair(const TlsConfig& config) {
  const TlsFlagNames& f = config.flags;
  if (config.cert_file.empty() != config.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.cert, " and ", f.key, " go together: pass both, or neither"));
  }
  if (config.cert_file.empty()) return std::optional<KeyCertPair>();
  KeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_pem, ReadPem(f.cert, config.cert_file));
  ASSIGN_OR_RETURN(pair.key_pem, ReadPem(f.key, config.key_file));
  ASSIGN_OR_RETURN(const Cert cert, ParseCertificates(f.cert, config.cert_file, pair.cert_pem));
  ASSIGN_OR_RETURN(const Key key, ParseKey(f.key, config.key_file, pair.key_pem));
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("the private key in ", Named(f.key, config.key_file),
                     " does not belong to the certificate in ", Named(f.cert, config.cert_file)));
  }
  return std::optional<KeyCertPair>(std::move(pair));
}

absl::StatusOr<std::string> LoadCa(const TlsConfig& config) {
  if (config.ca_file.empty()) return std::string();
  ASSIGN_OR_RETURN(std::string pem, ReadPem(config.flags.ca, config.ca_file));
  RETURN_IF_ERROR(ParseCertificates(config.flags.ca, config.ca_file, pem).status());
  return pem;
}

}  // namespace

TlsFlagNames WorkerClientTlsFlags() {
  return TlsFlagNames{
      .cert = "--worker_tls_cert", .key = "--worker_tls_key", .ca = "--worker_tls_ca"};
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsConfig& config) {
  const TlsFlagNames& f = config.flags;
  if (!config.enabled()) {
    if (config.require_client_cert) {
      return absl::InvalidArgumentError(
          absl::StrCat("client certificates can only be required over TLS: pass ", f.cert, ", ",
                       f.key, " and ", f.ca));
    }
    return grpc::InsecureServerCredentials();
  }
  ASSIGN_OR_RETURN(std::optional<KeyCertPair> pair, LoadKeyCertPair(config));
  if (!pair.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.ca, " needs the server's own certificate and key: pass ", f.cert, " and ", f.key));
  }
  if (config.require_client_cert && config.ca_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("requiring client certificates needs the CA that signs them: pass ", f.ca));
  }
  ASSIGN_OR_RETURN(std::string ca, LoadCa(config));

  grpc_ssl_client_certificate_request_type request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  if (config.require_client_cert) {
    request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  } else if (!ca.empty()) {
    request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  grpc::SslServerCredentialsOptions options(request);
  options.pem_root_certs = std::move(ca);
  options.pem_key_cert_pairs.push_back(
      grpc::SslServerCredentialsOptions::PemKeyCertPair{pair->key_pem, pair->cert_pem});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<ChannelSecurity> MakeChannelSecurity(const TlsConfig& config) {
  ChannelSecurity security;
  if (!config.enabled()) {
    security.credentials = grpc::InsecureChannelCredentials();
    return security;
  }
  ASSIGN_OR_RETURN(std::optional<KeyCertPair> pair, LoadKeyCertPair(config));
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, LoadCa(config));
  if (pair.has_value()) {
    options.pem_private_key = std::move(pair->key_pem);
    options.pem_cert_chain = std::move(pair->cert_pem);
  }
  security.credentials = grpc::SslCredentials(options);
  security.tls = true;
  security.target_name_override = config.target_name_override;
  return security;
}

}  // namespace tandem::rpc
