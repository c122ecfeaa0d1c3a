#include "router/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem::router {

ApiKeys::Digest ApiKeys::Sha256(absl::string_view data) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), d.data());
  return d;
}

absl::Status ApiKeys::Add(absl::string_view key, absl::string_view where) {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": an API key is empty"));
  if (key.size() > kMaxApiKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": an API key is longer than ", kMaxApiKeyBytes, " bytes"));
  }
  for (char c : key) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": an API key holds a space or a control character"));
    }
  }
  digests_.push_back(Sha256(key));
  return absl::OkStatus();
}

absl::StatusOr<ApiKeys> ApiKeys::Create(const std::vector<std::string>& keys,
                                        const std::string& file) {
  ApiKeys out;
  for (const std::string& key : keys) {
    if (absl::Status s = out.Add(key, "--api_key"); !s.ok()) return s;
  }
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read the API key file ", file));
    std::ostringstream text;
    text << in.rdbuf();
    int line_number = 0;
    for (absl::string_view line : absl::StrSplit(text.str(), '\n')) {
      ++line_number;
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || line.front() == '#') continue;
      if (absl::Status s = out.Add(line, absl::StrCat(file, ":", line_number)); !s.ok()) return s;
    }
    if (out.digests_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("the API key file ", file, " holds no key"));
    }
  }
  return out;
}

bool ApiKeys::Check(absl::string_view key) const {
  if (key.empty() || key.size() > kMaxApiKeyBytes) return false;
  const Digest d = Sha256(key);
  // Every digest is compared, whatever matched before.
  int matched = 0;
  for (const Digest& k : digests_) matched |= CRYPTO_memcmp(k.data(), d.data(), d.size()) == 0;
  return matched != 0;
}

bool ApiKeys::CheckAuthorization(absl::string_view header) const {
  header = absl::StripAsciiWhitespace(header);
  constexpr absl::string_view kScheme = "bearer ";
  if (header.size() < kScheme.size() ||
      !absl::EqualsIgnoreCase(header.substr(0, kScheme.size()), kScheme)) {
    return false;
  }
  return Check(absl::StripLeadingAsciiWhitespace(header.substr(kScheme.size())));
}

}  // namespace tandem::router
