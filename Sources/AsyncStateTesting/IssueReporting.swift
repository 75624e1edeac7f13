import Foundation

#if canImport(Testing)
import Testing
#endif

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Reports a test failure at `location`: as a Swift Testing issue when a Swift Testing test is
/// running, otherwise as an XCTest failure when XCTest is loaded, and on standard error in any case
/// (so a command-line run shows it too).
func reportIssue(_ message: String, at location: VirtualClock.SourceLocation) {
    FileHandle.standardError.write(Data((message + "\n").utf8))
    #if canImport(Testing)
    if Test.current != nil {
        Issue.record(
            Comment(rawValue: message),
            sourceLocation: Testing.SourceLocation(
                fileID: location.fileID, filePath: location.filePath, line: location.line,
                column: location.column))
        return
    }
    #endif
    xctFail?("\(location): \(message)", #filePath, #line)
}

/// `XCTFail(_:file:line:)`, looked up in the running process, or `nil` when XCTest is not loaded.
///
/// This module must not link XCTest (the demo executable uses it, and apps would drag XCTest in),
/// so the function is found by its mangled name, as pointfreeco/xctest-dynamic-overlay does. XCTest
/// records the failure on the test case that is running and ignores it when none is. Its file and
/// line must be a `StaticString`, which cannot be made from the stall's location at run time: the
/// message carries the location instead.
private let xctFail: (@convention(thin) (String, StaticString, UInt) -> Void)? = {
    #if canImport(Glibc) || canImport(Darwin)
    guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "$s6XCTest7XCTFail_4file4lineySS_s12StaticStringVSutF") else {
        return nil
    }
    return unsafeBitCast(symbol, to: (@convention(thin) (String, StaticString, UInt) -> Void).self)
    #else
    return nil
    #endif
}()
