/// An array that holds its first element inline, so that the usual case — one element — allocates
/// nothing: a settled flight's one waiter (``ResumedWaiters``), a write's one eviction.
@usableFromInline
struct InlineOneArray<Element>: Sequence {
    @usableFromInline var first: Element?
    @usableFromInline var more: [Element] = []

    @inlinable init() {}

    @inlinable var isEmpty: Bool { first == nil }

    @inlinable mutating func append(_ element: Element) {
        if first == nil { first = element } else { more.append(element) }
    }

    @inlinable func makeIterator() -> Iterator { Iterator(first: first, more: more.makeIterator()) }

    @usableFromInline
    struct Iterator: IteratorProtocol {
        @usableFromInline var first: Element?
        @usableFromInline var more: IndexingIterator<[Element]>

        @inlinable init(first: Element?, more: IndexingIterator<[Element]>) {
            (self.first, self.more) = (first, more)
        }

        @inlinable mutating func next() -> Element? {
            if let element = first {
                first = nil
                return element
            }
            return more.next()
        }
    }
}
