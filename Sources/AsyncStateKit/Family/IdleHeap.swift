/// The entries of a shard with an idle expiry, by a lower bound of their last access: a binary heap,
/// least first, with each entry's place in it by slot (so that an entry leaves it in O(log n)).
///
/// An entry is pushed when it is made, by that instant; hits do not move it (they only write their
/// instant in the shard's last accesses). So the root tells when the shard may next hold an idle
/// entry — never later than the first one, maybe earlier — and the sweep removes the entries idle by
/// their true last access and places the others by it (``raiseRoot(to:)``). Each entry is so looked
/// at about once per idle expiry, however often it is hit.
@usableFromInline struct IdleHeap {
    /// An entry in the heap: its slot, and a lower bound of its last access.
    @usableFromInline struct Node {
        @usableFromInline var since: Duration
        @usableFromInline var slot: Int32
    }

    /// The heap.
    private(set) var heap: [Node] = []
    /// Each slot's position in ``heap`` (-1 when it is not in it).
    private var positions: [Int32] = []

    /// The entry with the least lower bound, if any.
    @usableFromInline var root: Node? { heap.first }

    /// Adds the entry at `slot`, as last accessed at `since`.
    @usableFromInline mutating func push(_ slot: Int32, since: Duration) {
        while positions.count <= Int(slot) { positions.append(-1) }
        heap.append(Node(since: since, slot: slot))
        positions[Int(slot)] = Int32(heap.count - 1)
        siftUp(heap.count - 1)
    }

    /// Takes the entry at `slot` out of the heap.
    @usableFromInline mutating func remove(_ slot: Int32) {
        let position = Int(positions[Int(slot)])
        let last = heap.count - 1
        positions[Int(slot)] = -1
        guard position != last else {
            heap.removeLast()
            return
        }
        heap[position] = heap.removeLast()
        positions[Int(heap[position].slot)] = Int32(position)
        siftDown(siftUp(position))
    }

    /// Places the root by `since`, a later instant than its own.
    @usableFromInline mutating func raiseRoot(to since: Duration) {
        heap[0].since = since
        siftDown(0)
    }

    /// Moves the node at `position` up while it is older than its parent; returns where it ends.
    @discardableResult
    private mutating func siftUp(_ position: Int) -> Int {
        var position = position
        while position > 0 {
            let parent = (position - 1) / 2
            guard heap[position].since < heap[parent].since else { break }
            swapNodes(position, parent)
            position = parent
        }
        return position
    }

    /// Moves the node at `position` down while a child is older.
    private mutating func siftDown(_ position: Int) {
        var position = position
        while true {
            let (left, right) = (2 * position + 1, 2 * position + 2)
            var least = position
            if left < heap.count, heap[left].since < heap[least].since { least = left }
            if right < heap.count, heap[right].since < heap[least].since { least = right }
            guard least != position else { return }
            swapNodes(position, least)
            position = least
        }
    }

    private mutating func swapNodes(_ a: Int, _ b: Int) {
        heap.swapAt(a, b)
        positions[Int(heap[a].slot)] = Int32(a)
        positions[Int(heap[b].slot)] = Int32(b)
    }

    /// The bytes the heap's buffers hold (by their capacity).
    @usableFromInline var bufferBytes: Int { bytes(of: heap) + bytes(of: positions) }
}
