import Foundation

/// The service's configuration, as its source (a config service, a database row) holds it.
public struct ServiceConfig: Codable, Sendable, Equatable {
    /// Bumped on every change at the source.
    public var version: Int
    /// Feature flags by name.
    public var features: [String: Bool]

    /// Creates a configuration.
    public init(version: Int, features: [String: Bool]) {
        self.version = version
        self.features = features
    }
}

/// Exchange rates against one base currency.
public struct Rates: Codable, Sendable, Equatable {
    /// The currency the rates are quoted against.
    public var base: String
    /// Units of each currency per unit of `base`.
    public var rates: [String: Double]

    /// Creates rates.
    public init(base: String, rates: [String: Double]) {
        self.base = base
        self.rates = rates
    }
}

/// A user's profile.
public struct Profile: Codable, Sendable, Equatable {
    /// The user's id.
    public var id: Int
    /// The user's display name.
    public var name: String

    /// Creates a profile.
    public init(id: Int, name: String) {
        self.id = id
        self.name = name
    }
}

/// What an upstream can answer besides a value.
public enum UpstreamError: Error, Equatable, Sendable {
    /// The thing asked for does not exist (mapped to 404).
    case notFound
    /// The upstream could not answer (mapped to 503, or to the stale value when there is one).
    case unavailable
}

/// Where the service's data comes from: slow and sometimes down. The states in ``Catalog`` call it
/// only when their data is not fresh.
public protocol Upstream: Sendable {
    /// The current configuration.
    func config() async throws -> ServiceConfig
    /// The current exchange rates.
    func rates() async throws -> Rates
    /// The profile of user `id`; throws ``UpstreamError/notFound`` for an unknown id.
    func profile(_ id: Int) async throws -> Profile
    /// The profiles of `ids`, in one call (a batch endpoint); an unknown id is left out of the answer.
    func profiles(_ ids: [Int]) async throws -> [Int: Profile]
}

/// A bad day for the simulated upstream, from its start: after `after`, every call fails for `down`
/// (``UpstreamError/unavailable``), then answers after `slowLatency` for `slow`, then recovers.
public struct UpstreamOutage: Sendable, Equatable {
    public var after: Duration
    public var down: Duration
    public var slow: Duration
    public var slowLatency: Duration

    /// Creates an outage schedule.
    public init(after: Duration, down: Duration, slow: Duration, slowLatency: Duration) {
        (self.after, self.down, self.slow, self.slowLatency) = (after, down, slow, slowLatency)
    }
}

/// An in-process stand-in for a real upstream: each call sleeps `latency` on `clock` (a
/// `ContinuousClock` when running, a `VirtualClock` in tests) and answers; ids above 1,000,000 are
/// unknown. An ``UpstreamOutage`` makes it fail, then slow, for a while. Replace it with your
/// database or HTTP client.
public struct SimulatedUpstream<C: Clock<Duration>>: Upstream {
    /// How long each call takes.
    public var latency: Duration
    /// The clock the calls sleep on.
    public var clock: C
    /// The outage to play, counted from `start`; `nil` for none.
    public var outage: UpstreamOutage?
    /// When the upstream was made.
    public let start: C.Instant

    /// Creates an upstream whose calls take `latency` on `clock`, and that plays `outage` from now.
    public init(latency: Duration, clock: C, outage: UpstreamOutage? = nil) {
        self.latency = latency
        self.clock = clock
        self.outage = outage
        start = clock.now
    }

    /// Waits as a call does now — or throws, while the outage is down.
    private func call() async throws {
        guard let outage else { return try await clock.sleep(for: latency) }
        let elapsed = start.duration(to: clock.now)
        let downEnds = outage.after + outage.down
        if elapsed >= outage.after, elapsed < downEnds { throw UpstreamError.unavailable }
        try await clock.sleep(
            for: elapsed >= downEnds && elapsed < downEnds + outage.slow ? outage.slowLatency : latency)
    }

    public func config() async throws -> ServiceConfig {
        try await call()
        return ServiceConfig(version: 1, features: ["search": true, "beta-checkout": false])
    }

    public func rates() async throws -> Rates {
        try await call()
        return Rates(base: "EUR", rates: ["USD": 1.08, "GBP": 0.85, "JPY": 163.2])
    }

    public func profile(_ id: Int) async throws -> Profile {
        try await call()
        guard let profile = Self.profile(id) else { throw UpstreamError.notFound }
        return profile
    }

    public func profiles(_ ids: [Int]) async throws -> [Int: Profile] {
        try await call()
        var profiles: [Int: Profile] = [:]
        for id in ids { profiles[id] = Self.profile(id) }
        return profiles
    }

    /// The profile of user `id`, or `nil` if there is no such user.
    private static func profile(_ id: Int) -> Profile? {
        (0...1_000_000).contains(id) ? Profile(id: id, name: "user \(id)") : nil
    }
}
