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
///
/// ## Traces
///
/// A tracer needs to know in whose request an event happened, but events other than hits are
/// delivered from a queue, perhaps by another thread. So a state asks its observer for
/// ``callerContext()`` in the task of each caller that is about to cause events other than a hit
/// (a miss, a join, a fetch it starts, data served stale, an invalidation), and those events carry
/// what it returned (``AsyncStateEvent/callerContext``): a tracing adapter returns the task's
/// `ServiceContext`. A hit is delivered in its caller's task, so an adapter reads the context there
/// itself; no hit asks for it. Events about a fetch carry the fetch (``AsyncStateEvent/fetch``: one
/// object per run of an operation, where an adapter keeps its span), and those about a waiting caller
/// carry its ``AsyncStateEvent/waiter``: every caller that waits for a fetch — the one that started
/// it, or one that ``AsyncStateEvent/Kind/joined`` it — is answered by exactly one
/// ``AsyncStateEvent/Kind/waitEnded(error:)``. A batch (``AsyncStateFamily/values(for:retry:_:)``,
/// ``AsyncStateFamily/value(for:batchWindow:maxBatchSize:retry:_:)``) is reported as
/// ``AsyncStateEvent/Kind/batchStarted(_:)`` and ``AsyncStateEvent/Kind/batchEnded(error:)`` besides
/// its keys' own fetches. The article <doc:ObservingAService> shows the span tree that the example
/// service's tracing adapter builds from them.
public protocol AsyncStateObserver: Sendable {
    /// Called once per event.
    func observe(_ event: AsyncStateEvent)

    /// What the events a caller causes should carry (``AsyncStateEvent/callerContext``), read in
    /// that caller's task: a tracing adapter returns `ServiceContext.current`. Called once per call
    /// that causes events other than a hit, before the state takes its lock; never for a hit. The
    /// default returns `nil`.
    func callerContext() -> (any Sendable)?
}

extension AsyncStateObserver {
    /// Returns `nil`: events carry no caller context.
    public func callerContext() -> (any Sendable)? { nil }
}

/// One run of a fetch's operation (or of a batch's), as events report it (``AsyncStateEvent/fetch``):
/// the object is the same in every event about that run, from its
/// ``AsyncStateEvent/Kind/started(_:)`` to its outcome, so an observer can keep what it needs with it
/// (``annotate(_:for:)``: a tracer's span) instead of in a table of its own. Made only for a state
/// with an observer.
public final class AsyncStateFetch: Sendable, Hashable, CustomStringConvertible {
    /// A number no other fetch of this process has.
    public let id: UInt64
    /// Why it started.
    public let reason: AsyncStateEvent.Reason
    /// Each owner's annotation, by the owner's identity. The entry keeps the owner weakly and a read
    /// checks it: an owner freed while the fetch lives leaves its entry behind, and a new object made
    /// at the same address must not read it.
    private let annotations = LockedValue<[ObjectIdentifier: Annotation]>([:])

    private struct Annotation {
        weak var owner: AnyObject?
        var value: any Sendable
    }

    private static let lastID = LockedValue<UInt64>(0)

    @usableFromInline
    init(reason: AsyncStateEvent.Reason) {
        id = Self.lastID.withLock {
            $0 &+= 1
            return $0
        }
        self.reason = reason
    }

    /// What `owner` (an observer, or an object it owns) keeps with this fetch; `nil` until it
    /// ``annotate(_:for:)``. Each owner has its own, so observers in a group do not overwrite each
    /// other's; read and written under a lock.
    public func annotation(for owner: AnyObject) -> (any Sendable)? {
        annotations.withLock { annotations in
            guard let annotation = annotations[ObjectIdentifier(owner)], annotation.owner === owner else { return nil }
            return annotation.value
        }
    }

    /// Keeps `value` with this fetch for `owner` (`nil` removes it); see ``annotation(for:)``. The
    /// fetch does not keep `owner` alive: once it is freed, its annotation is no one's.
    public func annotate(_ value: (any Sendable)?, for owner: AnyObject) {
        annotations.withLock { annotations in
            annotations[ObjectIdentifier(owner)] = value.map { Annotation(owner: owner, value: $0) }
        }
    }

    /// `fetch #id (reason)`.
    public var description: String { "fetch #\(id) (\(reason))" }

    /// Whether both are the same fetch.
    public static func == (lhs: AsyncStateFetch, rhs: AsyncStateFetch) -> Bool { lhs === rhs }

    /// Hashes the fetch's identity.
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
}

/// One thing a state did.
public struct AsyncStateEvent: Sendable {
    /// The state's name (its `name:`), for log metadata and metric labels.
    public var name: String
    /// For an entry of a family, its key (`String(describing:)`); `nil` for a single state. A
    /// family's own events keep the key itself and describe it when this is read, so that an observer
    /// that never reads it (a metric counted by state name) pays nothing for it on a hit.
    public var key: String? {
        get {
            switch keyStorage {
            case .none: nil
            case .described(let description): description
            case .value(let key): String(describing: key)
            }
        }
        set { keyStorage = newValue.map(KeyStorage.described) ?? .none }
    }
    /// The key, described or not yet.
    @usableFromInline var keyStorage: KeyStorage
    /// What happened.
    public var kind: Kind
    /// The fetch this event is about: set for ``Kind/started(_:)``, ``Kind/joined``,
    /// ``Kind/attemptFailed(error:attempt:retryIn:)``, the outcomes, ``Kind/notModified``,
    /// ``Kind/softTimeout``, ``Kind/waitEnded(error:)``, a ``Kind/failSafe(error:)`` that answers a
    /// waiter, and a batch's events (the batch's own); `nil` for the others, and without an observer.
    public var fetch: AsyncStateFetch?
    /// The waiting caller this event is about: set for ``Kind/joined``, for a
    /// ``Kind/started(_:)`` whose caller waits for the fetch it started, and for
    /// ``Kind/waitEnded(error:)``, which ends each of them.
    public var waiter: Waiter?
    /// What ``AsyncStateObserver/callerContext()`` returned in the task of the caller that caused
    /// this event; `nil` for events no caller caused (a fetch's attempts and outcomes, timers) and for
    /// hits, which are delivered in their caller's task.
    public var callerContext: (any Sendable)?
    /// For ``Kind/invalidated`` and ``Kind/invalidatedTag(_:entries:)`` caused through an
    /// ``AsyncStateInvalidator``: the message, received from another replica or published by this one
    /// (its ``AsyncStateInvalidation/metadata`` carries the sender's trace context); `nil` for a
    /// direct ``AsyncState/invalidate()``.
    public var invalidation: AsyncStateInvalidation?

    /// Creates an event.
    public init(
        name: String, key: String? = nil, kind: Kind, fetch: AsyncStateFetch? = nil, waiter: Waiter? = nil,
        callerContext: (any Sendable)? = nil, invalidation: AsyncStateInvalidation? = nil
    ) {
        self.name = name
        keyStorage = key.map(KeyStorage.described) ?? .none
        self.kind = kind
        self.fetch = fetch
        self.waiter = waiter
        self.callerContext = callerContext
        self.invalidation = invalidation
    }

    /// An event of a family's entry, whose key is described only if an observer reads ``key``.
    @inlinable
    init(
        name: String, describing key: some Hashable & Sendable, kind: Kind,
        callerContext: (any Sendable)? = nil, invalidation: AsyncStateInvalidation? = nil
    ) {
        self.name = name
        keyStorage = .value(key)
        self.kind = kind
        self.callerContext = callerContext
        self.invalidation = invalidation
    }

    /// A key as an event holds it.
    @usableFromInline
    enum KeyStorage: Sendable {
        /// No key: a single state's event, or a family's own.
        case none
        /// A key already described (a live entry's events, or one set by hand).
        case described(String)
        /// A key, described when read.
        case value(any Hashable & Sendable)
    }

    /// A caller waiting for a fetch: equal in its ``Kind/joined`` (or ``Kind/started(_:)``) and its
    /// ``Kind/waitEnded(error:)``, distinct from every other caller of the same state waiting at the
    /// same time.
    public struct Waiter: Hashable, Sendable, CustomStringConvertible {
        @usableFromInline let state: ObjectIdentifier
        /// The caller's number in its state: they grow in the order callers arrive.
        public let number: UInt64

        @usableFromInline
        init(state: ObjectIdentifier, number: UInt64) {
            (self.state, self.number) = (state, number)
        }

        /// `waiter #number`.
        public var description: String { "waiter #\(number)" }
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
        /// A caller stopped waiting for the fetch (``AsyncStateEvent/fetch``) it started or joined
        /// (``AsyncStateEvent/waiter``): answered with its outcome (`error` is `nil` for a value,
        /// including a fail-safe or soft-timeout answer), or cancelled (`CancellationError`). Exactly
        /// one per waiting caller.
        case waitEnded(error: (any Error)?)
        /// A batch's operation started (``AsyncStateEvent/fetch`` is the batch's), for the keys of
        /// these fetches: one per key, each reported as ``started(_:)`` with its key (and its
        /// caller's context) before, and ending with its own outcome. An observer that needs each
        /// key's caller here keeps it with that fetch when it starts (``AsyncStateFetch/annotate(_:for:)``).
        /// Reported with no key.
        case batchStarted([AsyncStateFetch])
        /// The batch's operation returned (`error` is `nil`) or threw `error`; its keys' fetches
        /// report their own outcomes. Reported with no key.
        case batchEnded(error: (any Error)?)
        /// What the family's second level did in the key's fetch (see ``AsyncStateSecondLevelOptions``),
        /// reported from inside the fetch's attempt, before its outcome.
        case secondLevel(AsyncStateSecondLevelEvent)
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
