public import Foundation

/// Why a caller asks a state for its value: the one description of a request, given to the machine,
/// which derives from it everything that depends on it — how fresh, failed and stale data are
/// treated, why a flight it starts started (for the observer), and what a paged state is reading.
@usableFromInline
enum FetchRequest: Equatable, Sendable {
    /// `value`, `snapshot`, one key of a batch: fresh data at once, stale data at once under
    /// stale-while-revalidate, otherwise the flight in flight or a new one.
    case value
    /// `fetch`: as ``value``, but waits for the flight even under stale-while-revalidate.
    case fetch
    /// `refresh`: always runs the operation, replacing the flight in flight.
    case refresh
    /// `run(every:)`: its first call as ``fetch``; the later ones join the flight in flight, otherwise
    /// start one whatever the freshness and the failure expiry.
    case periodic(first: Bool)
    /// A paged state's `loadMore`: joins the flight in flight, otherwise starts one, which leaves the
    /// data's freshness as it was, succeeding or failing (a list is as old as its first page); a
    /// ``value`` or ``fetch`` on expired data replaces such a flight instead of joining it.
    case loadMore

    /// Whether the request asks the source itself, whatever a second level holds: a refresh does
    /// (it is asked for because the value may have changed at the source); the others take a
    /// fresh entry from the second level.
    @inlinable var readsTheSource: Bool { self == .refresh }
}

extension FetchStateMachine {
    /// What a flight is for, which decides how its end treats the data.
    @usableFromInline
    enum FlightKind {
        /// Callers wait for it; it ends when the last one leaves.
        case foreground
        /// A paged state's append to data it has: its end leaves the data's freshness as it was.
        case append
        /// Started for a caller that got stale data at once (stale-while-revalidate, restored data):
        /// it goes on when its waiters leave.
        case background
        /// A refresh ahead, started while the data was still fresh: it goes on when its waiters leave,
        /// and if it fails the data stays fresh until its own expiry.
        case refreshAhead

        /// Whether it goes on with no waiter.
        @inlinable var keepsAlive: Bool { self == .background || self == .refreshAhead }
    }

    /// Where a flight is: its current attempt runs, or waits out a backoff.
    @usableFromInline
    enum Stage {
        /// Attempt `attempt` runs.
        case running(AttemptID)
        /// Attempt `attempt` starts at `until`.
        case backingOff(AttemptID, until: Duration)

        /// The current attempt: running, or due after the backoff.
        @inlinable var attempt: AttemptID {
            switch self {
            case .running(let attempt), .backingOff(let attempt, _): return attempt
            }
        }
    }

    /// The shell's handles of a flight (or of a step of one) to cancel once the lock is released: its
    /// attempt's task, its timer (of the attempt's timeout, or of the backoff), and the flight's soft
    /// timeout's timer (which outlives the steps: only the flight's end takes it).
    @usableFromInline
    struct Handles {
        @usableFromInline var attempt: Handle?
        @usableFromInline var timer: Handle?
        @usableFromInline var softTimer: Handle?

        @inlinable init(attempt: Handle? = nil, timer: Handle? = nil, softTimer: Handle? = nil) {
            (self.attempt, self.timer, self.softTimer) = (attempt, timer, softTimer)
        }
    }

    /// The operation run in flight, who waits for it, and everything else alive while it runs.
    @usableFromInline
    struct Flight {
        /// This flight's id; events carrying another id are stale.
        @usableFromInline var id: FlightID
        /// The operation: kept for the flight's attempts only.
        @usableFromInline var operation: Operation
        /// Its current attempt, running or due.
        @usableFromInline var stage: Stage
        /// The callers waiting for its outcome: a set, so that one leaves in O(1).
        @usableFromInline var waiters: WaiterIDs
        /// What it is for.
        @usableFromInline var kind: FlightKind
        /// Why it started (the observer's `started`).
        @usableFromInline var reason: Reason
        /// Whether its attempts must ask the source itself (``AttemptInput/readsTheSource``).
        @usableFromInline var readsTheSource: Bool
        /// Whether the state had a value when it started (a paged state's activity).
        @usableFromInline var startedWithValue: Bool
        /// Set by ``invalidate(now:version:)`` during the flight: its result lands already expired.
        @usableFromInline var expiresOnArrival: Bool
        /// Set when its soft timeout passed: it runs in the background since, and a reader that would
        /// join it is answered with a usable value at once instead.
        @usableFromInline var isPastSoftTimeout = false
        /// The waiters its soft timeout does not release (`refresh`, `retry`, periodic runs: they ask
        /// for new data); only kept with a soft timeout.
        @usableFromInline var patientWaiters = WaiterIDs()
        /// How failed attempts are retried.
        @usableFromInline var policy: RetryPolicy
        /// When the flight started (for the retry budget and the observer's duration).
        @usableFromInline var startedAt: Duration
        /// Attempts started so far.
        @usableFromInline var attempts: Int
        /// The jitter generator for this flight's retries.
        @usableFromInline var random: SplitMix64
        /// The shell's handles of the running attempt and of the pending timer.
        @usableFromInline var handles: Handles
        /// What a second level held, not fresh, when an attempt read it: what fail-safe may answer
        /// if the flight fails for good (``FetchStateMachine/fallbackOffered(_:attempt:value:arrival:now:)``).
        @usableFromInline var fallback: Fallback?

        @inlinable
        init(
            id: FlightID, operation: Operation, stage: Stage, waiters: WaiterIDs, kind: FlightKind,
            reason: Reason, readsTheSource: Bool, startedWithValue: Bool, expiresOnArrival: Bool, policy: RetryPolicy,
            startedAt: Duration, attempts: Int, random: SplitMix64, handles: Handles
        ) {
            (self.id, self.operation, self.stage, self.waiters, self.kind) = (id, operation, stage, waiters, kind)
            (self.reason, self.readsTheSource) = (reason, readsTheSource)
            (self.startedWithValue, self.expiresOnArrival) = (startedWithValue, expiresOnArrival)
            (self.policy, self.startedAt, self.attempts) = (policy, startedAt, attempts)
            (self.random, self.handles) = (random, handles)
        }

        /// The current attempt's id.
        @inlinable var attempt: AttemptID { stage.attempt }

        /// When the current attempt starts, while the flight waits out a backoff; `nil` while it runs.
        @inlinable var retryAt: Duration? {
            if case .backingOff(_, let until) = stage { return until } else { return nil }
        }
    }

    /// How the ``FetchRequest`` treats fresh, failed and stale data.
    @usableFromInline
    enum FetchMode: Sendable {
        /// Fresh data (or a failure within the failure expiry) is answered without running the
        /// operation; otherwise the caller joins the flight in flight or starts one.
        case ifExpired
        /// Always runs the operation, replacing any flight in flight.
        case always
        /// Joins the flight in flight, otherwise starts one whatever the freshness.
        case joinOrStart
        /// As ``joinOrStart``, for an append (see ``FetchRequest/loadMore``).
        case append
        /// As ``ifExpired``, except that stale data is returned at once while a background flight
        /// refreshes it.
        case staleWhileRevalidate

        /// Whether a caller in this mode reads (`value`, `fetch`, `snapshot`): it is answered from
        /// fresh data, a cached failure or fail-safe without a flight, and a soft timeout releases it
        /// with a usable value. The others (`refresh`, a periodic run, an append, `retry`) ask for
        /// new data, and wait for it past a soft timeout. The one definition of a soft timeout's
        /// patient waiters.
        @inlinable var isReader: Bool { self == .ifExpired || self == .staleWhileRevalidate }
    }

    /// What an operation's attempt ended with.
    @usableFromInline enum Outcome {
        /// It returned a value.
        case success(Value)
        /// It threw an error other than `CancellationError`.
        case failure(any Error)
        /// It threw `CancellationError` (by itself or because it was cancelled).
        case cancelled
        /// It answered that the value it was given is still current (conditional refresh).
        case notModified
        /// It answered with a value another replica fetched (read from a second level): a success
        /// dated as that fetch was, as old and with as much freshness left as `arrival` says.
        case arrived(Value, RemoteArrival)

        /// What an attempt that answered `result` ended with.
        @inlinable init(_ result: AttemptResult<Value>) {
            switch result {
            case .value(let value): self = .success(value)
            case .notModified: self = .notModified
            case .arrived(let value, let arrival): self = .arrived(value, arrival)
            }
        }
    }

    /// An attempt for the shell to run now: run `operation` with `input` in a task, give the task and
    /// the timer to ``attach(task:timer:)``, report its end with
    /// ``attemptFinished(_:attempt:outcome:now:date:)``, and, if `timeoutAt` is set, report
    /// ``attemptTimedOut(_:attempt:now:)`` at that instant unless it ended first.
    @usableFromInline
    struct Attempt {
        /// The flight it belongs to.
        @usableFromInline var flight: FlightID
        /// Its id.
        @usableFromInline var id: AttemptID
        /// What it runs.
        @usableFromInline var operation: Operation
        /// What the operation may read of the state (taken as the attempt starts).
        @usableFromInline var input: AttemptInput<Value>
        /// When it times out; `nil` for never.
        @usableFromInline var timeoutAt: Duration?
        /// When its flight's soft timeout is due, if it is the first attempt of a flight that has one
        /// (see ``softTimeoutPassed(_:now:)``): schedule it and give its timer to
        /// ``attach(softTimer:)``.
        @usableFromInline var softTimeoutAt: Duration?
        /// Why its flight started, if it is the flight's first attempt (the observer's `started`);
        /// `nil` for a later attempt.
        @usableFromInline var starts: Reason?

        @inlinable
        init(
            flight: FlightID, id: AttemptID, operation: Operation, input: AttemptInput<Value>, timeoutAt: Duration?,
            softTimeoutAt: Duration?, starts: Reason?
        ) {
            (self.flight, self.id, self.operation, self.input) = (flight, id, operation, input)
            (self.timeoutAt, self.softTimeoutAt, self.starts) = (timeoutAt, softTimeoutAt, starts)
        }
    }

    /// What to do after ``fetch(waiter:request:now:policy:operation:callerAttempts:)``.
    @usableFromInline
    enum FetchAction {
        /// Give the caller `value` now; it does not wait. Report it as `answer` says, and start
        /// `refresh` if there is one: a new background flight with no waiters, which refreshes the
        /// value (stale-while-revalidate, restored data, a refresh ahead).
        case answer(Value, Answer, refresh: Attempt?)
        /// Throw this error to the caller now (a cached failure, a reentrant call, too many abandoned
        /// operations). Nothing changes.
        case fail(any Error)
        /// The caller joined the flight in flight and waits for it.
        case join
        /// The flight in flight, if `replaced` is set, ended (cancel its handles; its outcome is
        /// `cancelled`); start `attempt`, a new flight the caller waits for.
        case start(Attempt, replaced: Handles?)
    }

    /// What a caller answered at once got, as the observer hears it.
    @usableFromInline
    enum Answer {
        /// Fresh data: a hit (even when it starts a refresh ahead).
        case fresh
        /// Data that is not fresh: a stale serve (stale-while-revalidate, restored data, past a soft
        /// timeout).
        case stale
        /// The last good value instead of the cached failure `error`: fail-safe (the value is
        /// younger than the maximum stale age).
        case failSafe(any Error)
        /// A paged state's list at its end, with nothing in flight: there is nothing to load, and
        /// nothing to report.
        case atEnd
    }

    /// What to do after ``retry(waiter:operation:now:callerAttempts:)``.
    @usableFromInline enum RetryAction {
        /// Cancel `cancel` (a backoff's timer) and start this attempt now; the caller waits.
        case start(Attempt, cancel: Handles)
        /// Nothing to re-run: return at once.
        case ignore
    }

    /// How long a flight ran and how many attempts it started, for the observer.
    @usableFromInline struct FlightReport {
        @usableFromInline var duration: Duration
        @usableFromInline var attempts: Int

        @inlinable
        init(duration: Duration, attempts: Int) {
            (self.duration, self.attempts) = (duration, attempts)
        }
    }

    /// What to do after an attempt ended, timed out, or its backoff ended. Each carries the handles
    /// it ended, to cancel once the lock is released.
    @usableFromInline enum FlightAction {
        /// The event is stale (another attempt or flight is current): change nothing.
        case drop
        /// Attempt number `attempts` failed with `error` and will be retried: at `at` report
        /// ``backoffEnded(_:attempt:error:now:)`` for `attempt` (attach the timer).
        case retry(flight: FlightID, attempt: AttemptID, at: Duration, error: any Error, attempts: Int, cancel: Handles)
        /// Start this attempt now.
        case start(Attempt, cancel: Handles)
        /// The flight settled: its outcome is `outcome` (for the observer), and its `waiters` are
        /// resumed with `answer`.
        case settle(
            waiters: WaiterIDs, outcome: FlightOutcome, answer: Result<Value, any Error>, report: FlightReport,
            cancel: Handles)
    }

    /// How a flight ended, as the observer hears it.
    @usableFromInline enum FlightOutcome {
        /// It succeeded with a new value.
        case succeeded
        /// It succeeded and kept the value: the operation answered "not modified".
        case notModified
        /// It failed with `error`; its waiters get the error.
        case failed(any Error)
        /// It failed with `error`; its waiters get the last good value instead (fail-safe).
        case failedSafe(any Error)
        /// It was cancelled (by itself, or its attempt threw `CancellationError`).
        case cancelled
    }

    /// What to do after ``softTimeoutPassed(_:now:)``.
    @usableFromInline enum SoftTimeoutAction {
        /// Nothing: the flight ended, or nobody waits, or there is no usable value.
        case none
        /// Resume `waiters` with `value`; the flight goes on in the background.
        case answer(waiters: WaiterIDs, value: Value)
    }

    /// What to do after ``waiterCancelled(_:)``: what becomes of the flight. A waiter that was still in
    /// it gets `CancellationError` (the store takes it out of its table of waiters); one that was not
    /// keeps the outcome it already got (see `WaiterSlot`).
    @usableFromInline
    enum WaiterCancelledAction {
        /// The waiter was no longer waiting (already resumed): nothing to do.
        case none
        /// It left; the flight goes on for the others (or in the background).
        case left
        /// It was the flight's last waiter: the flight ended (its outcome is `cancelled`); cancel its
        /// handles.
        case leftAndEndedFlight(cancel: Handles)
    }

    /// What to do with a flight that an event ended early.
    @usableFromInline enum EndedFlight {
        /// There was no flight.
        case none
        /// Cancel its handles and resume `waiters` (with what the event says).
        case end(waiters: WaiterIDs, cancel: Handles)
    }

    /// The box of ``flightBox``.
    @usableFromInline
    final class FlightBox {
        @usableFromInline var flight: Flight
        @inlinable init(_ flight: Flight) { self.flight = flight }
    }

    /// A flight's ``Flight/fallback``: a value another replica fetched, which a second level held
    /// (not fresh) when an attempt read it, received (on the store's clock) at `receivedAt` — its
    /// source's answer, `arrival.age` before the read. Boxed: a flight without one is no larger.
    @usableFromInline
    final class Fallback {
        @usableFromInline let value: Value
        @usableFromInline let receivedAt: Duration
        @usableFromInline let date: Date
        @usableFromInline let version: UInt64

        @inlinable init(_ value: Value, arrival: RemoteArrival, now: Duration) {
            (self.value, self.date, self.version) = (value, arrival.date, arrival.version)
            receivedAt = now.saturatingAdd(.zero - arrival.age)
        }
    }
}
