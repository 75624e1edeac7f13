public import Synchronization

/// What a waiter is resumed with: one object for all the waiters of a settled flight, or
/// ``cancelled`` for a waiter whose task was cancelled. A waiter's continuation carries this
/// reference rather than the value, so that neither the slots nor the settling loop depend on the
/// value's type.
///
/// A failure (and ``cancelled``) is an instance of this class itself, with the error to throw; a
/// success is a ``WaiterValue``, which adds the value. No stored type of either depends on the
/// value's type except the value itself: a generic class whose stored type did (a
/// `Result<Value, any Error>`) had its deinitializer look the type's metadata up at run time, for
/// every flight.
@usableFromInline
class WaiterOutcome: @unchecked Sendable {
    // @unchecked: `failure` is a `let` of a `Sendable` type, and the one subclass, ``WaiterValue``,
    // adds only a `let` of a `Sendable` type; nothing is ever mutated but ``published``, an atomic.

    /// The error a waiter throws; `nil` for a ``WaiterValue``.
    @usableFromInline let failure: (any Error)?

    /// Set (releasing) once the outcome is built, read (acquiring) by each waiter before it reads the
    /// rest. On every processor Swift runs on the continuation that carries the outcome already
    /// orders these reads after the writes; the pair is for ThreadSanitizer, which does not see that
    /// order when a continuation is resumed before its task has suspended (the runtime's fast path
    /// is not instrumented: swiftlang/swift#57803), and reported a race on `failure` once in a few
    /// dozen runs of the suite. On x86-64 and arm64 both are plain moves.
    @usableFromInline let published: Atomic<Bool> = Atomic(false)

    /// A waiter whose task was cancelled: it throws `CancellationError`.
    @usableFromInline static let cancelled = WaiterOutcome(failure: CancellationError())

    /// An outcome that throws `failure`.
    @inlinable init(failure: any Error) { self.failure = failure }

    /// For ``WaiterValue`` only: an instance of this class itself always has a failure, which
    /// ``result(as:)`` relies on.
    @inlinable init() { self.failure = nil }

    /// The outcome of a settled flight: a ``WaiterValue`` for a success.
    @inlinable
    static func settled<Value: Sendable>(_ result: Result<Value, any Error>) -> WaiterOutcome {
        let outcome: WaiterOutcome
        switch result {
        case .success(let value): outcome = WaiterValue(value)
        case .failure(let error): outcome = WaiterOutcome(failure: error)
        }
        outcome.published.store(true, ordering: .releasing)
        return outcome
    }

    /// The value, or the error to throw. `Value` is the waiting state's type, which a settled
    /// flight's ``WaiterValue`` always has.
    @inlinable
    final func result<Value: Sendable>(as _: Value.Type) throws -> Value {
        _ = published.load(ordering: .acquiring)
        if let failure { throw failure }
        return unsafeDowncast(self, to: WaiterValue<Value>.self).value
    }
}

/// The outcome of a flight that succeeded, shared by all its waiters.
@usableFromInline
final class WaiterValue<Value: Sendable>: WaiterOutcome, @unchecked Sendable {
    // @unchecked: see ``WaiterOutcome``; `value` is a `let` of a `Sendable` type.
    @usableFromInline let value: Value

    @inlinable
    init(_ value: Value) {
        self.value = value
        super.init()
    }
}
