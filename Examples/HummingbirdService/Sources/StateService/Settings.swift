import Foundation
import Logging
import PostgresInvalidation
import PostgresNIO

/// Everything an operator may tune, read from environment variables (durations in seconds, decimals
/// allowed). Unset variables keep the defaults; a malformed or out-of-range one is an error that
/// names it, so a typo stops the service at start instead of running it with a surprise.
///
/// | Variable | Default | Meaning |
/// |---|---|---|
/// | `HOST`, `PORT` | 127.0.0.1, 8080 | Where the server listens. |
/// | `LOG_LEVEL` | info | swift-log level (`trace` shows every hit). |
/// | `CONFIG_EXPIRY` | 60 | How long the configuration is fresh. |
/// | `CONFIG_REFRESH_EVERY` | 30 | Background refresh interval of the configuration. |
/// | `RATES_EXPIRY` | 5 | How long rates are fresh (stale ones are served while refreshing). |
/// | `PROFILE_EXPIRY` | 30 | How long a profile is fresh; refreshed ahead from 80 %. |
/// | `PROFILE_CAPACITY` | 10000 | Profiles kept at most. |
/// | `PROFILE_IDLE_EXPIRY` | 600 | A profile nobody read for this long is dropped. |
/// | `RETRY_ATTEMPTS` | 3 | Attempts per fetch, the first included. |
/// | `RETRY_INITIAL_DELAY` | 0.1 | The first backoff; doubled after each failure. |
/// | `FETCH_TIMEOUT` | 2 | Longest an attempt may take. |
/// | `FAILURE_EXPIRY` | 1 | How long a failure is answered without asking the upstream again (`Retry-After`). |
/// | `UPSTREAM_LATENCY` | 0.02 | How long the simulated upstream takes per call. |
/// | `STATE_FILE` | (none) | Where the states are saved on shutdown and loaded from at start (warm restarts). |
/// | `TENANT_EXPIRY` | 60 | How long a tenant's configuration is fresh: the longest a replica can serve an old one if an invalidation is lost. |
/// | `POSTGRES_URL` | (none) | `postgres://user[:password]@host[:port]/database`: tenants live there, and replicas invalidate each other through it. Without it, tenants live in memory. |
/// | `INVALIDATION_CHANNEL` | async_state_invalidations | The `NOTIFY` channel the replicas share. |
public struct Settings: Sendable, Equatable {
    public var host = "127.0.0.1"
    public var port = 8080
    public var logLevel = Logger.Level.info
    public var configExpiry = Duration.seconds(60)
    public var configRefreshInterval = Duration.seconds(30)
    public var ratesExpiry = Duration.seconds(5)
    public var profileExpiry = Duration.seconds(30)
    public var profileCapacity = 10_000
    public var profileIdleExpiry = Duration.seconds(600)
    public var retryAttempts = 3
    public var retryInitialDelay = Duration.milliseconds(100)
    public var fetchTimeout = Duration.seconds(2)
    public var failureExpiry = Duration.seconds(1)
    public var upstreamLatency = Duration.milliseconds(20)
    public var stateFile: String?
    public var tenantExpiry = Duration.seconds(60)
    public var postgres: PostgresSettings?
    public var invalidationChannel = "async_state_invalidations"

    /// The defaults.
    public init() {}

    /// The defaults, overridden by the variables set in `environment`.
    ///
    /// - Throws: ``SettingsError`` naming the first malformed or out-of-range variable.
    public init(environment: [String: String]) throws(SettingsError) {
        let read = EnvironmentReader(environment: environment)
        host = read.string("HOST") ?? host
        port = try read.integer("PORT", in: 0...65_535) ?? port
        if let level = read.string("LOG_LEVEL") {
            guard let parsed = Logger.Level(rawValue: level.lowercased()) else {
                throw SettingsError(variable: "LOG_LEVEL", value: level, expected: "trace…critical")
            }
            logLevel = parsed
        }
        configExpiry = try read.seconds("CONFIG_EXPIRY") ?? configExpiry
        configRefreshInterval = try read.seconds("CONFIG_REFRESH_EVERY") ?? configRefreshInterval
        ratesExpiry = try read.seconds("RATES_EXPIRY") ?? ratesExpiry
        profileExpiry = try read.seconds("PROFILE_EXPIRY") ?? profileExpiry
        profileCapacity = try read.integer("PROFILE_CAPACITY", in: 1...100_000_000) ?? profileCapacity
        profileIdleExpiry = try read.seconds("PROFILE_IDLE_EXPIRY") ?? profileIdleExpiry
        retryAttempts = try read.integer("RETRY_ATTEMPTS", in: 1...100) ?? retryAttempts
        retryInitialDelay = try read.seconds("RETRY_INITIAL_DELAY", allowingZero: true) ?? retryInitialDelay
        fetchTimeout = try read.seconds("FETCH_TIMEOUT") ?? fetchTimeout
        failureExpiry = try read.seconds("FAILURE_EXPIRY", allowingZero: true) ?? failureExpiry
        upstreamLatency = try read.seconds("UPSTREAM_LATENCY", allowingZero: true) ?? upstreamLatency
        stateFile = read.string("STATE_FILE")
        tenantExpiry = try read.seconds("TENANT_EXPIRY") ?? tenantExpiry
        if let url = read.string("POSTGRES_URL") {
            guard let parsed = PostgresSettings(url: url) else {
                throw SettingsError(
                    variable: "POSTGRES_URL", value: url, expected: "postgres://user[:password]@host[:port]/database")
            }
            postgres = parsed
        }
        if let channel = read.string("INVALIDATION_CHANNEL") {
            guard PostgresInvalidationBus.isValidChannel(channel) else {
                throw SettingsError(
                    variable: "INVALIDATION_CHANNEL", value: channel,
                    expected: "1 to 63 lowercase letters, digits and underscores, not starting with a digit")
            }
            invalidationChannel = channel
        }
    }
}

/// Where the PostgreSQL server is, from `POSTGRES_URL` (no TLS: for a server on the same host or
/// network; add TLS settings for anything else).
public struct PostgresSettings: Sendable, Equatable {
    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String

    /// Parses `postgres://user[:password]@host[:port]/database` (or `postgresql://`).
    public init?(url: String) {
        guard let components = URLComponents(string: url), ["postgres", "postgresql"].contains(components.scheme),
            let host = components.host, !host.isEmpty, let username = components.user, !username.isEmpty
        else { return nil }
        let database = String(components.path.drop { $0 == "/" })
        guard !database.isEmpty, !database.contains("/") else { return nil }
        if let port = components.port, !(1...65_535).contains(port) { return nil }
        self.host = host
        self.port = components.port ?? 5432
        self.username = username
        self.password = components.password
        self.database = database
    }

    /// The configuration of the service's connection pool.
    public var client: PostgresClient.Configuration {
        PostgresClient.Configuration(
            host: host, port: port, username: username, password: password, database: database, tls: .disable)
    }

    /// The configuration of a single connection (the invalidation listener's).
    public var connection: PostgresConnection.Configuration {
        PostgresConnection.Configuration(
            host: host, port: port, username: username, password: password, database: database, tls: .disable)
    }
}

/// A variable that could not be used, and what it should look like.
public struct SettingsError: Error, Equatable, CustomStringConvertible {
    public var variable: String
    public var value: String
    public var expected: String

    public var description: String { "\(variable)=\(value): expected \(expected)" }
}

/// Parses variables, naming the variable in every error.
private struct EnvironmentReader {
    let environment: [String: String]

    func string(_ name: String) -> String? {
        guard let value = environment[name]?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
        return value
    }

    func integer(_ name: String, in range: ClosedRange<Int>) throws(SettingsError) -> Int? {
        guard let text = string(name) else { return nil }
        guard let value = Int(text), range.contains(value) else {
            throw SettingsError(variable: name, value: text, expected: "an integer in \(range)")
        }
        return value
    }

    /// Seconds, up to a year: a positive decimal (or zero, if `allowingZero`).
    func seconds(_ name: String, allowingZero: Bool = false) throws(SettingsError) -> Duration? {
        guard let text = string(name) else { return nil }
        let year = 365.0 * 24 * 3600
        guard let value = Double(text), value.isFinite, value <= year, allowingZero ? value >= 0 : value > 0 else {
            throw SettingsError(
                variable: name, value: text, expected: "seconds, \(allowingZero ? "0" : "above 0") to \(Int(year))")
        }
        return .nanoseconds(Int64((value * 1e9).rounded()))
    }
}
