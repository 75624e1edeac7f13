import Foundation
import Testing

@testable import AsyncStateKit

/// Drives `FetchStateMachine` directly: events in, actions out, no clock, no tasks.
@Suite struct FetchStateMachineTests {
    typealias Machine = FetchStateMachine<[Int]>

    static let expiry = Duration.seconds(10)

    static func makeMachine(expiry: Duration = expiry) -> Machine {
        Machine(initialValue: [], expiry: expiry, isEmpty: { $0.isEmpty })
    }

    static func date(_ now: Duration) -> Date { Date(timeIntervalSinceReferenceDate: Double(now.components.seconds)) }

    /// The states every event is applied to, each built by events, with the instant it is observed at.
    enum Start: String, CaseIterable, CustomTestStringConvertible {
        case initial, loading, success, expired, invalidated, empty, failure, refreshing, loadingInvalidated

        var testDescription: String { rawValue }

        func build() -> (machine: Machine, now: Duration) {
            var machine = makeMachine()
            func succeed(_ value: [Int], at now: Duration) {
                guard case .start(let id, _) = machine.fetch(waiter: 1, mode: .always, now: now) else {
                    fatalError("expected a start")
                }
                _ = machine.operationFinished(id, outcome: .success(value), now: now, date: date(now))
            }
            switch self {
            case .initial:
                return (machine, .zero)
            case .loading:
                _ = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero)
                return (machine, .zero)
            case .success:
                succeed([1], at: .zero)
                return (machine, .seconds(1))
            case .expired:
                succeed([1], at: .zero)
                return (machine, expiry)
            case .invalidated:
                succeed([1], at: .zero)
                machine.invalidate()
                return (machine, .seconds(1))
            case .empty:
                succeed([], at: .zero)
                return (machine, .seconds(1))
            case .failure:
                succeed([1], at: .zero)
                guard case .start(let id, _) = machine.fetch(waiter: 2, mode: .always, now: .seconds(1)) else {
                    fatalError("expected a start")
                }
                _ = machine.operationFinished(
                    id, outcome: .failure(SourceDown()), now: .seconds(1), date: date(.seconds(1)))
                return (machine, .seconds(1))
            case .refreshing:
                succeed([1], at: .zero)
                _ = machine.fetch(waiter: 2, mode: .always, now: .seconds(1))
                return (machine, .seconds(1))
            case .loadingInvalidated:
                _ = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero)
                machine.invalidate()
                return (machine, .zero)
            }
        }
    }

    /// Every event, applied at the start state's instant. Returns the action, compactly.
    enum Event: String, CaseIterable, CustomTestStringConvertible {
        case fetch, refresh, staleWhileRevalidate, retry, periodicRefresh
        case succeed, succeedEmpty, fail, cancelledByItself, staleResult
        case lastWaiterCancelled, cancel, invalidate, set, setEmpty, reset

        var testDescription: String { rawValue }

        func apply(to machine: inout Machine, at now: Duration) -> String {
            let flight = machine.flight?.id ?? 999
            func finish(_ outcome: Machine.Outcome) -> String {
                switch machine.operationFinished(flight, outcome: outcome, now: now, date: date(now)) {
                case .drop: return "drop"
                case .retry: return "retry"
                case .settle(let waiters, .success(let value)): return "settle(\(waiters.count), \(value))"
                case .settle(let waiters, .failure(let error)):
                    return "settle(\(waiters.count), \(error is CancellationError ? "cancelled" : "error"))"
                }
            }
            func describe(_ ended: Machine.EndedFlight) -> String {
                switch ended {
                case .none: return "none"
                case .cancel(_, let waiters): return "cancel(\(waiters.count))"
                }
            }
            switch self {
            case .fetch, .refresh, .staleWhileRevalidate:
                let mode: Machine.FetchMode =
                    switch self {
                    case .fetch: .ifExpired
                    case .refresh: .always
                    default: .staleWhileRevalidate
                    }
                switch machine.fetch(waiter: 100, mode: mode, now: now) {
                case .returnFresh(let value): return "fresh(\(value))"
                case .returnStale(let value, nil): return "stale(\(value))"
                case .returnStale(let value, .some): return "stale(\(value))+start"
                case .join: return "join"
                case .start(_, nil): return "start"
                case .start(_, .some): return "start+cancel"
                }
            case .retry, .periodicRefresh:
                let action =
                    self == .retry
                    ? machine.retry(waiter: 100, now: now) : machine.periodicRefresh(waiter: 100, now: now)
                switch action {
                case .start: return "start"
                case .ignore: return "ignore"
                }
            case .succeed: return finish(.success([7]))
            case .succeedEmpty: return finish(.success([]))
            case .fail: return finish(.failure(SourceDown()))
            case .cancelledByItself: return finish(.cancelled)
            case .staleResult:
                switch machine.operationFinished(12_345, outcome: .success([9]), now: now, date: date(now)) {
                case .drop: return "drop"
                case .retry: return "retry"
                case .settle: return "settle"
                }
            case .lastWaiterCancelled:
                switch machine.waiterCancelled(machine.flight?.waiters.first ?? 999) {
                case .none: return "none"
                case .resume: return "resume"
                case .resumeAndCancelFlight: return "resume+cancel"
                }
            case .cancel: return describe(machine.cancel())
            case .invalidate:
                machine.invalidate()
                return "ok"
            case .set: return describe(machine.set([5], now: now, date: date(now)))
            case .setEmpty: return describe(machine.set([], now: now, date: date(now)))
            case .reset: return describe(machine.reset())
            }
        }
    }

    /// "action → phase fresh|expired value" for every (state, event) pair, written out by hand.
    static let expected: [Start: [Event: String]] = [
        .initial: [
            .staleWhileRevalidate: "start → loading expired []", .periodicRefresh: "ignore → initial expired []",
            .fetch: "start → loading expired []", .refresh: "start → loading expired []",
            .retry: "ignore → initial expired []", .succeed: "drop → initial expired []",
            .succeedEmpty: "drop → initial expired []", .fail: "drop → initial expired []",
            .cancelledByItself: "drop → initial expired []", .staleResult: "drop → initial expired []",
            .lastWaiterCancelled: "none → initial expired []", .cancel: "none → initial expired []",
            .invalidate: "ok → initial expired []", .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []", .reset: "none → initial expired []",
        ],
        .loading: [
            .staleWhileRevalidate: "join → loading expired []", .periodicRefresh: "ignore → loading expired []",
            .fetch: "join → loading expired []", .refresh: "start+cancel → loading expired []",
            .retry: "ignore → loading expired []", .succeed: "settle(1, [7]) → success fresh [7]",
            .succeedEmpty: "settle(1, []) → empty fresh []", .fail: "settle(1, error) → failure expired []",
            .cancelledByItself: "settle(1, cancelled) → initial expired []",
            .staleResult: "drop → loading expired []",
            .lastWaiterCancelled: "resume+cancel → initial expired []", .cancel: "cancel(1) → initial expired []",
            .invalidate: "ok → loading expired []", .set: "cancel(1) → success fresh [5]",
            .setEmpty: "cancel(1) → empty fresh []", .reset: "cancel(1) → initial expired []",
        ],
        .success: [
            .staleWhileRevalidate: "fresh([1]) → success fresh [1]", .periodicRefresh: "start → loading fresh [1]",
            .fetch: "fresh([1]) → success fresh [1]", .refresh: "start → loading fresh [1]",
            .retry: "ignore → success fresh [1]", .succeed: "drop → success fresh [1]",
            .succeedEmpty: "drop → success fresh [1]", .fail: "drop → success fresh [1]",
            .cancelledByItself: "drop → success fresh [1]", .staleResult: "drop → success fresh [1]",
            .lastWaiterCancelled: "none → success fresh [1]", .cancel: "none → success fresh [1]",
            .invalidate: "ok → success expired [1]", .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []", .reset: "none → initial expired []",
        ],
        .expired: [
            .staleWhileRevalidate: "stale([1])+start → loading expired [1]",
            .periodicRefresh: "start → loading expired [1]",
            .fetch: "start → loading expired [1]", .refresh: "start → loading expired [1]",
            .retry: "ignore → success expired [1]", .succeed: "drop → success expired [1]",
            .succeedEmpty: "drop → success expired [1]", .fail: "drop → success expired [1]",
            .cancelledByItself: "drop → success expired [1]", .staleResult: "drop → success expired [1]",
            .lastWaiterCancelled: "none → success expired [1]", .cancel: "none → success expired [1]",
            .invalidate: "ok → success expired [1]", .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []", .reset: "none → initial expired []",
        ],
        .invalidated: [
            .staleWhileRevalidate: "stale([1])+start → loading expired [1]",
            .periodicRefresh: "start → loading expired [1]",
            .fetch: "start → loading expired [1]", .refresh: "start → loading expired [1]",
            .retry: "ignore → success expired [1]", .succeed: "drop → success expired [1]",
            .succeedEmpty: "drop → success expired [1]", .fail: "drop → success expired [1]",
            .cancelledByItself: "drop → success expired [1]", .staleResult: "drop → success expired [1]",
            .lastWaiterCancelled: "none → success expired [1]", .cancel: "none → success expired [1]",
            .invalidate: "ok → success expired [1]", .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []", .reset: "none → initial expired []",
        ],
        .empty: [
            .staleWhileRevalidate: "fresh([]) → empty fresh []", .periodicRefresh: "start → loading fresh []",
            .fetch: "fresh([]) → empty fresh []", .refresh: "start → loading fresh []",
            .retry: "start → loading fresh []", .succeed: "drop → empty fresh []",
            .succeedEmpty: "drop → empty fresh []", .fail: "drop → empty fresh []",
            .cancelledByItself: "drop → empty fresh []", .staleResult: "drop → empty fresh []",
            .lastWaiterCancelled: "none → empty fresh []", .cancel: "none → empty fresh []",
            .invalidate: "ok → empty expired []", .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []", .reset: "none → initial expired []",
        ],
        .failure: [
            .staleWhileRevalidate: "stale([1])+start → loading expired [1]",
            .periodicRefresh: "start → loading expired [1]",
            .fetch: "start → loading expired [1]", .refresh: "start → loading expired [1]",
            .retry: "start → loading expired [1]", .succeed: "drop → failure expired [1]",
            .succeedEmpty: "drop → failure expired [1]", .fail: "drop → failure expired [1]",
            .cancelledByItself: "drop → failure expired [1]", .staleResult: "drop → failure expired [1]",
            .lastWaiterCancelled: "none → failure expired [1]", .cancel: "none → failure expired [1]",
            .invalidate: "ok → failure expired [1]", .set: "none → success fresh [5]",
            .setEmpty: "none → empty fresh []", .reset: "none → initial expired []",
        ],
        .refreshing: [
            .staleWhileRevalidate: "fresh([1]) → loading fresh [1]", .periodicRefresh: "ignore → loading fresh [1]",
            .fetch: "fresh([1]) → loading fresh [1]", .refresh: "start+cancel → loading fresh [1]",
            .retry: "ignore → loading fresh [1]", .succeed: "settle(1, [7]) → success fresh [7]",
            .succeedEmpty: "settle(1, []) → empty fresh []", .fail: "settle(1, error) → failure expired [1]",
            .cancelledByItself: "settle(1, cancelled) → success fresh [1]",
            .staleResult: "drop → loading fresh [1]",
            .lastWaiterCancelled: "resume+cancel → success fresh [1]", .cancel: "cancel(1) → success fresh [1]",
            .invalidate: "ok → loading expired [1]", .set: "cancel(1) → success fresh [5]",
            .setEmpty: "cancel(1) → empty fresh []", .reset: "cancel(1) → initial expired []",
        ],
        .loadingInvalidated: [
            .staleWhileRevalidate: "join → loading expired []", .periodicRefresh: "ignore → loading expired []",
            .fetch: "join → loading expired []", .refresh: "start+cancel → loading expired []",
            .retry: "ignore → loading expired []", .succeed: "settle(1, [7]) → success expired [7]",
            .succeedEmpty: "settle(1, []) → empty expired []", .fail: "settle(1, error) → failure expired []",
            .cancelledByItself: "settle(1, cancelled) → initial expired []",
            .staleResult: "drop → loading expired []",
            .lastWaiterCancelled: "resume+cancel → initial expired []", .cancel: "cancel(1) → initial expired []",
            .invalidate: "ok → loading expired []", .set: "cancel(1) → success fresh [5]",
            .setEmpty: "cancel(1) → empty fresh []", .reset: "cancel(1) → initial expired []",
        ],
    ]

    @Test(arguments: Start.allCases, Event.allCases)
    func everyStateAndEvent(_ start: Start, _ event: Event) throws {
        var (machine, now) = start.build()
        let generationBefore = machine.generation
        let action = event.apply(to: &machine, at: now)
        let outcome =
            "\(action) → \(machine.phase.name) \(machine.isFresh(at: now) ? "fresh" : "expired") \(machine.value)"
        let expected = try #require(Self.expected[start]?[event])
        #expect(outcome == expected)
        // Writes (set, reset, invalidate) and transitions bump the generation; a drop, a join, a fresh
        // answer, a lone waiter leaving or a no-op do not.
        let isWrite = [.set, .setEmpty, .reset, .invalidate].contains(event)
        let changed =
            isWrite || action.hasPrefix("resume+")
            || !["drop", "join", "ignore", "none", "fresh", "resume", "stale"].contains { action.hasPrefix($0) }
            || action.hasSuffix("+start")
        #expect((machine.generation != generationBefore) == changed, "generation after \(action)")
        // Invariant: loading if and only if a flight is in flight.
        #expect(machine.phase.isLoading == (machine.flight != nil))
    }

    @Test func theExpectationTableCoversEveryPair() {
        for start in Start.allCases {
            #expect(Set(Self.expected[start, default: [:]].keys) == Set(Event.allCases), "\(start)")
        }
    }

    @Test func aWaiterLeavingBeforeTheLastOneLeavesTheFlightRunning() {
        var machine = Self.makeMachine()
        guard case .start(let id, _) = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero) else {
            Issue.record("expected a start")
            return
        }
        guard case .join = machine.fetch(waiter: 2, mode: .ifExpired, now: .zero) else {
            Issue.record("expected a join")
            return
        }
        guard case .resume(1) = machine.waiterCancelled(1) else {
            Issue.record("expected the first waiter to be resumed alone")
            return
        }
        #expect(machine.phase.isLoading)
        guard case .none = machine.waiterCancelled(1) else {
            Issue.record("a waiter that already left cannot leave twice")
            return
        }
        guard
            case .settle(let waiters, .success([3])) = machine.operationFinished(
                id, outcome: .success([3]), now: .zero, date: Self.date(.zero))
        else {
            Issue.record("expected the flight to settle for the remaining waiter")
            return
        }
        #expect(waiters == [2])
    }

    @Test func refreshHandsTheOldFlightsWaitersToTheNewOne() {
        var machine = Self.makeMachine()
        guard case .start(let first, nil) = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero),
            case .start(let second, first) = machine.fetch(waiter: 2, mode: .always, now: .zero)
        else {
            Issue.record("expected start, then start cancelling the first")
            return
        }
        guard case .drop = machine.operationFinished(first, outcome: .success([1]), now: .zero, date: Self.date(.zero))
        else {
            Issue.record("the replaced flight's result must be dropped")
            return
        }
        guard
            case .settle(let waiters, .success([2])) = machine.operationFinished(
                second, outcome: .success([2]), now: .zero, date: Self.date(.zero))
        else {
            Issue.record("expected the new flight to settle")
            return
        }
        #expect(waiters == [1, 2])
        #expect(machine.value == [2])
    }

    @Test func freshForLessThanTheExpiryExactly() {
        var machine = Self.makeMachine()
        guard case .start(let id, _) = machine.fetch(waiter: 1, mode: .ifExpired, now: .seconds(5)) else {
            Issue.record("expected a start")
            return
        }
        _ = machine.operationFinished(id, outcome: .success([1]), now: .seconds(5), date: Self.date(.seconds(5)))
        #expect(machine.isFresh(at: .seconds(15) - .nanoseconds(1)))
        #expect(!machine.isFresh(at: .seconds(15)))
    }

    @Test(arguments: [Duration.zero, .seconds(-5)])
    func zeroOrNegativeExpiryIsNeverFresh(_ expiry: Duration) {
        var machine = Self.makeMachine(expiry: expiry)
        guard case .start(let id, _) = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero) else {
            Issue.record("expected a start")
            return
        }
        _ = machine.operationFinished(id, outcome: .success([1]), now: .zero, date: Self.date(.zero))
        #expect(!machine.isFresh(at: .zero))
        guard case .start = machine.fetch(waiter: 2, mode: .ifExpired, now: .zero) else {
            Issue.record("with no freshness, every fetch runs the operation")
            return
        }
    }

    @Test func resetForgetsTheOperationSoRetryHasNothingToDo() {
        var machine = Self.makeMachine()
        guard case .start(let id, _) = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero) else {
            Issue.record("expected a start")
            return
        }
        _ = machine.operationFinished(id, outcome: .failure(SourceDown()), now: .zero, date: Self.date(.zero))
        #expect(machine.hasOperation)
        _ = machine.reset()
        #expect(!machine.hasOperation)
        guard case .ignore = machine.retry(waiter: 2) else {
            Issue.record("retry after reset must be ignored")
            return
        }
    }

    @Test func successDateIsTheDateGivenWithTheResult() {
        var machine = Self.makeMachine()
        guard case .start(let id, _) = machine.fetch(waiter: 1, mode: .ifExpired, now: .zero) else {
            Issue.record("expected a start")
            return
        }
        let date = Date(timeIntervalSince1970: 1_234)
        _ = machine.operationFinished(id, outcome: .success([1]), now: .seconds(3), date: date)
        #expect(machine.phase.lastUpdated == date)
    }
}
