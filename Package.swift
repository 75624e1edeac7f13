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
    ],
    swiftLanguageModes: [.v6]
)
