import Foundation

/// What a family's miss does with a second level (see ``AsyncStateSecondLevelOptions`` for the
/// rules): read, lease, load, write, wait. It runs inside the attempt of the key's local flight, so
/// the family's own single flight, cancellation, retry and timeout apply around it unchanged; it
/// answers with the source's value, or with one another replica fetched, which the store settles as
/// arrived (``SecondLevelArrival``) with the freshness it has left.
@usableFromInline
final class SecondLevelLoader<Value: Sendable>: Sendable {
    let options: AsyncStateSecondLevelOptions<Value>
    let clock: StoreClock
    /// How long a value stays fresh from its source's answer, on this replica (its own lifetime, or
    /// the declared expiry).
    let lifetime: @Sendable (Value) -> Duration
    private let health = LockedValue(Health())

    /// Whether the second level is being skipped, and the counts.
    private struct Health {
        /// Until when (on the clock) the second level is skipped; `nil` while it answers.
        var skippedUntil: Duration?
        /// Faults in a row: one per backoff, however many calls that were in flight together fail.
        var faultsInARow = 0
        /// When the last fault was seen (on the clock): a call that started before it neither ends
        /// the backoff by succeeding nor lengthens it by failing.
        var lastFaultAt: Duration?
        var statistics = AsyncStateSecondLevelStatistics()
    }

    /// What a load answered with.
    enum Loaded {
        /// The source's value, which this replica fetched without writing it to the second level.
        case source(Value)
        /// A value with its second-level version: one another replica's source answered with, read
        /// from the second level, or the one this replica fetched and wrote as the lease's holder.
        case arrived(Value, RemoteArrival)
    }

    /// A call to the second level failed (with `error`) or ran past its timeout
    /// (``AsyncStateSecondLevelTimeout``): the load goes to the source.
    private struct Fault: Error {
        var error: any Error
    }

    @usableFromInline
    init(
        options: AsyncStateSecondLevelOptions<Value>, clock: StoreClock,
        lifetime: @escaping @Sendable (Value) -> Duration
    ) {
        (self.options, self.clock, self.lifetime) = (options, clock, lifetime)
    }

    var statistics: AsyncStateSecondLevelStatistics { health.withLock { $0.statistics } }

    /// The second level's key for a family key.
    func key(for description: String) -> String { "\(options.namespace):\(description)" }

    /// A store's operation for `key` that loads through the second level (see ``load(_:_:)``): it
    /// returns the source's value, or throws a value with its version (another replica's, or its own
    /// as the lease's holder) as a ``SecondLevelArrival``, which the store's task settles as arrived.
    ///
    /// An entry older than the value `store` holds (by its source's answer), or than the version it
    /// knows exists, is not taken: a replica's data never gets older, even after it called its
    /// source without the lease (the second level was down, or a wait ran out).
    ///
    /// For a refresh (``FetchRequest/readsTheSource``), it takes no entry: it loads from the source
    /// as the lease's holder, once any other holder's lease is over. What it does is reported to the
    /// store's observer, as part of the fetch.
    @usableFromInline
    func operation<Key>(
        for key: Key, in store: AsyncStateStore<Value?>, request: FetchRequest,
        _ operation: @escaping @Sendable () async throws -> Value
    ) -> @Sendable () async throws -> Value? {
        self.operation(
            named: self.key(for: String(describing: key)), in: store, fromSource: request.readsTheSource, operation
        ) { $0 }
    }

    /// A single state's operation (see ``operation(for:in:request:_:)``): its entry is the
    /// namespace's own key (``stateKey``).
    @usableFromInline
    func operation(
        in store: AsyncStateStore<Value>, request: FetchRequest,
        _ operation: @escaping @Sendable () async throws -> Value
    ) -> @Sendable () async throws -> Value {
        self.operation(named: stateKey, in: store, fromSource: request.readsTheSource, operation) { $0 }
    }

    /// A single state's key in the second level: its namespace and a colon (so that
    /// ``invalidateAll()`` covers it as it covers a family's keys).
    var stateKey: String { key(for: "") }

    /// The operation of a store of `StoreValue` (a family entry's `Value?`, a state's `Value`) for the
    /// second level's `key`; `stored` makes a loaded value the store's.
    private func operation<StoreValue: Sendable>(
        named key: String, in store: AsyncStateStore<StoreValue>, fromSource: Bool,
        _ operation: @escaping @Sendable () async throws -> Value,
        stored: @escaping @Sendable (Value) -> StoreValue
    ) -> @Sendable () async throws -> StoreValue {
        { [self, weak store] in
            let (held, version) =
                store?.core.withLock { ($0.machine.data.lastSuccess, $0.machine.data.version) } ?? (nil, 0)
            var report: (@Sendable (AsyncStateSecondLevelEvent) -> Void)?
            if store?.events != nil { report = { [weak store] in store?.reportSecondLevel($0) } }
            let load = Load(key: key, held: held, minimum: version, fromSource: fromSource, report: report)
            switch try await self.load(load, operation) {
            case .source(let value): return stored(value)
            case .arrived(let value, let arrival):
                throw SecondLevelArrival<StoreValue>(value: stored(value), arrival: arrival)
            }
        }
    }

    /// One load: its key, what an entry must be newer than, and whom to tell.
    struct Load: Sendable {
        /// The second level's key.
        var key: String
        /// The date of the value this replica holds: an entry dated earlier is not taken, nor the
        /// held value itself (its date and ``minimum`` as version). The load runs because that value
        /// is expired or was invalidated: taking it back would undo an invalidation that the second
        /// level missed (the invalidator could not mark it, and the message carries no version).
        var held: Date?
        /// The version this replica knows exists: an entry below it is not taken.
        var minimum: UInt64
        /// A refresh: no entry is taken.
        var fromSource: Bool
        var report: (@Sendable (AsyncStateSecondLevelEvent) -> Void)?
    }

    /// Loads a key's value: from the second level if it holds a fresh one, else from `operation` as
    /// the lease's holder (writing it), else from the holder's write; from `operation` directly when
    /// the second level fails or a wait runs out.
    func load(_ load: Load, _ operation: @Sendable () async throws -> Value) async throws -> Loaded {
        if isSkipped() {
            note(.skipped, load)
            return .source(try await operation())
        }
        do {
            return try await loadThroughSecondLevel(load, operation)
        } catch let fault as Fault {
            note(.fault(error: fault.error), load)
            try Task.checkCancellation()  // a call ended by this load's cancellation: no source call
            return .source(try await operation())
        }
    }

    private func loadThroughSecondLevel(_ load: Load, _ operation: @Sendable () async throws -> Value) async throws
        -> Loaded
    {
        let key = load.key
        if !load.fromSource, let fresh = try await freshEntry(load) { return fresh }
        let giveUpAt = clock.now().saturatingAdd(options.maximumWait)
        var waited = false
        while true {
            switch try await bounded({ [options] in
                try await options.level.acquireLease(on: key, for: options.leaseDuration)
            }) {
            case .acquired(let token):
                return try await loadAsHolder(load, token: token, afterWaiting: waited, operation)
            case .held(let expiresIn):
                if !waited {
                    waited = true
                    note(.waiting, load)
                }
                // Read every poll until the holder's write is there; ask for the lease again once
                // its lease has expired (or at the next poll: a holder may give it back early).
                let now = clock.now()
                // Never sooner than a millisecond (a lease said to expire now, or already: skewed
                // clocks), so that a waiter never spins.
                let wake = min(
                    now.saturatingAdd(options.pollInterval),
                    now.saturatingAdd(max(expiresIn, .milliseconds(1))), giveUpAt)
                try await clock.sleep(max(wake, now))
                if !load.fromSource, let fresh = try await freshEntry(load) { return fresh }
                if clock.now() >= giveUpAt {
                    note(.waitRanOut, load)
                    return .source(try await operation())
                }
            }
        }
    }

    /// The holder's load: the source's value, written with the lease's token as its version; the
    /// lease is given back afterwards whatever happens (after the write, so that a replica that
    /// finds the lease free finds the entry too). A holder that waited for another first reads the
    /// entry once more: its last read found none, and that holder may have written it and given the
    /// lease back since.
    private func loadAsHolder(
        _ load: Load, token: UInt64, afterWaiting waited: Bool, _ operation: @Sendable () async throws -> Value
    ) async throws -> Loaded {
        let key = load.key
        // Given back in a task of its own, whatever happens: not held up by a slow second level, and
        // not skipped when this load was cancelled (its caller's cancellation would end the call at
        // once, and the other replicas would wait for the lease to expire).
        defer { Task(executorPreference: clock.executor) { [self] in await release(key, token: token) } }
        if waited, !load.fromSource, let fresh = try await freshEntry(load) { return fresh }
        let value = try await operation()
        let date = clock.date()
        let lifetime = lifetime(value)
        guard lifetime > .zero, let payload = try? options.codec.encode(value) else {
            note(.loaded(version: nil), load)
            return .source(value)
        }
        let entry = AsyncStateStoredEntry(
            payload: payload, succeededAt: date, freshUntil: date.addingTimeInterval(lifetime.timeInterval),
            version: token)
        // Written in a task of its own: once the source has answered, the entry saves the fleet a
        // call even if this load's callers have all left (its cancellation would end the call).
        let written = await Task(executorPreference: clock.executor) { [self, options] in
            try? await bounded { try await options.level.write(entry, for: key) }
        }.value
        switch written {
        case true?:
            note(.loaded(version: token), load)
            return .arrived(value, RemoteArrival(age: .zero, lifetime: lifetime, date: date, version: token))
        case false?:
            // A newer holder wrote first (this one outlived its lease), or the key was invalidated
            // since: the entry there is newer than this value.
            note(.writeRefused(version: token), load)
            var newer = load
            (newer.held, newer.minimum) = (nil, token)
            if let fresh = try? await freshEntry(newer) { return fresh }
            // The newer version is an invalidation's (no fresh entry): this value is from before the
            // change, and lands expired (the next read loads again).
            return .arrived(value, RemoteArrival(age: .zero, lifetime: .zero, date: date, version: token))
        case nil:
            note(.loaded(version: nil), load)
            return .source(value)
        }
    }

    /// Gives the lease back, within the timeout; a fault only counts.
    private func release(_ key: String, token: UInt64) async {
        _ = try? await bounded { [options] in try await options.level.releaseLease(on: key, token: token) }
    }

    /// The key's entry as an answer, if the second level holds a fresh one that decodes, is at least
    /// the load's minimum version, and is neither older than the value the replica holds nor that
    /// value itself.
    private func freshEntry(_ load: Load) async throws -> Loaded? {
        let key = load.key
        guard let entry = try await bounded({ [options] in try await options.level.read(key) }) else { return nil }
        guard entry.version >= load.minimum else { return nil }
        if let held = load.held,
            entry.succeededAt < held || (entry.succeededAt == held && entry.version == load.minimum)
        {
            return nil
        }
        let value: Value
        do {
            value = try options.codec.decode(entry.payload)
        } catch {
            // An invalidation's marker has no payload: not a fault of the entry.
            if !entry.payload.isEmpty { note(.undecodable(error: error), load) }
            return nil
        }
        let date = clock.date()
        let age = max(Duration.clamped(seconds: date.timeIntervalSince(entry.succeededAt)), .zero)
        // Never fresher than this replica would keep it from the source's answer.
        let remaining = min(
            Duration.clamped(seconds: entry.freshUntil.timeIntervalSince(date)), lifetime(value) - age)
        guard remaining > .zero else { return nil }
        note(.hit(version: entry.version), load)
        return .arrived(
            value, RemoteArrival(age: age, lifetime: remaining, date: entry.succeededAt, version: entry.version))
    }

    /// Marks `key`'s entry stale in the second level (before a change made through this replica is
    /// announced to the others); the version its next entry will exceed, or `nil` when the second
    /// level failed (or is being skipped).
    ///
    /// Tried even while loads skip the second level (a change must reach it if it can), and in a
    /// task of its own: the caller's cancellation (a request dropped after its write) does not stop
    /// it.
    func invalidate(_ key: String) async -> UInt64? {
        await Task(executorPreference: clock.executor) { [self, options] in
            try? await bounded { try await options.level.invalidate(key) }
        }.value
    }

    /// Marks every entry of this family stale in the second level (as ``invalidate(_:)`` does, tried
    /// whatever the backoff, and not stopped by the caller's cancellation); whether it did.
    func invalidateAll() async -> Bool {
        await Task(executorPreference: clock.executor) { [self, options] in
            (try? await bounded { try await options.level.invalidateAll(withPrefix: "\(options.namespace):") })
                != nil
        }.value
    }

    /// Whether the second level is being skipped after a fault.
    private func isSkipped() -> Bool {
        health.withLock { health in
            guard let until = health.skippedUntil, clock.now() < until else { return false }
            return true
        }
    }

    /// Counts `event` and tells the observer.
    private func note(_ event: AsyncStateSecondLevelEvent, _ load: Load) {
        health.withLock { health in
            switch event {
            case .hit: health.statistics.hits += 1
            case .loaded: health.statistics.loads += 1
            case .waiting: health.statistics.waits += 1
            case .waitRanOut: health.statistics.waitsRunOut += 1
            case .fault: break  // counted where it happens (every fault, reported or not)
            case .skipped: health.statistics.skipped += 1
            case .undecodable: health.statistics.undecodable += 1
            case .writeRefused:
                health.statistics.refusedWrites += 1
                health.statistics.loads += 1
            }
        }
        load.report?(event)
    }

    /// Runs one call to the second level, bounded by the timeout: its result, or ``Fault`` when it
    /// throws or runs past the timeout (then it is cancelled and left behind, so a call that
    /// ignores cancellation cannot hold the load). A fault makes the second level skipped for the
    /// backoff; a success ends the backoff. The caller's cancellation ends the wait at once with
    /// `CancellationError`.
    private func bounded<T: Sendable>(_ call: @escaping @Sendable () async throws -> T) async throws -> T {
        let race = Race<T>()
        let startedAt = clock.now()
        let deadline = startedAt.saturatingAdd(options.timeout)
        let result: Result<T, any Error> = await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                race.begin(continuation)
                let work = Task(executorPreference: clock.executor) {
                    do {
                        race.finish(.success(try await call()))
                    } catch {
                        race.finish(.failure(error))
                    }
                }
                let timer = Task(executorPreference: clock.executor) { [clock, options] in
                    try? await clock.sleep(deadline)
                    if !Task.isCancelled {
                        race.finish(.failure(AsyncStateSecondLevelTimeout(after: options.timeout)))
                    }
                }
                race.onFinish {
                    work.cancel()
                    timer.cancel()
                }
            }
        } onCancel: {
            race.finish(.failure(CancellationError()))
        }
        switch result {
        case .success(let value):
            health.withLock { health in
                guard health.lastFaultAt.map({ startedAt >= $0 }) ?? true else { return }
                (health.faultsInARow, health.skippedUntil, health.lastFaultAt) = (0, nil, nil)
            }
            return value
        case .failure(let error) where error is CancellationError && Task.isCancelled:
            throw error
        case .failure(let error):
            let now = clock.now()
            health.withLock { health in
                health.statistics.faults += 1
                // Calls in flight together fail together: one fault for the backoff.
                guard health.lastFaultAt.map({ startedAt >= $0 }) ?? true else { return }
                health.lastFaultAt = now
                health.faultsInARow += 1
                var backoff = options.faultBackoff
                for _ in 1..<min(health.faultsInARow, 32) where backoff < options.maximumFaultBackoff {
                    backoff = backoff.saturatingAdd(backoff)
                }
                health.skippedUntil = now.saturatingAdd(min(backoff, options.maximumFaultBackoff))
            }
            throw Fault(error: error)
        }
    }
}

/// The first of a call's result, its timeout and its caller's cancellation to arrive resumes the
/// waiting caller; the others are dropped.
private final class Race<T: Sendable>: Sendable {
    private struct State {
        var continuation: UnsafeContinuation<Result<T, any Error>, Never>?
        var result: Result<T, any Error>?
        var cleanup: (@Sendable () -> Void)?
        var finished = false
    }
    private let state = LockedValue(State())

    /// Registers the waiting caller (a result that came first is delivered now).
    func begin(_ continuation: UnsafeContinuation<Result<T, any Error>, Never>) {
        let early = state.withLock { state -> Result<T, any Error>? in
            if let result = state.result { return result }
            state.continuation = continuation
            return nil
        }
        if let early { continuation.resume(returning: early) }
    }

    /// Runs `cleanup` once the race is decided (now, if it is).
    func onFinish(_ cleanup: @escaping @Sendable () -> Void) {
        let now = state.withLock { state -> Bool in
            if state.finished { return true }
            state.cleanup = cleanup
            return false
        }
        if now { cleanup() }
    }

    /// Decides the race with `result` unless it is decided.
    func finish(_ result: Result<T, any Error>) {
        let (continuation, cleanup) = state.withLock {
            state -> (UnsafeContinuation<Result<T, any Error>, Never>?, (@Sendable () -> Void)?) in
            guard !state.finished else { return (nil, nil) }
            state.finished = true
            state.result = result
            defer { (state.continuation, state.cleanup) = (nil, nil) }
            return (state.continuation, state.cleanup)
        }
        continuation?.resume(returning: result)
        cleanup?()
    }
}

/// What an operation wrapped by a second level throws to hand its store a value another replica
/// fetched: the store's task turns it into the machine's ``FetchStateMachine/Outcome/arrived(_:_:)``
/// (it never reaches a caller).
@usableFromInline
struct SecondLevelArrival<Value: Sendable>: Error {
    @usableFromInline let value: Value
    @usableFromInline let arrival: RemoteArrival
}

extension Duration {
    /// `interval` seconds, within `±AsyncStateLimits.maximumDuration` (a wall-clock difference read
    /// from a second level may be anything).
    static func clamped(seconds interval: TimeInterval) -> Duration {
        let bound = AsyncStateLimits.maximumDuration.timeInterval
        guard !interval.isNaN else { return .zero }
        return .nanoseconds(Int64(max(-bound, min(bound, interval)) * 1e9))
    }
}
