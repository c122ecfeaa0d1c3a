// tandem-kvbench-netdelay: holds every packet of one netfilter queue for a
// fixed time, then lets it through, to give a veth pair the round trip of a
// long path where the kernel has no netem (scripts/bench-lanes.sh).
//
// Packets reach it through an iptables NFQUEUE rule. Only their metadata is
// copied to this process; the kernel keeps the packet, and the verdicts are
// batched: the queue hands packets over in order with rising ids, and the
// delay is the same for all, so one "accept every id up to N" releases all
// that are due. Run it at a real-time priority (chrt): a late wake-up adds to
// the delay, and the benchmark's busy-polling processes take both cores.
//   iptables-legacy -t mangle -A OUTPUT -o DEV -j NFQUEUE --queue-num 7
//   chrt -f 50 tandem-kvbench-netdelay --queue 7 --delay_ms 20
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/flags.h"

ABSL_FLAG(int, queue, -1, "The NFQUEUE number to serve (iptables --queue-num)");
ABSL_FLAG(double, delay_ms, 0, "How long every packet is held, in milliseconds");
ABSL_FLAG(int, max_queued, 1 << 16,
          "Packets the kernel may hold for this queue; it drops beyond that, so it must cover "
          "the packets of one delay at the highest rate");

namespace tandem::kvbench {
namespace {

volatile sig_atomic_t stop_requested = 0;

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Builds one nfnetlink_queue message: header, then attributes.
class Message {
 public:
  Message(uint16_t type, uint16_t queue) {
    buffer_.resize(NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nfgenmsg)));
    auto* header = reinterpret_cast<nlmsghdr*>(buffer_.data());
    header->nlmsg_type = (NFNL_SUBSYS_QUEUE << 8) | type;
    header->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
    auto* gen = reinterpret_cast<nfgenmsg*>(buffer_.data() + NLMSG_HDRLEN);
    gen->nfgen_family = AF_UNSPEC;
    gen->version = NFNETLINK_V0;
    gen->res_id = htons(queue);
  }

  template <typename T>
  Message& Add(uint16_t type, const T& value) {
    const size_t at = buffer_.size();
    buffer_.resize(at + NLA_ALIGN(NLA_HDRLEN + sizeof(T)));
    auto* attribute = reinterpret_cast<nlattr*>(buffer_.data() + at);
    attribute->nla_type = type;
    attribute->nla_len = NLA_HDRLEN + sizeof(T);
    memcpy(buffer_.data() + at + NLA_HDRLEN, &value, sizeof(T));
    return *this;
  }

  // The finished message, its length field set.
  const std::vector<char>& Bytes() {
    reinterpret_cast<nlmsghdr*>(buffer_.data())->nlmsg_len = buffer_.size();
    return buffer_;
  }

 private:
  std::vector<char> buffer_;
};

class Queue {
 public:
  ~Queue() {
    if (fd_ >= 0) close(fd_);
  }

  // Binds netfilter queue `number`, asking for packet metadata only, GSO
  // packets whole (no segmenting them for us), and room for `max_queued`.
  absl::Status Open(uint16_t number, uint32_t max_queued) {
    number_ = number;
    fd_ = socket(AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER);
    if (fd_ < 0) return absl::ErrnoToStatus(errno, "netlink socket");
    // Bursts of thousands of packet messages must not overflow the socket:
    // a lost message is a packet held until the kernel drops the queue.
    const int buffer = 64 << 20;
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof(buffer));
    sockaddr_nl local{};
    local.nl_family = AF_NETLINK;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0) {
      return absl::ErrnoToStatus(errno, "netlink bind");
    }
    nfqnl_msg_config_cmd bind{NFQNL_CFG_CMD_BIND, 0, htons(AF_INET)};
    if (absl::Status s = Send(Message(NFQNL_MSG_CONFIG, number).Add(NFQA_CFG_CMD, bind)); !s.ok()) {
      return s;
    }
    nfqnl_msg_config_params params{0, NFQNL_COPY_META};
    params.copy_range = 0;
    const uint32_t flags = htonl(NFQA_CFG_F_GSO);
    return Send(Message(NFQNL_MSG_CONFIG, number)
                    .Add(NFQA_CFG_PARAMS, params)
                    .Add(NFQA_CFG_QUEUE_MAXLEN, htonl(max_queued))
                    .Add(NFQA_CFG_MASK, flags)
                    .Add(NFQA_CFG_FLAGS, flags));
  }

  // Holds packets for `delay_ns` until a signal asks it to stop.
  absl::Status Serve(int64_t delay_ns) {
    std::deque<std::pair<int64_t, uint32_t>> held;  // (due time, packet id)
    std::vector<char> buffer(1 << 20);
    while (!stop_requested) {
      int64_t wait_ns = 100'000'000;
      if (!held.empty()) wait_ns = std::max<int64_t>(0, held.front().first - NowNs());
      const timespec wait{static_cast<time_t>(wait_ns / 1'000'000'000), wait_ns % 1'000'000'000};
      pollfd fd{fd_, POLLIN, 0};
      if (ppoll(&fd, 1, &wait, nullptr) < 0 && errno != EINTR) {
        return absl::ErrnoToStatus(errno, "poll");
      }
      for (;;) {
        const ssize_t n = recv(fd_, buffer.data(), buffer.size(), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
        if (n < 0) return absl::ErrnoToStatus(errno, "netlink recv (packets lost)");
        const int64_t due = NowNs() + delay_ns;
        // Unsigned, as nlmsg_len is: NLMSG_OK compares the two.
        uint32_t length = static_cast<uint32_t>(n);
        for (auto* header = reinterpret_cast<nlmsghdr*>(buffer.data()); NLMSG_OK(header, length);
             header = NLMSG_NEXT(header, length)) {
          if (header->nlmsg_type == NLMSG_ERROR) {
            const int error = reinterpret_cast<nlmsgerr*>(NLMSG_DATA(header))->error;
            if (error != 0) return absl::ErrnoToStatus(-error, "nfnetlink_queue");
            continue;
          }
          if ((header->nlmsg_type & 0xff) != NFQNL_MSG_PACKET) continue;
          if (std::optional<uint32_t> id = PacketId(header)) held.emplace_back(due, *id);
        }
      }
      // Everything due goes out with one verdict for the newest due id.
      const int64_t now = NowNs();
      std::optional<uint32_t> last;
      while (!held.empty() && held.front().first <= now) {
        last = held.front().second;
        held.pop_front();
      }
      if (last.has_value()) {
        nfqnl_msg_verdict_hdr verdict{htonl(NF_ACCEPT), htonl(*last)};
        Message message(NFQNL_MSG_VERDICT_BATCH, number_);
        message.Add(NFQA_VERDICT_HDR, verdict);
        const std::vector<char>& bytes = message.Bytes();
        if (send(fd_, bytes.data(), bytes.size(), 0) < 0) {
          return absl::ErrnoToStatus(errno, "verdict");
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  // Sends a configuration message and waits for its acknowledgement.
  absl::Status Send(Message& message) {
    const std::vector<char>& bytes = message.Bytes();
    if (send(fd_, bytes.data(), bytes.size(), 0) < 0) {
      return absl::ErrnoToStatus(errno, "netlink send");
    }
    char reply[4096];
    const ssize_t n = recv(fd_, reply, sizeof(reply), 0);
    if (n < 0) return absl::ErrnoToStatus(errno, "netlink recv");
    auto* header = reinterpret_cast<nlmsghdr*>(reply);
    if (NLMSG_OK(header, n) && header->nlmsg_type == NLMSG_ERROR) {
      const int error = reinterpret_cast<nlmsgerr*>(NLMSG_DATA(header))->error;
      if (error != 0) {
        return absl::ErrnoToStatus(
            -error, absl::StrCat("configuring queue ", number_,
                                 -error == EPERM ? " (needs root: CAP_NET_ADMIN)"
                                                 : " (is another process serving it?)"));
      }
    }
    return absl::OkStatus();
  }

  static std::optional<uint32_t> PacketId(nlmsghdr* header) {
    const int offset = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nfgenmsg));
    int length = static_cast<int>(header->nlmsg_len) - offset;
    for (auto* attribute = reinterpret_cast<nlattr*>(reinterpret_cast<char*>(header) + offset);
         length >= NLA_HDRLEN && attribute->nla_len >= NLA_HDRLEN && attribute->nla_len <= length;
         length -= NLA_ALIGN(attribute->nla_len),
               attribute = reinterpret_cast<nlattr*>(reinterpret_cast<char*>(attribute) +
                                                     NLA_ALIGN(attribute->nla_len))) {
      if ((attribute->nla_type & NLA_TYPE_MASK) != NFQA_PACKET_HDR) continue;
      nfqnl_msg_packet_hdr packet;
      memcpy(&packet, reinterpret_cast<char*>(attribute) + NLA_HDRLEN, sizeof(packet));
      return ntohl(packet.packet_id);
    }
    return std::nullopt;
  }

  int fd_ = -1;
  uint16_t number_ = 0;
};

int Run() {
  const int queue = absl::GetFlag(FLAGS_queue);
  const double delay_ms = absl::GetFlag(FLAGS_delay_ms);
  if (queue < 0 || queue > 65535 || delay_ms < 0 || absl::GetFlag(FLAGS_max_queued) < 1) {
    std::cerr << "tandem-kvbench-netdelay: --queue must be 0..65535 (the iptables --queue-num), "
                 "--delay_ms at least 0 and --max_queued at least 1\n";
    return 2;
  }
  struct sigaction action {};
  action.sa_handler = [](int) { stop_requested = 1; };
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  Queue q;
  absl::Status status = q.Open(queue, absl::GetFlag(FLAGS_max_queued));
  if (status.ok()) status = q.Serve(static_cast<int64_t>(delay_ms * 1e6));
  if (!status.ok()) {
    std::cerr << "tandem-kvbench-netdelay: " << status << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem::kvbench

int main(int argc, char** argv) {
  tandem::ParseToolFlags(argc, argv,
                         "tandem-kvbench-netdelay: delays the packets of one netfilter queue "
                         "(NFQUEUE) by a fixed time");
  return tandem::kvbench::Run();
}
