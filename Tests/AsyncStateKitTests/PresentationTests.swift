import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

/// What one presentation call saw: the case `fold` chose and what it was given.
private enum Presented: Equatable {
    case initial
    case loading(previous: [Int]?)
    case empty
    case success([Int], Date)
    case failure(code: Int, previous: [Int]?)
}

private func present(_ snapshot: AsyncSnapshot<[Int]>) -> Presented {
    snapshot.fold(
        initial: { .initial },
        loading: { .loading(previous: $0) },
        empty: { .empty },
        success: { .success($0, $1) },
        failure: { error, previous in .failure(code: (error as? SourceDown)?.code ?? -1, previous: previous) })
}

@Suite struct PresentationTests {
    @Test func theKindOfEveryPhaseIsItsCaseWithoutThePayload() {
        let phases: [AsyncPhase] = [
            .initial, .loading, .empty, .success(virtualDate(1)), .failure(SourceDown(code: 1)),
        ]
        #expect(phases.map(\.kind) == [.initial, .loading, .empty, .success, .failure])
        #expect(phases.map(\.kind.rawValue) == phases.map(\.name))
        #expect(AsyncPhase.Kind.allCases == [.initial, .loading, .empty, .success, .failure])
        // Two successes at different dates, or failures with different errors, are the same kind.
        #expect(AsyncPhase.success(virtualDate(1)).kind == AsyncPhase.success(virtualDate(2)).kind)
        #expect(AsyncPhase.failure(SourceDown(code: 1)).kind == AsyncPhase.failure(CancellationError()).kind)
        #expect(Set(phases.map(\.kind)).count == 5)
        #expect("\(AsyncPhase.Kind.failure)" == "failure")
    }

    @Test func foldPresentsEveryPhaseOfAStateAndThePreviousValueOnlyWhenThereIsOne() async throws {
        let clock = VirtualClock()
        let state = AsyncState<[Int]>(wrappedValue: [0], clock: clock)
        let source = Source<[Int]>()
        #expect(present(state.snapshot) == .initial)  // the initial value [0] is not a previous value

        // Loading with nothing to show yet, then a success at the clock's date.
        let first = clock.task { await state.fetch(source.operation(on: clock, delay: .seconds(1), value: [1])) }
        await clock.settle()
        #expect(present(state.snapshot) == .loading(previous: nil))
        await clock.advance(by: .seconds(1))
        try await first.value
        #expect(present(state.snapshot) == .success([1], clock.date))

        // A refresh loads with the previous value presentable, then fails keeping it.
        let failing = source.operation(on: clock, delay: .seconds(1), value: [9], error: SourceDown(code: 503))
        let second = clock.task { await state.refresh(failing) }
        await clock.settle()
        #expect(present(state.snapshot) == .loading(previous: [1]))
        await clock.advance(by: .seconds(1))
        try await second.value
        #expect(present(state.snapshot) == .failure(code: 503, previous: [1]))

        // An empty answer; then a reset forgets every value.
        await state.refresh { [] }
        #expect(present(state.snapshot) == .empty)
        await state.reset()
        #expect(present(state.snapshot) == .initial)
        #expect(state.snapshot.previousValue == nil)

        // A failure with no value before it has nothing to present but the error.
        await state.fetch { throw SourceDown(code: 500) }
        #expect(present(state.snapshot) == .failure(code: 500, previous: nil))

        // A value that was `set` (no fetch ever succeeded) is a previous value too, dated by its write.
        await state.set([7])
        await state.refresh { throw SourceDown(code: 502) }
        #expect(state.snapshot.lastSuccess != nil && state.snapshot.successCount == 0)
        #expect(present(state.snapshot) == .failure(code: 502, previous: [7]))
    }

    @Test func aFamilyEntryPresentsTheSameWayLiveOrCompact() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<Int, [Int]>(expiry: .seconds(60), clock: clock)
        #expect(try await family.value(for: 1) { [$0] } == [1])
        // Not in use any more: the entry is compact, and still presents its value and date.
        guard case .compact = family.core.peek(1) else {
            Issue.record("the settled entry was not compacted")
            return
        }
        let snapshot = try #require(family.snapshot(for: 1))
        #expect(snapshot.hasValue)
        #expect(snapshot.previousValue == .some([1]))
        let presented = snapshot.fold(
            initial: { "initial" }, loading: { _ in "loading" }, empty: { "empty" },
            success: { value, date in "\(value ?? []) at \(date == clock.date)" }, failure: { _, _ in "failure" })
        #expect(presented == "[1] at true")
    }

    @Test func aSnapshotBuiltByHandDerivesWhetherItHasAValue() {
        #expect(!AsyncSnapshot(value: 0, phase: .initial, isExpired: true).hasValue)
        #expect(!AsyncSnapshot(value: 0, phase: .failure(SourceDown(code: 1)), isExpired: true).hasValue)
        #expect(AsyncSnapshot(value: 0, phase: .empty, isExpired: false).hasValue)
        #expect(AsyncSnapshot(value: 0, phase: .loading, isExpired: true, lastSuccess: virtualDate(0)).hasValue)
        #expect(AsyncSnapshot(value: 0, phase: .loading, isExpired: true, hasValue: true).previousValue == 0)
    }
}

/// `snapshot(retry:_:)`: the value and its metadata from one read, answered like `value`.
@Suite struct SnapshotReadTests {
    @Test func aMissWaitsForTheFetchAndAHitAnswersAtOnceWithTheSameSnapshot() async throws {
        let clock = VirtualClock()
        let state = AsyncState<[Int]>(wrappedValue: [], expiry: .seconds(60), clock: clock)
        let source = Source<[Int]>()
        let load = source.operation(on: clock, delay: .seconds(2), value: [1])
        let caller = clock.task { try await state.snapshot(load) }
        await clock.advance(by: .seconds(2))
        let fetched = try await caller.value
        #expect(fetched.value == [1])
        #expect(fetched.phase.lastUpdated == clock.date)
        #expect(fetched.lastSuccess == clock.date)
        #expect(!fetched.isExpired)
        await clock.advance(by: .seconds(30))
        let hit = try await state.snapshot(load)
        #expect(source.runs == 1)
        #expect(hit.value == [1] && hit.lastSuccess == fetched.lastSuccess && !hit.isExpired)
        // Expired: the next call goes to the source again and reports the new date.
        await clock.advance(by: .seconds(30))
        let again = clock.task { try await state.snapshot(load) }
        await clock.advance(by: .seconds(2))
        #expect(try await again.value.lastSuccess == clock.date)
        #expect(source.runs == 2)
    }

    @Test func aFailureIsTheSnapshotsPhaseWithThePreviousValueNotAnError() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock)
        let none = try await state.snapshot { throw SourceDown(code: 503) }
        #expect(none.phase.error as? SourceDown == SourceDown(code: 503))
        #expect(none.previousValue == nil)
        await state.set(5)
        await clock.advance(by: .seconds(10))
        let failed = try await state.snapshot { throw SourceDown(code: 502) }
        #expect(failed.phase.kind == .failure)
        #expect(failed.previousValue == 5)
        #expect(failed.isExpired)
        #expect(failed.failureCount == 1)
    }

    @Test func underStaleWhileRevalidateTheStaleValueComesAtOnceWhileItLoads() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, expiry: .seconds(10), clock: clock, staleWhileRevalidate: true)
        let source = Source<Int>()
        await state.set(1)
        await clock.advance(by: .seconds(11))
        let stale = try await state.snapshot(source.operation(on: clock, delay: .seconds(5), value: 2))
        #expect(stale.value == 1)
        #expect(stale.phase.kind == .loading)
        #expect(stale.isExpired)
        #expect(stale.previousValue == 1)
        await clock.advance(by: .seconds(5))
        #expect(state.snapshot.value == 2)
        #expect(source.runs == 1)
    }

    @Test func aCancelledCallerGetsCancellationErrorAndTheFetchGoesOnForOthers() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        let load = Source<Int>().operation(on: clock, delay: .seconds(5), value: 7)
        let leaving = clock.task { try await state.snapshot(load) }
        let staying = clock.task { try await state.snapshot(load) }
        await clock.advance(by: .seconds(1))
        leaving.cancel()
        await #expect(throws: CancellationError.self) { try await leaving.value }
        await clock.advance(by: .seconds(4))
        #expect(try await staying.value.value == 7)
    }

    @Test func errorsNoFetchPutInThePhaseAreThrown() async throws {
        let clock = VirtualClock()
        let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
        await #expect(throws: AsyncStateError.reentrantCall) {
            _ = try await state.snapshot { try await state.snapshot { 1 }.value }
        }
        #expect(state.phase.kind == .failure)  // the outer fetch failed with the inner call's error
    }

    @Test func aFamilyAnswersWithTheKeysSnapshotLiveOrCompact() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<Int, String>(expiry: .seconds(60), clock: clock)
        let source = Source<String>()
        let load = source.operation(on: clock, delay: .seconds(1), value: "three")
        let caller = clock.task { try await family.snapshot(for: 3) { _ in try await load() } }
        await clock.advance(by: .seconds(1))
        let fetched = try await caller.value
        #expect(fetched.value == "three" && fetched.lastSuccess == clock.date && !fetched.isExpired)
        // Settled and unused: compact; a hit reads it from the shard, without the source.
        guard case .compact = family.core.peek(3) else {
            Issue.record("the settled entry was not compacted")
            return
        }
        let hit = try await family.snapshot(for: 3) { _ in "never" }
        #expect(hit.value == "three" && hit.lastSuccess == fetched.lastSuccess && hit.phase.kind == .success)
        let failed = try await family.snapshot(for: 4) { _ in throw SourceDown(code: 404) }
        #expect(failed.phase.error as? SourceDown == SourceDown(code: 404))
        #expect(failed.value == nil && failed.previousValue == nil)
        #expect(source.runs == 1)
    }
}

/// The README's and the article's paging and presentation examples, run.
@Suite struct PagingAndPresentingExampleTests {
    @Test func theOrdersServiceReadsPagesAndWalksTheListing() async throws {
        let service = OrdersService()
        #expect(try await service.firstPage().count == 100)
        #expect(try await service.nextPage().count == 200)
        #expect(try await service.countAll() == 250)
        #expect(try await service.nextPage().count == 250)  // the end: nothing more to read
    }

    @Test func theHTTPMappingAnswersEveryPhase() async throws {
        let clock = VirtualClock()
        let service = TenantConfigService(expiry: .seconds(60), clock: clock)
        let config = service.$config
        #expect(answer(for: config.snapshot, now: clock.date) == HTTPAnswer(status: 503, headers: ["Retry-After": "1"]))
        _ = try await config.snapshot { "flags: on" }
        await clock.advance(by: .seconds(90))
        // Expired, and the source fails: the last good value, 90 s old.
        let failed = try await config.snapshot { throw SourceDown(code: 500) }
        #expect(answer(for: failed, now: clock.date) == HTTPAnswer(status: 200, headers: ["Age": "90"]))
        // The handler form, on the real date: a fresh value is as old as the call took (whole
        // seconds; 0 unless the machine is very busy).
        let start = Date()
        let fresh = try await handle(AsyncState(wrappedValue: ""), load: { "flags: off" })
        let elapsed = Int(Date().timeIntervalSince(start))
        #expect(fresh.status == 200)
        let age = try #require(fresh.headers["Age"].flatMap { Int($0) })
        #expect((0...elapsed).contains(age))
    }
}
