// ThreadSanitizer build only (--config=tsan): makes Debian's uninstrumented absl::Mutex visible
// to TSan. Debian ships Abseil compiled without -fsanitize=thread, so TSan cannot see the
// happens-before edges of absl::Mutex and reports every access it guards as a race. These
// definitions interpose the exported Mutex and Condition functions (our code and the library
// itself call them through the PLT), call the real ones (dlsym RTLD_NEXT) and tell TSan what
// they mean: Lock acquires the mutex, Unlock releases it, Await (and its timed forms) releases it
// while it waits and acquires it again, and a Condition is evaluated under the mutex whose Unlock or Await
// evaluates it (the waiter's condition may run in the unlocking thread). In any other build
// this file is empty.
#if defined(__SANITIZE_THREAD__)
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdlib>

#include "absl/synchronization/mutex.h"

namespace absl {
ABSL_NAMESPACE_BEGIN
namespace {

// The mutex whose Unlock or Await this thread is inside: the one a Condition runs under.
thread_local const void* current_mutex = nullptr;

template <typename Fn>
Fn Real(const char* mangled) {
  void* fn = dlsym(RTLD_NEXT, mangled);
  if (fn == nullptr) abort();  // a different Abseil: the shim must not silently do nothing
  return reinterpret_cast<Fn>(fn);
}

}  // namespace

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_release(this);
  const void* outer = current_mutex;
  current_mutex = this;
  real(this);
  current_mutex = outer;
}

void Mutex::Await(const Condition& cond) {
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>("_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  const void* outer = current_mutex;
  current_mutex = this;
  real(this, cond);
  current_mutex = outer;
  __tsan_acquire(this);
}

// The timed waits release and reacquire the mutex like Await.
bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  const void* outer = current_mutex;
  current_mutex = this;
  const bool result = real(this, cond, timeout);
  current_mutex = outer;
  __tsan_acquire(this);
  return result;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(this);
  const void* outer = current_mutex;
  current_mutex = this;
  const bool result = real(this, cond, deadline);
  current_mutex = outer;
  __tsan_acquire(this);
  return result;
}

bool Condition::Eval() const {
  static auto real = Real<bool (*)(const Condition*)>("_ZNK4absl7debian39Condition4EvalEv");
  if (current_mutex != nullptr) __tsan_acquire(const_cast<void*>(current_mutex));
  const bool result = real(this);
  if (current_mutex != nullptr) __tsan_release(const_cast<void*>(current_mutex));
  return result;
}

ABSL_NAMESPACE_END
}  // namespace absl

// Suppressions, compiled into every binary of the TSan build (no file to find at run time).
// Only for code we do not build: Debian's gRPC and Abseil are not instrumented, so TSan sees
// their system calls (epoll, memmove) through its interceptors but not the synchronisation
// around them; gRPC's own templates (grpc::internal, compiled into our binaries) hand call
// state between its uninstrumented threads the same way. Nothing of samplerd's own code is
// suppressed. civetweb and prometheus-cpp-pull (the metrics listener), also Debian's and
// uninstrumented, hand requests between their threads the same way; civetweb also formats its
// Date header with gmtime, whose static buffer its worker threads share (its own race, in a
// header no one reads).
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libgrpc.so.29\n"
         "called_from_lib:libabsl_status.so.20220623\n"
         "called_from_lib:libabsl_cord.so.20220623\n"
         "race:grpc::internal::\n"
         "called_from_lib:libgrpc++.so.1.51\n"
         "called_from_lib:libgpr.so.29\n"
         "called_from_lib:libabsl_graphcycles_internal.so.20220623\n"
         "called_from_lib:libabsl_synchronization.so.20220623\n"
         // Races only (called_from_lib would hide the lock inside the library from an unlock
         // inlined into ours).
         "race:libcivetweb.so.1\n"
         "race:libprometheus-cpp-pull.so.1.0\n";
}
#endif  // __SANITIZE_THREAD__
