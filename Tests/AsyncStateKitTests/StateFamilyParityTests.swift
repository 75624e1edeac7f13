import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// The README's promise, checked side by side: a family's key has exactly the behaviour of an
/// `@AsyncState` declared with the same arguments. The same seeded random script of calls runs on a
/// state, on a one-key family whose entry rests between uses (compact), and on a one-key family whose
/// entry an `updates(for:)` subscriber keeps live; after every step their snapshots, the callers'
/// answers, the source's calls and the observer's events must agree, and so must what the state's
/// and the live entry's `updates` streams delivered.
@Suite struct StateFamilyParityTests {
    /// What one subject has done so far, in a form the three can be compared in.
    final class Record: AsyncStateObserver {
        private let state = LockedValue((events: [String](), answers: [Int: String](), calls: 0, updates: [String]()))

        var events: [String] { state.withLock { $0.events } }
        var answers: [Int: String] { state.withLock { $0.answers } }
        var calls: Int { state.withLock { $0.calls } }
        var updates: [String] { state.withLock { $0.updates } }

        func observe(_ event: AsyncStateEvent) {
            // A family also reports a value replaced by `set` as a removal: a family's own event.
            if case .removed = event.kind { return }
            state.withLock { $0.events.append("\(event.kind)") }
        }
        func answer(_ caller: Int, _ answer: String) { state.withLock { $0.answers[caller] = answer } }
        func called() { state.withLock { $0.calls += 1 } }
        func updated(_ snapshot: String) { state.withLock { $0.updates.append(snapshot) } }
    }

    /// A snapshot as the three subjects can be compared: the family's `Value?` and the state's
    /// initial value both become "no value".
    static func describe<Value>(_ snapshot: AsyncSnapshot<Value>?, _ value: (Value) -> Int?) -> String {
        guard let snapshot else { return "no entry" }
        let shown = snapshot.hasValue ? value(snapshot.value).map(String.init) ?? "nil" : "-"
        let error = snapshot.lastError.map { "\(type(of: $0))" } ?? "-"
        return
            "\(snapshot.phase.name)@\(snapshot.phase.lastUpdated.map { "\($0.timeIntervalSinceReferenceDate)" } ?? "-")"
            + " value \(shown) expired \(snapshot.isExpired) failures \(snapshot.failureCount) error \(error)"
            + " lastSuccess \(snapshot.lastSuccess.map { "\($0.timeIntervalSinceReferenceDate)" } ?? "-")"
            + " successes \(snapshot.successCount)"
    }

    /// What `body` returned or threw.
    static func capture(_ body: () async throws -> Int) async -> Result<Int, any Error> {
        do { return .success(try await body()) } catch { return .failure(error) }
    }

    static func describe(_ result: Result<Int, any Error>) -> String {
        switch result {
        case .success(let value): "value \(value)"
        case .failure(let error): "\(type(of: error))"
        }
    }

    /// Runs one seeded script; returns what differed, or `nil`.
    static func runScript(seed: UInt64, steps: Int) async -> String? {
        var random = SplitMix64(seed: seed)
        func pick(_ count: UInt64) -> Int { Int(random.next() % count) }
        let clock = VirtualClock()
        let policies = RandomPolicies(&random)
        let isEmpty: @Sendable (Int) -> Bool = { $0 == 0 }

        let records = (state: Record(), resting: Record(), live: Record())
        let state = AsyncState<Int>(
            wrappedValue: -1, expiry: .seconds(2), clock: clock, retry: policies.retry, timeout: policies.timeout,
            softTimeout: policies.softTimeout,
            failureExpiry: policies.failureExpiry, staleWhileRevalidate: policies.staleWhileRevalidate,
            refreshAfter: policies.refreshAfter, maxStaleAge: policies.maxStaleAge, isEmpty: isEmpty,
            observer: records.state)
        func family(_ record: Record) -> AsyncStateFamily<Int, Int> {
            AsyncStateFamily(
                expiry: .seconds(2), clock: clock, retry: policies.retry, timeout: policies.timeout,
                softTimeout: policies.softTimeout,
                failureExpiry: policies.failureExpiry, staleWhileRevalidate: policies.staleWhileRevalidate,
                refreshAfter: policies.refreshAfter, maxStaleAge: policies.maxStaleAge, isEmpty: isEmpty,
                observer: record)
        }
        let (resting, live) = (family(records.resting), family(records.live))
        let key = 7
        // The state's and the live entry's streams, collected as they deliver.
        let stateUpdates = state.updates
        let liveUpdates = live.updates(for: key)
        let collectors = [
            clock.task { for await snapshot in stateUpdates { records.state.updated(describe(snapshot) { $0 }) } },
            clock.task { for await snapshot in liveUpdates { records.live.updated(describe(snapshot) { $0 }) } },
        ]
        defer { for collector in collectors { collector.cancel() } }

        var callers: [[Task<Void, any Error>]] = [[], [], []]
        var log: [String] = []
        // A warm start, sometimes: the same archive into each (a family's restored entry rests).
        let restores = pick(3) == 0
        if restores {
            let archive = AsyncStateArchive(value: 5, phase: pick(2) == 0 ? .success : .empty, lastSuccess: nil)
            log.append("restore(\(archive.phase))")
            _ = try? await state.restore(archive)
            _ = try? resting.restore([key: archive])
            _ = try? live.restore([key: archive])
        }
        for step in 0..<steps {
            let result = pick(4)
            let fails = pick(4) == 0
            let duration = Duration.milliseconds(500 * Int64(pick(5)))
            func operation(_ record: Record) -> @Sendable () async throws -> Int {
                {
                    record.called()
                    try await clock.sleep(for: duration)
                    if fails { throw SourceDown() }
                    return result
                }
            }
            // The first step makes the family's entry if nothing did (a family without an entry for
            // the key ignores `invalidate`, where a state reports it).
            let action = step == 0 && !restores ? 0 : pick(13)
            let caller = callers[0].count
            /// Runs `state` on the state and `family` on each family, as caller number `caller`,
            /// recording their answers.
            func launch(
                _ state:
                    @escaping @Sendable (@escaping @Sendable () async throws -> Int) async -> Result<Int, any Error>,
                _ family:
                    @escaping @Sendable (
                        AsyncStateFamily<Int, Int>, @escaping @Sendable (Int) async throws -> Int
                    ) async -> Result<Int, any Error>
            ) {
                let stateOperation = operation(records.state)
                callers[0].append(clock.task { records.state.answer(caller, describe(await state(stateOperation))) })
                for (index, (subject, record)) in [(resting, records.resting), (live, records.live)].enumerated() {
                    let keyed = operation(record)
                    callers[index + 1].append(
                        clock.task { record.answer(caller, describe(await family(subject) { _ in try await keyed() })) }
                    )
                }
            }
            let spec = "\(result)\(fails ? "!" : "") \(duration)"
            switch action {
            case 0, 1, 2:
                log.append("value(\(spec))")
                launch(
                    { op in await capture { try await state.value(op) } },
                    { f, op in await capture { try await f.value(for: key, op) } })
            case 3, 4, 5:
                // Calls that return once settled, without a value: `fetch`, `refresh`, `retry`.
                let name = ["fetch", "refresh", "retry"][action - 3]
                log.append("\(name)(\(spec))")
                launch(
                    { op in
                        switch action {
                        case 3: await state.fetch(op)
                        case 4: await state.refresh(op)
                        default: await state.retry(op)
                        }
                        return .success(0)
                    },
                    { f, op in
                        switch action {
                        case 3: await f.fetch(for: key, op)
                        case 4: await f.refresh(for: key, op)
                        default: await f.retry(for: key, op)
                        }
                        return .success(0)
                    })
            case 6:
                log.append("snapshot(\(spec))")
                launch(
                    { op in await capture { try await state.snapshot(op).previousValue ?? -100 } },
                    { f, op in await capture { try await f.snapshot(for: key, op).previousValue.flatMap { $0 } ?? -100 }
                    })
            case 7:
                log.append("set(\(result))")
                await state.set(result)
                resting.set(result, for: key)
                live.set(result, for: key)
            case 8:
                log.append("invalidate")
                await state.invalidate()
                resting.invalidate(key)
                live.invalidate(key)
            case 9:
                log.append("cancel")
                await state.cancel()
                resting.cancel(key)
                live.cancel(key)
            case 10:
                guard caller > 0 else { continue }
                let victim = pick(UInt64(caller))
                log.append("cancelCaller(\(victim))")
                for subject in callers { subject[victim].cancel() }
            default:
                log.append("advance(\(duration))")
                await clock.advance(by: duration)
            }
            await clock.advance(by: .zero)

            func archived(_ archive: AsyncStateArchive<Int>?) -> String {
                archive.map { "archive \($0.value) \($0.phase) \(String(describing: $0.lastSuccess))" } ?? "no archive"
            }
            let snapshots = [
                describe(state.snapshot) { $0 } + archived(state.archive),
                describe(resting.snapshot(for: key)) { $0 } + archived(resting.archive[key]),
                describe(live.snapshot(for: key)) { $0 } + archived(live.archive[key]),
            ]
            let all = [records.state, records.resting, records.live]
            var differences: [String] = []
            if Set(snapshots).count > 1 { differences.append("snapshots \(snapshots)") }
            if Set(all.map(\.answers)).count > 1 { differences.append("answers \(all.map(\.answers))") }
            if Set(all.map(\.calls)).count > 1 { differences.append("source calls \(all.map(\.calls))") }
            if Set(all.map(\.events)).count > 1 { differences.append("events \(all.map(\.events))") }
            if records.state.updates != records.live.updates {
                differences.append("updates \(records.state.updates) ≠ \(records.live.updates)")
            }
            if !differences.isEmpty {
                for subject in callers { for task in subject { task.cancel() } }
                await clock.advance(by: .seconds(30))
                return "seed \(seed) (\(policies)), after [\(log.joined(separator: ", "))]: "
                    + differences.joined(separator: "; ")
            }
        }
        for subject in callers { for task in subject { task.cancel() } }
        await clock.advance(by: .seconds(30))
        return nil
    }

    @Test func aKeyOfAFamilyBehavesAsAStateAtRestAndLive() async {
        await expectEverySeedHolds(from: 20_261_125, count: 300) { seed in await Self.runScript(seed: seed, steps: 30) }
    }
}
