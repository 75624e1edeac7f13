/// One run of a batch operation shared by the per-key flights it answers
/// (``AsyncStateFamily/values(for:retry:_:)``).
///
/// Each key whose fetch the batch call started has a flight whose operation asks this object for its
/// key's value. The first attempt of each key waits for the batch; a retry of that key (its retry
/// policy) runs the batch operation for that key alone. The batch task starts once every flight is
/// known, and is cancelled when every key's first attempt has stopped waiting (each flight was
/// cancelled or timed out).
@usableFromInline
final class BatchLoad<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    @usableFromInline typealias Operation = @Sendable ([Key]) async throws -> [Key: Value]

    private struct State {
        /// The batch's outcome, once it has one.
        var outcome: Result<[Key: Value], any Error>?
        /// Keys whose first attempt has asked already (a later ask is a retry).
        var asked: Set<Key> = []
        /// First attempts waiting for the outcome, by waiter id.
        var waiting: [UInt64: (key: Key, continuation: UnsafeContinuation<Value, any Error>)] = [:]
        var lastWaiter: UInt64 = 0
        /// Keys whose first attempt stopped waiting before the outcome (cancelled).
        var gaveUp = 0
        /// The keys the batch loads; fixed by ``start(_:executor:)``.
        var keys: [Key] = []
        var task: Task<Void, Never>?

        /// Whether every key's first attempt stopped waiting before the batch had an outcome.
        var allGaveUp: Bool { outcome == nil && !keys.isEmpty && gaveUp >= keys.count }
    }

    private let operation: Operation
    private let state = LockedValue(State())
    /// The family's observer and the batch's own fetch, which its events report (`nil` without an
    /// observer).
    private let observation: (observer: Observation, fetch: AsyncStateFetch)?

    /// A batch running `operation`; `observer` (the family's) hears of it, as a fetch of its own.
    @usableFromInline
    init(operation: @escaping Operation, observer: Observation? = nil) {
        self.operation = operation
        observation = observer.map { ($0, AsyncStateFetch(reason: .fetch)) }
    }

    /// Reports `kind` about this batch to the observer, if there is one.
    private func report(_ kind: AsyncStateEvent.Kind) {
        guard let observation else { return }
        observation.observer.deliver(kind, fetch: observation.fetch)
    }

    /// Starts the batch for `keys` (the keys whose flights this batch call started). `attempts` mark
    /// the batch's task as running those flights' first attempts (see ``OperationContext``): the
    /// operation runs their work, so a call from it into one of its own keys is refused as
    /// reentrant, as it would be from a single key's operation, instead of waiting for itself.
    /// `fetches`: those flights, for the observer (empty without one).
    @usableFromInline
    func start(
        _ keys: [Key], attempts: [UInt64], fetches: [AsyncStateFetch], executor: (any TaskExecutor)?
    ) {
        let marked = OperationContext.marks(adding: attempts)
        report(.batchStarted(fetches))
        let task = Task(executorPreference: executor) { [self, operation] in
            let outcome: Result<[Key: Value], any Error>
            do {
                outcome = .success(try await OperationContext.$running.withValue(marked) { try await operation(keys) })
            } catch {
                outcome = .failure(error)
            }
            report(.batchEnded(error: outcome.error))
            finish(outcome)
        }
        let cancelNow = state.withLock { state -> Bool in
            state.keys = keys
            state.task = task
            return state.allGaveUp
        }
        if cancelNow { task.cancel() }
    }

    /// The value of `key`: from the batch for its first attempt, from the operation run for `key`
    /// alone for a retry.
    @usableFromInline
    func value(for key: Key) async throws -> Value {
        let isFirst = state.withLock { $0.asked.insert(key).inserted }
        guard isFirst else { return try Self.pick(key, from: await operation([key])) }
        let id = state.withLock { state -> UInt64 in
            state.lastWaiter &+= 1
            return state.lastWaiter
        }
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { continuation in
                let cancelled = Task.isCancelled
                let (outcome, task) = state.withLock {
                    state -> (Result<[Key: Value], any Error>?, Task<Void, Never>?) in
                    if let outcome = state.outcome { return (outcome, nil) }
                    guard cancelled else {
                        state.waiting[id] = (key, continuation)
                        return (nil, nil)
                    }
                    state.gaveUp += 1
                    return (.failure(CancellationError()), state.allGaveUp ? state.task : nil)
                }
                task?.cancel()
                if let outcome { continuation.resume(with: outcome.flatMap { Self.pickResult(key, from: $0) }) }
            }
        } onCancel: {
            leave(id)
        }
    }

    /// A first attempt's task was cancelled: it stops waiting; the batch is cancelled once every
    /// key's first attempt has.
    private func leave(_ id: UInt64) {
        let (continuation, task) = state.withLock {
            state -> (UnsafeContinuation<Value, any Error>?, Task<Void, Never>?) in
            guard let waiter = state.waiting.removeValue(forKey: id) else { return (nil, nil) }
            state.gaveUp += 1
            return (waiter.continuation, state.allGaveUp ? state.task : nil)
        }
        continuation?.resume(throwing: CancellationError())
        task?.cancel()
    }

    private func finish(_ outcome: Result<[Key: Value], any Error>) {
        let waiting = state.withLock { state in
            state.outcome = outcome
            defer { state.waiting = [:] }
            return state.waiting
        }
        for (key, continuation) in waiting.values {
            continuation.resume(with: outcome.flatMap { Self.pickResult(key, from: $0) })
        }
    }

    private static func pickResult(_ key: Key, from values: [Key: Value]) -> Result<Value, any Error> {
        Result { try pick(key, from: values) }
    }

    private static func pick(_ key: Key, from values: [Key: Value]) throws -> Value {
        guard let value = values[key] else { throw AsyncStateError.missingFromBatch }
        return value
    }
}
