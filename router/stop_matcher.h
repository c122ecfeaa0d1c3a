// StopMatcher: finds the request's stop strings in streamed text.
//
// Text arrives in pieces; a stop string may span pieces. Text that could be
// the start of a stop string is held back until the next piece shows
// whether it is one, so the client never receives a prefix of a stop string
// that later turns out to end the generation.
//
// Thread-compatible.
#ifndef TANDEM_ROUTER_STOP_MATCHER_H_
#define TANDEM_ROUTER_STOP_MATCHER_H_

#include <string>
#include <string_view>
#include <vector>

namespace tandem::router {

class StopMatcher {
 public:
  // Empty stop strings are ignored (validation refuses them earlier).
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends `text`; returns the text that is safe to send now. Once a stop
  // string appears, returns the text before it, stopped() turns true and
  // later calls return "".
  std::string Push(std::string_view text);

  // The text held back, at the end of the stream (no stop string can
  // complete any more).
  std::string Flush();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_STOP_MATCHER_H_
