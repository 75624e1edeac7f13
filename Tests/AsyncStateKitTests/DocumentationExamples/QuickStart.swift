// swift-format-ignore-file
// Verbatim from Sources/AsyncStateKit/AsyncStateKit.docc/GettingStarted.md (whose first lines are README.md's
// quick start); .ci/doc-snippets checks that both blocks still match this file.
import AsyncStateKit

struct Config: Sendable {
    var featureFlags: [String: Bool] = [:]
    static let `default` = Config()
}

func loadConfig() async throws -> Config { Config(featureFlags: ["new-checkout": true]) }  // your source

struct ConfigService {
    @AsyncState var config: Config = .default  // fresh for 120 s unless you pass `expiry:`

    func current() async throws -> Config {
        // Fifty concurrent callers: one load. Then served from memory until it expires.
        // A failure is thrown here, kept in `$config.phase`, and `config` keeps the last good value.
        try await $config.value { try await loadConfig() }
    }
}

extension ConfigService {
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
