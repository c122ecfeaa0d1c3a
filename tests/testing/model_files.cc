#include "tests/testing/model_files.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <system_error>

namespace tandem::testing {
namespace {

// The folders TempDir() created, with the creating process; the destructor,
// run at normal exit, removes those this process created. A forked child (a
// death test, a spawned worker) that exits normally must not delete its
// parent's folders. TANDEM_KEEP_TEST_DIRS=1 keeps them all (worker logs
// for a failure's post-mortem).
class TempDirRegistry {
 public:
  ~TempDirRegistry() {
    if (const char* keep = std::getenv("TANDEM_KEEP_TEST_DIRS");
        keep != nullptr && std::string(keep) == "1") {
      return;
    }
    for (const auto& [dir, creator] : dirs_) {
      if (creator != ::getpid()) continue;
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }

  void Add(const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.emplace(dir, ::getpid());
  }

 private:
  std::mutex mu_;
  std::map<std::string, pid_t> dirs_;
};

TempDirRegistry& Registry() {
  static TempDirRegistry registry;
  return registry;
}

}  // namespace

std::string ModelsDir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("TANDEM_MODELS"); env != nullptr && *env != '\0') {
    return fs::is_directory(env) ? std::string(env) : std::string();
  }
  const fs::path beside = fs::path(TANDEM_SOURCE_DIR).parent_path() / "shared" / "models";
  return fs::is_directory(beside) ? beside.string() : std::string();
}

std::string ModelFile(const std::string& name) {
  const std::string dir = ModelsDir();
  if (dir.empty()) return {};
  const std::filesystem::path p = std::filesystem::path(dir) / name;
  return std::filesystem::is_regular_file(p) ? p.string() : std::string();
}

bool ModelsRequired() {
  const char* env = std::getenv("TANDEM_REQUIRE_MODELS");
  return env != nullptr && std::string(env) == "1";
}

std::string TempDir() {
  namespace fs = std::filesystem;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "tandem";
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  const fs::path dir =
      fs::temp_directory_path() / ("tandem-test-" + std::to_string(::getpid()) + "-" + name);
  fs::create_directories(dir);
  Registry().Add(dir.string());
  return dir.string();
}

}  // namespace tandem::testing
