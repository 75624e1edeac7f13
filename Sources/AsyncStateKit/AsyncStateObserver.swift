/// Receives what a state (or a family's entries) does, for logs, metrics and traces — without the
/// library depending on any of them.
///
/// Give one to a state with `name:` and `observer:`; a state without an observer pays nothing for the
/// feature but a check. An adapter is a few lines:
///
/// ```swift
/// struct PrintObserver: AsyncStateObserver {
///     func observe(_ event: AsyncStateEvent) { print(event.name, event.kind) }
/// }
/// ```
///
/// Events are delivered after the state's lock is released, never while it is held, so an observer
/// may read the state. A state's events other than ``AsyncStateEvent/Kind/hit`` reach its observer in
/// the order they happened, one at a time (they are queued under the state's lock), and a fetch's
/// events are delivered before its callers resume — unless another thread is delivering that
/// state's events at that moment, which then delivers them a moment later. A hit is delivered by the
/// caller's own task, as it happens; a family's removals, by whoever caused them. Keep `observe`
/// short: it runs on the thread of whoever caused the event.
///
/// A caller that did not get fresh data at once — a miss — is reported as what it did next:
/// ``AsyncStateEvent/Kind/joined`` a fetch in flight, or ``AsyncStateEvent/Kind/started(_:)`` one
/// with ``AsyncStateEvent/Reason/fetch``; so misses are `joined` plus `started(.fetch)`. A caller
/// answered at once with data that was not fresh is ``AsyncStateEvent/Kind/servedStale``, never a
/// hit.
///
/// Every ``AsyncStateEvent/Kind/started(_:)`` is followed by exactly one outcome of that fetch:
/// ``AsyncStateEvent/Kind/succeeded(duration:attempts:)``,
/// ``AsyncStateEvent/Kind/failed(error:duration:attempts:)`` or ``AsyncStateEvent/Kind/cancelled``
/// — the last also when the fetch was ended by something else: ``AsyncState/set(_:)`` (its result
/// would never land), ``AsyncState/refresh(retry:_:)`` replacing it (reported before the new fetch's
/// start), ``AsyncState/reset()``, ``AsyncState/cancel()``, or its last caller leaving. So a gauge of
/// fetches in flight built from these events never drifts.
public protocol AsyncStateObserver: Sendable {
    /// Called once per event.
    func observe(_ event: AsyncStateEvent)
}

/// One thing a state did.
public struct AsyncStateEvent: Sendable {
    /// The state's name (its `name:`), for log metadata and metric labels.
    public var name: String
    /// For an entry of a family, its key (`String(describing:)`); `nil` for a single state.
    public var key: String?
    /// What happened.
    public var kind: Kind

    /// Creates an event.
    public init(name: String, key: String? = nil, kind: Kind) {
        self.name = name
        self.key = key
        self.kind = kind
    }

    /// What happened.
    public enum Kind: Sendable {
        /// A caller got fresh data at once.
        case hit
        /// A caller got data that was not fresh at once: stale-while-revalidate, or restored data
        /// under refresh ahead, while a fetch refreshes it (``started(_:)`` with
        /// ``Reason/background`` follows when this caller started that fetch). Not a hit: a hit is
        /// fresh data, so stale serves are counted apart, and rise exactly when the source struggles.
        case servedStale
        /// A caller got the last good value instead of `error`, by fail-safe (`maxStaleAge:`): the
        /// fetch it waited for failed with `error`, or `error` was answered from the failure expiry,
        /// and the value was younger than the maximum stale age. The value is stale: the snapshot's
        /// phase is the failure. Counted apart from hits and ``servedStale``: they rise while the
        /// source is down.
        case failSafe(error: any Error)
        /// A caller that waited for a fetch until its soft timeout (`softTimeout:`) got the last good
        /// value then; the fetch goes on in the background, and its result lands when it arrives.
        /// Callers that come while it still runs get the value at once, as ``servedStale``.
        case softTimeout
        /// A caller joined the fetch in flight.
        case joined
        /// A fetch started, for this reason.
        case started(Reason)
        /// Attempt number `attempt` of the fetch failed with `error`; the next starts in `retryIn`.
        case attemptFailed(error: any Error, attempt: Int, retryIn: Duration)
        /// The fetch succeeded after `attempts` attempts, `duration` after it started.
        case succeeded(duration: Duration, attempts: Int)
        /// The fetch that just ``succeeded(duration:attempts:)`` kept the value: its operation answered
        /// ``AsyncStateRevalidation/notModified`` (an entity tag's 304), which renewed the value's
        /// freshness without replacing it.
        case notModified
        /// The fetch failed with `error` after `attempts` attempts, `duration` after it started.
        case failed(error: any Error, duration: Duration, attempts: Int)
        /// The fetch in flight was cancelled.
        case cancelled
        /// The data was marked expired (``AsyncState/invalidate()``).
        case invalidated
        /// A family's entries carrying `tag` were marked expired (``AsyncStateFamily/invalidate(tag:)``),
        /// `entries` of them (each also reported as ``invalidated`` with its key); reported once, with
        /// no key, after them.
        case invalidatedTag(String, entries: Int)
        /// A family's entry left it, or had its value replaced.
        case removed(AsyncStateFamilyRemovalReason)
    }

    /// Why a fetch started.
    public enum Reason: String, Hashable, CaseIterable, Sendable {
        /// A caller asked for data that was not fresh (`value`, `fetch`, `values`).
        case fetch
        /// A caller asked for new data whatever its freshness (`refresh`).
        case refresh
        /// A caller retried a failure (`retry`).
        case retry
        /// Stale-while-revalidate or refresh ahead: data was served at once, the fetch runs behind it.
        case background
        /// `run(every:)`'s periodic refresh.
        case periodic
        /// A paged state's `loadMore`: the next page, appended to the list.
        case loadMore
    }
}

/// A state's observer and what it reports as (the store's part; `nil` without an observer).
@usableFromInline
struct Observation: Sendable {
    @usableFromInline let name: String
    @usableFromInline let key: String?
    @usableFromInline let observer: any AsyncStateObserver

    @usableFromInline
    init(name: String, key: String?, observer: any AsyncStateObserver) {
        (self.name, self.key, self.observer) = (name, key, observer)
    }

    /// Delivers `kind` now (for hits: by the caller).
    @usableFromInline
    func deliver(_ kind: AsyncStateEvent.Kind) {
        observer.observe(AsyncStateEvent(name: name, key: key, kind: kind))
    }
}

/// Delivers a state's events in order, one at a time, never under the state's lock. Events are
/// enqueued under the state's lock (so the queue's order is the order they happened) and drained
/// after it is released: whoever finds the queue idle drains it, including what others add meanwhile.
@usableFromInline
final class EventQueue: Sendable {
    private let state = LockedValue<(events: [AsyncStateEvent.Kind], draining: Bool)>(([], false))
    @usableFromInline let observation: Observation

    @usableFromInline
    init(_ observation: Observation) {
        self.observation = observation
    }

    /// Adds `events`; called under the state's lock (this lock is taken inside it, never around it).
    @usableFromInline
    func enqueue(_ events: [AsyncStateEvent.Kind]) {
        state.withLock { $0.events += events }
    }

    /// Delivers what is queued, unless another thread is delivering (it delivers these too).
    @usableFromInline
    func drain() {
        var batch = state.withLock { state -> [AsyncStateEvent.Kind] in
            guard !state.draining, !state.events.isEmpty else { return [] }
            state.draining = true
            defer { state.events = [] }
            return state.events
        }
        while !batch.isEmpty {
            for kind in batch { observation.deliver(kind) }
            batch = state.withLock { state in
                defer { state.events = [] }
                if state.events.isEmpty { state.draining = false }
                return state.events
            }
        }
    }
}
