import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// A small reference model of the semantics, written independently of `FetchStateMachine`: what the
/// phase, value, freshness, operations in flight and callers' outcomes must be after each step.
struct ReferenceModel {
    struct Operation: Equatable {
        var result: Int
        var fails: Bool
        var duration: Duration
        /// The lifetime its value says it has (``AsyncStateExpiring``); `nil` for the expiry.
        var lifetime: Duration? = nil
        /// A conditional operation that answers "not modified" (unless it `fails`).
        var notModified = false
    }

    /// The state's value: a number and the lifetime it says it has.
    struct Leased: Equatable, AsyncStateExpiring {
        var n: Int
        var lifetime: Duration?
        var timeToLive: Duration? { lifetime }
    }

    struct Flight {
        var operation: Operation
        var ends: Duration
        var waiters: [Int]
        var phaseBefore: String
        var successDateBefore: Duration?
        var landsExpired: Bool
        /// When its soft timeout passes; `nil` without one, or once it has passed.
        var softAt: Duration?
        /// Whether its soft timeout has passed: it then goes on with no waiter.
        var isPastSoftTimeout = false
        /// The waiters the soft timeout does not release (`refresh`, `retry`).
        var patient: Set<Int> = []
    }

    static let initialValue = -1
    let expiry: Duration
    /// Fail-safe: a failed flight's waiters get the value if it arrived less than this long ago.
    var maxStaleAge: Duration? = nil
    /// Readers waiting this long for a flight get a usable value instead.
    var softTimeout: Duration? = nil

    var now: Duration = .zero
    var value = initialValue
    var phase = "initial"
    var successAt: Duration?
    var freshSince: Duration?
    /// The lifetime the current value says it has; `nil` for the expiry.
    var lifetime: Duration?
    /// When the value arrived (a success or a write); `nil` while there is none.
    var receivedAt: Duration?
    /// The value a soft timeout answers: any value there is, or with a maximum stale age, a young one.
    var softTimeoutValue: Int? {
        guard let receivedAt else { return nil }
        if let maxStaleAge, now - receivedAt >= maxStaleAge { return nil }
        return value
    }
    var flight: Flight?
    /// Callers' outcomes: "value(n)", "failed", "cancelled" (value callers) or "done" (others).
    var outcomes: [Int: String] = [:]
    /// Whether each caller awaits a value (`value`) or just completion (`refresh`, `retry`).
    var wantsValue: [Int: Bool] = [:]

    /// Fresh for the value's own lifetime if it has one (zero or less: never), else the expiry.
    var isFresh: Bool { freshSince.map { now - $0 < (lifetime ?? expiry) } ?? false }
    /// Whether there is fresh data younger than `interval` (what `hasExpired(in:)` says, negated):
    /// the age is the arrival's, whatever the value's lifetime.
    func isYounger(than interval: Duration) -> Bool { freshSince.map { now - $0 < interval } ?? false }

    mutating func resolve(_ caller: Int, _ outcome: String) {
        outcomes[caller] = wantsValue[caller] == true ? outcome : "done"
    }

    mutating func startFlight(_ operation: Operation, waiters: [Int], patient: Set<Int> = []) {
        let before = flight.map { ($0.phaseBefore, $0.successDateBefore) } ?? (phase, successAt)
        flight = Flight(
            operation: operation, ends: now + operation.duration, waiters: waiters, phaseBefore: before.0,
            successDateBefore: before.1, landsExpired: false, softAt: softTimeout.map { now + $0 },
            patient: (flight?.patient ?? []).union(patient))
        phase = "loading"
    }

    mutating func endFlight(resolvingWith outcome: String) {
        guard let ended = flight else { return }
        flight = nil
        for waiter in ended.waiters { resolve(waiter, outcome) }
    }

    mutating func restorePhase(of ended: Flight) {
        phase = ended.phaseBefore
        successAt = ended.successDateBefore
    }

    mutating func value(caller: Int, _ operation: Operation) {
        wantsValue[caller] = true
        if isFresh { return resolve(caller, "value(\(value))") }
        if flight != nil {
            if flight!.isPastSoftTimeout, let value = softTimeoutValue { return resolve(caller, "value(\(value))") }
            return flight!.waiters.append(caller)
        }
        startFlight(operation, waiters: [caller])
    }

    mutating func refresh(caller: Int, _ operation: Operation) {
        wantsValue[caller] = false
        startFlight(operation, waiters: (flight?.waiters ?? []) + [caller], patient: [caller])
    }

    /// `retry(_:)`: the state keeps no operation, so it runs the one it is given.
    mutating func retry(caller: Int, _ operation: Operation) {
        wantsValue[caller] = false
        guard flight == nil, phase == "failure" || phase == "empty" else {
            return resolve(caller, "done")
        }
        startFlight(operation, waiters: [caller], patient: [caller])
    }

    mutating func write(_ newValue: Int, lifetime: Duration?) {
        endFlight(resolvingWith: "value(\(newValue))")
        value = newValue
        self.lifetime = lifetime
        phase = newValue == 0 ? "empty" : "success"
        successAt = newValue == 0 ? nil : now
        freshSince = now
        receivedAt = now
    }

    mutating func invalidate() {
        freshSince = nil
        flight?.landsExpired = true
    }

    mutating func cancel() {
        guard let ended = flight else { return }
        endFlight(resolvingWith: "cancelled")
        restorePhase(of: ended)
    }

    mutating func reset() {
        endFlight(resolvingWith: "cancelled")
        value = Self.initialValue
        phase = "initial"
        successAt = nil
        freshSince = nil
        receivedAt = nil
    }

    mutating func cancelCaller(_ caller: Int) {
        guard var current = flight, let index = current.waiters.firstIndex(of: caller) else { return }
        current.waiters.remove(at: index)
        current.patient.remove(caller)
        resolve(caller, "cancelled")
        if current.waiters.isEmpty, !current.isPastSoftTimeout {
            flight = nil
            restorePhase(of: current)
        } else {
            flight = current
        }
    }

    mutating func advance(by duration: Duration) {
        let target = now + duration
        // The soft timeout first, if it passes before the flight ends (the model's instants never tie).
        if let softAt = flight?.softAt, softAt <= target, softAt < flight!.ends {
            now = softAt
            flight!.softAt = nil
            flight!.isPastSoftTimeout = true
            if let value = softTimeoutValue {
                let patient = flight!.patient
                let readers = flight!.waiters.filter { !patient.contains($0) }
                flight!.waiters.removeAll { !patient.contains($0) }
                for reader in readers { resolve(reader, "value(\(value))") }
            }
        }
        if let current = flight, current.ends <= target {
            now = current.ends
            flight = nil
            if current.operation.fails {
                phase = "failure"
                successAt = nil
                freshSince = nil
                let answered = maxStaleAge.flatMap { maxAge in receivedAt.map { now - $0 < maxAge } } ?? false
                for waiter in current.waiters { resolve(waiter, answered ? "value(\(value))" : "failed") }
            } else if current.operation.notModified, receivedAt == nil {
                // Nothing to keep: the fetch fails (`notModifiedWithoutValue`), with no value for
                // fail-safe either.
                phase = "failure"
                successAt = nil
                freshSince = nil
                for waiter in current.waiters { resolve(waiter, "failed") }
            } else {
                // "Not modified" keeps the value (and so its lifetime), renewed as a success would be.
                if !current.operation.notModified {
                    value = current.operation.result
                    lifetime = current.operation.lifetime
                }
                phase = value == 0 ? "empty" : "success"
                successAt = value == 0 ? nil : now
                freshSince = current.landsExpired ? nil : now
                receivedAt = now
                for waiter in current.waiters { resolve(waiter, "value(\(value))") }
            }
        }
        now = target
    }
}

@Suite struct RandomizedModelTests {
    static let expiry = Duration.seconds(4)

    /// Runs one random sequence of `steps` steps; returns a failure report, or nil.
    static func runSequence(seed: UInt64, steps: Int) async -> String? {
        var random = SplitMix64(seed: seed)
        let clock = VirtualClock()
        // Fail-safe in a third of the sequences, with a maximum stale age shorter than or beyond the
        // expiry.
        let maxStaleAge: Duration? = [nil, nil, .seconds(2), .seconds(6)][Int(random.next() % 4)]
        // A soft timeout in half of them: never at an instant a flight can end (those are 500 ms
        // apart), where the model could not tell which comes first.
        let softTimeout: Duration? = [nil, nil, .milliseconds(750), .milliseconds(1_250)][Int(random.next() % 4)]
        // Values that say their own lifetime in half of them: none, never fresh, shorter or longer
        // than the expiry, on the grid of the steps (freshness is compared when read, so a tie is
        // decided by the same strict test in both).
        let lifetimes: [Duration?] =
            random.next() % 2 == 0 ? [nil] : [nil, .zero, .milliseconds(-1), .milliseconds(1_500), .seconds(7)]
        let state = AsyncState<ReferenceModel.Leased>(
            wrappedValue: ReferenceModel.Leased(n: ReferenceModel.initialValue, lifetime: nil), expiry: expiry,
            clock: clock, softTimeout: softTimeout, maxStaleAge: maxStaleAge, isEmpty: { $0.n == 0 })
        let running = LockedValue(0)
        let outcomes = LockedValue([Int: String]())
        var tasks: [Int: Task<Void, any Error>] = [:]
        var model = ReferenceModel(expiry: expiry, maxStaleAge: maxStaleAge, softTimeout: softTimeout)
        var log: [String] = []

        func makeOperation(conditional: Bool = false) -> (
            ReferenceModel.Operation, @Sendable () async throws -> ReferenceModel.Leased
        ) {
            let spec = ReferenceModel.Operation(
                result: Int(random.next() % 6), fails: random.next() % 4 == 0,
                duration: .milliseconds(500 * Int64(1 + random.next() % 4)),
                lifetime: lifetimes[Int(random.next() % UInt64(lifetimes.count))],
                notModified: conditional && random.next() % 3 == 0)
            return (
                spec,
                {
                    running.withLock { $0 += 1 }
                    defer { running.withLock { $0 -= 1 } }
                    try await clock.sleep(for: spec.duration)
                    if spec.fails { throw SourceDown() }
                    return ReferenceModel.Leased(n: spec.result, lifetime: spec.lifetime)
                }
            )
        }
        /// `spec`'s operation as a conditional one that answers "not modified" (given a value or not:
        /// the state fails it without one), through the public overloads.
        func notModified(_ spec: ReferenceModel.Operation) -> AsyncState<ReferenceModel.Leased>.ConditionalOperation {
            { _ in
                running.withLock { $0 += 1 }
                defer { running.withLock { $0 -= 1 } }
                try await clock.sleep(for: spec.duration)
                if spec.fails { throw SourceDown() }
                return .notModified
            }
        }
        func record(_ caller: Int, _ body: @escaping @Sendable () async throws -> String) {
            tasks[caller] = clock.task {
                let outcome: String
                do { outcome = try await body() } catch is CancellationError { outcome = "cancelled" } catch {
                    outcome = "failed"
                }
                outcomes.withLock { $0[caller] = outcome }
            }
        }

        for step in 0..<steps {
            let caller = step
            switch random.next() % 10 {
            case 0, 1:
                let (spec, operation) = makeOperation(conditional: true)
                log.append(
                    "value(\(spec.notModified ? "304" : "\(spec.result)")\(spec.fails ? "!" : "") \(spec.duration)"
                        + " \(String(describing: spec.lifetime)))")
                if spec.notModified {
                    let conditional = notModified(spec)
                    record(caller) { "value(\(try await state.value(revalidating: conditional).n))" }
                } else {
                    record(caller) { "value(\(try await state.value(operation).n))" }
                }
                model.value(caller: caller, spec)
            case 2:
                let (spec, operation) = makeOperation(conditional: true)
                log.append(
                    "refresh(\(spec.notModified ? "304" : "\(spec.result)")\(spec.fails ? "!" : "") \(spec.duration))")
                let conditional = notModified(spec)
                record(caller) {
                    if spec.notModified {
                        await state.refresh(revalidating: conditional)
                    } else {
                        await state.refresh(operation)
                    }
                    return "done"
                }
                model.refresh(caller: caller, spec)
            case 3:
                let (spec, operation) = makeOperation()
                log.append("retry(\(spec.result)\(spec.fails ? "!" : "") \(spec.duration))")
                record(caller) {
                    await state.retry(operation)
                    return "done"
                }
                model.retry(caller: caller, spec)
            case 4:
                let newValue = Int(random.next() % 3)
                let lifetime = lifetimes[Int(random.next() % UInt64(lifetimes.count))]
                log.append("set(\(newValue) \(String(describing: lifetime)))")
                await state.set(ReferenceModel.Leased(n: newValue, lifetime: lifetime))
                model.write(newValue, lifetime: lifetime)
            case 5:
                log.append("invalidate")
                await state.invalidate()
                model.invalidate()
            case 6:
                log.append(random.next() % 3 == 0 ? "reset" : "cancel")
                if log.last == "reset" {
                    await state.reset()
                    model.reset()
                } else {
                    await state.cancel()
                    model.cancel()
                }
            case 7:
                let waiting = model.flight?.waiters ?? []
                guard !waiting.isEmpty else { continue }
                let victim = waiting[Int(random.next() % UInt64(waiting.count))]
                log.append("cancelCaller(\(victim))")
                tasks[victim]?.cancel()
                model.cancelCaller(victim)
            default:
                let duration = Duration.milliseconds(250 * Int64(random.next() % 9))
                log.append("advance(\(duration))")
                await clock.advance(by: duration)
                model.advance(by: duration)
            }
            await clock.settle()

            var problems: [String] = []
            if state.phase.name != model.phase { problems.append("phase \(state.phase.name) ≠ \(model.phase)") }
            if state.wrappedValue.n != model.value { problems.append("value \(state.wrappedValue.n) ≠ \(model.value)") }
            if state.snapshot.isExpired == model.isFresh { problems.append("fresh ≠ \(model.isFresh)") }
            if state.hasExpired(in: expiry) == model.isYounger(than: expiry) {
                problems.append("younger than the expiry ≠ \(model.isYounger(than: expiry))")
            }
            let expectedDate =
                model.phase == "success"
                ? model.successAt.map { Date(timeIntervalSinceReferenceDate: Double($0 / .milliseconds(1)) / 1_000) }
                : nil
            if state.phase.lastUpdated != expectedDate {
                problems.append(
                    "date \(String(describing: state.phase.lastUpdated)) ≠ \(String(describing: expectedDate))")
            }
            let inFlight = running.withLock { $0 }
            if inFlight != (model.flight == nil ? 0 : 1) { problems.append("operations running: \(inFlight)") }
            let seen = outcomes.withLock { $0 }
            if seen != model.outcomes {
                problems.append(
                    "callers \(seen.sorted { $0.key < $1.key }) ≠ \(model.outcomes.sorted { $0.key < $1.key })")
            }
            if !problems.isEmpty {
                for task in tasks.values { task.cancel() }
                await state.cancel()
                return
                    "seed \(seed), after step \(step) [\(log.joined(separator: ", "))]: \(problems.joined(separator: "; "))"
            }
        }
        // No caller is left hanging: every flight ends within its longest duration.
        await clock.advance(by: .seconds(10))
        model.advance(by: .seconds(10))
        let unresolved = Set(tasks.keys).subtracting(outcomes.withLock { $0 }.keys)
        guard unresolved.isEmpty else { return "seed \(seed): callers never resolved: \(unresolved.sorted())" }
        guard clock.pendingSleepers == 0 else { return "seed \(seed): sleepers left: \(clock.pendingSleepers)" }
        guard state.store.waiterCount == 0 else {
            return "seed \(seed): waiter slots left: \(state.store.waiterCount)"
        }
        return nil
    }

    @Test func randomSequencesAgreeWithTheReferenceModel() async {
        await expectEverySeedHolds(from: 20_261_122, count: 2_000) { seed in
            await Self.runSequence(seed: seed, steps: 24)
        }
    }
}
