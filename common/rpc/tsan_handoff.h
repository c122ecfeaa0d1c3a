// Happens-before edges across gRPC's callback API, for ThreadSanitizer.
//
// A reaction (OnReadDone, a unary call's done callback) runs on one of
// gRPC's threads after the call that started its operation (StartRead,
// stub->async()->Method). gRPC orders the two inside Debian's libgrpc,
// which is not instrumented, so TSan sees our state written before the
// start and read in the reaction as a race. HandToGrpc(object) just before
// starting an operation and TakeFromGrpc(object) first thing in its
// reaction tell TSan about that order; in other builds they are empty.
#ifndef TANDEM_COMMON_RPC_TSAN_HANDOFF_H_
#define TANDEM_COMMON_RPC_TSAN_HANDOFF_H_

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TANDEM_RPC_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(TANDEM_RPC_TSAN)
#define TANDEM_RPC_TSAN 1
#endif

#ifdef TANDEM_RPC_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace tandem::rpc {

inline void HandToGrpc([[maybe_unused]] const void* object) {
#ifdef TANDEM_RPC_TSAN
  __tsan_release(const_cast<void*>(object));
#endif
}

inline void TakeFromGrpc([[maybe_unused]] const void* object) {
#ifdef TANDEM_RPC_TSAN
  __tsan_acquire(const_cast<void*>(object));
#endif
}

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_RPC_TSAN_HANDOFF_H_
