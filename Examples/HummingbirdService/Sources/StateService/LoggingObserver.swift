import AsyncStateKit
import Logging
import Synchronization

/// Logs what states do through swift-log: one line per transition, with the state's name (and a
/// family entry's key) as metadata. Hits, stale serves and joins are per request, so they log at
/// `trace`; fetches
/// at `debug`/`info`, failures at `warning`/`error`.
///
/// ```swift
/// AsyncState(wrappedValue: .empty, name: "rates", observer: LoggingObserver(logger: logger))
/// ```
public struct LoggingObserver: AsyncStateObserver {
    public let logger: Logger

    public init(logger: Logger) {
        self.logger = logger
    }

    public func observe(_ event: AsyncStateEvent) {
        var metadata: Logger.Metadata = ["state": "\(event.name)"]
        if let key = event.key { metadata["key"] = "\(key)" }
        switch event.kind {
        case .hit:
            logger.trace("hit", metadata: metadata)
        case .servedStale:
            logger.trace("served stale data", metadata: metadata)
        case .failSafe(let error):
            metadata["error"] = "\(error)"
            logger.debug("served the last good value instead of a failure", metadata: metadata)
        case .notModified:
            logger.debug("not modified: the value was kept and is fresh again", metadata: metadata)
        case .softTimeout:
            logger.debug("served the last good value at the soft timeout; the fetch goes on", metadata: metadata)
        case .joined:
            logger.trace("joined the fetch in flight", metadata: metadata)
        case .started(let reason):
            metadata["reason"] = "\(reason.rawValue)"
            logger.debug("fetch started", metadata: metadata)
        case .attemptFailed(let error, let attempt, let retryIn):
            metadata["error"] = "\(error)"
            metadata["attempt"] = "\(attempt)"
            metadata["retry_in"] = "\(retryIn)"
            logger.warning("attempt failed, retrying", metadata: metadata)
        case .succeeded(let duration, let attempts):
            metadata["duration"] = "\(duration)"
            metadata["attempts"] = "\(attempts)"
            logger.info("fetch succeeded", metadata: metadata)
        case .failed(let error, let duration, let attempts):
            metadata["error"] = "\(error)"
            metadata["duration"] = "\(duration)"
            metadata["attempts"] = "\(attempts)"
            logger.error("fetch failed", metadata: metadata)
        case .cancelled:
            logger.info("fetch cancelled", metadata: metadata)
        case .invalidated:
            logger.debug("invalidated", metadata: metadata)
        case .invalidatedTag(let tag, let entries):
            metadata["tag"] = "\(tag)"
            metadata["entries"] = "\(entries)"
            logger.info("tag invalidated", metadata: metadata)
        case .removed(let reason):
            metadata["reason"] = "\(reason)"
            logger.debug("entry removed", metadata: metadata)
        case .waitEnded(let error):
            if let error { metadata["error"] = "\(error)" }
            logger.trace("stopped waiting", metadata: metadata)
        case .batchStarted(let fetches):
            metadata["keys"] = "\(fetches.count)"
            logger.debug("batch started", metadata: metadata)
        case .batchEnded(let error):
            if let error { metadata["error"] = "\(error)" }
            logger.debug(error == nil ? "batch loaded" : "batch failed", metadata: metadata)
        case .secondLevel(let secondLevel):
            switch secondLevel {
            case .hit(let version):
                metadata["version"] = "\(version)"
                logger.debug("answered from the second level", metadata: metadata)
            case .loaded(let version):
                if let version { metadata["version"] = "\(version)" }
                logger.debug("loaded as the lease's holder", metadata: metadata)
            case .waiting:
                logger.trace("waiting for another replica's load", metadata: metadata)
            case .waitRanOut:
                logger.warning("waited too long for another replica's load; loading here", metadata: metadata)
            case .fault(let error):
                metadata["error"] = "\(error)"
                logger.warning("second level failed; skipping it for a while", metadata: metadata)
            case .skipped:
                logger.trace("second level skipped after a fault", metadata: metadata)
            case .undecodable(let error):
                metadata["error"] = "\(error)"
                logger.warning("dropped an undecodable second-level entry", metadata: metadata)
            case .writeRefused(let version):
                metadata["version"] = "\(version)"
                logger.debug("second level holds a newer version than this load", metadata: metadata)
            }
        }
    }
}

/// Several observers as one: each event goes to each, in order.
public struct ObserverGroup: AsyncStateObserver {
    public let observers: [any AsyncStateObserver]

    public init(_ observers: [any AsyncStateObserver]) {
        self.observers = observers
    }

    /// Each observer's caller context, in order.
    public func callerContext() -> (any Sendable)? {
        observers.map { $0.callerContext() }
    }

    /// Delivers `event` to each observer, with the caller context that observer gave.
    public func observe(_ event: AsyncStateEvent) {
        let contexts = event.callerContext as? [(any Sendable)?]
        for (index, observer) in observers.enumerated() {
            var own = event
            own.callerContext = contexts.flatMap { index < $0.count ? $0[index] : nil }
            observer.observe(own)
        }
    }
}

/// Logs the deliveries an invalidator refused (forged, unsigned, replayed), at most one line per
/// `interval` with how many and why since the last: a flood of forged messages costs a counter,
/// never a flood of log lines. Never logs a message's content (an attacker chose it).
public final class RejectionLog: Sendable {
    private struct State {
        var counts: [String: Int] = [:]
        var lastLine: ContinuousClock.Instant?
    }

    private let logger: Logger
    private let interval: Duration
    private let state = Mutex(State())

    public init(logger: Logger, interval: Duration = .seconds(10)) {
        self.logger = logger
        self.interval = interval
    }

    /// The invalidator's `events:` callback; other events pass through to `next`.
    public func events(
        then next: (@Sendable (AsyncStateInvalidator.Event) -> Void)? = nil
    ) -> @Sendable (AsyncStateInvalidator.Event) -> Void {
        { [self] event in
            next?(event)
            guard case .rejected(_, let reason) = event else { return }
            note("\(reason)")
        }
    }

    private func note(_ reason: String) {
        let now = ContinuousClock.now
        let counts = state.withLock { state -> [String: Int]? in
            state.counts[reason, default: 0] += 1
            if let last = state.lastLine, now - last < interval { return nil }
            state.lastLine = now
            defer { state.counts = [:] }
            return state.counts
        }
        guard let counts else { return }
        let summary = counts.sorted { $0.key < $1.key }.map { "\($0.value) for \($0.key)" }.joined(separator: ", ")
        logger.warning(
            "invalidations refused",
            metadata: ["refused": "\(summary)", "hint": "a replica with another secret, or someone without it"])
    }
}
