/// A paginated listing — an upstream read page by page with a cursor — held like an ``AsyncState``:
/// the pages read so far, their phase, expiry, retries and single flight.
///
/// The operation receives a cursor (`nil` for the first page) and returns an ``AsyncPage``: its
/// items and the next cursor (`nil` at the end). The state keeps the pages in order:
///
/// ```swift
/// actor OrdersService {
///     @AsyncPagedState(cursor: String.self, expiry: .seconds(60)) var orders: [Order]
///
///     func firstOrders() async throws -> [Order] {
///         try await $orders.items { cursor in try await self.api.orders(after: cursor) }
///     }
///     func moreOrders() async throws {
///         try await $orders.loadMore { cursor in try await self.api.orders(after: cursor) }
///     }
/// }
/// ```
///
/// - ``items(retry:_:)`` answers with the kept items, reading the first page unless the list is
///   fresh; ``loadMore(retry:_:)`` appends the next page. Both are single flight: concurrent callers
///   share one read.
/// - A failed page keeps every item read before it; the phase is ``AsyncPhase/failure(_:)`` with that
///   page's error, and calling ``loadMore(retry:_:)`` again retries that page alone. A cancelled read
///   leaves the pages and phase exactly as they were.
/// - ``refresh(retry:_:)`` reads from the first page again and replaces the whole list when it lands;
///   a page that was being appended meanwhile is dropped, never appended to the new list.
/// - The list is as old as its first page: appending pages does not renew it. Once it expires (or
///   after ``invalidate()``), ``items(retry:_:)`` and ``fetch(retry:_:)`` read from the first page
///   again.
/// - `maxPages` bounds the memory: only the most recent pages are kept.
/// - ``allPages(retry:_:)`` and ``allItems(retry:_:)`` walk the listing to its end as an
///   `AsyncSequence`, reading pages through the state as they go.
///
/// While a read is in flight, ``activity`` says which: the first page, a refresh, or the next page
/// (with the items read so far readable).
@propertyWrapper
public struct AsyncPagedState<Item: Sendable, Cursor: Sendable>: Sendable {
    /// Reads the page at a cursor (`nil`: the first page).
    public typealias Operation = @Sendable (Cursor?) async throws -> AsyncPage<Item, Cursor>

    /// What a paged state is reading.
    public enum Activity: Hashable, Sendable {
        /// Nothing.
        case idle
        /// The first page, with nothing read before.
        case loadingFirstPage
        /// The first page again, replacing a list that was read before (a refresh, or an expired
        /// list); its items stay readable until the new list lands.
        case refreshing
        /// The next page, to append; the items read so far stay readable.
        case loadingMore
    }

    typealias Store = AsyncStateStore<AsyncPages<Item, Cursor>>

    let store: Store
    /// The most recent `maxPages`, or `nil` for every page.
    let maxPages: Int?

    /// Creates an empty paged state.
    ///
    /// - Parameters:
    ///   - cursor: The cursor's type (for the property wrapper, whose declared type names only the
    ///     items: `@AsyncPagedState(cursor: String.self) var orders: [Order]`).
    ///   - expiry: How long a list stays fresh from its first page.
    ///   - clock: The clock that expiry, backoff and timeouts run on.
    ///   - retry: How failed page reads are retried.
    ///   - timeout: The longest one attempt may take; `nil` for none.
    ///   - softTimeout: How long callers of the first page wait before they get the list they have
    ///     instead, while the read goes on (see ``AsyncState``); `loadMore` always waits. `nil`: off.
    ///   - failureExpiry: How long a failed first page is answered without reading it again (see
    ///     ``AsyncState``); `loadMore` always reads.
    ///   - maxStaleAge: Fail-safe: when reading the first page fails, callers get the list they had
    ///     instead of the error while it is younger than this (see ``AsyncState``); a failed
    ///     `loadMore` always throws. `nil` (the default), zero or less: off.
    ///   - maxPages: Keep only the most recent pages; `nil` for all. Values below 1 mean 1.
    ///   - name: What the state reports as to its `observer`.
    ///   - observer: Receives what the state does; a page appended is a fetch started with reason
    ///     ``AsyncStateEvent/Reason/loadMore``.
    public init(
        cursor: Cursor.Type = Cursor.self,
        expiry: Duration = .seconds(120),
        clock: some Clock<Duration> = ContinuousClock(),
        retry: RetryPolicy = .never,
        timeout: Duration? = nil,
        softTimeout: Duration? = nil,
        failureExpiry: Duration = .zero,
        maxStaleAge: Duration? = nil,
        maxPages: Int? = nil,
        name: String = "",
        observer: (any AsyncStateObserver)? = nil
    ) {
        let configuration = StoreConfiguration<AsyncPages<Item, Cursor>>(
            expiry: expiry, failureExpiry: failureExpiry, isEmpty: { $0.isEmptyListing }, retry: retry,
            timeout: timeout, softTimeout: softTimeout, staleWhileRevalidate: false, refreshAfter: nil,
            maxStaleAge: maxStaleAge)
        store = Store(
            initialValue: AsyncPages(), configuration: configuration, clock: StoreClock(clock),
            observation: observer.map { Observation(name: name, key: nil, observer: $0) })
        self.maxPages = maxPages.map { max(1, $0) }
    }

    // MARK: Reading

    /// The kept items, in order (joins the kept pages: O(n)).
    public var wrappedValue: [Item] { store.cell.value.items }

    /// The state itself, for its methods: `$orders.loadMore { … }`.
    public var projectedValue: Self { self }

    /// The kept pages, their cursor and counts.
    public var pages: AsyncPages<Item, Cursor> { store.cell.value }

    /// The phase of the last read (first page, refresh or next page).
    public var phase: AsyncPhase { store.cell.phase }

    /// What is being read now: derived from why the flight in flight started, published with the
    /// snapshot that says `loading`.
    public var activity: Activity {
        store.cell.contents.read { contents in
            guard let start = contents.pointee.flightStart else { return .idle }
            return !start.hadValue ? .loadingFirstPage : start.reason == .loadMore ? .loadingMore : .refreshing
        }
    }

    /// Whether there is more to read (see ``AsyncPages/hasMore``).
    public var hasMore: Bool { pages.hasMore }

    /// The cursor of the next page, `nil` before the first page and at the end.
    public var nextCursor: Cursor? { pages.nextCursor }

    /// How many pages were read since the first one (see ``AsyncPages/loadedPages``).
    public var pageCount: Int { pages.loadedPages }

    /// The current snapshot: the pages, phase, expiry and metadata.
    public var snapshot: AsyncSnapshot<AsyncPages<Item, Cursor>> { store.cell.snapshot(at: store.clock.now()) }

    /// The current snapshot, then one per transition, as ``AsyncState/updates``.
    public var updates: AsyncStream<AsyncSnapshot<AsyncPages<Item, Cursor>>> {
        store.cell.subscribe(at: store.clock.now())
    }

    // MARK: Reading pages

    /// Returns the kept items: at once when the list is fresh, else after reading the first page
    /// (joining a read in flight), which replaces the list.
    ///
    /// - Throws: The first page's error (after retries); `CancellationError` when the caller is
    ///   cancelled; what ``AsyncState/value(retry:_:)`` throws otherwise.
    @discardableResult
    public nonisolated(nonsending) func items(retry: RetryPolicy? = nil, _ operation: @escaping Operation)
        async throws -> [Item]
    {
        try await list(retry: retry, operation).items
    }

    /// Reads the first page unless the list is fresh, like ``items(retry:_:)``; never throws (the
    /// outcome is in ``phase``).
    public nonisolated(nonsending) func fetch(retry: RetryPolicy? = nil, _ operation: @escaping Operation) async {
        _ = try? await items(retry: retry, operation)
    }

    /// Reads from the first page again, fresh or not, replacing a read in flight (whose result is
    /// dropped — an appended page included); the whole list is replaced when the first page lands.
    public nonisolated(nonsending) func refresh(retry: RetryPolicy? = nil, _ operation: @escaping Operation) async {
        _ = try? await reload(retry: retry, operation)
    }

    /// Appends the next page and returns the pages after it.
    ///
    /// Single flight: while any read is in flight (the first page, a refresh or another page), joins
    /// it instead. Before the first page, reads it; at the end of the listing (``hasMore`` false)
    /// with no read in flight, returns at once. A failed page leaves the list as it was — its items,
    /// and its freshness: ``items(retry:_:)`` still answers from it — with the error in ``phase``;
    /// call again to retry that page. Appending does not renew the list's freshness; an
    /// ``items(retry:_:)`` on an expired list does not join an append, it reads the first page.
    ///
    /// - Throws: The page's error (after retries); `CancellationError` when the caller is cancelled.
    @discardableResult
    public nonisolated(nonsending) func loadMore(retry: RetryPolicy? = nil, _ operation: @escaping Operation)
        async throws -> AsyncPages<Item, Cursor>
    {
        let maxPages = maxPages
        // The machine decides what an append is: at the end of the list with nothing in flight, the
        // list at once; before the first page, a first read; otherwise an append to the list it
        // hands the attempt, which only a refresh, a read of an expired list or a reset could change
        // — and each of them ends this flight, whose result is then dropped.
        return try await read(
            .loadMore, retry: retry,
            .reading { input in
                guard let list = input.previous else { return .value(AsyncPages(first: try await operation(nil))) }
                guard let cursor = list.nextCursor else { return .value(list) }
                return .value(list.appending(try await operation(cursor), maxPages: maxPages))
            })
    }

    /// Marks the list expired: the next ``items(retry:_:)`` reads from the first page.
    public nonisolated(nonsending) func invalidate() async {
        store.invalidate()
    }

    /// Cancels the read in flight: its callers get `CancellationError`; the pages and phase are as
    /// they were before it.
    public nonisolated(nonsending) func cancel() async {
        store.cancel()
    }

    /// Forgets every page and goes back to ``AsyncPhase/initial``; a read in flight is cancelled.
    public nonisolated(nonsending) func reset() async {
        store.reset()
    }

    // MARK: Walking the listing

    /// The listing's pages from the first to the last, read through this state as the sequence is
    /// iterated (see ``AsyncPagedSequence``).
    public func allPages(retry: RetryPolicy? = nil, _ operation: @escaping Operation) -> AsyncPagedSequence<
        Item, Cursor
    > {
        AsyncPagedSequence(state: self, retry: retry, operation: operation)
    }

    /// The listing's items from the first to the last, read page by page through this state.
    public func allItems(retry: RetryPolicy? = nil, _ operation: @escaping Operation) -> AsyncPagedItemSequence<
        Item, Cursor
    > {
        AsyncPagedItemSequence(pages: allPages(retry: retry, operation))
    }

    // MARK: Internals

    /// The list: at once when fresh, else after reading the first page (see ``items(retry:_:)``).
    nonisolated(nonsending) func list(retry: RetryPolicy?, _ operation: @escaping Operation) async throws
        -> AsyncPages<Item, Cursor>
    {
        if let fresh = store.hit(\.value) { return fresh }
        return try await read(.value, retry: retry, firstPage(operation))
    }

    /// Reads from the first page again (see ``refresh(retry:_:)``), throwing what the read throws.
    nonisolated(nonsending) func reload(retry: RetryPolicy?, _ operation: @escaping Operation) async throws
        -> AsyncPages<Item, Cursor>
    {
        try await read(.refresh, retry: retry, firstPage(operation))
    }

    /// The operation that reads the first page into a new list.
    private func firstPage(_ operation: @escaping Operation) -> Store.Operation {
        .plain { AsyncPages(first: try await operation(nil)) }
    }

    /// Asks the store for `request`.
    private nonisolated(nonsending) func read(
        _ request: FetchRequest, retry: RetryPolicy?, _ operation: Store.Operation
    ) async throws -> AsyncPages<Item, Cursor> {
        try await store.fetch(request, policy: retry, operation)
    }
}

/// The pages of a listing from the first to the last, read through an ``AsyncPagedState`` as the
/// sequence is iterated: the walk starts from the state's list if it is fresh (else from a new first
/// page), uses the pages it keeps, and reads the next ones with `loadMore` (single flight with every
/// other caller, and kept for them). Pages are not checked for freshness again once the walk started.
///
/// Iteration stops at the end of the listing, throws a page's error (after the state's retries), and
/// throws `CancellationError` when its task is cancelled. If the state's list is replaced while
/// walking (a refresh, or another caller's read of an expired list), the walk goes on at the same page
/// index in the new list, as a cursor over a changing listing would — re-reading the pages before it.
/// With `maxPages`, a walk from the start whose state's window slid past the first page reads the
/// first page again (replacing the list); a page dropped before a walk reached it (other callers read
/// further) throws ``AsyncStateError/pageNoLongerKept(_:)``.
public struct AsyncPagedSequence<Item: Sendable, Cursor: Sendable>: AsyncSequence, Sendable {
    /// A page's items.
    public typealias Element = [Item]

    let state: AsyncPagedState<Item, Cursor>
    let retry: RetryPolicy?
    let operation: AsyncPagedState<Item, Cursor>.Operation

    /// Creates the iterator; each iterator walks from the first page.
    public func makeAsyncIterator() -> Iterator {
        Iterator(sequence: self)
    }

    /// Walks the pages.
    public struct Iterator: AsyncIteratorProtocol {
        let sequence: AsyncPagedSequence
        /// The index of the next page to return.
        var next = 0

        /// The next page, or `nil` after the last.
        public mutating func next() async throws -> [Item]? {
            let (state, retry, operation) = (sequence.state, sequence.retry, sequence.operation)
            try Task.checkCancellation()
            var list = state.pages
            if next == 0 || !list.hasFirstPage {
                // The walk starts from the state's list if it is fresh, else from a new first page; a
                // list whose window (`maxPages`) slid past the first page is read from it again.
                list = try await state.list(retry: retry, operation)
                if next == 0, list.firstKeptPage > 0 { list = try await state.reload(retry: retry, operation) }
            }
            while next >= list.loadedPages {
                guard list.hasMore else { return nil }
                try Task.checkCancellation()
                list = try await state.loadMore(retry: retry, operation)
            }
            guard next >= list.firstKeptPage else { throw AsyncStateError.pageNoLongerKept(next) }
            defer { next += 1 }
            return list.pages[next - list.firstKeptPage]
        }
    }
}

/// The items of a listing from the first to the last: an ``AsyncPagedSequence``'s pages, one item
/// at a time. It stops, throws and is cancelled as that sequence is.
public struct AsyncPagedItemSequence<Item: Sendable, Cursor: Sendable>: AsyncSequence, Sendable {
    /// An item.
    public typealias Element = Item

    let pages: AsyncPagedSequence<Item, Cursor>

    /// Creates the iterator; each iterator walks from the first page.
    public func makeAsyncIterator() -> Iterator {
        Iterator(pages: pages.makeAsyncIterator())
    }

    /// Walks the items.
    public struct Iterator: AsyncIteratorProtocol {
        var pages: AsyncPagedSequence<Item, Cursor>.Iterator
        var page: [Item] = []
        var index = 0

        /// The next item, or `nil` after the last.
        public mutating func next() async throws -> Item? {
            while index == page.count {
                guard let next = try await pages.next() else { return nil }
                (page, index) = (next, 0)
            }
            defer { index += 1 }
            return page[index]
        }
    }
}
