#include "tests/testing/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/time/clock.h"

extern char** environ;

namespace tandem::testing {

Child::Child(const std::vector<std::string>& argv, const posix_spawn_file_actions_t* actions) {
  Spawn(argv, actions);
}

Child::Child(const std::vector<std::string>& argv, const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  Spawn(argv, &actions);
  posix_spawn_file_actions_destroy(&actions);
}

void Child::Spawn(const std::vector<std::string>& argv, const posix_spawn_file_actions_t* actions) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  if (posix_spawnp(&pid_, args[0], actions, nullptr, args.data(), environ) != 0) pid_ = -1;
}

Child::~Child() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    Wait();
  }
}

void Child::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

void Child::Kill() {
  Signal(SIGKILL);
  Wait();
}

int Child::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  const absl::Time until = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (absl::Now() >= until) return -1;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace tandem::testing
