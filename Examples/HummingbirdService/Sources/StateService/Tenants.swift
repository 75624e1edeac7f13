import Foundation
import Logging
import PostgresFleetCache
import PostgresNIO
import Synchronization

/// A tenant's configuration, as the database holds it.
public struct TenantConfig: Codable, Sendable, Equatable {
    /// The tenant's id.
    public var tenant: String
    /// Bumped by every write, starting at 1.
    public var version: Int
    /// The tenant's settings.
    public var settings: [String: String]

    /// Creates a configuration.
    public init(tenant: String, version: Int, settings: [String: String]) {
        self.tenant = tenant
        self.version = version
        self.settings = settings
    }

    /// What the cache files this tenant under (see `Catalog.invalidateTenants(tag:)`): `plan:<name>`
    /// when its `plan` setting names one, else none.
    public var tags: [String] { settings["plan"].map { ["plan:\($0)"] } ?? [] }

    /// The most settings a tenant has, and the longest key and value, in UTF-8 bytes: what a write
    /// may hold (see ``validate(_:)``).
    public static let maximumSettings = 64
    public static let maximumKeyBytes = 64
    public static let maximumValueBytes = 1_024

    /// What a write's settings break, if anything: a fixed message that never echoes the input.
    public static func validate(_ settings: [String: String]) -> String? {
        guard settings.count <= maximumSettings else { return "at most \(maximumSettings) settings" }
        guard settings.allSatisfy({ (1...maximumKeyBytes).contains($0.key.utf8.count) }) else {
            return "a setting's name is 1 to \(maximumKeyBytes) bytes"
        }
        guard settings.values.allSatisfy({ $0.utf8.count <= maximumValueBytes }) else {
            return "a setting's value is at most \(maximumValueBytes) bytes"
        }
        return nil
    }

    /// About what the configuration takes in memory, in bytes: the tenants family's weight.
    public var weight: Int {
        64 + tenant.utf8.count + settings.reduce(0) { $0 + 32 + $1.key.utf8.count + $1.value.utf8.count }
    }

    /// Whether `id` can name a tenant: 1 to 64 ASCII letters, digits, `-` and `_`.
    public static func isValidID(_ id: String) -> Bool {
        (1...64).contains(id.utf8.count)
            && id.utf8.allSatisfy { byte in
                switch byte {
                case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                    UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"):
                    return true
                default:
                    return false
                }
            }
    }
}

/// Where tenants' configurations are written and read: shared by every replica of the service
/// (``PostgresTenantStore``), or in memory for a single process and tests (``InMemoryTenantStore``).
public protocol TenantStore: Sendable {
    /// The configuration of `tenant`; throws ``UpstreamError/notFound`` for a tenant never written.
    func tenant(_ tenant: String) async throws -> TenantConfig
    /// Replaces the settings of `tenant` (creating it at version 1), bumping its version.
    func write(_ tenant: String, settings: [String: String]) async throws -> TenantConfig
    /// Asks the store for nothing in particular, to learn whether it answers (the readiness probe).
    func probe() async throws
}

extension TenantStore {
    /// A store in memory always answers.
    public func probe() async throws {}
}

/// Tenants in this process's memory.
public final class InMemoryTenantStore: TenantStore {
    private let tenants = Mutex<[String: TenantConfig]>([:])

    /// An empty store.
    public init() {}

    public func tenant(_ tenant: String) async throws -> TenantConfig {
        guard let config = tenants.withLock({ $0[tenant] }) else { throw UpstreamError.notFound }
        return config
    }

    public func write(_ tenant: String, settings: [String: String]) async throws -> TenantConfig {
        tenants.withLock { tenants in
            let config = TenantConfig(tenant: tenant, version: (tenants[tenant]?.version ?? 0) + 1, settings: settings)
            tenants[tenant] = config
            return config
        }
    }
}

/// Another store whose reads each take `latency` longer on `clock` (`TENANT_READ_LATENCY`): a slow
/// source, to watch replicas wait for one another's load.
public struct DelayedTenantStore<C: Clock<Duration>>: TenantStore {
    /// The store read after the delay.
    public var base: any TenantStore
    /// How much longer each read takes.
    public var latency: Duration
    /// The clock the delay is slept on.
    public var clock: C

    /// `base`, each read `latency` slower on `clock`.
    public init(_ base: any TenantStore, latency: Duration, clock: C) {
        (self.base, self.latency, self.clock) = (base, latency, clock)
    }

    public func tenant(_ tenant: String) async throws -> TenantConfig {
        try await clock.sleep(for: latency)
        return try await base.tenant(tenant)
    }

    public func write(_ tenant: String, settings: [String: String]) async throws -> TenantConfig {
        try await base.write(tenant, settings: settings)
    }

    public func probe() async throws { try await base.probe() }
}

/// Tenants in a PostgreSQL table, `tenant_configs`, created on first use.
public final class PostgresTenantStore: TenantStore {
    private let client: PostgresClient
    private let logger: Logger
    private let schema: PostgresSchema
    /// How ``probe()`` connects on its own (the pool retries a failing connection quietly, and its
    /// queries then only wait: a connection of the probe's own says why it fails).
    private let probing: PostgresConnection.Configuration?

    /// What else the probe prepares, after its table (`PostgresSecondLevel.prepare`).
    private let preparing: [@Sendable () async throws -> Void]

    /// A store on `client` (run the client in the service group), probed for readiness through a
    /// connection of its own made with `probing` (`nil`: through the client). The probe also
    /// creates the store's table and checks that the service's role owns it, then runs `preparing`
    /// (the second level's `prepare`): tables another role owns make the service not ready, with
    /// the reason, from its first probe at start.
    public init(
        client: PostgresClient, logger: Logger, probing: PostgresConnection.Configuration? = nil,
        preparing: [@Sendable () async throws -> Void] = []
    ) {
        self.client = client
        self.logger = logger
        self.probing = probing
        self.preparing = preparing
        schema = PostgresSchema(
            client: client, logger: logger, lock: 7_160_231, owned: ["tenant_configs"],
            statements: [
                "CREATE TABLE IF NOT EXISTS public.tenant_configs (tenant text PRIMARY KEY, version bigint NOT NULL, settings text NOT NULL)"
            ])
    }

    public func tenant(_ tenant: String) async throws -> TenantConfig {
        try await prepare()
        let rows = try await client.query(
            "SELECT version, settings FROM public.tenant_configs WHERE tenant = \(tenant)", logger: logger)
        for try await (version, settings) in rows.decode((Int, String).self) {
            return TenantConfig(tenant: tenant, version: version, settings: try Self.decode(settings))
        }
        throw UpstreamError.notFound
    }

    public func write(_ tenant: String, settings: [String: String]) async throws -> TenantConfig {
        try await prepare()
        let json = String(decoding: try JSONEncoder().encode(settings), as: UTF8.self)
        let rows = try await client.query(
            """
            INSERT INTO public.tenant_configs AS t (tenant, version, settings) VALUES (\(tenant), 1, \(json))
            ON CONFLICT (tenant) DO UPDATE SET version = t.version + 1, settings = EXCLUDED.settings
            RETURNING version
            """, logger: logger)
        for try await version in rows.decode(Int.self) {
            return TenantConfig(tenant: tenant, version: version, settings: settings)
        }
        throw UpstreamError.unavailable
    }

    /// Connects (which negotiates TLS, signs in and opens the database) and runs `SELECT 1`: on a
    /// connection of its own when the store was given one's configuration, so that a wrong password,
    /// a missing database or a TLS mismatch comes back as the server's error; else through the
    /// client. Then prepares the tables (created once; their owner checked): a table another role
    /// owns comes back as `PostgresSchema.ForeignOwner`.
    public func probe() async throws {
        if let probing {
            let connection = try await PostgresConnection.connect(configuration: probing, id: 0, logger: logger)
            do {
                for try await _ in try await connection.query("SELECT 1", logger: logger) {}
            } catch {
                try? await connection.close()
                throw error
            }
            try await connection.close()
        } else {
            for try await _ in try await client.query("SELECT 1", logger: logger) {}
        }
        try await prepare()
        for prepare in preparing { try await prepare() }
    }

    /// Creates the table once per process (tried again after a failure).
    private func prepare() async throws { try await schema.prepare() }

    private static func decode(_ settings: String) throws -> [String: String] {
        try JSONDecoder().decode([String: String].self, from: Data(settings.utf8))
    }
}
