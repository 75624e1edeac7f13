import Foundation
import Logging
import NIOSSL
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
/// | `PROFILE_BATCH_WINDOW` | 0.002 | How long `GET /profiles/:id` collects missed ids into one upstream batch call. |
/// | `PROFILE_BATCH_SIZE` | 100 | The most ids one such batch call asks for. |
/// | `RETRY_ATTEMPTS` | 3 | Attempts per fetch, the first included. |
/// | `RETRY_INITIAL_DELAY` | 0.1 | The first backoff; doubled after each failure. |
/// | `FETCH_TIMEOUT` | 2 | Longest an attempt may take. |
/// | `FAILURE_EXPIRY` | 1 | How long a failure is answered without asking the upstream again (`Retry-After`). |
/// | `SOFT_TIMEOUT` | 0 (off) | How long a request waits for a fetch before it gets the value held instead; the fetch goes on and its result lands. Below `FETCH_TIMEOUT`. |
/// | `MAX_STALE_AGE` | 0 (off) | Fail-safe: while the upstream fails, a value younger than this is answered instead of the failure (`GET /profiles/:id` answers it; the snapshot routes serve their last value on a failure anyway). |
/// | `UPSTREAM_LATENCY` | 0.02 | How long the simulated upstream takes per call. |
/// | `UPSTREAM_OUTAGE` | (none) | `after,down,slow,latency` in seconds: from `after` seconds after the start, the simulated upstream fails for `down` seconds, then takes `latency` per call for `slow` seconds (to try fail-safe and the soft timeout under load). |
/// | `STATE_FILE` | (none) | Where the states are saved on shutdown and loaded from at start (warm restarts). |
/// | `TRACE_FILE` | (none) | Record spans with the in-memory tracer and write them to this file as JSON lines (see `TraceExport`: mode 0600, a symbolic link refused); without it, spans go to whatever tracer is bootstrapped (none: they cost nothing). |
/// | `TENANT_EXPIRY` | 60 | How long a tenant's configuration is fresh: the longest a replica can serve an old one if an invalidation is lost. |
/// | `TENANT_READ_LATENCY` | 0 | How much longer each read of the tenant store takes (a slow source, to watch the replicas wait for one another's load). |
/// | `TENANT_MAX_BYTES` | 67108864 | What the cached tenants' settings may weigh together, in bytes. |
/// | `WRITE_TOKEN` | (none) | The bearer token `PUT /config/:tenant` requires (at least 16 characters); without it, writes are refused. |
/// | `POSTGRES_URL` | (none) | `postgres://user[:password]@host[:port]/database[?sslmode=disable\|require\|verify-full]`: tenants live there, and replicas invalidate each other through it. Without it, tenants live in memory. TLS is verified (`verify-full`) by default for any host but the loopback, where the default is `disable`; TLS is required for any other host. |
/// | `INVALIDATION_CHANNEL` | async_state_invalidations | The `NOTIFY` channel the replicas share. |
/// | `INVALIDATION_SECRET` | (none; required with `POSTGRES_URL`) | The secret the replicas sign their invalidations with (HMAC-SHA256, at least 32 bytes): a message without a valid signature, or replayed, is dropped. Several, separated by spaces, while rotating: the first signs, any is accepted. |
/// | `SECOND_LEVEL` | on | With `POSTGRES_URL`: `on` shares the tenants the replicas load in PostgreSQL (`PostgresSecondLevel`), so that the fleet costs the tenant store one read per change; `off`: each replica reads its own. |
/// | `STORE_TIMEOUT` | 2 | The longest one call to the tenant store may take (a read, a write, the readiness probe): past it the caller gets 503 with a message naming what is unreachable, and a request never outlasts it by much. |
/// | `STORE_PROBE_EVERY` | 5 | How often the readiness probe asks the tenant store for a row (`/ready` is 503, with the reason, while it fails). |
/// | `SECOND_LEVEL_WRITES` | foreground | `background`: a replica that loaded a tenant answers as soon as the tenant store does, and writes it to the second level afterwards (`AsyncStateSecondLevelOptions.writesInBackground`: safe here, where every replica hears invalidations); `foreground`: after the write. |
/// | `SECOND_LEVEL_TIMEOUT` | 0.25 | The longest one call to the second level may take before the load goes to the tenant store instead (and the second level is skipped for a backoff). |
/// | `INVALIDATE_ALL_INTERVAL` | 1 | The shortest time between two invalidations of every tenant caused by messages (more are coalesced). |
///
/// No error ever shows a secret: a URL's password is replaced by `***`, and the values of
/// `WRITE_TOKEN` and `INVALIDATION_SECRET` by their length.
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
    public var profileBatchWindow = Duration.milliseconds(2)
    public var profileBatchSize = 100
    public var retryAttempts = 3
    public var retryInitialDelay = Duration.milliseconds(100)
    public var fetchTimeout = Duration.seconds(2)
    public var failureExpiry = Duration.seconds(1)
    /// Fail-safe's maximum stale age; `nil` for off.
    public var maxStaleAge: Duration?
    /// The soft timeout of every fetch; `nil` for off.
    public var softTimeout: Duration?
    public var upstreamLatency = Duration.milliseconds(20)
    public var upstreamOutage: UpstreamOutage?
    public var stateFile: String?
    /// Where spans are written (`TRACE_FILE`); `nil` for nowhere.
    public var traceFile: String?
    public var tenantExpiry = Duration.seconds(60)
    public var tenantMaximumBytes = 64 << 20
    /// How much longer each read of the tenant store takes.
    public var tenantReadLatency = Duration.zero
    public var writeToken: String?
    public var postgres: PostgresSettings?
    public var invalidationChannel = "async_state_invalidations"
    /// The invalidation secrets: the first signs, any is accepted (several while rotating).
    public var invalidationSecrets: [String]?
    public var invalidateAllInterval = Duration.seconds(1)
    /// Whether tenants go through a second level in PostgreSQL (with ``postgres`` only).
    public var secondLevel = true
    /// Whether a replica answers a miss before its second-level write (`SECOND_LEVEL_WRITES=background`).
    public var secondLevelWritesInBackground = false
    /// The longest one call to the second level may take.
    public var secondLevelTimeout = Duration.milliseconds(250)
    /// The longest one call to the tenant store may take.
    public var storeTimeout = Duration.seconds(2)
    /// How often the readiness probe asks the tenant store.
    public var storeProbeInterval = Duration.seconds(5)

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
        profileBatchWindow = try read.seconds("PROFILE_BATCH_WINDOW", allowingZero: true) ?? profileBatchWindow
        profileBatchSize = try read.integer("PROFILE_BATCH_SIZE", in: 1...10_000) ?? profileBatchSize
        retryAttempts = try read.integer("RETRY_ATTEMPTS", in: 1...100) ?? retryAttempts
        retryInitialDelay = try read.seconds("RETRY_INITIAL_DELAY", allowingZero: true) ?? retryInitialDelay
        fetchTimeout = try read.seconds("FETCH_TIMEOUT") ?? fetchTimeout
        failureExpiry = try read.seconds("FAILURE_EXPIRY", allowingZero: true) ?? failureExpiry
        if let age = try read.seconds("MAX_STALE_AGE", allowingZero: true) { maxStaleAge = age > .zero ? age : nil }
        if let soft = try read.seconds("SOFT_TIMEOUT", allowingZero: true) { softTimeout = soft > .zero ? soft : nil }
        upstreamLatency = try read.seconds("UPSTREAM_LATENCY", allowingZero: true) ?? upstreamLatency
        upstreamOutage = try read.outage("UPSTREAM_OUTAGE")
        stateFile = read.string("STATE_FILE")
        traceFile = read.string("TRACE_FILE")
        tenantExpiry = try read.seconds("TENANT_EXPIRY") ?? tenantExpiry
        tenantReadLatency = try read.seconds("TENANT_READ_LATENCY", allowingZero: true) ?? tenantReadLatency
        tenantMaximumBytes = try read.integer("TENANT_MAX_BYTES", in: 1...(1 << 40)) ?? tenantMaximumBytes
        if let token = read.string("WRITE_TOKEN") {
            guard token.count >= 16 else {
                throw SettingsError(
                    variable: "WRITE_TOKEN", value: "(\(token.count) characters)", expected: "at least 16 characters")
            }
            writeToken = token
        }
        if let url = read.string("POSTGRES_URL") {
            do {
                postgres = try PostgresSettings(url: url)
            } catch {
                throw SettingsError(
                    variable: "POSTGRES_URL", value: PostgresSettings.redacting(url),
                    expected: "postgres://user[:password]@host[:port]/database[?sslmode=…] (\(error))")
            }
        }
        if let secret = read.string("INVALIDATION_SECRET") {
            // Several, separated by spaces, while the fleet rotates its secret (see HMACAuthenticator).
            let secrets = secret.split(whereSeparator: \.isWhitespace).map(String.init)
            let minimum = HMACAuthenticator.minimumSecretBytes
            guard !secrets.isEmpty, secrets.allSatisfy({ $0.utf8.count >= minimum }) else {
                // Lengths only: never a secret, nor a part of one.
                let lengths = secrets.map { "\($0.utf8.count) bytes" }.joined(separator: ", ")
                throw SettingsError(
                    variable: "INVALIDATION_SECRET", value: "(\(lengths.isEmpty ? "blank" : lengths))",
                    expected: "at least \(minimum) bytes each (several separated by spaces while rotating)")
            }
            invalidationSecrets = secrets
        } else if postgres != nil {
            throw SettingsError(
                variable: "INVALIDATION_SECRET", value: "(unset)",
                expected: "a secret of at least \(HMACAuthenticator.minimumSecretBytes) bytes with POSTGRES_URL "
                    + "(anyone who can connect to the database could otherwise invalidate every replica)")
        }
        invalidateAllInterval =
            try read.seconds("INVALIDATE_ALL_INTERVAL", allowingZero: true) ?? invalidateAllInterval
        secondLevel = try read.choice("SECOND_LEVEL", [("on", true), ("off", false)]) ?? secondLevel
        secondLevelWritesInBackground =
            try read.choice("SECOND_LEVEL_WRITES", [("foreground", false), ("background", true)])
            ?? secondLevelWritesInBackground
        secondLevelTimeout = try read.seconds("SECOND_LEVEL_TIMEOUT") ?? secondLevelTimeout
        storeTimeout = try read.seconds("STORE_TIMEOUT") ?? storeTimeout
        storeProbeInterval = try read.seconds("STORE_PROBE_EVERY") ?? storeProbeInterval
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

/// Where the PostgreSQL server is, and how to reach it, from `POSTGRES_URL`.
///
/// TLS follows libpq's `sslmode`: `verify-full` (the default) encrypts and verifies the server's
/// certificate and host name against the system's trust store; `require` encrypts without
/// verifying (it does not stop someone on the path who can answer as the server); `disable` sends
/// everything in clear, and is accepted only for a server on the loopback interface. Anyone on the
/// path of a clear connection can read tenants' data, inject notifications, or ask the driver for a
/// clear-text password.
public struct PostgresSettings: Sendable, Equatable {
    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String
    public var sslMode: SSLMode

    /// How the connections use TLS (libpq's `sslmode` values that the service supports).
    public enum SSLMode: String, Sendable, Equatable, CaseIterable {
        /// No TLS: only for a server on the loopback interface.
        case disable
        /// TLS, the server's certificate not verified.
        case require
        /// TLS, the server's certificate and host name verified.
        case verifyFull = "verify-full"
    }

    /// Why a `POSTGRES_URL` was refused (never quoting it: it may hold a password).
    public struct URLError: Error, Equatable, CustomStringConvertible {
        public var reason: String
        public var description: String { reason }
    }

    /// Parses `postgres://user[:password]@host[:port]/database[?sslmode=…]` (or `postgresql://`).
    /// No other query parameter is accepted: one the service would silently ignore (`sslrootcert`,
    /// a misspelled `sslmode`) would leave the connection less safe than its operator thinks.
    ///
    /// - Throws: ``URLError`` saying what is wrong.
    public init(url: String) throws(URLError) {
        guard let components = URLComponents(string: url), ["postgres", "postgresql"].contains(components.scheme)
        else { throw URLError(reason: "not a postgres:// URL") }
        guard let host = components.host, !host.isEmpty else { throw URLError(reason: "no host") }
        guard let username = components.user, !username.isEmpty else { throw URLError(reason: "no user") }
        let database = String(components.path.drop { $0 == "/" })
        guard !database.isEmpty, !database.contains("/") else {
            throw URLError(reason: "no database, or more than one")
        }
        if let port = components.port, !(1...65_535).contains(port) { throw URLError(reason: "a port out of range") }
        var sslMode: SSLMode?
        for item in components.queryItems ?? [] {
            guard item.name == "sslmode", sslMode == nil else {
                throw URLError(reason: "the query parameter \"\(item.name)\" is not supported (only sslmode, once)")
            }
            guard let mode = item.value.flatMap(SSLMode.init(rawValue:)) else {
                throw URLError(reason: "sslmode must be disable, require or verify-full")
            }
            sslMode = mode
        }
        let isLoopback = Self.isLoopback(host)
        let mode = sslMode ?? (isLoopback ? .disable : .verifyFull)
        guard mode != .disable || isLoopback else {
            throw URLError(reason: "sslmode=disable is accepted only for a loopback host, not \(host)")
        }
        self.host = host
        self.port = components.port ?? 5432
        self.username = username
        self.password = components.password
        self.database = database
        self.sslMode = mode
    }

    /// Whether `host` is the loopback interface (`localhost`, `127.0.0.0/8`, `::1`).
    static func isLoopback(_ host: String) -> Bool {
        let host = host.lowercased()
        if host == "localhost" || host == "::1" || host == "[::1]" { return true }
        let octets = host.split(separator: ".", omittingEmptySubsequences: false)
        return octets.count == 4 && octets[0] == "127" && octets.allSatisfy { UInt8($0) != nil }
    }

    /// `url` with its password, if any, replaced by `***`: what an error may show. Written for every
    /// spelling libpq accepts and the mistakes people make, never trusting a URL parser: a password
    /// in the user information (up to the last `@`, whatever it holds — `#`, `@`, `:`), after a
    /// scheme misspelled (`postgres//`, `postgres:/`) or without one; a `password` parameter (and
    /// `sslpassword`) in the query; and a key-value connection string (`host=db password='…'`), of
    /// which only the host, port, database, user and sslmode are shown. It may hide more than the
    /// password (a host after an `@` in the query), never less.
    public static func redacting(_ url: String) -> String {
        if !url.contains("://"), url.contains("=") { return redactingKeyValues(url) }
        var head: Substring = ""
        var tail = Substring(url)
        if let at = url.lastIndex(of: "@") {
            var userInfo = url[..<at]
            tail = url[url.index(after: at)...]
            // A scheme, spelled right (`postgres://`, or any other, which the caller then refuses).
            if let scheme = userInfo.range(of: "://"),
                userInfo[..<scheme.lowerBound].allSatisfy({
                    $0.isASCII && ($0.isLetter || $0.isNumber || "+.-".contains($0))
                })
            {
                head = userInfo[..<scheme.upperBound]
                userInfo = userInfo[scheme.upperBound...]
            }
            if let colon = userInfo.firstIndex(of: ":") { userInfo = userInfo[..<colon] + ":***" }
            head += userInfo + "@"
        }
        return String(head) + redactingPasswordParameters(String(tail))
    }

    /// A quoted value as libpq reads one: `'…'` with `\'` and `\\` escapes, up to its closing quote
    /// or, unterminated, to the end (all of it may be a secret).
    private static let quotedValue = #"'(?:[^'\\]|\\.)*(?:'|$)"#

    /// `text` with the value of every parameter whose name ends in `password` replaced by `***`:
    /// up to the next `&` or space, or, quoted, to its closing quote (or the end).
    static func redactingPasswordParameters(_ text: String) -> String {
        guard
            let pattern = try? NSRegularExpression(
                pattern: #"(?i)(password\s*=\s*)(?:"# + quotedValue + #"|[^&\s]*)"#)
        else { return "***" }
        return pattern.stringByReplacingMatches(
            in: text, range: NSRange(text.startIndex..., in: text), withTemplate: "$1***")
    }

    /// A libpq key-value connection string, showing only the keys that hold no secret.
    static func redactingKeyValues(_ text: String) -> String {
        let shown: Set<String> = ["host", "hostaddr", "port", "dbname", "user", "sslmode"]
        guard
            let pattern = try? NSRegularExpression(
                pattern: #"([A-Za-z_]+)\s*=\s*("# + quotedValue + #"|\S*)"#)
        else { return "(a connection string of \(text.utf8.count) bytes)" }
        let range = NSRange(text.startIndex..., in: text)
        let parts = pattern.matches(in: text, range: range).compactMap { match -> String? in
            guard let key = Range(match.range(at: 1), in: text).map({ String(text[$0]) }),
                let value = Range(match.range(at: 2), in: text).map({ String(text[$0]) })
            else { return nil }
            return shown.contains(key.lowercased()) ? "\(key)=\(value)" : "\(key)=***"
        }
        return parts.isEmpty ? "(a connection string of \(text.utf8.count) bytes)" : parts.joined(separator: " ")
    }

    /// The TLS configuration of `sslMode` (`nil` for `disable`).
    private var tlsConfiguration: TLSConfiguration? {
        switch sslMode {
        case .disable:
            return nil
        case .require:
            var configuration = TLSConfiguration.makeClientConfiguration()
            configuration.certificateVerification = .none
            return configuration
        case .verifyFull:
            return TLSConfiguration.makeClientConfiguration()  // full verification, the system's roots
        }
    }

    /// The configuration of the service's connection pool.
    public var client: PostgresClient.Configuration {
        PostgresClient.Configuration(
            host: host, port: port, username: username, password: password, database: database,
            tls: tlsConfiguration.map { .require($0) } ?? .disable)
    }

    /// The configuration of a single connection (the invalidation listener's).
    ///
    /// - Throws: NIOSSL's error when the TLS context cannot be made (the system's trust store).
    public func connection() throws -> PostgresConnection.Configuration {
        PostgresConnection.Configuration(
            host: host, port: port, username: username, password: password, database: database,
            tls: try tlsConfiguration.map { .require(try NIOSSLContext(configuration: $0)) } ?? .disable)
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

    /// One of `words`, in any case: its value.
    func choice<Value>(_ name: String, _ words: [(String, Value)]) throws(SettingsError) -> Value? {
        guard let text = string(name) else { return nil }
        guard let (_, value) = words.first(where: { $0.0 == text.lowercased() }) else {
            throw SettingsError(variable: name, value: text, expected: words.map(\.0).joined(separator: " or "))
        }
        return value
    }

    /// `after,down,slow,latency`: four numbers of seconds, each 0 to a year.
    func outage(_ name: String) throws(SettingsError) -> UpstreamOutage? {
        guard let text = string(name) else { return nil }
        let malformed = SettingsError(variable: name, value: text, expected: "after,down,slow,latency in seconds")
        let parts = text.split(separator: ",", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 4 else { throw malformed }
        var fields: [Duration] = []
        for part in parts {
            // Each part as its own variable would be read: a number of seconds, 0 to a year.
            guard let field = try? EnvironmentReader(environment: [name: part]).seconds(name, allowingZero: true)
            else { throw malformed }
            fields.append(field)
        }
        return UpstreamOutage(after: fields[0], down: fields[1], slow: fields[2], slowLatency: fields[3])
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
