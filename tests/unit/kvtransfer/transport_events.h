// Test helper for KvTransport events.
#ifndef TANDEM_TESTS_UNIT_KVTRANSFER_TRANSPORT_EVENTS_H_
#define TANDEM_TESTS_UNIT_KVTRANSFER_TRANSPORT_EVENTS_H_

#include <optional>
#include <utility>
#include <vector>

#include "kvtransfer/kv_transport.h"

namespace tandem::kvtransfer::testing {

// Takes the first event of `kind` out of `events`; nullopt when none is there.
inline std::optional<TransportEvent> TakeEvent(std::vector<TransportEvent>& events,
                                               TransportEvent::Kind kind) {
  for (auto it = events.begin(); it != events.end(); ++it) {
    if (it->kind == kind) {
      TransportEvent found = std::move(*it);
      events.erase(it);
      return found;
    }
  }
  return std::nullopt;
}

}  // namespace tandem::kvtransfer::testing

#endif  // TANDEM_TESTS_UNIT_KVTRANSFER_TRANSPORT_EVENTS_H_
