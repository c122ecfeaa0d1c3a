#include "tests/testing/tls_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/testing/child_process.h"

namespace tandem::testing {
namespace {

class OpenSsl {
 public:
  explicit OpenSsl(std::string dir) : dir_(std::move(dir)), log_(dir_ + "/openssl.log") {}

  absl::Status Run(std::vector<std::string> args) {
    args.insert(args.begin(), "openssl");
    Child child(args, log_);
    const int code = child.Wait(absl::Seconds(60));
    if (code == 0) return absl::OkStatus();
    std::ifstream in(log_);
    std::stringstream out;
    out << in.rdbuf();
    return absl::InternalError(
        absl::StrCat("'", absl::StrJoin(args, " "), "' exited with ", code, ":\n", out.str()));
  }

  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

  // A self-signed CA: <name>.pem and <name>.key.
  absl::Status Ca(const std::string& name) {
    return Run({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-days", "2", "-subj", "/CN=" + name, "-keyout", Path(name + ".key"),
                "-out", Path(name + ".pem")});
  }

  // A leaf certificate <name>.pem (key <name>.key) signed by CA `ca`.
  absl::Status Leaf(const std::string& name, const std::string& ca, const std::string& usage) {
    const std::string ext = Path(name + ".ext");
    std::ofstream(ext) << "basicConstraints=critical,CA:FALSE\n"
                       << "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                       << "extendedKeyUsage=" << usage << "\n";
    if (absl::Status s = Run({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                              "-nodes", "-subj", "/CN=" + name, "-keyout", Path(name + ".key"),
                              "-out", Path(name + ".csr")});
        !s.ok()) {
      return s;
    }
    return Run({"x509", "-req", "-in", Path(name + ".csr"), "-CA", Path(ca + ".pem"), "-CAkey",
                Path(ca + ".key"), "-CAcreateserial", "-days", "2", "-extfile", ext, "-out",
                Path(name + ".pem")});
  }

 private:
  std::string dir_;
  std::string log_;
};

}  // namespace

absl::StatusOr<TlsFiles> MakeTlsFiles(const std::string& dir) {
  std::filesystem::create_directories(dir);
  OpenSsl ssl(dir);
  for (absl::Status s : {ssl.Ca("ca"), ssl.Leaf("localhost", "ca", "serverAuth"),
                         ssl.Leaf("client", "ca", "clientAuth"), ssl.Ca("unknown-ca"),
                         ssl.Leaf("unknown-client", "unknown-ca", "clientAuth")}) {
    if (!s.ok()) return s;
  }
  TlsFiles files;
  files.ca_cert = ssl.Path("ca.pem");
  files.server_cert = ssl.Path("localhost.pem");
  files.server_key = ssl.Path("localhost.key");
  files.client_cert = ssl.Path("client.pem");
  files.client_key = ssl.Path("client.key");
  files.unknown_ca_cert = ssl.Path("unknown-ca.pem");
  files.unknown_client_cert = ssl.Path("unknown-client.pem");
  files.unknown_client_key = ssl.Path("unknown-client.key");
  return files;
}

}  // namespace tandem::testing
