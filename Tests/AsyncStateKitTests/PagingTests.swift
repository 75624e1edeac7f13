import AsyncStateKit
import AsyncStateTesting
import Foundation
import Testing

/// A listing of the items `offset..<offset + count`, read `pageSize` at a time with an `Int` cursor
/// (the index of the page's first item), each read taking `delay` on the clock. Reads at a cursor in
/// `failing` throw; every read is logged.
final class Listing: Sendable {
    private struct Script {
        var count: Int
        var offset = 0
        var failing: Set<Int> = []
        var reads: [Int?] = []
        var cancelled = 0
    }

    private let script: LockedValue<Script>
    let pageSize: Int

    init(count: Int, pageSize: Int = 10) {
        script = LockedValue(Script(count: count))
        self.pageSize = pageSize
    }

    /// The cursors read so far (`nil`: the first page), in order.
    var reads: [Int?] { script.withLock { $0.reads } }
    /// Reads cancelled while they slept.
    var cancelled: Int { script.withLock { $0.cancelled } }

    func fail(at cursor: Int?) { _ = script.withLock { $0.failing.insert(cursor ?? 0) } }
    func heal() { script.withLock { $0.failing = [] } }
    /// The listing changes at the source: every item shifts by `offset`.
    func shift(by offset: Int) { script.withLock { $0.offset = offset } }

    func operation(on clock: VirtualClock, delay: Duration = .seconds(1)) -> AsyncPagedState<Int, Int>.Operation {
        { [self] cursor in
            script.withLock { $0.reads.append(cursor) }
            do {
                try await clock.sleep(for: delay)
            } catch {
                script.withLock { $0.cancelled += 1 }
                throw error
            }
            let start = cursor ?? 0
            let (count, offset, failing) = script.withLock { ($0.count, $0.offset, $0.failing) }
            if failing.contains(start) { throw SourceDown(code: 500 + start) }
            let end = min(start + pageSize, count)
            return AsyncPage(items: Array(start..<end).map { $0 + offset }, next: end < count ? end : nil)
        }
    }
}

/// Reads `state`'s first page with `listing`'s one-second operation, moving `clock` past it.
func readFirstPage(of state: AsyncPagedState<Int, Int>, from listing: Listing, on clock: VirtualClock) async throws {
    let first = clock.task { try await state.items(listing.operation(on: clock)) }
    await clock.advance(by: .seconds(1))
    _ = try await first.value
}

@Suite struct PagingTests {
    @Test func firstPageThenMorePagesUntilTheEndOfTheListing() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 25)
        let state = AsyncPagedState<Int, Int>(clock: clock)
        let read = listing.operation(on: clock)
        #expect(state.hasMore && state.pageCount == 0 && state.phase.kind == .initial)

        let first = clock.task { try await state.items(read) }
        await clock.settle()
        #expect(state.activity == .loadingFirstPage)
        await clock.advance(by: .seconds(1))
        #expect(try await first.value == Array(0..<10))
        #expect(state.activity == .idle)
        #expect(state.nextCursor == 10 && state.hasMore && state.pageCount == 1)
        #expect(state.phase.lastUpdated == clock.date)

        // The next page: the items read so far stay readable while it loads.
        let second = clock.task { try await state.loadMore(read) }
        await clock.settle()
        #expect(state.activity == .loadingMore)
        #expect(state.wrappedValue == Array(0..<10))
        await clock.advance(by: .seconds(1))
        #expect(try await second.value.items == Array(0..<20))

        let third = clock.task { try await state.loadMore(read) }
        await clock.advance(by: .seconds(1))
        #expect(try await third.value.loadedPages == 3)
        #expect(state.wrappedValue == Array(0..<25))
        #expect(!state.hasMore && state.nextCursor == nil)

        // At the end of the listing, loadMore answers at once without reading.
        #expect(try await state.loadMore(read).itemCount == 25)
        #expect(listing.reads == [nil, 10, 20])
        // Fresh: items answers from the state.
        #expect(try await state.items(read).count == 25)
        #expect(listing.reads.count == 3)
    }

    @Test func concurrentLoadMoreCallsShareOneRead() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 100)
        let state = AsyncPagedState<Int, Int>(clock: clock)
        let read = listing.operation(on: clock)
        try await readFirstPage(of: state, from: listing, on: clock)
        let callers = (0..<10).map { _ in clock.task { try await state.loadMore(read) } }
        await clock.advance(by: .seconds(1))
        for caller in callers { #expect(try await caller.value.loadedPages == 2) }
        #expect(listing.reads == [nil, 10])
    }

    @Test func aFailedMiddlePageKeepsEveryItemAndIsRetriedAlone() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 30)
        let state = AsyncPagedState<Int, Int>(clock: clock)
        let read = listing.operation(on: clock)
        try await readFirstPage(of: state, from: listing, on: clock)

        listing.fail(at: 10)
        let failing = clock.task { try await state.loadMore(read) }
        await clock.advance(by: .seconds(1))
        await #expect(throws: SourceDown(code: 510)) { try await failing.value }
        #expect(state.wrappedValue == Array(0..<10))
        #expect(state.phase.error as? SourceDown == SourceDown(code: 510))
        #expect(state.nextCursor == 10 && state.pageCount == 1)

        listing.heal()
        let retried = clock.task { try await state.loadMore(read) }
        await clock.advance(by: .seconds(1))
        #expect(try await retried.value.items == Array(0..<20))
        #expect(listing.reads == [nil, 10, 10])
        #expect(state.phase.kind == .success)
    }

    @Test func aPageIsRetriedByThePolicyAndTimesOutLikeAnyFetch() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 30)
        let state = AsyncPagedState<Int, Int>(
            clock: clock, retry: RetryPolicy(maxAttempts: 2, backoff: .constant(.seconds(1))), timeout: .seconds(5))
        try await readFirstPage(of: state, from: listing, on: clock)

        // The page fails once; the policy retries it a second later, when the source is back.
        listing.fail(at: 10)
        let more = clock.task { try await state.loadMore(listing.operation(on: clock)) }
        await clock.advance(by: .seconds(1))
        #expect(state.phase.kind == .loading && state.snapshot.failureCount == 1)
        listing.heal()
        await clock.advance(by: .seconds(2))
        #expect(try await more.value.items == Array(0..<20))
        #expect(listing.reads == [nil, 10, 10])

        // A page that takes too long times out, twice (the policy retries a timeout too, a second
        // later); the list is as it was.
        let slow = clock.task { try await state.loadMore(listing.operation(on: clock, delay: .seconds(60))) }
        await clock.advance(by: .seconds(5))
        #expect(state.snapshot.failureCount == 1)
        await clock.advance(by: .seconds(6))
        await #expect(throws: AsyncStateError.timedOut(after: .seconds(5))) { try await slow.value }
        #expect(listing.cancelled == 2)
        #expect(state.wrappedValue == Array(0..<20) && state.nextCursor == 20)
        await clock.advance(by: .seconds(60))
    }

    @Test func aFailedPageLeavesTheListFreshAndUncached() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 30)
        let state = AsyncPagedState<Int, Int>(expiry: .seconds(60), clock: clock, failureExpiry: .seconds(30))
        let read = listing.operation(on: clock, delay: .zero)
        _ = try await state.items(read)
        listing.fail(at: 10)
        await #expect(throws: SourceDown(code: 510)) { try await state.loadMore(read) }
        // The list still answers, from memory, and its failed page is not a cached failure.
        #expect(try await state.items(read) == Array(0..<10))
        #expect(listing.reads == [nil, 10])
        listing.heal()
        #expect(try await state.loadMore(read).itemCount == 20)
        #expect(listing.reads == [nil, 10, 10])
    }

    @Test func aFirstPageReadByLoadMoreIsFresh() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 30)
        let log = EventLog()
        let state = AsyncPagedState<Int, Int>(expiry: .seconds(60), clock: clock, name: "list", observer: log)
        let read = listing.operation(on: clock, delay: .zero)
        #expect(try await state.loadMore(read).items == Array(0..<10))
        #expect(try await state.items(read) == Array(0..<10))
        #expect(listing.reads == [nil])
        #expect(log.all.contains("list started(fetch)"))
    }

    @Test func itemsOnAnExpiredListReadsTheFirstPageInsteadOfJoiningAnAppend() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 30)
        let state = AsyncPagedState<Int, Int>(expiry: .seconds(60), clock: clock)
        _ = try await state.items(listing.operation(on: clock, delay: .zero))
        await clock.advance(by: .seconds(61))
        let more = clock.task { try await state.loadMore(listing.operation(on: clock)) }
        await clock.settle()
        listing.shift(by: 1000)
        let items = clock.task { try await state.items(listing.operation(on: clock)) }
        await clock.advance(by: .seconds(1))
        #expect(try await items.value == Array(1000..<1010))
        #expect(try await more.value.items == Array(1000..<1010))  // its caller gets the new list
        #expect(!state.snapshot.isExpired)
        #expect(listing.reads == [nil, 10, nil])
    }

    @Test func aNewWalkOnAWindowThatSlidPastTheFirstPageReadsItAgain() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 40)
        let state = AsyncPagedState<Int, Int>(clock: clock, maxPages: 2)
        let read = listing.operation(on: clock, delay: .zero)
        _ = try await state.items(read)
        _ = try await state.loadMore(read)
        _ = try await state.loadMore(read)  // page 0 dropped
        var items: [Int] = []
        for try await item in state.allItems(read) { items.append(item) }
        #expect(items == Array(0..<40))
        #expect(listing.reads == [nil, 10, 20, nil, 10, 20, 30])
    }

    @Test func aListingWhoseKeptPagesAreEmptyIsNotEmptyIfItDroppedSome() async throws {
        let clock = VirtualClock()
        let state = AsyncPagedState<Int, Int>(clock: clock, maxPages: 1)
        _ = try await state.items { _ in AsyncPage(items: [1], next: 1) }
        _ = try await state.loadMore { _ in AsyncPage(items: [], next: nil) }
        #expect(state.wrappedValue.isEmpty && !state.hasMore)
        #expect(state.phase.kind == .success)
    }

    @Test func aRefreshReplacesTheListAndAPageReadBeforeItIsNeverAppended() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 30)
        let state = AsyncPagedState<Int, Int>(clock: clock)
        try await readFirstPage(of: state, from: listing, on: clock)

        // A page is being appended (2 s); a refresh starts 1 s in, after the source changed.
        let more = clock.task { try await state.loadMore(listing.operation(on: clock, delay: .seconds(2))) }
        await clock.advance(by: .seconds(1))
        listing.shift(by: 1000)
        let refresh = clock.task { await state.refresh(listing.operation(on: clock, delay: .seconds(2))) }
        await clock.settle()
        #expect(state.activity == .refreshing)
        #expect(state.wrappedValue == Array(0..<10))  // the old list stays readable
        await clock.advance(by: .seconds(1))
        // The old page's read would have landed now: it is dropped.
        #expect(state.pageCount == 1)
        #expect(state.wrappedValue == Array(0..<10))
        await clock.advance(by: .seconds(1))
        try await refresh.value
        #expect(state.wrappedValue == Array(1000..<1010))
        #expect(state.pageCount == 1 && state.nextCursor == 10)
        // The caller of the replaced loadMore got the new list, not a mix.
        #expect(try await more.value.items == Array(1000..<1010))
        #expect(listing.cancelled == 1)
    }

    @Test func cancellationLeavesThePagesAndPhaseExactlyAsTheyWere() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 30)
        let state = AsyncPagedState<Int, Int>(clock: clock)
        let read = listing.operation(on: clock)

        // The first page: back to initial, nothing kept.
        let first = clock.task { try await state.items(read) }
        await clock.settle()
        first.cancel()
        await #expect(throws: CancellationError.self) { try await first.value }
        #expect(state.phase.kind == .initial && state.pageCount == 0 && state.activity == .idle)

        let again = clock.task { try await state.items(read) }
        await clock.advance(by: .seconds(1))
        _ = try await again.value
        let before = state.snapshot

        // The next page, cancelled by its only caller.
        let more = clock.task { try await state.loadMore(read) }
        await clock.settle()
        more.cancel()
        await #expect(throws: CancellationError.self) { try await more.value }
        #expect(state.phase.lastUpdated == before.phase.lastUpdated)
        #expect(state.wrappedValue == Array(0..<10) && state.nextCursor == 10 && state.pageCount == 1)

        // A refresh, cancelled with cancel(): the old list and phase.
        let refresh = clock.task { await state.refresh(read) }
        await clock.settle()
        await state.cancel()
        try await refresh.value
        #expect(state.phase.lastUpdated == before.phase.lastUpdated)
        #expect(state.wrappedValue == Array(0..<10) && state.activity == .idle)
        await clock.advance(by: .seconds(5))
        #expect(listing.cancelled == 3)
        #expect(state.pageCount == 1)
    }

    @Test func theWholeListExpiresWithItsFirstPage() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 50)
        let state = AsyncPagedState<Int, Int>(expiry: .seconds(60), clock: clock)
        let read = listing.operation(on: clock, delay: .zero)
        _ = try await state.items(read)
        await clock.advance(by: .seconds(30))
        _ = try await state.loadMore(read)  // appending does not renew the list
        #expect(state.pageCount == 2)
        await clock.advance(by: .seconds(29))
        #expect(try await state.items(read).count == 20)  // still fresh
        await clock.advance(by: .seconds(1))
        #expect(state.snapshot.isExpired)
        #expect(try await state.items(read) == Array(0..<10))  // read from the first page again
        #expect(state.pageCount == 1)
        #expect(listing.reads == [nil, 10, nil])

        // Invalidated: the same.
        _ = try await state.loadMore(read)
        await state.invalidate()
        #expect(try await state.items(read).count == 10)
        #expect(listing.reads == [nil, 10, nil, 10, nil])
    }

    @Test func maxPagesKeepsOnlyTheMostRecentPages() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 100)
        let state = AsyncPagedState<Int, Int>(clock: clock, maxPages: 2)
        let read = listing.operation(on: clock, delay: .zero)
        _ = try await state.items(read)
        for _ in 0..<3 { _ = try await state.loadMore(read) }
        let pages = state.pages
        #expect(pages.pages.count == 2 && pages.loadedPages == 4 && pages.firstKeptPage == 2)
        #expect(pages.items == Array(20..<40))
        #expect(pages.nextCursor == 40)
        // Below 1 means 1.
        let one = AsyncPagedState<Int, Int>(clock: clock, maxPages: -3)
        _ = try await one.items(read)
        _ = try await one.loadMore(read)
        #expect(one.wrappedValue == Array(10..<20))
    }

    @Test func anEmptyListingIsEmptyAndAFirstPageWithMoreToComeIsNot() async throws {
        let clock = VirtualClock()
        let state = AsyncPagedState<Int, Int>(clock: clock)
        _ = try await state.items { _ in AsyncPage(items: [], next: nil) }
        #expect(state.phase.kind == .empty && !state.hasMore)
        let sparse = AsyncPagedState<Int, Int>(clock: clock)
        _ = try await sparse.items { _ in AsyncPage(items: [], next: 5) }
        #expect(sparse.phase.kind == .success && sparse.hasMore)
    }

    @Test func walkingTheListingReadsEachPageOnceThroughTheState() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 25)
        let state = AsyncPagedState<Int, Int>(clock: clock)
        let read = listing.operation(on: clock, delay: .zero)
        var items: [Int] = []
        for try await item in state.allItems(read) { items.append(item) }
        #expect(items == Array(0..<25))
        #expect(listing.reads == [nil, 10, 20])
        // A second walk of the fresh list reads nothing.
        var pages: [[Int]] = []
        for try await page in state.allPages(read) { pages.append(page) }
        #expect(pages.map(\.count) == [10, 10, 5])
        #expect(listing.reads.count == 3)
    }

    @Test func aWalkStopsWhenItsTaskIsCancelled() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 1_000)
        let state = AsyncPagedState<Int, Int>(clock: clock)
        let read = listing.operation(on: clock)
        let seen = LockedValue(0)
        let walk = clock.task {
            for try await _ in state.allItems(read) { seen.withLock { $0 += 1 } }
        }
        await clock.advance(by: .seconds(2))  // two pages
        walk.cancel()
        await #expect(throws: CancellationError.self) { try await walk.value }
        await clock.advance(by: .seconds(10))
        #expect(seen.withLock { $0 } == 20)
        #expect(listing.reads == [nil, 10, 20])  // the third read was cancelled, no fourth
        #expect(listing.cancelled == 1)
        #expect(state.pageCount == 2)
    }

    @Test func aWalkThatFallsBehindMaxPagesSaysSoInsteadOfSkipping() async throws {
        let clock = VirtualClock()
        let listing = Listing(count: 100)
        let state = AsyncPagedState<Int, Int>(clock: clock, maxPages: 1)
        let read = listing.operation(on: clock, delay: .zero)
        var walk = state.allPages(read).makeAsyncIterator()
        #expect(try await walk.next() == Array(0..<10))
        _ = try await state.loadMore(read)
        _ = try await state.loadMore(read)  // page 1 dropped before the walk read it
        await #expect(throws: AsyncStateError.pageNoLongerKept(1)) { try await walk.next() }
    }

    @Test func aPageAppendedIsReportedWithItsReason() async throws {
        let clock = VirtualClock()
        let log = EventLog()
        let state = AsyncPagedState<Int, Int>(clock: clock, name: "orders", observer: log)
        let read = Listing(count: 30).operation(on: clock, delay: .zero)
        _ = try await state.items(read)
        _ = try await state.loadMore(read)
        #expect(log.all.filter { $0.contains("started") } == ["orders started(fetch)", "orders started(loadMore)"])
    }
}

/// The property wrapper form, with the cursor named in the attribute.
struct OrdersHolder {
    @AsyncPagedState(cursor: String.self, expiry: .seconds(60), maxPages: 10) var orders: [Int]
}

@Test func thePagedStateIsAPropertyWrapper() async throws {
    let holder = OrdersHolder()
    let items = try await holder.$orders.items { cursor in
        cursor == nil ? AsyncPage(items: [1, 2], next: "b") : AsyncPage(items: [3], next: nil)
    }
    #expect(items == [1, 2])
    try await holder.$orders.loadMore { _ in AsyncPage(items: [3], next: nil) }
    #expect(holder.orders == [1, 2, 3])
    #expect(!holder.$orders.hasMore)
}
