import AsyncStateTesting
import Foundation

@testable import AsyncStateKit

/// A fleet of replicas in one process, in virtual time, driven by a seeded schedule: reads, source
/// changes announced through the invalidator, writes through it, changes nobody announces, and
/// faults — of the second level (an outage, latency past its timeout, a partition of one replica, a
/// lost lease, garbage in an entry), of the bus (a replica disconnected, a sender whose publications
/// are refused, duplicated and delayed — so reordered — deliveries), of the source (down), restarts
/// (cold, or warm from the family's archive) and clock jumps. After every step it checks the fleet's promises (``Promise``); every few steps,
/// and at the end, it heals every fault, waits out the recovery bound, and checks that the fleet has
/// converged.
///
/// The same seed runs the same schedule: a failing seed replays with
/// `FLEET_SEED=<seed> swift test --filter FleetSimulatorTests/replay`, which prints it.
final class FleetSimulation: @unchecked Sendable {
    // @unchecked Sendable: the simulation's own fields are touched only by `run()`'s task (the
    // test's); what the operations' tasks record goes through `log` and the replicas' `served`
    // (both LockedValue).

    /// The promises checked.
    enum Promise: String, CaseIterable, Sendable {
        /// A replica never serves a version older than one it served, while the key stays in its
        /// memory (per key, per incarnation; an eviction forgets it).
        case monotonic
        /// Once the bus and the second level have been up past the recovery bound, every replica
        /// serves the latest change.
        case converges
        /// A quiet round (every fault healed) costs the source at most one call per key, however
        /// many replicas read it; and the whole run costs at most ``SourceCallBudget/bound``: its
        /// fallbacks and loads during faults, and away from faults one load per key and period, and
        /// per trigger (a change, a reconnection, a lost lease or garbage).
        case sourceCalls
        /// Every read returns within the family's timeout; every announcement within two
        /// second-level timeouts (a put, a mark) and a margin.
        case bounded
        /// The invalidator's queue stays within its capacity; a family within its capacity.
        case queues
    }

    /// A fault put in on purpose, to show that the check of each promise can fail.
    enum Sabotage: String, CaseIterable, Sendable {
        /// Reads of the second level sometimes answer an older entry with a new date (a lagging
        /// read replica that rewrites dates): breaks ``Promise/monotonic``.
        case staleReads
        /// Invalidators without recovery: a message the sender's bus refuses is lost. Breaks
        /// ``Promise/converges``.
        case noRecovery
        /// A second level whose lease is always granted: breaks ``Promise/sourceCalls``.
        case noLeases
        /// Families without a timeout, and a source that hangs 10 s instead of failing: breaks
        /// ``Promise/bounded``.
        case noTimeout
        /// The queue check told a capacity of 1 while the invalidator keeps 3: shows that the check
        /// measures the queue (``Promise/queues``).
        case queueCheckedTooTight
        /// The run's source-call bound without the reads that overlapped a fault: shows that the
        /// whole-run check counts the calls (``Promise/sourceCalls``).
        case budgetWithoutFaults
    }

    /// What a run found.
    struct Report: Sendable {
        var seed: UInt64
        var steps = 0
        var faults = 0
        var reads = 0
        var quietRounds = 0
        var sourceCalls = 0
        /// The run's source-call bound (``SourceCallBudget/bound``).
        var sourceCallBound = 0
        var warmRestarts = 0
        var violations: [(Promise, String)] = []
        var schedule: [String] = []
    }

    static let topic = "fleet"
    let seed: UInt64
    let replicaCount: Int
    let keyCount: Int
    let stepCount: Int
    let sabotage: Sabotage?

    let clock = VirtualClock(stallTimeout: .seconds(60))
    let level: InMemorySecondLevel
    let network: InMemoryInvalidationNetwork
    let source: Source
    private var random: SplitMix64
    private var replicas: [Replica] = []
    private let log = LockedValue(Report(seed: 0))
    /// Operations started and not yet finished.
    private let pending = LockedValue(0)
    /// Keys with a change or a write in flight: one at a time per key (two writes of one key racing
    /// through one replica is a race of the service's, not the fleet's).
    private let changing = LockedValue<Set<Int>>([])
    private var expiryBoundSinceQuiet = false
    private var faults = Faults()
    private var budget: SourceCallBudget
    /// When the faults in force began (`nil`: none in force).
    private var faultsSince: Duration?
    /// The replicas' calls of the source, as their second level reported them: loads as a lease's
    /// holder (by key and time), and fallbacks (a fault, a skipped second level, a wait that ran
    /// out).
    private let sourceCallsSeen = LockedValue<(loads: [(key: Int, at: Duration)], fallbacks: Int)>(([], 0))

    /// What the whole run may cost the source, as a formula of what happened in it. Each call is a
    /// flight's, and each flight's call is reported by its second level (a family without retries,
    /// on a second level): a load as the lease's holder, or a fallback — the second level failed,
    /// was skipped after a fault, or a wait for another's load ran out — which only faults cause.
    /// Loads that overlapped a fault (or the recovery bound after it) are counted as they come. Away
    /// from faults, a key is loaded only when the second level has no fresh entry a replica may
    /// take: after a trigger — a change of the key (announced, written, or not), a bus
    /// reconnection (the replica refuses the entry it held before: one load per key), a lost lease
    /// or garbage (one load per replica at most), a key restored by a warm restart (its data may be
    /// younger than the entry, taken from the source as a fallback during a fault) — or when the
    /// entry the last load wrote has expired, a lifetime less the jitter later. Two loads of a key
    /// with no trigger between them
    /// are so at least that far apart, and began at least that less the timeout apart: in
    /// different periods of that length. So the run costs at most: its fallbacks, its loads in
    /// faults, and away from faults, per key, the periods in which it was loaded plus its triggers.
    /// Fleet-wide single flight is what keeps two replicas' loads of a key apart: without leases,
    /// replicas that miss together load together, in one period, and the bound breaks.
    struct SourceCallBudget {
        var changes = 0
        var reconnections = 0
        let replicas: Int
        let keys: Int
        var lostEntries = 0
        /// Keys restored by warm restarts: restored data may be younger than the second level's
        /// entry (a fallback its replica answered during a fault), which it then refuses — one
        /// load per key restored at most.
        var restoredKeys = 0
        var fallbacks = 0
        /// Periods (of a lifetime less the jitter and the timeout) in which a key was loaded away
        /// from faults, summed over the keys.
        var loadPeriods = 0
        /// Fault windows: from a fault to the recovery bound after it ended.
        var faultWindows: [(start: Duration, end: Duration)] = []
        var loadsInFaults = 0

        var bound: Int {
            fallbacks + loadsInFaults + loadPeriods + changes + keys * reconnections + replicas * lostEntries
                + restoredKeys
        }
    }

    /// The family's and the second level's settings, and the bounds derived from them.
    static let expiry = Duration.seconds(60)
    static let timeout = Duration.seconds(2)
    static let levelTimeout = Duration.milliseconds(250)
    static let maximumFaultBackoff = Duration.seconds(4)
    static let recovery = AsyncStateInvalidator.Recovery(
        capacity: 3, backoff: .milliseconds(200), maximumBackoff: .seconds(4))
    /// How long after every fault is healed the fleet has converged: the longest recovery backoff
    /// (a queued message or mark is sent again), the longest second-level skip (a replica reads it
    /// again), the longest delivery delay, and a margin.
    static let recoveryBound = Duration.seconds(5)
    static let familyCapacity = 3

    /// Whether the families' second-level writes go behind their answers (drawn from the seed).
    let writesInBackground: Bool
    /// The second level's expiry jitter (drawn from the seed: none, or 10 s).
    let expiryJitter: Duration
    /// Whether every replica's events go into the schedule too (for a replay).
    var tracesEvents = false

    /// A simulation of `replicas` replicas (drawn from the seed, 2 to 4, when `nil`) over `keys` keys
    /// for `steps` steps.
    init(seed: UInt64, replicas: Int? = nil, keys: Int = 4, steps: Int = 40, sabotage: Sabotage? = nil) {
        self.seed = seed
        var random = SplitMix64(seed: seed)
        let replicas = replicas ?? 2 + Int(random.next() % 3)
        writesInBackground = random.next() % 2 == 0
        expiryJitter = random.next() % 2 == 0 ? .zero : .seconds(10)
        self.random = random
        budget = SourceCallBudget(replicas: replicas, keys: keys)
        (replicaCount, keyCount, stepCount, self.sabotage) = (replicas, keys, steps, sabotage)
        level = InMemorySecondLevel(clock: clock)
        network = InMemoryInvalidationNetwork(clock: clock, seed: seed ^ 0x5eed)
        source = Source(keys: keys, clock: clock, seed: seed, hangs: sabotage == .noTimeout)
        log.withLock { $0.seed = seed }
    }

    /// The faults in force.
    struct Faults {
        var levelDown = false
        var levelLatency = Duration.zero
        var partitioned: Set<Int> = []
        var disconnected: Set<Int> = []
        var refusing: Set<Int> = []
        var duplicates = false
        var delayed = false
        var sourceDown = false

        var isHealed: Bool {
            !levelDown && levelLatency == .zero && partitioned.isEmpty && disconnected.isEmpty && refusing.isEmpty
                && !duplicates && !delayed && !sourceDown
        }
    }

    // MARK: Running

    func run() async -> Report {
        note(
            "\(replicaCount) replicas, \(keyCount) keys, second-level writes \(writesInBackground ? "behind the answer" : "before it"), expiry jitter \(expiryJitter)"
        )
        for index in 0..<replicaCount { replicas.append(await makeReplica(index)) }
        for step in 1...stepCount {
            await runStep(step)
            await clock.advance(by: .milliseconds(Int64(random.next() % 400)))
            check(after: step)
            if step % 15 == 0 || step == stepCount { await quietRound(after: step) }
        }
        await heal()
        await drain()
        for replica in replicas { await replica.stop() }
        await clock.advance(by: .seconds(1))
        checkSourceCalls()
        return log.withLock { report in
            report.steps = stepCount
            report.sourceCalls = source.calls
            return report
        }
    }

    /// The whole run's source calls against ``SourceCallBudget/bound``.
    private func checkSourceCalls() {
        let period = Self.expiry - expiryJitter - Self.timeout
        let windows = budget.faultWindows
        let (loads, fallbacks) = sourceCallsSeen.withLock { $0 }
        budget.fallbacks = fallbacks
        var periods = Set<[Int64]>()
        budget.loadsInFaults = 0
        for load in loads {
            // A load began within the timeout before it was reported (a lease wait included).
            if windows.contains(where: { $0.start <= load.at && load.at - Self.timeout <= $0.end }) {
                budget.loadsInFaults += 1
            } else {
                periods.insert([Int64(load.key), Int64((load.at / period).rounded(.down))])
            }
        }
        budget.loadPeriods = periods.count
        let calls = source.calls
        if sabotage == .budgetWithoutFaults { (budget.loadsInFaults, budget.fallbacks) = (0, 0) }
        log.withLock { $0.sourceCallBound = budget.bound }
        if calls > budget.bound {
            violate(
                .sourceCalls,
                "the run cost \(calls) source calls, more than \(budget.bound): \(budget.fallbacks) fallbacks + "
                    + "\(budget.loadsInFaults) loads in faults + \(budget.loadPeriods) periods with loads + "
                    + "\(budget.changes) changes + \(keyCount) keys × \(budget.reconnections) reconnections + "
                    + "\(replicaCount) replicas × \(budget.lostEntries) lost entries + \(budget.restoredKeys) keys restored"
            )
        }
    }

    /// Records what a replica's second level reported of a load of `key`: a call of the source.
    func secondLevelReported(_ event: AsyncStateSecondLevelEvent, key: String?) {
        guard let key = key.flatMap(Int.init) else { return }
        let at = clock.now.offset
        switch event {
        case .loaded:
            sourceCallsSeen.withLock { $0.loads.append((key, at)) }
        case .writeRefused:
            // With writes in the background a refused write follows its load's `.loaded`.
            if !writesInBackground { sourceCallsSeen.withLock { $0.loads.append((key, at)) } }
        case .fault, .skipped, .waitRanOut:
            sourceCallsSeen.withLock { $0.fallbacks += 1 }
        default:
            break
        }
    }

    /// Opens a fault window when faults come into force, closes it (a recovery bound later) when
    /// the last is healed.
    private func faultsChanged() {
        let now = clock.now.offset
        if !faults.isHealed {
            if faultsSince == nil { faultsSince = now }
        } else if let since = faultsSince {
            budget.faultWindows.append((since, now + Self.recoveryBound))
            faultsSince = nil
        }
    }

    func noteEvent(_ line: String) { note(line) }

    private func note(_ line: String) {
        let at = clock.now.offset
        let seconds = Double(at.components.seconds) + Double(at.components.attoseconds) / 1e18
        log.withLock { $0.schedule.append("t=\(String(format: "%.3f", seconds)) s \(line)") }
    }

    private func violate(_ promise: Promise, _ message: String) {
        log.withLock { $0.violations.append((promise, message)) }
    }

    private func draw(_ bound: Int) -> Int { Int(random.next() % UInt64(bound)) }

    private func runStep(_ step: Int) async {
        let r = draw(replicaCount)
        let k = draw(keyCount)
        switch draw(100) {
        case 0..<40: read(r, k)
        case 40..<50: change(r, k, announced: true)
        case 50..<60: write(r, k)
        case 60..<63: change(r, k, announced: false)
        case 63..<68: await restart(r)
        case 68..<72:
            let jump = Duration.seconds(Int64(5 + draw(90)))
            note("step \(step): clock jumps \(jump)")
            await clock.advance(by: jump)
        default: await fault(r, k)
        }
    }

    // MARK: Operations

    /// Starts `body` as an operation: counted as pending until it ends, its duration checked
    /// against `bound`.
    private func operation(_ name: String, bound: Duration, _ body: @escaping @Sendable () async -> Void) {
        pending.withLock { $0 += 1 }
        let started = clock.now.offset
        clock.task { [self] in
            await body()
            let took = clock.now.offset - started
            if took > bound { violate(.bounded, "\(name) took \(took), more than \(bound)") }
            pending.withLock { $0 -= 1 }
        }
    }

    private func read(_ r: Int, _ k: Int) {
        let replica = replicas[r]
        log.withLock { $0.reads += 1 }
        note("read r\(r) k\(k)")
        operation("read r\(r) k\(k)", bound: Self.timeout + .milliseconds(1)) { [source] in
            let value = try? await replica.family.value(for: k, source.operation)
            guard let value else { return }
            replica.served(value, for: k) { served in
                self.violate(.monotonic, "r\(r) served k\(k) = v\(value) after serving v\(served)")
            }
        }
    }

    private func change(_ r: Int, _ k: Int, announced: Bool) {
        guard changing.withLock({ $0.insert(k).inserted }) else { return }
        let version = source.change(k)
        budget.changes += 1
        guard announced else {
            changing.withLock { _ = $0.remove(k) }
            expiryBoundSinceQuiet = true
            note("source k\(k) → v\(version), not announced")
            return
        }
        note("source k\(k) → v\(version), announced by r\(r)")
        let replica = replicas[r]
        replica.announcing.withLock { $0 += 1 }
        operation("invalidate r\(r) k\(k)", bound: Self.levelTimeout * 2 + .milliseconds(100)) { [changing] in
            _ = try? await replica.invalidator.invalidate(Self.topic, key: "\(k)")
            replica.announcing.withLock { $0 -= 1 }
            changing.withLock { _ = $0.remove(k) }
        }
    }

    private func write(_ r: Int, _ k: Int) {
        guard changing.withLock({ $0.insert(k).inserted }) else { return }
        let version = source.change(k)
        budget.changes += 1
        note("write k\(k) = v\(version) through r\(r)")
        let replica = replicas[r]
        replica.announcing.withLock { $0 += 1 }
        operation("set r\(r) k\(k)", bound: Self.levelTimeout * 2 + .milliseconds(100)) { [changing] in
            _ = try? await replica.invalidator.set(version, for: k, in: replica.family, topic: Self.topic)
            replica.announcing.withLock { $0 -= 1 }
            replica.served(version, for: k) { _ in }  // its own write: what it serves from now
            changing.withLock { _ = $0.remove(k) }
        }
    }

    private func restart(_ r: Int) async {
        let old = replicas[r]
        // A crash: what its invalidator still owed is lost, and the fleet learns of that change at
        // expiry (the documented bound), as of a change nobody announced.
        let owed = old.invalidator.messagesPending + old.announcing.withLock { $0 }
        if owed > 0 { expiryBoundSinceQuiet = true }
        // Warm (its families' archive saved at the stop and restored at the start) or cold.
        let archive = draw(2) == 0 ? old.family.archive : nil
        note(
            "restart r\(r)\(archive.map { " warm, \($0.count) keys restored" } ?? " cold")"
                + "\(owed > 0 ? ", losing \(owed) queued or unsent announcements" : "")")
        await old.stop()
        replicas[r] = await makeReplica(r)
        if let archive {
            budget.restoredKeys += (try? replicas[r].family.restore(archive)) ?? 0
            log.withLock { $0.warmRestarts += 1 }
        }
        faults.partitioned.remove(r)
        faults.disconnected.remove(r)
        faults.refusing.remove(r)
        faultsChanged()
    }

    private func fault(_ r: Int, _ k: Int) async {
        log.withLock { $0.faults += 1 }
        switch draw(11) {
        case 0:
            faults.levelDown.toggle()
            level.isDown = faults.levelDown
            note("second level \(faults.levelDown ? "down" : "up")")
        case 1:
            let latencies: [Duration] = [.zero, .milliseconds(5), .milliseconds(100), .milliseconds(400)]
            faults.levelLatency = latencies[draw(latencies.count)]
            level.latency = faults.levelLatency
            note("second level latency \(faults.levelLatency)")
        case 2:
            let partitioned = !faults.partitioned.contains(r)
            if partitioned { faults.partitioned.insert(r) } else { faults.partitioned.remove(r) }
            replicas[r].connection.isPartitioned = partitioned
            note("r\(r) \(partitioned ? "cut off from" : "back to") the second level")
        case 3:
            if faults.disconnected.contains(r) {
                faults.disconnected.remove(r)
                replicas[r].bus.reconnect()
                budget.reconnections += 1
                note("r\(r)'s bus reconnects")
            } else {
                faults.disconnected.insert(r)
                replicas[r].bus.disconnect()
                note("r\(r)'s bus disconnects")
            }
        case 4:
            let refusing = !faults.refusing.contains(r)
            if refusing { faults.refusing.insert(r) } else { faults.refusing.remove(r) }
            replicas[r].bus.refusesPublishing = refusing
            note("r\(r)'s publications \(refusing ? "refused" : "taken again")")
        case 5:
            faults.duplicates.toggle()
            network.duplicatesDeliveries = faults.duplicates
            note("deliveries \(faults.duplicates ? "duplicated" : "single")")
        case 6:
            faults.delayed.toggle()
            network.deliveryDelay = faults.delayed ? .zero ... .milliseconds(50) : nil
            note("deliveries \(faults.delayed ? "delayed 0-50 ms (reordered)" : "at once")")
        case 7:
            faults.sourceDown.toggle()
            source.isDown = faults.sourceDown
            note("source \(faults.sourceDown ? "down" : "up")")
        case 8:
            level.loseLease(on: "n:\(k)")
            lostEntry()
            note("lease on k\(k) lost")
        case 9:
            if var entry = level.entry(for: "n:\(k)") {
                entry.payload = Array("garbage".utf8)
                level.overwrite(entry, for: "n:\(k)")
                lostEntry()
                note("garbage in k\(k)'s entry (v\(entry.version))")
            }
        default:
            note("nothing")
        }
        faultsChanged()
    }

    /// A lost lease or entry: a fault of a moment, and a fault window of a recovery bound.
    private func lostEntry() {
        let now = clock.now.offset
        budget.lostEntries += 1
        budget.faultWindows.append((now, now + Self.recoveryBound))
    }

    // MARK: Checks

    private func check(after step: Int) {
        let capacity = sabotage == .queueCheckedTooTight ? 1 : Self.recovery.capacity
        for (index, replica) in replicas.enumerated() {
            let queued = replica.invalidator.messagesPending
            if queued > capacity {
                violate(.queues, "after step \(step), r\(index) holds \(queued) messages, cap \(capacity)")
            }
            let count = replica.family.count
            if count > Self.familyCapacity {
                violate(
                    .queues, "after step \(step), r\(index) holds \(count) entries, capacity \(Self.familyCapacity)")
            }
        }
    }

    /// Heals every fault, waits out the recovery bound (and the expiry, if a change was not
    /// announced), then reads every key on every replica at once: each must serve the source's
    /// latest version, and the round must cost at most one source call per key.
    private func quietRound(after step: Int) async {
        await heal()
        await drain()
        await clock.advance(by: Self.recoveryBound)
        if expiryBoundSinceQuiet {
            // A change announced by nobody, or whose announcement a crash lost: the fleet learns of
            // it at expiry (every replica's and the second level's entry): one expiry more.
            await clock.advance(by: Self.expiry)
            expiryBoundSinceQuiet = false
        }
        note("quiet round after step \(step)")
        log.withLock { $0.quietRounds += 1 }
        let callsBefore = source.calls
        let results = LockedValue<[String]>([])
        for (r, replica) in replicas.enumerated() {
            for k in 0..<keyCount {
                operation("quiet read r\(r) k\(k)", bound: Self.timeout + .milliseconds(1)) { [source] in
                    let value = try? await replica.family.value(for: k, source.operation)
                    let latest = source.version(k)
                    if value != latest {
                        results.withLock {
                            $0.append(
                                "r\(r) serves k\(k) = \(value.map { "v\($0)" } ?? "an error"), the latest is v\(latest)"
                            )
                        }
                    }
                    if let value { replica.served(value, for: k) { _ in } }
                }
            }
        }
        await drain()
        for line in results.withLock({ $0 }) { violate(.converges, "after step \(step): \(line)") }
        let calls = source.calls - callsBefore
        if calls > keyCount {
            violate(.sourceCalls, "the quiet round after step \(step) cost \(calls) source calls for \(keyCount) keys")
        }
    }

    private func heal() async {
        level.isDown = false
        level.latency = .zero
        for (index, replica) in replicas.enumerated() {
            replica.connection.isPartitioned = false
            replica.bus.refusesPublishing = false
            if faults.disconnected.contains(index) {
                replica.bus.reconnect()
                budget.reconnections += 1
            }
        }
        network.duplicatesDeliveries = false
        network.deliveryDelay = nil
        source.isDown = false
        faults = Faults()
        faultsChanged()
    }

    /// Advances until every operation started has ended (at most a minute of virtual time).
    private func drain() async {
        for _ in 0..<600 where pending.withLock({ $0 }) > 0 { await clock.advance(by: .milliseconds(100)) }
        if pending.withLock({ $0 }) > 0 { violate(.bounded, "operations still running a minute after they started") }
    }

    // MARK: Replicas

    private func makeReplica(_ index: Int) async -> Replica {
        let connection = level.replica()
        let levelView: any AsyncStateSecondLevel =
            switch sabotage {
            case .staleReads: StaleReads(connection: connection, clock: clock)
            case .noLeases: AlwaysGranted(connection: connection)
            default: connection
            }
        // What the replica served of a key it no longer holds is forgotten with the key: the promise
        // is kept while the key stays in its memory (an evicted key comes back as the second level
        // or the source has it).
        let newest = LockedValue<[Int: Int]>([:])
        let family = AsyncStateFamily<Int, Int>(
            expiry: Self.expiry, capacity: Self.familyCapacity, clock: clock,
            timeout: sabotage == .noTimeout ? nil : Self.timeout, maxStaleAge: .seconds(300),
            onRemoval: { key, _, reason in
                if reason != .replaced { newest.withLock { _ = $0.removeValue(forKey: key) } }
            },
            name: "r\(index)", observer: EventTrace(simulation: self, writes: tracesEvents),
            secondLevel: AsyncStateSecondLevelOptions(
                level: levelView, namespace: "n", codec: .json, timeout: Self.levelTimeout,
                leaseDuration: .seconds(3), maximumFaultBackoff: Self.maximumFaultBackoff,
                writesInBackground: writesInBackground, expiryJitter: expiryJitter))
        let bus = network.bus()
        let invalidator = AsyncStateInvalidator(
            bus: bus, invalidateAllInterval: .zero, clock: clock,
            recovery: sabotage == .noRecovery ? nil : Self.recovery)
        invalidator.subscribe(family, to: Self.topic)
        let runner = clock.task { await invalidator.run() }
        await clock.advance(by: .zero)
        return Replica(
            family: family, invalidator: invalidator, bus: bus, connection: connection, runner: runner, newest: newest)
    }
}
