#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The one lock of this package: a value guarded by a `pthread_mutex_t`.
///
/// Not `Synchronization.Mutex`: on Linux ThreadSanitizer cannot see `Mutex` (it locks with raw futex
/// calls) and reports every access made under it as a race, which would make
/// `swift test --sanitize=thread` useless. A pthread mutex is seen by TSan and costs about the same
/// uncontended. Every module of the package uses this type (it is `package`, not `public`).
@usableFromInline
package final class LockedValue<Value>: @unchecked Sendable {
    // @unchecked Sendable is sound: `value` is only read or written inside `withLock`, which holds
    // `mutex` for the whole access, so no two threads ever touch it at once. `Value` need not be
    // Sendable for the same reason (it never escapes the lock except by copy the caller returns).
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    /// The guarded value, behind a pointer: the lock already excludes other accesses, and a stored
    /// `var` of a class would pay a dynamic exclusivity check on every access.
    @usableFromInline let value: UnsafeMutablePointer<Value>

    /// Creates a lock guarding `initialValue`.
    package init(_ initialValue: Value) {
        value = .allocate(capacity: 1)
        value.initialize(to: initialValue)
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        let rc = pthread_mutex_init(mutex, nil)
        precondition(rc == 0, "pthread_mutex_init failed: \(rc)")
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
        value.deinitialize(count: 1)
        value.deallocate()
    }

    /// Runs `body` with exclusive access to the guarded value.
    ///
    /// Never call back into the same lock from `body`, and never resume a continuation inside it:
    /// return what must be resumed and resume it after the lock is released.
    @inlinable
    package func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        lock()
        defer { unlock() }
        return try body(&value.pointee)
    }

    /// Takes the lock (out of line, so that inlinable callers need not see the C library).
    @usableFromInline
    package func lock() {
        pthread_mutex_lock(mutex)
    }

    /// Releases the lock.
    @usableFromInline
    package func unlock() {
        pthread_mutex_unlock(mutex)
    }
}
