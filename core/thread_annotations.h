// Clang thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html).
//
// Under clang, each KVF_ macro expands to the attribute of the same name and
// `-Wthread-safety` checks, at compile time, that every access to a
// KVF_GUARDED_BY member happens with its mutex held and that every function
// marked KVF_REQUIRES is called with it held. Under any other compiler the
// macros expand to nothing, so GCC builds are unaffected.
// tools/thread_safety_check.sh runs the analysis over client/, server/,
// transport/ and core/ with -Werror.
//
// Use them with kvfabric::Mutex (core/mutex.h), whose Lock/Unlock and scoped
// MutexLock carry the acquire/release annotations; a plain std::mutex is not a
// capability and cannot be named in KVF_GUARDED_BY.
//
//   class Counter {
//    public:
//     void Add(int n) KVF_EXCLUDES(mu_) {
//       MutexLock lock(&mu_);
//       AddLocked(n);
//     }
//    private:
//     void AddLocked(int n) KVF_REQUIRES(mu_) { total_ += n; }
//     Mutex mu_;
//     int total_ KVF_GUARDED_BY(mu_) = 0;
//   };
//
// Where the analysis cannot follow (a lock handed to another function, a
// callback invoked under a lock it cannot see), prefer telling it the truth
// (mu_.AssertHeld() in the callback, KVF_REQUIRES on a lambda) over
// KVF_NO_THREAD_SAFETY_ANALYSIS; when the latter is needed, a comment beside it
// says why.
#ifndef KVFABRIC_CORE_THREAD_ANNOTATIONS_H_
#define KVFABRIC_CORE_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define KVF_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define KVF_THREAD_ANNOTATION_(x)
#endif

// On a class: its objects are capabilities (mutex-like); `x` names the kind in
// diagnostics ("mutex").
#define KVF_CAPABILITY(x) KVF_THREAD_ANNOTATION_(capability(x))

// On an RAII class that acquires a capability in its constructor and releases
// it in its destructor (MutexLock).
#define KVF_SCOPED_CAPABILITY KVF_THREAD_ANNOTATION_(scoped_lockable)

// On a data member or global: reads and writes require holding `x`.
#define KVF_GUARDED_BY(x) KVF_THREAD_ANNOTATION_(guarded_by(x))

// On a pointer (or smart pointer) member: dereferencing it requires holding
// `x`; the pointer itself is not guarded.
#define KVF_PT_GUARDED_BY(x) KVF_THREAD_ANNOTATION_(pt_guarded_by(x))

// On a mutex member: the lock order. The analysis checks these only under
// -Wthread-safety-beta; they document the order regardless.
#define KVF_ACQUIRED_BEFORE(...) KVF_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define KVF_ACQUIRED_AFTER(...) KVF_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))

// On a function: the caller must hold the capabilities (exclusively, or at
// least shared), and still holds them on return.
#define KVF_REQUIRES(...) KVF_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define KVF_REQUIRES_SHARED(...) KVF_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))

// On a function: it acquires the capabilities (not held on entry, held on
// return). With no argument on a member of a capability class: `this`.
#define KVF_ACQUIRE(...) KVF_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define KVF_ACQUIRE_SHARED(...) KVF_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))

// On a function: it releases the capabilities (held on entry, not on return).
#define KVF_RELEASE(...) KVF_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define KVF_RELEASE_SHARED(...) KVF_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))

// On a function returning bool (first argument: the value that means
// "acquired"): it may acquire the capabilities.
#define KVF_TRY_ACQUIRE(...) KVF_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define KVF_TRY_ACQUIRE_SHARED(...) \
  KVF_THREAD_ANNOTATION_(try_acquire_shared_capability(__VA_ARGS__))

// On a function: the caller must not hold the capabilities (the function
// takes them itself; holding one would deadlock). Checked under
// -Wthread-safety-negative only.
#define KVF_EXCLUDES(...) KVF_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))

// On a function: it checks at run time that the calling thread holds `x`
// (aborting otherwise), so the analysis may assume it is held afterwards.
#define KVF_ASSERT_CAPABILITY(x) KVF_THREAD_ANNOTATION_(assert_capability(x))
#define KVF_ASSERT_SHARED_CAPABILITY(x) KVF_THREAD_ANNOTATION_(assert_shared_capability(x))

// On a function: it returns a reference to the capability `x` (an accessor).
#define KVF_RETURN_CAPABILITY(x) KVF_THREAD_ANNOTATION_(lock_returned(x))

// On a function: the analysis skips its body. Every use carries a comment
// saying why the analysis cannot follow it.
#define KVF_NO_THREAD_SAFETY_ANALYSIS KVF_THREAD_ANNOTATION_(no_thread_safety_analysis)

#endif  // KVFABRIC_CORE_THREAD_ANNOTATIONS_H_
