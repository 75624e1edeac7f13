// Resident memory per idle state, measured in a fresh process (the benchmark process reuses pages
// freed by earlier benchmarks, which hides growth). Run:
//   swift run --package-path Benchmarks -c release MemoryPerState [count]
import AsyncStateKit
import Foundation

/// This process's resident set size, in bytes (Linux: /proc/self/statm).
func residentBytes() -> Int {
    guard let statm = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let pages = statm.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}

nonisolated func measure(count: Int) async -> Int {
    var states: [AsyncState<Int>] = []
    states.reserveCapacity(count)  // the array's own growth is not the states' cost
    let before = residentBytes()
    for index in 0..<count {
        let state = AsyncState<Int>(wrappedValue: index)
        await state.set(index)  // fetched once, then idle
        states.append(state)
    }
    let perState = (residentBytes() - before) / count
    withExtendedLifetime(states) {}
    return perState
}

let count = CommandLine.arguments.dropFirst().first.flatMap(Int.init) ?? 100_000
print("\(await measure(count: count)) resident bytes per idle AsyncState<Int> (\(count) states)")
