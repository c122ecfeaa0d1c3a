#include "tools/router_bench/router_process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace tandem::router_bench {

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) return absl::StrCat("was killed by signal ", WTERMSIG(wait_status));
  return "stopped";
}

// Writes `text` to stderr from a forked child (no allocation, no locks).
void ChildError(const char* text) {
  const ssize_t unused = write(2, text, strlen(text));
  (void)unused;
}

}  // namespace

std::string TailOfFile(const std::string& path, size_t max_bytes) {
  const std::string text = ReadFile(path);
  return text.size() <= max_bytes ? text : text.substr(text.size() - max_bytes);
}

absl::StatusOr<std::unique_ptr<RouterProcess>> RouterProcess::Start(const RouterLaunch& launch) {
  if (access(launch.binary.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--router=", launch.binary, " is not an executable file"));
  }
  char dir_template[] = "/tmp/tandem-router-bench.XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  const std::string dir = dir_template;
  const std::string port_file = dir + "/port";

  std::vector<std::string> args = {launch.binary};
  args.insert(args.end(), launch.args.begin(), launch.args.end());
  args.push_back(absl::StrCat("--port_file=", port_file));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const int log_fd = open(launch.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write the router's log ", launch.log_path, ": ", strerror(errno)));
  }
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (launch.cpu >= 0) CPU_SET(launch.cpu, &cpus);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    if (launch.cpu >= 0 && sched_setaffinity(0, sizeof(cpus), &cpus) != 0) {
      ChildError("tandem-router-bench: cannot pin the router to --router_cpu\n");
      _exit(127);
    }
    execv(argv[0], argv.data());
    ChildError("tandem-router-bench: cannot execute the router\n");
    _exit(127);
  }
  close(log_fd);
  std::unique_ptr<RouterProcess> router(new RouterProcess(pid, launch.log_path, dir));

  const absl::Time deadline = absl::Now() + launch.startup_timeout;
  while (true) {
    int wait_status = 0;
    if (waitpid(pid, &wait_status, WNOHANG) == pid) {
      router->pid_ = -1;
      return absl::FailedPreconditionError(
          absl::StrCat("the router ", DescribeExit(wait_status), " before serving; its log (",
                       launch.log_path, ") ends:\n", TailOfFile(launch.log_path, 2000)));
    }
    const std::string text = ReadFile(port_file);
    int port = 0;
    if (!text.empty() && text.back() == '\n' &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port) && port > 0) {
      router->port_ = port;
      return router;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the router wrote no port file within ", absl::FormatDuration(launch.startup_timeout),
          "; its log (", launch.log_path, ") ends:\n", TailOfFile(launch.log_path, 2000)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

RouterProcess::~RouterProcess() {
  if (pid_ > 0) Stop(absl::Seconds(5)).IgnoreError();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

absl::StatusOr<ProcessSample> RouterProcess::Sample() const {
  ProcessSample sample;
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid_, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("cannot read /proc/", pid_, "/stat"));
  }
  // After "pid (comm)": state is field 3, utime 14 and stime 15.
  const std::vector<std::string> fields =
      absl::StrSplit(stat.substr(paren + 2), ' ', absl::SkipEmpty());
  int64_t utime = 0;
  int64_t stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return absl::UnavailableError(absl::StrCat("unexpected /proc/", pid_, "/stat"));
  }
  sample.cpu_seconds =
      static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  for (absl::string_view line :
       absl::StrSplit(ReadFile(absl::StrCat("/proc/", pid_, "/status")), '\n')) {
    int64_t* field = nullptr;
    if (absl::ConsumePrefix(&line, "VmRSS:")) field = &sample.rss_kb;
    if (absl::ConsumePrefix(&line, "Threads:")) field = &sample.threads;
    if (field == nullptr) continue;
    absl::ConsumeSuffix(&line, "kB");
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), field)) {
      return absl::UnavailableError(absl::StrCat("unexpected /proc/", pid_, "/status"));
    }
  }
  return sample;
}

absl::Status RouterProcess::Stop(absl::Duration grace) {
  if (pid_ <= 0) return absl::OkStatus();
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  int wait_status = 0;
  bool killed = false;
  while (waitpid(pid_, &wait_status, WNOHANG) != pid_) {
    if (!killed && absl::Now() > deadline) {
      kill(pid_, SIGKILL);
      killed = true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  pid_ = -1;
  if (killed) {
    return absl::DeadlineExceededError(absl::StrCat("the router did not stop within ",
                                                    absl::FormatDuration(grace),
                                                    " of SIGTERM and was killed"));
  }
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("the router ", DescribeExit(wait_status), " on SIGTERM; its log: ", log_path_));
}

int64_t RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  return static_cast<int64_t>(limit.rlim_cur);
}

absl::Status AvoidCpu(int cpu) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    return absl::InternalError(absl::StrCat("sched_getaffinity: ", strerror(errno)));
  }
  if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--router_cpu=", cpu, " is not a CPU this process may run on"));
  }
  CPU_CLR(cpu, &allowed);
  if (CPU_COUNT(&allowed) == 0) return absl::OkStatus();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    int tid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &tid)) continue;
    // A thread may have exited since the listing.
    sched_setaffinity(tid, sizeof(allowed), &allowed);
  }
  return absl::OkStatus();
}

}  // namespace tandem::router_bench
