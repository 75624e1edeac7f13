// swift-tools-version: 6.2
import PackageDescription

let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

let package = Package(
    name: "swift-async-state",
    platforms: [.macOS(.v15), .iOS(.v18), .tvOS(.v18), .watchOS(.v11), .visionOS(.v2)],
    products: [
        .library(name: "AsyncStateKit", targets: ["AsyncStateKit"]),
        .library(name: "AsyncStateTesting", targets: ["AsyncStateTesting"]),
    ],
    targets: [
        .target(name: "AsyncStateKit", swiftSettings: swiftSettings),
        .target(
            name: "AsyncStateTesting",
            dependencies: ["AsyncStateKit"],
            swiftSettings: swiftSettings
        ),
        // The demo: a small Linux service (`swift run asyncstate-demo`). The scenario lives in a
        // library target of its own so that a test can run it in virtual time.
        .target(
            name: "DemoService",
            dependencies: ["AsyncStateKit", "AsyncStateTesting"],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "asyncstate-demo",
            dependencies: ["DemoService"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "AsyncStateKitTests",
            dependencies: ["AsyncStateKit", "AsyncStateTesting"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "AsyncStateTestingTests",
            dependencies: ["AsyncStateTesting", "AsyncStateKit"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "DemoServiceTests",
            dependencies: ["DemoService", "AsyncStateTesting"],
            swiftSettings: swiftSettings
        ),
    ],
    swiftLanguageModes: [.v6]
)
