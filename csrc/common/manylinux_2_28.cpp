// The glibc symbol versions _C links against: none newer than GLIBC_2.28, the newest the
// manylinux_2_28 tag allows, whatever glibc the build host has.
//
// A glibc at least 2.34 (Debian 12 has 2.36) moved the pthread, semaphore, shm and dl
// functions into libc.so.6 under a new version, GLIBC_2.34, and kept the old ones
// (GLIBC_2.2.5: the libpthread/libdl/librt of older glibc) as compatibility symbols that
// nothing links against by default. The static CUDA runtime (libcudart_static.a, which
// cannot be recompiled), the driver loader (cubin_loader.cpp) and the statically linked
// libstdc++ (std::call_once) call them. The linker's --wrap=NAME, which CMakeLists.txt
// passes for every symbol this file lists, renames each undefined reference to NAME, from
// our objects and from the static archives alike, into __wrap_NAME; this file defines
// those:
// - DSA_OLD_VERSION(NAME, VERSION): a jump to NAME@VERSION, the old version, which
//   glibc 2.28 defines (in libpthread.so.0, libdl.so.2 or librt.so.1, which _C
//   therefore needs) and every later glibc keeps. A jump, not a call: the arguments
//   pass untouched, whatever NAME's signature, and so does the return address, which
//   dlopen and dlsym read to know their caller.
// - __libc_single_threaded and arc4random, which have no old version: defined below.
// tests/test_wheel.py checks the result: no symbol version the tag does not allow.

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#define DSA_OLD_VERSION(name, version)                                                  \
  __asm__(".pushsection .text\n"                                                        \
          ".symver " #name "_old, " #name "@" #version "\n"                             \
          ".globl __wrap_" #name "\n"                                                   \
          ".hidden __wrap_" #name "\n"                                                  \
          ".type __wrap_" #name ", @function\n"                                         \
          "__wrap_" #name ":\n"                                                         \
          "  jmp " #name "_old@PLT\n"                                                   \
          ".size __wrap_" #name ", . - __wrap_" #name "\n"                              \
          ".popsection\n");

DSA_OLD_VERSION(dlclose, GLIBC_2.2.5)
DSA_OLD_VERSION(dlerror, GLIBC_2.2.5)
DSA_OLD_VERSION(dlmopen, GLIBC_2.3.4)
DSA_OLD_VERSION(dlopen, GLIBC_2.2.5)
DSA_OLD_VERSION(dlsym, GLIBC_2.2.5)
DSA_OLD_VERSION(dlvsym, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_condattr_setpshared, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_create, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_detach, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_getspecific, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_join, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_key_create, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_key_delete, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_kill, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_mutex_trylock, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_mutexattr_destroy, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_mutexattr_init, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_mutexattr_setpshared, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_mutexattr_settype, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_once, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_rwlock_destroy, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_rwlock_init, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_rwlock_rdlock, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_rwlock_timedrdlock, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_rwlock_timedwrlock, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_rwlock_tryrdlock, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_rwlock_trywrlock, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_rwlock_unlock, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_rwlock_wrlock, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_rwlockattr_destroy, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_rwlockattr_init, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_rwlockattr_setpshared, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_setspecific, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_spin_destroy, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_spin_init, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_spin_lock, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_spin_trylock, GLIBC_2.2.5)
DSA_OLD_VERSION(pthread_spin_unlock, GLIBC_2.2.5)
DSA_OLD_VERSION(sem_destroy, GLIBC_2.2.5)
DSA_OLD_VERSION(sem_init, GLIBC_2.2.5)
DSA_OLD_VERSION(sem_post, GLIBC_2.2.5)
DSA_OLD_VERSION(sem_timedwait, GLIBC_2.2.5)
DSA_OLD_VERSION(sem_trywait, GLIBC_2.2.5)
DSA_OLD_VERSION(sem_wait, GLIBC_2.2.5)
DSA_OLD_VERSION(shm_open, GLIBC_2.2.5)
DSA_OLD_VERSION(shm_unlink, GLIBC_2.2.5)

#undef DSA_OLD_VERSION

// __libc_single_threaded (GLIBC_2.32): libstdc++ skips atomic reference counting while it
// reads non-zero. Always zero: counts stay atomic, as on any glibc before 2.32.
extern "C" __attribute__((visibility("hidden"))) char __wrap___libc_single_threaded = 0;

// arc4random (GLIBC_2.36), behind libstdc++'s std::random_device: 4 random bytes from
// getrandom (GLIBC_2.25), which never returns a partial read of so few; like glibc's, it
// aborts if the kernel has no entropy to give.
extern "C" __attribute__((visibility("hidden"))) std::uint32_t __wrap_arc4random() {
  std::uint32_t value;
  for (;;) {
    if (getrandom(&value, sizeof value, 0) == sizeof value) return value;
    if (errno != EINTR) std::abort();
  }
}
