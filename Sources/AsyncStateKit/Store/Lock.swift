#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The one lock of this package: a value guarded by a `pthread_mutex_t`, both in one allocation.
///
/// Not `Synchronization.Mutex`: on Linux ThreadSanitizer cannot see `Mutex` (it locks with raw futex
/// calls) and reports every access made under it as a race, which would make
/// `swift test --sanitize=thread` useless. A pthread mutex is seen by TSan and costs about the same
/// uncontended. Every module of the package uses this type (it is `package`, not `public`).
@usableFromInline
package struct LockedValue<Value>: @unchecked Sendable {
    // @unchecked Sendable is sound: the value is only read or written inside `withLock`, which holds
    // the mutex for the whole access, so no two threads ever touch it at once. `Value` need not be
    // Sendable for the same reason (it never escapes the lock except by copy the caller returns).
    @usableFromInline let storage: LockStorage<Value>

    /// Creates a lock guarding `initialValue`.
    @usableFromInline package init(_ initialValue: Value) {
        storage = LockStorage.make(initialValue)
    }

    /// Runs `body` with exclusive access to the guarded value.
    ///
    /// Never call back into the same lock from `body`, and never resume a continuation inside it:
    /// return what must be resumed and resume it after the lock is released.
    @inlinable
    package func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        try storage.withUnsafeMutablePointers { value, mutex in
            MutexWords.lock(mutex)
            defer { MutexWords.unlock(mutex) }
            return try body(&value.pointee)
        }
    }
}

/// The allocation behind a ``LockedValue``: the value as the header, the mutex as the elements (raw
/// words, so that inlinable code need not name the C type).
@usableFromInline
package final class LockStorage<Value>: ManagedBuffer<Value, UInt64> {
    static func make(_ value: Value) -> LockStorage<Value> {
        let words = (MemoryLayout<pthread_mutex_t>.size + 7) / 8
        let buffer = create(minimumCapacity: words) { _ in value }
        let storage = buffer as! LockStorage<Value>  // as swift-nio does: unsafeDowncast miscompiled in 5.10
        storage.withUnsafeMutablePointerToElements { MutexWords.initialize($0) }
        return storage
    }

    deinit {
        // ManagedBuffer destroys the header (the value) itself; the elements are ours to destroy.
        withUnsafeMutablePointerToElements { MutexWords.destroy($0) }
    }
}

/// Takes and releases a ``LockStorage``'s mutex: out of line, so that inlinable callers need not see
/// the C library, and not members of the generic `LockStorage`, whose static methods need its type's
/// metadata: an inlined `withLock` would look it up (a call, cached) on every lock.
@usableFromInline
enum MutexWords {
    /// Takes the mutex at `words`.
    @usableFromInline
    static func lock(_ words: UnsafeMutablePointer<UInt64>) {
        pthread_mutex_lock(UnsafeMutableRawPointer(words).assumingMemoryBound(to: pthread_mutex_t.self))
    }

    /// Takes the mutex at `words` if it is free; whether it did.
    @usableFromInline
    static func tryLock(_ words: UnsafeMutablePointer<UInt64>) -> Bool {
        pthread_mutex_trylock(UnsafeMutableRawPointer(words).assumingMemoryBound(to: pthread_mutex_t.self)) == 0
    }

    /// Releases the mutex at `words`.
    @usableFromInline
    static func unlock(_ words: UnsafeMutablePointer<UInt64>) {
        pthread_mutex_unlock(UnsafeMutableRawPointer(words).assumingMemoryBound(to: pthread_mutex_t.self))
    }

    /// Makes a mutex at `words` (room for a `pthread_mutex_t`, rounded up to words).
    static func initialize(_ words: UnsafeMutablePointer<UInt64>) {
        let mutex = UnsafeMutableRawPointer(words).bindMemory(to: pthread_mutex_t.self, capacity: 1)
        #if canImport(Glibc)
        // Adaptive: a contended lock spins briefly before it sleeps. Every critical section here
        // is a few hundred nanoseconds, so under a stampede the holder is almost always about
        // to release it, and a futex sleep and wake-up would cost far more than the wait.
        var attributes = pthread_mutexattr_t()
        pthread_mutexattr_init(&attributes)
        pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_ADAPTIVE_NP))
        let rc = pthread_mutex_init(mutex, &attributes)
        pthread_mutexattr_destroy(&attributes)
        #else
        let rc = pthread_mutex_init(mutex, nil)
        #endif
        precondition(rc == 0, "pthread_mutex_init failed: \(rc)")
    }

    /// Destroys the mutex at `words`.
    static func destroy(_ words: UnsafeMutablePointer<UInt64>) {
        pthread_mutex_destroy(UnsafeMutableRawPointer(words).assumingMemoryBound(to: pthread_mutex_t.self))
    }
}
