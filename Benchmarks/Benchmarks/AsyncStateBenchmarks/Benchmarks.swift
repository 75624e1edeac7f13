// Each benchmark of the library is paired with a baseline measured in the same run; the README's
// table reports their ratio. Run: swift package --package-path Benchmarks benchmark
//
// Names have no spaces: package-benchmark 1.38.1 writes threshold files with spaces replaced by
// underscores but reads them by the raw name, so a name with spaces never finds its thresholds.
@_spi(Benchmarks) import AsyncStateKit
import AsyncStateTesting
import AsyncStateTracing
import Benchmark
import Clocks
import Foundation
import InMemoryTracing
import Synchronization

// MARK: Baselines

/// The smallest actor: one call is one hop.
actor TrivialActor {
    var value = 1
    func get() -> Int { value }
}

/// The cache most Swift developers write: an actor holding a task per key and when it finished.
actor HandWrittenCache<Key: Hashable & Sendable, Value: Sendable> {
    private struct Entry {
        var task: Task<Value, any Error>
        var fetchedAt: ContinuousClock.Instant?
    }

    private var entries: [Key: Entry] = [:]
    private let clock = ContinuousClock()
    private let expiry: Duration

    init(expiry: Duration) {
        self.expiry = expiry
    }

    func value(for key: Key, _ load: @escaping @Sendable () async throws -> Value) async throws -> Value {
        if let entry = entries[key] {
            guard let fetchedAt = entry.fetchedAt else { return try await entry.task.value }  // in flight
            if fetchedAt.duration(to: clock.now) < expiry { return try await entry.task.value }
        }
        let task = Task { try await load() }
        entries[key] = Entry(task: task, fetchedAt: nil)
        do {
            let value = try await task.value
            entries[key]?.fetchedAt = clock.now
            return value
        } catch {
            entries[key] = nil
            throw error
        }
    }
}

/// A hand-written single-flight cache that keeps the library's cancellation contract (DESIGN.md,
/// "Cancellation"): a caller whose task is cancelled stops waiting at once; the shared load goes on
/// while others wait and is cancelled when the last one leaves. `HandWrittenCache`'s callers instead
/// wait for the load's task whatever happens to them. It has no expiry, phases, eviction, retries or
/// observer: beside the two, it shows what the contract alone costs a miss (the `Miss:` benchmarks'
/// reference point, not their baseline).
final class CancellableCache<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    /// One load and its waiters.
    private final class Flight: @unchecked Sendable {
        // @unchecked: every stored property is read and written only under the cache's `state`
        // mutex (in `value(for:_:)`, its cancellation handler and `finish`), never elsewhere.
        var task: Task<Void, Never>?
        var waiting: [Int: UnsafeContinuation<Value, any Error>] = [:]
        /// Waiters cancelled before their continuation was registered.
        var left: Set<Int> = []
        /// Callers that have not left.
        var members = 0
        var result: Result<Value, any Error>?
    }

    private enum Entry {
        case loading(Flight)
        case loaded(Value)
    }

    private struct State {
        var entries: [Key: Entry] = [:]
        var lastWaiter = 0
    }

    private let state = Mutex(State())

    private enum Step {
        case hit(Value)
        case wait(Flight, Int, starts: Bool)
    }

    func value(for key: Key, _ load: @escaping @Sendable () async throws -> Value) async throws -> Value {
        let step = state.withLock { state -> Step in
            let flight: Flight
            let starts: Bool
            switch state.entries[key] {
            case .loaded(let value): return .hit(value)
            case .loading(let current): (flight, starts) = (current, false)
            case nil:
                (flight, starts) = (Flight(), true)
                state.entries[key] = .loading(flight)
            }
            state.lastWaiter += 1
            flight.members += 1
            return .wait(flight, state.lastWaiter, starts: starts)
        }
        let (flight, id, starts): (Flight, Int, Bool)
        switch step {
        case .hit(let value): return value
        case .wait(let waited, let waiter, let starting): (flight, id, starts) = (waited, waiter, starting)
        }
        if starts {
            let task = Task {
                let result: Result<Value, any Error>
                do { result = .success(try await load()) } catch { result = .failure(error) }
                self.finish(key, flight, result)
            }
            let abandoned = state.withLock { _ in
                flight.task = task
                return flight.members == 0
            }
            if abandoned { task.cancel() }
        }
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { continuation in
                let now = state.withLock { _ -> Result<Value, any Error>? in
                    if let result = flight.result { return result }
                    if flight.left.remove(id) != nil { return .failure(CancellationError()) }
                    flight.waiting[id] = continuation
                    return nil
                }
                if let now { continuation.resume(with: now) }
            }
        } onCancel: {
            let (continuation, task) = state.withLock {
                state -> (UnsafeContinuation<Value, any Error>?, Task<Void, Never>?) in
                guard flight.result == nil else { return (nil, nil) }
                let continuation = flight.waiting.removeValue(forKey: id)
                if continuation == nil { flight.left.insert(id) }
                flight.members -= 1
                guard flight.members == 0 else { return (continuation, nil) }
                if case .loading(let current) = state.entries[key], current === flight { state.entries[key] = nil }
                return (continuation, flight.task)
            }
            task?.cancel()
            continuation?.resume(throwing: CancellationError())
        }
    }

    private func finish(_ key: Key, _ flight: Flight, _ result: Result<Value, any Error>) {
        let waiting = state.withLock { state in
            flight.result = result
            if case .loading(let current) = state.entries[key], current === flight {
                switch result {
                case .success(let value): state.entries[key] = .loaded(value)
                case .failure: state.entries[key] = nil
                }
            }
            defer { flight.waiting = [:] }
            return flight.waiting
        }
        for continuation in waiting.values { continuation.resume(with: result) }
    }
}

/// The cache most Swift developers write for many keys: an actor holding a task per key, and when
/// each finished (`HandWrittenCache` is the same shape).
typealias HandWrittenKeyedCache = HandWrittenCache<String, Int>

/// An actor dictionary with a deadline per key: the shape of Hummingbird's `MemoryPersistDriver` and
/// Vapor's memory cache (no single flight: a miss loads in every caller).
actor TTLDictionary<Key: Hashable & Sendable, Value: Sendable> {
    private var values: [Key: (value: Value, expires: ContinuousClock.Instant)] = [:]
    private let clock = ContinuousClock()
    private let expiry: Duration

    init(expiry: Duration) {
        self.expiry = expiry
    }

    func get(_ key: Key) -> Value? {
        guard let entry = values[key], clock.now < entry.expires else { return nil }
        return entry.value
    }

    func set(_ key: Key, _ value: Value) {
        values[key] = (value, clock.now.advanced(by: expiry))
    }
}

/// Families, caches and dictionaries filled once per process (filling a million keys takes longer
/// than a benchmark's run, so it must not be part of every sample).
final class Filled: Sendable {
    static let shared = Filled()
    private let made = Mutex<[String: any Sendable]>([:])

    func value<T: Sendable>(_ name: String, _ make: () async throws -> T) async rethrows -> T {
        if let existing = made.withLock({ $0[name] }) as? T { return existing }
        let value = try await make()
        made.withLock { $0[name] = value }
        return value
    }
}

/// A family of `keys` fresh entries (key = value), filled once per process.
func filledFamily(_ keys: Int) async -> AsyncStateFamily<Int, Int> {
    await Filled.shared.value("family-\(keys)") {
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
        for key in 0..<keys { family.set(key, for: key) }
        return family
    }
}

/// `count` keys visited in a scattered order (a stride prime to the count), so that consecutive
/// hits do not share cache lines.
func scattered(_ count: Int) -> [Int] {
    var keys: [Int] = []
    keys.reserveCapacity(count)
    var key = 0
    for _ in 0..<count {
        key = (key &+ 7_919) % count
        keys.append(key)
    }
    return keys
}

/// A benchmark's walk through `scattered(count)`, made once per process: each sample goes on where
/// the previous one stopped, so that a run visits every key before it visits one again. (A walk that
/// started over in each sample would hit the same thousand keys, warm in the caches, every time.)
final class ScatteredWalk: Sendable {
    let order: [Int]
    private let position = Atomic<Int>(0)

    private init(_ count: Int) {
        order = scattered(count)
    }

    /// The walk of `count` keys for the benchmark `name`.
    static func named(_ name: String, keys count: Int) async -> ScatteredWalk {
        await Filled.shared.value("walk-\(name)-\(count)") { ScatteredWalk(count) }
    }

    /// Measures `hit` on the walk's keys in turn, one per scaled iteration of `benchmark`, going on
    /// from where the last sample stopped. Always inlined, so that `hit` is too: a call through a
    /// closure would add its cost to every hit measured.
    @inline(__always)
    func measure(_ benchmark: Benchmark, _ hit: (Int) async throws -> Void) async rethrows {
        let order = order
        var next = position.load(ordering: .relaxed)
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations {
            next = next == order.count - 1 ? 0 : next + 1
            try await hit(order[next])
        }
        benchmark.stopMeasurement()
        position.store(next, ordering: .relaxed)
    }
}

/// An operation's source that answers when opened, or throws when its caller is cancelled.
final class Gate: Sendable {
    private let state = Mutex<(open: Bool, waiting: [CheckedContinuation<Int, any Error>])>((false, []))

    func wait() async throws -> Int {
        try await withCheckedThrowingContinuation { continuation in
            let isOpen = state.withLock { state in
                if !state.open { state.waiting.append(continuation) }
                return state.open
            }
            if isOpen { continuation.resume(returning: 42) }
        }
    }

    func open() {
        let waiting = state.withLock { state in
            state.open = true
            defer { state.waiting = [] }
            return state.waiting
        }
        for continuation in waiting { continuation.resume(returning: 42) }
    }
}

/// For each iteration, 10,000 concurrent callers of a fresh cache (`makeCaller` makes one and says how
/// to call it) with one operation that counts its runs: exactly one run and every answer expected.
func stampede(
    _ benchmark: Benchmark,
    makeCaller: () -> @Sendable () async -> Int
) async {
    for _ in benchmark.scaledIterations {
        let call = makeCaller()
        stampedeRuns.store(0, ordering: .relaxed)
        let total = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<10_000 { group.addTask { await call() } }
            return await group.reduce(0, +)
        }
        blackHole(total)
        let runs = stampedeRuns.load(ordering: .relaxed)
        if runs != 1 || total != 420_000 { benchmark.error("\(runs) operation runs, total \(total)") }
    }
}

/// The stampede's operation: a function, not a closure value, so that passing it to generic code
/// costs no reabstraction thunk per caller (a closure held in a variable would be wrapped in one,
/// allocated, on every call — a cost of the harness, not of what it measures; a closure literal at
/// the call site, as users write, is made in the generic form directly).
@Sendable func stampedeOperation() async throws -> Int {
    stampedeRuns.add(1, ordering: .relaxed)
    await Task.yield()
    return 42
}

let stampedeRuns = Atomic<Int>(0)

/// A counter tasks can share.
final class Counter: Sendable {
    private let atomic = Atomic<Int>(0)
    func increment() { atomic.add(1, ordering: .relaxed) }
    var value: Int { atomic.load(ordering: .relaxed) }
}

/// A source that operations call: a class, as a database client would be.
final class Database: Sendable {
    func number(for key: Int) async throws -> Int { key }
}

/// An observer that does nothing: what remains is the cost of producing and delivering an event.
struct NoOpObserver: AsyncStateObserver {
    func observe(_ event: AsyncStateEvent) { blackHole(event.kind) }
}

/// A non-capturing operation: calling it allocates nothing.
@Sendable func loadNumber() async throws -> Int { 42 }

var nanosecondScale: Benchmark.Configuration {
    .init(
        metrics: [.wallClock, .cpuTotal, .throughput, .mallocCountTotal], scalingFactor: .kilo,
        maxDuration: .seconds(2), maxIterations: 100_000,
        thresholds: [.mallocCountTotal: .init(absolute: [.p90: 0])])
}

/// As ``nanosecondScale``, but a capturing closure may allocate its context on every call: the
/// threshold is the count measured, so that a change shows.
var capturingScale: Benchmark.Configuration {
    .init(
        metrics: [.wallClock, .cpuTotal, .throughput, .mallocCountTotal], scalingFactor: .kilo,
        maxDuration: .seconds(2), maxIterations: 100_000)
}

var concurrencyScale: Benchmark.Configuration {
    .init(
        metrics: [.wallClock, .cpuTotal, .mallocCountTotal], scalingFactor: .one,
        maxDuration: .seconds(3), maxIterations: 30,
        thresholds: [.mallocCountTotal: .init(relative: [.p90: 10])])
}

let benchmarks: @Sendable () -> Void = {
    // MARK: Synchronous reads vs one uncontended lock

    Benchmark("Read:Mutex-lock-unlock(baseline)", configuration: nanosecondScale) { benchmark in
        let mutex = Mutex(0)
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations {
            blackHole(
                mutex.withLock {
                    $0 &+= 1
                    return $0
                })
        }
    }

    Benchmark("Read:wrappedValue", configuration: nanosecondScale) { benchmark in
        let state = AsyncState<Int>(wrappedValue: 7)
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations { blackHole(state.wrappedValue) }
    }

    Benchmark("Read:phase", configuration: nanosecondScale) { benchmark in
        let state = AsyncState<Int>(wrappedValue: 7)
        await state.set(8)
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations { blackHole(state.phase) }
    }

    // MARK: A fresh hit vs an actor call and a hand-written cache

    Benchmark("Hit:trivial-actor-call(baseline)", configuration: nanosecondScale) { benchmark in
        let actor = TrivialActor()
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations { blackHole(await actor.get()) }
    }

    Benchmark("Hit:hand-written-actor-cache(baseline)", configuration: nanosecondScale) { benchmark in
        let cache = HandWrittenCache<String, Int>(expiry: .seconds(3_600))
        _ = try await cache.value(for: "k", loadNumber)
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations { blackHole(try await cache.value(for: "k", loadNumber)) }
    }

    Benchmark("Hit:value(_:)-fresh", configuration: nanosecondScale) { benchmark in
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(3_600))
        _ = try await state.value(loadNumber)
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations { blackHole(try await state.value(loadNumber)) }
    }

    // The same hit with an observer that does nothing: the cost of one event.
    Benchmark("Hit:value(_:)-fresh-with-a-no-op-observer", configuration: nanosecondScale) { benchmark in
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(3_600), name: "n", observer: NoOpObserver())
        _ = try await state.value(loadNumber)
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations { blackHole(try await state.value(loadNumber)) }
    }

    // The same hit, traced (the example's `TracingObserver` on the in-memory tracer): a hit makes no
    // span, so the same cost, and no allocation.
    Benchmark("Hit:value(_:)-fresh-with-the-tracing-observer", configuration: nanosecondScale) { benchmark in
        let tracing = TracingObserver(tracer: InMemoryTracer(recordInjections: false, recordExtractions: false))
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(3_600), name: "n", observer: tracing)
        _ = try await state.value(loadNumber)
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations { blackHole(try await state.value(loadNumber)) }
    }

    // The usual call site: an operation that captures what it needs (a client and a key).
    Benchmark("Hit:value(_:)-fresh-capturing", configuration: capturingScale) { benchmark in
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(3_600))
        let database = Database()
        _ = try await state.value { try await database.number(for: 1) }
        benchmark.startMeasurement()
        for key in benchmark.scaledIterations {
            blackHole(try await state.value { try await database.number(for: key) })
        }
    }

    // The same call site, passing what it needs to a non-capturing operation.
    Benchmark("Hit:value(using:_:)-fresh", configuration: nanosecondScale) { benchmark in
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(3_600))
        let database = Database()
        _ = try await state.value(using: (database, 1)) { try await $0.0.number(for: $0.1) }
        benchmark.startMeasurement()
        for key in benchmark.scaledIterations {
            blackHole(try await state.value(using: (database, key)) { try await $0.0.number(for: $0.1) })
        }
    }

    // `snapshot`, the call a server answering with the value's metadata makes (the example does), the
    // same two ways.
    Benchmark("Hit:snapshot(_:)-fresh-capturing", configuration: capturingScale) { benchmark in
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(3_600))
        let database = Database()
        _ = try await state.snapshot { try await database.number(for: 1) }
        benchmark.startMeasurement()
        for key in benchmark.scaledIterations {
            blackHole(try await state.snapshot { try await database.number(for: key) })
        }
    }

    Benchmark("Hit:snapshot(using:_:)-fresh", configuration: nanosecondScale) { benchmark in
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(3_600))
        let database = Database()
        _ = try await state.snapshot(using: (database, 1)) { try await $0.0.number(for: $0.1) }
        benchmark.startMeasurement()
        for key in benchmark.scaledIterations {
            blackHole(try await state.snapshot(using: (database, key)) { try await $0.0.number(for: $0.1) })
        }
    }

    Benchmark("Hit:fetch(_:)-fresh", configuration: nanosecondScale) { benchmark in
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(3_600))
        await state.fetch(loadNumber)
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations {
            await state.fetch(loadNumber)
            blackHole(state)
        }
    }

    // MARK: A cold state hit by 10,000 callers vs 10,000 tasks calling an actor

    Benchmark("Cold:10000-tasks-calling-an-actor(baseline)", configuration: concurrencyScale) { benchmark in
        for _ in benchmark.scaledIterations {
            let actor = TrivialActor()
            let total = await withTaskGroup(of: Int.self) { group in
                for _ in 0..<10_000 { group.addTask { await actor.get() } }
                return await group.reduce(0, +)
            }
            blackHole(total)
        }
    }

    Benchmark("Cold:10000-concurrent-value(_:)", configuration: concurrencyScale) { benchmark in
        await stampede(benchmark) {
            let state = AsyncState<Int>(wrappedValue: 0)
            return { (try? await state.value(stampedeOperation)) ?? 0 }
        }
    }

    // The same stampede, traced: one load span and 9,999 wait spans, each linked to the load.
    Benchmark("Cold:10000-concurrent-value(_:)-traced", configuration: concurrencyScale) { benchmark in
        await stampede(benchmark) {
            let tracer = InMemoryTracer(recordInjections: false, recordExtractions: false)
            let state = AsyncState<Int>(wrappedValue: 0, name: "n", observer: TracingObserver(tracer: tracer))
            return { (try? await state.value(stampedeOperation)) ?? 0 }
        }
    }

    Benchmark("Cold:10000-concurrent-hand-written-cache(baseline)", configuration: concurrencyScale) { benchmark in
        await stampede(benchmark) {
            let cache = HandWrittenCache<String, Int>(expiry: .seconds(3_600))
            return { (try? await cache.value(for: "k", stampedeOperation)) ?? 0 }
        }
    }

    // MARK: 10,000 waiters join a flight, then leave at once by cancellation

    for cancelling in [false, true] {
        Benchmark(
            cancelling ? "Cancel:10000-waiters-cancelled-at-once" : "Cancel:10000-waiters-join(baseline)",
            configuration: concurrencyScale
        ) { benchmark in
            for _ in benchmark.scaledIterations {
                let state = AsyncState<Int>(wrappedValue: 0)
                let gate = Gate()
                await withTaskGroup(of: Int.self) { group in
                    if !cancelling { benchmark.startMeasurement() }
                    for _ in 0..<10_000 {
                        group.addTask { (try? await state.value { try await gate.wait() }) ?? 0 }
                    }
                    while state.waitingCallers < 10_000 { await Task.yield() }
                    if cancelling {
                        benchmark.startMeasurement()
                        group.cancelAll()
                    } else {
                        benchmark.stopMeasurement()
                        gate.open()
                    }
                    blackHole(await group.reduce(0, +))
                    if cancelling { benchmark.stopMeasurement() }
                }
                gate.open()
            }
        }
    }

    // MARK: Publishing a transition to subscribers

    // A `set` publishes one snapshot to every `updates` subscriber. These subscribers never read, so
    // each stream's buffer stays full (the newest 64) and a publication only replaces its oldest
    // entry: no allocation per subscriber. The readers' lock is held for a copy, not for the sends.
    for subscribers in [0, 1_000] {
        Benchmark(
            "Updates:set-with-\(subscribers)-subscribers\(subscribers == 0 ? "(baseline)" : "")",
            configuration: .init(
                metrics: [.wallClock, .mallocCountTotal], scalingFactor: .one, maxDuration: .seconds(2),
                maxIterations: 1_000, thresholds: [.mallocCountTotal: .init(absolute: [.p90: 0])])
        ) { benchmark in
            let state = AsyncState<Int>(wrappedValue: 0)
            let streams = (0..<subscribers).map { _ in state.updates }
            for value in 0..<100 { await state.set(value) }  // fill every buffer
            benchmark.startMeasurement()
            for value in benchmark.scaledIterations { await state.set(value) }
            benchmark.stopMeasurement()
            blackHole(streams)
        }
    }

    // MARK: A family of states: hits, a cold stampede over many keys, batches

    for keys in [1_000, 1_000_000] {
        let scale = keys == 1_000 ? "1000" : "1000000"
        Benchmark("Family:hit-\(scale)-keys", configuration: nanosecondScale) { benchmark in
            let family = await filledFamily(keys)
            try await ScatteredWalk.named("family", keys: keys).measure(benchmark) { key in
                blackHole(try await family.value(for: key) { $0 })
            }
        }

        // Traced: a hit makes no span, and the event's key is a small string: no allocation.
        if keys == 1_000 {
            Benchmark("Family:hit-1000-keys-with-the-tracing-observer", configuration: nanosecondScale) { benchmark in
                let tracer = InMemoryTracer(recordInjections: false, recordExtractions: false)
                let family = AsyncStateFamily<Int, Int>(
                    expiry: .seconds(3_600), capacity: keys, name: "f", observer: TracingObserver(tracer: tracer))
                for key in 0..<keys { family.set(key, for: key) }
                try await ScatteredWalk.named("family-traced", keys: keys).measure(benchmark) { key in
                    blackHole(try await family.value(for: key) { $0 })
                }
            }
        }

        // With a second level: a hit never reads it, and costs what a hit without one costs (no
        // allocation). Filled through misses that went through the second level, so that the
        // entries carry its versions.
        if keys == 1_000 {
            Benchmark("Family:hit-1000-keys-with-a-second-level", configuration: nanosecondScale) { benchmark in
                let level = await Filled.shared.value("second-level") { InMemorySecondLevel(clock: ContinuousClock()) }
                let family = try await Filled.shared.value("family-second-level-\(keys)") {
                    let family = AsyncStateFamily<Int, Int>(
                        expiry: .seconds(3_600), capacity: keys,
                        secondLevel: AsyncStateSecondLevelOptions(level: level, namespace: "numbers", codec: .json))
                    for key in 0..<keys { _ = try await family.value(for: key) { $0 } }
                    // The misses' last tasks (their leases given back, their timers cancelled) end
                    // before the hits are measured: their allocations are not a hit's.
                    try await Task.sleep(for: .milliseconds(500))
                    return family
                }
                let reads = level.counts.reads
                try await ScatteredWalk.named("family-second-level", keys: keys).measure(benchmark) { key in
                    blackHole(try await family.value(for: key) { $0 })
                }
                if level.counts.reads != reads { benchmark.error("a hit read the second level") }
            }
        }

        // The usual call site passes what the operation needs as a context: still no allocation.
        if keys == 1_000 {
            Benchmark("Family:hit-1000-keys-using-a-context", configuration: nanosecondScale) { benchmark in
                let family = await filledFamily(keys)
                let database = Database()
                try await ScatteredWalk.named("family-using", keys: keys).measure(benchmark) { key in
                    blackHole(
                        try await family.value(for: key, using: database) { try await $1.number(for: $0) })
                }
            }
        }

        // What a server answers with: the snapshot (value, phase, age), its operation given a context.
        if keys == 1_000 {
            Benchmark("Family:snapshot-hit-1000-keys-using-a-context", configuration: nanosecondScale) { benchmark in
                let family = await filledFamily(keys)
                let database = Database()
                try await ScatteredWalk.named("family-snapshot", keys: keys).measure(benchmark) { key in
                    blackHole(
                        try await family.snapshot(for: key, using: database) {
                            try await $1.number(for: $0)
                        })
                }
            }
        }

        // Reads that are not uses, beside the `value(for:)` hit above in the same run: the latest
        // value (`family[key]`) and the snapshot (`snapshot(for:)`), specialized in this module.
        if keys == 1_000 {
            Benchmark("Family:read-subscript-1000-keys", configuration: nanosecondScale) { benchmark in
                let family = await filledFamily(keys)
                await ScatteredWalk.named("family-subscript", keys: keys).measure(benchmark) { key in
                    blackHole(family[key])
                }
            }
            Benchmark("Family:read-snapshot(for:)-1000-keys", configuration: nanosecondScale) { benchmark in
                let family = await filledFamily(keys)
                await ScatteredWalk.named("family-snapshot-read", keys: keys).measure(benchmark) { key in
                    blackHole(family.snapshot(for: key))
                }
            }
            // Every entry at once: a dictionary of 1,000 values or snapshots per iteration (its
            // allocations, a fixed few, are the threshold).
            Benchmark("Family:read-every-value-1000-keys", configuration: .init(maxIterations: 1_000)) { benchmark in
                let family = await filledFamily(keys)
                benchmark.startMeasurement()
                for _ in benchmark.scaledIterations { blackHole(family.wrappedValue) }
                benchmark.stopMeasurement()
            }
            Benchmark("Family:read-every-snapshot-1000-keys", configuration: .init(maxIterations: 1_000)) {
                benchmark in
                let family = await filledFamily(keys)
                benchmark.startMeasurement()
                for _ in benchmark.scaledIterations { blackHole(family.snapshots) }
                benchmark.stopMeasurement()
            }
            // A write to a key that has a value, beside an actor dictionary's write in the same run
            // (a family of its own: the filled one's values must stay as the reads expect them).
            Benchmark("Family:write-set(_:for:)-1000-keys", configuration: nanosecondScale) { benchmark in
                let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
                for key in 0..<keys { family.set(key, for: key) }
                await ScatteredWalk.named("family-set", keys: keys).measure(benchmark) { key in
                    family.set(key, for: key)
                }
            }
            // A write of a new key to a full family: it evicts one entry (reported and released
            // after the shard's lock, from a list whose first entry is inline). The threshold counts
            // a sample of 1,000 writes: 12 allocations, the table's occasional upkeep (1,012 when
            // the list allocated for each eviction).
            Benchmark("Family:write-set(_:for:)-new-key-evicting-1000-keys", configuration: nanosecondScale) {
                benchmark in
                let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: keys)
                for key in 0..<keys { family.set(key, for: key) }
                var next = keys
                benchmark.startMeasurement()
                for _ in benchmark.scaledIterations {
                    family.set(next, for: next)
                    next += 1
                }
                benchmark.stopMeasurement()
                if family.count != keys { benchmark.error("\(family.count) entries for a capacity of \(keys)") }
            }
            Benchmark("Family:actor-dictionary-with-TTL-write-1000-keys(baseline)", configuration: nanosecondScale) {
                benchmark in
                let dictionary = TTLDictionary<Int, Int>(expiry: .seconds(3_600))
                for key in 0..<keys { await dictionary.set(key, key) }
                await ScatteredWalk.named("dictionary-set", keys: keys).measure(benchmark) { key in
                    await dictionary.set(key, key)
                }
            }
        }

        Benchmark("Family:hand-written-actor-cache-\(scale)-keys(baseline)", configuration: nanosecondScale) {
            benchmark in
            let names = await Filled.shared.value("names-\(keys)") { (0..<keys).map(String.init) }
            let cache = try await Filled.shared.value("cache-\(keys)") {
                let cache = HandWrittenKeyedCache(expiry: .seconds(3_600))
                for name in names { _ = try await cache.value(for: name, loadNumber) }
                return cache
            }
            try await ScatteredWalk.named("cache", keys: keys).measure(benchmark) { key in
                blackHole(try await cache.value(for: names[key], loadNumber))
            }
        }

        Benchmark("Family:actor-dictionary-with-TTL-\(scale)-keys(baseline)", configuration: nanosecondScale) {
            benchmark in
            let dictionary = await Filled.shared.value("dictionary-\(keys)") {
                let dictionary = TTLDictionary<Int, Int>(expiry: .seconds(3_600))
                for key in 0..<keys { await dictionary.set(key, key) }
                return dictionary
            }
            await ScatteredWalk.named("dictionary", keys: keys).measure(benchmark) { key in
                blackHole(await dictionary.get(key))
            }
        }
    }

    // A miss: a key never asked before, one caller. The family makes the entry, runs the operation
    // and settles; the hand-written caches make a task and keep every key (they have no capacity).
    // Each sample makes a new family and asks 1,000 keys of it, so its misses never evict (an
    // evicting write is `Family:write-set(_:for:)-new-key-evicting-…`, and `HitLoop miss 10000`
    // fills the family first). Each benchmark is written out with its operation as a
    // literal at the call, as a user writes it: passed in from a shared helper, the family's
    // operation cost two more allocations per miss (13 against 11), which is not what users pay.
    Benchmark("Miss:family-value(for:)-new-key", configuration: capturingScale) { benchmark in
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: 10_000)
        benchmark.startMeasurement()
        for key in benchmark.scaledIterations { blackHole(try await family.value(for: key) { $0 }) }
    }
    Benchmark("Miss:hand-written-actor-cache-new-key(baseline)", configuration: capturingScale) { benchmark in
        let cache = HandWrittenCache<Int, Int>(expiry: .seconds(3_600))
        benchmark.startMeasurement()
        for key in benchmark.scaledIterations { blackHole(try await cache.value(for: key) { key }) }
    }
    // The reference point: a hand-written cache with the same cancellation contract as the family.
    Benchmark("Miss:hand-written-cancellable-cache-new-key(reference)", configuration: capturingScale) {
        benchmark in
        let cache = CancellableCache<Int, Int>()
        benchmark.startMeasurement()
        for key in benchmark.scaledIterations { blackHole(try await cache.value(for: key) { key }) }
    }
    // The same with an operation that suspends once, as a real source's does: the attempt then
    // resumes and settles on another thread, and wakes its caller there.
    Benchmark("Miss:family-value(for:)-new-key-suspending", configuration: capturingScale) { benchmark in
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: 10_000)
        benchmark.startMeasurement()
        for key in benchmark.scaledIterations {
            blackHole(
                try await family.value(for: key) { key in
                    await Task.yield()
                    return key
                })
        }
    }
    Benchmark("Miss:hand-written-actor-cache-new-key-suspending(baseline)", configuration: capturingScale) {
        benchmark in
        let cache = HandWrittenCache<Int, Int>(expiry: .seconds(3_600))
        benchmark.startMeasurement()
        for key in benchmark.scaledIterations {
            blackHole(
                try await cache.value(for: key) {
                    await Task.yield()
                    return key
                })
        }
    }
    Benchmark("Miss:hand-written-cancellable-cache-new-key-suspending(reference)", configuration: capturingScale) {
        benchmark in
        let cache = CancellableCache<Int, Int>()
        benchmark.startMeasurement()
        for key in benchmark.scaledIterations {
            blackHole(
                try await cache.value(for: key) {
                    await Task.yield()
                    return key
                })
        }
    }

    // 1,000 distinct keys, 10 concurrent callers each: exactly one run per key.
    Benchmark("Family:cold-1000-keys-x10-callers", configuration: concurrencyScale) { benchmark in
        for _ in benchmark.scaledIterations {
            let family = AsyncStateFamily<Int, Int>(capacity: 1_000)
            let runs = Counter()
            let total = await withTaskGroup(of: Int.self) { group in
                for caller in 0..<10_000 {
                    group.addTask {
                        (try? await family.value(for: caller % 1_000) { key in
                            runs.increment()
                            await Task.yield()
                            return key
                        }) ?? -1
                    }
                }
                return await group.reduce(0, +)
            }
            if runs.value != 1_000 || total != 10 * 499_500 {
                benchmark.error("\(runs.value) operation runs for 1,000 keys, total \(total)")
            }
        }
    }

    // 10,000 keys asked by 100 concurrent callers in overlapping batches of 200: every key loaded once.
    Benchmark("Family:batched-10000-keys-100-callers", configuration: concurrencyScale) { benchmark in
        for _ in benchmark.scaledIterations {
            let family = AsyncStateFamily<Int, Int>(capacity: 10_000)
            let loaded = Counter()
            let batches = Counter()
            let answered = await withTaskGroup(of: Int.self) { group in
                for caller in 0..<100 {
                    // Caller c asks for keys 100c ..< 100c + 200: each key is asked by two callers.
                    let keys = (caller * 100..<caller * 100 + 200).map { $0 % 10_000 }
                    group.addTask {
                        let results = await family.values(for: keys) { missing in
                            batches.increment()
                            for _ in missing { loaded.increment() }
                            await Task.yield()
                            return Dictionary(uniqueKeysWithValues: missing.map { ($0, $0) })
                        }
                        return results.values.count { (try? $0.get()) != nil }
                    }
                }
                return await group.reduce(0, +)
            }
            if loaded.value != 10_000 || answered != 20_000 {
                benchmark.error("\(loaded.value) keys loaded in \(batches.value) batches, \(answered) answers")
            }
        }
    }

    // 10,000 concurrent misses over 10,000 keys, coalesced: exactly 100 operation calls of 100 keys
    // (each batch closes when full; the window, 100 ms, only bounds a batch that never fills).
    Benchmark("Family:coalesced-10000-misses-maxBatchSize-100", configuration: concurrencyScale) { benchmark in
        for _ in benchmark.scaledIterations {
            let family = AsyncStateFamily<Int, Int>(capacity: 10_000)
            let calls = Counter()
            let total = await withTaskGroup(of: Int.self) { group in
                for key in 0..<10_000 {
                    group.addTask {
                        (try? await family.value(for: key, batchWindow: .milliseconds(100), maxBatchSize: 100) { keys in
                            calls.increment()
                            return Dictionary(uniqueKeysWithValues: keys.map { ($0, $0) })
                        }) ?? -1
                    }
                }
                return await group.reduce(0, +)
            }
            if calls.value != 100 || total != 49_995_000 {
                benchmark.error("\(calls.value) operation calls for 10,000 keys, total \(total)")
            }
        }
    }

    // MARK: The state machine alone

    Benchmark(
        "Machine:4-transitions(fetch,settle,set,invalidate)",
        configuration: .init(
            metrics: [.wallClock, .throughput, .mallocCountTotal], scalingFactor: .kilo, maxDuration: .seconds(2),
            thresholds: [.mallocCountTotal: .init(absolute: [.p90: 0])])
    ) { benchmark in
        var machine = FetchStateMachineBenchmark()
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations { blackHole(machine.cycle()) }
    }

    // MARK: Waking N sleepers: VirtualClock vs swift-clocks' TestClock

    for count in [100, 1_000, 10_000] {
        Benchmark(
            "Clock:VirtualClock-wakes-\(count)",
            configuration: .init(
                metrics: [.wallClock, .mallocCountTotal], maxDuration: .seconds(3), maxIterations: 20,
                // Dispatch's per-thread caches make this count vary (309 to 407 for 100 sleepers):
                // a loose bound, which an extra allocation per wake (+100%) still breaks.
                thresholds: [.mallocCountTotal: .init(relative: [.p90: 50])])
        ) { benchmark in
            let clock = VirtualClock()
            let woken = Counter()
            for _ in 0..<count {
                clock.task {
                    try await clock.sleep(for: .seconds(1))
                    woken.increment()
                }
            }
            await clock.waitForSleepers(count)
            benchmark.startMeasurement()
            await clock.advance(by: .seconds(1))
            benchmark.stopMeasurement()
            if woken.value != count { benchmark.error("woke \(woken.value)") }
        }
    }

    // TestClock re-sorts its sleepers on every wake; at 10,000 one advance would take minutes, so it is
    // measured at 100 and 1,000 only.
    for count in [100, 1_000] {
        Benchmark(
            "Clock:TestClock-wakes-\(count)(baseline)",
            configuration: .init(metrics: [.wallClock], maxDuration: .seconds(5), maxIterations: count > 100 ? 3 : 20)
        ) { benchmark in
            let clock = TestClock()
            let woken = Counter()
            let tasks = (0..<count).map { _ in
                Task {
                    try await clock.sleep(for: .seconds(1))
                    woken.increment()
                }
            }
            // TestClock cannot tell how many sleepers it holds: give the tasks real time to register.
            try await Task.sleep(for: .milliseconds(100))
            benchmark.startMeasurement()
            await clock.advance(by: .seconds(1))
            benchmark.stopMeasurement()
            for task in tasks { _ = await task.result }
            if woken.value != count { benchmark.error("woke \(woken.value)") }
        }
    }

    // MARK: Memory per idle state

    // Bytes requested from malloc and still held, per fetched-then-idle state (deterministic). The
    // resident-set growth per state is measured in a fresh process by the MemoryPerState tool:
    // `swift run --package-path Benchmarks -c release MemoryPerState`.
    // The same per entry of a family (besides its key and value).
    Benchmark(
        "Memory:heap-bytes-held-per-idle-family-entry",
        configuration: .init(
            metrics: [.memoryLeakedBytes, .mallocCountTotal], scalingFactor: .kilo, maxIterations: 20,
            thresholds: [.memoryLeakedBytes: .init(relative: [.p90: 2]), .mallocCountTotal: .init(relative: [.p90: 2])])
    ) { benchmark in
        let family = AsyncStateFamily<Int, Int>(capacity: benchmark.scaledIterations.count)
        benchmark.startMeasurement()
        for index in benchmark.scaledIterations { family.set(index, for: index) }
        benchmark.stopMeasurement()
        blackHole(family)
    }

    Benchmark(
        "Memory:heap-bytes-held-per-idle-state",
        configuration: .init(
            metrics: [.memoryLeakedBytes, .mallocCountTotal], scalingFactor: .kilo, maxIterations: 20,
            thresholds: [.memoryLeakedBytes: .init(relative: [.p90: 2]), .mallocCountTotal: .init(relative: [.p90: 2])])
    ) { benchmark in
        var states: [AsyncState<Int>] = []
        states.reserveCapacity(benchmark.scaledIterations.count)
        benchmark.startMeasurement()
        for index in benchmark.scaledIterations {
            let state = AsyncState<Int>(wrappedValue: index)
            await state.set(index)  // fetched once, then idle
            states.append(state)
        }
        benchmark.stopMeasurement()
        blackHole(states)
    }
}
