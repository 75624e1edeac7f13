import Foundation

/// What a family's miss does with a second level (see ``AsyncStateSecondLevelOptions`` for the
/// rules): read, lease, load, write, wait. It runs inside the attempt of the key's local flight, so
/// the family's own single flight, cancellation, retry and timeout apply around it unchanged. It
/// reads the state only through the attempt's ``AttemptInput``, and answers a typed
/// ``AttemptResult``: the source's answer, or a value another replica fetched (``AttemptResult/arrived(_:_:)``),
/// which the machine settles with the freshness it has left. Which entries it may take, and how
/// fresh they are, the machine's rules decide (``AttemptInput/mayTake(version:succeededAt:)``,
/// ``AttemptInput/arrival(succeededAt:freshUntil:version:lifetime:at:)``).
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

    /// The second level's key of a family's key: the one way it is named, by loads and by the
    /// invalidator (`"007"` and 7 are different keys there as they are here).
    @usableFromInline func key<Key>(of key: Key) -> String { self.key(for: String(describing: key)) }

    /// The second level's key for a key's description (a message's key that names no entry here).
    func key(for description: String) -> String { "\(options.namespace):\(description)" }

    /// A single state's key in the second level: its namespace and a colon (so that
    /// ``invalidateAll()`` covers it as it covers a family's keys).
    @usableFromInline var stateKey: String { key(for: "") }

    /// The operation of a store of `StoreValue` (a family entry's `Value?`, a state's `Value`) that
    /// loads `source` through the second level's `key` (see ``load(_:report:_:unwrap:stored:)``).
    /// `unwrap` gives the value to write from the store's (`nil`: not written); `stored` makes a
    /// value read from the second level the store's. What it does is reported to `store`'s observer,
    /// as part of the fetch.
    @usableFromInline
    func operation<StoreValue: Sendable>(
        named key: String, reportingTo store: AsyncStateStore<StoreValue>, _ source: FetchOperation<StoreValue>,
        unwrap: @escaping @Sendable (StoreValue) -> Value?, stored: @escaping @Sendable (Value) -> StoreValue
    ) -> FetchOperation<StoreValue> {
        var report: (@Sendable (AsyncStateSecondLevelEvent) -> Void)?
        if store.events != nil { report = { [weak store] in store?.reportSecondLevel($0) } }
        return .reading { [self, report] input in
            let load = Load(key: key, input: input, report: report)
            return try await self.load(load, { try await source.run(with: input) }, unwrap: unwrap, stored: stored)
        }
    }

    /// What a load's reads of the second level found: the version the last one found (0: no entry;
    /// `nil` before a read).
    struct Reading {
        var seen: UInt64?
    }

    /// One load: its key, what its attempt read of the state, and whom to tell.
    struct Load<StoreValue: Sendable>: Sendable {
        /// The second level's key.
        var key: String
        /// What the attempt read of the state: the held value's date and the version its data is
        /// known to be (which entries it may take), and whether it must read the source.
        var input: AttemptInput<StoreValue>
        var report: (@Sendable (AsyncStateSecondLevelEvent) -> Void)?
    }

    /// Loads a key's value: from the second level if it holds a fresh one the input may take, else
    /// from `source` as the lease's holder (writing it), else from the holder's write; from `source`
    /// directly when the second level fails or a wait runs out.
    func load<StoreValue>(
        _ load: Load<StoreValue>, _ source: @Sendable () async throws -> AttemptResult<StoreValue>,
        unwrap: @Sendable (StoreValue) -> Value?, stored: @Sendable (Value) -> StoreValue
    ) async throws -> AttemptResult<StoreValue> {
        if isSkipped() {
            note(.skipped, load)
            return try await source()
        }
        var reading = Reading()
        do {
            return try await loadThroughSecondLevel(load, &reading, source, unwrap: unwrap, stored: stored)
        } catch let fault as Fault {
            note(.fault(error: fault.error), load)
            try Task.checkCancellation()  // a call ended by this load's cancellation: no source call
            return try await source()
        }
    }

    private func loadThroughSecondLevel<StoreValue>(
        _ load: Load<StoreValue>, _ reading: inout Reading,
        _ source: @Sendable () async throws -> AttemptResult<StoreValue>,
        unwrap: @Sendable (StoreValue) -> Value?, stored: @Sendable (Value) -> StoreValue
    ) async throws -> AttemptResult<StoreValue> {
        let key = load.key
        let readsEntries = !load.input.readsTheSource
        if readsEntries, let fresh = try await freshEntry(load, reading: &reading, stored: stored) { return fresh }
        let giveUpAt = load.input.waitEnds(from: clock.now(), maximumWait: options.maximumWait)
        var waited = false
        while true {
            switch try await bounded({ [options] in
                try await options.level.acquireLease(on: key, for: options.leaseDuration)
            }) {
            case .acquired(let token, let storedVersion):
                // Read again when another replica may have written since the last read: the grant
                // names another version, or does not say.
                let readsAgain = reading.seen != nil && (storedVersion == nil || storedVersion != reading.seen)
                return try await loadAsHolder(
                    load, &reading, token: token, readsAgain: readsAgain, source, unwrap: unwrap, stored: stored)
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
                if readsEntries, let fresh = try await freshEntry(load, reading: &reading, stored: stored) {
                    return fresh
                }
                if clock.now() >= giveUpAt {
                    note(.waitRanOut, load)
                    return try await source()
                }
            }
        }
    }

    /// The holder's load: the source's value, written with the lease's token as its version; the
    /// lease is given back afterwards whatever happens (after the write, so that a replica that
    /// finds the lease free finds the entry too). A holder that `readsAgain` reads the entry once
    /// more first: its last read found none it could take, and another replica may have written one
    /// and given the lease back since. A source that answers "not modified" writes nothing.
    private func loadAsHolder<StoreValue>(
        _ load: Load<StoreValue>, _ reading: inout Reading, token: UInt64, readsAgain: Bool,
        _ source: @Sendable () async throws -> AttemptResult<StoreValue>, unwrap: @Sendable (StoreValue) -> Value?,
        stored: @Sendable (Value) -> StoreValue
    ) async throws -> AttemptResult<StoreValue> {
        let key = load.key
        // Given back in a task of its own, whatever happens: not held up by a slow second level, and
        // not skipped when this load was cancelled (its caller's cancellation would end the call at
        // once, and the other replicas would wait for the lease to expire). A write in the background
        // gives it back itself, after the write.
        var releasesOnReturn = true
        defer {
            if releasesOnReturn {
                Task(executorPreference: clock.executor) { [self] in await release(key, token: token) }
            }
        }
        if readsAgain, let fresh = try await freshEntry(load, reading: &reading, stored: stored) { return fresh }
        let answer: AttemptResult<StoreValue>
        do {
            answer = try await source()
        } catch {
            // It called its source as the holder: reported as every holder's load is, with nothing
            // written.
            note(.loaded(version: nil), load)
            throw error
        }
        guard case .value(let answered) = answer, let value = unwrap(answered) else {
            note(.loaded(version: nil), load)
            return answer
        }
        let date = clock.date()
        let lifetime = Self.jittered(lifetime(value), by: options.expiryJitter, key: key, version: token)
        guard lifetime > .zero, let envelope = try? options.codec.encode(value),
            let entry = EntrySeal.entry(
                envelope, key: key, version: token, succeededAt: date,
                freshUntil: date.addingTimeInterval(lifetime.timeInterval), authenticator: options.authenticator)
        else {
            note(.loaded(version: nil), load)
            return answer
        }
        // Dated as its entry is (a sealed one's date is down to the millisecond): the replica's own
        // value and its entry are the same, and it does not take the entry back after an
        // invalidation that names no version (``AttemptInput/mayTake(version:succeededAt:)``).
        let arrival = RemoteArrival(age: .zero, lifetime: lifetime, date: entry.succeededAt, version: token)
        // Written in a task of its own: once the source has answered, the entry saves the fleet a
        // call even if this load's callers have all left (its cancellation would end the call).
        let write = Task(executorPreference: clock.executor) { [self, options] in
            let written = try? await bounded { try await options.level.write(entry, for: key) }
            if options.writesInBackground {
                await release(key, token: token)
                if written == false { note(.writeRefused(version: token), load) }
            }
            return written
        }
        if options.writesInBackground {
            // The callers are answered now; the write and the release follow, each within the
            // timeout. A write the second level refuses is counted, and its newer version reaches
            // this replica as the invalidation that made it (or is taken at the next miss).
            releasesOnReturn = false
            note(.loaded(version: token), load)
            return .arrived(answered, arrival)
        }
        let written = await write.value
        switch written {
        case true?:
            note(.loaded(version: token), load)
            return .arrived(answered, arrival)
        case false?:
            // A newer holder wrote first (this one outlived its lease), or the key was invalidated
            // since: the entry there is newer than this value.
            note(.writeRefused(version: token), load)
            var newer = load
            newer.input = load.input.requiring(version: token)
            var reading = Reading()
            if let fresh = try? await freshEntry(newer, reading: &reading, stored: stored) { return fresh }
            // The newer version is an invalidation's (no fresh entry): this value is from before the
            // change, and lands expired (the next read loads again).
            return .arrived(
                answered, RemoteArrival(age: .zero, lifetime: .zero, date: entry.succeededAt, version: token))
        case nil:
            note(.loaded(version: nil), load)
            return answer
        }
    }

    /// `lifetime` less an amount in `0...jitter` (never more than `lifetime` less a nanosecond)
    /// drawn from `key` and `version`: the one rule of expiry jitter
    /// (``AsyncStateSecondLevelOptions/expiryJitter``).
    static func jittered(_ lifetime: Duration, by jitter: Duration, key: String, version: UInt64) -> Duration {
        guard jitter > .zero, lifetime > .nanoseconds(1) else { return lifetime }
        // FNV-1a over the key's bytes, mixed with the version (stable across processes, unlike
        // `Hasher`).
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in key.utf8 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        var random = SplitMix64(seed: hash ^ version)
        let bound = min(jitter, lifetime - .nanoseconds(1))
        let nanoseconds = UInt64(clamping: bound.attoseconds / 1_000_000_000)
        let draw = nanoseconds == .max ? random.next() : random.next() % (nanoseconds + 1)
        return lifetime - .nanoseconds(Int64(clamping: draw))
    }

    /// Gives the lease back, within the timeout; a fault only counts.
    private func release(_ key: String, token: UInt64) async {
        _ = try? await bounded { [options] in try await options.level.releaseLease(on: key, token: token) }
    }

    /// The key's entry as an answer, if the second level holds one that decodes and that the load's
    /// input may take fresh (the machine's rules: ``AttemptInput/mayTake(version:succeededAt:)``,
    /// ``AttemptInput/arrival(succeededAt:freshUntil:version:lifetime:at:)``). The read's version goes
    /// to `reading` (0: no entry), and an entry it may take that is not fresh is offered to the
    /// flight as its fail-safe fallback (``AttemptInput/offerFallback``).
    private func freshEntry<StoreValue>(
        _ load: Load<StoreValue>, reading: inout Reading, stored: @Sendable (Value) -> StoreValue
    ) async throws -> AttemptResult<StoreValue>? {
        let key = load.key
        let entry = try await bounded({ [options] in try await options.level.read(key) })
        reading.seen = entry?.version ?? 0
        let date = clock.date()
        if let entry, !AttemptInput<StoreValue>.isPlausible(succeededAt: entry.succeededAt, at: date) {
            note(
                .undecodable(
                    error: AsyncStateSecondLevelImplausibleEntry(succeededAt: entry.succeededAt, readAt: date)), load)
            return nil
        }
        guard let entry, load.input.mayTake(version: entry.version, succeededAt: entry.succeededAt) else {
            return nil
        }
        // An invalidation's marker has no payload: nothing to take, and not a fault of the entry.
        guard !entry.payload.isEmpty else { return nil }
        let value: Value
        do {
            value = try options.codec.decode(
                EntrySeal.envelope(of: entry, key: key, authenticator: options.authenticator))
        } catch {
            note(.undecodable(error: error), load)
            return nil
        }
        guard
            let arrival = AttemptInput<StoreValue>.arrival(
                succeededAt: entry.succeededAt, freshUntil: entry.freshUntil, version: entry.version,
                lifetime: lifetime(value), at: date)
        else {
            // Not fresh, but one the load may take: the flight keeps it as what fail-safe may answer
            // if it fails for good, by its source's failure or its own timeout
            // (``FetchStateMachine/takesFallback(_:at:)``).
            let age = Duration.clamped(seconds: date.timeIntervalSince(entry.succeededAt))
            load.input.offerFallback?(
                stored(value),
                RemoteArrival(age: max(age, .zero), lifetime: .zero, date: entry.succeededAt, version: entry.version))
            return nil
        }
        note(.hit(version: entry.version), load)
        return .arrived(stored(value), arrival)
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

    /// Stores `value`, written through this replica, as `key`'s entry under a new version
    /// (``AsyncStateSecondLevel/put(for:entry:)``), fresh for its lifetime from now: the version, or `nil`
    /// when it could not (a fault, a second level without `put`, a value not to be kept — a lifetime
    /// of zero — or one that does not encode). Tried whatever the backoff, in a task of its own.
    func put(_ value: Value, key: String) async -> UInt64? {
        let lifetime = lifetime(value)
        guard lifetime > .zero, let envelope = try? options.codec.encode(value) else { return nil }
        let date = clock.date()
        let freshUntil = date.addingTimeInterval(lifetime.timeInterval)
        return await Task(executorPreference: clock.executor) { [self, options] in
            try? await bounded {
                try await options.level.put(for: key) { version in
                    guard
                        let entry = EntrySeal.entry(
                            envelope, key: key, version: version, succeededAt: date, freshUntil: freshUntil,
                            authenticator: options.authenticator)
                    else { throw AsyncStateSecondLevelUnauthenticatedEntry(key: key, version: version) }
                    return entry
                }
            }
        }.value
    }

    /// Marks every entry of this family stale in the second level (as ``invalidate(_:)`` does, tried
    /// whatever the backoff, and not stopped by the caller's cancellation); whether it did.
    func invalidateAll() async -> Bool {
        await Task(executorPreference: clock.executor) { [self, options] in
            (try? await bounded { try await options.level.invalidateAll(withPrefix: self.key(for: "")) })
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
    private func note<StoreValue>(_ event: AsyncStateSecondLevelEvent, _ load: Load<StoreValue>) {
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
