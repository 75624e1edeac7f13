// Hits in a plain loop, outside the benchmark harness: 10,000,000 of them in all, on each of `keys`
// keys in turn in a scattered order (a stride prime to the count), and the mean time of one. For
// profiling (`perf record` on it sees nothing but the hits once the fill is done) and for comparing
// two builds of the library in alternation, which the harness's bimodal medians on a shared machine
// make hard. Run:
//   swift run --package-path Benchmarks -c release HitLoop family 1000000   # a family's hit
//   swift run --package-path Benchmarks -c release HitLoop dictionary 1000000   # an actor dictionary with TTLs
//   swift run --package-path Benchmarks -c release HitLoop single   # one state's hit
//   swift run --package-path Benchmarks -c release HitLoop family-snapshot 1000   # a family's snapshot hit
//   swift run --package-path Benchmarks -c release HitLoop miss 10000   # a family's miss (a new key each time; the capacity)
//   swift run --package-path Benchmarks -c release HitLoop miss-actor   # a hand-written actor `[Key: Task]` cache's miss
//   swift run --package-path Benchmarks -c release HitLoop miss-fresh 10000   # misses as the harness makes them:
//       1,000 at a time into a new family (the capacity), its teardown included
//   swift run --package-path Benchmarks -c release HitLoop miss-actor-fresh   # the same with the actor cache
//   swift run --package-path Benchmarks -c release HitLoop miss-fresh-var 10000   # miss-fresh with the operation
//       in a `let` rather than a literal at the call
//   swift run --package-path Benchmarks -c release HitLoop miss-fresh-yield 10000   # miss-fresh, the operation
//       suspending once (`Task.yield()`), as a real source's does (miss-actor-fresh-yield: the actor cache)
//   swift run --package-path Benchmarks -c release HitLoop single-yield   # a state that refetches on every call
//   swift run --package-path Benchmarks -c release HitLoop raw-yield   # `Task.immediate` + yield + `value` alone
//   swift run --package-path Benchmarks -c release HitLoop raw-task   # `Task.immediate` + `value` alone
//   swift run --package-path Benchmarks -c release HitLoop single-refetch   # a state that refetches on every call,
//       its operation answering at once: a flight of the engine alone, with no family entry
//   swift run --package-path Benchmarks -c release HitLoop miss-floor 10000   # what no family miss can do without,
//       as miss-fresh makes them: a bare `Task.immediate` awaited, and its answer written into a new key's
//       compact entry (`set(_:for:)`, as set-fresh)
//   swift run --package-path Benchmarks -c release HitLoop set 1000   # `set(_:for:)` on keys that have a value
//   swift run --package-path Benchmarks -c release HitLoop set-fresh 1000   # `set(_:for:)` on new keys, 1,000 at a
//       time into a new family (as miss-fresh)
//   swift run --package-path Benchmarks -c release HitLoop refresh 1000 300000   # `refresh(for:)` of keys that have a value
// With DETACHED=1 in the environment the loop runs in a detached task, on the cooperative pool (as the
// harness's benchmarks do) rather than on the main thread.
import AsyncStateKit
import Foundation

let mode = CommandLine.arguments.dropFirst().first ?? "family"
let keys = CommandLine.arguments.dropFirst(2).first.flatMap(Int.init) ?? 1_000
/// How many misses the miss modes make (a third argument; fewer for a profiler's shorter run).
let misses = CommandLine.arguments.dropFirst(3).first.flatMap(Int.init) ?? 1_000_000

/// The shape of Hummingbird's `MemoryPersistDriver`: an actor's dictionary of values with their
/// expiry instants.
actor TTLDictionary {
    private var entries: [Int: (value: Int, expires: ContinuousClock.Instant)] = [:]

    func get(_ key: Int) -> Int? {
        guard let entry = entries[key], entry.expires > .now else { return nil }
        return entry.value
    }

    func set(_ key: Int, _ value: Int) { entries[key] = (value, .now + .seconds(3_600)) }
}

/// The cache most Swift developers write: an actor holding a task per key.
actor TaskCache {
    private var tasks: [Int: Task<Int, any Error>] = [:]

    func value(for key: Int, _ load: @escaping @Sendable () async throws -> Int) async throws -> Int {
        if let task = tasks[key] { return try await task.value }
        let task = Task { try await load() }
        tasks[key] = task
        return try await task.value
    }
}

func run() async throws {
    let modes = [
        "family", "family-snapshot", "dictionary", "single", "miss", "miss-actor", "miss-fresh", "miss-actor-fresh",
        "miss-fresh-yield", "miss-actor-fresh-yield", "single-yield", "raw-yield", "set", "set-fresh", "refresh",
        "miss-fresh-var", "miss-floor", "raw-task", "single-refetch",
    ]
    guard modes.contains(mode), keys > 0 else {
        print("usage: HitLoop \(modes.joined(separator: "|")) [keys] [misses]")
        return
    }
    var order: [Int] = []
    var key = 0
    for _ in 0..<keys {
        key = (key &+ 7_919) % keys
        order.append(key)
    }
    var rounds = max(1, 10_000_000 / keys)
    var sum = 0
    let start: ContinuousClock.Instant
    switch mode {
    case "single":
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(3_600))
        _ = try await state.value { 1 }
        start = .now
        for _ in 0..<rounds { for _ in order { sum &+= try await state.value { 1 } } }
    case "miss":
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
        (rounds, order) = (1, Array(0..<misses))
        start = .now
        for key in order { sum &+= try await family.value(for: key) { $0 } }
    case "miss-fresh":
        (rounds, order) = (misses / 1_000, Array(0..<1_000))
        start = .now
        for _ in 0..<rounds {
            let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
            for key in order { sum &+= try await family.value(for: key) { $0 } }
        }
    case "miss-fresh-var":
        (rounds, order) = (misses / 1_000, Array(0..<1_000))
        let operation: @Sendable (Int) async throws -> Int = { $0 }
        start = .now
        for _ in 0..<rounds {
            let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
            for key in order { sum &+= try await family.value(for: key, operation) }
        }
    case "miss-actor-fresh":
        (rounds, order) = (misses / 1_000, Array(0..<1_000))
        start = .now
        for _ in 0..<rounds {
            let cache = TaskCache()
            for key in order { sum &+= try await cache.value(for: key) { key } }
        }
    case "miss-fresh-yield":
        (rounds, order) = (misses / 1_000, Array(0..<1_000))
        start = .now
        for _ in 0..<rounds {
            let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
            for key in order {
                sum &+= try await family.value(for: key) { key in
                    await Task.yield()
                    return key
                }
            }
        }
    case "miss-actor-fresh-yield":
        (rounds, order) = (misses / 1_000, Array(0..<1_000))
        start = .now
        for _ in 0..<rounds {
            let cache = TaskCache()
            for key in order {
                sum &+= try await cache.value(for: key) {
                    await Task.yield()
                    return key
                }
            }
        }
    case "set":
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
        for key in 0..<keys { family.set(key, for: key) }
        start = .now
        for _ in 0..<rounds {
            for key in order {
                family.set(key, for: key)
                sum &+= key
            }
        }
    case "refresh":
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
        for key in 0..<keys { family.set(key, for: key) }
        rounds = max(1, misses / keys)
        start = .now
        for _ in 0..<rounds {
            for key in order {
                await family.refresh(for: key) { $0 }
                sum &+= key
            }
        }
    case "set-fresh":
        (rounds, order) = (misses / 1_000, Array(0..<1_000))
        start = .now
        for _ in 0..<rounds {
            let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
            for key in order {
                family.set(key, for: key)
                sum &+= key
            }
        }
    case "miss-floor":
        (rounds, order) = (misses / 1_000, Array(0..<1_000))
        start = .now
        for _ in 0..<rounds {
            let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
            for key in order {
                let task = Task.immediate { key }
                family.set(await task.value, for: key)
                sum &+= key
            }
        }
    case "single-refetch":
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .zero)
        (rounds, order) = (1, Array(0..<misses))
        start = .now
        for key in order { sum &+= try await state.value { key } }
    case "raw-task":
        (rounds, order) = (1, Array(0..<misses))
        start = .now
        for key in order {
            let task = Task.immediate { key }
            sum &+= await task.value
        }
    case "single-yield":
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .zero)
        (rounds, order) = (1, Array(0..<misses))
        start = .now
        for _ in order {
            sum &+= try await state.value {
                await Task.yield()
                return 1
            }
        }
    case "raw-yield":
        (rounds, order) = (1, Array(0..<misses))
        start = .now
        for key in order {
            let task = Task.immediate {
                await Task.yield()
                return key
            }
            sum &+= await task.value
        }
    case "miss-actor":
        let cache = TaskCache()
        (rounds, order) = (1, Array(0..<misses))
        start = .now
        for key in order { sum &+= try await cache.value(for: key) { key } }
    case "dictionary":
        let dictionary = TTLDictionary()
        for key in 0..<keys { await dictionary.set(key, key) }
        start = .now
        for _ in 0..<rounds { for key in order { sum &+= await dictionary.get(key) ?? 0 } }
    case "family-snapshot":
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
        for key in 0..<keys { family.set(key, for: key) }
        start = .now
        for _ in 0..<rounds {
            for key in order { sum &+= try await family.snapshot(for: key) { $0 }.value ?? 0 }
        }
    default:
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
        for key in 0..<keys { family.set(key, for: key) }
        start = .now
        for _ in 0..<rounds { for key in order { sum &+= try await family.value(for: key) { $0 } } }
    }
    let elapsed = ContinuousClock.now - start
    // The sum is printed so that the hits cannot be optimized away.
    print(
        "\(mode), \(keys) keys: \(elapsed / (rounds * order.count)) a \(mode.hasPrefix("miss") ? "miss" : ["family", "family-snapshot", "dictionary", "single"].contains(mode) ? "hit" : "call") (checksum \(sum))"
    )
}

if ProcessInfo.processInfo.environment["DETACHED"] != nil {
    try await Task.detached { try await run() }.value
} else {
    try await run()
}
