import AsyncStateKit
import CoreMetrics
import Synchronization

/// Counts what states do through swift-metrics, labelled by the state's name:
///
/// - `async_state_hits_total`: callers answered with fresh data at once;
/// - `async_state_stale_serves_total`: callers answered at once with data that was not fresh
///   (stale-while-revalidate, restored data): counted apart from hits, since they rise exactly when
///   the source struggles;
/// - `async_state_misses_total`: callers that had to wait (joined a fetch, or started one);
/// - `async_state_runs_total{reason}`: operation runs (fetch, refresh, retry, background, periodic)
///   — the figure that shows single flight: runs stay flat while requests climb;
/// - `async_state_attempt_failures_total`, `async_state_failures_total`: failed attempts, and fetches
///   that failed after their retries;
/// - `async_state_evictions_total{reason}`: family entries removed (evicted, idle, removed, replaced);
/// - `async_state_invalidations_total`, `async_state_tag_invalidations_total`: data marked expired
///   (each entry), and tag invalidations of a family (each one, whatever its entries);
/// - `async_state_fetch_duration_seconds{outcome}`: a timer per fetch, success or failure.
///
/// Metric objects are made once per label set and kept (making one per event would allocate and
/// take the backend's lock on every hit). Every counter of every state named at `init` exists from
/// the start, at 0, so that an alert on one finds it on a healthy replica.
public final class MetricsObserver: AsyncStateObserver {
    private let factory: any MetricsFactory
    private let counters = Mutex<[CounterKey: Counter]>([:])
    private let timers = Mutex<[CounterKey: Timer]>([:])

    /// The counters made for every state at the start (each with the dimension values it takes).
    static let declared: [(label: String, dimension: (name: String, values: [String])?)] = [
        ("async_state_hits_total", nil), ("async_state_stale_serves_total", nil),
        ("async_state_fail_safe_serves_total", nil), ("async_state_soft_timeouts_total", nil),
        ("async_state_not_modified_total", nil), ("async_state_misses_total", nil),
        ("async_state_runs_total", ("reason", AsyncStateEvent.Reason.allCases.map(\.rawValue))),
        ("async_state_attempt_failures_total", nil), ("async_state_failures_total", nil),
        ("async_state_cancellations_total", nil), ("async_state_invalidations_total", nil),
        ("async_state_tag_invalidations_total", nil),
        ("async_state_evictions_total", ("reason", ["evicted", "idle", "removed", "replaced"])),
        ("async_state_batches_total", nil),
        (
            "async_state_second_level_total",
            (
                "event",
                ["hit", "loaded", "waiting", "wait_ran_out", "fault", "skipped", "undecodable", "write_refused"]
            )
        ),
    ]

    /// Reports to `factory` (the one bootstrapped with `MetricsSystem.bootstrap` by default), with
    /// every counter of the states named `states` made at once, at 0.
    public init(factory: any MetricsFactory = MetricsSystem.factory, states: [String] = []) {
        self.factory = factory
        for state in states {
            for (label, dimension) in Self.declared {
                for value in dimension?.values ?? [""] {
                    _ = counter(label, state, dimension.map { ($0.name, value) })
                }
            }
        }
    }

    /// Counts what an invalidator's recovery does (`async_state_invalidator_messages_total{event}`:
    /// `queued`, `resent`, `collapsed`, `dropped`) and the deliveries it refused
    /// (`async_state_invalidator_rejected_total{reason}`: `signature`, `untimed`, `outside_window`,
    /// `replayed`), each from 0.
    public func invalidatorEvents() -> @Sendable (AsyncStateInvalidator.Event) -> Void {
        let make = { [factory] (event: String) in
            Counter(
                label: "async_state_invalidator_messages_total", dimensions: [("event", event)], factory: factory)
        }
        let (queued, resent, collapsed, dropped) = (make("queued"), make("resent"), make("collapsed"), make("dropped"))
        let rejected = { [factory] (reason: String) in
            Counter(
                label: "async_state_invalidator_rejected_total", dimensions: [("reason", reason)], factory: factory)
        }
        let (signature, untimed, outsideWindow, replayed) = (
            rejected("signature"), rejected("untimed"), rejected("outside_window"), rejected("replayed")
        )
        return { event in
            switch event {
            case .queued: queued.increment()
            case .resent: resent.increment()
            case .collapsed: collapsed.increment()
            case .dropped: dropped.increment()
            case .rejected(_, .signature): signature.increment()
            case .rejected(_, .untimed): untimed.increment()
            case .rejected(_, .outsideWindow): outsideWindow.increment()
            case .rejected(_, .replayed): replayed.increment()
            }
        }
    }

    public func observe(_ event: AsyncStateEvent) {
        let state = event.name
        switch event.kind {
        case .hit: count("async_state_hits_total", state)
        case .servedStale: count("async_state_stale_serves_total", state)
        case .failSafe: count("async_state_fail_safe_serves_total", state)
        case .softTimeout: count("async_state_soft_timeouts_total", state)
        case .notModified: count("async_state_not_modified_total", state)
        case .joined: count("async_state_misses_total", state)
        case .started(let reason):
            // The caller that starts a fetch missed too; background and periodic runs had no caller.
            if reason == .fetch { count("async_state_misses_total", state) }
            count("async_state_runs_total", state, ("reason", reason.rawValue))
        case .attemptFailed: count("async_state_attempt_failures_total", state)
        case .succeeded(let duration, _): time(state, "success", duration)
        case .failed(_, let duration, _):
            count("async_state_failures_total", state)
            time(state, "failure", duration)
        case .cancelled: count("async_state_cancellations_total", state)
        case .invalidated: count("async_state_invalidations_total", state)
        case .invalidatedTag: count("async_state_tag_invalidations_total", state)
        case .removed(let reason): count("async_state_evictions_total", state, ("reason", "\(reason)"))
        case .batchStarted: count("async_state_batches_total", state)
        case .secondLevel(let secondLevel):
            let name =
                switch secondLevel {
                case .hit: "hit"
                case .loaded: "loaded"
                case .waiting: "waiting"
                case .waitRanOut: "wait_ran_out"
                case .fault: "fault"
                case .skipped: "skipped"
                case .undecodable: "undecodable"
                case .writeRefused: "write_refused"
                }
            count("async_state_second_level_total", state, ("event", name))
        case .waitEnded, .batchEnded: break
        }
    }

    private func count(_ label: String, _ state: String, _ extra: (String, String)? = nil) {
        counter(label, state, extra).increment()
    }

    private func counter(_ label: String, _ state: String, _ extra: (String, String)?) -> Counter {
        let key = CounterKey(label: label, state: state, extra: extra?.1)
        return counters.withLock { counters in
            if let counter = counters[key] { return counter }
            var dimensions = [("state", state)]
            if let extra { dimensions.append(extra) }
            let counter = Counter(label: label, dimensions: dimensions, factory: factory)
            counters[key] = counter
            return counter
        }
    }

    private func time(_ state: String, _ outcome: String, _ duration: Duration) {
        let key = CounterKey(label: "async_state_fetch_duration_seconds", state: state, extra: outcome)
        let timer = timers.withLock { timers in
            if let timer = timers[key] { return timer }
            let timer = Timer(
                label: key.label, dimensions: [("state", state), ("outcome", outcome)], factory: factory)
            timers[key] = timer
            return timer
        }
        timer.recordNanoseconds(duration.nanoseconds)
    }

    private struct CounterKey: Hashable {
        var label: String
        var state: String
        var extra: String?
    }
}

extension Duration {
    /// Whole nanoseconds, saturating (a timer takes an `Int64`).
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        let (product, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        return product.addingReportingOverflow(attoseconds / 1_000_000_000).overflow
            ? .max : product + attoseconds / 1_000_000_000
    }
}
