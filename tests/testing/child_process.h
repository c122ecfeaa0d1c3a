// A child process for multi-process tests: spawned from argv, killed and
// reaped if the test ends early, waited for with a deadline.
#ifndef TANDEM_TESTS_TESTING_CHILD_PROCESS_H_
#define TANDEM_TESTS_TESTING_CHILD_PROCESS_H_

#include <spawn.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace tandem::testing {

class Child {
 public:
  // Runs argv[0] (looked up in PATH) with `actions` (may be null).
  explicit Child(const std::vector<std::string>& argv,
                 const posix_spawn_file_actions_t* actions = nullptr);
  // Runs argv with stdout and stderr appended to `log_path`.
  Child(const std::vector<std::string>& argv, const std::string& log_path);
  ~Child();

  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // -1 when spawning failed or after the child was reaped.
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  void Signal(int sig);
  // SIGKILL, then reaps the child (so running() is false afterwards).
  void Kill();
  // Exit code, or 128 + signal; -1 if it did not end within `timeout`.
  int Wait(absl::Duration timeout = absl::Seconds(20));

 private:
  void Spawn(const std::vector<std::string>& argv, const posix_spawn_file_actions_t* actions);

  pid_t pid_ = -1;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TESTING_CHILD_PROCESS_H_
