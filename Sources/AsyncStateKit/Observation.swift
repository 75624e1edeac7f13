import Foundation

/// An observer and what a state, a family's entry or a family reports as (`key`: an entry's
/// description; `nil` for a single state or the family itself) — the one place events are built:
/// a store's events, recorded under its lock (``recorded(_:fetch:waiter:callerContext:invalidation:)``,
/// named and keyed when delivered), and a family's own and a batch's, delivered at once.
@usableFromInline
struct Observation: Sendable {
    @usableFromInline let name: String
    @usableFromInline let key: String?
    @usableFromInline let observer: any AsyncStateObserver

    @usableFromInline
    init(name: String, key: String?, observer: any AsyncStateObserver) {
        (self.name, self.key, self.observer) = (name, key, observer)
    }

    /// How the entry of `key` in the family this observes reports.
    @inlinable func entry(_ key: some Hashable & Sendable) -> Observation {
        Observation(name: name, key: String(describing: key), observer: observer)
    }

    /// Delivers `kind` now (for hits: by the caller).
    @usableFromInline
    func deliver(_ kind: AsyncStateEvent.Kind) {
        observer.observe(AsyncStateEvent(name: name, key: key, kind: kind))
    }

    /// An event recorded under a store's lock (see ``AsyncStateStore/record(_:aboutFetch:waiter:in:)``),
    /// to be delivered as the store's by ``deliver(recorded:)``.
    @inlinable
    static func recorded(
        _ kind: AsyncStateEvent.Kind, fetch: AsyncStateFetch?, waiter: AsyncStateEvent.Waiter?,
        callerContext: (any Sendable)?, invalidation: AsyncStateInvalidation?
    ) -> AsyncStateEvent {
        AsyncStateEvent(
            name: "", kind: kind, fetch: fetch, waiter: waiter, callerContext: callerContext,
            invalidation: invalidation)
    }

    /// Delivers an event recorded under the state's lock (``recorded(_:fetch:waiter:callerContext:invalidation:)``),
    /// as this state's: with its name and key.
    @usableFromInline
    func deliver(recorded event: AsyncStateEvent) {
        var event = event
        event.name = name
        event.key = key
        observer.observe(event)
    }

    /// Delivers `kind` about a family's entry of `key` now, the key described only if the observer
    /// reads it (a hit, a removal); `byCaller`: a caller caused it (a compact entry's
    /// invalidation), whose event carries its context and the invalidation message it applies.
    @inlinable
    func deliver(_ kind: AsyncStateEvent.Kind, describing key: some Hashable & Sendable, byCaller: Bool = false) {
        observer.observe(
            AsyncStateEvent(
                name: name, describing: key, kind: kind, callerContext: byCaller ? observer.callerContext() : nil,
                invalidation: byCaller ? InvalidationCause.current : nil))
    }

    /// Delivers `kind` about the family itself, caused by a caller (a tag's invalidation).
    @inlinable
    func deliverByCaller(_ kind: AsyncStateEvent.Kind) {
        observer.observe(
            AsyncStateEvent(
                name: name, key: nil, kind: kind, callerContext: observer.callerContext(),
                invalidation: InvalidationCause.current))
    }

    /// Delivers `kind` about a batch, whose fetch is `fetch`.
    @usableFromInline
    func deliver(_ kind: AsyncStateEvent.Kind, fetch: AsyncStateFetch) {
        observer.observe(AsyncStateEvent(name: name, kind: kind, fetch: fetch))
    }
}

/// The invalidation message being applied by the current task (set by ``AsyncStateInvalidator``
/// around the invalidations a message causes), for the observer's events.
@usableFromInline
enum InvalidationCause {
    @TaskLocal static var message: AsyncStateInvalidation?

    /// ``message``, for inlinable code.
    @usableFromInline static var current: AsyncStateInvalidation? { message }
}

/// Delivers a state's events in order, one at a time, never under the state's lock. Events are
/// enqueued under the state's lock (so the queue's order is the order they happened) and drained
/// after it is released: whoever finds the queue idle drains it, including what others add meanwhile.
@usableFromInline
final class EventQueue: Sendable {
    private let state = LockedValue<(events: [AsyncStateEvent], draining: Bool)>(([], false))
    private let fetch = LockedValue<AsyncStateFetch?>(nil)
    /// What the state reports as. Changed only by ``renew(_:)``, for a family's spare store, which
    /// nothing else references then (see ``AsyncStateStore/renew(seed:observation:)``): no other thread
    /// can read it meanwhile, and every later reader reaches the store through its shard's lock,
    /// which the renewal happens under, so each read is ordered after the write.
    @usableFromInline nonisolated(unsafe) private(set) var observation: Observation

    /// The state's fetch in flight, or its last one: set when a fetch starts, under the state's lock
    /// (this lock is taken inside it).
    @usableFromInline var currentFetch: AsyncStateFetch? {
        get { fetch.withLock { $0 } }
        set { fetch.withLock { $0 = newValue } }
    }

    @usableFromInline
    init(_ observation: Observation) {
        self.observation = observation
    }

    /// Makes the queue a new one reporting as `observation`, for a family's spare store made anew for
    /// another key: no fetch. Its events were all delivered: a store nothing else references has no
    /// caller in it, so nobody is draining.
    @usableFromInline
    func renew(_ observation: Observation) {
        precondition(state.withLock { $0.events.isEmpty && !$0.draining }, "a spare store's events were not delivered")
        fetch.withLock { $0 = nil }
        self.observation = observation
    }

    /// Empties the queue of a family's store kept as a spare (``AsyncStateStore/park()``): renewed
    /// (``renew(_:)``) as reporting for no key, it forgets its key and its last fetch, so that a
    /// spare keeps nothing of the key it served until it is made anew for another.
    @usableFromInline
    func park() {
        renew(Observation(name: observation.name, key: nil, observer: observation.observer))
    }

    /// Adds `events`; called under the state's lock (this lock is taken inside it, never around it).
    @usableFromInline
    func enqueue(_ events: [AsyncStateEvent]) {
        state.withLock { $0.events += events }
    }

    /// Delivers what is queued, unless another thread is delivering (it delivers these too).
    @usableFromInline
    func drain() {
        var batch = state.withLock { state -> [AsyncStateEvent] in
            guard !state.draining, !state.events.isEmpty else { return [] }
            state.draining = true
            defer { state.events = [] }
            return state.events
        }
        while !batch.isEmpty {
            for event in batch { observation.deliver(recorded: event) }
            batch = state.withLock { state in
                defer { state.events = [] }
                if state.events.isEmpty { state.draining = false }
                return state.events
            }
        }
    }
}
