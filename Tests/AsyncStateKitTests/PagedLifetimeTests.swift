import AsyncStateKit
import AsyncStateTesting
import Foundation
import Testing

/// An actor owning a paged state whose operations capture the actor.
actor PagedOwner {
    @AsyncPagedState<Int, Int> var numbers: [Int]
    let clock: any Clock<Duration>
    let script: LoadScript
    let freed: DeinitFlag

    init(clock: any Clock<Duration>, script: LoadScript, freed: DeinitFlag, expiry: Duration) {
        _numbers = AsyncPagedState(expiry: expiry, clock: clock)
        (self.clock, self.script, self.freed) = (clock, script, freed)
    }
    deinit { freed.set() }

    func page(_ cursor: Int?) async throws -> AsyncPage<Int, Int> {
        let value = try await script.load(on: clock)
        let index = cursor ?? 0
        return AsyncPage(items: [value], next: index < 2 ? index + 1 : nil)
    }
    func current() async throws -> Int {
        try await $numbers.items { cursor in try await self.page(cursor) }.first ?? -1
    }
    func more() async throws -> Int { try await $numbers.loadMore { cursor in try await self.page(cursor) }.itemCount }
    func walk() async throws -> Int {
        var count = 0
        for try await _ in $numbers.allItems({ cursor in try await self.page(cursor) }) { count += 1 }
        return count
    }
}

// As `OwnerLifetimeTests`, for a paged state: an owner captured by its operations is freed after a
// first page that succeeded, failed or was cancelled, after a page appended, and after a walk.
@Suite struct PagedLifetimeTests {
    enum Scenario: String, CaseIterable, Sendable {
        case afterSuccess, afterFailure, afterCancel, afterLoadMore, afterWalk
    }

    @Test(arguments: World.Kind.allCases)
    func anOwnerCapturedByItsPagedOperationsIsFreed(_ kind: World.Kind) async throws {
        for scenario in Scenario.allCases { try await check(scenario, World(kind: kind)) }
    }

    func check(_ scenario: Scenario, _ world: World) async throws {
        let script = LoadScript()
        let freed = DeinitFlag()
        var owner: PagedOwner? = PagedOwner(clock: world.clock, script: script, freed: freed, expiry: world.unit * 10)
        let comment = Comment(rawValue: "\(scenario) \(world.kind)")

        switch scenario {
        case .afterSuccess, .afterFailure, .afterCancel:
            try await exerciseCommonScenario(
                scenario.rawValue, current: { [owner] in try await owner!.current() }, script: script, world: world,
                comment: comment)
        case .afterLoadMore:
            #expect(try await owner!.current() == 1, comment)
            #expect(try await owner!.more() == 2, comment)
        case .afterWalk:
            #expect(try await owner!.walk() == 3, comment)
        }
        await expectReleased({ owner = nil }, freed: freed, script: script, world: world, comment: comment)
    }
}

/// A paged state's durations at their extremes, on `ContinuousClock` (which traps on overflow where
/// `VirtualClock` does not).
@Suite struct PagedExtremeDurationTests {
    @Test(arguments: [Duration.seconds(Int64.max), .seconds(-Int64.max), .zero])
    func extremeDurationsNeverTrap(_ duration: Duration) async throws {
        let state = AsyncPagedState<Int, Int>(
            expiry: duration, timeout: duration, failureExpiry: duration, maxPages: Int.max)
        let read: AsyncPagedState<Int, Int>.Operation = { cursor in
            AsyncPage(items: [cursor ?? 0], next: (cursor ?? 0) < 3 ? (cursor ?? 0) + 1 : nil)
        }
        #expect(try await state.items(read) == [0])
        try await state.loadMore(read)
        await state.invalidate()
        var all: [Int] = []
        for try await item in state.allItems(read) { all.append(item) }
        #expect(all == [0, 1, 2, 3])
    }
}
