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
/// replica until ``Bus/reconnect()`` (which delivers `.reconnected`),
/// and ``duplicatesDeliveries`` delivers every message twice (at-least-once delivery).
public final class InMemoryInvalidationNetwork: Sendable {
    /// The replicas' connections, held weakly: a bus holds its network, not the reverse.
    private let buses = Mutex<[WeakBus]>([])
    private struct WeakBus: Sendable { weak var bus: Bus? }
    private let duplicates = Atomic<Bool>(false)

    /// An empty network.
    public init() {}

    /// Whether every message is delivered twice.
    public var duplicatesDeliveries: Bool {
        get { duplicates.load(ordering: .relaxed) }
        set { duplicates.store(newValue, ordering: .relaxed) }
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
            for _ in 0..<copies { receiver.deliver(.invalidate(invalidation)) }
        }
    }

    /// One replica's connection to the network.
    public final class Bus: AsyncStateInvalidationBus {
        private struct State {
            var connected = true
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
        /// - Throws: ``Disconnected`` while this replica is disconnected.
        public func publish(_ invalidation: AsyncStateInvalidation) async throws {
            guard state.withLock({ $0.connected }) else { throw Disconnected() }
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
