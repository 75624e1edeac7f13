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

    @Test(arguments: [
        ("PORT", "80a"), ("PORT", "70000"), ("LOG_LEVEL", "loud"), ("CONFIG_EXPIRY", "0"),
        ("CONFIG_EXPIRY", "-1"), ("RATES_EXPIRY", "nan"), ("PROFILE_EXPIRY", "1e300"), ("RETRY_ATTEMPTS", "0"),
        ("FAILURE_EXPIRY", "-0.5"), ("PROFILE_CAPACITY", "999999999999"),
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
