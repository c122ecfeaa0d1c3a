// A simulated cluster described in deploy/local/cluster.sh's words: the
// flags it passes to every decode worker (--decode_args), every prefill
// worker (--prefill_args) and the router (--router_args), as those
// binaries spell them. Each flag the simulator models acts on the
// cluster's options; any other is refused, never ignored.
#ifndef TANDEM_TOOLS_SIM_CLUSTER_ARGS_H_
#define TANDEM_TOOLS_SIM_CLUSTER_ARGS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tools/sim/sim_cluster.h"

namespace tandem::sim {

// Which binary's flags a string of arguments holds.
enum class ArgsRole { kDecode, kPrefill, kRouter };

// Applies `args` ("--name value", "--name=value", "--flag", "--noflag",
// separated by spaces) to `options`: for kDecode its decode loop options,
// for kPrefill its prefill loop options, for kRouter the router core's and
// the registry's. --routing_policy=prefix gives the router a PrefixRouter
// (with --prefix_routing_load_tokens), =load takes it away. Later flags
// win. INVALID_ARGUMENT naming the flag for one the simulator does not
// model (with the list of those it does), a malformed value or a word that
// is not a flag.
absl::Status ApplyClusterArgs(ArgsRole role, absl::string_view args, SimClusterOptions& options);

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_CLUSTER_ARGS_H_
