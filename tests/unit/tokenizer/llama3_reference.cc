#include "tests/unit/tokenizer/llama3_reference.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "tests/testing/child_process.h"
#include "tests/testing/model_files.h"
#include "tests/unit/tokenizer/tokenizer_corpus.h"

namespace tandem::testing {
namespace {

namespace fs = std::filesystem;

bool InPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::error_code ec;
    if (!dir.empty() && fs::exists(fs::path(std::string(dir)) / program, ec)) return true;
  }
  return false;
}

// Runs argv with output appended to `log`; an error quoting the log's tail
// when it fails.
absl::Status Run(const std::vector<std::string>& argv, const std::string& log,
                 absl::Duration timeout) {
  Child child(argv, log);
  const int rc = child.Wait(timeout);
  if (rc == 0) return absl::OkStatus();
  std::string tail = ReadFileOrEmpty(log);
  if (tail.size() > 2000) tail = tail.substr(tail.size() - 2000);
  return absl::UnavailableError(absl::StrCat("'", argv[0], " ", argv.size() > 1 ? argv[1] : "",
                                             "' exited with ", rc, " (log ", log, "): ", tail));
}

// An exclusive lock on the cache, held until destroyed: tests of several
// processes (ctest -j) fill the cache once, one at a time, instead of
// writing the same files at once and reading each other's halves.
class CacheLock {
 public:
  static absl::StatusOr<std::unique_ptr<CacheLock>> Take(const fs::path& path,
                                                         absl::Duration timeout) {
    const int fd = open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot open ", path.string()));
    const absl::Time deadline = absl::Now() + timeout;
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (absl::Now() >= deadline) {
        close(fd);
        return absl::DeadlineExceededError(absl::StrCat(
            "another test held ", path.string(), " for over ", absl::FormatDuration(timeout)));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return std::unique_ptr<CacheLock>(new CacheLock(fd));
  }
  ~CacheLock() { close(fd_); }  // Closing releases the lock.

 private:
  explicit CacheLock(int fd) : fd_(fd) {}
  const int fd_;
};

absl::StatusOr<Llama3Reference> SetUp() {
  for (const char* program : {"node", "npm"}) {
    if (!InPath(program)) {
      return absl::UnavailableError(absl::StrCat(program,
                                                 " is not in PATH (scripts/install-deps.sh "
                                                 "installs nodejs and npm)"));
    }
  }
  const fs::path cache(TANDEM_TEST_CACHE_DIR);
  const fs::path npm_dir = cache / "npm";
  const fs::path modules = npm_dir / "node_modules";
  std::error_code ec;
  fs::create_directories(npm_dir, ec);
  // Longer than the install and the tokenizer's writing below together.
  ASSIGN_OR_RETURN(std::unique_ptr<CacheLock> lock,
                   CacheLock::Take(cache / "llama3-reference.lock", absl::Seconds(480)));
  if (!fs::exists(modules / "llama3-tokenizer-js" / "package.json", ec)) {
    const absl::Status installed = Run({"npm", "install", "--prefix", npm_dir.string(),
                                        "--no-audit", "--no-fund", "llama3-tokenizer-js@1.2.0"},
                                       (npm_dir / "install.log").string(), absl::Seconds(300));
    if (!installed.ok()) return installed;
  }
  const fs::path tokenizer_dir = cache / "llama3";
  if (!fs::exists(tokenizer_dir / "tokenizer.json", ec)) {
    const absl::Status written = Run({"node", TANDEM_LLAMA3_REFERENCE_SCRIPT, "tokenizer",
                                      modules.string(), tokenizer_dir.string()},
                                     (cache / "llama3.log").string(), absl::Seconds(120));
    if (!written.ok()) return written;
  }
  return Llama3Reference::Make(modules.string(), tokenizer_dir.string());
}

}  // namespace

Llama3Reference Llama3Reference::Make(std::string modules_dir, std::string tokenizer_dir) {
  Llama3Reference ref;
  ref.modules_dir_ = std::move(modules_dir);
  ref.tokenizer_dir_ = std::move(tokenizer_dir);
  return ref;
}

absl::StatusOr<const Llama3Reference*> Llama3Reference::Get() {
  static const absl::StatusOr<Llama3Reference>* const ref =
      new absl::StatusOr<Llama3Reference>(SetUp());
  if (!ref->ok()) return ref->status();
  return &ref->value();
}

absl::StatusOr<std::vector<std::vector<int32_t>>> Llama3Reference::Encode(
    const std::vector<std::string>& texts, bool special) const {
  const std::string dir = TempDir();
  const std::string in = dir + "/corpus.json";
  const std::string out = dir + "/ids.json";
  std::ofstream(in, std::ios::binary) << nlohmann::json(texts).dump();
  std::vector<std::string> argv = {
      "node", TANDEM_LLAMA3_REFERENCE_SCRIPT, "encode", modules_dir_, in, out};
  if (special) argv.push_back("special");
  if (absl::Status s = Run(argv, dir + "/encode.log", absl::Seconds(240)); !s.ok()) return s;
  const nlohmann::json ids = nlohmann::json::parse(ReadFileOrEmpty(out), nullptr, false);
  if (!ids.is_array() || ids.size() != texts.size()) {
    return absl::InternalError(
        absl::StrCat("reference output ", out, " is not ", texts.size(), " id lists"));
  }
  return ids.get<std::vector<std::vector<int32_t>>>();
}

}  // namespace tandem::testing
