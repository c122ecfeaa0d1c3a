// A second process for ucx_transport_test's peer-failure tests: it talks to
// the test over UCX until the test kills it with SIGKILL.
//
//   ucx_transport_test_peer hold          prints its address (hex) on stdout,
//                                        then receives and never accepts
//   ucx_transport_test_peer send ADDRHEX  connects, prints "connected", then
//                                        keeps 4 sends of 8 MiB in flight
//
// It exits by itself after a minute so that a crashed test leaves nothing.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "kvtransfer/ucx/ucx_transport.h"

namespace tandem::kvtransfer {
namespace {

constexpr size_t kMessageBytes = size_t{8} << 20;

int Run(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  absl::StatusOr<std::unique_ptr<UcxTransport>> transport = UcxTransport::Create();
  if (!transport.ok()) {
    std::fprintf(stderr, "%s\n", transport.status().ToString().c_str());
    return 1;
  }
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  std::vector<TransportEvent> events;
  if (mode == "hold") {
    std::printf("%s\n", absl::BytesToHexString((*transport)->LocalAddress()).c_str());
    std::fflush(stdout);
    while (absl::Now() < give_up) {
      events.clear();
      (*transport)->Poll(events);
      (*transport)->WaitForActivity(absl::Now() + absl::Milliseconds(10));
    }
    return 0;
  }
  if (mode != "send" || argc < 3) return 2;
  absl::StatusOr<PeerId> peer = (*transport)->Connect(absl::HexStringToBytes(argv[2]));
  std::vector<char> buffer(kMessageBytes, 'x');
  absl::StatusOr<RegionId> region =
      (*transport)->RegisterMemory(buffer.data(), buffer.size(), MemoryKind::kHost);
  if (!peer.ok() || !region.ok()) return 1;
  std::printf("connected\n");
  std::fflush(stdout);
  const Slice slice{*region, 0, kMessageBytes};
  int in_flight = 0;
  while (absl::Now() < give_up) {
    while (in_flight < 4) {
      if (!(*transport)->PostSend(*peer, "stream", {&slice, 1}).ok()) return 1;
      ++in_flight;
    }
    events.clear();
    (*transport)->Poll(events);
    for (const TransportEvent& event : events) {
      if (event.kind == TransportEvent::Kind::kSendDone) --in_flight;
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) { return tandem::kvtransfer::Run(argc, argv); }
