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

    @Test func postgresAndTenantVariables() throws {
        let settings = try Settings(environment: [
            "POSTGRES_URL": "postgres://app:s%40cret@db.internal:6543/service", "TENANT_EXPIRY": "20",
            "INVALIDATION_CHANNEL": "tenants_v2",
        ])
        #expect(settings.tenantExpiry == .seconds(20))
        #expect(settings.invalidationChannel == "tenants_v2")
        let postgres = try #require(settings.postgres)
        #expect(postgres.host == "db.internal")
        #expect(postgres.port == 6543)
        #expect(postgres.username == "app")
        #expect(postgres.password == "s@cret")
        #expect(postgres.database == "service")
        #expect(PostgresSettings(url: "postgresql://app@localhost/db")?.port == 5432)
        #expect(try Settings(environment: [:]).postgres == nil)
    }

    @Test(arguments: [
        ("PORT", "80a"), ("PORT", "70000"), ("LOG_LEVEL", "loud"), ("CONFIG_EXPIRY", "0"),
        ("CONFIG_EXPIRY", "-1"), ("RATES_EXPIRY", "nan"), ("PROFILE_EXPIRY", "1e300"), ("RETRY_ATTEMPTS", "0"),
        ("FAILURE_EXPIRY", "-0.5"), ("PROFILE_CAPACITY", "999999999999"), ("TENANT_EXPIRY", "0"),
        ("POSTGRES_URL", "mysql://app@host/db"), ("POSTGRES_URL", "postgres://host/db"),
        ("POSTGRES_URL", "postgres://app@host/"), ("POSTGRES_URL", "postgres://app@host:0/db"),
        ("INVALIDATION_CHANNEL", "Tenants"), ("INVALIDATION_CHANNEL", "a\"; DROP TABLE x; --"),
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
}
