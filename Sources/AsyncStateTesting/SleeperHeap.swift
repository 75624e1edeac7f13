/// A binary min-heap of sleeper keys ordered by (deadline, registration order).
///
/// O(log N) per push and pop; ties on the deadline come out first-in, first-out because the
/// registration number breaks them. Cancelled sleepers are not searched for and removed: the clock
/// forgets their continuation, and their key is dropped when it reaches the top
/// (``VirtualClock`` compacts the heap when such dead keys outnumber live ones).
struct SleeperHeap {
    /// One sleeper's place in the heap.
    struct Key: Comparable {
        /// The instant the sleeper is due, as an offset from the clock's start.
        var deadline: Duration
        /// The sleeper's registration number: unique, increasing.
        var id: UInt64

        static func < (lhs: Key, rhs: Key) -> Bool {
            lhs.deadline != rhs.deadline ? lhs.deadline < rhs.deadline : lhs.id < rhs.id
        }
    }

    private(set) var keys: [Key] = []

    /// The number of keys, dead ones included.
    var count: Int { keys.count }

    /// The smallest key, if any.
    var min: Key? { keys.first }

    /// Adds a key. O(log N).
    mutating func push(_ key: Key) {
        keys.append(key)
        siftUp(keys.count - 1)
    }

    /// Removes and returns the smallest key. O(log N).
    @discardableResult
    mutating func popMin() -> Key? {
        guard !keys.isEmpty else { return nil }
        keys.swapAt(0, keys.count - 1)
        let top = keys.removeLast()
        if !keys.isEmpty { siftDown(0) }
        return top
    }

    /// Drops the keys for which `isDead` is true, then restores heap order. O(N).
    mutating func removeAll(where isDead: (Key) -> Bool) {
        keys.removeAll(where: isDead)
        // Floyd's bottom-up heap construction.
        var index = keys.count / 2
        while index > 0 {
            index -= 1
            siftDown(index)
        }
    }

    private mutating func siftUp(_ start: Int) {
        var child = start
        while child > 0 {
            let parent = (child - 1) / 2
            guard keys[child] < keys[parent] else { return }
            keys.swapAt(child, parent)
            child = parent
        }
    }

    private mutating func siftDown(_ start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1
            guard left < keys.count else { return }
            let right = left + 1
            var smallest = left
            if right < keys.count, keys[right] < keys[left] { smallest = right }
            guard keys[smallest] < keys[parent] else { return }
            keys.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
