import Foundation
import Testing

@testable import AsyncStateKit

/// Drives `FetchStateMachine` directly: events in, actions out, no clock, no tasks.
@Suite struct FetchStateMachineTests {
    /// Operations are plain labels here: the machine only carries them.
    typealias Machine = FetchStateMachine<[Int], String, Never>

    static let expiry = Duration.seconds(10)
    static let timeout = Duration.seconds(5)
    static let failureExpiry = Duration.seconds(30)
    /// A policy with one retry, a second after the first failure.
    static let oneRetry = RetryPolicy(maxAttempts: 2, backoff: .constant(.seconds(1)))

    static func makeMachine(expiry: Duration = expiry, failureExpiry: Duration = .zero) -> Machine {
        Machine(
            initialValue: [],
            configuration: StoreConfiguration(
                expiry: expiry, failureExpiry: failureExpiry, isEmpty: { $0.isEmpty }, timeout: timeout))
    }

    static func date(_ now: Duration) -> Date { Date(timeIntervalSinceReferenceDate: Double(now.components.seconds)) }

    /// The states every event is applied to, each built by events, with the instant it is observed at.
    enum Start: String, CaseIterable, CustomTestStringConvertible {
        case initial, loading, success, expired, invalidated, empty, failure, failureCached, refreshing
        case loadingInvalidated, backingOff

        var testDescription: String { rawValue }

        func build() -> (machine: Machine, now: Duration) {
            var machine = makeMachine(failureExpiry: self == .failureCached ? failureExpiry : .zero)
            func succeed(_ value: [Int], at now: Duration) {
                guard case .start(let attempt, _) = machine.fetch(waiter: 1, mode: .always, now: now, operation: "a")
                else { fatalError("expected a start") }
                _ = machine.attemptFinished(
                    attempt.flight, attempt: attempt.id, outcome: .success(value), now: now, date: date(now))
            }
            switch self {
            case .initial:
                return (machine, .zero)
            case .loading:
                _ = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero, operation: "a")
                return (machine, .zero)
            case .success:
                succeed([1], at: .zero)
                return (machine, .seconds(1))
            case .expired:
                succeed([1], at: .zero)
                return (machine, expiry)
            case .invalidated:
                succeed([1], at: .zero)
                _ = machine.invalidate(now: .zero)
                return (machine, .seconds(1))
            case .empty:
                succeed([], at: .zero)
                return (machine, .seconds(1))
            case .failure, .failureCached:
                succeed([1], at: .zero)
                guard
                    case .start(let attempt, _) = machine.fetch(
                        waiter: 2, mode: .always, now: .seconds(1), operation: "b")
                else { fatalError("expected a start") }
                _ = machine.attemptFinished(
                    attempt.flight, attempt: attempt.id, outcome: .failure(SourceDown()), now: .seconds(1),
                    date: date(.seconds(1)))
                return (machine, .seconds(1))
            case .refreshing:
                succeed([1], at: .zero)
                _ = machine.fetch(waiter: 2, mode: .always, now: .seconds(1), operation: "b")
                return (machine, .seconds(1))
            case .loadingInvalidated:
                _ = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero, operation: "a")
                _ = machine.invalidate(now: .zero)
                return (machine, .zero)
            case .backingOff:
                guard
                    case .start(let attempt, _) = machine.fetch(
                        waiter: 1, mode: .ifExpired, now: .zero, policy: oneRetry, operation: "a"),
                    case .retry = machine.attemptFinished(
                        attempt.flight, attempt: attempt.id, outcome: .failure(SourceDown()), now: .zero,
                        date: date(.zero))
                else { fatalError("expected a start, then a retry") }
                return (machine, .zero)
            }
        }
    }

    /// Every event, applied at the start state's instant. Returns the action, compactly.
    enum Event: String, CaseIterable, CustomTestStringConvertible {
        case fetch, refresh, staleWhileRevalidate, joinOrStart, retry, retryNow, reentrantFetch
        case succeed, succeedEmpty, fail, cancelledByItself, staleResult, timeout, backoffEnded, backoffThrew
        case lastWaiterCancelled, cancel, invalidate, set, setEmpty, reset

        var testDescription: String { rawValue }

        func apply(to machine: inout Machine, at now: Duration) -> String {
            let flight = machine.flight?.id ?? 999
            let attempt = machine.flight?.attempt ?? 999
            func describe(_ action: Machine.FlightAction) -> String {
                switch action {
                case .drop: return "drop"
                case .retry: return "retry"
                case .start(let attempt, _): return "start(\(attempt.operation))"
                case .settle(let waiters, .failedSafe(let error), .success(let value), _, _):
                    return "settle(\(waiters.count), \(Self.name(of: error)))+failSafe(\(value))"
                case .settle(let waiters, _, .success(let value), _, _): return "settle(\(waiters.count), \(value))"
                case .settle(let waiters, _, .failure(let error), _, _):
                    return "settle(\(waiters.count), \(Self.name(of: error)))"
                }
            }
            func finish(_ outcome: Machine.Outcome) -> String {
                describe(machine.attemptFinished(flight, attempt: attempt, outcome: outcome, now: now, date: date(now)))
            }
            func describe(_ ended: Machine.EndedFlight) -> String {
                switch ended {
                case .none: return "none"
                case .end(let waiters, _): return "end(\(waiters.count))"
                }
            }
            func describe(_ action: Machine.FetchAction) -> String {
                switch action {
                case .answer(let value, .failSafe(let error), _):
                    return "failSafe(\(value), \(Self.name(of: error)))"
                case .answer(let value, _, nil): return "value(\(value))"
                case .answer(let value, _, let attempt?): return "stale(\(value))+start(\(attempt.operation))"
                case .fail(let error): return "fail(\(Self.name(of: error)))"
                case .join: return "join"
                case .start(let attempt, nil): return "start(\(attempt.operation))"
                case .start(let attempt, _?): return "start(\(attempt.operation))+replace"
                }
            }
            switch self {
            case .fetch, .refresh, .staleWhileRevalidate, .joinOrStart:
                let mode: Machine.FetchMode =
                    switch self {
                    case .fetch: .ifExpired
                    case .refresh: .always
                    case .joinOrStart: .joinOrStart
                    default: .staleWhileRevalidate
                    }
                return describe(machine.fetch(waiter: 100, mode: mode, now: now, operation: "new"))
            case .reentrantFetch:
                return describe(
                    machine.fetch(waiter: 100, mode: .ifExpired, now: now, operation: "new", callerAttempts: [attempt]))
            case .retry, .retryNow:
                switch machine.retry(waiter: 100, operation: self == .retry ? "new" : nil, now: now) {
                case .start(let attempt, _): return "start(\(attempt.operation))"
                case .ignore: return "ignore"
                }
            case .succeed: return finish(.success([7]))
            case .succeedEmpty: return finish(.success([]))
            case .fail: return finish(.failure(SourceDown()))
            case .cancelledByItself: return finish(.cancelled)
            case .staleResult:
                return describe(
                    machine.attemptFinished(12_345, attempt: 1, outcome: .success([9]), now: now, date: date(now)))
            case .timeout:
                return describe(machine.attemptTimedOut(flight, attempt: attempt, now: now))
            case .backoffEnded:
                return describe(machine.backoffEnded(flight, attempt: attempt, error: nil, now: now))
            case .backoffThrew:
                return describe(machine.backoffEnded(flight, attempt: attempt, error: SourceDown(), now: now))
            case .lastWaiterCancelled:
                switch machine.waiterCancelled(machine.flight?.waiters.first ?? 999) {
                case .none: return "none"
                case .left: return "resume"
                case .leftAndEndedFlight: return "resume+end"
                }
            case .cancel: return describe(machine.cancel())
            case .invalidate: return machine.invalidate(now: now) == true ? "publish" : "no-op"
            case .set: return describe(machine.set([5], now: now, date: date(now), version: 0))
            case .setEmpty: return describe(machine.set([], now: now, date: date(now), version: 0))
            case .reset:
                let (ended, changed) = machine.reset()
                return describe(ended) + (changed ? "" : " no-op")
            }
        }

        static func name(of error: any Error) -> String {
            switch error {
            case is CancellationError: "cancelled"
            case AsyncStateError.timedOut: "timedOut"
            case AsyncStateError.reentrantCall: "reentrant"
            default: "error"
            }
        }
    }

    /// "action → phase fresh|expired value" for every (state, event) pair: first printed from the
    /// machine, then every row checked by hand against DESIGN.md's semantics and the
    /// PhasesAndTransitions article (two were wrong and the machine was fixed: `invalidate` published
    /// for a cached failure and for data already expired by time).
    static let expected: [Start: [Event: String]] = [
        .initial: [
            .fetch: "start(new) → loading expired []",
            .refresh: "start(new) → loading expired []",
            .staleWhileRevalidate: "start(new) → loading expired []",
            .joinOrStart: "start(new) → loading expired []",
            .retry: "ignore → initial expired []",
            .retryNow: "ignore → initial expired []",
            .reentrantFetch: "start(new) → loading expired []",
            .succeed: "drop → initial expired []",
            .succeedEmpty: "drop → initial expired []",
            .fail: "drop → initial expired []",
            .cancelledByItself: "drop → initial expired []",
            .staleResult: "drop → initial expired []",
            .timeout: "drop → initial expired []",
            .backoffEnded: "drop → initial expired []",
            .backoffThrew: "drop → initial expired []",
            .lastWaiterCancelled: "none → initial expired []",
            .cancel: "none → initial expired []",
            .invalidate: "no-op → initial expired []",
            .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []",
            .reset: "none no-op → initial expired []",
        ],
        .loading: [
            .fetch: "join → loading expired []",
            .refresh: "start(new)+replace → loading expired []",
            .staleWhileRevalidate: "join → loading expired []",
            .joinOrStart: "join → loading expired []",
            .retry: "ignore → loading expired []",
            .retryNow: "ignore → loading expired []",
            .reentrantFetch: "fail(reentrant) → loading expired []",
            .succeed: "settle(1, [7]) → success fresh [7]",
            .succeedEmpty: "settle(1, []) → empty fresh []",
            .fail: "settle(1, error) → failure expired []",
            .cancelledByItself: "settle(1, cancelled) → initial expired []",
            .staleResult: "drop → loading expired []",
            .timeout: "settle(1, timedOut) → failure expired []",
            .backoffEnded: "drop → loading expired []",
            .backoffThrew: "drop → loading expired []",
            .lastWaiterCancelled: "resume+end → initial expired []",
            .cancel: "end(1) → initial expired []",
            .invalidate: "no-op → loading expired []",
            .set: "end(1) → success fresh [5]",
            .setEmpty: "end(1) → empty fresh []",
            .reset: "end(1) → initial expired []",
        ],
        .success: [
            .fetch: "value([1]) → success fresh [1]",
            .refresh: "start(new) → loading fresh [1]",
            .staleWhileRevalidate: "value([1]) → success fresh [1]",
            .joinOrStart: "start(new) → loading fresh [1]",
            .retry: "ignore → success fresh [1]",
            .retryNow: "ignore → success fresh [1]",
            .reentrantFetch: "value([1]) → success fresh [1]",
            .succeed: "drop → success fresh [1]",
            .succeedEmpty: "drop → success fresh [1]",
            .fail: "drop → success fresh [1]",
            .cancelledByItself: "drop → success fresh [1]",
            .staleResult: "drop → success fresh [1]",
            .timeout: "drop → success fresh [1]",
            .backoffEnded: "drop → success fresh [1]",
            .backoffThrew: "drop → success fresh [1]",
            .lastWaiterCancelled: "none → success fresh [1]",
            .cancel: "none → success fresh [1]",
            .invalidate: "publish → success expired [1]",
            .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []",
            .reset: "none → initial expired []",
        ],
        .expired: [
            .fetch: "start(new) → loading expired [1]",
            .refresh: "start(new) → loading expired [1]",
            .staleWhileRevalidate: "stale([1])+start(new) → loading expired [1]",
            .joinOrStart: "start(new) → loading expired [1]",
            .retry: "ignore → success expired [1]",
            .retryNow: "ignore → success expired [1]",
            .reentrantFetch: "start(new) → loading expired [1]",
            .succeed: "drop → success expired [1]",
            .succeedEmpty: "drop → success expired [1]",
            .fail: "drop → success expired [1]",
            .cancelledByItself: "drop → success expired [1]",
            .staleResult: "drop → success expired [1]",
            .timeout: "drop → success expired [1]",
            .backoffEnded: "drop → success expired [1]",
            .backoffThrew: "drop → success expired [1]",
            .lastWaiterCancelled: "none → success expired [1]",
            .cancel: "none → success expired [1]",
            .invalidate: "no-op → success expired [1]",
            .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []",
            .reset: "none → initial expired []",
        ],
        .invalidated: [
            .fetch: "start(new) → loading expired [1]",
            .refresh: "start(new) → loading expired [1]",
            .staleWhileRevalidate: "stale([1])+start(new) → loading expired [1]",
            .joinOrStart: "start(new) → loading expired [1]",
            .retry: "ignore → success expired [1]",
            .retryNow: "ignore → success expired [1]",
            .reentrantFetch: "start(new) → loading expired [1]",
            .succeed: "drop → success expired [1]",
            .succeedEmpty: "drop → success expired [1]",
            .fail: "drop → success expired [1]",
            .cancelledByItself: "drop → success expired [1]",
            .staleResult: "drop → success expired [1]",
            .timeout: "drop → success expired [1]",
            .backoffEnded: "drop → success expired [1]",
            .backoffThrew: "drop → success expired [1]",
            .lastWaiterCancelled: "none → success expired [1]",
            .cancel: "none → success expired [1]",
            .invalidate: "no-op → success expired [1]",
            .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []",
            .reset: "none → initial expired []",
        ],
        .empty: [
            .fetch: "value([]) → empty fresh []",
            .refresh: "start(new) → loading fresh []",
            .staleWhileRevalidate: "value([]) → empty fresh []",
            .joinOrStart: "start(new) → loading fresh []",
            .retry: "start(new) → loading fresh []",
            .retryNow: "ignore → empty fresh []",
            .reentrantFetch: "value([]) → empty fresh []",
            .succeed: "drop → empty fresh []",
            .succeedEmpty: "drop → empty fresh []",
            .fail: "drop → empty fresh []",
            .cancelledByItself: "drop → empty fresh []",
            .staleResult: "drop → empty fresh []",
            .timeout: "drop → empty fresh []",
            .backoffEnded: "drop → empty fresh []",
            .backoffThrew: "drop → empty fresh []",
            .lastWaiterCancelled: "none → empty fresh []",
            .cancel: "none → empty fresh []",
            .invalidate: "publish → empty expired []",
            .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []",
            .reset: "none → initial expired []",
        ],
        .failure: [
            .fetch: "start(new) → loading expired [1]",
            .refresh: "start(new) → loading expired [1]",
            .staleWhileRevalidate: "stale([1])+start(new) → loading expired [1]",
            .joinOrStart: "start(new) → loading expired [1]",
            .retry: "start(new) → loading expired [1]",
            .retryNow: "ignore → failure expired [1]",
            .reentrantFetch: "start(new) → loading expired [1]",
            .succeed: "drop → failure expired [1]",
            .succeedEmpty: "drop → failure expired [1]",
            .fail: "drop → failure expired [1]",
            .cancelledByItself: "drop → failure expired [1]",
            .staleResult: "drop → failure expired [1]",
            .timeout: "drop → failure expired [1]",
            .backoffEnded: "drop → failure expired [1]",
            .backoffThrew: "drop → failure expired [1]",
            .lastWaiterCancelled: "none → failure expired [1]",
            .cancel: "none → failure expired [1]",
            .invalidate: "no-op → failure expired [1]",
            .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []",
            .reset: "none → initial expired []",
        ],
        .failureCached: [
            .fetch: "fail(error) → failure expired [1]",
            .refresh: "start(new) → loading expired [1]",
            .staleWhileRevalidate: "value([1]) → failure expired [1]",
            .joinOrStart: "start(new) → loading expired [1]",
            .retry: "start(new) → loading expired [1]",
            .retryNow: "ignore → failure expired [1]",
            .reentrantFetch: "fail(error) → failure expired [1]",
            .succeed: "drop → failure expired [1]",
            .succeedEmpty: "drop → failure expired [1]",
            .fail: "drop → failure expired [1]",
            .cancelledByItself: "drop → failure expired [1]",
            .staleResult: "drop → failure expired [1]",
            .timeout: "drop → failure expired [1]",
            .backoffEnded: "drop → failure expired [1]",
            .backoffThrew: "drop → failure expired [1]",
            .lastWaiterCancelled: "none → failure expired [1]",
            .cancel: "none → failure expired [1]",
            .invalidate: "no-op → failure expired [1]",
            .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []",
            .reset: "none → initial expired []",
        ],
        .refreshing: [
            .fetch: "value([1]) → loading fresh [1]",
            .refresh: "start(new)+replace → loading fresh [1]",
            .staleWhileRevalidate: "value([1]) → loading fresh [1]",
            .joinOrStart: "join → loading fresh [1]",
            .retry: "ignore → loading fresh [1]",
            .retryNow: "ignore → loading fresh [1]",
            .reentrantFetch: "value([1]) → loading fresh [1]",
            .succeed: "settle(1, [7]) → success fresh [7]",
            .succeedEmpty: "settle(1, []) → empty fresh []",
            .fail: "settle(1, error) → failure expired [1]",
            .cancelledByItself: "settle(1, cancelled) → success fresh [1]",
            .staleResult: "drop → loading fresh [1]",
            .timeout: "settle(1, timedOut) → failure expired [1]",
            .backoffEnded: "drop → loading fresh [1]",
            .backoffThrew: "drop → loading fresh [1]",
            .lastWaiterCancelled: "resume+end → success fresh [1]",
            .cancel: "end(1) → success fresh [1]",
            .invalidate: "publish → loading expired [1]",
            .set: "end(1) → success fresh [5]",
            .setEmpty: "end(1) → empty fresh []",
            .reset: "end(1) → initial expired []",
        ],
        .loadingInvalidated: [
            .fetch: "join → loading expired []",
            .refresh: "start(new)+replace → loading expired []",
            .staleWhileRevalidate: "join → loading expired []",
            .joinOrStart: "join → loading expired []",
            .retry: "ignore → loading expired []",
            .retryNow: "ignore → loading expired []",
            .reentrantFetch: "fail(reentrant) → loading expired []",
            .succeed: "settle(1, [7]) → success expired [7]",
            .succeedEmpty: "settle(1, []) → empty expired []",
            .fail: "settle(1, error) → failure expired []",
            .cancelledByItself: "settle(1, cancelled) → initial expired []",
            .staleResult: "drop → loading expired []",
            .timeout: "settle(1, timedOut) → failure expired []",
            .backoffEnded: "drop → loading expired []",
            .backoffThrew: "drop → loading expired []",
            .lastWaiterCancelled: "resume+end → initial expired []",
            .cancel: "end(1) → initial expired []",
            .invalidate: "no-op → loading expired []",
            .set: "end(1) → success fresh [5]",
            .setEmpty: "end(1) → empty fresh []",
            .reset: "end(1) → initial expired []",
        ],
        .backingOff: [
            .fetch: "join → loading expired []",
            .refresh: "start(new)+replace → loading expired []",
            .staleWhileRevalidate: "join → loading expired []",
            .joinOrStart: "join → loading expired []",
            .retry: "start(a) → loading expired []",
            .retryNow: "start(a) → loading expired []",
            .reentrantFetch: "join → loading expired []",
            .succeed: "drop → loading expired []",
            .succeedEmpty: "drop → loading expired []",
            .fail: "drop → loading expired []",
            .cancelledByItself: "drop → loading expired []",
            .staleResult: "drop → loading expired []",
            .timeout: "drop → loading expired []",
            .backoffEnded: "start(a) → loading expired []",
            .backoffThrew: "settle(1, error) → failure expired []",
            .lastWaiterCancelled: "resume+end → initial expired []",
            .cancel: "end(1) → initial expired []",
            .invalidate: "no-op → loading expired []",
            .set: "end(1) → success fresh [5]",
            .setEmpty: "end(1) → empty fresh []",
            .reset: "end(1) → initial expired []",
        ],
    ]

    @Test(arguments: Start.allCases, Event.allCases)
    func everyStateAndEvent(_ start: Start, _ event: Event) throws {
        var (machine, now) = start.build()
        let action = event.apply(to: &machine, at: now)
        let outcome =
            "\(action) → \(machine.phase.name) \(machine.isFresh(at: now) ? "fresh" : "expired") \(machine.value)"
        let expected = try #require(Self.expected[start]?[event])
        #expect(outcome == expected)
        // Invariant: loading if and only if a flight is in flight, and the operation lives only there.
        #expect(machine.phase.isLoading == (machine.flight != nil))
    }

    @Test func theExpectationTableCoversEveryPair() {
        for start in Start.allCases {
            #expect(Set(Self.expected[start, default: [:]].keys) == Set(Event.allCases), "\(start)")
        }
    }

    @Test func aWaiterLeavingBeforeTheLastOneLeavesTheFlightRunning() throws {
        var machine = Self.makeMachine()
        guard case .start(let attempt, _) = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero, operation: "a"),
            case .join = machine.fetch(waiter: 2, mode: .ifExpired, now: .zero, operation: "b")
        else { throw Failure("expected a start, then a join") }
        guard case .left = machine.waiterCancelled(1) else {
            throw Failure("expected the first waiter to be resumed alone")
        }
        #expect(machine.phase.isLoading)
        guard case .none = machine.waiterCancelled(1) else { throw Failure("a waiter cannot leave twice") }
        guard
            case .settle(let waiters, _, .success([3]), _, _) = machine.attemptFinished(
                attempt.flight, attempt: attempt.id, outcome: .success([3]), now: .zero, date: Self.date(.zero))
        else { throw Failure("expected the flight to settle for the remaining waiter") }
        #expect(waiters == [2])
    }

    @Test func refreshHandsTheOldFlightsWaitersToTheNewOne() throws {
        var machine = Self.makeMachine()
        guard case .start(let first, nil) = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero, operation: "a"),
            case .start(let second, _?) = machine.fetch(waiter: 2, mode: .always, now: .zero, operation: "b")
        else { throw Failure("expected start, then start replacing the first") }
        guard
            case .drop = machine.attemptFinished(
                first.flight, attempt: first.id, outcome: .success([1]), now: .zero, date: Self.date(.zero))
        else { throw Failure("the replaced flight's result must be dropped") }
        guard
            case .settle(let waiters, _, .success([2]), _, _) = machine.attemptFinished(
                second.flight, attempt: second.id, outcome: .success([2]), now: .zero, date: Self.date(.zero))
        else { throw Failure("expected the new flight to settle") }
        #expect(waiters == [1, 2])
        #expect(machine.value == [2])
    }

    @Test func freshForLessThanTheExpiryExactly() throws {
        var machine = Self.makeMachine()
        try machine.succeed([1], at: .seconds(5))
        #expect(machine.isFresh(at: .seconds(15) - .nanoseconds(1)))
        #expect(!machine.isFresh(at: .seconds(15)))
    }

    @Test(arguments: [Duration.zero, .seconds(-5)])
    func zeroOrNegativeExpiryIsNeverFresh(_ expiry: Duration) throws {
        var machine = Self.makeMachine(expiry: expiry)
        try machine.succeed([1], at: .zero)
        #expect(!machine.isFresh(at: .zero))
        guard case .start = machine.fetch(waiter: 2, mode: .ifExpired, now: .zero, operation: "b") else {
            throw Failure("with no freshness, every fetch runs the operation")
        }
    }

    @Test func theOperationLivesOnlyInTheFlight() throws {
        var machine = Self.makeMachine()
        guard case .start(let attempt, _) = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero, operation: "a")
        else { throw Failure("expected a start") }
        #expect(machine.flight?.operation == "a")
        _ = machine.attemptFinished(
            attempt.flight, attempt: attempt.id, outcome: .failure(SourceDown()), now: .zero, date: Self.date(.zero))
        #expect(machine.flight == nil)
        // Nothing is kept to re-run: retry without an operation does nothing, with one it starts.
        guard case .ignore = machine.retry(waiter: 2, operation: nil, now: .zero) else {
            throw Failure("retry without an operation after the flight must be ignored")
        }
        guard case .start(let retried, _) = machine.retry(waiter: 3, operation: "b", now: .zero) else {
            throw Failure("retry with an operation after a failure must start")
        }
        #expect(retried.operation == "b")
    }

    @Test func aFailureIsAnsweredFromTheNegativeCacheUntilItsExpiry() throws {
        var machine = Self.makeMachine(failureExpiry: .seconds(3))
        guard case .start(let attempt, _) = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero, operation: "a")
        else { throw Failure("expected a start") }
        _ = machine.attemptFinished(
            attempt.flight, attempt: attempt.id, outcome: .failure(SourceDown()), now: .seconds(1),
            date: Self.date(.seconds(1)))
        guard
            case .fail(let error) = machine.fetch(
                waiter: 2, mode: .ifExpired, now: .seconds(4) - .nanoseconds(1), operation: "b"),
            error is SourceDown
        else { throw Failure("within the failure expiry, the cached error answers") }
        guard case .start = machine.fetch(waiter: 3, mode: .ifExpired, now: .seconds(4), operation: "c") else {
            throw Failure("at the failure expiry, the source is called again")
        }
    }

    @Test func aTimedOutAttemptCountsAsAbandonedUntilItReturns() throws {
        var machine = Self.makeMachine()
        var abandoned: [Machine.Attempt] = []
        for n in 0..<AsyncStateLimits.abandonedOperations {
            guard
                case .start(let attempt, _) = machine.fetch(
                    waiter: UInt64(n), mode: .ifExpired, now: .zero, operation: "a")
            else { throw Failure("expected a start") }
            guard
                case .settle(_, _, .failure(AsyncStateError.timedOut), _, _) = machine.attemptTimedOut(
                    attempt.flight, attempt: attempt.id, now: Self.timeout)
            else { throw Failure("expected the flight to time out") }
            abandoned.append(attempt)
        }
        #expect(machine.abandoned.count == AsyncStateLimits.abandonedOperations)
        guard
            case .fail(AsyncStateError.tooManyAbandonedOperations) = machine.fetch(
                waiter: 99, mode: .ifExpired, now: Self.timeout, operation: "b")
        else { throw Failure("no new operation while the limit of abandoned ones runs") }
        // One returns late: its result is dropped, and operations start again.
        guard
            case .drop = machine.attemptFinished(
                abandoned[0].flight, attempt: abandoned[0].id, outcome: .success([1]), now: .seconds(6),
                date: Self.date(.seconds(6)))
        else { throw Failure("a late result must be dropped") }
        guard case .start = machine.fetch(waiter: 100, mode: .ifExpired, now: .seconds(6), operation: "c") else {
            throw Failure("expected a start once an abandoned operation returned")
        }
    }

    @Test func aRetryDueWhileTheLimitOfAbandonedOperationsRunsSettlesWithTheLastError() throws {
        var machine = Self.makeMachine()
        for n in 0..<(AsyncStateLimits.abandonedOperations - 1) {
            guard
                case .start(let attempt, _) = machine.fetch(
                    waiter: UInt64(n), mode: .ifExpired, now: .zero, operation: "a")
            else { throw Failure("expected a start") }
            _ = machine.attemptTimedOut(attempt.flight, attempt: attempt.id, now: Self.timeout)
        }
        guard
            case .start(let attempt, _) = machine.fetch(
                waiter: 50, mode: .ifExpired, now: .zero, policy: Self.oneRetry, operation: "b")
        else { throw Failure("expected a start") }
        // Its own timeout makes the limit: the retry it would have earned does not start.
        guard
            case .settle(_, _, .failure(AsyncStateError.timedOut), _, _) = machine.attemptTimedOut(
                attempt.flight, attempt: attempt.id, now: Self.timeout)
        else { throw Failure("expected the flight to settle instead of retrying") }
    }

    @Test func reentrancyCountsOnlyTheRunningAttempt() throws {
        var machine = Self.makeMachine()
        guard
            case .start(let attempt, _) = machine.fetch(
                waiter: 1, mode: .ifExpired, now: .zero, policy: Self.oneRetry, operation: "a")
        else { throw Failure("expected a start") }
        #expect(machine.isReentrant([attempt.id]))
        _ = machine.attemptFinished(
            attempt.flight, attempt: attempt.id, outcome: .failure(SourceDown()), now: .zero, date: Self.date(.zero))
        // The attempt is over (the flight waits out its backoff): a task it started may join.
        #expect(!machine.isReentrant([attempt.id]))
        guard
            case .join = machine.fetch(
                waiter: 2, mode: .ifExpired, now: .zero, operation: "b", callerAttempts: [attempt.id])
        else { throw Failure("a task the finished attempt started must be able to join") }
    }

    @Test func successDateIsTheDateGivenWithTheResult() throws {
        var machine = Self.makeMachine()
        let date = Date(timeIntervalSince1970: 1_234)
        try machine.succeed([1], at: .seconds(3), date: date)
        #expect(machine.phase.lastUpdated == date)
    }
}

/// A test failure with a message, thrown where a `guard case` did not match.
struct Failure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

extension FetchStateMachineTests.Machine {
    /// Runs one fetch that succeeds with `value` at `now`.
    mutating func succeed(_ value: [Int], at now: Duration, date: Date? = nil) throws {
        guard case .start(let attempt, _) = fetch(waiter: 1, mode: .always, now: now, operation: "a") else {
            throw Failure("expected a start")
        }
        _ = attemptFinished(
            attempt.flight, attempt: attempt.id, outcome: .success(value), now: now,
            date: date ?? FetchStateMachineTests.date(now))
    }
}
