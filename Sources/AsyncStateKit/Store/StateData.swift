public import Foundation

/// What a state knows besides its flight: its value, the phase it settled in, when its data arrived
/// fresh, and its metadata. One value type with the rules that change it, so that a state's machine
/// (``FetchStateMachine``, whose idle state is this value) and a family's entry at rest (which keeps
/// this value, packed: ``Packed``) follow the same rules by calling the same methods.
///
/// It never says `loading`: a flight is the machine's, and the machine's phase is `loading` exactly
/// while it has one. ``phase`` is the phase the state settled in last, which a cancelled flight leaves
/// as it was.
///
/// Every stored property is set by the one designated initializer, which has no default arguments,
/// and none has a default value: a property added here does not compile until that initializer
/// takes it, which breaks ``init(value:freshSince:packed:)`` until ``Packed`` keeps it too.
@usableFromInline
struct StateData<Value: Sendable> {
    /// The latest value: the initial one until a success or a write, then kept through later flights
    /// and failures.
    @usableFromInline var value: Value
    /// The phase the state last settled in: `initial`, `success`, `empty` or `failure`.
    @usableFromInline var phase: AsyncPhase
    /// When the current data arrived fresh, moved by its value's own lifetime if it has one (see
    /// ``StoreConfiguration/freshnessShift(of:)``): every freshness test compares it with the declared
    /// expiry. `nil` when there is none or it was invalidated or failed. While it is set, the data
    /// arrived at ``receivedAt``, so the shift is `freshSince − receivedAt` (``freshnessShift``).
    @usableFromInline var freshSince: Duration?
    /// When the current value arrived (a success or a write; for restored data, its last success as
    /// the archive dated it), kept through invalidations and failures: the age fail-safe measures.
    /// `nil` without a value, or for restored data with no date.
    @usableFromInline var receivedAt: Duration?
    /// When the current failure settled, while it may still be answered from the negative cache.
    @usableFromInline var failedAt: Duration?
    /// When restored data (see ``restore(_:isEmpty:lastSuccess:now:date:restoredAt:)``) was
    /// restored, while it is answered at once under refresh ahead, stale, for
    /// ``StoreConfiguration/restoredWindow``; `nil` when the data was not restored or newer data, an
    /// invalidation or a reset has come since.
    @usableFromInline var restoredAt: Duration?
    /// Whether ``value`` came from a success or a write (not the initial value): stale-while-revalidate
    /// serves it, archives save it.
    @usableFromInline var hasValue: Bool
    /// Whether ``value`` was empty when it arrived (by the emptiness test then, or as an archive said):
    /// what the phase said of it, kept while a later flight loads or fails. Archives save it.
    @usableFromInline var valueIsEmpty: Bool
    /// Failed attempts of the current (or last) fetch; back to zero when a fetch starts or succeeds.
    @usableFromInline var failureCount: Int
    /// The error of the most recent failed attempt, even if a later fetch succeeded.
    @usableFromInline var lastError: (any Error)?
    /// The wall date of the most recent success or write (`set`): the date of the value held.
    @usableFromInline var lastSuccess: Date?
    /// How many fetches have succeeded.
    @usableFromInline var successCount: Int
    /// The newest second-level version this data is known to be (see ``AsyncStateSecondLevel``): the
    /// version of the entry it came from, or of an invalidation that said a newer one exists; 0 for
    /// none. It only grows (``SecondLevelVersion``): a value this replica fetched itself keeps it
    /// (that value is newer still).
    @usableFromInline var version: UInt64

    /// The designated initializer: every field, no defaults (see the type's note).
    @inlinable
    init(
        value: Value, phase: AsyncPhase, freshSince: Duration?, receivedAt: Duration?, failedAt: Duration?,
        restoredAt: Duration?, hasValue: Bool, valueIsEmpty: Bool, failureCount: Int, lastError: (any Error)?,
        lastSuccess: Date?, successCount: Int, version: UInt64
    ) {
        self.value = value
        self.phase = phase
        self.freshSince = freshSince
        self.receivedAt = receivedAt
        self.failedAt = failedAt
        self.restoredAt = restoredAt
        self.hasValue = hasValue
        self.valueIsEmpty = valueIsEmpty
        self.failureCount = failureCount
        self.lastError = lastError
        self.lastSuccess = lastSuccess
        self.successCount = successCount
        self.version = version
    }

    /// A state that has only its initial value.
    @inlinable init(initialValue: Value) {
        self.init(
            value: initialValue, phase: .initial, freshSince: nil, receivedAt: nil, failedAt: nil, restoredAt: nil,
            hasValue: false, valueIsEmpty: false, failureCount: 0, lastError: nil, lastSuccess: nil, successCount: 0,
            version: 0)
    }

    /// Whether this is all a state needs to keep while nobody uses it: a value that succeeded (or was
    /// set, or is empty), no failure. A family then keeps only this, packed (a machine with no flight
    /// and no abandoned operation keeps nothing else but its ids and jitter seeds).
    @inlinable var isAtRest: Bool {
        guard hasValue, failedAt == nil, failureCount == 0 else { return false }
        switch phase {
        case .success, .empty: return true
        case .initial, .loading, .failure: return false
        }
    }

    // MARK: Freshness

    /// Whether the data is fresh at `now`: it arrived less than `expiry` ago and was not invalidated.
    /// `initial` and `failure` are never fresh.
    @inlinable
    func isFresh(at now: Duration, expiry: Duration) -> Bool {
        isWithinExpiry(since: freshSince, at: now, expiry: expiry)
    }

    /// The snapshot at `now`, for data that stays fresh for `expiry`; its phase is `loading` while
    /// `isLoading` (a flight runs).
    @inlinable
    func snapshot(at now: Duration, expiry: Duration, isLoading: Bool = false) -> AsyncSnapshot<Value> {
        AsyncSnapshot(
            value: value, phase: isLoading ? .loading : phase, isExpired: !isFresh(at: now, expiry: expiry),
            failureCount: failureCount, lastError: lastError, lastSuccess: lastSuccess, successCount: successCount,
            hasValue: hasValue)
    }

    /// The last good value, if fail-safe may answer it instead of a failure at `now`: there is one,
    /// and it arrived less than `maxStaleAge` ago (not at it: the age is the maximum then) — by the
    /// one freshness test, with the maximum stale age as the expiry of the value's arrival.
    @inlinable func failSafeValue(at now: Duration, maxStaleAge: Duration?) -> Value? {
        guard let maxStaleAge, hasValue, isWithinExpiry(since: receivedAt, at: now, expiry: maxStaleAge) else {
            return nil
        }
        return value
    }

    // MARK: Changes

    /// How a success treats the data's freshness.
    @usableFromInline enum Freshness {
        /// Fresh from the instant given, moved by `shift` (the value's own lifetime minus the expiry).
        case from(Duration, shift: Duration)
        /// Expired already (the data was invalidated while it was being fetched).
        case expired
        /// As it was (an appended page: a list is as old as its first page).
        case unchanged
    }

    /// New data arrives: `newValue`, empty by `isEmpty`, in a phase dated `date`. What a success, a
    /// write and a restore share: the value is the data's, the phase says what it is, and a cached
    /// failure and a restored window are over.
    @inlinable mutating func receive(_ newValue: Value, isEmpty: Bool, date: Date) {
        value = newValue
        hasValue = true
        valueIsEmpty = isEmpty
        phase = isEmpty ? .empty : .success(date)
        failedAt = nil
        restoredAt = nil
    }

    /// A fetch succeeded with `newValue` (empty by `isEmpty`) at `now`, on `date`. The value is as
    /// old as its data's freshness says: new at `now`, unless `unchanged` (an appended page).
    /// `age`: how long before `now` the value's source answered (a value another replica fetched),
    /// which fail-safe's maximum stale age counts; `version`: its second-level version, if it has one.
    @inlinable mutating func succeed(
        _ newValue: Value, isEmpty: Bool, now: Duration, date: Date, freshness: Freshness, age: Duration,
        version: UInt64
    ) {
        receive(newValue, isEmpty: isEmpty, date: date)
        self.version = SecondLevelVersion.merged(version, known: self.version)
        let arrived = age > .zero ? now.saturatingAdd(.zero - age) : now
        switch freshness {
        case .from(let instant, let shift): (freshSince, receivedAt) = (instant.saturatingAdd(shift), arrived)
        case .expired: (freshSince, receivedAt) = (nil, arrived)
        case .unchanged: break
        }
        failureCount = 0
        lastSuccess = date
        successCount += 1
    }

    /// A fallback: `newValue` (empty by `isEmpty`), another replica's, which a second level held when
    /// the source failed, becomes the last good value — received at `receivedAt` (its source's
    /// answer, on this store's clock), dated `date`, at `version`, not fresh. The failure that follows
    /// (``fail(_:at:keepsFreshness:cached:)``) sets the phase; the counts of successes and failures
    /// are this state's own and stay.
    @inlinable mutating func receiveFallback(
        _ newValue: Value, isEmpty: Bool, receivedAt: Duration, date: Date, version: UInt64
    ) {
        receive(newValue, isEmpty: isEmpty, date: date)
        self.version = SecondLevelVersion.merged(version, known: self.version)
        (freshSince, self.receivedAt, lastSuccess) = (nil, receivedAt, date)
    }

    /// A fetch failed for good with `error` at `now`. Its data stays fresh until its own expiry if
    /// `keepsFreshness` (a failed refresh ahead, a failed append); the failure is answered from the
    /// negative cache from `now` if `cached`.
    @inlinable mutating func fail(_ error: any Error, at now: Duration, keepsFreshness: Bool, cached: Bool) {
        phase = .failure(error)
        if !keepsFreshness { freshSince = nil }
        failedAt = cached ? now : nil
    }

    /// A write (`set`): `newValue`, empty by `isEmpty`, fresh from `now` for its own lifetime
    /// (`shift`, see ``Freshness/from(_:shift:)``), as a fetched value would be; at second-level
    /// `version` if it was written there too (0: it was not), which the data then knows. Its date is
    /// the value's (``lastSuccess``): no second-level entry from before the write is taken over it
    /// (``SecondLevelVersion/takes(_:succeededAt:over:known:)``), and an archive dates it so.
    @inlinable mutating func set(
        _ newValue: Value, isEmpty: Bool, shift: Duration, now: Duration, date: Date, version: UInt64
    ) {
        receive(newValue, isEmpty: isEmpty, date: date)
        lastSuccess = date
        self.version = SecondLevelVersion.merged(version, known: self.version)
        freshSince = now.saturatingAdd(shift)
        receivedAt = now
    }

    /// How far the fresh data's own lifetime moved ``freshSince`` (see
    /// ``StoreConfiguration/freshnessShift(of:)``); `nil` without fresh data.
    @inlinable var freshnessShift: Duration? {
        guard let freshSince, let receivedAt else { return nil }
        return freshSince - receivedAt
    }

    /// An invalidation, which may name the second-level version it makes current: one naming a
    /// version is ignored (`nil`) unless it makes this data older (``SecondLevelVersion``);
    /// otherwise (and always without a version) ``invalidate(now:expiry:)``, and the data knows the
    /// version exists (a load then takes no older entry). The one rule for a state's machine and a
    /// family's compact entry.
    @inlinable mutating func invalidate(now: Duration, expiry: Duration, version: UInt64?) -> Bool? {
        if let version {
            guard SecondLevelVersion.invalidates(version, known: self.version) else { return nil }
            self.version = version
        }
        return invalidate(now: now, expiry: expiry)
    }

    /// `invalidate()`: the data is expired now, for every interval; a cached failure is forgotten, and
    /// restored data is no longer answered at once. Returns whether a snapshot changed: only data fresh
    /// at `now` (for `expiry`) becoming expired changes one.
    @inlinable mutating func invalidate(now: Duration, expiry: Duration) -> Bool {
        let visible = isFresh(at: now, expiry: expiry)
        freshSince = nil
        failedAt = nil
        restoredAt = nil
        return visible
    }

    /// A warm restart: `newValue` as expired data (see ``FetchStateMachine/restore(_:isEmpty:lastSuccess:now:date:)``),
    /// answered at once from `restoredAt` (under refresh ahead), or never (`nil`). Its age is its
    /// last success's, on the wall clock at `date` (`now` on the state's clock): none without a date.
    @inlinable mutating func restore(
        _ newValue: Value, isEmpty: Bool, lastSuccess: Date?, now: Duration, date: Date, restoredAt: Duration?
    ) {
        receive(newValue, isEmpty: isEmpty, date: lastSuccess ?? date)
        self.lastSuccess = lastSuccess
        receivedAt = lastSuccess.flatMap { Self.instant(aged: date.timeIntervalSince($0), at: now) }
        freshSince = nil
        self.restoredAt = restoredAt
        failureCount = 0
    }

    /// The instant `age` seconds before `now`: an age below zero (a date from the future) counts as
    /// zero, one past the limits as the limit; `nil` for NaN.
    @inlinable static func instant(aged age: Double, at now: Duration) -> Duration? {
        guard !age.isNaN else { return nil }
        let limit = AsyncStateLimits.maximumDuration
        let seconds = min(max(age, 0), Double(limit.components.seconds))
        return now.saturatingAdd(.zero - .seconds(seconds))
    }

    /// What a warm restart saves: the value, whether it is empty — as the phase said when it arrived,
    /// not as the emptiness test says now — and when it last succeeded; `nil` without a value.
    @inlinable var archived: (value: Value, isEmpty: Bool, lastSuccess: Date?)? {
        hasValue ? (value, valueIsEmpty, lastSuccess) : nil
    }

    /// Whether anything a reader can see differs from a state that has only its initial value.
    @inlinable var differsFromInitial: Bool {
        let isInitial = if case .initial = phase { true } else { false }
        return hasValue || !isInitial || failureCount != 0 || lastError != nil || lastSuccess != nil
            || successCount != 0
    }
}
