public import AsyncStateKit
import Synchronization

/// Replicas of a service in one process, for tests of invalidation across replicas: each ``bus()``
/// is one replica's connection, delivering what the others publish.
///
/// ```swift
/// let network = InMemoryInvalidationNetwork()
/// let (a, b) = (AsyncStateInvalidator(bus: network.bus()), AsyncStateInvalidator(bus: network.bus()))
/// ```
///
/// Like a real bus, every stream from ``Bus/deliveries()`` starts with `.reconnected`: it listens
/// from then on, and what was published before is not delivered to it.
///
/// It can misbehave the way real buses do: ``Bus/disconnect()`` loses the messages meant for a
/// replica until ``Bus/reconnect()`` (which delivers `.reconnected`), ``Bus/refusesPublishing``
/// refuses a replica's publications while it still receives (the sender's outage alone),
/// ``duplicatesDeliveries`` delivers every message twice (at-least-once delivery), and on a network
/// made with a clock, ``deliveryDelay`` delays each delivery by a seeded random amount — messages
/// published close together then arrive out of order.
public final class InMemoryInvalidationNetwork: Sendable {
    /// The replicas' connections, held weakly: a bus holds its network, not the reverse.
    private let buses = Mutex<[WeakBus]>([])
    private struct WeakBus: Sendable { weak var bus: Bus? }
    private let duplicates = Atomic<Bool>(false)
    /// The delay range and the generator that draws from it.
    private let delays = Mutex<(range: ClosedRange<Duration>?, random: SplitMix64)>((nil, SplitMix64(seed: 0)))
    /// Runs a delivery after a delay on the network's clock; `nil` without a clock.
    private let later: (@Sendable (Duration, @escaping @Sendable () -> Void) -> Void)?

    /// An empty network, delivering at once.
    public init() { later = nil }

    /// An empty network whose deliveries can be delayed (``deliveryDelay``) on `clock`, each by an
    /// amount drawn from a generator seeded with `seed`: the same seed, the same delays. On a
    /// `VirtualClock` the delayed deliveries take part in its settling.
    public init<C: Clock<Duration>>(clock: C, seed: UInt64) {
        delays.withLock { $0.random = SplitMix64(seed: seed) }
        let virtual = clock as? VirtualClock
        later = { delay, deliver in
            let body: @Sendable () async throws -> Void = {
                try await clock.sleep(for: delay)
                deliver()
            }
            if let virtual { virtual.task(body) } else { Task { try await body() } }
        }
    }

    /// Whether every message is delivered twice.
    public var duplicatesDeliveries: Bool {
        get { duplicates.load(ordering: .relaxed) }
        set { duplicates.store(newValue, ordering: .relaxed) }
    }

    /// How long each delivery takes, drawn for each message and receiver from this range (`nil`, the
    /// default: at once). Only on a network made with a clock (``init(clock:seed:)``); ignored
    /// otherwise. A receiver disconnected when the delivery arrives loses it.
    public var deliveryDelay: ClosedRange<Duration>? {
        get { delays.withLock { $0.range } }
        set { delays.withLock { $0.range = newValue } }
    }

    /// A new replica's connection.
    public func bus() -> Bus {
        let bus = Bus(network: self)
        buses.withLock { buses in
            buses.removeAll { $0.bus == nil }
            buses.append(WeakBus(bus: bus))
        }
        return bus
    }

    fileprivate func send(_ invalidation: AsyncStateInvalidation, from sender: Bus) {
        let receivers = buses.withLock { $0.compactMap(\.bus).filter { $0 !== sender } }
        let copies = duplicatesDeliveries ? 2 : 1
        for receiver in receivers {
            for _ in 0..<copies {
                if let later, let delay = nextDelay() {
                    later(delay) { receiver.deliver(.invalidate(invalidation)) }
                } else {
                    receiver.deliver(.invalidate(invalidation))
                }
            }
        }
    }

    /// The next delivery's delay, if deliveries are delayed.
    private func nextDelay() -> Duration? {
        delays.withLock { delays in
            guard let range = delays.range else { return nil }
            let (low, high) = (range.lowerBound.attoseconds, range.upperBound.attoseconds)
            guard high > low else { return range.lowerBound }
            let span = UInt64(clamping: (high - low) / 1_000_000_000)  // nanoseconds
            let draw = span == .max ? delays.random.next() : delays.random.next() % (span + 1)
            return range.lowerBound + .nanoseconds(Int64(clamping: draw))
        }
    }

    /// One replica's connection to the network.
    public final class Bus: AsyncStateInvalidationBus {
        private struct State {
            var connected = true
            var refusesPublishing = false
            var listeners: [Int: AsyncStream<AsyncStateInvalidationDelivery>.Continuation] = [:]
            var nextListener = 0
            var delivered = 0
            var lost = 0
            var dropped = 0
        }

        private let network: InMemoryInvalidationNetwork
        private let state = Mutex(State())

        fileprivate init(network: InMemoryInvalidationNetwork) {
            self.network = network
        }

        /// Sends `invalidation` to every other replica that is connected.
        ///
        /// - Throws: ``Disconnected`` while this replica is disconnected or refuses to publish.
        public func publish(_ invalidation: AsyncStateInvalidation) async throws {
            guard state.withLock({ $0.connected && !$0.refusesPublishing }) else { throw Disconnected() }
            network.send(invalidation, from: self)
        }

        /// What the other replicas publish, and reconnections, starting with `.reconnected`: this
        /// stream listens from now on, and missed whatever was published before.
        public func deliveries() -> AsyncStream<AsyncStateInvalidationDelivery> {
            let (stream, continuation) = AsyncStream.makeStream(of: AsyncStateInvalidationDelivery.self)
            // Before the stream is registered, so that nothing is delivered to it before this.
            continuation.yield(.reconnected)
            let id = state.withLock { state in
                state.nextListener += 1
                state.listeners[state.nextListener] = continuation
                state.delivered += 1
                return state.nextListener
            }
            continuation.onTermination = { [weak self] _ in
                _ = self?.state.withLock { $0.listeners.removeValue(forKey: id) }
            }
            return stream
        }

        /// Loses every message meant for this replica, and refuses its publications, until
        /// ``reconnect()``.
        public func disconnect() {
            state.withLock { $0.connected = false }
        }

        /// Whether this replica's publications are refused (``publish(_:)`` throws) while it still
        /// receives the others': the sender's outage alone.
        public var refusesPublishing: Bool {
            get { state.withLock { $0.refusesPublishing } }
            set { state.withLock { $0.refusesPublishing = newValue } }
        }

        /// Connects again and delivers `.reconnected`.
        public func reconnect() {
            state.withLock { $0.connected = true }
            deliver(.reconnected, evenIfDisconnected: true)
        }

        /// How many deliveries reached at least one listener (each stream's first `.reconnected`
        /// included), how many were lost while this replica was disconnected, and how many were
        /// dropped because nobody listened (no stream from ``deliveries()`` was open).
        public var counts: (delivered: Int, lost: Int, dropped: Int) {
            state.withLock { ($0.delivered, $0.lost, $0.dropped) }
        }

        /// How many streams from ``deliveries()`` are open.
        public var listenerCount: Int { state.withLock { $0.listeners.count } }

        /// Ends every stream from ``deliveries()`` (the bus shut down).
        public func shutDown() {
            let listeners = state.withLock { state in
                defer { state.listeners = [:] }
                return state.listeners
            }
            for listener in listeners.values { listener.finish() }
        }

        fileprivate func deliver(_ delivery: AsyncStateInvalidationDelivery, evenIfDisconnected: Bool = false) {
            let listeners = state.withLock { state -> [AsyncStream<AsyncStateInvalidationDelivery>.Continuation] in
                guard state.connected || evenIfDisconnected else {
                    state.lost += 1
                    return []
                }
                guard !state.listeners.isEmpty else {
                    state.dropped += 1
                    return []
                }
                state.delivered += 1
                return Array(state.listeners.values)
            }
            for listener in listeners { listener.yield(delivery) }
        }
    }

    /// What ``Bus/publish(_:)`` throws while its replica is disconnected.
    public struct Disconnected: Error, Sendable {}
}
