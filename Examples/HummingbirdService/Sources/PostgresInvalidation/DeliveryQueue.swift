import AsyncStateKit
import Synchronization

/// One subscriber's deliveries, in a buffer of bounded size: a flood that arrives faster than the
/// subscriber applies it cannot grow memory without limit. When the buffer is full, what it holds
/// and the new delivery are replaced by one `reconnected` — invalidating everything is always safe,
/// and covers whatever was dropped — so the buffer never holds more than `capacity` deliveries.
///
/// Read by one consumer, through ``stream(onEnd:)``.
final class DeliveryQueue: Sendable {
    private struct State {
        var buffer: Ring<AsyncStateInvalidationDelivery>
        var waiter: CheckedContinuation<AsyncStateInvalidationDelivery?, Never>?
        var finished = false
        var overflows = 0
    }

    /// The most deliveries the buffer holds.
    let capacity: Int
    private let state: Mutex<State>

    init(capacity: Int) {
        self.capacity = max(1, capacity)
        state = Mutex(State(buffer: Ring(capacity: self.capacity)))
    }

    /// How many slots the buffer has allocated (for tests): never more than ``capacity``.
    var allocatedSlots: Int { state.withLock { $0.buffer.allocated } }

    /// How many times the buffer overflowed and was replaced by one `reconnected`.
    var overflows: Int { state.withLock { $0.overflows } }

    /// Adds `delivery`; returns `false` when the buffer overflowed (it then holds one `reconnected`).
    @discardableResult
    func push(_ delivery: AsyncStateInvalidationDelivery) -> Bool {
        let (waiter, fitted) = state.withLock {
            state -> (CheckedContinuation<AsyncStateInvalidationDelivery?, Never>?, Bool) in
            guard !state.finished else { return (nil, true) }
            if let waiter = state.waiter {
                state.waiter = nil
                return (waiter, true)
            }
            if state.buffer.append(delivery) { return (nil, true) }
            state.buffer.removeAll()
            _ = state.buffer.append(.reconnected)
            state.overflows += 1
            return (nil, false)
        }
        waiter?.resume(returning: delivery)
        return fitted
    }

    /// Ends the queue: its consumer gets what is buffered, then the end.
    func finish() {
        let waiter = state.withLock { state in
            state.finished = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: nil)
    }

    /// The next delivery, waiting for one; `nil` once the queue has finished and is empty, or when the
    /// calling task is cancelled.
    func next() async -> AsyncStateInvalidationDelivery? {
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let answer = state.withLock { state -> AsyncStateInvalidationDelivery?? in
                    if let delivery = state.buffer.popFirst() { return .some(delivery) }
                    if state.finished || Task.isCancelled { return .some(nil) }
                    state.waiter = continuation
                    return .none
                }
                if let answer { continuation.resume(returning: answer) }
            }
        } onCancel: {
            let waiter = state.withLock { state in
                defer { state.waiter = nil }
                return state.waiter
            }
            waiter?.resume(returning: nil)
        }
    }

    /// The queue as a stream for its one consumer; `onEnd` runs when the consumer stops.
    func stream(onEnd: @escaping @Sendable () -> Void) -> AsyncStream<AsyncStateInvalidationDelivery> {
        AsyncStream(unfolding: { [self] in await next() }, onCancel: onEnd)
    }
}

/// A first-in, first-out ring of at most `capacity` elements: it grows by doubling up to its capacity
/// and frees each element as it is taken, so what it holds — and what it has allocated — never
/// exceeds the capacity, whatever went through it (a buffer that frees its slots only when it
/// empties holds every element ever pushed while one stays pending).
struct Ring<Element> {
    private var slots: [Element?] = []
    private var head = 0
    private(set) var count = 0
    let capacity: Int

    init(capacity: Int) {
        self.capacity = max(1, capacity)
    }

    /// The slots allocated.
    var allocated: Int { slots.count }

    /// Adds `element` at the end; `false` (and unchanged) when full.
    mutating func append(_ element: Element) -> Bool {
        guard count < capacity else { return false }
        if count == slots.count { grow() }
        slots[(head + count) % slots.count] = element
        count += 1
        return true
    }

    /// Takes the first element out, freeing its slot; `nil` when empty.
    mutating func popFirst() -> Element? {
        guard count > 0 else { return nil }
        let element = slots[head].take()
        head = (head + 1) % slots.count
        count -= 1
        return element
    }

    /// Empties the ring, keeping its slots.
    mutating func removeAll() {
        while popFirst() != nil {}
        head = 0
    }

    /// Doubles the slots (up to the capacity), the elements in order from the first slot.
    private mutating func grow() {
        let size = min(capacity, max(4, slots.count * 2))
        var grown: [Element?] = []
        grown.reserveCapacity(size)
        for offset in 0..<count { grown.append(slots[(head + offset) % slots.count].take()) }
        grown.append(contentsOf: repeatElement(nil, count: size - count))
        slots = grown
        head = 0
    }
}
