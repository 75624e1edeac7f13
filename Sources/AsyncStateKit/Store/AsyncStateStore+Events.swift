import Foundation

/// What a store's observer hears, and in which order: every event a store reports is recorded here,
/// from what the machine's actions carry, and built by ``Observation`` (as a family's own events and a
/// batch's are). Events are recorded under the store's lock, so their order
/// is the order the machine decided them in, and delivered once it is released (see
/// ``withCore(byCaller:_:)``).
extension AsyncStateStore {
    /// Records an event for the observer, if there is one (under the lock; delivered after it):
    /// about the state's current fetch if `aboutFetch`, and about `waiter` if any.
    @inlinable
    func record(
        _ kind: @autoclosure () -> AsyncStateEvent.Kind, aboutFetch: Bool = false, waiter: Machine.WaiterID? = nil,
        in effects: inout Effects
    ) {
        guard let events else { return }
        // Named and keyed when delivered (``Observation/deliver(recorded:)``).
        effects.events.append(
            Observation.recorded(
                kind(), fetch: aboutFetch ? events.currentFetch : nil,
                waiter: waiter.map { AsyncStateEvent.Waiter(state: ObjectIdentifier(self), number: $0) },
                callerContext: effects.callerContext, invalidation: effects.invalidation))
    }

    /// Records that waiters `ids` stop waiting, answered with `error` (`nil`: a value), in the order
    /// they arrived: those still waiting, each once (see ``AsyncStateEvent/Kind/waitEnded(error:)``).
    @inlinable
    func recordWaitsEnded(
        _ ids: some Sequence<Machine.WaiterID>, error: @autoclosure () -> (any Error)?, in core: Core,
        _ effects: inout Effects
    ) {
        // `error` only with an observer: an error made into `any Error` is boxed, an allocation.
        guard events != nil else { return }
        let error = error()
        for id in ids.sorted() {
            switch core.waiterSlots[id] {
            case .pending, .waiting: record(.waitEnded(error: error), aboutFetch: true, waiter: id, in: &effects)
            case .resolved, nil: break
            }
        }
    }

    /// Records each of waiters `ids`, in the order they arrived, as `kind` about the fetch in flight.
    @inlinable @inline(__always)
    func recordEach(_ ids: WaiterIDs, _ kind: @autoclosure () -> AsyncStateEvent.Kind, in effects: inout Effects) {
        guard events != nil else { return }
        let kind = kind()
        for id in ids.sorted() { record(kind, aboutFetch: true, waiter: id, in: &effects) }
    }

    /// Records a caller answered at once (see ``FetchStateMachine/Answer``): a hit, a stale serve, or
    /// a fail-safe answer; a paged state's list at its end is not reported.
    @inlinable @inline(__always)
    func record(answered answer: Machine.Answer, in effects: inout Effects) {
        switch answer {
        case .fresh: record(.hit, in: &effects)
        case .stale: record(.servedStale, in: &effects)
        case .failSafe(let error): record(.failSafe(error: error), in: &effects)
        case .atEnd: break
        }
    }

    /// Records an attempt that starts: the first of a flight as the flight's start, with its reason
    /// (`waiter`: the caller that started it and waits for it, if any); a later one that a caller
    /// starts now (a retry during a backoff) as that caller joining it.
    @inlinable @inline(__always)
    func record(starting reason: AsyncStateEvent.Reason?, waiter: Machine.WaiterID?, in effects: inout Effects) {
        guard let events else { return }
        if let reason {
            events.currentFetch = AsyncStateFetch(reason: reason)
            record(.started(reason), aboutFetch: true, waiter: waiter, in: &effects)
        } else if let waiter {
            record(.joined, aboutFetch: true, waiter: waiter, in: &effects)
        }
    }

    /// Records a flight's settle: its outcome (with its duration and attempts), then, for a fail-safe
    /// answer, each waiter it answers that way, as each caller that joins is.
    @inlinable @inline(__always)
    func record(
        settled outcome: Machine.FlightOutcome, report: Machine.FlightReport, waiters ids: WaiterIDs,
        in effects: inout Effects
    ) {
        guard events != nil else { return }
        switch outcome {
        case .succeeded, .notModified:
            record(.succeeded(duration: report.duration, attempts: report.attempts), aboutFetch: true, in: &effects)
            if case .notModified = outcome { record(.notModified, aboutFetch: true, in: &effects) }
        case .failed(let error), .failedSafe(let error):
            record(
                .failed(error: error, duration: report.duration, attempts: report.attempts), aboutFetch: true,
                in: &effects)
            if case .failedSafe = outcome { recordEach(ids, .failSafe(error: error), in: &effects) }
        case .cancelled:
            record(.cancelled, aboutFetch: true, in: &effects)
        }
    }

    /// A hit, for the observer (called by ``hit(_:)``, outside any lock). Never inlined: the event
    /// it builds would otherwise be part of every caller's async frame, with or without an observer.
    @inlinable @inline(never)
    func observeHit() {
        observation?.deliver(.hit)
    }

    /// The fetch the store started last, for the observer (`nil` without one): read just after a
    /// call started it, it is that call's (a flight that waits for a batch does not end before the
    /// batch answers, or is cancelled).
    @inlinable var observedFetch: AsyncStateFetch? {
        guard let events else { return nil }
        return core.withLock { _ in events.currentFetch }
    }

    /// Reports what the second level did in the fetch in flight (see ``SecondLevelLoader``).
    func reportSecondLevel(_ event: AsyncStateSecondLevelEvent) {
        withCore { _, effects in record(.secondLevel(event), aboutFetch: true, in: &effects) }
    }
}
