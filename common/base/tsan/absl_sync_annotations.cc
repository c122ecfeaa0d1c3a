// ThreadSanitizer annotations for Debian's uninstrumented absl::Mutex,
// absl::CondVar and absl::Notification (ThreadSanitizer builds only).
//
// libabsl_synchronization is compiled without -fsanitize=thread, so TSan
// sees none of its locking: every access guarded by an absl::Mutex would be
// reported as a race. This library is loaded ahead of absl's (see the top
// CMakeLists.txt), so its definitions of the out-of-line members below take
// the place of absl's for our code and for gRPC alike. Each one tells TSan
// what the real one (found with dlsym(RTLD_NEXT)) does, the way absl's own
// TSan build annotates them: a lock between __tsan_mutex_pre_lock and
// __tsan_mutex_post_lock, an unlock between pre_unlock and post_unlock.
// TSan ignores memory accesses between a pre and a post annotation, which
// covers the Condition functions absl evaluates inside those calls.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define TANDEM_STR2(x) #x
#define TANDEM_STR(x) TANDEM_STR2(x)

// The real absl function whose Itanium-mangled name is "_ZN" or "_ZNK",
// then "4absl" and the inline namespace, then `rest`.
template <typename Fn>
Fn Real(const char* prefix, const char* rest) {
  const std::string ns = TANDEM_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = std::string(prefix) + "4absl" + std::to_string(ns.size()) + ns + rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "absl_sync_annotations: no %s in the absl libraries\n", name.c_str());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

constexpr unsigned kRead = __tsan_mutex_read_lock;
constexpr unsigned kTry = __tsan_mutex_try_lock;
constexpr unsigned kTryFailed = __tsan_mutex_try_lock | __tsan_mutex_try_lock_failed;

// Some of absl's calls make others through the PLT, and so through these
// (AwaitWithTimeout calls AwaitWithDeadline): only the outermost annotates.
thread_local int tls_depth = 0;

class Scope {
 public:
  Scope() : outermost_(tls_depth++ == 0) {}
  ~Scope() { --tls_depth; }
  bool outermost() const { return outermost_; }

 private:
  const bool outermost_;
};

// A call that takes `mu` (LockWhen...): TSan sees it lock.
template <typename Call>
auto Locking(absl::Mutex* mu, unsigned flags, Call call) {
  Scope scope;
  if (!scope.outermost()) return call();
  __tsan_mutex_pre_lock(mu, flags);
  if constexpr (std::is_void_v<decltype(call())>) {
    call();
    __tsan_mutex_post_lock(mu, flags, 0);
  } else {
    auto result = call();
    __tsan_mutex_post_lock(mu, flags, 0);
    return result;
  }
}

// A call that releases `mu` and holds it again when it returns (Await,
// CondVar::Wait): TSan sees an unlock, then a lock around the real call.
template <typename Call>
auto Relock(absl::Mutex* mu, unsigned flags, Call call) {
  if (tls_depth > 0) return call();
  __tsan_mutex_pre_unlock(mu, flags);
  __tsan_mutex_post_unlock(mu, flags);
  return Locking(mu, flags, call);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static const auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex4LockEv");
  Locking(this, 0, [&] { real(this); });
}

void Mutex::ReaderLock() {
  static const auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex10ReaderLockEv");
  Locking(this, kRead, [&] { real(this); });
}

bool Mutex::TryLock() {
  static const auto real = Real<bool (*)(Mutex*)>("_ZN", "5Mutex7TryLockEv");
  Scope scope;
  if (!scope.outermost()) return real(this);
  __tsan_mutex_pre_lock(this, kTry);
  const bool locked = real(this);
  __tsan_mutex_post_lock(this, locked ? kTry : kTryFailed, 0);
  return locked;
}

bool Mutex::ReaderTryLock() {
  static const auto real = Real<bool (*)(Mutex*)>("_ZN", "5Mutex13ReaderTryLockEv");
  Scope scope;
  if (!scope.outermost()) return real(this);
  __tsan_mutex_pre_lock(this, kRead | kTry);
  const bool locked = real(this);
  __tsan_mutex_post_lock(this, kRead | (locked ? kTry : kTryFailed), 0);
  return locked;
}

void Mutex::Unlock() {
  static const auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex6UnlockEv");
  Scope scope;
  if (!scope.outermost()) return real(this);
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  static const auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex12ReaderUnlockEv");
  Scope scope;
  if (!scope.outermost()) return real(this);
  __tsan_mutex_pre_unlock(this, kRead);
  real(this);
  __tsan_mutex_post_unlock(this, kRead);
}

void Mutex::LockWhen(const Condition& cond) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>("_ZN", "5Mutex8LockWhenERKNS0_9ConditionE");
  Locking(this, 0, [&] { real(this, cond); });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>("_ZN", "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking(this, kRead, [&] { real(this, cond); });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "_ZN", "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN", "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, 0, [&] { return real(this, cond, deadline); });
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "_ZN", "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, kRead, [&] { return real(this, cond, timeout); });
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN", "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, kRead, [&] { return real(this, cond, deadline); });
}

// Await may be called with the mutex held shared or exclusive; TSan needs
// only the happens-before edges here, which the exclusive form gives.
void Mutex::Await(const Condition& cond) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>("_ZN", "5Mutex5AwaitERKNS0_9ConditionE");
  Relock(this, 0, [&] { real(this, cond); });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "_ZN", "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Relock(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN", "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Relock(this, 0, [&] { return real(this, cond, deadline); });
}

void ReleasableMutexLock::Release() {
  static const auto real =
      Real<void (*)(ReleasableMutexLock*)>("_ZN", "19ReleasableMutexLock7ReleaseEv");
  // The lock's only member is the Mutex* it releases.
  Mutex* mu = *reinterpret_cast<Mutex**>(this);
  Scope scope;
  if (!scope.outermost()) return real(this);
  __tsan_mutex_pre_unlock(mu, 0);
  real(this);
  __tsan_mutex_post_unlock(mu, 0);
}

void CondVar::Wait(Mutex* mu) {
  static const auto real = Real<void (*)(CondVar*, Mutex*)>("_ZN", "7CondVar4WaitEPNS0_5MutexE");
  Relock(mu, 0, [&] { real(this, mu); });
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      "_ZN", "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Relock(mu, 0, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, absl::Time)>(
      "_ZN", "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Relock(mu, 0, [&] { return real(this, mu, deadline); });
}

// A Notification syncs through its own Mutex inside absl (not through the
// calls above) and through `notified_yet_`, which the inline
// HasBeenNotified reads: Notify releases both addresses, a wait that saw
// the notification acquires the object's.
namespace {
static_assert(sizeof(Notification) == 2 * sizeof(Mutex),
              "absl::Notification is {Mutex mutex_; atomic<bool> notified_yet_;}");
void* NotifiedYet(const Notification* n) {
  return const_cast<char*>(reinterpret_cast<const char*>(n) + sizeof(Mutex));
}
}  // namespace

void Notification::Notify() {
  static const auto real = Real<void (*)(Notification*)>("_ZN", "12Notification6NotifyEv");
  __tsan_release(this);
  __tsan_release(NotifiedYet(this));
  real(this);
}

void Notification::WaitForNotification() const {
  static const auto real =
      Real<void (*)(const Notification*)>("_ZNK", "12Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  static const auto real = Real<bool (*)(const Notification*, absl::Duration)>(
      "_ZNK", "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  static const auto real = Real<bool (*)(const Notification*, absl::Time)>(
      "_ZNK", "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
