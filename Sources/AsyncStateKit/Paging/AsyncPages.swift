/// One page of a listing, as a paged state's operation returns it: its items and the cursor of the
/// next page, `nil` at the end of the listing.
public struct AsyncPage<Item: Sendable, Cursor: Sendable>: Sendable {
    /// The page's items, in the listing's order.
    public var items: [Item]
    /// Where the next page starts (a token, an offset, a page number), or `nil` if this is the last.
    public var next: Cursor?
    /// How long the listing stays fresh, if the source said so (an HTTP `Cache-Control: max-age`):
    /// read from the first page only, since a listing is as old as its first page (see
    /// ``AsyncStateExpiring``); `nil` for the state's `expiry`.
    public var timeToLive: Duration?

    /// Creates a page, fresh for `timeToLive` if given (see ``timeToLive``).
    public init(items: [Item], next: Cursor?, timeToLive: Duration? = nil) {
        self.items = items
        self.next = next
        self.timeToLive = timeToLive
    }
}

/// The pages an ``AsyncPagedState`` holds: the listing read so far, from its first page.
///
/// With `maxPages`, only the most recent pages are kept (a sliding window): ``firstKeptPage`` says
/// how many were dropped from the front, ``loadedPages`` how many were read in all.
public struct AsyncPages<Item: Sendable, Cursor: Sendable>: Sendable, AsyncStateExpiring {
    /// The kept pages, in the listing's order.
    public private(set) var pages: [[Item]]
    /// How many pages were read since the first one, kept or dropped.
    public private(set) var loadedPages: Int
    /// The cursor of the next page: `nil` before the first page and at the end of the listing.
    public private(set) var nextCursor: Cursor?
    /// Whether the first page was read.
    public private(set) var hasFirstPage: Bool
    /// The first page's ``AsyncPage/timeToLive``: how long the listing stays fresh, `nil` for the
    /// state's `expiry`. Appended pages do not change it.
    public private(set) var timeToLive: Duration?

    /// Nothing read yet.
    public init() {
        pages = []
        loadedPages = 0
        nextCursor = nil
        hasFirstPage = false
    }

    /// A listing read up to its first page.
    init(first page: AsyncPage<Item, Cursor>) {
        pages = [page.items]
        loadedPages = 1
        nextCursor = page.next
        hasFirstPage = true
        timeToLive = page.timeToLive
    }

    /// Whether there is more to read: before the first page, and while the last page read named a
    /// next one.
    public var hasMore: Bool { !hasFirstPage || nextCursor != nil }

    /// The index (from 0, the listing's first page) of the first kept page: the number of pages
    /// dropped by `maxPages`.
    public var firstKeptPage: Int { loadedPages - pages.count }

    /// The kept items, in order (joins the kept pages: O(n)).
    public var items: [Item] { Array(pages.joined()) }

    /// The number of kept items.
    public var itemCount: Int { pages.reduce(0) { $0 + $1.count } }

    /// Whether the listing is read to its end and holds no item.
    var isEmptyListing: Bool {
        hasFirstPage && nextCursor == nil && firstKeptPage == 0 && pages.allSatisfy(\.isEmpty)
    }

    /// This listing with `page` appended, keeping at most `maxPages` pages (the most recent).
    func appending(_ page: AsyncPage<Item, Cursor>, maxPages: Int?) -> Self {
        var result = self
        result.pages.append(page.items)
        result.loadedPages += 1
        result.nextCursor = page.next
        if let maxPages, result.pages.count > maxPages {
            result.pages.removeFirst(result.pages.count - maxPages)
        }
        return result
    }
}

/// A value that is a listing read page by page: it can be at its end, with nothing more to load (see
/// ``FetchStateMachine/isAtEnd(_:)``, the one place the machine asks).
@usableFromInline
protocol AsyncStateListing {
    /// Whether the listing's last page was read: an append has nothing to load.
    var isAtEnd: Bool { get }
}

extension AsyncPages: AsyncStateListing {
    /// The first page was read, and the last page said there is no next one (``hasMore`` is false).
    @usableFromInline var isAtEnd: Bool { !hasMore }
}
