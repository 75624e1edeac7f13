// The cold paths as a request handler meets them, outside the benchmark harness: every call is made
// from a detached task (a handler runs on the cooperative pool, not the main thread), and each of our
// measurements alternates with its baseline's in the same process, repetition after repetition, so
// that a shared machine's drift falls on both. Run:
//   swift run --package-path Benchmarks -c release ColdPaths miss [keys] [repetitions] [capacity]
//       a family's miss: `value(for:)` of `keys` (20,000) keys never seen before, awaited one after
//       another, against the usual keyed actor cache (`[Key: entry]` + `[Key: Task]`); a new family
//       and a new cache each repetition; the family's capacity defaults to the keys (no eviction)
//   swift run --package-path Benchmarks -c release ColdPaths stampede [callers] [repetitions]
//       `callers` (10,000) concurrent `value(_:)` calls on one cold state, against the same number on
//       one key of the same keyed actor cache, each in a task of its own
//   swift run --package-path Benchmarks -c release ColdPaths miss-suspending …
//       the miss with an operation that suspends once (`Task.yield()`), as a real source's does
// It prints each repetition's time per call for both, then the fastest and the median of each and
// their ratios. Allocation counts are the harness's (`Miss:`, `Cold:`), which counts every malloc.
import AsyncStateKit
import Foundation

let arguments = Array(CommandLine.arguments.dropFirst())
let mode = arguments.first ?? "miss"
let count = arguments.dropFirst().first.flatMap(Int.init) ?? (mode == "stampede" ? 10_000 : 20_000)
let repetitions = arguments.dropFirst(2).first.flatMap(Int.init) ?? 15
let capacity = arguments.dropFirst(3).first.flatMap(Int.init) ?? count

/// The keyed cache most Swift services write: an actor with the values it has and the loads in
/// flight, each load a task of its own.
actor KeyedActorCache {
    private var entries: [Int: (value: Int, loadedAt: ContinuousClock.Instant)] = [:]
    private var loads: [Int: Task<Int, any Error>] = [:]
    private let expiry: Duration

    init(expiry: Duration) { self.expiry = expiry }

    func value(for key: Int, _ load: @escaping @Sendable (Int) async throws -> Int) async throws -> Int {
        if let entry = entries[key], entry.loadedAt.duration(to: .now) < expiry { return entry.value }
        if let task = loads[key] { return try await task.value }
        let task = Task { try await load(key) }
        loads[key] = task
        defer { loads[key] = nil }
        let value = try await task.value
        entries[key] = (value, .now)
        return value
    }
}

/// Counts operation runs without a lock on the hot path's side (one increment a run).
final class Runs: @unchecked Sendable {
    // @unchecked: `count` is only written under `lock`, and read after every writer has finished
    // (the stampede's task group has returned).
    private let lock = NSLock()
    private var count = 0
    func increment() {
        lock.lock()
        count += 1
        lock.unlock()
    }
    var value: Int {
        lock.lock()
        defer { lock.unlock() }
        return count
    }
}

/// Times `body` and returns nanoseconds per call over `calls` calls.
func timed(calls: Int, _ body: () async throws -> Int) async rethrows -> (Double, Int) {
    let start = ContinuousClock.now
    let checksum = try await body()
    let elapsed = ContinuousClock.now - start
    let nanoseconds = Double(elapsed.components.seconds) * 1e9 + Double(elapsed.components.attoseconds) / 1e9
    return (nanoseconds / Double(calls), checksum)
}

func missOnce(suspending: Bool) async throws -> (ours: Double, baseline: Double) {
    // Each call's operation is a closure literal at the call, as a handler writes it (held in a
    // variable and passed on, it costs each cache a reabstraction thunk per call).
    func measure(_ call: (Int) async throws -> Int) async throws -> (Double, Int) {
        try await timed(calls: count) {
            var sum = 0
            for key in 0..<count { sum &+= try await call(key) }
            return sum
        }
    }
    let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: capacity)
    let cache = KeyedActorCache(expiry: .seconds(3_600))
    let ours: (Double, Int)
    let baseline: (Double, Int)
    if suspending {
        ours = try await measure { key in
            try await family.value(for: key) { key in
                await Task.yield()
                return key
            }
        }
        baseline = try await measure { key in
            try await cache.value(for: key) { key in
                await Task.yield()
                return key
            }
        }
    } else {
        ours = try await measure { key in try await family.value(for: key) { $0 } }
        baseline = try await measure { key in try await cache.value(for: key) { $0 } }
    }
    precondition(ours.1 == baseline.1, "the two caches answered differently")
    return (ours.0, baseline.0)
}

func stampedeOnce() async throws -> (ours: Double, baseline: Double) {
    let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(3_600))
    let runs = Runs()
    let (ours, total) = await timed(calls: count) {
        await withTaskGroup(of: Int.self) { group in
            for _ in 0..<count {
                group.addTask {
                    (try? await state.value {
                        runs.increment()
                        await Task.yield()
                        return 1
                    }) ?? 0
                }
            }
            return await group.reduce(0, +)
        }
    }
    precondition(runs.value == 1 && total == count, "\(runs.value) runs, \(total) answers")
    let cache = KeyedActorCache(expiry: .seconds(3_600))
    let (baseline, check) = await timed(calls: count) {
        await withTaskGroup(of: Int.self) { group in
            for _ in 0..<count {
                group.addTask {
                    (try? await cache.value(for: 0) { _ in
                        await Task.yield()
                        return 1
                    }) ?? 0
                }
            }
            return await group.reduce(0, +)
        }
    }
    precondition(check == count, "the actor cache answered \(check) of \(count)")
    return (ours, baseline)
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted.count % 2 == 1
        ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
}

func run() async throws {
    guard ["miss", "miss-suspending", "stampede"].contains(mode), count > 0, repetitions > 0, capacity > 0 else {
        print("usage: ColdPaths miss|miss-suspending|stampede [calls] [repetitions] [capacity]")
        exit(64)
    }
    var (ours, baseline): ([Double], [Double]) = ([], [])
    func once() async throws -> (ours: Double, baseline: Double) {
        mode == "stampede" ? try await stampedeOnce() : try await missOnce(suspending: mode == "miss-suspending")
    }
    // One repetition of each first, not counted: the first touches of the memory and code.
    _ = try await once()
    for repetition in 1...repetitions {
        let pair = try await once()
        ours.append(pair.ours)
        baseline.append(pair.baseline)
        print(
            String(
                format: "%2d  ours %8.0f ns  baseline %8.0f ns  %.2fx", repetition, pair.ours, pair.baseline,
                pair.ours / pair.baseline))
    }
    let what = mode == "stampede" ? "\(count) concurrent cold callers" : "\(mode), \(count) new keys"
    print(
        String(
            format: "%@: fastest %.0f / %.0f ns (%.2fx), median %.0f / %.0f ns (%.2fx) a call",
            what + (mode == "stampede" ? "" : ", capacity \(capacity)"),
            ours.min()!, baseline.min()!, ours.min()! / baseline.min()!, median(ours), median(baseline),
            median(ours) / median(baseline)))
}

try await Task.detached { try await run() }.value
