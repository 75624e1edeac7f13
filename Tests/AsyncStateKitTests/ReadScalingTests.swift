// These tests run on ContinuousClock and the global concurrent executor on purpose: they look for
// races between readers on every core and a writer, which a serial virtual executor would never
// interleave. Run them under ThreadSanitizer too (`swift test --sanitize=thread`).
import AsyncStateTesting
import Foundation
import Synchronization
import Testing

@testable import AsyncStateKit

/// Reads that scale with cores (``ReadMostlyLock``): a contended lock spreads into a stripe per
/// processor, readers on a stripe never see a torn or outdated value, and what readers leave on their
/// stripes reaches the value before any writer looks at it.
///
/// One test at a time: each spins threads of its own with `sched_yield`, and two at once under
/// ThreadSanitizer on a loaded 2-core machine starved each other past their 30 s deadlines.
@Suite(.serialized) struct ReadScalingTests {
    /// A value whose readers count their reads on their stripe.
    struct Counted: StripeReadable {
        struct Reads: StripeLocalStorage {
            var count = 0
            init(stripe: Int) {}
            var wantsAbsorbing: Bool { count >= 1_000 }
            var mustAbsorb: Bool { count >= 2_000 }
        }
        var reads = 0
        var payload = (0, "0")
        static func absorb(_ local: inout Reads, into value: UnsafeMutablePointer<Self>) {
            value.pointee.reads += local.count
            local.count = 0
        }
    }

    /// What the tasks of a test share.
    final class Tally: Sendable {
        let written = Atomic<Int>(0)
        let failures = Atomic<Int>(0)
        let done = Atomic<Bool>(false)
    }

    /// How many tasks read at once: one per core, at least 2.
    static var readers: Int { max(2, ProcessInfo.processInfo.activeProcessorCount) }

    /// Every read is counted exactly once, whether made under the mutex, on a stripe, or folded in
    /// by a full stripe's reader or by a writer; and a writer's payload is never seen torn.
    @Test(arguments: [false, true])
    func everyReadReachesTheValueAndNoneSeesATornWrite(spreadFirst: Bool) async {
        let lock = ReadMostlyLock(Counted())
        if spreadFirst { lock.spreadNow() }
        #expect(lock.isSpread == spreadFirst)
        let perReader = 20_000
        let tally = Tally()
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                for step in 1...2_000 { lock.withLock { $0.payload = (step, String(step)) } }
            }
            for _ in 0..<Self.readers {
                group.addTask {
                    var last = 0
                    for _ in 0..<perReader {
                        let seen = lock.access { value, access -> (Int, String) in
                            switch access {
                            case .exclusive(let value): value.pointee.reads += 1
                            case .shared(let local): local.pointee.count += 1
                            }
                            return value.pointee.payload
                        }
                        if String(seen.0) != seen.1 || seen.0 < last { tally.failures.add(1, ordering: .relaxed) }
                        last = seen.0
                    }
                }
            }
        }
        #expect(tally.failures.load(ordering: .relaxed) == 0)
        #expect(lock.withLock { $0.reads } == Self.readers * perReader)
    }

    /// Readers that keep finding the mutex taken spread the lock, at the ``ReadMostlyLock/spreadAfter``th.
    ///
    /// Contention is made, not hoped for: a writer thread holds the mutex until the reader has found
    /// it taken, once per round (a test that waits for two busy tasks to collide by chance fails on a
    /// machine loaded enough that they never run at the same moment).
    @Test func contentionSpreadsTheLock() async {
        let lock = ReadMostlyLock(Counted())
        let rounds = ReadMostlyLock<Counted>.spreadAfter
        let steps = Steps()
        // Both sides spin on threads of their own (see ``onOwnThread(_:)``).
        let writer = Thread.start { [lock] in
            for index in 1...rounds {
                lock.withLock { value in
                    value.payload.0 = index
                    steps.written.store(index, ordering: .releasing)
                    // Held until this round's read has found the mutex taken.
                    steps.waitUntil { lock.contendedReads >= index }
                }
                // The next round starts once this one's read is over, not while it waits for the mutex.
                steps.waitUntil { steps.read.load(ordering: .acquiring) >= index }
            }
        }
        let (seen, spreadEarly) = await onOwnThread { [lock] in
            var seen: [Int] = []
            var spreadEarly: [Int] = []
            for index in 1...rounds {
                steps.waitUntil { steps.written.load(ordering: .acquiring) >= index }
                if steps.gaveUp.load(ordering: .relaxed) { break }
                if lock.isSpread { spreadEarly.append(index) }
                seen.append(lock.read { $0.pointee.payload.0 })
                steps.read.store(index, ordering: .releasing)
            }
            return (seen, spreadEarly)
        }
        await writer.value
        let gaveUp = steps.gaveUp.load(ordering: .relaxed)
        #expect(!gaveUp)
        #expect(spreadEarly.isEmpty, "spread before round \(spreadEarly)")
        #expect(lock.contendedReads == rounds)
        #expect(lock.isSpread)
        // Each read waited for the write that held the mutex, and saw it.
        #expect(seen == Array(1...rounds))
    }

    /// The rounds of ``contentionSpreadsTheLock()``, shared by its two threads.
    final class Steps: Sendable {
        let written = Atomic<Int>(0)
        let read = Atomic<Int>(0)
        let gaveUp = Atomic<Bool>(false)
        let deadline = ContinuousClock.now + .seconds(30)

        /// Spins, yielding the processor, until `condition` holds, or gives up (for both threads) at
        /// the deadline, so that a broken lock fails the test instead of hanging it.
        func waitUntil(_ condition: () -> Bool) {
            while !condition() {
                if gaveUp.load(ordering: .relaxed) { return }
                if ContinuousClock.now > deadline {
                    gaveUp.store(true, ordering: .relaxed)
                    return
                }
                sched_yield()
            }
        }
    }

    /// The source a state's writer changes and its misses read.
    final class Source: Sendable {
        let step = Atomic<Int>(0)
    }

    /// What a state's readers see while a writer sets, invalidates and refreshes it.
    struct Pair: Sendable {
        let number: Int
        let text: String
        init(_ number: Int) { (self.number, self.text) = (number, String(number)) }
        var isWhole: Bool { text == String(number) }
    }

    /// Readers on every core against a writer that sets, invalidates and refreshes one state: no
    /// reader sees a torn value, a value older than one it saw before, or a value older than the
    /// last write that had finished when its read began.
    ///
    /// The source changes before each write, as a real one does before its invalidation is sent: a
    /// miss that starts once an invalidation has finished fetches at least that step's value.
    @Test(arguments: [false, true])
    func aStateReadOnEveryCoreNeverGoesBack(spreadFirst: Bool) async throws {
        let state = AsyncState(wrappedValue: Pair(0), expiry: .seconds(3_600))
        if spreadFirst { state.store.cell.contents.spreadNow() }
        let tally = Tally()
        let source = Source()
        let writes = 3_000
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                for step in 1...writes {
                    source.step.store(step, ordering: .releasing)
                    switch step % 10 {
                    case 3: await state.invalidate()
                    case 7: await state.refresh { Pair(source.step.load(ordering: .acquiring)) }
                    default: await state.set(Pair(step))
                    }
                    tally.written.store(step, ordering: .releasing)
                }
            }
            for _ in 0..<Self.readers {
                group.addTask {
                    var last = 0
                    var reads = 0
                    while true {
                        let floor = tally.written.load(ordering: .acquiring)
                        if floor >= writes { break }
                        // A miss (after an invalidation) fetches what the source holds now.
                        let value = try await state.value { Pair(source.step.load(ordering: .acquiring)) }
                        let snapshot = state.snapshot.value
                        if !value.isWhole || !snapshot.isWhole || value.number < last || value.number < floor {
                            tally.failures.add(1, ordering: .relaxed)
                        }
                        last = value.number
                        // Hits never suspend: let the writer, and the suite's other tests, have the
                        // cooperative pool's threads now and then.
                        reads &+= 1
                        if reads % 16 == 0 { await Task.yield() }
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(tally.failures.load(ordering: .relaxed) == 0)
    }

    /// The same for a family's keys: readers on every core hit keys that a writer sets and
    /// invalidates; every key's values only go forward for each reader, and no entry is lost (none
    /// idle-expired or evicted).
    ///
    /// With and without an idle expiry (a spread shard then drops no hit, see ``AccessBuffer``), and
    /// with the shard's lock spread first or left to contention.
    @Test(arguments: [(spreadFirst: false, idle: true), (true, true), (true, false)])
    func aFamilyReadOnEveryCoreNeverGoesBack(spreadFirst: Bool, idle: Bool) async throws {
        let keys = 64
        let family = AsyncStateFamily<Int, Pair>(
            expiry: .seconds(3_600), capacity: keys, idleExpiry: idle ? .seconds(3_600) : nil)
        if spreadFirst { for shard in family.core.shards { shard.spreadNow() } }
        // What the writer has finished writing, per key (a pthread lock, which ThreadSanitizer sees).
        let written = LockedValue([Int](repeating: 0, count: keys))
        let tally = Tally()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                for step in 1...3_000 {
                    let key = step % keys
                    if step % 10 == 3 {
                        family.invalidate(key)
                    } else {
                        family.set(Pair(step), for: key)
                        written.withLock { $0[key] = step }
                    }
                }
                tally.done.store(true, ordering: .releasing)
            }
            for reader in 0..<Self.readers {
                group.addTask {
                    var last = [Int](repeating: 0, count: keys)
                    var key = reader
                    var reads = 0
                    while !tally.done.load(ordering: .acquiring) {
                        key = (key &+ 7) % keys
                        let floor = written.withLock { $0[key] }
                        let value = try await family.value(for: key) { key in
                            Pair(written.withLock { $0[key] })
                        }
                        if !value.isWhole || value.number < last[key] || value.number < floor {
                            tally.failures.add(1, ordering: .relaxed)
                        }
                        last[key] = value.number
                        reads &+= 1
                        if reads % 16 == 0 { await Task.yield() }
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(tally.failures.load(ordering: .relaxed) == 0)
        #expect(family.count == keys)
    }

    /// A spread shard's hits while another holds its mutex (a reader folding in its stripe, say):
    /// with an idle expiry, a reader whose buffer is full waits for the mutex rather than drop a hit,
    /// since a dropped hit would let a key in use go as idle; without one, it never waits, and the
    /// policy goes without the hits it had no room for.
    @Test(arguments: [true, false])
    func aSpreadShardWaitsRatherThanDropAHitOnlyWithAnIdleExpiry(idle: Bool) async throws {
        let clock = VirtualClock()
        let keys = 2 * AccessBuffer.capacity
        let family = AsyncStateFamily<Int, Int>(
            expiry: .seconds(3_600), capacity: keys, idleExpiry: idle ? .seconds(10) : nil, clock: clock)
        for key in 0..<keys { family.set(key, for: key) }
        let shard = family.core.shards[0]
        shard.spreadNow()
        let (held, readerDone) = (DispatchSemaphore(value: 0), DispatchSemaphore(value: 0))
        // The other holder of the mutex: it lets go once the reader is done, or after 200 ms (a
        // reader that waits for the mutex is never done before then). The waits for it are made on
        // threads of their own (see ``onOwnThread(_:)``).
        let holder = Thread.start {
            shard.storage.withUnsafeMutablePointerToElements { words in
                let mutex = ReadMostlyStorage<FamilyShard<Int, Int>>.mutex(in: words)
                MutexWords.lock(mutex)
                held.signal()
                let waited = readerDone.wait(timeout: .now() + .milliseconds(idle ? 200 : 10_000)) == .timedOut
                MutexWords.unlock(mutex)
                return waited
            }
        }
        // Every key hit once at 5 s, the last two buffers' worth while the mutex is taken.
        let values = await onOwnThread {
            held.wait()
            let values = (0..<keys).map { family.core.freshValue(of: $0, at: .seconds(5)) }
            readerDone.signal()
            return values
        }
        #expect(values == Array(0..<keys))
        let readerWaited = await holder.value
        #expect(readerWaited == idle)
        guard idle else { return }
        // At 11 s every key was last used at 5 s: none is idle yet, however its hit was noted.
        await clock.advance(by: .seconds(11))
        #expect(family.count == keys)
        await clock.advance(by: .seconds(5))
        #expect(family.count == 0)
    }

    /// A value whose readers count their reads on a stripe that holds at most 16 and may not drop
    /// any (as a shard's buffer with an idle expiry).
    struct Bounded: StripeReadable {
        struct Reads: StripeLocalStorage {
            var count = 0
            var dropped = 0
            init(stripe: Int) {}
            var wantsAbsorbing: Bool { count >= 8 }
            var mustAbsorb: Bool { count >= 16 }
        }
        var reads = 0
        static func absorb(_ local: inout Reads, into value: UnsafeMutablePointer<Self>) {
            value.pointee.reads += local.count
            local.count = 0
        }
    }

    /// A stripe that may not drop what its readers leave is never full when a reader reads, however
    /// many readers share it and however long the mutex is held: the one that must fold it in holds
    /// the stripe from then until it has read.
    @Test func aStripeThatMayNotDropIsNeverFullWhenRead() async {
        let lock = ReadMostlyLock(Bounded())
        lock.spreadNow()
        let threads = 4 * Self.readers
        let perThread = 20_000
        let steps = Steps()
        let group = DispatchGroup()
        // Another holder of the mutex, as a reader folding in its stripe would be, now and then.
        DispatchQueue.global().async(group: group) {
            lock.storage.withUnsafeMutablePointerToElements { words in
                let mutex = ReadMostlyStorage<Bounded>.mutex(in: words)
                while steps.read.load(ordering: .acquiring) < threads {
                    MutexWords.lock(mutex)
                    for _ in 0..<2_000 { sched_yield() }
                    MutexWords.unlock(mutex)
                    sched_yield()
                }
            }
        }
        for _ in 0..<threads {
            group.enter()
            Thread.detachNewThread {
                for _ in 0..<perThread {
                    lock.access { _, access in
                        guard case .shared(let local) = access else { return }
                        if local.pointee.count >= 16 {
                            local.pointee.dropped += 1
                        } else {
                            local.pointee.count += 1
                        }
                    }
                }
                steps.read.add(1, ordering: .releasing)
                group.leave()
            }
        }
        await onOwnThread { group.wait() }
        // What the readers dropped stays on the stripes (a writer's folding in keeps it).
        let dropped = lock.withLock { _ in
            lock.storage.withUnsafeMutablePointerToElements { words in
                let stripes = Stripes<Bounded.Reads>(words[0].load(ordering: .acquiring))
                return (0..<stripes.count).reduce(0) { $0 + stripes.local($1).pointee.dropped }
            }
        }
        #expect(dropped == 0)
        #expect(lock.withLock { $0.reads } == threads * perThread)
    }

    /// A spread shard's buffers note one hit in ``AccessBuffer/sampleInterval`` only while processors
    /// contend for the shard: a fold that follows another stripe's within
    /// ``AccessBuffer/contendedGap``. A fold that follows the same stripe's, or comes later, turns
    /// sampling off; the sampled hits are drawn at random, not by a stride that would skip the same
    /// keys of a loop; and a shard with an idle expiry never samples.
    @Test func aSpreadShardSamplesItsHitsOnlyWhileProcessorsContend() {
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: 64)
        let keys = 0..<8
        for key in keys { family.set(key, for: key) }
        family.core.shards[0].storage.withUnsafeMutablePointerToHeader { shard in
            let slots = keys.map { key in
                FamilyShard.freshValue(
                    in: UnsafePointer(shard), of: key, hash: key.hashValue, at: .zero, hitWindow: .seconds(3_600)
                ).map { shard.pointee.table.records[Int($0.position)].slot } ?? -1
            }
            #expect(!slots.contains(-1))
            /// Offers `hits` hits on the keys in turn at `instant`, and returns the slots noted.
            func offer(_ hits: Int, to buffer: inout AccessBuffer, at instant: Duration, lossless: Bool = false)
                -> [Int32]
            {
                let before = buffer.count
                for hit in 0..<hits {
                    buffer.append(
                        slots[hit % keys.count], hash: (hit % keys.count).hashValue, at: instant, lossless: lossless
                    )
                }
                var copy = buffer
                var noted: [Int32] = []
                copy.drain { noted.append($0.slot) }
                return Array(noted.dropFirst(before))
            }
            var (first, second) = (AccessBuffer(stripe: 0), AccessBuffer(stripe: 1))
            let start = Duration.seconds(1)
            // The first fold: nothing to compare with.
            #expect(offer(4, to: &first, at: start).count == 4)
            FamilyShard.absorb(&first, into: shard)
            #expect(!first.isSampling && first.count == 0)
            // Another stripe's fold 10 µs later, then the first's again: contention, both sample.
            #expect(offer(4, to: &second, at: start + .microseconds(10)).count == 4)
            FamilyShard.absorb(&second, into: shard)
            #expect(second.isSampling)
            _ = offer(4, to: &first, at: start + .microseconds(20))
            FamilyShard.absorb(&first, into: shard)
            #expect(first.isSampling)
            // A sampling buffer notes about one hit in eight, of many keys of the loop (the draws
            // are seeded: the same hits every run).
            let noted = offer(256, to: &second, at: start + .microseconds(30))
            #expect((16...48).contains(noted.count), "\(noted.count) of 256 noted")
            #expect(Set(noted).count >= 4, "a stride of eight would note one key of the eight")
            // With an idle expiry it notes every hit, sampling or not.
            FamilyShard.absorb(&second, into: shard)
            #expect(second.isSampling)
            #expect(offer(40, to: &second, at: start + .microseconds(40), lossless: true).count == 40)
            // The same stripe's fold after its own: sampling stops.
            FamilyShard.absorb(&second, into: shard)
            #expect(!second.isSampling)
            // Another stripe's fold, but a second after the last: no contention, no sampling.
            // (Sixty-four offered while it still samples, to fold some in.)
            _ = offer(64, to: &first, at: start + .seconds(1))
            #expect(first.count > 0)
            FamilyShard.absorb(&first, into: shard)
            #expect(!first.isSampling)
            #expect(offer(4, to: &first, at: start + .seconds(1)).count == 4)
        }
    }
}

extension Thread {
    /// Runs `body` on a new thread, started at once, and returns a task that waits for its result
    /// without holding a thread of the cooperative pool (see ``onOwnThread(_:)``).
    static func start<T: Sendable>(_ body: @escaping @Sendable () -> T) -> Task<T, Never> {
        let result = LockedValue<T?>(nil)
        let done = DispatchSemaphore(value: 0)
        detachNewThread {
            let value = body()
            result.withLock { $0 = value }
            done.signal()
        }
        return Task {
            await onOwnThread {
                done.wait()
                return result.withLock { $0! }
            }
        }
    }
}

/// Runs `body` — which blocks, on a semaphore or a spin — on a thread of its own and waits for it
/// suspended. A test that blocks a thread of the cooperative pool (two on a 2-core machine) stalls
/// every test running beside it: two such at once stopped the pool for ten seconds under
/// ThreadSanitizer, and tests polling on the real clock ran out of time.
func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread.detachNewThread { continuation.resume(returning: body()) }
    }
}
