// Resident memory per idle state, and per idle entry of a family, measured in a fresh process (the
// benchmark process reuses pages freed by earlier benchmarks, which hides growth). Run:
//   swift run --package-path Benchmarks -c release MemoryPerState [count]           # AsyncState<Int>
//   swift run --package-path Benchmarks -c release MemoryPerState collection [count]  # AsyncState<[Int]>, empty
//   swift run --package-path Benchmarks -c release MemoryPerState family [count]    # family entries
//   swift run --package-path Benchmarks -c release MemoryPerState evicting [count]  # the same, after twice as many keys (evicting)
//   swift run --package-path Benchmarks -c release MemoryPerState empty [capacity]   # empty families
//   swift run --package-path Benchmarks -c release MemoryPerState tagged [count]    # family entries with one tag each
import AsyncStateKit
import Foundation

/// This process's resident set size, in bytes (Linux: /proc/self/statm).
func residentBytes() -> Int {
    guard let statm = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let pages = statm.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// Resident bytes per idle state of `count` made by `make` (from their index), each set once to the
/// value it holds. The caller's closure picks the initializer: a collection's, say, whose state
/// tests its values for emptiness.
nonisolated func measureStates<Value: Sendable>(count: Int, _ make: (Int) -> AsyncState<Value>) async -> Int {
    var states: [AsyncState<Value>] = []
    states.reserveCapacity(count)  // the array's own growth is not the states' cost
    let before = residentBytes()
    for index in 0..<count {
        let state = make(index)
        await state.set(state.wrappedValue)  // fetched once, then idle
        states.append(state)
    }
    let perState = (residentBytes() - before) / count
    withExtendedLifetime(states) {}
    return perState
}

/// Resident bytes per idle entry of an `AsyncStateFamily<Int, Int>` holding `count` entries (its
/// keys and values included: 16 bytes of them).
/// With `evicting`, twice as many keys are set, so that the family evicts half of them (and holds
/// what an evicting family holds besides its entries: the policy's history of evicted keys).
/// With `tagged`, each entry carries one tag of 100 (`tenant:0` to `tenant:99`, strings short enough
/// to need no allocation of their own): the cost of the tag index per entry.
nonisolated func measureFamily(count: Int, evicting: Bool = false, tagged: Bool = false) -> Int {
    let before = residentBytes()
    @Sendable func tenant(_ key: Int, _ value: Int) -> [String] { ["tenant:" + String(key % 100)] }
    let tags: (@Sendable (Int, Int) -> [String])? = tagged ? tenant : nil
    let family = AsyncStateFamily<Int, Int>(capacity: count, tags: tags)
    for key in 0..<(evicting ? 2 * count : count) { family.set(key, for: key) }  // set once, then idle
    let perEntry = (residentBytes() - before) / count
    withExtendedLifetime(family) {}
    return perEntry
}

/// Resident bytes per empty `AsyncStateFamily<Int, Int>` of `capacity` (1,000 of them, so that pages
/// resolve a few bytes). One capacity per process: pages freed by one would be reused by the next.
nonisolated func measureEmptyFamilies(capacity: Int) -> Int {
    var families: [AsyncStateFamily<Int, Int>] = []
    families.reserveCapacity(1_000)
    let before = residentBytes()
    for _ in 0..<1_000 { families.append(AsyncStateFamily<Int, Int>(capacity: capacity)) }
    let perFamily = (residentBytes() - before) / 1_000
    withExtendedLifetime(families) {}
    return perFamily
}

let arguments = CommandLine.arguments.dropFirst()
if arguments.first == "empty" {
    let capacity = arguments.dropFirst().first.flatMap(Int.init) ?? 1_000
    print("\(measureEmptyFamilies(capacity: capacity)) resident bytes per empty family of capacity \(capacity)")
} else if arguments.first == "family" || arguments.first == "evicting" || arguments.first == "tagged" {
    let count = arguments.dropFirst().first.flatMap(Int.init) ?? 1_000_000
    let evicting = arguments.first == "evicting"
    let tagged = arguments.first == "tagged"
    print(
        "\(measureFamily(count: count, evicting: evicting, tagged: tagged)) resident bytes per idle"
            + " AsyncStateFamily<Int, Int> entry (\(count) entries\(evicting ? ", after \(2 * count) keys" : "")"
            + "\(tagged ? ", one tag each" : ""))")
} else if arguments.first == "collection" {
    let count = arguments.dropFirst().first.flatMap(Int.init) ?? 100_000
    let perState = await measureStates(count: count) { _ in AsyncState<[Int]>(wrappedValue: []) }
    print("\(perState) resident bytes per idle AsyncState<[Int]> (\(count) states)")
} else {
    let count = arguments.first.flatMap(Int.init) ?? 100_000
    let perState = await measureStates(count: count) { AsyncState<Int>(wrappedValue: $0) }
    print("\(perState) resident bytes per idle AsyncState<Int> (\(count) states)")
}
