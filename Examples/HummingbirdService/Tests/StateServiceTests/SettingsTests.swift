import Testing

@testable import StateService

@Suite struct SettingsTests {
    @Test func unsetVariablesKeepTheDefaults() throws {
        #expect(try Settings(environment: [:]) == Settings())
        #expect(try Settings(environment: ["PORT": " "]) == Settings())
    }

    @Test func variablesOverrideTheDefaults() throws {
        let settings = try Settings(environment: [
            "HOST": "0.0.0.0", "PORT": "9000", "LOG_LEVEL": "DEBUG", "CONFIG_EXPIRY": "1.5",
            "PROFILE_CAPACITY": "500", "RETRY_ATTEMPTS": "5", "FAILURE_EXPIRY": "0", "UPSTREAM_LATENCY": "0.25",
        ])
        #expect(settings.host == "0.0.0.0")
        #expect(settings.port == 9000)
        #expect(settings.logLevel == .debug)
        #expect(settings.configExpiry == .milliseconds(1500))
        #expect(settings.profileCapacity == 500)
        #expect(settings.retryAttempts == 5)
        #expect(settings.failureExpiry == .zero)
        #expect(settings.upstreamLatency == .milliseconds(250))
    }

    @Test func sourceDownVariables() throws {
        let settings = try Settings(environment: [
            "MAX_STALE_AGE": "60", "SOFT_TIMEOUT": "0.2", "UPSTREAM_OUTAGE": "5,10,10,1.5",
        ])
        #expect(settings.maxStaleAge == .seconds(60))
        #expect(settings.softTimeout == .milliseconds(200))
        #expect(
            settings.upstreamOutage
                == UpstreamOutage(
                    after: .seconds(5), down: .seconds(10), slow: .seconds(10), slowLatency: .seconds(1.5)))
        let off = try Settings(environment: ["MAX_STALE_AGE": "0", "SOFT_TIMEOUT": "0"])
        #expect(off.maxStaleAge == nil && off.softTimeout == nil && off.upstreamOutage == nil)
    }

    @Test func postgresAndTenantVariables() throws {
        let settings = try Settings(environment: [
            "POSTGRES_URL": "postgres://app:s%40cret@db.internal:6543/service", "TENANT_EXPIRY": "20",
            "INVALIDATION_CHANNEL": "tenants_v2", "INVALIDATION_SECRET": String(repeating: "k", count: 32),
            "WRITE_TOKEN": "0123456789abcdef", "TENANT_MAX_BYTES": "1000000", "INVALIDATE_ALL_INTERVAL": "2",
        ])
        #expect(settings.tenantExpiry == .seconds(20))
        #expect(settings.invalidationChannel == "tenants_v2")
        #expect(settings.writeToken == "0123456789abcdef" && settings.tenantMaximumBytes == 1_000_000)
        #expect(settings.invalidateAllInterval == .seconds(2))
        #expect(settings.secondLevel)  // on by default
        #expect(try !Settings(environment: ["SECOND_LEVEL": "OFF"]).secondLevel)
        #expect(settings.secondLevelTimeout == .milliseconds(250) && settings.tenantReadLatency == .zero)
        #expect(try Settings(environment: ["TENANT_READ_LATENCY": "0.2"]).tenantReadLatency == .milliseconds(200))
        #expect(try Settings(environment: ["SECOND_LEVEL_TIMEOUT": "2"]).secondLevelTimeout == .seconds(2))
        #expect(!settings.secondLevelWritesInBackground)  // after the write, by default
        #expect(try Settings(environment: ["SECOND_LEVEL_WRITES": "Background"]).secondLevelWritesInBackground)
        let postgres = try #require(settings.postgres)
        #expect(postgres.host == "db.internal")
        #expect(postgres.port == 6543)
        #expect(postgres.username == "app")
        #expect(postgres.password == "s@cret")
        #expect(postgres.database == "service")
        #expect(postgres.sslMode == .verifyFull)  // a remote host: TLS, verified, by default
        #expect(try PostgresSettings(url: "postgresql://app@localhost/db").port == 5432)
        #expect(try Settings(environment: [:]).postgres == nil)
    }

    @Test(arguments: [
        ("PORT", "80a"), ("PORT", "70000"), ("LOG_LEVEL", "loud"), ("CONFIG_EXPIRY", "0"),
        ("CONFIG_EXPIRY", "-1"), ("RATES_EXPIRY", "nan"), ("PROFILE_EXPIRY", "1e300"), ("RETRY_ATTEMPTS", "0"),
        ("FAILURE_EXPIRY", "-0.5"), ("PROFILE_CAPACITY", "999999999999"), ("TENANT_EXPIRY", "0"),
        ("POSTGRES_URL", "mysql://app@host/db"), ("POSTGRES_URL", "postgres://host/db"),
        ("POSTGRES_URL", "postgres://app@host/"), ("POSTGRES_URL", "postgres://app@host:0/db"),
        ("INVALIDATION_CHANNEL", "Tenants"), ("INVALIDATION_CHANNEL", "a\"; DROP TABLE x; --"),
        ("MAX_STALE_AGE", "-1"), ("SOFT_TIMEOUT", "x"), ("UPSTREAM_OUTAGE", "5,10,10"),
        ("UPSTREAM_OUTAGE", "5,,10,1"), ("UPSTREAM_OUTAGE", "5,10,10,-1"), ("UPSTREAM_OUTAGE", "1,2,3,4,5"),
        ("SECOND_LEVEL", "yes"), ("SECOND_LEVEL_TIMEOUT", "0"), ("SECOND_LEVEL_WRITES", "later"),
    ])
    func aMalformedVariableIsAnErrorThatNamesIt(variable: String, value: String) {
        do {
            _ = try Settings(environment: [variable: value])
            Issue.record("\(variable)=\(value) was accepted")
        } catch {
            #expect(error.variable == variable)
            #expect("\(error)".hasPrefix("\(variable)=\(value): expected"))
        }
    }

    @Test func tlsFollowsSSLModeAndIsRequiredForAnyHostButTheLoopback() throws {
        #expect(try PostgresSettings(url: "postgres://app@127.0.0.1/db").sslMode == .disable)
        #expect(try PostgresSettings(url: "postgres://app@localhost/db").sslMode == .disable)
        #expect(try PostgresSettings(url: "postgres://app@[::1]/db").sslMode == .disable)
        #expect(try PostgresSettings(url: "postgres://app@127.0.0.1/db?sslmode=require").sslMode == .require)
        #expect(try PostgresSettings(url: "postgres://app@db.internal/db").sslMode == .verifyFull)
        #expect(try PostgresSettings(url: "postgres://app@db.internal/db?sslmode=require").sslMode == .require)
        #expect(try PostgresSettings(url: "postgres://app@db.internal/db?sslmode=verify-full").sslMode == .verifyFull)
        // What would leave a connection less safe than its operator thinks is refused.
        for url in [
            "postgres://app@db.internal/db?sslmode=disable", "postgres://app@10.0.0.1/db?sslmode=disable",
            "postgres://app@127.0.0.1.evil.example/db?sslmode=disable", "postgres://app@db.internal/db?sslmode=prefer",
            "postgres://app@db.internal/db?ssl_mode=require", "postgres://app@db.internal/db?sslrootcert=/x",
            "postgres://app@db.internal/db?sslmode=require&sslmode=disable",
        ] {
            #expect(throws: PostgresSettings.URLError.self, "\(url)") { try PostgresSettings(url: url) }
        }
        // The connections are made with it.
        let remote = try PostgresSettings(url: "postgres://app@db.internal/db")
        _ = try remote.connection()
        _ = remote.client
    }

    @Test func noErrorShowsASecret() {
        let secret = "hunter2-is-the-password"
        for url in [
            "postgres://app:\(secret)@db.internal:0/db", "postgres://app:\(secret)@db.internal/db?sslmode=disable",
            "postgres://app:\(secret)@db.internal/db?unknown=1", "postgres://app:\(secret)@ho st/db",
        ] {
            do {
                _ = try Settings(environment: [
                    "POSTGRES_URL": url, "INVALIDATION_SECRET": String(repeating: "k", count: 32),
                ])
                Issue.record("\(url) was accepted")
            } catch {
                #expect(!"\(error)".contains(secret), "\(error)")
                #expect("\(error)".contains("***"), "\(error)")
            }
        }
        for (variable, value) in [("WRITE_TOKEN", "short-\(secret.prefix(4))"), ("INVALIDATION_SECRET", secret)] {
            do {
                _ = try Settings(environment: [variable: value])
                Issue.record("\(variable) was accepted")
            } catch {
                #expect(!"\(error)".contains(value), "\(error)")
                #expect(error.variable == variable)
            }
        }
        #expect(PostgresSettings.redacting("postgres://app@db/x") == "postgres://app@db/x")
    }

    /// Every spelling of a password libpq accepts, and the usual mistakes: the password never shows,
    /// the host does where it can be told apart.
    @Test(arguments: [
        ("postgres://app:Pa55-w0rd@db:5432/app", "db:5432/app"),
        ("postgresql://app:Pa55-w0rd@db/app?sslmode=require", "db/app?sslmode=require"),
        ("postgres://app@db/app?password=Pa55-w0rd", "db/app?password=***"),
        ("postgres://app@db/app?sslmode=require&password=Pa55-w0rd&x=1", "password=***&x=1"),
        ("postgres://app@db/app?sslpassword=Pa55-w0rd", "sslpassword=***"),
        ("app:Pa55-w0rd@db:5432/app", "@db:5432/app"),
        ("postgres//user:Pa55-w0rd@db/app", "@db/app"),
        ("postgres:/user:Pa55-w0rd@db/app", "@db/app"),
        ("postgres://app:Pa#55-w0rd@db/app", "@db/app"),
        ("postgres://app:Pa@55-w0rd@db/app", "@db/app"),
        ("postgres://app:Pa55-w0rd#@db/app", "@db/app"),
        ("host=db port=5432 dbname=app user=app password=Pa55-w0rd", "host=db port=5432 dbname=app user=app"),
        ("host=db password='Pa55 w0rd' user=app", "host=db password=*** user=app"),
        ("host=db password='Pa55 \\' w0rd", "host=db password=***"),
        ("password = Pa55-w0rd host=db", "password=*** host=db"),
    ])
    func aPasswordNeverShowsHoweverTheURLIsSpelled(url: String, shown: String) {
        let redacted = PostgresSettings.redacting(url)
        #expect(!redacted.contains("Pa55") && !redacted.contains("w0rd"), "\(redacted)")
        #expect(redacted.contains(shown), "\(redacted)")
    }

    @Test func aSecretIsRequiredWithAServerToInvalidateThrough() {
        #expect(throws: SettingsError.self) {
            try Settings(environment: ["POSTGRES_URL": "postgres://app@127.0.0.1/db"])
        }
        #expect(throws: SettingsError.self) {
            try Settings(environment: ["POSTGRES_URL": "postgres://app@127.0.0.1/db", "INVALIDATION_SECRET": "short"])
        }
    }
}
