import Foundation

/// Drives the internal ``FetchStateMachine`` through a fixed cycle of transitions, for the
/// benchmarks package (which cannot see internal types). Not API: it may change at any time.
@_spi(Benchmarks)
public struct FetchStateMachineBenchmark {
    private var machine = FetchStateMachine<Int, Void, Never>(
        initialValue: 0, configuration: StoreConfiguration(expiry: .seconds(120), isEmpty: { $0 == 0 }))
    private var now = Duration.zero
    private let date = Date(timeIntervalSinceReferenceDate: 0)

    /// Creates a machine at its initial state.
    public init() {}

    /// Four transitions: fetch (start), attempt finished (settle), set, invalidate. Returns the
    /// attempt's id so that the work is observable.
    public mutating func cycle() -> UInt64 {
        now += .seconds(1)
        guard case .start(let attempt, _) = machine.fetch(waiter: 1, request: .refresh, now: now, operation: ()) else {
            return 0
        }
        _ = machine.attemptFinished(attempt.flight, attempt: attempt.id, outcome: .success(1), now: now, date: date)
        _ = machine.set(2, now: now, date: date, version: 0)
        _ = machine.invalidate(now: now)
        return attempt.id
    }
}

extension AsyncState {
    /// How many callers are waiting for this state's fetch, for the benchmarks package. Not API.
    @_spi(Benchmarks)
    public var waitingCallers: Int { store.waiterCount }
}
