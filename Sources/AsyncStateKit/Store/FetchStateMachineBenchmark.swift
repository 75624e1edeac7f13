import Foundation

/// Drives the internal ``FetchStateMachine`` through a fixed cycle of transitions, for the
/// benchmarks package (which cannot see internal types). Not API: it may change at any time.
@_spi(Benchmarks)
public struct FetchStateMachineBenchmark {
    private var machine = FetchStateMachine<Int>(initialValue: 0, expiry: .seconds(120), isEmpty: { $0 == 0 })
    private var now = Duration.zero
    private let date = Date(timeIntervalSinceReferenceDate: 0)

    /// Creates a machine at its initial state.
    public init() {}

    /// Four transitions: fetch (start), operation finished (settle), set, invalidate. Returns the
    /// generation so that the work is observable.
    public mutating func cycle() -> UInt64 {
        now += .seconds(1)
        guard case .start(let id, _) = machine.fetch(waiter: 1, mode: .always, now: now) else { return 0 }
        _ = machine.operationFinished(id, outcome: .success(1), now: now, date: date)
        _ = machine.set(2, now: now, date: date)
        machine.invalidate()
        return machine.generation
    }
}
