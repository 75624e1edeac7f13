// swift-tools-version: 6.2
// A tracing adapter for AsyncStateKit on swift-distributed-tracing: a package of its own, so that the
// library's root package stays free of dependencies. The example service and the benchmarks use it.
import PackageDescription

import struct Foundation.URL

// A path dependency is known by its directory's name, which depends on where the repository was
// cloned ("swift-async-state", or "main" in CI): read it rather than assume it.
let root = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
let library = root.lastPathComponent.lowercased()

let package = Package(
    name: "AsyncStateTracing",
    platforms: [.macOS(.v15)],
    products: [.library(name: "AsyncStateTracing", targets: ["AsyncStateTracing"])],
    dependencies: [
        .package(path: "../.."),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.7.3"),
    ],
    targets: [
        // `TracingObserver`: an `AsyncStateObserver` that turns a state's loads, waits, batches and
        // invalidations into spans.
        .target(
            name: "AsyncStateTracing",
            dependencies: [
                .product(name: "AsyncStateKit", package: library),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ]
        ),
        // The span trees, exact, in virtual time, with the in-memory tracer.
        .testTarget(
            name: "AsyncStateTracingTests",
            dependencies: [
                "AsyncStateTracing",
                .product(name: "AsyncStateKit", package: library),
                .product(name: "AsyncStateTesting", package: library),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
