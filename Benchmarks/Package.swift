// swift-tools-version: 6.3
// The benchmarks are a package of their own (swift-nio's layout), so the library's root package stays
// free of dependencies: a root `swift build` never reads this manifest.
import PackageDescription

import struct Foundation.URL

// A path dependency is known by its directory's name, which depends on where the repository was
// cloned ("swift-async-state", or "main" in CI): read it rather than assume it.
let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
let library = root.lastPathComponent.lowercased()

let package = Package(
    name: "AsyncStateBenchmarks",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(path: "../"),
        .package(url: "https://github.com/ordo-one/benchmark.git", from: "1.38.1", traits: ["MallocInterposer"]),
        .package(url: "https://github.com/pointfreeco/swift-clocks.git", from: "1.1.1"),
        .package(path: "../Examples/AsyncStateTracing"),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.7.3"),
    ],
    targets: [
        .executableTarget(
            name: "AsyncStateBenchmarks",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "AsyncStateKit", package: library),
                .product(name: "AsyncStateTesting", package: library),
                .product(name: "Clocks", package: "swift-clocks"),
                .product(name: "AsyncStateTracing", package: "AsyncStateTracing"),
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
            ],
            path: "Benchmarks/AsyncStateBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        .executableTarget(
            name: "HitRatio",
            dependencies: [.product(name: "AsyncStateKit", package: library)],
            path: "Tools/HitRatio"
        ),
        .executableTarget(
            name: "HitLoop",
            dependencies: [.product(name: "AsyncStateKit", package: library)],
            path: "Tools/HitLoop"
        ),
        .executableTarget(
            name: "HitScaling",
            dependencies: [.product(name: "AsyncStateKit", package: library)],
            path: "Tools/HitScaling"
        ),
        .executableTarget(
            name: "ColdPaths",
            dependencies: [.product(name: "AsyncStateKit", package: library)],
            path: "Tools/ColdPaths"
        ),
        .executableTarget(
            name: "IndexLayout",
            path: "Tools/IndexLayout"
        ),
        .executableTarget(
            name: "MemoryPerState",
            dependencies: [.product(name: "AsyncStateKit", package: library)],
            path: "Tools/MemoryPerState"
        ),
    ],
    swiftLanguageModes: [.v6]
)
