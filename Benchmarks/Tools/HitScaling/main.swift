// Hits from 1, 2, … concurrent tasks (up to the machine's core count), and how the throughput scales:
// the measurement behind "reads that scale with cores". Each task makes `hits` hits (5,000,000
// unless a second argument says otherwise); the figure is all the tasks' hits over the time from
// the first task's start to the last one's end, the best of `runs` runs (3 unless a third argument
// says otherwise). Run:
//   swift run --package-path Benchmarks -c release HitScaling            # every row
//   swift run --package-path Benchmarks -c release HitScaling state      # one row (mutex, state, state-per-task, family-1k, family-1k-per-task, family-1m)
// Compare two builds of the library by running each one's binary in alternation: a shared machine's
// figures move by more than a difference within one build.
import AsyncStateKit
import Foundation
import Synchronization

let rows = ["mutex", "state", "state-per-task", "family-1k", "family-1k-per-task", "family-1m"]
let only = CommandLine.arguments.dropFirst().first.flatMap { $0 == "all" ? nil : $0 }
let hits = CommandLine.arguments.dropFirst(2).first.flatMap(Int.init) ?? 5_000_000
let runs = CommandLine.arguments.dropFirst(3).first.flatMap(Int.init) ?? 3
/// The task counts measured: 1, 2, 4, … up to the cores this process may run on.
let cores = ProcessInfo.processInfo.activeProcessorCount
let taskCounts = Array(sequence(first: 1) { $0 * 2 }.prefix { $0 <= max(cores, 2) })

/// The hits of one row with `tasks` concurrent tasks: the hits per second of all of them together.
func measure(_ row: String, tasks: Int) async throws -> Double {
    // Every row's subject is made (and filled) before the clock starts.
    let subject = try await Subject(row, tasks: tasks)
    let start = ContinuousClock.now
    let checksum = try await withThrowingTaskGroup(of: Int.self) { group in
        for task in 0..<tasks { group.addTask { try await subject.hit(task: task) } }
        return try await group.reduce(0, &+)
    }
    let elapsed = ContinuousClock.now - start
    precondition(checksum != 42, "unreachable: keeps the hits")
    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    return Double(tasks * hits) / seconds
}

/// What a row hits.
final class Subject: Sendable {
    let row: String
    let mutex = Mutex(1)
    let states: [AsyncState<Int>]
    let families: [AsyncStateFamily<Int, Int>]
    /// The keys each task visits, in a scattered order (a stride prime to the count).
    let order: [Int]

    init(_ row: String, tasks: Int) async throws {
        self.row = row
        let stateCount = row == "state-per-task" ? tasks : row == "state" ? 1 : 0
        states = (0..<stateCount).map { _ in AsyncState<Int>(wrappedValue: 0, expiry: .seconds(3_600)) }
        for state in states { _ = try await state.value { 1 } }
        let keys = row == "family-1m" ? 1_000_000 : 1_000
        let familyCount = row == "family-1k-per-task" ? tasks : row.hasPrefix("family") ? 1 : 0
        families = (0..<familyCount).map { _ in
            let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
            for key in 0..<keys { family.set(key, for: key) }
            return family
        }
        var order: [Int] = []
        var key = 0
        for _ in 0..<keys {
            key = (key &+ 7_919) % keys
            order.append(key)
        }
        self.order = order
    }

    func hit(task: Int) async throws -> Int {
        var sum = 0
        switch row {
        case "mutex":
            for _ in 0..<hits { sum &+= mutex.withLock { $0 } }
        case "state", "state-per-task":
            let state = states[row == "state" ? 0 : task]
            for _ in 0..<hits { sum &+= try await state.value { 1 } }
        default:
            let family = families[row == "family-1k-per-task" ? task : 0]
            // Each task starts at its own place in the order, so that two tasks do not walk in step.
            var index = (order.count / max(1, task + 1)) % order.count
            for _ in 0..<hits {
                sum &+= try await family.value(for: order[index]) { $0 }
                index += 1
                if index == order.count { index = 0 }
            }
        }
        return sum
    }
}

func run() async throws {
    let selected = only.map { [$0] } ?? rows
    guard selected.allSatisfy(rows.contains), hits > 0, runs > 0 else {
        print("usage: HitScaling [all|\(rows.joined(separator: "|"))] [hits per task] [runs]")
        return
    }
    print("\(cores) cores; \(hits) hits per task; the best of \(runs) runs; millions of hits a second")
    print("row".padding(toLength: 20, withPad: " ", startingAt: 0), terminator: "")
    for tasks in taskCounts { print("  \(tasks) task\(tasks == 1 ? " " : "s")", terminator: "") }
    print("  scaling (\(taskCounts.last!) over 1)")
    for row in selected {
        // The task counts take turns run after run, so that a slow spell of this shared machine
        // falls on all of them rather than on one.
        var best = [Double](repeating: 0, count: taskCounts.count)
        for _ in 0..<runs {
            for (index, tasks) in taskCounts.enumerated() {
                best[index] = max(best[index], try await measure(row, tasks: tasks))
            }
        }
        print(row.padding(toLength: 20, withPad: " ", startingAt: 0), terminator: "")
        for figure in best {
            print(
                String(repeating: " ", count: max(0, 9 - format(figure / 1e6).count)) + format(figure / 1e6),
                terminator: "")
        }
        print("  \(format(best.last! / best.first!))×")
    }
}

func format(_ value: Double) -> String {
    let scaled = (value * 100).rounded() / 100
    return "\(scaled)"
}

try await run()
