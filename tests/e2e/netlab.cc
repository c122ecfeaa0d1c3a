#include "tests/e2e/netlab.h"

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::testing {
namespace {

absl::Status Sh(const std::string& command) {
  if (std::system((command + " >/dev/null 2>&1").c_str()) != 0) {
    return absl::InternalError(absl::StrCat("'", command, "' failed"));
  }
  return absl::OkStatus();
}

// Opens TUN device `dev` in the calling thread's network namespace.
absl::StatusOr<int> OpenTun(const std::string& dev) {
  const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot open /dev/net/tun: ", errno));
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::strncpy(ifr.ifr_name, dev.c_str(), IFNAMSIZ - 1);
  if (ioctl(fd, TUNSETIFF, &ifr) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("TUNSETIFF ", dev, ": errno ", errno));
  }
  return fd;
}

// Opens the TUN device in namespace `ns`: a thread of its own enters the
// namespace (setns changes only the calling thread's).
absl::StatusOr<int> OpenTunIn(const std::string& ns, const std::string& dev) {
  absl::StatusOr<int> fd = absl::InternalError("not run");
  std::thread([&] {
    const int ns_fd = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns_fd < 0 || setns(ns_fd, CLONE_NEWNET) != 0) {
      fd = absl::InternalError(absl::StrCat("cannot enter namespace ", ns));
    } else {
      fd = OpenTun(dev);
    }
    if (ns_fd >= 0) close(ns_fd);
  }).join();
  return fd;
}

uint32_t DestinationOf(const char* packet) {
  uint32_t ip;
  std::memcpy(&ip, packet + 16, 4);
  return ip;
}

uint32_t ParseIp(const std::string& text) {
  unsigned a, b, c, d;
  std::sscanf(text.c_str(), "%u.%u.%u.%u", &a, &b, &c, &d);
  const unsigned char bytes[4] = {static_cast<unsigned char>(a), static_cast<unsigned char>(b),
                                  static_cast<unsigned char>(c), static_cast<unsigned char>(d)};
  uint32_t ip;
  std::memcpy(&ip, bytes, 4);
  return ip;
}

}  // namespace

struct NetLab::Link {
  std::string name;
  int fd = -1;
  LinkFault fault;
  // When this link's rate cap frees up, each way (0: out of the node, 1: in).
  absl::Time busy_until[2] = {absl::InfinitePast(), absl::InfinitePast()};
};

struct NetLab::Pending {
  absl::Time due;
  uint64_t serial;  // keeps packets of one due time in order
  int to;
  std::string bytes;
  bool operator>(const Pending& o) const { return due != o.due ? due > o.due : serial > o.serial; }
};

absl::Status NetLab::Available() {
  if (geteuid() != 0) return absl::UnavailableError("the network lab needs root");
  if (std::system("ip netns list >/dev/null 2>&1") != 0) {
    return absl::UnavailableError("the network lab needs 'ip netns' (iproute2)");
  }
  if (access("/dev/net/tun", R_OK | W_OK) != 0) {
    return absl::UnavailableError("the network lab needs /dev/net/tun");
  }
  return absl::OkStatus();
}

// Deletes the namespaces of labs whose process is gone (killed before its
// destructor ran): their names are tnl<pid>s<serial>-<node>.
void SweepStaleNamespaces() {
  FILE* list = popen("ip netns list 2>/dev/null", "r");
  if (list == nullptr) return;
  char line[256];
  std::vector<std::string> stale;
  while (std::fgets(line, sizeof(line), list) != nullptr) {
    int pid = 0;
    char name[128];
    if (std::sscanf(line, "%127s", name) == 1 && std::sscanf(name, "tnl%ds", &pid) == 1 &&
        pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      stale.push_back(name);
    }
  }
  pclose(list);
  for (const std::string& ns : stale) (void)Sh("ip netns del " + ns);
}

absl::StatusOr<std::unique_ptr<NetLab>> NetLab::Create() {
  if (absl::Status s = Available(); !s.ok()) return s;
  SweepStaleNamespaces();
  std::unique_ptr<NetLab> lab(new NetLab());
  static int serial = 0;
  const int n = serial++;
  // Device names must fit in 15 characters: tnl<pid>s<serial>n<index>.
  lab->tag_ = absl::StrCat(getpid(), "s", n % 100);
  const int id = (getpid() * 7 + n) % 25600;
  lab->subnet_ = absl::StrCat("10.", 100 + id / 256, ".", id % 256, ".");
  if (pipe2(lab->wake_, O_NONBLOCK | O_CLOEXEC) != 0) return absl::InternalError("pipe2");
  lab->hub_ = std::thread([l = lab.get()] { l->Run(); });
  return lab;
}

NetLab::~NetLab() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (write(wake_[1], "x", 1) < 0) {
    // The hub also wakes within its poll timeout.
  }
  if (hub_.joinable()) hub_.join();
  absl::MutexLock lock(&mu_);
  for (const auto& link : links_) close(link->fd);
  // Deleting a namespace deletes the links in it; the client's goes with its fd.
  for (const std::string& ns : namespaces_) (void)Sh("ip netns del " + ns);
  close(wake_[0]);
  close(wake_[1]);
}

absl::StatusOr<NetNode> NetLab::AddLink(const std::string& name, bool own_namespace) {
  int index;
  {
    absl::MutexLock lock(&mu_);
    index = static_cast<int>(links_.size());
  }
  NetNode node{.name = name,
               .ns = own_namespace ? "" : absl::StrCat("tnl", tag_, "-", name),
               .dev = absl::StrCat("tnl", tag_, "n", index),
               .ip = absl::StrCat(subnet_, index + 1)};
  absl::StatusOr<int> fd = absl::InternalError("no fd");
  if (own_namespace) {
    fd = OpenTun(node.dev);
  } else {
    if (absl::Status s = Sh("ip netns add " + node.ns); !s.ok()) return s;
    namespaces_.push_back(node.ns);
    fd = OpenTunIn(node.ns, node.dev);
  }
  if (!fd.ok()) return fd.status();
  const std::string ip = own_namespace ? "ip " : absl::StrCat("ip -n ", node.ns, " ");
  for (const std::string& c :
       {absl::StrCat(ip, "addr add ", node.ip, "/24 dev ", node.dev),
        absl::StrCat(ip, "link set ", node.dev, " up"), absl::StrCat(ip, "link set lo up")}) {
    if (absl::Status s = Sh(c); !s.ok()) {
      close(*fd);
      return s;
    }
  }
  absl::MutexLock lock(&mu_);
  auto link = std::make_unique<Link>();
  link->name = name;
  link->fd = *fd;
  links_.push_back(std::move(link));
  link_of_ip_[ParseIp(node.ip)] = index;
  return node;
}

absl::StatusOr<NetNode> NetLab::AddNode(const std::string& name) { return AddLink(name, false); }
absl::StatusOr<NetNode> NetLab::AddClientNode() { return AddLink("client", true); }

std::vector<std::string> NetLab::Prefix(const NetNode& node) const {
  return {"ip", "netns", "exec", node.ns, "env", "UCX_TLS=tcp", "UCX_NET_DEVICES=" + node.dev};
}

void NetLab::SetFault(const std::string& name, const LinkFault& fault) {
  absl::MutexLock lock(&mu_);
  for (const auto& link : links_) {
    if (link->name == name) link->fault = fault;
  }
}

void NetLab::ClearFaults() {
  absl::MutexLock lock(&mu_);
  for (const auto& link : links_) link->fault = LinkFault();
}

NetLab::Counters NetLab::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

void NetLab::Run() {
  std::priority_queue<Pending, std::vector<Pending>, std::greater<>> pending;
  std::mt19937_64 random(12345);
  std::uniform_real_distribution<double> coin(0, 1);
  uint64_t serial = 0;
  char buffer[65536];
  while (true) {
    std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}};
    std::vector<int> index_of_fd;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      for (int i = 0; i < static_cast<int>(links_.size()); ++i) {
        fds.push_back({links_[i]->fd, POLLIN, 0});
        index_of_fd.push_back(i);
      }
    }
    int timeout_ms = 100;
    if (!pending.empty()) {
      const absl::Duration wait = pending.top().due - absl::Now();
      timeout_ms = std::clamp(static_cast<int>(absl::ToDoubleMilliseconds(wait) + 0.999), 0, 100);
    }
    poll(fds.data(), fds.size(), timeout_ms);
    if (fds[0].revents & POLLIN) {
      while (read(wake_[0], buffer, sizeof(buffer)) > 0) {
      }
    }
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (size_t f = 1; f < fds.size(); ++f) {
      if (!(fds[f].revents & POLLIN)) continue;
      Link& from = *links_[index_of_fd[f - 1]];
      // A bounded batch per link per round, so one busy link cannot starve the rest.
      for (int n = 0; n < 64; ++n) {
        const ssize_t len = read(from.fd, buffer, sizeof(buffer));
        if (len <= 0) break;
        // IPv4 only (the kernel's IPv6 chatter has nowhere to go).
        if (len < 20 || (buffer[0] >> 4) != 4) continue;
        auto it = link_of_ip_.find(DestinationOf(buffer));
        if (it == link_of_ip_.end()) continue;
        Link& to = *links_[it->second];
        bool drop = from.fault.cut || to.fault.cut || coin(random) < from.fault.loss ||
                    coin(random) < to.fault.loss;
        if (drop) {
          ++counters_.dropped;
          continue;
        }
        // Out of `from`, then into `to`: each link's rate cap, then its delay.
        absl::Time at = now;
        for (auto [link, way] : {std::pair{&from, 0}, std::pair{&to, 1}}) {
          if (link->fault.rate_bps > 0) {
            at = std::max(at, link->busy_until[way]) +
                 absl::Seconds(static_cast<double>(len) * 8 / link->fault.rate_bps);
            link->busy_until[way] = at;
          }
          if (coin(random) >= link->fault.reorder) at += link->fault.delay;
        }
        pending.push(Pending{at, serial++, it->second, std::string(buffer, len)});
      }
    }
    const absl::Time sent_by = absl::Now();
    while (!pending.empty() && pending.top().due <= sent_by) {
      const Pending& p = pending.top();
      // A full device queue drops the packet, as a full qdisc would.
      if (write(links_[p.to]->fd, p.bytes.data(), p.bytes.size()) < 0) {
        ++counters_.dropped;
      } else {
        ++counters_.forwarded;
      }
      pending.pop();
    }
  }
}

}  // namespace tandem::testing
