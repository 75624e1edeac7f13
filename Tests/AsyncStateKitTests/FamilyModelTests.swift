import AsyncStateTesting
import Testing

@testable import AsyncStateKit

/// A family must behave, key by key, as a dictionary of independent `AsyncState`s declared with the
/// same arguments: random sequences of calls on both, on one virtual clock, must leave the same
/// snapshots and give every caller the same outcome (compact entries, restores and shards included).
@Suite struct FamilyModelTests {
    /// A seeded generator (SplitMix64), so that a failing sequence can be replayed.
    struct Random {
        var state: UInt64
        mutating func next(_ bound: Int) -> Int {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return Int((z ^ (z >> 31)) % UInt64(bound))
        }
    }

    /// A source whose n-th call for a key (per system) is scripted: its duration and whether it fails
    /// come from the key and n alone, so both systems see the same answers at the same instants.
    final class Script: Sendable {
        let clock: VirtualClock
        private let calls = LockedValue<[Int: Int]>([:])
        init(clock: VirtualClock) { self.clock = clock }

        func load(_ key: Int) async throws -> Int {
            let call = calls.withLock { calls in
                calls[key, default: 0] += 1
                return calls[key]!
            }
            try await clock.sleep(for: .milliseconds(((key * 7 + call * 13) % 5) * 400))
            if (key + call) % 3 == 0 { throw SourceDown(code: call) }
            return key * 100 + call
        }
    }

    static func describe(_ snapshot: AsyncSnapshot<Int?>?) -> String {
        guard let snapshot else { return "absent" }
        return
            "\(snapshot.value.map(String.init) ?? "nil") \(snapshot.phase.name) expired=\(snapshot.isExpired) "
            + "failures=\(snapshot.failureCount) successes=\(snapshot.successCount) "
            + "error=\(snapshot.lastError.map { String(describing: $0) } ?? "none")"
    }

    @Test(arguments: [1, 2, 3, 4, 5, 6, 7, 8] as [UInt64])
    func aFamilyBehavesAsADictionaryOfStates(seed: UInt64) async throws {
        let clock = VirtualClock()
        let retry = RetryPolicy.exponential(maxAttempts: 2, initial: .milliseconds(300))
        let family = AsyncStateFamily<Int, Int>(
            expiry: .seconds(2), capacity: 100, clock: clock, retry: retry, failureExpiry: .seconds(1),
            refreshAfter: seed.isMultiple(of: 2) ? .seconds(1) : nil)
        let familySource = Script(clock: clock)
        let referenceSource = Script(clock: clock)
        let states = LockedValue<[Int: AsyncState<Int?>]>([:])
        func state(_ key: Int) -> AsyncState<Int?> {
            states.withLock { states in
                if let state = states[key] { return state }
                let state = AsyncState<Int?>(
                    wrappedValue: nil, expiry: .seconds(2), clock: clock, retry: retry, failureExpiry: .seconds(1),
                    refreshAfter: seed.isMultiple(of: 2) ? .seconds(1) : nil, isEmpty: { _ in false })
                states[key] = state
                return state
            }
        }
        var random = Random(state: seed)
        var outcomes: [(family: Task<String, any Error>, reference: Task<String, any Error>, step: String)] = []
        func describe(_ work: @escaping @Sendable () async throws -> Int?) -> Task<String, any Error> {
            clock.task {
                do { return "value \(try await work().map(String.init) ?? "nil")" } catch { return "threw \(error)" }
            }
        }

        for step in 0..<60 {
            let key = random.next(4)
            let name: String
            switch random.next(8) {
            case 0, 1:
                name = "value(\(key))"
                let reference = state(key)
                outcomes.append(
                    (
                        describe { try await family.value(for: key, familySource.load) },
                        describe { try await reference.value { try await referenceSource.load(key) } }, name
                    ))
            case 2:
                name = "fetch(\(key))"
                let reference = state(key)
                outcomes.append(
                    (
                        describe {
                            await family.fetch(for: key, familySource.load)
                            return nil
                        },
                        describe {
                            await reference.fetch { try await referenceSource.load(key) }
                            return nil
                        }, name
                    ))
            case 3:
                name = "refresh(\(key))"
                let reference = state(key)
                outcomes.append(
                    (
                        describe {
                            await family.refresh(for: key, familySource.load)
                            return nil
                        },
                        describe {
                            await reference.refresh { try await referenceSource.load(key) }
                            return nil
                        }, name
                    ))
            case 4:
                name = "set(\(key))"
                family.set(step, for: key)
                await state(key).set(step)
            case 5:
                name = "invalidate(\(key))"
                family.invalidate(key)
                await states.withLock { $0[key] }?.invalidate()
            case 6:
                name = "cancel(\(key))"
                family.cancel(key)
                await states.withLock { $0[key] }?.cancel()
            default:
                name = "advance"
            }
            await clock.advance(by: .milliseconds(random.next(4) * 250))
            for key in 0..<4 {
                let reference = states.withLock { $0[key] }
                #expect(
                    Self.describe(family.snapshot(for: key)) == Self.describe(reference?.snapshot),
                    "seed \(seed), step \(step) (\(name)), key \(key)")
            }
        }
        await clock.advance(by: .seconds(10))
        for (familyTask, referenceTask, step) in outcomes {
            #expect(try await familyTask.value == referenceTask.value, "seed \(seed), \(step)")
        }
    }
}
