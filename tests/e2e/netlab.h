// A network lab for fault tests: every process in a network namespace of its
// own, each namespace joined to a hub by one link that can be delayed, made
// lossy, reordered, rate-capped or cut.
//
// The links are TUN devices, one per namespace, and the hub is a thread of
// the test that forwards IP packets between them and plays netem's part on
// each link. Real veth pairs with `tc netem` would do the same, but netem is
// a kernel module that many test kernels (and CI VMs) lack; TUN needs only
// /dev/net/tun. The test itself reaches the lab through a link in its own
// namespace (the "client" node), so its traffic to the router crosses the
// router's link like any other.
//
// Addresses are 10.A.B.N/24 with A.B taken from the process id, and
// namespace and device names carry it too, so that two runs never clash; the
// destructor deletes every namespace and link (also when a test fails), and
// Create deletes those of labs whose process was killed.
#ifndef TANDEM_TESTS_E2E_NETLAB_H_
#define TANDEM_TESTS_E2E_NETLAB_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::testing {

// What a link does to the packets that cross it, in both directions (as if
// netem sat on both ends of a veth pair).
struct LinkFault {
  absl::Duration delay = absl::ZeroDuration();  // added each way
  double loss = 0;                              // probability a packet is dropped, each way
  double reorder = 0;    // probability a packet skips the delay (overtakes others)
  int64_t rate_bps = 0;  // bits per second each way, 0 = unlimited
  bool cut = false;      // partition: every packet dropped
};

struct NetNode {
  std::string name;  // as given to AddNode
  std::string ns;    // network namespace ("" for the client node: the test's own)
  std::string dev;   // its link's device inside the namespace
  std::string ip;    // its address
};

class NetLab {
 public:
  // Why the lab cannot run here (not root, no `ip netns`, no /dev/net/tun),
  // or OK. Tests skip on an error.
  static absl::Status Available();
  static absl::StatusOr<std::unique_ptr<NetLab>> Create();
  ~NetLab();

  // A new namespace with its link to the hub, loopback up.
  absl::StatusOr<NetNode> AddNode(const std::string& name);
  // The link of the test's own namespace (routes the lab's subnet to it).
  absl::StatusOr<NetNode> AddClientNode();

  // The command prefix that runs a program in the node's namespace, with UCX
  // held to TCP over the node's link (its shared-memory transports would
  // bypass the network between namespaces of one host).
  std::vector<std::string> Prefix(const NetNode& node) const;

  void SetFault(const std::string& name, const LinkFault& fault);
  void ClearFaults();

  struct Counters {
    int64_t forwarded = 0;
    int64_t dropped = 0;
  };
  Counters counters() const;

 private:
  struct Link;
  struct Pending;
  NetLab() = default;
  absl::StatusOr<NetNode> AddLink(const std::string& name, bool own_namespace);
  void Run();

  std::string tag_;     // unique per run: in every name
  std::string subnet_;  // "10.A.B."
  int wake_[2] = {-1, -1};
  std::vector<std::string> namespaces_;
  std::string client_dev_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, int> link_of_ip_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread hub_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_E2E_NETLAB_H_
