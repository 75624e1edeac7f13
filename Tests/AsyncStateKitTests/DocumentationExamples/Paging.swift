// swift-format-ignore-file
// Verbatim from README.md and Sources/AsyncStateKit/AsyncStateKit.docc/PagingAndPresenting.md;
// .ci/doc-snippets checks that their blocks still match this file.
import AsyncStateKit

struct Order: Sendable, Equatable { var id: Int }

final class OrdersAPI: Sendable {
    // One page of orders from offset `cursor`, 100 at a time; 250 orders in all.
    func orders(after cursor: Int?) async throws -> AsyncPage<Order, Int> {
        let start = cursor ?? 0
        let end = min(start + 100, 250)
        return AsyncPage(items: (start..<end).map { Order(id: $0) }, next: end < 250 ? end : nil)
    }
}

actor OrdersService {
    let api = OrdersAPI()

    // The pages read so far, fresh for a minute from the first page; at most 50 pages kept.
    @AsyncPagedState(cursor: Int.self, expiry: .seconds(60), maxPages: 50) var orders: [Order]

    func firstPage() async throws -> [Order] {
        try await $orders.items { cursor in try await self.api.orders(after: cursor) }
    }

    func nextPage() async throws -> [Order] {
        try await $orders.loadMore { cursor in try await self.api.orders(after: cursor) }.items
    }

    // Every order, through the state: kept pages at once, the others read (and kept) as reached.
    func countAll() async throws -> Int {
        var count = 0
        for try await _ in $orders.allItems({ cursor in try await self.api.orders(after: cursor) }) { count += 1 }
        return count
    }
}
