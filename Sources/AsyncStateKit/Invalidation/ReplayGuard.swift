/// What an invalidator with an authenticator remembers of the signed messages it accepted, so that
/// a message captured on the way (anyone who can LISTEN can) and sent again is refused.
///
/// A message is accepted once, and only while its `sentAt` is within `window` of the receiver's
/// wall clock. The signatures of accepted messages are kept until their time leaves the window, at
/// most `capacity` of them: when more arrive, the oldest is forgotten and the time it was sent
/// becomes a floor, at or below which every message is refused — so forgetting never lets a replay
/// in, and memory stays bounded whatever arrives.
struct ReplayGuard {
    /// How far a message's time may be from the receiver's, either way, in milliseconds.
    let window: Int64
    /// The most signatures kept.
    let capacity: Int
    private var seen: Set<String> = []
    /// Accepted messages in arrival order, from `head` on (a ring kept compact: see ``forgetOldest()``).
    private var order: [(sentAt: Int64, signature: String)] = []
    private var head = 0
    /// Messages sent at or before this are refused (the newest time forgotten under pressure).
    private(set) var floor = Int64.min

    init(window: Duration, capacity: Int) {
        let milliseconds = window.components.seconds.multipliedReportingOverflow(by: 1_000)
        self.window = milliseconds.overflow ? .max : max(0, milliseconds.partialValue)
        self.capacity = max(1, capacity)
    }

    /// How many signatures are kept (for tests).
    var count: Int { seen.count }

    /// Admits a message with `signature`, sent at `sentAt`, at the receiver's `now` (both in
    /// milliseconds since 1970); `nil` when it is accepted (and remembered), else why not.
    mutating func admit(signature: String, sentAt: Int64, now: Int64) -> AsyncStateInvalidator.Rejection? {
        let (distance, overflow) = now.subtractingReportingOverflow(sentAt)
        guard !overflow, distance.magnitude <= window.magnitude else { return .outsideWindow }
        guard sentAt > floor else { return .replayed }
        // What left the window can no longer be replayed: it is refused by its time.
        while head < order.count, order[head].sentAt < now.subtractingReportingOverflow(window).partialValue {
            forgetOldest()
        }
        guard seen.insert(signature).inserted else { return .replayed }
        order.append((sentAt, signature))
        if seen.count > capacity {
            floor = max(floor, order[head].sentAt)
            forgetOldest()
        }
        return nil
    }

    private mutating func forgetOldest() {
        seen.remove(order[head].signature)
        head += 1
        // Compacted once half is consumed: the array never holds more than twice what is kept.
        if head >= 64, head * 2 >= order.count {
            order.removeFirst(head)
            head = 0
        }
    }
}
