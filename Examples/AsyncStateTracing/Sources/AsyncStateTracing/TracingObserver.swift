public import AsyncStateKit
import Foundation
public import Tracing

/// An ``AsyncStateObserver`` that records what states and families do as spans of a
/// swift-distributed-tracing `Tracer`, so that a trace shows which request's load every waiting
/// request waited for.
///
/// ```swift
/// let tracing = TracingObserver()                        // InstrumentationSystem.tracer
/// @AsyncState(name: "config", observer: tracing) var config: Config = .default
/// let invalidator = AsyncStateInvalidator(bus: bus, metadata: tracing.invalidationMetadata)
/// ```
///
/// The spans (every attribute is under `async_state.`; see ``Attribute``):
/// - **`async_state.load`**, one per fetch: a child of the request that started it. Its attempts'
///   failures and backoffs are events on it (`async_state.attempt_failed`). It links to each request
///   that joined it, up to ``maximumLinks``, and counts them all (`async_state.joiners`). A fetch
///   that runs behind an answer (stale-while-revalidate, refresh ahead: reason `background`) or on a
///   schedule (`run(every:)`: reason `periodic`) is a root span of its own trace, linked to the
///   request that triggered it.
/// - **`async_state.wait`**, one per request that joined a fetch: a child of that request, linked to
///   the load it waited for, ended when it was answered (or cancelled). The request that started the
///   fetch needs none: the load is its child.
/// - **`async_state.batch`**, one per run of a batch operation: a root span linked to each distinct
///   request whose miss it loads; each key's load links to it.
/// - **`async_state.invalidate`**: a child of the request that invalidated, or, on a replica that
///   received the message, a root span linked to the sending request (whose trace context the message
///   carries: pass ``invalidationMetadata`` to the invalidator).
///
/// Hits are not traced (count them with metrics). Events are delivered in order, so each span is
/// started before anything refers to it.
public final class TracingObserver: AsyncStateObserver {
    /// The most links a load or a batch span gets; the counts attributes are exact beyond it.
    public let maximumLinks: Int
    private let tracer: any Tracer
    /// The wait spans of the requests waiting now, by waiter.
    private let waits = Locked<[AsyncStateEvent.Waiter: any Span]>([:])

    /// The attribute names, all under `async_state.`.
    public enum Attribute {
        /// The state's or family's `name:`.
        public static let name = "async_state.name"
        /// The family entry's key.
        public static let key = "async_state.key"
        /// Why the fetch started (`fetch`, `refresh`, `retry`, `background`, `periodic`, `loadMore`).
        public static let reason = "async_state.reason"
        /// The fetch's number (``AsyncStateFetch/id``), the same on its load and on the waits for it.
        public static let fetch = "async_state.fetch"
        /// How it ended: `success`, `failure` or `cancelled`.
        public static let outcome = "async_state.outcome"
        /// How many attempts the fetch made.
        public static let attempts = "async_state.attempts"
        /// How many requests joined the load (all of them, linked or not).
        public static let joiners = "async_state.joiners"
        /// On an `async_state.attempt_failed` event: the attempt's number.
        public static let attempt = "async_state.attempt"
        /// On an `async_state.attempt_failed` event: the backoff before the next attempt, in seconds.
        public static let retryIn = "async_state.retry_in"
        /// On a batch: how many keys it loads.
        public static let batchKeys = "async_state.batch.keys"
        /// On a batch: how many distinct requests it loads for.
        public static let batchCallers = "async_state.batch.callers"
        /// On an invalidation: the bus topic, when it came through an invalidator.
        public static let topic = "async_state.topic"
        /// On an invalidation of a tag: the tag.
        public static let tag = "async_state.tag"
    }

    /// An observer that records spans with `tracer` (by default, the one bootstrapped with
    /// `InstrumentationSystem.bootstrap`), linking at most `maximumLinks` joiners or callers to a
    /// load or a batch.
    public init(tracer: any Tracer = InstrumentationSystem.tracer, maximumLinks: Int = 128) {
        self.tracer = tracer
        self.maximumLinks = max(0, maximumLinks)
    }

    /// The caller's `ServiceContext`, which the events it causes carry.
    public func callerContext() -> (any Sendable)? { ServiceContext.current }

    /// The current request's trace context, as an invalidation message's metadata: give it to
    /// `AsyncStateInvalidator(bus:metadata:)`, and the invalidations on the other replicas link to
    /// the request that caused them.
    @Sendable public func invalidationMetadata() -> [String: String] {
        var carrier: [String: String] = [:]
        tracer.inject(ServiceContext.current ?? .topLevel, into: &carrier, using: DictionaryInjector())
        return carrier
    }

    public func observe(_ event: AsyncStateEvent) {
        switch event.kind {
        case .started(let reason): started(event, reason)
        case .joined: joined(event)
        case .waitEnded(let error): waitEnded(event, error)
        case .attemptFailed(let error, let attempt, let retryIn):
            load(event.fetch)?.span.addEvent(
                SpanEvent(
                    name: "async_state.attempt_failed",
                    attributes: [
                        Attribute.attempt: .int64(Int64(attempt)), Attribute.retryIn: .double(retryIn.seconds),
                        "exception.message": .string("\(error)"),
                    ]))
        case .succeeded(_, let attempts): finish(event, "success", attempts: attempts, error: nil)
        case .failed(let error, _, let attempts): finish(event, "failure", attempts: attempts, error: error)
        case .cancelled: finish(event, "cancelled", attempts: nil, error: nil)
        case .softTimeout: note("async_state.soft_timeout", on: event)
        case .failSafe: note("async_state.fail_safe", on: event)
        case .invalidated: invalidated(event, tag: nil)
        case .invalidatedTag(let tag, _): invalidated(event, tag: tag)
        case .batchStarted(let fetches): batchStarted(event, fetches)
        case .batchEnded(let error):
            guard let batch = load(event.fetch) else { return }
            if let error { batch.span.recordError(error) }
            batch.span.end()
        case .secondLevel(let secondLevel): self.secondLevel(secondLevel, event)
        case .hit, .servedStale, .notModified, .removed:
            break
        }
    }

    /// What the second level did, as an event on the load's span: a hit (no source call), a load
    /// as the lease's holder, a wait for another replica, a fault.
    private func secondLevel(_ secondLevel: AsyncStateSecondLevelEvent, _ event: AsyncStateEvent) {
        guard let span = load(event.fetch)?.span else { return }
        var attributes: SpanAttributes = [:]
        let name: String
        switch secondLevel {
        case .hit(let version):
            name = "async_state.second_level.hit"
            attributes["async_state.second_level.version"] = Int64(truncatingIfNeeded: version)
        case .loaded(let version):
            name = "async_state.second_level.loaded"
            if let version {
                attributes["async_state.second_level.version"] = Int64(truncatingIfNeeded: version)
            }
        case .waiting: name = "async_state.second_level.waiting"
        case .waitRanOut: name = "async_state.second_level.wait_ran_out"
        case .fault(let error):
            name = "async_state.second_level.fault"
            attributes["exception.message"] = "\(error)"
        case .skipped: name = "async_state.second_level.skipped"
        case .undecodable(let error):
            name = "async_state.second_level.undecodable"
            attributes["exception.message"] = "\(error)"
        case .writeRefused(let version):
            name = "async_state.second_level.write_refused"
            attributes["async_state.second_level.version"] = Int64(truncatingIfNeeded: version)
        }
        span.addEvent(SpanEvent(name: name, attributes: attributes))
    }

    // MARK: Loads and waits

    /// A load's (or a batch's) span, kept with its fetch, and the context of the request that
    /// started it.
    private final class Load: Sendable {
        let span: any Span
        let caller: ServiceContext?
        let joiners = Locked(0)

        init(_ span: any Span, caller: ServiceContext?) {
            (self.span, self.caller) = (span, caller)
        }
    }

    /// What this observer keeps with `fetch`.
    private func load(_ fetch: AsyncStateFetch?) -> Load? { fetch?.annotation(for: self) as? Load }

    private func started(_ event: AsyncStateEvent, _ reason: AsyncStateEvent.Reason) {
        guard let fetch = event.fetch else { return }
        let caller = event.callerContext as? ServiceContext
        let span: any Span
        if reason == .background || reason == .periodic {
            // Nobody waits for it: a trace of its own, linked to what triggered it.
            span = tracer.startSpan("async_state.load", context: ServiceContext.topLevel)
            if let caller, hasSpan(caller) { span.addLink(SpanLink(context: caller, attributes: [:])) }
        } else {
            span = tracer.startSpan("async_state.load", context: caller ?? .topLevel)
        }
        describe(span, event)
        span.attributes[Attribute.reason] = reason.rawValue
        fetch.annotate(Load(span, caller: caller), for: self)
    }

    private func joined(_ event: AsyncStateEvent) {
        guard let load = load(event.fetch), let waiter = event.waiter else { return }
        let wait = tracer.startSpan("async_state.wait", context: event.callerContext as? ServiceContext ?? .topLevel)
        describe(wait, event)
        wait.addLink(SpanLink(context: load.span.context, attributes: [:]))
        waits.withLock { $0[waiter] = wait }
        let joiners = load.joiners.withLock {
            $0 += 1
            return $0
        }
        if joiners <= maximumLinks { load.span.addLink(SpanLink(context: wait.context, attributes: [:])) }
    }

    private func waitEnded(_ event: AsyncStateEvent, _ error: (any Error)?) {
        guard let waiter = event.waiter, let wait = waits.withLock({ $0.removeValue(forKey: waiter) }) else { return }
        if let error { wait.recordError(error) }
        wait.attributes[Attribute.outcome] =
            error == nil ? "success" : error is CancellationError ? "cancelled" : "failure"
        wait.end()
    }

    /// Ends a fetch's load span with its outcome.
    private func finish(_ event: AsyncStateEvent, _ outcome: String, attempts: Int?, error: (any Error)?) {
        guard let load = load(event.fetch) else { return }
        load.span.attributes[Attribute.outcome] = outcome
        if let attempts { load.span.attributes[Attribute.attempts] = attempts }
        load.span.attributes[Attribute.joiners] = load.joiners.withLock { $0 }
        if let error {
            load.span.recordError(error)
            load.span.setStatus(SpanStatus(code: .error))
        }
        load.span.end()
    }

    /// An event on the wait span of the event's waiter, if it has one.
    private func note(_ name: String, on event: AsyncStateEvent) {
        guard let waiter = event.waiter, let wait = waits.withLock({ $0[waiter] }) else { return }
        wait.addEvent(SpanEvent(name: name))
    }

    // MARK: Batches

    private func batchStarted(_ event: AsyncStateEvent, _ fetches: [AsyncStateFetch]) {
        guard let own = event.fetch else { return }
        let span = tracer.startSpan("async_state.batch", context: ServiceContext.topLevel)
        span.attributes[Attribute.name] = event.name
        span.attributes[Attribute.fetch] = Int64(own.id)
        span.attributes[Attribute.batchKeys] = fetches.count
        // One link per request: their keys' contexts are told apart by what the tracer would
        // propagate of them.
        var callers = Set<[String: String]>()
        for fetch in fetches {
            guard let key = load(fetch) else { continue }
            if let caller = key.caller {
                let carrier = propagated(caller)
                if !carrier.isEmpty, callers.insert(carrier).inserted, callers.count <= maximumLinks {
                    span.addLink(SpanLink(context: caller, attributes: [:]))
                }
            }
            key.span.addLink(SpanLink(context: span.context, attributes: [:]))
        }
        span.attributes[Attribute.batchCallers] = callers.count
        own.annotate(Load(span, caller: nil), for: self)
    }

    // MARK: Invalidations

    private func invalidated(_ event: AsyncStateEvent, tag: String?) {
        let span: any Span
        if let caller = event.callerContext as? ServiceContext, hasSpan(caller) {
            span = tracer.startSpan("async_state.invalidate", context: caller)
        } else if let metadata = event.invalidation?.metadata {
            var sender = ServiceContext.topLevel
            tracer.extract(metadata, into: &sender, using: DictionaryExtractor())
            guard hasSpan(sender) else { return }
            span = tracer.startSpan("async_state.invalidate", context: ServiceContext.topLevel)
            span.addLink(SpanLink(context: sender, attributes: [:]))
        } else {
            return
        }
        describe(span, event)
        if let topic = event.invalidation?.topic { span.attributes[Attribute.topic] = topic }
        if let tag { span.attributes[Attribute.tag] = tag }
        span.end()
    }

    // MARK: Helpers

    private func describe(_ span: any Span, _ event: AsyncStateEvent) {
        span.attributes[Attribute.name] = event.name
        if let key = event.key { span.attributes[Attribute.key] = key }
        if let fetch = event.fetch { span.attributes[Attribute.fetch] = Int64(fetch.id) }
    }

    /// What the tracer propagates of `context`: empty when it holds no span.
    private func propagated(_ context: ServiceContext) -> [String: String] {
        var carrier: [String: String] = [:]
        tracer.inject(context, into: &carrier, using: DictionaryInjector())
        return carrier
    }

    private func hasSpan(_ context: ServiceContext) -> Bool { !propagated(context).isEmpty }
}

/// Writes a trace context into a message's metadata.
struct DictionaryInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) {
        carrier[key] = value
    }
}

/// Reads a trace context from a message's metadata.
struct DictionaryExtractor: Extractor {
    func extract(key: String, from carrier: [String: String]) -> String? { carrier[key] }
}

/// A value behind a lock (`NSLock`, which the thread sanitizer understands).
final class Locked<Value>: @unchecked Sendable {
    // @unchecked Sendable is sound: `value` is read and written only inside `withLock`, under `lock`.
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) {
        self.value = value
    }

    func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

extension Duration {
    /// The duration in seconds.
    fileprivate var seconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
