// swift-tools-version: 6.2
// An example service, a package of its own so that the library's root package stays free of
// dependencies: a root `swift build` never reads this manifest.
import PackageDescription

import struct Foundation.URL

// A path dependency is known by its directory's name, which depends on where the repository was
// cloned ("swift-async-state", or "main" in CI): read it rather than assume it.
let root = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
let library = root.lastPathComponent.lowercased()

let package = Package(
    name: "HummingbirdService",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(path: "../.."),
        .package(path: "../AsyncStateTracing"),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.7.3"),
        .package(
            url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1", traits: ["FullFoundation"]),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
    ],
    targets: [
        // Invalidation across replicas over PostgreSQL's LISTEN/NOTIFY: an `AsyncStateInvalidationBus`.
        .target(
            name: "PostgresInvalidation",
            dependencies: [
                .product(name: "AsyncStateKit", package: library),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The second level in PostgreSQL: an `AsyncStateSecondLevel` the replicas share.
        .target(
            name: "PostgresFleetCache",
            dependencies: [
                .product(name: "AsyncStateKit", package: library),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The service: its states, routes, observers and configuration (tested without a socket).
        .target(
            name: "StateService",
            dependencies: [
                .product(name: "AsyncStateKit", package: library),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "AsyncStateTracing", package: "AsyncStateTracing"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
                "PostgresInvalidation", "PostgresFleetCache",
            ]
        ),
        // `swift run hummingbird-service`: reads the environment, bootstraps logging and metrics, runs.
        .executableTarget(
            name: "hummingbird-service",
            dependencies: [
                "StateService", "PostgresInvalidation", "PostgresFleetCache",
                .product(name: "AsyncStateTracing", package: "AsyncStateTracing"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // `swift run -c release second-level-benchmark` (POSTGRES_URL): a miss answered by the second
        // level against a direct query of the same table through the same client.
        .executableTarget(
            name: "second-level-benchmark",
            dependencies: [
                "PostgresFleetCache",
                .product(name: "AsyncStateKit", package: library),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "StateServiceTests",
            dependencies: [
                "StateService",
                .product(name: "AsyncStateTesting", package: library),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ]
        ),
        // Against a real PostgreSQL server (`bash .ci/replicas` starts one): the PostgreSQL bus, and
        // three `hummingbird-service` processes agreeing after writes. Skipped without
        // `ASYNCSTATE_POSTGRES_URL`.
        .testTarget(
            name: "ReplicaTests",
            dependencies: [
                "PostgresInvalidation", "PostgresFleetCache", "StateService",
                .product(name: "AsyncStateKit", package: library),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
