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
        var buffer: [AsyncStateInvalidationDelivery] = []
        var head = 0
        var waiter: CheckedContinuation<AsyncStateInvalidationDelivery?, Never>?
        var finished = false
        var overflows = 0
    }

    /// The most deliveries the buffer holds.
    let capacity: Int
    private let state = Mutex(State())

    init(capacity: Int) {
        self.capacity = max(1, capacity)
    }

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
            if state.buffer.count - state.head < capacity {
                state.buffer.append(delivery)
                return (nil, true)
            }
            state.buffer = [.reconnected]
            state.head = 0
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
                    if state.head < state.buffer.count {
                        let delivery = state.buffer[state.head]
                        state.head += 1
                        if state.head == state.buffer.count {
                            state.buffer.removeAll(keepingCapacity: true)
                            state.head = 0
                        }
                        return .some(delivery)
                    }
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
