// The TLS flags of a tandem gRPC server, defined once for every binary that
// links tandem_rpc_tls_flags (it must not define them itself):
//   --tls_cert FILE       PEM certificate chain the server presents;
//   --tls_key FILE        its PEM private key (unencrypted);
//   --tls_client_ca FILE  PEM CA: clients must present a certificate it
//                         signed (mutual TLS).
// None set: plain gRPC.
#ifndef TANDEM_COMMON_RPC_TLS_FLAGS_H_
#define TANDEM_COMMON_RPC_TLS_FLAGS_H_

#include "common/rpc/tls.h"

namespace tandem::rpc {

// The flags as a server's TlsConfig (require_client_cert when
// --tls_client_ca is set); files are read by StartServer.
TlsConfig ServerTlsFromFlags();

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_RPC_TLS_FLAGS_H_
