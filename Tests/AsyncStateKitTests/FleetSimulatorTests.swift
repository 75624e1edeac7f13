import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// The fleet's promises over seeded schedules of reads, changes, writes and faults
/// (``FleetSimulation``). `FLEET_SEEDS=<n>` runs more seeds (`FLEET_FIRST_SEED` moves the first);
/// `FLEET_SEED=<seed>` replays one and prints its schedule. Serialized: one batch at a time, so that
/// the simulator keeps one core busy, not both, beside the tests that run on the real clock.
@Suite(.serialized) struct FleetSimulatorTests {
    static let environment = ProcessInfo.processInfo.environment
    static let seedCount = environment["FLEET_SEEDS"].flatMap(Int.init) ?? 500
    static let firstSeed = environment["FLEET_FIRST_SEED"].flatMap(UInt64.init) ?? 1

    /// The seeds, in batches (each a test case, reported apart).
    static let batches: [ClosedRange<UInt64>] = {
        let size = max(1, seedCount / 20)
        return stride(from: 0, to: seedCount, by: size).map { start in
            firstSeed + UInt64(start)...firstSeed + UInt64(min(start + size, seedCount) - 1)
        }
    }()

    @Test(arguments: batches)
    func everyPromiseHoldsOverSeededSchedules(seeds: ClosedRange<UInt64>) async {
        var totals = (steps: 0, faults: 0, reads: 0, quiet: 0, calls: 0, bound: 0, warm: 0)
        for seed in seeds {
            let report = await FleetSimulation(seed: seed).run()
            totals.steps += report.steps
            totals.faults += report.faults
            totals.reads += report.reads
            totals.quiet += report.quietRounds
            totals.calls += report.sourceCalls
            totals.bound += report.sourceCallBound
            totals.warm += report.warmRestarts
            guard report.violations.isEmpty else {
                Issue.record(
                    """
                    seed \(seed) broke \(report.violations.map { "\($0.0): \($0.1)" }.joined(separator: "; ")). \
                    Replay: FLEET_SEED=\(seed) swift test --filter FleetSimulatorTests/replay
                    """)
                return
            }
        }
        if Self.seedCount > 500 {
            print(
                "fleet seeds \(seeds): \(totals.steps) steps, \(totals.faults) faults, \(totals.reads) reads, "
                    + "\(totals.warm) warm restarts, \(totals.quiet) quiet rounds, \(totals.calls) source calls "
                    + "(bound \(totals.bound)), 0 violations")
        }
    }

    /// Each promise, broken on purpose, is caught within the first 100 seeds.
    @Test(arguments: FleetSimulation.Sabotage.allCases)
    func eachBrokenPromiseIsCaught(sabotage: FleetSimulation.Sabotage) async {
        let expected: FleetSimulation.Promise =
            switch sabotage {
            case .staleReads: .monotonic
            case .noRecovery: .converges
            case .noLeases: .sourceCalls
            case .noTimeout: .bounded
            case .queueCheckedTooTight: .queues
            case .budgetWithoutFaults: .sourceCalls
            }
        for seed in UInt64(1)...100 {
            let report = await FleetSimulation(seed: seed, sabotage: sabotage).run()
            let caught = report.violations.contains { promise, message in
                promise == expected
                    && (sabotage != .budgetWithoutFaults && sabotage != .noLeases || message.hasPrefix("the run cost"))
            }
            if caught { return }
        }
        Issue.record("\(sabotage) broke \(expected) in none of 100 seeds")
    }

    /// `FLEET_SEED=<seed>`: runs that seed and prints its schedule and what it found.
    @Test(.enabled(if: environment["FLEET_SEED"] != nil))
    func replay() async {
        let seed = Self.environment["FLEET_SEED"].flatMap(UInt64.init) ?? 0
        let simulation = FleetSimulation(seed: seed)
        simulation.tracesEvents = Self.environment["FLEET_TRACE"] != nil
        let report = await simulation.run()
        print(report.schedule.joined(separator: "\n"))
        for (promise, message) in report.violations { print("VIOLATION \(promise): \(message)") }
        #expect(report.violations.isEmpty)
    }
}
