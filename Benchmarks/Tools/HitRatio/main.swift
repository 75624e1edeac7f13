// Hit ratio of a family's eviction policy against an exact LRU of the same capacity, replayed in the
// same process: on the real traces in ../shared/cache-traces and on synthetic traces generated here
// with a fixed seed. Every request goes through the public API, `value(for:)` on a family with a long
// expiry (a miss is an operation call). Run:
//   swift run --package-path Benchmarks -c release HitRatio [requests] [part of a trace's name] [--seeds N] [--tasks N]
// for example `HitRatio web07` or `HitRatio 10000000 scans` (the default: 2,000,000 synthetic
// requests, every trace, 3 seeds, one task). `--tasks 2` replays each trace from two concurrent tasks:
// what the policy loses when contended shards note their hits in per-processor buffers.
//
// Deterministic from run to run: the tool runs itself with SWIFT_DETERMINISTIC_HASHING=1, so keys hash
// alike in every run, and each family figure is the average over `--seeds` renamings of the keys
// (each key XOR a seed: the same trace, hashed differently), so that no figure is one lucky hashing.
import AsyncStateKit
import Foundation
import Synchronization

// Hashing seeded per process would move a cell by up to half a point between runs.
if ProcessInfo.processInfo.environment["SWIFT_DETERMINISTIC_HASHING"] == nil {
    setenv("SWIFT_DETERMINISTIC_HASHING", "1", 1)
    let arguments = CommandLine.arguments.map { strdup($0) } + [nil]
    execv("/proc/self/exe", arguments)
    print("cannot run again with SWIFT_DETERMINISTIC_HASHING=1: \(String(cString: strerror(errno)))")
    exit(1)
}

/// SplitMix64: a small seeded generator.
struct Random {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    mutating func unit() -> Double { Double(next() >> 11) / Double(1 << 53) }
}

/// Keys 0..<count drawn with probability ∝ 1 / (rank + 1)^exponent, by inverting the cumulative
/// distribution (a binary search), ranks shuffled so that popularity does not follow key order.
struct Zipf {
    let cumulative: [Double]
    let keys: [Int]

    init(count: Int, exponent: Double, random: inout Random) {
        var total = 0.0
        var cumulative: [Double] = []
        cumulative.reserveCapacity(count)
        for rank in 0..<count {
            total += 1 / pow(Double(rank + 1), exponent)
            cumulative.append(total)
        }
        self.cumulative = cumulative.map { $0 / total }
        var keys = Array(0..<count)
        for index in stride(from: count - 1, to: 0, by: -1) {
            keys.swapAt(index, Int(random.next() % UInt64(index + 1)))
        }
        self.keys = keys
    }

    func draw(_ random: inout Random) -> Int {
        let target = random.unit()
        var (low, high) = (0, cumulative.count - 1)
        while low < high {
            let middle = (low + high) / 2
            if cumulative[middle] < target { low = middle + 1 } else { high = middle }
        }
        return keys[low]
    }
}

/// An exact LRU of `capacity` keys: the baseline.
struct LRU {
    let capacity: Int
    var slots: [Int: Int] = [:]
    var keys: [Int] = []
    var newer: [Int] = []
    var older: [Int] = []
    var newest = -1
    var oldest = -1
    var free: [Int] = []

    init(capacity: Int) { self.capacity = capacity }

    /// A use of `key`: `true` for a hit.
    mutating func use(_ key: Int) -> Bool {
        if let slot = slots[key] {
            unlink(slot)
            linkAsNewest(slot)
            return true
        }
        if slots.count == capacity {
            let victim = oldest
            unlink(victim)
            slots[keys[victim]] = nil
            free.append(victim)
        }
        let slot: Int
        if let reused = free.popLast() {
            slot = reused
            keys[slot] = key
        } else {
            slot = keys.count
            keys.append(key)
            newer.append(-1)
            older.append(-1)
        }
        slots[key] = slot
        linkAsNewest(slot)
        return false
    }

    mutating func linkAsNewest(_ slot: Int) {
        older[slot] = newest
        newer[slot] = -1
        if newest != -1 { newer[newest] = slot }
        newest = slot
        if oldest == -1 { oldest = slot }
    }

    mutating func unlink(_ slot: Int) {
        if newer[slot] != -1 { older[newer[slot]] = older[slot] } else { newest = older[slot] }
        if older[slot] != -1 { newer[older[slot]] = newer[slot] } else { oldest = newer[slot] }
    }
}

/// An LFU that remembers every key's exact count of requests since the trace began (an unbounded
/// history, which no bounded cache has): on a miss, the key comes in if it has now been requested
/// more often than the least requested key held, which goes (on a tie the one held stays). Under the
/// independent reference model this is the best estimate of popularity that the requests seen so far
/// give: the ceiling for a policy that learns popularity from what it has seen, as W-TinyLFU does.
struct PerfectLFU {
    let capacity: Int
    var counts: [Int: Int] = [:]
    /// The keys held, by their count.
    var held: [Int: Set<Int>] = [:]
    var heldCount = 0
    var least = 0

    init(capacity: Int) { self.capacity = capacity }

    /// A use of `key`: `true` for a hit.
    mutating func use(_ key: Int) -> Bool {
        let count = counts[key, default: 0]
        counts[key] = count + 1
        if held[count]?.remove(key) != nil {
            held[count + 1, default: []].insert(key)
            if held[count]!.isEmpty {
                held[count] = nil
                if least == count { least = count + 1 }
            }
            return true
        }
        if heldCount == capacity {
            guard count + 1 > least else { return false }
            held[least]!.removeFirst()
            if held[least]!.isEmpty { held[least] = nil }
            heldCount -= 1
        }
        held[count + 1, default: []].insert(key)
        heldCount += 1
        least = heldCount == 1 ? count + 1 : min(least, count + 1)
        if held[least] == nil { least = held.keys.min()! }
        return false
    }
}

/// What a policy that knew each key's popularity would get on a trace drawn independently from `zipf`
/// (the independent reference model), the scans aside: it keeps the `capacity` most popular keys
/// (Aho, Denning and Ullman's A0, the best a policy that does not know the future can expect under
/// that model) and misses only on each one's first request. The ceiling for the other columns.
func optimalHits(_ requested: [Int], zipf: Zipf, capacity: Int) -> Int {
    var top = [Bool](repeating: false, count: zipf.keys.count)
    for rank in 0..<capacity { top[zipf.keys[rank]] = true }
    var seen = [Bool](repeating: false, count: zipf.keys.count)
    var hits = 0
    for key in requested where key < zipf.keys.count && top[key] {
        if seen[key] { hits += 1 } else { seen[key] = true }
    }
    return hits
}

/// A trace: `requests` keys.
func trace(exponent: Double, scans: Bool, keys: Int, requests: Int, seed: UInt64) -> (requests: [Int], zipf: Zipf) {
    var random = Random(state: seed)
    let zipf = Zipf(count: keys, exponent: exponent, random: &random)
    var trace: [Int] = []
    trace.reserveCapacity(requests)
    var nextScanKey = keys  // scanned keys are never requested again
    while trace.count < requests {
        // With scans: every 50,000 requests, 20,000 keys read once in a row (a batch job, a crawler).
        if scans, trace.count % 70_000 == 50_000 {
            for _ in 0..<20_000 where trace.count < requests {
                trace.append(nextScanKey)
                nextScanKey += 1
            }
            continue
        }
        trace.append(zipf.draw(&random))
    }
    return (trace, zipf)
}

/// The real traces in `../shared/cache-traces` (beside the repository's checkout): each request a
/// big-endian 32-bit key, xz-compressed (see that folder's SOURCES.md: cache2k's traces from
/// Caffeine's simulator, CC BY 4.0, © headissue GmbH, Jens Wilke).
let realTraces = ["web07", "web12", "orm-busy"]

/// The requests of real trace `name`, or `nil` (with a message) when it cannot be read.
func realTrace(_ name: String) -> [Int]? {
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()
    let file = root.deletingLastPathComponent().appendingPathComponent(
        "shared/cache-traces/caffeine-cache2k-\(name).trace.xz")
    let xz = Process()
    xz.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    xz.arguments = ["xz", "-dc", file.path]
    let pipe = Pipe()
    xz.standardOutput = pipe
    do { try xz.run() } catch {
        print("cannot run xz for \(file.path): \(error)")
        return nil
    }
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    xz.waitUntilExit()
    guard xz.terminationStatus == 0, data.count % 4 == 0 else {
        print("cannot read \(file.path) (xz exited \(xz.terminationStatus))")
        return nil
    }
    return data.withUnsafeBytes { bytes in
        stride(from: 0, to: bytes.count, by: 4).map { offset in
            Int(Int32(bigEndian: bytes.loadUnaligned(fromByteOffset: offset, as: Int32.self)))
        }
    }
}

/// Operation calls: a family's misses.
final class Loads: Sendable {
    let count = Atomic<Int>(0)
}

/// The hit ratio (%) of a family of `capacity` entries on `requested`, averaged over `seeds` renamings
/// of the keys, each request a `value(for:)` call.
///
/// With `tasks` over 1, that many tasks replay it at once, task `t` the requests whose index is `t`
/// modulo `tasks`, in order: contended shards spread, as on a server's cores, and their hits are noted
/// as a spread shard notes them. Not deterministic: the tasks' interleaving varies from run to run.
func familyHitRatio(_ requested: [Int], capacity: Int, seeds: Int, tasks: Int = 1) async -> Double {
    var total = 0.0
    for seed in 0..<seeds {
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(1_000_000_000), capacity: capacity)
        let loads = Loads()
        let salt = seed << 40
        @Sendable func replay(_ task: Int) async {
            for index in stride(from: task, to: requested.count, by: tasks) {
                _ = try? await family.value(for: requested[index] ^ salt, using: loads) { key, loads in
                    loads.count.add(1, ordering: .relaxed)
                    return key
                }
            }
        }
        if tasks == 1 {
            await replay(0)
        } else {
            await withTaskGroup(of: Void.self) { group in
                for task in 0..<tasks { group.addTask { await replay(task) } }
            }
        }
        let misses = loads.count.load(ordering: .relaxed)
        total += 100 * Double(requested.count - misses) / Double(requested.count)
    }
    return total / Double(seeds)
}

let keys = 1_000_000
var arguments = Array(CommandLine.arguments.dropFirst())
/// The positive count that follows `flag` in `arguments` (both taken out), or `fallback` without it.
func count(after flag: String, in arguments: inout [String], of what: String, or fallback: Int) -> Int {
    guard let index = arguments.firstIndex(of: flag) else { return fallback }
    guard index + 1 < arguments.count, let count = Int(arguments[index + 1]), count > 0 else {
        print("usage: \(flag) takes a number of \(what), more than 0")
        exit(1)
    }
    arguments.removeSubrange(index...index + 1)
    return count
}
let seeds = count(after: "--seeds", in: &arguments, of: "seeds", or: 3)
let tasks = count(after: "--tasks", in: &arguments, of: "concurrent tasks", or: 1)
let requests = arguments.lazy.compactMap { Int($0) }.first ?? 2_000_000
let only = arguments.first { Int($0) == nil }
let selectedRealTraces = realTraces.filter { name in only.map(name.contains) ?? true }
let traces = [
    ("Zipf 0.8", 0.8, false), ("Zipf 0.99", 0.99, false), ("Zipf 0.99 + scans", 0.99, true),
    // Almost only hits: a shard often meets more hits between two misses than its read buffer notes,
    // so the policy sees a sample of them.
    ("Zipf 1.5", 1.5, false),
].filter { trace in only.map(trace.0.contains) ?? true }
guard requests > 0, !traces.isEmpty || !selectedRealTraces.isEmpty else {
    print(
        "usage: HitRatio [requests, more than 0] [part of a trace's name: Zipf 0.8, Zipf 0.99, scans, Zipf 1.5,"
            + " web07, web12, orm-busy] [--seeds N] [--tasks N]")
    exit(1)
}

/// A hit ratio in tenths of a percent.
func percent(_ value: Double) -> String {
    let tenths = abs(Int((value * 10).rounded()))
    return "\(value < 0 ? "-" : "")\(tenths / 10).\(tenths % 10) %"
}

/// `text` padded with spaces to `width` characters.
func padded(_ text: String, _ width: Int) -> String { text + String(repeating: " ", count: max(0, width - text.count)) }

/// The hit ratio (%) of an exact LRU of `capacity` keys on `requested`.
func lruHitRatio(_ requested: [Int], capacity: Int) -> Double {
    var lru = LRU(capacity: capacity)
    var hits = 0
    for key in requested where lru.use(key) { hits += 1 }
    return 100 * Double(hits) / Double(requested.count)
}

print(
    "family: value(for:) on an AsyncStateFamily, the average of \(seeds) hashings of the keys"
        + (tasks > 1 ? ", replayed by \(tasks) concurrent tasks (not deterministic)" : ""))
if !selectedRealTraces.isEmpty {
    print("real traces (every request counted, capacity = 1 % and 10 % of the unique keys): family vs exact LRU")
    print("trace       capacity   family    LRU      difference")
    for name in selectedRealTraces {
        guard let requested = realTrace(name) else { continue }
        let unique = Set(requested).count
        for capacity in [unique / 100, unique / 10] {
            let ours = await familyHitRatio(requested, capacity: capacity, seeds: seeds, tasks: tasks)
            let theirs = lruHitRatio(requested, capacity: capacity)
            print(
                "\(padded(name, 12))\(padded("\(capacity)", 10)) \(percent(ours))   \(percent(theirs))   "
                    + "\(ours >= theirs ? "+" : "")\(percent(ours - theirs))"
            )
        }
    }
}
if traces.isEmpty { exit(0) }
print("hit ratio over \(requests) requests, keys drawn from \(keys) (seeded), family vs exact LRU")
print("trace                         capacity   family    LRU      difference   LFU, exact counts   bound (A0)")
for (name, exponent, scans) in traces {
    let (requested, zipf) = trace(exponent: exponent, scans: scans, keys: keys, requests: requests, seed: 42)
    for capacity in [keys / 100, keys / 10] {
        let ours = await familyHitRatio(requested, capacity: capacity, seeds: seeds, tasks: tasks)
        let theirs = lruHitRatio(requested, capacity: capacity)
        var lfu = PerfectLFU(capacity: capacity)
        var lfuHits = 0
        for key in requested where lfu.use(key) { lfuHits += 1 }
        let bound = 100 * Double(optimalHits(requested, zipf: zipf, capacity: capacity)) / Double(requests)
        print(
            "\(padded(name, 30))\(padded("\(capacity)", 10)) \(percent(ours))   \(percent(theirs))   "
                + "\(ours >= theirs ? "+" : "")\(percent(ours - theirs))"
                + "       \(percent(100 * Double(lfuHits) / Double(requests)))              \(percent(bound))"
        )
    }
}
