import Testing

@testable import AsyncStateKit

/// The small set of a flight's waiter ids: one id inline, more in a set, and back.
@Suite struct WaiterIDsTests {
    @Test func behavesAsASetThroughEveryStorage() {
        var ids = WaiterIDs()
        #expect(ids.isEmpty && ids.count == 0 && ids.first == nil && Array(ids).isEmpty)
        ids.insert(7)
        ids.insert(7)
        #expect(ids.count == 1 && ids.contains(7) && !ids.contains(8) && ids.first == 7)
        ids.insert(8)
        ids.insert(9)
        #expect(ids.count == 3 && Set(ids) == [7, 8, 9])
        ids.remove(8)
        ids.remove(42)
        #expect(ids.count == 2 && Set(ids) == [7, 9])
        ids.remove(7)
        // Back to one inline id: it is found, and removing it empties the set.
        if case .one(9, _) = ids.table.storage {
        } else {
            Issue.record("one id left is not kept inline: \(ids.table.storage)")
        }
        #expect(ids == [9] && ids.contains(9))
        ids.remove(9)
        #expect(ids.isEmpty && ids == [])
    }

    @Test func subtractingAndEqualityIgnoreOrderAndStorage() {
        let all: WaiterIDs = [1, 2, 3, 4]
        #expect(all.subtracting([2, 4, 5]) == [3, 1])
        #expect(all.subtracting(all).isEmpty)
        #expect(all.subtracting([]) == all)
        #expect(([5] as WaiterIDs) != [5, 6])
        #expect(([5, 6] as WaiterIDs) != [5, 7])
        var many: WaiterIDs = [1, 2]
        many.remove(2)
        #expect(many == [1])
    }

    @Test func theTableOfWaitersKeepsOneSlotInlineAndGrowsAndShrinksAsADictionary() {
        var slots = WaiterSlots()
        #expect(slots.count == 0 && slots[1] == nil)
        slots[1] = .pending
        if case .one(1, .pending) = slots.storage {} else { Issue.record("one slot is not inline: \(slots.storage)") }
        slots[2] = .pending
        slots[3] = .resolved(WaiterOutcome.cancelled)
        #expect(slots.count == 3)
        if case .resolved = slots[3] {} else { Issue.record("slot 3 lost: \(String(describing: slots[3]))") }
        slots[2] = nil
        slots[9] = nil  // absent: nothing changes
        #expect(slots.count == 2 && slots[2] == nil)
        slots[1] = nil
        if case .one(3, .resolved) = slots.storage {
        } else {
            Issue.record("one slot left is not inline: \(slots.storage)")
        }
        slots[3] = .pending
        if case .pending = slots[3] {} else { Issue.record("slot 3 not replaced") }
        slots[3] = nil
        #expect(slots.count == 0 && slots[3] == nil)
    }
}
