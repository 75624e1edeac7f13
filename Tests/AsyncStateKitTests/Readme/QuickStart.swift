// swift-format-ignore-file
// Verbatim from README.md; .ci/run checks that the README's block still matches this file.
import AsyncStateKit

struct Config: Sendable {
    var featureFlags: [String: Bool] = [:]
    static let `default` = Config()
}

func loadConfig() async throws -> Config {
    // Call your config service here.
    Config(featureFlags: ["new-checkout": true])
}

struct ConfigService {
    @AsyncState var config: Config = .default  // expires after 120 s unless you pass `expiry:`

    func current() async throws -> Config {
        // Fifty concurrent callers: one load. The next two minutes: served from memory.
        // A failure is thrown here and kept in `$config.phase`.
        try await $config.value { try await loadConfig() }
    }

    func describe() -> String {
        switch $config.phase {
        case .initial: "not loaded yet"
        case .loading: "loading (still serving the previous config)"
        case .empty: "no config"
        case .success(let date): "loaded at \(date)"
        case .failure(let error): "failed: \(error)"
        }
    }
}
