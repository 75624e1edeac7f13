import AsyncStateKit
import Testing

@testable import PostgresInvalidation

/// The delivery buffer's ring: bounded by its capacity in what it holds and what it allocates, in
/// order, whatever goes through it.
@Suite struct RingTests {
    @Test func oneMessageAlwaysPendingHoldsNoMoreThanTheCapacity() {
        var ring = Ring<Int>(capacity: 16)
        var order: [Int] = []
        _ = ring.append(0)
        // 100,000 through a ring that always has one waiting: a buffer freed only when empty would
        // hold them all.
        for value in 1...100_000 {
            guard ring.append(value), let first = ring.popFirst() else { break }
            order.append(first)
        }
        #expect(order == Array(0..<100_000))
        #expect(ring.count == 1 && ring.allocated <= 16)
    }

    @Test func itKeepsOrderAcrossGrowthAndWrapAndRefusesPastItsCapacity() {
        var ring = Ring<Int>(capacity: 10)
        var expected: [Int] = []
        var next = 0
        for round in 0..<50 {
            for _ in 0..<(round % 7) where ring.append(next) {
                expected.append(next)
                next += 1
            }
            for _ in 0..<(round % 5) {
                let first = ring.popFirst()
                #expect(first == (expected.isEmpty ? nil : expected.removeFirst()))
            }
            #expect(ring.count == expected.count && ring.count <= 10 && ring.allocated <= 10)
        }
        while ring.count < 10, ring.append(-1) {}
        let appendedPastCapacity = ring.append(99)
        #expect(ring.count == 10 && !appendedPastCapacity)
        ring.removeAll()
        let afterRemoval = ring.popFirst()
        #expect(ring.count == 0 && afterRemoval == nil)
    }

    @Test func aQueueThatOverflowsHoldsOneReconnected() async {
        let queue = DeliveryQueue(capacity: 4)
        for index in 0..<10 { queue.push(.invalidate(AsyncStateInvalidation(topic: "t", key: "\(index)"))) }
        #expect(queue.overflows == 2)
        #expect(queue.allocatedSlots <= 4)
        #expect(await queue.next() == .reconnected)
        #expect(await queue.next() == .invalidate(AsyncStateInvalidation(topic: "t", key: "9")))
    }
}
